//! A general resumable, verified HTTP downloader: the bytes go to `<dest>.incomplete`, are
//! hashed while they stream, and are renamed to `<dest>` only after the size and sha256 match.
//!
//! Resume: an existing partial file is continued with `Range: bytes=<len>-`. Retry: dropped
//! connections, timeouts, stalls and 5xx/429 are retried with exponential back-off, keeping the
//! partial file; other 4xx fail at once (a 404 or 401 will not fix itself). The Hugging Face
//! client ([`crate::hub`]) and backend installs ([`crate::install`]) both download through it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::StreamExt;

use crate::net::Unanswered;
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
    /// Where requests are answered in memory (the simulation's Hub; None: over HTTP).
    pub in_memory: Option<InMemory>,
}

/// Answers a downloader's requests in memory, for the engine's simulation (crates/sim): the
/// Hub's listings and its files, with their faults. lemonade itself has none. An `Err` is a
/// connection that gave no answer.
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct InMemory(
    pub Arc<dyn Fn(reqwest::Request) -> BoxFuture<'static, Result<reqwest::Response, Unanswered>> + Send + Sync>,
);

/// Why a request got no answer: over HTTP, or in memory.
#[derive(Debug, thiserror::Error)]
pub enum Unsent {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error(transparent)]
    InMemory(#[from] Unanswered),
}

impl std::fmt::Debug for InMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InMemory")
    }
}

/// Per partial file, the writer that appends to it. A fetch waits for the last writer of its
/// file to finish before it reads where to resume from: a download that was stopped (its
/// future dropped by a pause or a cancel) leaves its writer draining what it had received, and
/// a resume at once must neither start short of those bytes nor append beside them.
static WRITERS: LazyLock<parking_lot::Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

fn writer_slot(partial: &Path) -> Arc<tokio::sync::Mutex<()>> {
    let mut all = WRITERS.lock();
    if let Some(slot) = all.get(partial).and_then(Weak::upgrade) {
        return slot;
    }
    all.retain(|_, w| w.strong_count() > 0);
    let slot = Arc::new(tokio::sync::Mutex::new(()));
    all.insert(partial.to_path_buf(), Arc::downgrade(&slot));
    slot
}

/// `download_rate_limit`: the bytes per second every download of this process shares (0:
/// unlimited). Process-wide, as the link it protects is.
static RATE_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// When the bytes received so far, at the limit, would have finished arriving.
static PACED_UNTIL: parking_lot::Mutex<Option<tokio::time::Instant>> = parking_lot::Mutex::new(None);

/// Sets the bytes per second all downloads share (0: unlimited); takes effect at the next chunk.
pub fn set_rate_limit(bytes_per_s: u64) {
    RATE_LIMIT.store(bytes_per_s, std::sync::atomic::Ordering::Relaxed);
}

