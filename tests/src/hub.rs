//! A Hugging Face Hub double on 127.0.0.1: serves real files from a directory with the Hub's
//! API and headers, and misbehaves on request.
//!
//! Layout: `<root>/<org>/<repo>/<files…>`. Endpoints:
//! * `GET /api/models?search=Q&limit=N[&filter=gguf]` → `[{"id", "downloads", "likes", "tags",
//!   "pipeline_tag"}]`: the repos whose id contains Q (any case), with `X-Total-Count`; 429
//!   when Q is `rate-limit-me`.
//! * `GET /api/models/{org}/{repo}` → `{"id", "sha", "siblings": [{"rfilename"}]}`
//! * `GET /api/models/{org}/{repo}/tree/{rev}?recursive=true` → `[{"type", "path", "size",
//!   "oid", "lfs": {"oid", "size"}}]` (every file is "LFS", with its sha256)
//! * `GET|HEAD /{org}/{repo}/resolve/{rev}/{path}` → the bytes, with `ETag`, `X-Repo-Commit`,
//!   `X-Linked-Etag`, `X-Linked-Size`, `Accept-Ranges`, and `Range` → 206.
//! * `GET|HEAD /{org}/{repo}/releases/download/{version}/{asset}` → GitHub's release download
//!   layout, from `<root>/<org>/<repo>/releases/download/<version>/<asset>` (same knobs).
//!
//! Knobs: 503 for the first N requests of files, drop the connection after N bytes (for the
//! first M file requests), require a bearer token. Every file request is logged with its
//! `Range` header so tests can prove a resume re-fetched no byte it already had.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use serde_json::json;

/// The commit every repo of the double reports.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Debug, Default, Clone)]
pub struct Knobs {
    /// Answer 503 to this many file requests first.
    pub fail_first: usize,
    /// Cut the connection after this many body bytes…
    pub drop_after: Option<u64>,
    /// …for this many file requests.
    pub drop_times: usize,
    /// Require `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Serve bytes that differ from what the listing's sha256 promises (same length).
    pub corrupt: bool,
    /// Pause this long between 64 KiB chunks.
    pub chunk_delay: Option<std::time::Duration>,
    /// The commit the repos' info reports instead of [`COMMIT`] (an upstream update).
    pub commit: Option<String>,
}

/// A logged file request: path and the `Range` header, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    knobs: Knobs,
    log: Vec<Logged>,
    /// sha256 of each served file, by absolute path.
    hashes: BTreeMap<PathBuf, String>,
}

#[derive(Clone)]
struct Shared {
    root: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

pub struct HubDouble {
    pub url: String,
    shared: Shared,
    _task: tokio::task::JoinHandle<()>,
}

impl HubDouble {
    /// Serves `root` on an OS-chosen port of 127.0.0.1.
    pub async fn start(root: &Path, knobs: Knobs) -> HubDouble {
        let shared =
            Shared { root: root.to_path_buf(), inner: Arc::new(Mutex::new(Inner { knobs, ..Default::default() })) };
        let app = Router::new()
            .route("/api/models", get(search))
            .route("/api/models/{org}/{repo}", get(info))
            .route("/api/models/{org}/{repo}/tree/{rev}", get(tree))
            .route("/{org}/{repo}/resolve/{rev}/{*path}", get(file).head(file))
            .route("/{org}/{repo}/releases/download/{version}/{asset}", get(release).head(release))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        HubDouble { url, shared, _task: task }
    }

    pub fn set_knobs(&self, knobs: Knobs) {
        self.shared.inner.lock().unwrap().knobs = knobs;
    }

    /// File requests so far.
    pub fn log(&self) -> Vec<Logged> {
        self.shared.inner.lock().unwrap().log.clone()
    }

    /// The sha256 the double reports for `<org>/<repo>/<path>`.
    pub fn sha256(&self, repo: &str, path: &str) -> String {
        let p = self.shared.root.join(repo).join(path);
        sha256_of(&self.shared, &p)
    }
}

fn sha256_of(s: &Shared, p: &Path) -> String {
    if let Some(h) = s.inner.lock().unwrap().hashes.get(p) {
        return h.clone();
    }
    let h = host::download::sha256_file(p).unwrap();
    s.inner.lock().unwrap().hashes.insert(p.to_path_buf(), h.clone());
    h
}

fn files(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        if e.path().is_dir() {
            files(&e.path(), &rel, out);
        } else {
            out.push((rel, e.path()));
        }
    }
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, axum::Json(json!({"error": "Repository not found"}))).into_response()
}

async fn search(
    State(s): State<Shared>,
    axum::extract::Query(q): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    let query = q.get("search").cloned().unwrap_or_default().to_ascii_lowercase();
    if query == "rate-limit-me" {
        return (StatusCode::TOO_MANY_REQUESTS, axum::Json(json!({"error": "slow down"}))).into_response();
    }
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10);
    let gguf_only = q.get("filter").is_some_and(|f| f == "gguf");
    let mut repos = Vec::new();
    for org in std::fs::read_dir(&s.root).into_iter().flatten().flatten().filter(|e| e.path().is_dir()) {
        for repo in std::fs::read_dir(org.path()).into_iter().flatten().flatten().filter(|e| e.path().is_dir()) {
            let id = format!("{}/{}", org.file_name().to_string_lossy(), repo.file_name().to_string_lossy());
            let mut list = Vec::new();
            files(&repo.path(), "", &mut list);
            let gguf = list.iter().any(|(rel, _)| rel.ends_with(".gguf"));
            if id.to_ascii_lowercase().contains(&query) && (gguf || !gguf_only) {
                let tags: Vec<&str> = if gguf { vec!["gguf", "text-generation"] } else { vec!["text-generation"] };
                repos.push(json!({"id": id, "downloads": list.len() * 100, "likes": list.len(), "tags": tags,
                                  "pipeline_tag": "text-generation"}));
            }
        }
    }
    repos.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let total = repos.len();
    repos.truncate(limit);
    ([("x-total-count", total.to_string())], axum::Json(repos)).into_response()
}

