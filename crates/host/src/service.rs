//! `lemonade service install|uninstall|status`: lemonade as a systemd user service. The unit
//! is written to `$XDG_CONFIG_HOME/systemd/user/lemonade.service` (else
//! `~/.config/systemd/user/`) and handed to `systemctl --user`. The system-wide unit the
//! `.deb` installs is `deploy/systemd/lemonade.service`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HostError;

/// The unit's file name.
pub const UNIT: &str = "lemonade.service";

/// Where the user unit goes.
pub fn unit_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let config = env("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").filter(|h| !h.is_empty()).map(|h| Path::new(&h).join(".config")))?;
    Some(config.join("systemd/user").join(UNIT))
}

/// The user unit running `exe serve` with `args`: restarted on failure, `systemctl --user
/// reload` re-reads config.json (SIGHUP), the hardening a user unit can take.
pub fn user_unit(exe: &Path, args: &[String]) -> String {
    let quote = |a: &str| {
        if a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@".contains(c)) {
            a.to_string()
        } else {
            format!("\"{}\"", a.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%"))
        }
    };
    let mut cmd = vec![quote(&exe.display().to_string()), "serve".into()];
    cmd.extend(args.iter().map(|a| quote(a)));
    format!(
        "[Unit]\n\
         Description=lemonade local AI server (user service)\n\
         After=network.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={}\n\
         ExecReload=/bin/kill -HUP $MAINPID\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         TimeoutStopSec=30\n\
         NoNewPrivileges=yes\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        cmd.join(" ")
    )
}

/// Writes `unit` at `path` (its folder created), replacing one there.
pub fn write_unit(path: &Path, unit: &str) -> Result<(), HostError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| HostError::Io { path: dir.display().to_string(), source })?;
    }
    crate::files::write_atomic(path, unit.as_bytes())
        .map_err(|source| HostError::Io { path: path.display().to_string(), source })
}

/// Removes the unit at `path`; false when there was none.
pub fn remove_unit(path: &Path) -> Result<bool, HostError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(HostError::Io { path: path.display().to_string(), source }),
    }
}

/// `systemctl --user` failed, or could not run: what it said.
#[derive(Debug, thiserror::Error)]
pub enum SystemctlError {
    #[error("systemctl --user {args} failed ({status}): {said}")]
    Failed { args: String, status: std::process::ExitStatus, said: String },
    #[error("systemctl could not run: {0}")]
    CannotRun(#[from] std::io::Error),
}

/// `systemctl --user ARGS`: its output when it succeeded.
pub fn systemctl(args: &[&str]) -> Result<String, SystemctlError> {
    match Command::new("systemctl").arg("--user").args(args).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => {
            let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            Err(SystemctlError::Failed { args: args.join(" "), status: o.status, said: said.trim().to_string() })
        }
        Err(e) => Err(SystemctlError::CannotRun(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_unit_runs_serve_with_its_arguments_quoted_and_reloads_on_sighup() {
        let u = user_unit(Path::new("/home/u/.cargo/bin/lemonade"), &["--port".into(), "8001".into(), "a b%".into()]);
        assert!(u.contains("ExecStart=/home/u/.cargo/bin/lemonade serve --port 8001 \"a b%%\"\n"), "{u}");
        assert!(u.contains("ExecReload=/bin/kill -HUP $MAINPID\n"), "{u}");
        assert!(u.contains("WantedBy=default.target"), "{u}");
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        assert_eq!(unit_path(env).unwrap(), Path::new("/home/u/.config/systemd/user/lemonade.service"));
        let xdg = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "/x".to_string());
        assert_eq!(unit_path(xdg).unwrap(), Path::new("/x/systemd/user/lemonade.service"));
    }
}