/// Waits as long as `n` more bytes take at the rate limit, after the bytes every download
/// received before them: chunks take turns on one clock, so downloads together keep to it.
async fn pace(n: u64) {
    let rate = RATE_LIMIT.load(std::sync::atomic::Ordering::Relaxed);
    if rate == 0 {
        return;
    }
    let until = {
        let mut at = PACED_UNTIL.lock();
        let now = tokio::time::Instant::now();
        let start = at.filter(|t| *t > now).unwrap_or(now);
        let until = start + Duration::from_secs_f64(n as f64 / rate as f64);
        *at = Some(until);
        until
    };
    tokio::time::sleep_until(until).await;
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
            in_memory: None,
        }
    }

    /// Sends `req`: over HTTP, or to the in-memory answerer where the simulation answers.
    pub(crate) async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, Unsent> {
        match &self.in_memory {
            None => Ok(req.send().await?),
            Some(answer) => Ok((answer.0)(req.build()?).await?),
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
                    let (from, to) = (partial.clone(), blob.to_path_buf());
                    crate::offload::offload_io(move || std::fs::rename(from, to)).await.map_err(io(blob))?;
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
        // Held by this attempt's writer until its last byte is synced.
        let writing = writer_slot(partial).lock_owned().await;
        let have = file_len(partial).await;
        if file.size.is_some_and(|s| have >= s) {
            return Ok(None); // complete (verification decides whether it is right)
        }
        let mut req = self.get(url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = self.send(req).await.map_err(|e| Attempt::Retry(e.to_string()))?;
        let status = resp.status().as_u16();
        // A server that ignores the range sends the whole file again: its first `have` bytes are
        // skipped, not written again, so the partial file never shrinks (whoever counted its
        // bytes counted bytes that stay). The final sha256 checks them; a file without one is
        // small (a git file) and its partial bytes are compared as they come instead.
        let mut skip = match status {
            206 => 0,
            200 => have,
            416 => return Ok(None),
            429 | 500..=599 => return Err(Attempt::Retry(format!("HTTP {status}"))),
            _ => return Err(Attempt::Fatal(DownloadError::Status { url: url.into(), status })),
        };
        let mut done = have;
        // Progress is reported against the listing's size, else the length the server sends
        // (plus what a resume already has), so a release archive with no listing shows progress.
        let total = file.size.or_else(|| resp.content_length().map(|n| n + have - skip));
        let hashing = file.sha256.is_some();
        let mut compare = match (skip, hashing) {
            (0, _) | (_, true) => None,
            (n, false) if n > COMPARED_MAX => return start_over(partial, "its partial file is too long to compare"),
            _ => Some(read_partial(partial).await.map_err(|e| Attempt::Fatal(io(partial)(e)))?),
        };
        let mut sink = Sink::open(partial, have > 0, hashing, writing).map_err(|e| Attempt::Fatal(io(partial)(e)))?;
        // Where this attempt starts.
        if !progress(done, total) {
            let _ = sink.finish().await;
            return Err(Attempt::Fatal(DownloadError::Cancelled(file.name.clone())));
        }
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
            self.on_received.received(chunk.len() as u64);
            pace(chunk.len() as u64).await;
            let skipped = skip.min(chunk.len() as u64);
            if let Some(before) = compare.as_mut() {
                let at = (have - skip) as usize;
                if before.get(at..at + skipped as usize) != Some(&chunk[..skipped as usize]) {
                    let _ = sink.finish().await;
                    return start_over(partial, "the server's file differs from the partial one");
                }
                if skip == skipped {
                    compare = None;
                }
            }
            skip -= skipped;
            let chunk = chunk.slice(skipped as usize..);
            done += chunk.len() as u64;
            if !chunk.is_empty() && !sink.write(chunk).await {
                break; // the writer failed; its error is reported below
            }
            if !progress(done, total) {
                failure = Some(Attempt::Fatal(DownloadError::Cancelled(file.name.clone())));
                break;
            }
        }
        // Whatever happened, what arrived is flushed and synced, so a later attempt resumes.
        let digest = sink.finish().await.map_err(|e| match e {
            Finished::NotDone(e) => Attempt::Retry(e.to_string()),
            Finished::Io(e) => Attempt::Fatal(io(partial)(e)),
        })?;
        if let Some(f) = failure {
            return Err(f);
        }
        if file.size.is_some_and(|s| done < s) {
            return Err(Attempt::Retry(format!("connection closed after {done} bytes")));
        }
        Ok(hashing.then_some(digest))
    }
}

/// The longest partial file without a sha256 compared byte for byte when a server ignores a
/// range (a git file of the Hub is at most 10 MB).
const COMPARED_MAX: u64 = 16 << 20;

/// A partial file's bytes.
async fn read_partial(path: &Path) -> std::io::Result<Vec<u8>> {
    let p = path.to_path_buf();
    crate::offload::offload_io(move || std::fs::read(p)).await
}

/// The partial file removed, so the next attempt fetches the whole file.
fn start_over(partial: &Path, why: &str) -> Result<Option<String>, Attempt> {
    let _ = std::fs::remove_file(partial);
    Err(Attempt::Retry(format!("the download starts over: {why}")))
}

/// The length of `path` (0 when it does not exist).
async fn file_len(path: &Path) -> u64 {
    let p = path.to_path_buf();
    crate::offload::offload(move || std::fs::metadata(p).map_or(0, |m| m.len())).await.unwrap_or(0)
}

/// Appends a download's bytes to its partial file, hashing them.
struct PartialWriter {
    file: std::fs::File,
    hasher: Option<Sha256>,
    writeback: Writeback,
}

