//! The prompt cache on disk: `<cache>/prompt-cache/<key dir>/` holds the slot files
//! llama-server saved (`<name>.bin`) and, beside each, its [`Entry`] (`<name>.bin.json`,
//! written atomically after the file was hashed and renamed into place). A file counts only
//! with its entry, and is restored only if its size and sha256 still match. llama-server
//! writes into `<name>.bin.part`; a kill mid-save leaves that, or a file without an entry,
//! and [`Store::open`] removes both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

pub use backends::prompt_cache::Entry;

use crate::files::write_atomic;

/// Suffix of a slot file llama-server is still writing.
pub const PART: &str = ".part";

/// The tokens in a slot file's header (see `backends::prompt_cache::saved_tokens`).
pub fn read_tokens(path: &Path) -> Option<Vec<i32>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut first = [0u8; 12];
    f.read_exact(&mut first).ok()?;
    let len = backends::prompt_cache::header_len(&first)?;
    if len > std::fs::metadata(path).ok()?.len() as usize {
        return None;
    }
    let mut head = first.to_vec();
    head.resize(len, 0);
    f.read_exact(&mut head[12..]).ok()?;
    backends::prompt_cache::saved_tokens(&head)
}

/// Why a slot file is not kept, or not trusted (logged: the cache never fails a request).
#[derive(Debug, thiserror::Error)]
pub enum SlotFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{file} has {len} bytes, its entry says {entry}")]
    Size { file: String, len: u64, entry: u64 },
    #[error("{file} does not match its sha256")]
    Sha256 { file: String },
    #[error("{file} is not a slot file this version reads")]
    Unreadable { file: String },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("the cache's file task failed: {0}")]
    Task(String),
}

/// The cache directory, and what it holds per model (kept in memory, so `health` reads it
/// without touching the disk).
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    usage: Arc<Mutex<BTreeMap<String, (u64, u64)>>>,
}

/// Milliseconds since the epoch (the LRU clock, and the saved files' names).
pub fn now_ms() -> u64 {
    crate::offload::unix_ms()
}

impl Store {
    /// Opens `root`, removing what a killed save left behind: partial files, files without an
    /// entry, entries without a file.
    pub fn open(root: &Path) -> Store {
        let s = Store { root: root.to_path_buf(), usage: Arc::default() };
        for dir in s.dirs() {
            crate::files::clean_leftover_temps(&dir);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let orphan = if name.ends_with(PART) {
                    true
                } else if let Some(bin) = name.strip_suffix(".json") {
                    !dir.join(bin).is_file()
                } else {
                    !dir.join(format!("{name}.json")).is_file()
                };
                if orphan {
                    tracing::info!(file = %p.display(), "prompt cache: removing a file a killed save left");
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        s.refresh();
        s
    }

    fn dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.root).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()
    }

