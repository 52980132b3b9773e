//! The Hugging Face Hub client and downloader, at the edge of the registry (the rest of the
//! crate does no network I/O).
//!
//! Files are written in huggingface_hub's cache layout, so caches are shared with Python
//! tools: the bytes go to `blobs/<etag>.incomplete` (huggingface_hub's own partial name, so
//! either tool resumes the other's download), are verified (size, and sha256 for LFS files)
//! while they stream, then renamed to `blobs/<etag>`; `snapshots/<commit>/<path>` is a relative
//! symlink to the blob and `refs/main` holds the commit.
//!
//! Resume: an existing partial file is continued with `Range: bytes=<len>-`. Retry: dropped
//! connections, timeouts, stalls and 5xx/429 are retried with exponential back-off, keeping the
//! partial file; other 4xx fail at once (a 404 or 401 will not fix itself).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::checkpoint::repo_folder_name;
use crate::plan::RepoFile;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{url}: HTTP {status}{}", if *status == 401 || *status == 403 { " (set HF_TOKEN for gated or private repositories)" } else { "" })]
    Status { url: String, status: u16 },
    #[error("{url}: {message} (gave up after {attempts} attempts)")]
    GaveUp { url: String, message: String, attempts: u32 },
    #[error("{path}: downloaded {got} bytes, expected {expected}")]
    Size { path: String, got: u64, expected: u64 },
    #[error("{path}: sha256 {got} does not match the Hub's {expected}; the partial download was removed")]
    Sha256 { path: String, got: String, expected: String },
    #[error("{0}: the download was cancelled")]
    Cancelled(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{url}: unexpected answer: {message}")]
    Protocol { url: String, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.display().to_string(), source }
}