impl PartialWriter {
    fn open(path: &Path, append: bool, hashing: bool) -> std::io::Result<PartialWriter> {
        let mut hasher = hashing.then(Sha256::new);
        if let (true, Some(h)) = (append, hasher.as_mut()) {
            // A resume: the hash covers the bytes already on disk first.
            std::io::copy(&mut std::fs::File::open(path)?, h)?;
        }
        // Unbuffered: each chunk reaches the kernel at once, so a killed process leaves
        // every received byte in the partial file for the next attempt.
        let file = std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(path)?;
        let writeback = Writeback::new(&file)?;
        Ok(PartialWriter { file, hasher, writeback })
    }

    fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.file.write_all(chunk)?;
        self.writeback.wrote(&self.file, chunk.len() as u64);
        if let Some(h) = self.hasher.as_mut() {
            h.update(chunk);
        }
        Ok(())
    }

    /// Synced; the hash of the whole file (empty when not hashing).
    fn finish(self) -> std::io::Result<String> {
        self.file.sync_all()?;
        Ok(self.hasher.map(|h| format!("{:x}", h.finalize())).unwrap_or_default())
    }
}

/// Where a download's chunks go: a writer thread fed through a bounded channel, so disk writes
/// and hashing overlap with the network reads (tokio::fs would make a blocking round trip per
/// chunk); or, in the simulation ([`crate::offload::inline`]), the partial file at once.
enum Sink {
    Thread { tx: tokio::sync::mpsc::Sender<bytes::Bytes>, writer: tokio::task::JoinHandle<std::io::Result<String>> },
    Here { writer: PartialWriter, failed: Option<std::io::Error>, _writing: tokio::sync::OwnedMutexGuard<()> },
}

enum Finished {
    NotDone(tokio::task::JoinError),
    Io(std::io::Error),
}

impl Sink {
    /// `writing`: the partial file's writer slot, held until the last byte is synced.
    fn open(
        path: &Path,
        append: bool,
        hashing: bool,
        writing: tokio::sync::OwnedMutexGuard<()>,
    ) -> std::io::Result<Sink> {
        if crate::offload::inline() {
            let writer = PartialWriter::open(path, append, hashing)?;
            return Ok(Sink::Here { writer, failed: None, _writing: writing });
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
        let path = path.to_path_buf();
        let writer = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let _writing = writing;
            let mut w = PartialWriter::open(&path, append, hashing)?;
            while let Some(chunk) = rx.blocking_recv() {
                w.write(&chunk)?;
            }
            w.finish()
        });
        Ok(Sink::Thread { tx, writer })
    }

    /// False once the writer failed.
    async fn write(&mut self, chunk: bytes::Bytes) -> bool {
        match self {
            Sink::Thread { tx, .. } => tx.send(chunk).await.is_ok(),
            Sink::Here { writer, failed, .. } => match writer.write(&chunk) {
                Ok(()) => true,
                Err(e) => {
                    *failed = Some(e);
                    false
                }
            },
        }
    }

    async fn finish(self) -> Result<String, Finished> {
        match self {
            Sink::Thread { tx, writer } => {
                drop(tx);
                writer.await.map_err(Finished::NotDone)?.map_err(Finished::Io)
            }
            Sink::Here { writer, failed: Some(e), .. } => {
                drop(writer);
                Err(Finished::Io(e))
            }
            Sink::Here { writer, failed: None, .. } => writer.finish().map_err(Finished::Io),
        }
    }
}

enum Attempt {
    Retry(String),
    Fatal(DownloadError),
}

