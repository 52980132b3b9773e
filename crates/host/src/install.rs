//! The backend install transaction: release archives into `<cache>/bin/<dir>/<backend>/`.
//!
//! Invariant: at every instant the backend directory is either the old install or the new one,
//! never a mix. The archive is downloaded (resumable, retried, checked against a pinned sha256
//! when the pins carry one), extracted into `<cache>/bin/.staging/…` on the same filesystem,
//! checked (the executable is there and runs `--version`), given its `version.txt`, synced, and
//! only then swapped in with one `renameat2(RENAME_EXCHANGE)` (or a plain rename when there was
//! no old install). Leftovers of an interrupted install are removed at start-up.
//!
//! What to install (the plan) is decided in `backends::releases`; callers serialize installs
//! of one backend.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use backends::releases::{self, InstallPlan, Pins};

use crate::binary;
use crate::download::{sha256_file, DownloadError, Downloader, Target};

/// The errors of an install or uninstall. The installed backend (if any) is unchanged by each.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("Download of {what} failed: {source}")]
    Download { what: String, source: DownloadError },
    #[error("{0}. The installed backend (if any) is unchanged")]
    Corrupt(DownloadError),
    #[error("{file}: sha256 {got} does not match the pinned {expected}; the archive was removed and the installed backend (if any) is unchanged")]
    PinnedSha256 { file: String, got: String, expected: String },
    #[error("{0} is not a valid archive ({1}); it was removed")]
    BadArchive(String, String),
    #[error("{0}")]
    DoesNotRun(String),
    #[error("{0}:{1} is not installed")]
    NotInstalled(String, String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}")]
    Task(String),
    /// `offline` is set: no release is downloaded.
    #[error("lemonade is offline (the `offline` setting is true): installing {0} needs the network. Set offline to false (`lemonade config set offline=false` or POST /internal/set) to allow it")]
    Offline(String),
}

fn io_error(path: &Path, source: std::io::Error) -> InstallError {
    InstallError::Io { path: path.display().to_string(), source }
}

/// Progress callback: `(bytes done, total if known)`; false cancels.
pub type Progress<'a> = &'a mut (dyn FnMut(u64, Option<u64>) -> bool + Send);

/// `<cache>/backend_versions.json` when present (a user's own pins, optionally with sha256s),
/// else v9.4.1's pins.
pub fn pins(cache_dir: &Path) -> Pins {
    let custom = cache_dir.join("backend_versions.json");
    if let Ok(text) = std::fs::read_to_string(&custom) {
        match Pins::parse(&text) {
            Ok(p) => return p,
            Err(e) => tracing::warn!(path = %custom.display(), error = %e, "ignoring unreadable backend pins"),
        }
    }
    Pins::parse(releases::DEFAULT_PINS).expect("built-in pins parse")
}

