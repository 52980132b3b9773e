//! The Hugging Face hub cache as `huggingface_hub` lays it out:
//!
//! ```text
//! <root>/models--org--repo/refs/main            (commit sha)
//! <root>/models--org--repo/blobs/<etag>         (file content)
//! <root>/models--org--repo/snapshots/<sha>/<path> → ../../blobs/<etag>   (symlink)
//! ```
//!
//! Files placed directly in a snapshot folder (Lemonade v9's way) are recognised too.

use std::path::{Path, PathBuf};

use registry::checkpoint::repo_folder_name;
pub use registry::{Snapshot, DOWNLOAD_MANIFEST};

/// Cache root: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_root_from_env(get: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(p) = get("HF_HUB_CACHE").filter(|s| !s.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = get("HF_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(p).join("hub");
    }
    let home = get("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".cache").join("huggingface").join("hub")
}

/// The snapshots of `repo` under `root`: the one `refs/main` names first, then the others
/// by name. Missing repo → empty.
pub fn snapshots(root: &Path, repo: &str) -> Vec<Snapshot> {
    let repo_dir = root.join(repo_folder_name(repo));
    let snap_root = repo_dir.join("snapshots");
    let Ok(entries) = std::fs::read_dir(&snap_root) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    if let Ok(main) = std::fs::read_to_string(repo_dir.join("refs").join("main")) {
        let main = main.trim();
        if let Some(i) = names.iter().position(|n| n == main) {
            let n = names.remove(i);
            names.insert(0, n);
        }
    }
    names
        .into_iter()
        .map(|n| {
            let dir = snap_root.join(n);
            let mut files = Vec::new();
            list_files(&dir, "", &mut files);
            files.sort();
            Snapshot { dir, files }
        })
        .collect()
}

fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let path = e.path();
        // metadata() follows symlinks: a snapshot link to a blob counts as a file.
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => list_files(&path, &rel, out),
            Ok(_) => out.push(rel),
            // A dangling symlink (blob missing) is not a usable file.
            Err(_) => {}
        }
    }
}

/// Whether a resolved file counts as downloaded: it exists, its snapshot has no download
/// manifest, and no partial download sits beside it.
pub fn is_complete(file: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(file) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let Some(parent) = file.parent() else {
        return false;
    };
    if parent.join(DOWNLOAD_MANIFEST).exists() {
        return false;
    }
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    !parent.join(format!("{name}.partial")).exists() && !parent.join(format!("{name}.incomplete")).exists()
}

/// Removes `repo`'s whole folder from the cache (every variant); a missing folder is fine.
pub async fn remove_repo(root: &Path, repo: &str) -> Result<(), crate::HostError> {
    let dir = root.join(repo_folder_name(repo));
    let gone = dir.clone();
    match crate::offload::offload_io(move || std::fs::remove_dir_all(gone)).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(crate::HostError::io(&dir)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_root_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(cache_root_from_env(env(&[("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b")])), PathBuf::from("/a"));
        assert_eq!(cache_root_from_env(env(&[("HF_HOME", "/b"), ("HOME", "/h")])), PathBuf::from("/b/hub"));
        assert_eq!(cache_root_from_env(env(&[("HOME", "/h")])), PathBuf::from("/h/.cache/huggingface/hub"));
    }

    #[test]
    fn reads_blob_symlinks_and_plain_files_main_ref_first() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--repo");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "bbb").unwrap();
        std::fs::write(repo.join("blobs/etag1"), b"GGUF").unwrap();
        let a = repo.join("snapshots/aaa");
        let b = repo.join("snapshots/bbb/sub");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("plain-Q4_0.gguf"), b"GGUF").unwrap();
        std::os::unix::fs::symlink("../../../blobs/etag1", b.join("linked-Q8_0.gguf")).unwrap();
        std::os::unix::fs::symlink("../../blobs/missing", repo.join("snapshots/bbb/dangling.gguf")).unwrap();

        let snaps = snapshots(tmp.path(), "org/repo");
        assert_eq!(snaps.len(), 2);
        assert!(snaps[0].dir.ends_with("bbb"), "refs/main snapshot first");
        assert_eq!(snaps[0].files, vec!["sub/linked-Q8_0.gguf".to_string()]);
        assert_eq!(snaps[1].files, vec!["plain-Q4_0.gguf".to_string()]);
        assert!(is_complete(&snaps[0].dir.join("sub/linked-Q8_0.gguf")));
        assert!(snapshots(tmp.path(), "org/other").is_empty());
    }

    #[test]
    fn partial_or_manifest_means_not_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("m.gguf");
        std::fs::write(&f, b"x").unwrap();
        assert!(is_complete(&f));
        std::fs::write(tmp.path().join("m.gguf.partial"), b"x").unwrap();
        assert!(!is_complete(&f));
        std::fs::remove_file(tmp.path().join("m.gguf.partial")).unwrap();
        std::fs::write(tmp.path().join(DOWNLOAD_MANIFEST), b"{}").unwrap();
        assert!(!is_complete(&f));
        assert!(!is_complete(&tmp.path().join("absent.gguf")));
    }
}