/// Size, then sha256 for LFS files (computed while streaming when `digest` is given, else by
/// reading the file); a corrupt partial file is removed.
async fn verify(partial: &Path, file: &Target, digest: Option<String>) -> Result<(), DownloadError> {
    let p = partial.to_path_buf();
    let len = crate::offload::offload_io(move || std::fs::metadata(p).map(|m| m.len())).await.map_err(io(partial))?;
    let remove = |p: &Path| {
        let p = p.to_path_buf();
        crate::offload::offload_io(move || std::fs::remove_file(p))
    };
    if let Some(expected) = file.size {
        if len != expected {
            let _ = remove(partial).await;
            return Err(DownloadError::Size { path: file.name.clone(), got: len, expected });
        }
    }
    if let Some(expected) = &file.sha256 {
        let p = partial.to_path_buf();
        let got = match digest {
            Some(d) => d,
            None => crate::offload::offload_io(move || sha256_file(&p)).await.map_err(io(partial))?,
        };
        if &got != expected {
            let _ = remove(partial).await;
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

    /// A download stopped while its writer still drains (its future dropped by a pause) and
    /// resumed at once: the resume waits for that writer, then asks from what it left on disk.
    #[tokio::test]
    async fn a_resume_waits_for_the_last_writer_of_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        let partial = dir.path().join("blob.incomplete");
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://127.0.0.1:{}/f", server.local_addr().unwrap().port());
        let asked = tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ =
                s.write_all(b"HTTP/1.1 206 Partial Content\r\ncontent-length: 3\r\nconnection: close\r\n\r\ndef").await;
            String::from_utf8_lossy(&buf[..n]).to_lowercase()
        });
        // The last writer holds the file's slot; the resume starts meanwhile.
        let last_writer = writer_slot(&partial).lock_owned().await;
        let d = Downloader::new(None);
        let target = Target { name: "f".into(), size: Some(6), sha256: None };
        let (b, t) = (blob.clone(), target.clone());
        let resume = tokio::spawn(async move { d.fetch(&url, &b, &t, &mut |_, _| true).await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // It drains its last bytes, and ends.
        std::fs::write(&partial, b"abc").unwrap();
        drop(last_writer);
        resume.await.unwrap().unwrap();
        assert!(asked.await.unwrap().contains("range: bytes=3-"), "the resume asked from the bytes on disk");
        assert_eq!(std::fs::read(&blob).unwrap(), b"abcdef");
    }

    /// A server answers a resume with the whole file (200, no range): the partial file keeps
    /// its bytes (compared, as this file has no sha256), the rest is appended, and no count
    /// goes back; a server whose file changed under the partial one makes the download start
    /// over.
    #[tokio::test]
    async fn a_server_that_ignores_the_range_neither_shrinks_the_partial_file_nor_corrupts_it() {
        let serve = |body: &'static [u8], times: usize| async move {
            let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://127.0.0.1:{}/f", server.local_addr().unwrap().port());
            let task = tokio::spawn(async move {
                let mut ranges = vec![];
                for _ in 0..times {
                    let (mut s, _) = server.accept().await.unwrap();
                    let mut buf = vec![0u8; 8192];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                    ranges.push(head.lines().find(|l| l.starts_with("range:")).map(str::to_string));
                    let reply =
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                    let _ = s.write_all(&[reply.as_bytes(), body].concat()).await;
                }
                ranges
            });
            (url, task)
        };
        let dir = tempfile::tempdir().unwrap();
        let (blob, partial) = (dir.path().join("blob"), dir.path().join("blob.incomplete"));
        let target = Target { name: "f".into(), size: Some(6), sha256: None };
        let mut d = Downloader::new(None);
        d.policy.first_backoff = Duration::from_millis(1);

        std::fs::write(&partial, b"abc").unwrap();
        let (url, asked) = serve(b"abcdef", 1).await;
        let mut counts = vec![];
        d.fetch(&url, &blob, &target, &mut |done, _| {
            counts.push(done);
            true
        })
        .await
        .unwrap();
        assert_eq!(asked.await.unwrap(), vec![Some("range: bytes=3-".to_string())]);
        assert_eq!(std::fs::read(&blob).unwrap(), b"abcdef");
        assert!(counts.iter().all(|&n| n >= 3) && counts.last() == Some(&6), "{counts:?}");

        std::fs::remove_file(&blob).unwrap();
        std::fs::write(&partial, b"xyz").unwrap();
        let (url, asked) = serve(b"abcdef", 2).await;
        d.fetch(&url, &blob, &target, &mut |_, _| true).await.unwrap();
        assert_eq!(asked.await.unwrap(), vec![Some("range: bytes=3-".to_string()), None], "started over");
        assert_eq!(std::fs::read(&blob).unwrap(), b"abcdef");
    }

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