/// `LEMONADE_RELEASES_URL` (a mirror of GitHub's `<repo>/releases/download/<v>/<file>` layout).
pub fn releases_url() -> String {
    std::env::var("LEMONADE_RELEASES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| releases::DEFAULT_RELEASES_URL.into())
}

fn staging_root(cache_dir: &Path) -> PathBuf {
    cache_dir.join("bin").join(".staging")
}

/// Removes what an interrupted install or uninstall left (never a live backend directory).
pub fn clean_staging(cache_dir: &Path) {
    let root = staging_root(cache_dir);
    if root.exists() {
        if let Err(e) = std::fs::remove_dir_all(&root) {
            tracing::warn!(path = %root.display(), error = %e, "cannot remove an interrupted install's files");
        } else {
            tracing::debug!(path = %root.display(), "removed an interrupted install's files");
        }
    }
}

/// Carries out `p` unless the pinned version is there; returns the bytes downloaded (0 when
/// nothing had to be done) and the version.
pub async fn install(cache_dir: &Path, p: &InstallPlan, progress: Progress<'_>) -> Result<(u64, String), InstallError> {
    let (recipe, backend) = (p.recipe.as_str(), p.backend.as_str());
    let final_dir = binary::managed_dir(cache_dir, p.dir, &p.backend);
    let installed_version = std::fs::read_to_string(final_dir.join("version.txt")).ok().map(|v| v.trim().to_string());
    if installed_version.as_deref() == Some(p.version.as_str()) && binary::find_recursive(&final_dir, p.exe).is_some() {
        return Ok((0, p.version.clone()));
    }
    let t = Instant::now();
    let staging = staging_root(cache_dir);
    std::fs::create_dir_all(&staging).map_err(|e| io_error(&staging, e))?;
    // The archive stays between attempts (it is resumed), under a name naming its version.
    let downloads = cache_dir.join("bin").join(".downloads");
    std::fs::create_dir_all(&downloads).map_err(|e| io_error(&downloads, e))?;
    let archive = downloads.join(&p.asset.filename);
    let url = p.asset.url(&releases_url());
    tracing::info!(recipe, backend, version = %p.version, %url, "installing backend");
    if !archive.is_file() {
        let mut fetcher = Downloader::new(None);
        // Fewer attempts than for models: an archive is small next to a model, and a load that
        // waits on an unreachable release site should fail in seconds, not minutes.
        fetcher.policy.attempts = 4;
        let file = Target { name: p.asset.filename.clone(), size: None, sha256: p.sha256.clone() };
        fetcher.fetch(&url, &archive, &file, progress).await.map_err(|e| match e {
            DownloadError::Sha256 { .. } => InstallError::Corrupt(e),
            e => InstallError::Download { what: format!("{recipe}:{backend}"), source: e },
        })?;
    } else if let Some(expected) = &p.sha256 {
        // Downloaded by an earlier attempt that did not finish installing: check it again.
        let a = archive.clone();
        let got = crate::offload::offload(move || sha256_file(&a))
            .await
            .map_err(|e| InstallError::Task(e.to_string()))?
            .map_err(|e| io_error(&archive, e))?;
        if &got != expected {
            let _ = std::fs::remove_file(&archive);
            return Err(InstallError::PinnedSha256 { file: p.asset.filename.clone(), got, expected: expected.clone() });
        }
    }
    let bytes = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
    progress(bytes, Some(bytes));
    let (archive2, staging2, plan_exe, version) = (archive.clone(), staging.clone(), p.exe, p.version.clone());
    let tree = crate::offload::offload(move || unpack(&archive2, &staging2, plan_exe, &version))
        .await
        .map_err(|e| InstallError::Task(e.to_string()))??;
    check_runs(&tree, p.exe).await?;
    swap_in(&tree, &final_dir)?;
    let _ = std::fs::remove_file(&archive);
    tracing::info!(recipe, backend, version = %p.version, secs = t.elapsed().as_secs_f64(), "backend installed");
    Ok((bytes, p.version.clone()))
}

/// Extracts `archive` into a fresh directory under `staging`, checks the executable is there,
/// makes it executable, writes `version.txt`, and syncs every file. Returns the directory.
fn unpack(archive: &Path, staging: &Path, exe: &str, version: &str) -> Result<PathBuf, InstallError> {
    let tree =
        tempfile::Builder::new().prefix("install-").tempdir_in(staging).map_err(|e| io_error(staging, e))?.keep();
    let name = archive.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let bad = |e: String| {
        let _ = std::fs::remove_file(archive);
        InstallError::BadArchive(name.to_string(), e)
    };
    if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        let f = std::fs::File::open(archive).map_err(|e| io_error(archive, e))?;
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        ar.set_preserve_permissions(true);
        ar.set_overwrite(false);
        // Entry by entry: one whose name is absolute or climbs out (`..`), or that would be
        // written through a link, refuses the whole archive (tar's own `unpack` skips the first
        // two silently).
        for entry in ar.entries().map_err(|e| bad(e.to_string()))? {
            let mut entry = entry.map_err(|e| bad(e.to_string()))?;
            let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
            let climbs =
                path.components().any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
            if climbs {
                return Err(bad(format!("its entry '{}' would land outside the install folder", path.display())));
            }
            match entry.unpack_in(&tree) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(bad(format!("its entry '{}' would land outside the install folder", path.display())))
                }
                Err(e) => return Err(bad(format!("its entry '{}': {e}", path.display()))),
            }
        }
    } else if name.ends_with(".zip") {
        // Names first: one that is absolute or climbs out refuses the archive (unzip itself
        // would strip them with a warning and go on).
        let list = std::process::Command::new("unzip")
            .arg("-Z1")
            .arg(archive)
            .output()
            .map_err(|e| InstallError::DoesNotRun(format!("cannot run unzip for {name}: {e}")))?;
        for entry in String::from_utf8_lossy(&list.stdout).lines() {
            let p = Path::new(entry);
            if p.components().any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir)) {
                return Err(bad(format!("its entry '{entry}' would land outside the install folder")));
            }
        }
        let out = std::process::Command::new("unzip")
            .args(["-q", "-o"])
            .arg(archive)
            .arg("-d")
            .arg(&tree)
            .output()
            .map_err(|e| InstallError::DoesNotRun(format!("cannot run unzip for {name}: {e}")))?;
        if !out.status.success() {
            return Err(bad(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
    } else {
        return Err(bad("unknown archive type".into()));
    }
    // No link may lead out of the tree (a zip's links are made after its files, so nothing was
    // written through one; a link left pointing outside is refused all the same).
    if let Some(link) = link_out_of(&tree, &tree) {
        let _ = std::fs::remove_dir_all(&tree);
        return Err(bad(format!("its link '{}' leads outside the install folder", link.display())));
    }
    // By name, executable bit or not (archives made on Windows may lack it).
    let exe_path = binary::find_file(&tree, exe, &|_| true).ok_or_else(|| bad(format!("it contains no {exe}")))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe_path, std::fs::Permissions::from_mode(0o755)).map_err(|e| io_error(&exe_path, e))?;
    std::fs::write(tree.join("version.txt"), format!("{version}\n")).map_err(|e| io_error(&tree, e))?;
    sync_tree(&tree).map_err(|e| io_error(&tree, e))?;
    Ok(tree)
}

