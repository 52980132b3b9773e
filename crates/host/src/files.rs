//! lemonade's own files: written atomically (same-directory temp file, fsync, rename, fsync of
//! the directory), so a crash at any point leaves either the old or the new file; JSON maps
//! are updated under one lock, so concurrent updates are not lost.

use parking_lot::Mutex;
use std::path::Path;

use registry::{CatalogueEntry, RECIPE_OPTIONS_FILE, USER_MODELS_FILE};
use serde::Serialize;

use crate::HostError;

/// Serializes the read-modify-write of the files we own.
static FILES: Mutex<()> = Mutex::new(());

/// Writes `bytes` to `path` atomically (same-directory temp file, fsync, rename, fsync dir).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(not(feature = "faults"))]
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    #[cfg(feature = "faults")]
    faults::write(path, &mut f, bytes)?;
    #[cfg(not(feature = "faults"))]
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the temp files of [`write_atomic`] in `dir` left by a process that was killed
/// mid-write (their pid, in the name, is not running). Returns how many were removed.
pub fn clean_leftover_temps(dir: &Path) -> usize {
    let mut removed = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { continue };
        // `.<name>.<pid>.<seq>.tmp`
        let mut parts = rest.rsplitn(3, '.');
        let (_seq, pid) = (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok()));
        let Some(pid) = pid else { continue };
        let running = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !running && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The bytes of `path`, or None when it does not exist.
pub fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>, HostError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HostError::io(path)(e)),
    }
}

/// Sets (or with None removes) `key` in the JSON object file at `path`: one writer at a time,
/// atomic replacement.
pub(crate) fn update_json_map<T: Serialize + serde::de::DeserializeOwned>(
    path: &Path,
    key: &str,
    value: Option<T>,
) -> Result<(), HostError> {
    let _one_writer = FILES.lock();
    let current = read_if_exists(path)?;
    let bytes = registry::updated_json_map(current.as_deref(), &path.display().to_string(), key, value)?;
    write_atomic(path, &bytes).map_err(HostError::io(path))
}

/// Replaces `name`'s saved options in `<cache_dir>/recipe_options.json` (None removes them).
pub fn save_recipe_options(
    cache_dir: &Path,
    name: &str,
    options: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), HostError> {
    update_json_map(&cache_dir.join(RECIPE_OPTIONS_FILE), name, options.cloned())
}

/// Points `alias` at `target` in `<cache_dir>/aliases.json`, or removes it (None).
pub fn save_alias(cache_dir: &Path, alias: &str, target: Option<&str>) -> Result<(), HostError> {
    update_json_map(&cache_dir.join(registry::ALIASES_FILE), alias, target.map(str::to_string))
}

/// Sets `alias`'s parameter variant in `<cache_dir>/alias_params.json`, or removes it (None).
pub fn save_alias_params(
    cache_dir: &Path,
    alias: &str,
    params: Option<&api_types::AliasParams>,
) -> Result<(), HostError> {
    update_json_map(&cache_dir.join(registry::ALIAS_PARAMS_FILE), alias, params.cloned())
}

/// Adds or replaces `user.<key>` in `<cache_dir>/user_models.json`, or removes it (None).
pub fn save_user_model(cache_dir: &Path, key: &str, entry: Option<&CatalogueEntry>) -> Result<(), HostError> {
    update_json_map(&cache_dir.join(USER_MODELS_FILE), key, entry.cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_temps_of_dead_writers_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(&dir.path().join("user_models.json"), b"{}").unwrap();
        // pid 0x7ffffffe is above pid_max: never running.
        let dead = dir.path().join(".user_models.json.2147483646.3.tmp");
        let ours = dir.path().join(format!(".user_models.json.{}.9.tmp", std::process::id()));
        let other = dir.path().join("notes.tmp");
        for p in [&dead, &ours, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(clean_leftover_temps(dir.path()), 1);
        assert!(!dead.exists() && ours.exists() && other.exists());
        assert_eq!(std::fs::read(dir.path().join("user_models.json")).unwrap(), b"{}");
    }
}

/// `<cache_dir>/config.json` as written (absent: `{}`). A file that is not a JSON object is an
/// error naming it and the parse error: it is never reset silently.
pub fn load_config(cache_dir: &Path) -> Result<serde_json::Map<String, serde_json::Value>, HostError> {
    let path = cache_dir.join(registry::config::CONFIG_FILE);
    match read_if_exists(&path)? {
        None => Ok(serde_json::Map::new()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
            HostError::Registry(registry::RegistryError::Json { path: path.display().to_string(), source })
        }),
    }
}

