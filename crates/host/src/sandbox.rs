//! Applies a backend's confinement ([`backends::sandbox::Policy`]) with Landlock and
//! `no_new_privs`, through the `landlock` crate.
//!
//! The ruleset is built in lemonade (paths opened, rules added) before the fork; the child
//! only sets `no_new_privs` and calls `landlock_restrict_self` between fork and exec, two
//! system calls and no allocation. The rules hold for the backend and everything it starts
//! (a launcher script's interpreter, a shell a compromised backend spawns).
//!
//! Why Landlock and not seccomp: the threats are files, the network and other processes,
//! which Landlock names directly (paths, TCP ports, scopes) and which hold across exec;
//! a seccomp filter names system calls, whose lists differ between glibc, CUDA, ROCm and
//! Python builds and break them in ways no test here could see. `no_new_privs` closes the
//! setuid route that would lift both.

use std::path::PathBuf;

use api_types::SandboxStatus;
use backends::sandbox::{self, Mode, Policy};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

/// Why a backend cannot be confined as asked.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "--sandbox strict: this kernel cannot confine backends fully; it lacks {0}. Use --sandbox best-effort to run with what it has, or a newer kernel"
    )]
    Unsupported(String),
    #[error("the sandbox could not be built: {0}")]
    Build(#[from] landlock::RulesetError),
}

/// The kernel's Landlock ABI version (0: none, or disabled at boot).
/// Asked once per process: the kernel's answer does not change while lemonade runs, and
/// `/health` reports it on every call.
pub fn landlock_abi() -> u32 {
    static ABI: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ABI.get_or_init(|| {
        // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
        // SAFETY: the documented version query; no memory is passed.
        let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
        u32::try_from(v).unwrap_or(0)
    })
}

/// The strongest mode this kernel holds completely: strict where it enforces every rule,
/// best-effort (with what it lacks named) elsewhere.
pub fn default_mode() -> Mode {
    match sandbox::missing(landlock_abi()).is_empty() {
        true => Mode::Strict,
        false => Mode::BestEffort,
    }
}

/// What `mode` gives every backend on this kernel. Err: `strict` asked of a kernel that cannot
/// hold it, naming what it lacks.
pub fn status(mode: Mode) -> Result<SandboxStatus, SandboxError> {
    let abi = landlock_abi();
    let missing = sandbox::missing(abi);
    if mode == Mode::Strict && !missing.is_empty() {
        return Err(SandboxError::Unsupported(missing.join("; ")));
    }
    let on = mode != Mode::Off;
    Ok(SandboxStatus {
        mode: mode.as_str().to_string(),
        landlock_abi: abi,
        filesystem: on && abi >= sandbox::ABI_FILESYSTEM,
        network: on && abi >= sandbox::ABI_NETWORK,
        scoped: on && abi >= sandbox::ABI_SCOPES,
        no_new_privs: on,
        missing: if on { missing } else { vec!["--sandbox off: backends run with all of the user's rights".into()] },
    })
}

/// A ruleset ready for the child, and what it enforces.
pub struct Confinement {
    ruleset: Option<RulesetCreated>,
    pub status: SandboxStatus,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement").field("status", &self.status).finish()
    }
}

impl Confinement {
    /// Restricts the calling process. Only for the child between fork and exec: it sets
    /// `no_new_privs` and enforces the ruleset, nothing else (no allocation). Under `strict`
    /// the ruleset was built as a hard requirement, so what it enforces is all of it.
    pub fn enforce(&mut self) -> std::io::Result<()> {
        match self.ruleset.take().map(RulesetCreated::restrict_self) {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(_)) => Err(std::io::Error::last_os_error()),
        }
    }
}

/// The ruleset of `policy` under `mode`, built in this process (its paths opened now; a path
/// that does not exist is skipped, as there is nothing there to grant).
pub fn prepare(mode: Mode, policy: &Policy) -> Result<Confinement, SandboxError> {
    let status = status(mode)?;
    if mode == Mode::Off {
        return Ok(Confinement { ruleset: None, status });
    }
    let abi = ABI::V6;
    let level = if mode == Mode::Strict { CompatLevel::HardRequirement } else { CompatLevel::BestEffort };
    let fail = SandboxError::Build;
    let exists = |p: &&PathBuf| p.exists();
    let rules = |paths: &[PathBuf], access| {
        paths
            .iter()
            .filter(exists)
            .filter_map(|p| PathFd::new(p).ok().map(|fd| (!p.is_dir(), fd)))
            .map(move |(file, fd)| {
                let a: landlock::BitFlags<AccessFs> = access;
                PathBeneath::new(fd, if file { a & AccessFs::from_file(abi) } else { a })
            })
            .collect::<Vec<_>>()
    };
    let read = AccessFs::from_read(abi);
    let device = read | AccessFs::WriteFile | AccessFs::IoctlDev;
    let mut r = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .map_err(fail)?
        .no_new_privs(true);
    for rule in rules(&policy.read, read)
        .into_iter()
        .chain(rules(&policy.write, AccessFs::from_all(abi)))
        .chain(rules(&policy.devices, device))
    {
        r = r.add_rule(rule).map_err(fail)?;
    }
    for port in &policy.bind {
        r = r.add_rule(NetPort::new(*port, AccessNet::BindTcp)).map_err(fail)?;
    }
    for port in &policy.connect {
        r = r.add_rule(NetPort::new(*port, AccessNet::ConnectTcp)).map_err(fail)?;
    }
    Ok(Confinement { ruleset: Some(r), status })
}