/// The first symbolic link under `dir` whose target is absolute or resolves outside `root`.
fn link_out_of(root: &Path, dir: &Path) -> Option<PathBuf> {
    let root = std::fs::canonicalize(root).ok()?;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).ok()?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&p).ok()?;
            let escapes = target.is_absolute()
                || std::fs::canonicalize(&p)
                    .map_or(target.components().any(|c| c == std::path::Component::ParentDir), |t| {
                        !t.starts_with(&root)
                    });
            if escapes {
                return Some(p);
            }
        } else if meta.is_dir() {
            if let Some(found) = link_out_of(&root, &p) {
                return Some(found);
            }
        }
    }
    None
}

fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            sync_tree(&p)?;
        } else if meta.is_file() {
            std::fs::File::open(&p)?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// The new executable must start: `--version` within 30 s (a wrong-architecture or truncated
/// binary fails here, before it replaces anything).
async fn check_runs(tree: &Path, exe: &str) -> Result<(), InstallError> {
    let path = binary::find_recursive(tree, exe)
        .ok_or_else(|| InstallError::DoesNotRun(format!("{exe} vanished from {}", tree.display())))?;
    // Run as a backend runs: with the allow-listed environment only.
    match crate::supervisor::run_once(&path, &["--version".to_string()], Duration::from_secs(30), true).await {
        Ok((Some(0), _)) => Ok(()),
        Ok((code, out)) => Err(InstallError::DoesNotRun(format!(
            "the downloaded {exe} does not run ({}): {}",
            code.map_or("killed by a signal".to_string(), |c| format!("exit status: {c}")),
            out.lines().last().unwrap_or_default()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            Err(InstallError::DoesNotRun(format!("the downloaded {exe} did not answer --version in 30 s")))
        }
        Err(e) => Err(InstallError::DoesNotRun(format!("the downloaded {exe} does not run: {e}"))),
    }
}

/// Puts `tree` at `final_dir` atomically: exchanged with the old install in one syscall, or
/// renamed when there is none. The old install ends up in the staging area and is removed.
fn swap_in(tree: &Path, final_dir: &Path) -> Result<(), InstallError> {
    let parent = final_dir.parent().expect("backend dir has a parent");
    std::fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
    if final_dir.exists() {
        exchange(tree, final_dir).map_err(|e| io_error(final_dir, e))?;
        // `tree` now holds the old install.
        let _ = std::fs::remove_dir_all(tree);
    } else {
        std::fs::rename(tree, final_dir).map_err(|e| io_error(final_dir, e))?;
    }
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| io_error(parent, e))
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths; renameat2 does not keep them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes `recipe:backend`'s managed directory (the caller unloads the models that run on it
/// first). The directory is first renamed into the staging area, so it disappears in one step.
/// `Err(NotInstalled)` when there is nothing to remove.
pub async fn uninstall(cache_dir: &Path, recipe: backends::Recipe, backend: &str) -> Result<(), InstallError> {
    let (dir, _) = recipe.dir_and_exe();
    let final_dir = binary::managed_dir(cache_dir, dir, backend);
    if !final_dir.exists() {
        return Err(InstallError::NotInstalled(recipe.to_string(), backend.to_string()));
    }
    let staging = staging_root(cache_dir);
    std::fs::create_dir_all(&staging).map_err(|e| io_error(&staging, e))?;
    let gone = staging.join(format!("uninstall-{recipe}-{backend}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&gone);
    std::fs::rename(&final_dir, &gone).map_err(|e| io_error(&final_dir, e))?;
    let _ = crate::offload::offload(move || std::fs::remove_dir_all(gone)).await;
    tracing::info!(recipe = %recipe, backend, "backend uninstalled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_swaps_two_directories_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("version.txt"), "new").unwrap();
        std::fs::write(b.join("version.txt"), "old").unwrap();
        swap_in(&a, &b).unwrap();
        assert_eq!(std::fs::read_to_string(b.join("version.txt")).unwrap(), "new");
        assert!(!a.exists(), "the old install is removed");
    }

    /// An archive entry: name, kind, link target, content.
    type Entry<'a> = (&'a str, tar::EntryType, Option<&'a str>, &'a [u8]);

    /// A tar.gz whose entries are written raw (no path checks of the tar crate's builder).
    fn hostile_archive(dir: &Path, entries: &[Entry]) -> PathBuf {
        let path = dir.join("llama-b1-bin-ubuntu-x64.tar.gz");
        let gz = flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, kind, link, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            // Raw bytes into the name field: set_path would refuse `..` and absolute paths.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap();
        path
    }

    /// A zip whose entries are written as named (the zip crate checks no path on write).
    fn hostile_zip(dir: &Path, entries: &[Entry]) -> PathBuf {
        let path = dir.join("llama-b1-bin-ubuntu-x64.zip");
        let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let o = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        for (name, kind, link, data) in entries {
            match (kind, link) {
                (tar::EntryType::Symlink, Some(l)) => z.add_symlink(*name, *l, o).unwrap(),
                _ => {
                    z.start_file(*name, o.unix_permissions(0o755)).unwrap();
                    std::io::Write::write_all(&mut z, data).unwrap();
                }
            }
        }
        z.finish().unwrap();
        path
    }

    /// CVE-class "zip slip": a backend archive's `../`, absolute and symlink-through entries
    /// are refused, and nothing lands outside the staging folder.
    #[test]
    fn an_archive_that_writes_outside_its_folder_is_refused_and_writes_nothing_there() {
        use tar::EntryType::{Regular, Symlink};
        let tmp = tempfile::tempdir().unwrap();
        let (staging, outside) = (tmp.path().join("staging"), tmp.path().join("outside"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let out = outside.display().to_string();
        let abs = format!("{out}/abs.txt");
        let cases: Vec<Vec<Entry>> = vec![
            vec![("llama-server", Regular, None, b"#!/bin/sh\n"), ("../outside/dotdot.txt", Regular, None, b"x")],
            vec![("llama-server", Regular, None, b"#!/bin/sh\n"), (abs.as_str(), Regular, None, b"x")],
            vec![
                ("llama-server", Regular, None, b"#!/bin/sh\n"),
                ("link", Symlink, Some(out.as_str()), b""),
                ("link/through.txt", Regular, None, b"x"),
            ],
        ];
        for (i, entries) in cases
            .iter()
            .enumerate()
            .flat_map(|(i, e)| [(i, e, false), (i + 10, e, true)])
            .map(|(i, e, zip)| (i, (e, zip)))
        {
            let (entries, zip) = entries;
            let archive = if zip { hostile_zip(tmp.path(), entries) } else { hostile_archive(tmp.path(), entries) };
            let r = unpack(&archive, &staging, "llama-server", "b1");
            let written: Vec<_> = std::fs::read_dir(&outside).unwrap().flatten().map(|e| e.file_name()).collect();
            assert!(written.is_empty(), "case {i}: wrote {written:?} outside ({r:?})");
            match r {
                Err(InstallError::BadArchive(_, why)) => {
                    assert!(why.contains("would land outside") || why.contains("link"), "case {i}: {why}")
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
    }
}
