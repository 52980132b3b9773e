//! The simulated Hugging Face Hub: a few repositories of one GGUF file (an LFS file with its
//! sha256) and a `config.json` each, answered in memory to host's downloader (the listings,
//! and each file from the `Range` asked). With faults on, it is slow, answers 503, drops
//! connections part way through a file, ignores a `Range` now and then, and goes down.
//!
//! It also judges every resume as it is asked: a request for a file must start exactly at what
//! the partial file on disk holds (the `resume_exact` invariant).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use host::download::InMemory;
use host::net::Unanswered;
use parking_lot::Mutex;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::rng::Rng;

/// The Hub's endpoint, as lemonade is configured with it.
pub const ENDPOINT: &str = "http://hub.sim";
/// How many repositories it has: `sim/repo-0` and on.
pub const REPOS: u64 = 3;
/// A repository it does not have.
pub const MISSING: &str = "sim/gone";
/// The GGUF file of each repository, as a `:Q4_K_M` checkpoint selects it.
pub const GGUF: &str = "model-Q4_K_M.gguf";

pub fn repo(i: u64) -> String {
    format!("sim/repo-{i}")
}

/// One file of a repository.
#[derive(Debug, Clone)]
pub struct SimFile {
    pub path: String,
    pub bytes: Bytes,
    /// The LFS sha256 (the GGUF); None for a small git file (`config.json`).
    pub sha256: Option<String>,
    /// Its blob's name in the cache: the LFS sha256, else its git oid.
    pub blob: String,
}

struct Repo {
    commit: String,
    files: Vec<SimFile>,
}

pub struct SimHub {
    hf_cache: PathBuf,
    faults: bool,
    inner: Mutex<State>,
}