/// Replaces `<cache_dir>/config.json` with `values` (atomically: a reader, or a restart after
/// a kill, sees the old file or the new one, whole).
pub fn save_config(cache_dir: &Path, values: &serde_json::Map<String, serde_json::Value>) -> Result<(), HostError> {
    let path = cache_dir.join(registry::config::CONFIG_FILE);
    let _one_writer = FILES.lock();
    let bytes = serde_json::to_vec_pretty(values).expect("a JSON map serializes");
    #[cfg(feature = "faults")]
    if faults::in_place(&path) {
        let mut f = std::fs::File::create(&path).map_err(HostError::io(&path))?;
        return faults::write(&path, &mut f, &bytes).map_err(HostError::io(&path));
    }
    write_atomic(&path, &bytes).map_err(HostError::io(&path))
}

/// A simulated disk under chosen directories (the engine's simulation runs many lemonades at
/// once, one per directory): a write killed after so many bytes (the process dies there: every
/// later write under the directory fails until it is revived, as a restart), no space left, and
/// `config.json` written in place (a past bug, put back on demand).
#[cfg(feature = "faults")]
pub mod faults {
    use std::io::Write;
    use std::path::{Path, PathBuf};

    use parking_lot::Mutex;

    /// What the next write under a directory meets.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Fault {
        /// The process dies after this many bytes of the next write.
        KillAfter(usize),
        /// The next write finds no space (nothing written).
        NoSpace,
    }

    #[derive(Default)]
    struct Disk {
        next: Option<Fault>,
        dead: bool,
        in_place: bool,
    }

    static DISKS: Mutex<Vec<(PathBuf, Disk)>> = Mutex::new(Vec::new());

    fn with<T>(path: &Path, f: impl FnOnce(&mut Disk) -> T) -> Option<T> {
        let mut disks = DISKS.lock();
        disks.iter_mut().find(|(dir, _)| path.starts_with(dir)).map(|(_, d)| f(d))
    }

    fn entry<T>(dir: &Path, f: impl FnOnce(&mut Disk) -> T) -> T {
        let mut disks = DISKS.lock();
        if let Some((_, d)) = disks.iter_mut().find(|(d, _)| d == dir) {
            return f(d);
        }
        disks.push((dir.to_path_buf(), Disk::default()));
        f(&mut disks.last_mut().expect("just pushed").1)
    }

    /// The next write under `dir` meets `fault`.
    pub fn arm(dir: &Path, fault: Fault) {
        entry(dir, |d| d.next = Some(fault));
    }

    /// No fault is armed under `dir` (one armed and not met is dropped).
    pub fn arm_none(dir: &Path) {
        entry(dir, |d| d.next = None);
    }

    /// `config.json` under `dir` is written in place from now on (the mutation).
    pub fn write_in_place(dir: &Path) {
        entry(dir, |d| d.in_place = true);
    }

    /// Whether the last kill under `dir` happened (and nothing revived it since).
    pub fn killed(dir: &Path) -> bool {
        with(dir, |d| d.dead).unwrap_or(false)
    }

    /// lemonade started again over `dir`: writes work, no fault is armed.
    pub fn revive(dir: &Path) {
        entry(dir, |d| (d.dead, d.next) = (false, None));
    }

    /// `dir` is done with: its entry goes.
    pub fn forget(dir: &Path) {
        DISKS.lock().retain(|(d, _)| d != dir);
    }

    pub(super) fn in_place(path: &Path) -> bool {
        with(path, |d| d.in_place).unwrap_or(false)
    }

    /// Writes `bytes` to `f` (the file at `path`) as the simulated disk lets it.
    pub(super) fn write(path: &Path, f: &mut std::fs::File, bytes: &[u8]) -> std::io::Result<()> {
        let killed = || std::io::Error::other("simulated kill: lemonade died during this write");
        let fault = with(path, |d| if d.dead { Err(()) } else { Ok(d.next.take()) }).unwrap_or(Ok(None));
        match fault {
            Err(()) => Err(killed()),
            Ok(None) => f.write_all(bytes),
            Ok(Some(Fault::NoSpace)) => Err(std::io::Error::from_raw_os_error(28)),
            Ok(Some(Fault::KillAfter(n))) => {
                f.write_all(&bytes[..n.min(bytes.len())])?;
                let _ = f.sync_all();
                with(path, |d| d.dead = true);
                Err(killed())
            }
        }
    }
}