/// Lemonade v11's provenance file in a repository's cache folder.
pub const PROVENANCE_FILE: &str = ".lemonade_registry.json";

/// Records where `repo`'s files came from, as Lemonade v11 does in
/// `models--org--repo/.lemonade_registry.json`: the source, the revision asked for, the commit
/// downloaded, when (Unix seconds), and each model pulled from it (`model`, merged with the
/// models the file already lists). Written atomically.
pub fn record_provenance(
    root: &Path,
    repo: &str,
    revision: &str,
    commit: &str,
    model: Option<&str>,
    at_unix: u64,
) -> Result<(), crate::HostError> {
    use serde_json::{json, Value};
    let path = root.join(repo_folder_name(repo)).join(PROVENANCE_FILE);
    let previous: Value =
        std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(Value::Null);
    let mut models = previous["processed_models"].as_object().cloned().unwrap_or_default();
    if let Some(m) = model {
        models.insert(m.to_string(), json!({"snapshot_id": commit, "downloaded_at": at_unix}));
    }
    let v = json!({"source": "huggingface", "repo_id": repo, "revision": revision, "snapshot_id": commit,
                   "downloaded_at": at_unix, "processed_models": models});
    let bytes = serde_json::to_vec_pretty(&v).expect("JSON serializes");
    crate::files::write_atomic(&path, &bytes).map_err(crate::HostError::io(&path))
}

/// The commit `repo`'s files were downloaded at, from its provenance file, else from the
/// snapshot `refs/main` names.
pub fn local_commit(root: &Path, repo: &str) -> Option<String> {
    let dir = root.join(repo_folder_name(repo));
    let from_file = std::fs::read(dir.join(PROVENANCE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["snapshot_id"].as_str().map(str::to_string));
    from_file.or_else(|| std::fs::read_to_string(dir.join("refs").join("main")).ok().map(|s| s.trim().to_string()))
}

#[cfg(test)]
mod provenance_tests {
    use super::*;

    #[test]
    fn provenance_is_recorded_merged_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("models--org--r")).unwrap();
        assert_eq!(local_commit(tmp.path(), "org/r"), None);
        record_provenance(tmp.path(), "org/r", "main", "abc", Some("user.A"), 10).unwrap();
        record_provenance(tmp.path(), "org/r", "main", "def", Some("user.B"), 20).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("models--org--r").join(PROVENANCE_FILE)).unwrap())
                .unwrap();
        assert_eq!(
            (v["snapshot_id"].as_str(), v["source"].as_str(), v["downloaded_at"].as_u64()),
            (Some("def"), Some("huggingface"), Some(20))
        );
        assert_eq!(v["processed_models"]["user.A"]["snapshot_id"], "abc", "earlier models kept");
        assert_eq!(local_commit(tmp.path(), "org/r").as_deref(), Some("def"));
    }
}

