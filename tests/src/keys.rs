//! The key sweep: every secret a test hands a [`crate::Lemonade`] (an environment variable
//! whose name ends in `KEY`, `TOKEN`, `SECRET` or `PASSWORD`, and each key a test names with
//! [`crate::Lemonade::secret`]) is searched for, when that server is dropped, in its log, in every
//! answer the helpers read back (HTTP bodies and CLI output) and in every file of its sandbox
//! (links not followed). A find fails the test.
//!
//! Each sweep also writes a record to `$LEMONADE_KEY_SWEEP/` when that is set; `cargo xtask test`
//! sets it, and after the whole run sums the records and fails on any find, or on a full run
//! that swept nothing (the sweep must be seen to run).

use std::path::{Path, PathBuf};

use serde_json::json;

/// Names whose values are secrets.
const SECRET_SUFFIXES: [&str; 4] = ["KEY", "TOKEN", "SECRET", "PASSWORD"];

/// Keys shorter than this are not searchable (a one-letter key is in every log); a test that
/// uses one fails and says so.
pub const MIN_KEY_LEN: usize = 8;

/// The secrets among `env`.
pub fn secrets_in(env: &[(&str, &str)]) -> Vec<String> {
    env.iter()
        .filter(|(k, _)| SECRET_SUFFIXES.iter().any(|s| k.to_ascii_uppercase().ends_with(s)))
        .filter(|(k, _)| !k.starts_with("LEMONADE_TEST_"))
        .map(|(_, v)| v.to_string())
        .collect()
}

/// What one sweep searched and found.
#[derive(Debug, Default)]
pub struct Sweep {
    pub keys: usize,
    pub files: usize,
    pub bytes: u64,
    pub log_lines: usize,
    pub answers: usize,
    /// One line per find: which key (its first 3 characters), where.
    pub leaks: Vec<String>,
}

/// Searches `log`, `answers` and the files under `dir` (but those `placed` by the test) for each of `keys` and, for a key of 16
/// characters or more, its middle (a key cut or quoted is still found).
pub fn sweep(keys: &[String], log: &[String], answers: &[String], dir: &Path, placed: &[PathBuf]) -> Sweep {
    let mut s = Sweep { keys: keys.len(), log_lines: log.len(), answers: answers.len(), ..Sweep::default() };
    if keys.is_empty() {
        return s;
    }
    let mut needles = Vec::new();
    for k in keys {
        if k.len() < MIN_KEY_LEN {
            s.leaks.push(format!("key {:?} is shorter than {MIN_KEY_LEN} characters: it cannot be searched for", k));
            continue;
        }
        let shown = format!("{}…", &k[..3]);
        needles.push((shown.clone(), k.clone()));
        // The middle of a long key too (a key cut or quoted); a short key's middle is too
        // common a string to mean anything.
        if k.len() >= 16 {
            needles.push((shown, k[3..k.len() - 3].to_string()));
        }
    }
    let finders: Vec<_> = needles.iter().map(|(shown, n)| (shown, memchr::memmem::Finder::new(n.as_bytes()))).collect();
    let mut look = |place: &str, bytes: &[u8]| {
        for (shown, f) in &finders {
            if f.find(bytes).is_some() {
                s.leaks.push(format!("key {shown} in {place}"));
            }
        }
    };
    for (i, line) in log.iter().enumerate() {
        look(&format!("log line {}", i + 1), line.as_bytes());
    }
    for (i, a) in answers.iter().enumerate() {
        look(&format!("answer {}", i + 1), a.as_bytes());
    }
    let mut files = 0;
    let mut bytes = 0;
    for p in files_under(dir).into_iter().filter(|p| !placed.contains(p)) {
        if let Ok(b) = std::fs::read(&p) {
            files += 1;
            bytes += b.len() as u64;
            look(&p.display().to_string(), &b);
        }
    }
    s.files = files;
    s.bytes = bytes;
    s.leaks.dedup();
    s
}

/// The plain files under `dir`, links not followed.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// Writes `s` as a record under `$LEMONADE_KEY_SWEEP`, when set.
pub fn record(s: &Sweep) {
    let Some(dir) = std::env::var_os("LEMONADE_KEY_SWEEP") else { return };
    let dir = PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let rec = json!({"test": test, "keys": s.keys, "files": s.files, "bytes": s.bytes,
                     "log_lines": s.log_lines, "answers": s.answers, "leaks": s.leaks});
    let _ = std::fs::write(dir.join(format!("{}-{nanos}.json", std::process::id())), rec.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_finds_a_key_or_its_middle_in_a_log_an_answer_or_a_file_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let key = "sk-sweep-0123456789".to_string();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/config.json"), "{\"k\": \"sweep-01234567\"}").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("holds"), &key).unwrap();
        std::os::unix::fs::symlink(outside.path().join("holds"), dir.path().join("link")).unwrap();
        let log = vec!["started".to_string(), format!("Bearer {key}")];
        let answers = vec!["{}".to_string(), format!("\"{}\"", &key[2..])];
        let s = sweep(std::slice::from_ref(&key), &log, &answers, dir.path(), &[]);
        assert_eq!(s.files, 1);
        assert!(s.leaks.iter().any(|l| l.contains("log line 2")), "{:?}", s.leaks);
        assert!(s.leaks.iter().any(|l| l.contains("answer 2")), "{:?}", s.leaks);
        assert!(s.leaks.iter().any(|l| l.contains("config.json")), "{:?}", s.leaks);
        assert!(!s.leaks.iter().any(|l| l.contains("link")), "{:?}", s.leaks);
        assert!(s.leaks.iter().all(|l| !l.contains(&key)), "a find never prints the key: {:?}", s.leaks);

        let placed = [dir.path().join("a/b/config.json")];
        let clean = sweep(&[key], &log[..1], &answers[..1], dir.path(), &placed);
        assert!(clean.leaks.is_empty(), "{:?}", clean.leaks);
        let short = sweep(&["k".into()], &[], &[], dir.path(), &[]);
        assert_eq!(short.leaks.len(), 1, "a key too short to search is itself a failure");
    }

    #[test]
    fn secrets_are_the_key_token_secret_and_password_variables() {
        let env = [("LEMONADE_API_KEY", "a"), ("HF_TOKEN", "b"), ("LEMONADE_LLAMACPP_CPU_BIN", "c"), ("X_SECRET", "d")];
        assert_eq!(secrets_in(&env), ["a", "b", "d"]);
    }
}