async fn info(State(s): State<Shared>, UrlPath((org, repo)): UrlPath<(String, String)>) -> Response {
    let dir = s.root.join(&org).join(&repo);
    if !dir.is_dir() {
        return not_found();
    }
    let mut list = Vec::new();
    files(&dir, "", &mut list);
    let siblings: Vec<_> = list.iter().map(|(rel, _)| json!({"rfilename": rel})).collect();
    let sha = s.inner.lock().unwrap().knobs.commit.clone().unwrap_or_else(|| COMMIT.to_string());
    axum::Json(json!({"id": format!("{org}/{repo}"), "sha": sha, "siblings": siblings})).into_response()
}

async fn tree(State(s): State<Shared>, UrlPath((org, repo, _rev)): UrlPath<(String, String, String)>) -> Response {
    let dir = s.root.join(&org).join(&repo);
    if !dir.is_dir() {
        return not_found();
    }
    let mut list = Vec::new();
    files(&dir, "", &mut list);
    let entries: Vec<_> = list
        .iter()
        .map(|(rel, p)| {
            let size = std::fs::metadata(p).unwrap().len();
            let sha = sha256_of(&s, p);
            json!({"type": "file", "path": rel, "size": size, "oid": &sha[..40], "lfs": {"oid": sha, "size": size}})
        })
        .collect();
    axum::Json(entries).into_response()
}

async fn release(
    s: State<Shared>,
    method: Method,
    headers: HeaderMap,
    UrlPath((org, repo, version, asset)): UrlPath<(String, String, String, String)>,
) -> Response {
    let path = format!("releases/download/{version}/{asset}");
    file(s, method, headers, UrlPath((org, repo, String::new(), path))).await
}

async fn file(
    State(s): State<Shared>,
    method: Method,
    headers: HeaderMap,
    UrlPath((org, repo, _rev, path)): UrlPath<(String, String, String, String)>,
) -> Response {
    let p = s.root.join(&org).join(&repo).join(&path);
    let range = headers.get("range").and_then(|v| v.to_str().ok()).map(str::to_string);
    let (corrupt, chunk_delay) = {
        let k = &s.inner.lock().unwrap().knobs;
        (k.corrupt, k.chunk_delay)
    };
    let (status, drop_after) = {
        let mut inner = s.inner.lock().unwrap();
        let knobs = &mut inner.knobs;
        let token_ok = knobs.token.as_ref().is_none_or(|t| {
            headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(format!("Bearer {t}").as_str())
        });
        let (status, drop_after) = if !token_ok {
            (401, None)
        } else if !p.is_file() {
            (404, None)
        } else if knobs.fail_first > 0 {
            knobs.fail_first -= 1;
            (503, None)
        } else if knobs.drop_times > 0 && knobs.drop_after.is_some() {
            knobs.drop_times -= 1;
            (if range.is_some() { 206 } else { 200 }, knobs.drop_after)
        } else {
            (if range.is_some() { 206 } else { 200 }, None)
        };
        inner.log.push(Logged { path: format!("{org}/{repo}/{path}"), range: range.clone(), status });
        (status, drop_after)
    };
    match status {
        401 => return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "Invalid credentials"}))).into_response(),
        404 => return (StatusCode::NOT_FOUND, axum::Json(json!({"error": "Entry not found"}))).into_response(),
        503 => return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response(),
        _ => {}
    }
    let mut bytes = std::fs::read(&p).unwrap();
    if corrupt && !bytes.is_empty() {
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
    }
    let total = bytes.len() as u64;
    let sha = sha256_of(&s, &p);
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    if start > total || (start == total && total > 0) {
        return (StatusCode::RANGE_NOT_SATISFIABLE, [("content-range", format!("bytes */{total}"))]).into_response();
    }
    let body = bytes[start as usize..].to_vec();
    let mut resp = Response::builder()
        .status(if range.is_some() { 206 } else { 200 })
        .header("etag", format!("\"{sha}\""))
        .header("x-linked-etag", format!("\"{sha}\""))
        .header("x-linked-size", total.to_string())
        .header("x-repo-commit", COMMIT)
        .header("accept-ranges", "bytes")
        .header("content-length", body.len().to_string());
    if range.is_some() {
        resp = resp.header("content-range", format!("bytes {start}-{}/{total}", total.saturating_sub(1)));
    }
    if method == Method::HEAD {
        return resp.body(Body::empty()).unwrap();
    }
    let body = match drop_after {
        // Send the first N bytes, then fail the body: the client sees a dropped connection.
        Some(n) => {
            let cut = (n as usize).min(body.len());
            let first = bytes::Bytes::from(body[..cut].to_vec());
            let stream =
                futures_util::stream::iter(vec![Ok::<_, std::io::Error>(first), Err(std::io::Error::other("dropped"))]);
            Body::from_stream(stream)
        }
        None => {
            let chunks: Vec<bytes::Bytes> = body.chunks(64 * 1024).map(|c| bytes::Bytes::from(c.to_vec())).collect();
            Body::from_stream(futures_util::stream::iter(chunks).then(move |c| async move {
                if let Some(d) = chunk_delay {
                    tokio::time::sleep(d).await;
                }
                Ok::<_, Infallible>(c)
            }))
        }
    };
    resp.body(body).unwrap()
}