/// How hard to try.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// No byte for this long counts as a dropped connection.
    pub stall: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            stall: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Hub {
    http: reqwest::Client,
    /// `HF_ENDPOINT`, default https://huggingface.co.
    pub endpoint: String,
    token: Option<String>,
    pub policy: RetryPolicy,
}

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>) -> Hub {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("lemonade/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("reqwest client");
        Hub {
            http,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            policy: RetryPolicy::default(),
        }
    }

    /// From `HF_ENDPOINT` and `HF_TOKEN`.
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
        Hub::new(&endpoint, std::env::var("HF_TOKEN").ok())
    }

    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.get(url);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn json(&self, url: &str) -> Result<serde_json::Value, HubError> {
        let resp = self.get(url).timeout(Duration::from_secs(60)).send().await.map_err(|e| HubError::GaveUp {
            url: url.into(),
            message: e.to_string(),
            attempts: 1,
        })?;
        if !resp.status().is_success() {
            return Err(HubError::Status { url: url.into(), status: resp.status().as_u16() });
        }
        resp.json().await.map_err(|e| HubError::Protocol { url: url.into(), message: e.to_string() })
    }

    /// The commit `rev` points to, and every file of the repo at it (recursive, with sizes and
    /// LFS sha256s).
    pub async fn list(&self, repo: &str, rev: &str) -> Result<(String, Vec<RepoFile>), HubError> {
        let info_url = format!("{}/api/models/{repo}/revision/{rev}", self.endpoint);
        let info = match self.json(&info_url).await {
            Ok(v) => v,
            // Older endpoints (and the test double) only know /api/models/{repo}.
            Err(HubError::Status { status: 404, .. }) => {
                self.json(&format!("{}/api/models/{repo}", self.endpoint)).await?
            }
            Err(e) => return Err(e),
        };
        let commit = info["sha"].as_str().unwrap_or(rev).to_string();
        let tree_url = format!("{}/api/models/{repo}/tree/{commit}?recursive=true", self.endpoint);
        let tree = self.json(&tree_url).await?;
        let entries = tree
            .as_array()
            .ok_or_else(|| HubError::Protocol { url: tree_url.clone(), message: "not a list".into() })?;
        let files = entries
            .iter()
            .filter(|e| e["type"] == "file")
            .filter_map(|e| {
                let lfs = e.get("lfs").filter(|l| l.is_object());
                Some(RepoFile {
                    path: e["path"].as_str()?.to_string(),
                    size: lfs.and_then(|l| l["size"].as_u64()).or_else(|| e["size"].as_u64()),
                    sha256: lfs.and_then(|l| l["oid"].as_str()).map(str::to_string),
                    blob: lfs.and_then(|l| l["oid"].as_str()).or_else(|| e["oid"].as_str()).map(str::to_string),
                })
            })
            .collect();
        Ok((commit, files))
    }

    pub fn resolve_url(&self, repo: &str, rev: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{rev}/{path}", self.endpoint)
    }

    /// Downloads one file into the cache (see [`Download`]). `progress(done, total)` is called
    /// as bytes arrive; returning false cancels (the partial file stays for a later resume).
    /// Returns the snapshot path.
    pub async fn download(
        &self,
        hf_cache: &Path,
        job: &Download<'_>,
        progress: &mut (dyn FnMut(u64, Option<u64>) -> bool + Send),
    ) -> Result<PathBuf, HubError> {
        let Download { repo, commit, file, dest_repo, dest } = *job;
        let repo_dir = hf_cache.join(repo_folder_name(dest_repo));
        let blob_name = file.blob.clone().unwrap_or_else(|| format!("{commit}-{}", dest.replace('/', "--")));
        let blobs = repo_dir.join("blobs");
        tokio::fs::create_dir_all(&blobs).await.map_err(io(&blobs))?;
        let blob = blobs.join(&blob_name);
        let done = tokio::fs::metadata(&blob).await.is_ok_and(|m| file.size.is_none_or(|s| m.len() == s));
        if !done {
            let url = self.resolve_url(repo, commit, &file.path);
            self.fetch(&url, &blob, file, progress).await?;
        } else {
            progress(file.size.unwrap_or(0), file.size);
        }
        let link = link_snapshot(&repo_dir, commit, dest, &blob_name)?;
        write_ref(&repo_dir, commit)?;
        Ok(link)
    }

    /// Downloads `url` to `dest` through `dest.incomplete` (resumed, retried, verified against
    /// `file.size` and `file.sha256` when known, fsynced, renamed). Also used for backend
    /// release archives.
    pub async fn fetch(
        &self,
        url: &str,
        blob: &Path,
        file: &RepoFile,
        progress: &mut (dyn FnMut(u64, Option<u64>) -> bool + Send),
    ) -> Result<(), HubError> {
        let partial = PathBuf::from(format!("{}.incomplete", blob.display()));
        let p = &self.policy;
        let mut backoff = p.first_backoff;
        let mut last_error = String::new();
        for attempt in 1..=p.attempts {
            if attempt > 1 {
                tracing::warn!(url, attempt, error = %last_error, "retrying download");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(p.max_backoff);
            }
            match self.fetch_once(url, &partial, file, progress).await {
                Ok(digest) => {
                    verify(&partial, file, digest).await?;
                    tokio::fs::rename(&partial, blob).await.map_err(io(blob))?;
                    return Ok(());
                }
                Err(Attempt::Retry(e)) => last_error = e,
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(HubError::GaveUp { url: url.into(), message: last_error, attempts: p.attempts })
    }

    /// One request: continues the partial file from its length. Returns the sha256 of the
    /// whole file when it could be computed while streaming (one pass over the bytes).
    async fn fetch_once(
        &self,
        url: &str,
        partial: &Path,
        file: &RepoFile,
        progress: &mut (dyn FnMut(u64, Option<u64>) -> bool + Send),
    ) -> Result<Option<String>, Attempt> {
        let have = tokio::fs::metadata(partial).await.map(|m| m.len()).unwrap_or(0);
        if file.size.is_some_and(|s| have >= s) {
            return Ok(None); // complete (verification decides whether it is right)
        }
        let mut req = self.get(url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = req.send().await.map_err(|e| Attempt::Retry(e.to_string()))?;
        let status = resp.status().as_u16();
        let append = match status {
            206 => true,
            200 => false, // the server ignored the range: start over
            416 => return Ok(None),
            429 | 500..=599 => return Err(Attempt::Retry(format!("HTTP {status}"))),
            _ => return Err(Attempt::Fatal(HubError::Status { url: url.into(), status })),
        };
        let mut done = if append { have } else { 0 };
        // Disk writes and hashing run on a writer thread fed through a bounded channel, so they
        // overlap with the network reads (tokio::fs would make a blocking round trip per chunk).
        let hashing = file.sha256.is_some();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
        let path = partial.to_path_buf();
        let writer = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use std::io::Write;
            let mut hasher = Sha256::new();
            if append && hashing {
                // A resume: the hash covers the bytes already on disk first.
                std::io::copy(&mut std::fs::File::open(&path)?, &mut hasher)?;
            }
            // Unbuffered: each chunk reaches the kernel at once, so a killed process leaves
            // every received byte in the partial file for the next attempt.
            let mut w =
                std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(&path)?;
            let mut writeback = Writeback::new(&w)?;
            while let Some(chunk) = rx.blocking_recv() {
                w.write_all(&chunk)?;
                writeback.wrote(&w, chunk.len() as u64);
                if hashing {
                    hasher.update(&chunk);
                }
            }
            w.sync_all()?;
            Ok(format!("{:x}", hasher.finalize()))
        });
        let mut body = resp.bytes_stream();
        let mut failure = None;
        loop {
            let chunk = match tokio::time::timeout(self.policy.stall, body.next()).await {
                Err(_) => {
                    failure = Some(Attempt::Retry(format!("stalled: no data for {:?}", self.policy.stall)));
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    failure = Some(Attempt::Retry(format!("connection lost: {e}")));
                    break;
                }
                Ok(Some(Ok(c))) => c,
            };
            done += chunk.len() as u64;
            if tx.send(chunk).await.is_err() {
                break; // the writer failed; its error is reported below
            }
            if !progress(done, file.size) {
                failure = Some(Attempt::Fatal(HubError::Cancelled(file.path.clone())));
                break;
            }
        }
        // Whatever happened, what arrived is flushed and synced, so a later attempt resumes.
        drop(tx);
        let digest =
            writer.await.map_err(|e| Attempt::Retry(e.to_string()))?.map_err(|e| Attempt::Fatal(io(partial)(e)))?;
        if let Some(f) = failure {
            return Err(f);
        }
        if file.size.is_some_and(|s| done < s) {
            return Err(Attempt::Retry(format!("connection closed after {done} bytes")));
        }
        Ok(hashing.then_some(digest))
    }
}