/// Why a file in a repository's cache folder is an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanKind {
    /// `blobs/<etag>.incomplete`: a download that stopped and that nothing will resume.
    Incomplete,
    /// `blobs/<etag>` that no snapshot links to.
    Unreferenced,
}

/// A file [`orphans`] found: its path relative to the cache root, its size and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub path: String,
    pub size: u64,
    pub kind: OrphanKind,
}

/// The orphaned files of `repo`'s cache folder: partial downloads (`blobs/*.incomplete`) and
/// blobs no snapshot symlink points to. Plain files in snapshots (v9's layout) and the
/// blobs they do not use are not orphans of this layout: a folder with no `blobs` has none.
pub fn orphans(root: &Path, repo: &str) -> Vec<Orphan> {
    let folder = repo_folder_name(repo);
    let repo_dir = root.join(&folder);
    let Ok(entries) = std::fs::read_dir(repo_dir.join("blobs")) else {
        return Vec::new();
    };
    let mut linked = std::collections::HashSet::new();
    linked_blobs(&repo_dir.join("snapshots"), &mut linked);
    let mut found: Vec<Orphan> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kind = if name.ends_with(".incomplete") {
                OrphanKind::Incomplete
            } else if !linked.contains(&name) {
                OrphanKind::Unreferenced
            } else {
                return None;
            };
            let size = e.metadata().map_or(0, |m| m.len());
            Some(Orphan { path: format!("{folder}/blobs/{name}"), size, kind })
        })
        .collect();
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The blob names the symlinks under `dir` point to (followed one level: `../../blobs/<x>`).
fn linked_blobs(dir: &Path, out: &mut std::collections::HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            linked_blobs(&e.path(), out);
        } else if t.is_symlink() {
            if let Some(name) = std::fs::read_link(e.path()).ok().and_then(|l| l.file_name().map(|n| n.to_owned())) {
                out.extend(name.into_string().ok());
            }
        }
    }
}

/// Removes the orphans `found` under `root` (paths as [`orphans`] gives them); a file already
/// gone is fine.
pub fn remove_orphans(root: &Path, found: &[Orphan]) -> Result<(), crate::HostError> {
    for o in found {
        let p = root.join(&o.path);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(crate::HostError::io(&p)(e)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod orphan_tests {
    use super::*;

    #[test]
    fn partial_and_unlinked_blobs_are_orphans_linked_ones_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--r");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/c1/sub")).unwrap();
        std::fs::write(repo.join("blobs/used"), b"1234").unwrap();
        std::fs::write(repo.join("blobs/used2"), b"12").unwrap();
        std::fs::write(repo.join("blobs/stale"), b"123").unwrap();
        std::fs::write(repo.join("blobs/next.incomplete"), b"12345").unwrap();
        std::os::unix::fs::symlink("../../blobs/used", repo.join("snapshots/c1/a.gguf")).unwrap();
        std::os::unix::fs::symlink("../../../blobs/used2", repo.join("snapshots/c1/sub/b.gguf")).unwrap();

        let found = orphans(tmp.path(), "org/r");
        let got: Vec<_> = found.iter().map(|o| (o.path.as_str(), o.size, o.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("models--org--r/blobs/next.incomplete", 5, OrphanKind::Incomplete),
                ("models--org--r/blobs/stale", 3, OrphanKind::Unreferenced),
            ]
        );
        remove_orphans(tmp.path(), &found).unwrap();
        remove_orphans(tmp.path(), &found).unwrap();
        assert!(orphans(tmp.path(), "org/r").is_empty());
        assert!(repo.join("blobs/used").exists() && repo.join("blobs/used2").exists(), "linked blobs kept");
        assert!(orphans(tmp.path(), "org/absent").is_empty());
    }
}
