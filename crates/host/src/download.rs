//! A general resumable, verified HTTP downloader: the bytes go to `<dest>.incomplete`, are
//! hashed while they stream, and are renamed to `<dest>` only after the size and sha256 match.
//!
//! Resume: an existing partial file is continued with `Range: bytes=<len>-`. Retry: dropped
//! connections, timeouts, stalls and 5xx/429 are retried with exponential back-off, keeping the
//! partial file; other 4xx fail at once (a 404 or 401 will not fix itself). The Hugging Face
//! client ([`crate::hub`]) and backend installs ([`crate::install`]) both download through it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
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
    /// 8 attempts, the first retry after 500 ms (`LEMONADE_RETRY_BACKOFF_MS` sets it: tests
    /// shorten it), doubling up to 30 s.
    fn default() -> Self {
        let first = std::env::var("LEMONADE_RETRY_BACKOFF_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
        RetryPolicy {
            attempts: 8,
            first_backoff: Duration::from_millis(first),
            max_backoff: Duration::from_secs(30),
            stall: Duration::from_secs(60),
        }
    }
}

/// What a downloaded file must be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The name used in errors and cancellation (a repo path, an archive name).
    pub name: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// An HTTP client with a retry policy and an optional bearer token.
#[derive(Debug, Clone)]
pub struct Downloader {
    http: reqwest::Client,
    token: Option<String>,
    pub policy: RetryPolicy,
    /// Told the length of every chunk received (a received-bytes counter).
    pub on_received: OnReceived,
}

/// A hook called with the length of every chunk a download receives.
#[derive(Clone, Default)]
pub struct OnReceived(Option<std::sync::Arc<dyn Fn(u64) + Send + Sync>>);

impl OnReceived {
    pub fn new(f: impl Fn(u64) + Send + Sync + 'static) -> OnReceived {
        OnReceived(Some(std::sync::Arc::new(f)))
    }

    fn received(&self, n: u64) {
        if let Some(f) = &self.0 {
            f(n);
        }
    }
}

impl std::fmt::Debug for OnReceived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "OnReceived(hook)" } else { "OnReceived(none)" })
    }
}

impl Downloader {
    pub fn new(token: Option<String>) -> Downloader {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("lemonade/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("reqwest client");
        Downloader {
            http,
            token: token.filter(|t| !t.is_empty()),
            policy: RetryPolicy::default(),
            on_received: OnReceived::default(),
        }
    }

    pub(crate) fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.get(url);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Downloads `url` to `blob` through `blob.incomplete` (resumed, retried, verified against
    /// `file.size` and `file.sha256` when known, fsynced, renamed).
    pub async fn fetch(
        &self,
        url: &str,
        blob: &Path,
        file: &Target,
        progress: &mut (dyn FnMut(u64, Option<u64>) -> bool + Send),
    ) -> Result<(), DownloadError> {
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
        Err(DownloadError::GaveUp { url: url.into(), message: last_error, attempts: p.attempts })
    }

    /// One request: continues the partial file from its length. Returns the sha256 of the
    /// whole file when it could be computed while streaming (one pass over the bytes).
    async fn fetch_once(
        &self,
        url: &str,
        partial: &Path,
        file: &Target,
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
            _ => return Err(Attempt::Fatal(DownloadError::Status { url: url.into(), status })),
        };
        let mut done = if append { have } else { 0 };
        // Progress is reported against the listing's size, else the length the server sends
        // (plus what a resume already has), so a release archive with no listing shows progress.
        let total = file.size.or_else(|| resp.content_length().map(|n| n + done));
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
            self.on_received.received(chunk.len() as u64);
            if tx.send(chunk).await.is_err() {
                break; // the writer failed; its error is reported below
            }
            if !progress(done, total) {
                failure = Some(Attempt::Fatal(DownloadError::Cancelled(file.name.clone())));
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

enum Attempt {
    Retry(String),
    Fatal(DownloadError),
}

/// Size, then sha256 for LFS files (computed while streaming when `digest` is given, else by
/// reading the file); a corrupt partial file is removed.
async fn verify(partial: &Path, file: &Target, digest: Option<String>) -> Result<(), DownloadError> {
    let len = tokio::fs::metadata(partial).await.map_err(io(partial))?.len();
    if let Some(expected) = file.size {
        if len != expected {
            let _ = tokio::fs::remove_file(partial).await;
            return Err(DownloadError::Size { path: file.name.clone(), got: len, expected });
        }
    }
    if let Some(expected) = &file.sha256 {
        let p = partial.to_path_buf();
        let got = match digest {
            Some(d) => d,
            None => tokio::task::spawn_blocking(move || sha256_file(&p))
                .await
                .map_err(|e| DownloadError::Protocol { url: file.name.clone(), message: e.to_string() })?
                .map_err(io(partial))?,
        };
        if &got != expected {
            let _ = tokio::fs::remove_file(partial).await;
            return Err(DownloadError::Sha256 { path: file.name.clone(), got, expected: expected.clone() });
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

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DownloadError + '_ {
    move |source| DownloadError::Io { path: path.display().to_string(), source }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The Hub answers a file with a redirect to its CDN on another host: the download follows
    /// it without the Hub token (`Authorization` is dropped on a redirect to another origin).
    #[tokio::test]
    async fn the_hub_token_does_not_follow_a_redirect_to_another_origin() {
        let cdn = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hub = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cdn_port = cdn.local_addr().unwrap().port();
        let hub_url = format!("http://127.0.0.1:{}/org/repo/resolve/main/m.gguf", hub.local_addr().unwrap().port());
        let answer = |mut s: tokio::net::TcpStream, reply: String| async move {
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = s.write_all(reply.as_bytes()).await;
            String::from_utf8_lossy(&buf[..n]).to_lowercase()
        };
        let hub_seen = tokio::spawn(async move {
            let (s, _) = hub.accept().await.unwrap();
            // `localhost`: another origin than 127.0.0.1, the same machine.
            let to = format!("http://localhost:{cdn_port}/blob");
            answer(s, format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"))
                .await
        });
        let cdn_seen = tokio::spawn(async move {
            let (s, _) = cdn.accept().await.unwrap();
            answer(s, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".into()).await
        });
        let d = Downloader::new(Some("hf_SECRETTOKEN".into()));
        let r = d.get(&hub_url).timeout(Duration::from_secs(10)).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "ok");
        assert!(hub_seen.await.unwrap().contains("authorization: bearer hf_secrettoken"), "the Hub gets the token");
        let cdn = cdn_seen.await.unwrap();
        assert!(!cdn.contains("hf_secrettoken") && !cdn.contains("authorization"), "{cdn}");
    }
}