struct State {
    rng: Rng,
    down: bool,
    repos: BTreeMap<String, Repo>,
    /// Resumes that did not start at what was on disk, in words.
    wrong_resumes: Vec<String>,
    /// File requests answered, and those that resumed (asked with a `Range` past 0).
    files_asked: u64,
    resumes: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SimHub {
    /// The Hub of seed `seed`; `faults`: it fails now and then. Its files are written under
    /// `hf_cache` by lemonade (the Hub reads the partial files there to judge a resume).
    pub fn new(seed: u64, hf_cache: &Path, faults: bool) -> Arc<SimHub> {
        let mut rng = Rng::new(seed ^ 0x0068_7562);
        let mut repos = BTreeMap::new();
        for i in 0..REPOS {
            let mut fill = |len: u64| -> Bytes { (0..len).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>().into() };
            let gguf = fill(rng_len(i));
            let config = Bytes::from(format!("{{\"sim_repo\": {i}}}"));
            let sha = hex(&Sha256::digest(&gguf));
            let oid = hex(&Sha256::digest(&config))[..40].to_string();
            let commit = hex(&Sha256::digest(format!("{seed}-{i}").as_bytes()))[..40].to_string();
            let files = vec![
                SimFile { path: GGUF.into(), bytes: gguf, sha256: Some(sha.clone()), blob: sha },
                SimFile { path: "config.json".into(), bytes: config, sha256: None, blob: oid },
            ];
            repos.insert(repo(i), Repo { commit, files });
        }
        let state = State { rng, down: false, repos, wrong_resumes: vec![], files_asked: 0, resumes: 0 };
        Arc::new(SimHub { hf_cache: hf_cache.to_path_buf(), faults, inner: Mutex::new(state) })
    }

    pub fn set_down(&self, down: bool) {
        self.inner.lock().down = down;
    }

    /// The files of `repo` (None: the Hub has no such repository).
    pub fn files(&self, repo: &str) -> Option<Vec<SimFile>> {
        self.inner.lock().repos.get(repo).map(|r| r.files.clone())
    }

    /// Where lemonade keeps `file` of `repo` once complete (`<blob>.incomplete` while partial).
    pub fn blob_path(&self, repo: &str, file: &SimFile) -> PathBuf {
        self.hf_cache.join(registry::checkpoint::repo_folder_name(repo)).join("blobs").join(&file.blob)
    }

    /// Resumes that did not start at what the disk held (taken: each is reported once).
    pub fn take_wrong_resumes(&self) -> Vec<String> {
        std::mem::take(&mut self.inner.lock().wrong_resumes)
    }

    /// (file requests, resumes) answered so far.
    pub fn asked(&self) -> (u64, u64) {
        let s = self.inner.lock();
        (s.files_asked, s.resumes)
    }

    /// How it answers, for lemonade's downloader.
    pub fn answerer(self: &Arc<Self>) -> InMemory {
        let me = self.clone();
        InMemory(Arc::new(move |req: reqwest::Request| me.answer(&req)))
    }

    fn answer(
        &self,
        req: &reqwest::Request,
    ) -> futures_util::future::BoxFuture<'static, Result<reqwest::Response, Unanswered>> {
        let path = req.url().path().trim_start_matches('/').to_string();
        let range: Option<u64> = req
            .headers()
            .get(reqwest::header::RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok());
        let (then, latency) = {
            let mut s = self.inner.lock();
            let latency = Duration::from_millis(if self.faults { s.rng.range(0, 300) } else { 0 });
            let roll = if self.faults { s.rng.range(0, 100) } else { 99 };
            let then = match (s.down, roll) {
                (true, 0..=49) => Then::Json(503, json!({"error": "the Hub is down"})),
                (true, _) => Then::Fail(Unanswered::Exited),
                (false, 0..=4) => Then::Json(503, json!({"error": "try again"})),
                (false, 5..=7) => Then::Fail(Unanswered::Closed),
                (false, _) => self.route(&mut s, &path, range, roll),
            };
            (then, latency)
        };
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            let (status, body) = match then {
                Then::Fail(why) => return Err(why),
                Then::Json(status, v) => (status, reqwest::Body::from(v.to_string())),
                Then::File { status, body } => (status, reqwest::Body::wrap_stream(futures_util::stream::iter(body))),
            };
            let resp = http::Response::builder().status(status).body(body).expect("a response of constant parts");
            Ok(reqwest::Response::from(resp))
        })
    }

    /// A request the Hub is up for: `roll` (0 to 99) draws its faults.
    fn route(&self, s: &mut State, path: &str, range: Option<u64>, roll: u64) -> Then {
        let parts: Vec<&str> = path.split('/').collect();
        let not_found = || Then::Json(404, json!({"error": "Repository not found"}));
        match parts.as_slice() {
            ["api", "models", owner, name, "revision", _] => match s.repos.get(&format!("{owner}/{name}")) {
                Some(r) => Then::Json(200, json!({"sha": r.commit})),
                None => not_found(),
            },
            ["api", "models", owner, name, "tree", _commit] => match s.repos.get(&format!("{owner}/{name}")) {
                Some(r) => Then::Json(200, Value::Array(r.files.iter().map(listing).collect())),
                None => not_found(),
            },
            [owner, name, "resolve", _commit, file @ ..] => {
                let repo = format!("{owner}/{name}");
                let Some(f) = s.repos.get(&repo).and_then(|r| r.files.iter().find(|f| f.path == file.join("/"))) else {
                    return not_found();
                };
                let f = f.clone();
                // Judged as asked: the partial file is what the downloader read its start from.
                let partial = PathBuf::from(format!("{}.incomplete", self.blob_path(&repo, &f).display()));
                let on_disk = std::fs::metadata(&partial).map_or(0, |m| m.len());
                let from = range.unwrap_or(0);
                s.files_asked += 1;
                if from > 0 {
                    s.resumes += 1;
                }
                if from != on_disk {
                    s.wrong_resumes
                        .push(format!("{repo}/{}: asked from byte {from} with {on_disk} bytes on disk", f.path));
                }
                // Some answers ignore the range (the whole file again), some drop part way.
                let (status, start) = match (from, roll) {
                    (0, _) => (200, 0),
                    (_, 8..=17) => (200, 0),
                    _ => (206, from.min(f.bytes.len() as u64)),
                };
                let rest = f.bytes.slice(start as usize..);
                let cut = (roll < 55 && rest.len() > 1).then(|| s.rng.range(0, rest.len() as u64) as usize);
                let mut body: Vec<Result<Bytes, std::io::Error>> = Vec::new();
                let end = cut.unwrap_or(rest.len());
                let mut at = 0;
                while at < end {
                    let next = (at + CHUNK).min(end);
                    body.push(Ok(rest.slice(at..next)));
                    at = next;
                }
                if cut.is_some() {
                    body.push(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the Hub dropped the connection",
                    )));
                }
                Then::File { status, body }
            }
            _ => not_found(),
        }
    }
}

/// How the Hub answers one request.
enum Then {
    Json(u16, Value),
    Fail(Unanswered),
    File { status: u16, body: Vec<Result<Bytes, std::io::Error>> },
}

/// Bytes per chunk of a file's answer.
const CHUNK: usize = 4096;

/// A GGUF's length for repository `i`: tens of KiB, a few chunks.
fn rng_len(i: u64) -> u64 {
    (12 + 9 * i) << 10
}

/// A file as the Hub's tree listing shows it.
fn listing(f: &SimFile) -> Value {
    let mut v = json!({"type": "file", "path": f.path, "size": f.bytes.len(), "oid": f.blob});
    if let Some(sha) = &f.sha256 {
        v["lfs"] = json!({"oid": sha, "size": f.bytes.len()});
    }
    v
}