/// The files a backend reads for the model files `named`: each of them, where its links lead,
/// and for one in a Hugging Face snapshot, where its siblings' links lead (a Kokoro index
/// names the ONNX file and voices beside it; a Hub cache made by other tools may link its
/// snapshots outside the repository's blobs).
pub fn model_files(named: &[&std::path::Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in named {
        out.push(p.to_path_buf());
        out.extend(std::fs::canonicalize(p).ok());
        let in_snapshot = p.parent().and_then(|d| d.parent()).is_some_and(|s| s.ends_with("snapshots"));
        if let (true, Some(dir)) = (in_snapshot, p.parent()) {
            let siblings = std::fs::read_dir(dir).into_iter().flatten().flatten().take(256);
            out.extend(siblings.filter_map(|e| std::fs::canonicalize(e.path()).ok()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What an interpreter-run backend needs besides its own folder: where its links lead; for a
/// launcher script (`#!`), the folders of the programs and files it names by absolute path
/// (Kokoro's `koko` execs a venv's Python on a script kept elsewhere), followed once more;
/// and for a program in or beside a Python venv (`pyvenv.cfg`), the venv and the Python
/// install it was made from (its `home`'s parent).
pub fn runtime_paths(program: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![(program.to_path_buf(), 0)];
    while let Some((p, depth)) = todo.pop() {
        let Some(dir) = p.parent().map(std::path::Path::to_path_buf) else { continue };
        if p != program {
            out.push(dir.clone());
        }
        if let Ok(real) = std::fs::canonicalize(&p) {
            out.extend(real.parent().filter(|d| *d != dir).map(std::path::Path::to_path_buf));
        }
        // A venv beside it (`<dir>/venv`) or around it (`<venv>/bin/python`).
        for venv in [dir.join("venv"), dir.parent().map(|d| d.to_path_buf()).unwrap_or_default()] {
            let Ok(text) = std::fs::read_to_string(venv.join("pyvenv.cfg")) else { continue };
            out.push(venv.clone());
            for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
                if k.trim() == "home" {
                    let home = PathBuf::from(v.trim());
                    let prefix = home.parent().map(|p| p.to_path_buf()).unwrap_or(home);
                    out.extend(std::fs::canonicalize(&prefix).ok().filter(|c| *c != prefix));
                    out.push(prefix);
                }
            }
        }
        if depth < 2 {
            for named in script_paths(&p) {
                todo.push((named, depth + 1));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The existing files a launcher script (`#!`, its first 4 KiB) names by absolute path.
fn script_paths(p: &std::path::Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 4096];
    let n = std::fs::File::open(p).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    if !head[..n].starts_with(b"#!") {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&head[..n]);
    text.split(|c: char| c.is_whitespace() || "'\"".contains(c))
        .filter(|t| t.starts_with('/') && !t.starts_with("//"))
        .map(PathBuf::from)
        .filter(|t| t.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kokoro's launcher installed under lemonade's cache, exec'ing a venv's Python elsewhere:
    /// the venv, its script's folder and the Python it was made from are all readable.
    #[test]
    fn a_launcher_script_grants_the_interpreter_and_script_it_names() {
        let tmp = tempfile::tempdir().unwrap();
        let (bin, src) = (tmp.path().join("bin/kokoro/cpu"), tmp.path().join("kokoro-src"));
        std::fs::create_dir_all(src.join("venv/bin")).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(src.join("venv/pyvenv.cfg"), "home = /opt/python3.11/bin\n").unwrap();
        std::fs::write(src.join("venv/bin/python"), "").unwrap();
        std::fs::write(src.join("koko.py"), "").unwrap();
        let koko = bin.join("koko");
        let script = format!(
            "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
            src.join("venv/bin/python").display(),
            src.join("koko.py").display()
        );
        std::fs::write(&koko, script).unwrap();
        let got = runtime_paths(&koko);
        for want in [src.clone(), src.join("venv"), src.join("venv/bin"), PathBuf::from("/opt/python3.11")] {
            assert!(got.contains(&want), "{} not in {got:?}", want.display());
        }
        assert!(!got.contains(&tmp.path().to_path_buf()), "{got:?}");
    }

    #[test]
    fn strict_is_refused_naming_what_a_weak_kernel_lacks_and_off_says_so() {
        let abi = landlock_abi();
        match status(Mode::Strict) {
            Ok(s) => assert!(abi >= sandbox::ABI_SCOPES && s.filesystem && s.network && s.scoped, "{s:?}"),
            Err(e) => assert!(abi < sandbox::ABI_SCOPES && e.to_string().contains("--sandbox best-effort"), "{e}"),
        }
        let off = status(Mode::Off).unwrap();
        assert!(!off.filesystem && !off.no_new_privs && off.missing[0].contains("all of the user's rights"));
    }
}