/// One file to fetch: `file` of `repo` at `commit`, stored under `dest_repo` (the model's main
/// repo; secondary files live in its snapshot too) as `dest`.
#[derive(Debug, Clone, Copy)]
pub struct Download<'a> {
    pub repo: &'a str,
    pub commit: &'a str,
    pub file: &'a RepoFile,
    pub dest_repo: &'a str,
    pub dest: &'a str,
}

enum Attempt {
    Retry(String),
    Fatal(HubError),
}

/// Size, then sha256 for LFS files (computed while streaming when `digest` is given, else by
/// reading the file); a corrupt partial file is removed.
async fn verify(partial: &Path, file: &RepoFile, digest: Option<String>) -> Result<(), HubError> {
    let len = tokio::fs::metadata(partial).await.map_err(io(partial))?.len();
    if let Some(expected) = file.size {
        if len != expected {
            let _ = tokio::fs::remove_file(partial).await;
            return Err(HubError::Size { path: file.path.clone(), got: len, expected });
        }
    }
    if let Some(expected) = &file.sha256 {
        let p = partial.to_path_buf();
        let got = match digest {
            Some(d) => d,
            None => tokio::task::spawn_blocking(move || sha256_file(&p))
                .await
                .map_err(|e| HubError::Protocol { url: file.path.clone(), message: e.to_string() })?
                .map_err(io(partial))?,
        };
        if &got != expected {
            let _ = tokio::fs::remove_file(partial).await;
            return Err(HubError::Sha256 { path: file.path.clone(), got, expected: expected.clone() });
        }
    }
    Ok(())
}

/// The sha256 of a file's bytes, as lowercase hex (blocking: call it off the async runtime).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

/// `snapshots/<commit>/<dest>` → `../../blobs/<blob>` (one more `..` per folder level).
fn link_snapshot(repo_dir: &Path, commit: &str, dest: &str, blob: &str) -> Result<PathBuf, HubError> {
    let link = repo_dir.join("snapshots").join(commit).join(dest);
    let parent = link.parent().expect("has parent");
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let depth = dest.matches('/').count() + 2;
    let target = PathBuf::from("../".repeat(depth)).join("blobs").join(blob);
    match std::fs::symlink_metadata(&link) {
        Ok(_) if std::fs::read_link(&link).is_ok_and(|t| t == target) => return Ok(link),
        Ok(_) => std::fs::remove_file(&link).map_err(io(&link))?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&target, &link).map_err(io(&link))?;
    Ok(link)
}

fn write_ref(repo_dir: &Path, commit: &str) -> Result<(), HubError> {
    let path = repo_dir.join("refs").join("main");
    crate::write_atomic(&path, commit.as_bytes()).map_err(io(&path))
}

/// Starts writing a download to disk while it arrives, so the `fsync` at its end has little
/// left to wait for (it cost about 70 ms per 100 MB at the end of a download here). Every
/// [`Writeback::WINDOW`] bytes, the kernel is asked to begin writing the window just filled
/// (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`: it does not wait). A hint only: the `fsync`
/// still decides durability, and on other systems this does nothing.
struct Writeback {
    /// Offset up to which writeback has been started.
    started: u64,
    /// Offset written so far.
    at: u64,
}

impl Writeback {
    const WINDOW: u64 = 8 << 20;

    fn new(f: &std::fs::File) -> std::io::Result<Writeback> {
        let at = f.metadata()?.len();
        Ok(Writeback { started: at, at })
    }

    fn wrote(&mut self, f: &std::fs::File, n: u64) {
        self.at += n;
        if self.at - self.started < Self::WINDOW {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain syscall on an open descriptor; offsets and length are in range.
            unsafe {
                libc::sync_file_range(
                    f.as_raw_fd(),
                    self.started as libc::off64_t,
                    (self.at - self.started) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = f;
        self.started = self.at;
    }
}