    /// The directory of one key, created.
    pub fn dir(&self, key_dir: &str) -> std::io::Result<PathBuf> {
        let d = self.root.join(key_dir);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Every entry: (its key directory, the entry).
    pub fn all(&self) -> Vec<(PathBuf, Entry)> {
        let mut out = Vec::new();
        for dir in self.dirs() {
            out.extend(self.entries(&dir).into_iter().map(|e| (dir.clone(), e)));
        }
        out
    }

    /// The entries of one key directory (unreadable ones skipped), most recently used first.
    pub fn entries(&self, dir: &Path) -> Vec<Entry> {
        let mut v: Vec<Entry> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin.json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        v.sort_by_key(|e: &Entry| std::cmp::Reverse(e.used_ms));
        v
    }

    /// Checks a slot file against its entry (size, then sha256).
    pub fn verify(&self, dir: &Path, e: &Entry) -> Result<(), SlotFileError> {
        let p = dir.join(&e.file);
        let io = |source| SlotFileError::Io { path: p.display().to_string(), source };
        let len = std::fs::metadata(&p).map_err(io)?.len();
        if len != e.bytes {
            return Err(SlotFileError::Size { file: e.file.clone(), len, entry: e.bytes });
        }
        let sha = crate::download::sha256_file(&p).map_err(io)?;
        if sha != e.sha256 {
            return Err(SlotFileError::Sha256 { file: e.file.clone() });
        }
        Ok(())
    }

    /// Makes the file llama-server just saved for `model` (`<file>.part`, made with the key
    /// `material`) an entry: reads its tokens, hashes it, renames it into place, then writes
    /// its entry atomically. A file whose bytes an entry of the directory already holds is
    /// dropped and that entry marked used instead.
    pub fn commit(&self, dir: &Path, file: &str, model: &str, material: &str) -> Result<Entry, SlotFileError> {
        let part = dir.join(format!("{file}{PART}"));
        let io = |source| SlotFileError::Io { path: part.display().to_string(), source };
        let bytes = std::fs::metadata(&part).map_err(io)?.len();
        let Some(token_ids) = read_tokens(&part) else {
            let _ = std::fs::remove_file(&part);
            return Err(SlotFileError::Unreadable { file: file.to_string() });
        };
        let e = Entry {
            model: model.into(),
            material: material.into(),
            file: file.into(),
            bytes,
            sha256: crate::download::sha256_file(&part).map_err(io)?,
            token_ids,
            used_ms: now_ms(),
        };
        if let Some(same) = self.entries(dir).into_iter().find(|x| x.sha256 == e.sha256 && x.material == e.material) {
            let _ = std::fs::remove_file(&part);
            self.touch(dir, &same);
            return Ok(same);
        }
        let file = dir.join(&e.file);
        std::fs::rename(&part, &file).map_err(io)?;
        let json = serde_json::to_vec_pretty(&e)?;
        write_atomic(&dir.join(format!("{}.json", e.file)), &json).map_err(io)?;
        self.refresh();
        Ok(e)
    }

    /// Marks an entry used now (LRU).
    pub fn touch(&self, dir: &Path, e: &Entry) {
        let mut e = e.clone();
        e.used_ms = now_ms();
        if let Ok(json) = serde_json::to_vec_pretty(&e) {
            let _ = write_atomic(&dir.join(format!("{}.json", e.file)), &json);
        }
    }

    /// Removes an entry and its file (the entry first, so a kill in between leaves an orphan
    /// file that [`Store::open`] removes, never an entry without its file).
    pub fn remove(&self, dir: &Path, e: &Entry) {
        remove_files(dir, e);
        self.refresh();
    }

    /// Removes the least recently used entries until the rest fit in `limit` bytes; returns
    /// how many.
    pub fn enforce(&self, limit: u64) -> usize {
        let (dirs, entries): (Vec<PathBuf>, Vec<Entry>) = self.all().into_iter().unzip();
        let evict = backends::prompt_cache::to_evict(&entries, limit);
        for &i in &evict {
            remove_files(&dirs[i], &entries[i]);
        }
        if !evict.is_empty() {
            self.refresh();
        }
        evict.len()
    }

    /// Removes everything; returns (files, bytes) removed.
    pub fn clear(&self) -> (u64, u64) {
        let (mut files, mut bytes) = (0, 0);
        for (d, e) in self.all() {
            remove_files(&d, &e);
            files += 1;
            bytes += e.bytes;
        }
        for d in self.dirs() {
            let _ = std::fs::remove_dir(d);
        }
        self.refresh();
        (files, bytes)
    }

    /// Re-reads what each model has saved.
    pub fn refresh(&self) {
        let mut usage = BTreeMap::new();
        for (_, e) in self.all() {
            let u: &mut (u64, u64) = usage.entry(e.model.clone()).or_default();
            u.0 += 1;
            u.1 += e.bytes;
        }
        *self.usage.lock() = usage;
    }

    /// (entries, bytes) saved for `model`.
    pub fn usage(&self, model: &str) -> (u64, u64) {
        self.usage.lock().get(model).copied().unwrap_or_default()
    }

    /// (entries, bytes) saved for every model together.
    pub fn total(&self) -> (u64, u64) {
        self.usage.lock().values().fold((0, 0), |a, u| (a.0 + u.0, a.1 + u.1))
    }
}

fn remove_files(dir: &Path, e: &Entry) {
    let _ = std::fs::remove_file(dir.join(format!("{}.json", e.file)));
    let _ = std::fs::remove_file(dir.join(&e.file));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(s: &Store, d: &Path, file: &str) -> Result<Entry, SlotFileError> {
        s.commit(d, file, "m", "k")
    }

    /// A slot file as llama-server writes it: header, packed tokens, then `fill` state bytes.
    fn slot_file(tokens: &[i32], fill: u8, n: usize) -> Vec<u8> {
        let mut v = backends::prompt_cache::slot_header(tokens);
        v.extend(std::iter::repeat_n(fill, n));
        v
    }

    #[test]
    fn a_committed_file_verifies_and_corruption_or_truncation_is_caught() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::open(tmp.path());
        let d = s.dir("k1").unwrap();
        std::fs::write(d.join("a.bin.part"), slot_file(&[5, 6, 7], 7, 960)).unwrap();
        let e = commit(&s, &d, "a.bin").unwrap();
        assert_eq!((e.bytes, s.usage("m"), e.token_ids.clone()), (1000, (1, 1000), vec![5, 6, 7]));
        s.verify(&d, &e).unwrap();
        let mut bytes = std::fs::read(d.join("a.bin")).unwrap();
        bytes[500] ^= 1;
        std::fs::write(d.join("a.bin"), &bytes).unwrap();
        assert!(s.verify(&d, &e).unwrap_err().to_string().contains("sha256"));
        std::fs::write(d.join("a.bin"), &bytes[..999]).unwrap();
        assert!(s.verify(&d, &e).unwrap_err().to_string().contains("999 bytes"));
        // The same bytes twice make one entry.
        std::fs::write(d.join("b.bin.part"), slot_file(&[1], 9, 10)).unwrap();
        let b = commit(&s, &d, "b.bin").unwrap();
        std::fs::write(d.join("c.bin.part"), slot_file(&[1], 9, 10)).unwrap();
        assert_eq!(commit(&s, &d, "c.bin").unwrap().file, b.file);
        assert!(!d.join("c.bin").exists() && !d.join("c.bin.part").exists());
        assert_eq!(s.entries(&d).len(), 2);
        // Not a slot file: refused, and removed.
        std::fs::write(d.join("x.bin.part"), b"GGUF and nothing").unwrap();
        assert!(commit(&s, &d, "x.bin").is_err());
        assert!(!d.join("x.bin.part").exists());
        // Eviction keeps what fits, least recently used out first.
        assert_eq!(s.enforce(u64::MAX), 0);
        assert_eq!(s.enforce(0), 2);
        assert_eq!(s.total(), (0, 0));
    }

    #[test]
    fn opening_removes_what_a_killed_save_left_and_clear_empties_it() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::open(tmp.path());
        let d = s.dir("k1").unwrap();
        std::fs::write(d.join("a.bin.part"), b"half").unwrap();
        std::fs::write(d.join("whole.bin.part"), slot_file(&[3], 1, 5)).unwrap();
        let whole = commit(&s, &d, "whole.bin").unwrap();
        std::fs::write(d.join("orphan.bin"), b"no entry").unwrap();
        let lost = Entry { file: "lost.bin".into(), ..whole.clone() };
        std::fs::write(d.join("lost.bin.json"), serde_json::to_vec(&lost).unwrap()).unwrap();
        let s = Store::open(tmp.path());
        let names: Vec<String> =
            std::fs::read_dir(&d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(d.join("whole.bin").exists() && d.join("whole.bin.json").exists());
        assert_eq!(s.entries(&d), vec![whole.clone()]);
        assert_eq!(s.clear(), (1, whole.bytes));
        assert_eq!(s.total(), (0, 0));
        assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
    }
}