/// `settings.json` (before `config.json`) moved aside once its keys are in `config.json`.
pub fn retire_settings(cache_dir: &Path) -> Result<(), HostError> {
    let from = cache_dir.join(SETTINGS_FILE);
    let to = cache_dir.join(format!("{SETTINGS_FILE}.migrated"));
    std::fs::rename(&from, &to).map_err(HostError::io(&from))
}

/// `settings.json` in lemonade's cache dir: scheduler settings changed through the admin API.
pub const SETTINGS_FILE: &str = "settings.json";

/// The saved scheduler settings (none saved: all absent). A file that is not a valid settings
/// object is an error naming it.
pub fn load_settings(cache_dir: &Path) -> Result<api_types::ParamsUpdate, HostError> {
    let path = cache_dir.join(SETTINGS_FILE);
    match read_if_exists(&path)? {
        None => Ok(api_types::ParamsUpdate::default()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
            HostError::Registry(registry::RegistryError::Json { path: path.display().to_string(), source })
        }),
    }
}

#[cfg(test)]
mod settings_tests {
    use super::*;

    #[test]
    fn the_config_file_is_written_whole_a_corrupt_one_is_named_and_old_settings_are_read() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_config(dir.path()).unwrap().is_empty(), "no file: no overrides");
        let mut m = serde_json::Map::new();
        m.insert("ctx_size".into(), 2048.into());
        save_config(dir.path(), &m).unwrap();
        assert_eq!(load_config(dir.path()).unwrap(), m);
        std::fs::write(dir.path().join("config.json"), b"{\"ctx_size\": ").unwrap();
        let err = load_config(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.json") && err.contains("EOF"), "{err}");
        assert_eq!(load_settings(dir.path()).unwrap(), api_types::ParamsUpdate::default());
        std::fs::write(dir.path().join(SETTINGS_FILE), b"{\"idle_timeout\": 30}").unwrap();
        assert_eq!(load_settings(dir.path()).unwrap().idle_timeout, Some(30));
        retire_settings(dir.path()).unwrap();
        assert!(!dir.path().join(SETTINGS_FILE).exists() && dir.path().join("settings.json.migrated").exists());
        std::fs::write(dir.path().join(SETTINGS_FILE), b"{\"idle_timeout\": \"soon\"}").unwrap();
        let err = load_settings(dir.path()).unwrap_err().to_string();
        assert!(err.contains("settings.json"), "{err}");
    }
}

/// The size of the file at `path` (following links; a folder: every file under it), or None
/// when nothing is there.
pub fn size_of(path: &Path) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return Some(meta.len());
    }
    let mut total = 0;
    for e in std::fs::read_dir(path).ok()?.flatten() {
        total += size_of(&e.path()).unwrap_or(0);
    }
    Some(total)
}
