//! What a backend binary supports: its `--help` and `--version` read once and kept by (path,
//! size, mtime), so a start costs a `stat` and no process more. The reading of the texts is
//! `backends::capabilities` (pure).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backends::capabilities::Capabilities;
use parking_lot::Mutex;

/// How long a binary has to print its help (a GPU build may look for its devices first).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// A file's size and mtime: the probe is kept while both stay.
type Key = (u64, Option<SystemTime>);
/// What a probe found (None: the binary lists no flags).
type Found = Option<Arc<Capabilities>>;

/// The capabilities of each backend binary read so far.
pub struct CapabilityCache {
    known: Mutex<HashMap<PathBuf, (Key, Found)>>,
    /// One probe at a time: requests that arrive together for a binary not read yet wait for
    /// the first one's answer instead of each running the binary.
    probing: tokio::sync::Mutex<()>,
    /// Probes run confined (always, but in the test that counts them through a file).
    confined: bool,
}

impl Default for CapabilityCache {
    fn default() -> CapabilityCache {
        CapabilityCache { known: Mutex::default(), probing: tokio::sync::Mutex::default(), confined: true }
    }
}

impl CapabilityCache {
    /// The capabilities of `program` (named `name` in messages), read from its `--help` and
    /// `--version` on first use and again only when the file changes. None when it lists no
    /// flags (not a help text) or cannot run: it is then built for as the newest lemonade knows.
    /// `version_file` holds what its install says (`version.txt`, read only when the binary is
    /// probed), used when `--version` says nothing.
    pub async fn get(&self, program: &Path, name: &str, version_file: Option<&Path>) -> Option<Arc<Capabilities>> {
        let meta = std::fs::metadata(program).ok()?;
        let key = (meta.len(), meta.modified().ok());
        let kept = || match self.known.lock().get(program) {
            Some((k, caps)) if *k == key => Some(caps.clone()),
            _ => None,
        };
        if let Some(caps) = kept() {
            return caps;
        }
        let _one = self.probing.lock().await;
        if let Some(caps) = kept() {
            return caps;
        }
        let version = version_file.and_then(|f| std::fs::read_to_string(f).ok()).map(|t| t.trim().to_string());
        let caps = probe(program, name, version.as_deref(), self.confined).await.map(Arc::new);
        match &caps {
            Some(c) => {
                tracing::info!(program = %program.display(), version = %c.describe(), "read the backend's capabilities")
            }
            None => {
                tracing::warn!(program = %program.display(), "the backend's --help lists no flags: its arguments are not checked")
            }
        }
        self.known.lock().insert(program.to_path_buf(), (key, caps.clone()));
        caps
    }
}

async fn probe(program: &Path, name: &str, version: Option<&str>, confined: bool) -> Option<Capabilities> {
    // Only a help that ends well is one: a program that fails on `--help` (a stand-in that
    // panics, a wrapper) says nothing of what it takes.
    let (code, help) =
        crate::supervisor::run_once(program, &["--help".to_string()], PROBE_TIMEOUT, confined).await.ok()?;
    if code != Some(0) {
        return None;
    }
    // llama.cpp prints `version: N (commit)`; others may not know the flag (then the install's
    // own version marker says it).
    let printed = crate::supervisor::run_once(program, &["--version".to_string()], PROBE_TIMEOUT, confined)
        .await
        .ok()
        .filter(|(code, text)| *code == Some(0) && text.contains("version:"))
        .map(|(_, text)| text);
    Capabilities::parse(name, &help, printed.as_deref().or(version).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_probe_is_kept_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("llama-server");
        let script = |flag: &str| {
            format!("#!/bin/sh\ncase \"$1\" in --version) echo 'version: 9093 (84e939a1)';; *) echo '{flag}   a flag';; esac\n")
        };
        std::fs::write(&bin, script("--no-mmap")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = CapabilityCache::default();
        let c = cache.get(&bin, "llama-server", None).await.unwrap();
        assert!(c.has("--no-mmap") && c.describe() == "llama-server b9093");
        std::fs::remove_file(&bin).unwrap();
        assert!(cache.get(&bin, "llama-server", None).await.is_none(), "a file that is gone is no binary");
        std::fs::write(&bin, script("--load-mode-and-more")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = cache.get(&bin, "llama-server", None).await.unwrap();
        assert!(c.has("--load-mode-and-more") && !c.has("--no-mmap"), "a changed file is read again");
        let none = dir.path().join("quiet");
        std::fs::write(&none, "#!/bin/sh\necho '-m MODEL'\nexit 101\n").unwrap();
        std::fs::set_permissions(&none, std::fs::Permissions::from_mode(0o755)).unwrap();
        let version = dir.path().join("version.txt");
        std::fs::write(&version, "v1\n").unwrap();
        assert!(cache.get(&none, "x", Some(&version)).await.is_none());
    }

    #[tokio::test]
    async fn requests_that_arrive_together_run_one_probe() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, runs) = (dir.path().join("llama-server"), dir.path().join("runs"));
        let script = format!("#!/bin/sh\necho x >> '{}'\necho '--no-mmap   a flag'\n", runs.display());
        std::fs::write(&bin, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Unconfined: the stand-in counts its runs in a file, which a confined probe cannot write.
        let cache = CapabilityCache { confined: false, ..CapabilityCache::default() };
        let all = futures_util::future::join_all((0..16).map(|_| cache.get(&bin, "llama-server", None))).await;
        assert!(all.iter().all(|c| c.as_ref().is_some_and(|c| c.has("--no-mmap"))));
        let n = std::fs::read_to_string(&runs).unwrap().lines().count();
        assert_eq!(n, 2, "one --help and one --version for 16 requests");
    }
}
