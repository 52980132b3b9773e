//! Forwarding to a backend. Streaming is a byte pipe: chunks are relayed as they arrive and
//! only a small tail is kept, to read the final usage/timings for `/stats`.

use std::convert::Infallible;

use api_types::Stats;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

use dialects::{Counts, SseDecoder, StreamTranslator};

use crate::error::ApiError;
use engine::remote::Route;
use engine::{Lease, Target};

/// Bytes of a stream kept to find the last usage/timings chunk and the `[DONE]` marker.
const TAIL_KEEP: usize = 16 * 1024;
const DONE: &[u8] = b"data: [DONE]";

async fn send(
    lease: &Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
    stream: bool,
) -> Result<reqwest::Response, ApiError> {
    crate::propagate::spilled(lease.spilled.as_deref());
    let body = match lease.upstream_model() {
        Some(id) => body.map(|b| backends::cloud::rewrite_model(&b, id).map(Bytes::from).unwrap_or(b)),
        None => body,
    };
    if lease.local().is_none() {
        return send_remote(lease, method, path_and_query, body).await;
    }
    if let Some(b) = &body {
        lease.before_forward(path_and_query, b).await;
    }
    let mut req = crate::propagate::apply(lease.http().request(method, lease.url(path_and_query)));
    if stream {
        // llama-server closes the connection after a streamed response although it advertised
        // keep-alive; a pooled connection reused before its FIN arrives fails the next request.
        req = req.header(header::CONNECTION, "close");
    }
    if let Some(b) = body {
        req = req.header(header::CONTENT_TYPE, "application/json").body(b);
    }
    issue(lease, req).await
}

/// Attempts at a remote provider, counting the first: a refused connection, a 502/504 or a
/// 503 without `Retry-After` is tried again, as nothing has reached the client yet; its
/// backpressure (429, 503 with `Retry-After`) is waited out when the pause is short.
const REMOTE_ATTEMPTS: u32 = 3;

/// [`send`] to a remote provider (the model id already the upstream's): its key added in its
/// auth header, the trace and session headers forwarded, an answer's headers awaited for
/// `--remote-timeout`. Its backpressure, when it is not waited out, is a 503 with its
/// `Retry-After` (`backends::upstream::judge`), never a 502.
async fn send_remote(
    lease: &Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
) -> Result<reqwest::Response, ApiError> {
    use backends::upstream::{judge, retry_after, Answer};
    let Target::Remote(route) = &lease.target else { unreachable!("send_remote is for remote leases") };
    let url = lease.url(path_and_query);
    let auth = route.provider.sendable_key()?.map(|k| route.provider.auth_header(&k));
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut req = crate::propagate::apply(lease.http().request(method.clone(), &url));
        if let Some((name, value)) = &auth {
            req = req.header(name.as_str(), value.as_str());
        }
        if let Some(b) = &body {
            req = req.header(header::CONTENT_TYPE, "application/json").body(b.clone());
        }
        let left = lease.remote_timeout().saturating_sub(started.elapsed());
        let r = match tokio::time::timeout(left, req.send()).await {
            Err(_) => return Err(remote_timeout(lease, route)),
            Ok(Err(e)) if attempt < REMOTE_ATTEMPTS && e.is_connect() => {
                pause(lease, route, attempt, started, None).await;
                continue;
            }
            Ok(Err(e)) => return Err(remote_failed(route, &e, lease.remote_timeout())),
            Ok(Ok(r)) => r,
        };
        let header = r.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let left = lease.remote_timeout().saturating_sub(started.elapsed());
        match judge(r.status().as_u16(), retry_after(header, now), attempt, REMOTE_ATTEMPTS, left) {
            Answer::Relay => {
                route.answered(started.elapsed());
                return Ok(r);
            }
            // The upstream's own failure: `backend_error` makes it a 502 naming it.
            Answer::Failed => return Ok(r),
            Answer::Retry => pause(lease, route, attempt, started, None).await,
            Answer::RetryAfter(wait) => pause(lease, route, attempt, started, Some(wait)).await,
            Answer::Busy(secs) => {
                route.answered(started.elapsed());
                let msg = format!(
                    "Upstream '{}' ({}) is busy: it answered {} asking to retry after {secs} s",
                    route.provider.name,
                    route.provider.base,
                    r.status()
                );
                tracing::info!(provider = %route.provider.name, retry_after = secs, "remote provider busy; passed on as 503");
                return Err(ApiError::UpstreamBusy { message: msg, retry_after: secs });
            }
        }
    }
}

/// Waits before attempt `attempt + 1` at a remote provider: `wait` (its `Retry-After`), else
/// a back-off; never past the request's time.
async fn pause(
    lease: &Lease,
    route: &Route,
    attempt: u32,
    started: std::time::Instant,
    wait: Option<std::time::Duration>,
) {
    let wait = wait.unwrap_or(std::time::Duration::from_millis(200 << attempt));
    tracing::warn!(provider = %route.provider.name, attempt, wait_ms = wait.as_millis() as u64, "remote provider failed or busy; trying again");
    tokio::time::sleep(wait.min(lease.remote_timeout().saturating_sub(started.elapsed()))).await;
}

fn remote_timeout(lease: &Lease, route: &Route) -> ApiError {
    let t = lease.remote_timeout();
    let msg = format!(
        "Upstream '{}' ({}) did not answer within {} s (--remote-timeout)",
        route.provider.name,
        route.provider.base,
        t.as_secs_f64()
    );
    route.failed(t, &msg, true);
    ApiError::UpstreamTimeout(msg)
}

fn remote_failed(route: &Route, e: &reqwest::Error, timeout: std::time::Duration) -> ApiError {
    let msg = format!(
        "Upstream '{}' ({}) failed: {}",
        route.provider.name,
        route.provider.base,
        host::cloud::describe(e, timeout)
    );
    route.failed(std::time::Duration::ZERO, &msg, true);
    ApiError::UpstreamFailed(msg)
}

async fn issue(lease: &Lease, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ApiError> {
    match req.send().await {
        Ok(r) => Ok(r),
        Err(e) => Err(unavailable(lease, &e).await),
    }
}

/// Forwards a request whose answer is a byte stream other than SSE (speech audio): the
/// backend's content type and bytes, relayed as they come, the lease held until the end. A
/// failure mid-stream aborts the response, so the client sees a cut stream rather than audio
/// that merely ends early.
pub async fn forward_bytes(lease: Lease, path: &str, body: Bytes) -> Result<Response, ApiError> {
    let resp = send(&lease, http::Method::POST, path, Some(body), true).await?;
    if !resp.status().is_success() {
        return Err(backend_error(&lease, resp).await);
    }
    let ct = content_type(&resp).unwrap_or_else(|| "application/octet-stream".into());
    let stream = resp.bytes_stream().map(move |chunk| {
        let held = &lease;
        chunk.map_err(|e| {
            tracing::warn!(model = %held.name(), error = %e, "stream from backend failed");
            std::io::Error::other(e)
        })
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&ct).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
}

/// Forwards a multipart form (a transcription) and returns the backend's answer labelled
/// `content_type`, or its error.
pub async fn forward_form(
    lease: Lease,
    path: &str,
    form: reqwest::multipart::Form,
    content_type: &'static str,
) -> Result<Response, ApiError> {
    // Only local backends get forms (pulls::lease forwards no audio request to a remote).
    let resp = issue(&lease, crate::propagate::apply(lease.http().post(lease.url(path))).multipart(form)).await?;
    if !resp.status().is_success() {
        return Err(backend_error(&lease, resp).await);
    }
    let bytes = read_body(&lease, resp).await?;
    Ok(([(header::CONTENT_TYPE, content_type)], bytes).into_response())
}

async fn read_body(lease: &Lease, resp: reqwest::Response) -> Result<Bytes, ApiError> {
    if let Target::Remote(route) = &lease.target {
        return match tokio::time::timeout(lease.remote_timeout(), resp.bytes()).await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(remote_failed(route, &e, lease.remote_timeout())),
            Err(_) => Err(remote_timeout(lease, route)),
        };
    }
    match resp.bytes().await {
        Ok(b) => Ok(b),
        Err(e) => Err(unavailable(lease, &e).await),
    }
}

fn content_type(resp: &reqwest::Response) -> Option<String> {
    resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The backend's error answer as [`ApiError::Backend`], its status and body kept.
async fn backend_error(lease: &Lease, resp: reqwest::Response) -> ApiError {
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = content_type(&resp);
    let body = match read_body(lease, resp).await {
        Ok(body) => body,
        Err(e) => return e,
    };
    match &lease.target {
        // An upstream's 5xx, or its refusal of our key, is the upstream's failure, not the
        // client's: 502 naming it. Its other 4xx are about the request and pass through.
        Target::Remote(route) if status.is_server_error() || matches!(status.as_u16(), 401 | 403) => {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = text.chars().take(300).collect();
            let hint = if status.is_server_error() {
                String::new()
            } else {
                format!(
                    " (its API key: `lemonade cloud auth {}` or {})",
                    route.provider.name,
                    backends::cloud::key_variable(&route.provider.name)
                )
            };
            let msg = format!(
                "Upstream '{}' ({}) answered {status}{hint}: {excerpt}",
                route.provider.name, route.provider.base
            );
            route.failed(std::time::Duration::ZERO, &msg, status.is_server_error());
            ApiError::UpstreamFailed(msg)
        }
        _ => ApiError::Backend { status, body, content_type },
    }
}

/// A whole answer: its status, content type and body, or the backend's error.
async fn fetch(
    lease: &Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
) -> Result<(StatusCode, Option<String>, Bytes), ApiError> {
    let resp = send(lease, method, path_and_query, body, false).await?;
    if !resp.status().is_success() {
        return Err(backend_error(lease, resp).await);
    }
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = content_type(&resp);
    Ok((status, content_type, read_body(lease, resp).await?))
}

/// How long a transport failure waits to learn whether the backend died (its exit is
/// recorded by a watcher task a moment after the connection breaks).
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

async fn unavailable(lease: &Lease, e: &reqwest::Error) -> ApiError {
    let model = match &lease.target {
        Target::Local { model, .. } => model,
        Target::Remote(route) => return remote_failed(route, e, lease.remote_timeout()),
    };
    let b = &model.backend;
    let exit = match b.exit_status() {
        Some(x) => Some(x),
        None => tokio::time::timeout(EXIT_GRACE, b.wait_exit()).await.ok(),
    };
    let wedged = model.wedged.load(std::sync::atomic::Ordering::SeqCst);
    match exit {
        Some(exit) if wedged => ApiError::BackendUnavailable(format!(
            "The backend of model '{}' stopped answering its health checks during the request and was killed ({exit}). Last log lines:\n{}",
            model.info.name,
            b.log_tail()
        )),
        Some(exit) => ApiError::BackendUnavailable(format!(
            "The backend of model '{}' exited ({exit}) during the request. Last log lines:\n{}",
            model.info.name,
            b.log_tail()
        )),
        None => ApiError::BackendUnavailable(format!("Backend of model '{}' failed: {e}", model.info.name)),
    }
}

/// Forwards a request and returns the backend's answer. Error statuses keep the backend's
/// status and body. `record_stats` updates the model's `/stats` from usage/timings.
pub async fn forward(
    lease: Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
    record_stats: bool,
) -> Result<Response, ApiError> {
    forward_with(lease, method, path_and_query, body, record_stats, |_, b| b).await
}

/// Sends a JSON request and returns the backend's JSON answer (recording `/stats` when asked),
/// for the dialects that translate it.
pub async fn call_json(lease: &Lease, path: &str, body: &Value, record_stats: bool) -> Result<Value, ApiError> {
    let body = Some(Bytes::from(serde_json::to_vec(body)?));
    let (_, _, bytes) = fetch(lease, http::Method::POST, path, body).await?;
    let bytes = echo_requested_id(lease, bytes);
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BackendUnavailable(format!("The backend answered with invalid JSON: {e}")))?;
    if record_stats {
        update_stats(lease, &v, true);
    }
    Ok(v)
}

/// [`forward`] for llama-server's own endpoints, whose answers may name the model's local files
/// (`/props` reports `model_path`): those paths become the model's name, so no answer to an
/// API client carries a path of this machine. Inference answers never name them (`--alias`
/// names the model), so only these routes pay for the search.
pub async fn forward_native(
    lease: Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
    record_stats: bool,
) -> Result<Response, ApiError> {
    forward_with(lease, method, path_and_query, body, record_stats, without_model_paths).await
}

async fn forward_with(
    lease: Lease,
    method: http::Method,
    path_and_query: &str,
    body: Option<Bytes>,
    record_stats: bool,
    rewrite: fn(&Lease, Bytes) -> Bytes,
) -> Result<Response, ApiError> {
    let (status, content_type, bytes) = fetch(&lease, method, path_and_query, body).await?;
    if record_stats {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            update_stats(&lease, &v, true);
        }
    }
    let ct = content_type.unwrap_or_else(|| "application/json".into());
    let bytes = echo_requested_id(&lease, rewrite(&lease, bytes));
    Ok((status, [(header::CONTENT_TYPE, ct)], bytes).into_response())
}

/// A remote model's answer names the id the client asked for (`<provider>.<id>`), not the
/// upstream's own, as a local model's answer names its model (llama-server's `--alias`).
fn echo_requested_id(lease: &Lease, bytes: Bytes) -> Bytes {
    match &lease.target {
        Target::Remote(r) => backends::cloud::echo_model(&bytes, &r.id, &r.name).map(Bytes::from).unwrap_or(bytes),
        Target::Local { .. } => bytes,
    }
}

/// `bytes` with the model's local file paths replaced by its name; unchanged (no copy) when
/// they mention none.
fn without_model_paths(lease: &Lease, bytes: Bytes) -> Bytes {
    let Some(model) = lease.local() else { return bytes };
    let info = &model.info;
    let mut out: Option<String> = None;
    for path in info.main_path.iter().chain(&info.mmproj_path) {
        let p = path.display().to_string();
        let text = out.as_deref().map(str::as_bytes).unwrap_or(&bytes);
        if p.len() > 1 && text.windows(p.len()).any(|w| w == p.as_bytes()) {
            let replaced = String::from_utf8_lossy(text).replace(&p, &info.name);
            out = Some(replaced);
        }
    }
    out.map(Bytes::from).unwrap_or(bytes)
}

/// Forwards a streaming request. A backend error before the first byte keeps its status;
/// once streaming, a failure becomes an error frame and the stream ends cleanly.
pub async fn forward_stream(lease: Lease, path: &str, body: Bytes) -> Result<Response, ApiError> {
    stream_with(lease, path, body, None).await
}

/// [`forward_stream`] in another dialect: each upstream event goes through `translate` as it
/// arrives; the end and a failure too.
pub async fn forward_translated(
    lease: Lease,
    path: &str,
    body: &Value,
    translate: Box<dyn StreamTranslator>,
) -> Result<Response, ApiError> {
    stream_with(lease, path, Bytes::from(serde_json::to_vec(body)?), Some(translate)).await
}

async fn stream_with(
    lease: Lease,
    path: &str,
    body: Bytes,
    translate: Option<Box<dyn StreamTranslator>>,
) -> Result<Response, ApiError> {
    let resp = send(&lease, http::Method::POST, path, Some(body), true).await?;
    if !resp.status().is_success() {
        return Err(backend_error(&lease, resp).await);
    }
    let content_type = translate.as_ref().map_or("text/event-stream", |t| t.content_type());
    let echo = match &lease.target {
        Target::Remote(r) => Some(Echo { upstream: r.id.clone(), requested: r.name.clone(), partial: BytesMut::new() }),
        Target::Local { .. } => None,
    };
    let state = StreamState {
        upstream: Box::pin(resp.bytes_stream()),
        echo,
        lease,
        tail: BytesMut::new(),
        translate: translate.map(|t| (t, SseDecoder::default())),
        started: false,
    };
    let stream = futures_util::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            // A remote provider that goes quiet mid-stream for `--remote-timeout` ends it.
            let next = match st.lease.local() {
                Some(_) => st.upstream.next().await,
                None => match tokio::time::timeout(st.lease.remote_timeout(), st.upstream.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        let Target::Remote(route) = &st.lease.target else { return None };
                        let msg = remote_timeout(&st.lease, route).to_string();
                        tracing::warn!(model = %st.lease.name(), error = %msg, "stream from upstream stalled");
                        return Some((Ok(st.failed(&msg)), None));
                    }
                },
            };
            match next {
                Some(Ok(chunk)) => {
                    st.first_byte();
                    st.keep_tail(&chunk);
                    // A chunk that makes no output (part of an event) is not sent empty.
                    if let Some(out) = st.relay(chunk) {
                        return Some((Ok::<Bytes, Infallible>(out), Some(st)));
                    }
                }
                Some(Err(e)) => {
                    let msg = unavailable(&st.lease, &e).await.to_string();
                    tracing::warn!(model = %st.lease.name(), error = %msg, "stream from backend failed");
                    return Some((Ok(st.failed(&msg)), None));
                }
                // `st` is dropped here, which records the stats (see `Drop`).
                None => return st.ended().map(|out| (Ok(out), None)),
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(r)
}

/// One upstream event's payload through `t`: a chunk, or the backend's own error frame as
/// the dialect's error (`[DONE]`, not JSON, adds nothing).
fn translate_event(t: &mut dyn StreamTranslator, data: &str, out: &mut Vec<u8>) {
    match serde_json::from_str::<Value>(data) {
        Ok(v) if v.get("error").is_some() => {
            let e = &v["error"];
            out.extend(t.error(e["message"].as_str().or(e.as_str()).unwrap_or("the backend failed")));
        }
        Ok(v) => out.extend(t.chunk(&v)),
        Err(_) => {}
    }
}

/// An SSE frame carrying an error, as Lemonade writes them (`type: streaming_error`).
pub fn error_frame(message: &str) -> Bytes {
    let v = serde_json::json!({"error": {"message": message, "type": "streaming_error"}});
    Bytes::from(format!("data: {v}\n\n"))
}

/// A remote stream's lines with the requested id in place of the upstream's (see
/// [`echo_requested_id`]): whole lines are passed on as they complete; a line split across
/// chunks waits for its end (one event, at most), so no id is missed at a chunk boundary.
struct Echo {
    upstream: String,
    requested: String,
    partial: BytesMut,
}

impl Echo {
    /// The complete lines `chunk` finishes, echoed; the rest waits.
    fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.partial.extend_from_slice(chunk);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else { return Bytes::new() };
        let lines = self.partial.split_to(end + 1).freeze();
        self.echo(lines)
    }

    /// What is left at the end of the stream.
    fn rest(&mut self) -> Bytes {
        let rest = self.partial.split().freeze();
        self.echo(rest)
    }

    fn echo(&self, lines: Bytes) -> Bytes {
        backends::cloud::echo_model(&lines, &self.upstream, &self.requested).map(Bytes::from).unwrap_or(lines)
    }
}

struct StreamState {
    upstream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    /// A remote model's stream: its model id echoed as the client asked for it.
    echo: Option<Echo>,
    /// Held until the stream ends or the client goes away.
    lease: Lease,
    tail: BytesMut,
    /// Another dialect's translator, and the decoder that feeds it events.
    translate: Option<(Box<dyn StreamTranslator>, SseDecoder)>,
    /// Whether the first byte has come (for the time to first token).
    started: bool,
}

impl StreamState {
    /// What to send for `chunk`: the chunk itself, or its translation (None: nothing yet).
    fn relay(&mut self, chunk: Bytes) -> Option<Bytes> {
        let chunk = match &mut self.echo {
            Some(e) => e.push(&chunk),
            None => chunk,
        };
        if chunk.is_empty() {
            return None;
        }
        let Some((t, sse)) = &mut self.translate else { return Some(chunk) };
        let mut out = Vec::new();
        for data in sse.push(&chunk) {
            translate_event(t.as_mut(), &data, &mut out);
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// The frame that ends a stream the backend broke off.
    fn failed(&mut self, msg: &str) -> Bytes {
        match &mut self.translate {
            Some((t, _)) => Bytes::from(t.error(msg)),
            None => error_frame(msg),
        }
    }

    /// What to send once the backend's stream has ended: a translation's end, or `[DONE]`
    /// when the backend left it out.
    fn ended(&mut self) -> Option<Bytes> {
        let rest = self.echo.as_mut().map(Echo::rest).unwrap_or_default();
        if let Some((t, sse)) = &mut self.translate {
            let mut out = Vec::new();
            for data in sse.push(&rest) {
                translate_event(t.as_mut(), &data, &mut out);
            }
            if let Some(data) = sse.finish() {
                translate_event(t.as_mut(), &data, &mut out);
            }
            out.extend(t.end());
            return Some(Bytes::from(out));
        }
        let done = self.tail.windows(DONE.len()).any(|w| w == DONE);
        let mut out = BytesMut::from(&rest[..]);
        if !done {
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        (!out.is_empty()).then(|| out.freeze())
    }

    fn first_byte(&mut self) {
        if !self.started {
            self.started = true;
            self.lease.streaming();
            self.lease.metrics().first_token(self.lease.name(), self.lease.asked.elapsed());
        }
    }

    fn keep_tail(&mut self, chunk: &[u8]) {
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 2 * TAIL_KEEP {
            let cut = self.tail.len() - TAIL_KEEP;
            let _ = self.tail.split_to(cut);
        }
    }
}

/// Records the stats however the stream ends: at the upstream's end, or when the client closes
/// the connection first, as clients do once they read `[DONE]` (before the upstream's end has
/// been polled).
impl Drop for StreamState {
    fn drop(&mut self) {
        self.finish();
    }
}

impl StreamState {
    /// Reads the last `data:` line with usage or timings into the model's stats.
    fn finish(&self) {
        let text = String::from_utf8_lossy(&self.tail);
        let last = text
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .filter(|d| d.contains("\"timings\"") || d.contains("\"usage\""))
            .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok());
        if let Some(v) = last {
            // Responses API events nest the usage inside `response`.
            let v = v.get("response").filter(|r| r.get("usage").is_some()).cloned().unwrap_or(v);
            update_stats(&self.lease, &v, false);
        }
    }
}

fn update_stats(lease: &Lease, v: &Value, non_streaming: bool) {
    if let Some(model) = lease.local() {
        apply_usage(&mut model.stats.lock(), v, non_streaming);
    }
    // A whole answer's time to first token is the wait for the model plus the prompt's time.
    lease.metrics().usage(lease.name(), &Counts::of(v), non_streaming.then_some(lease.waited));
}

/// usage → input/output tokens; llama.cpp `timings` override and give TTFT and tokens/s.
pub fn apply_usage(s: &mut Stats, v: &Value, non_streaming: bool) {
    let u64_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
    let f64_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    if let Some(u) = v.get("usage") {
        let input = u64_at(u, "prompt_tokens").or_else(|| u64_at(u, "input_tokens"));
        let output = u64_at(u, "completion_tokens").or_else(|| u64_at(u, "output_tokens"));
        if let Some(i) = input {
            s.input_tokens = i;
            if non_streaming {
                s.prompt_tokens = i;
            }
        }
        if let Some(o) = output {
            s.output_tokens = o;
        }
    }
    if let Some(t) = v.get("timings") {
        if let Some(n) = u64_at(t, "prompt_n") {
            s.input_tokens = n;
            // The whole prompt is the processed part plus the part reused from the cache; a
            // stream has no `usage` unless asked, but its last chunk has these timings.
            if let Some(cached) = u64_at(t, "cache_n") {
                s.prompt_tokens = n + cached;
            }
        }
        if let Some(n) = u64_at(t, "predicted_n") {
            s.output_tokens = n;
        }
        if let Some(ms) = f64_at(t, "prompt_ms") {
            s.time_to_first_token = ms / 1000.0;
        }
        if let Some(tps) = f64_at(t, "predicted_per_second") {
            s.tokens_per_second = tps;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_override_usage() {
        let mut s = Stats::default();
        let v = serde_json::json!({"usage": {"prompt_tokens": 10, "completion_tokens": 5},
            "timings": {"prompt_n": 9, "predicted_n": 4, "prompt_ms": 25.0, "predicted_per_second": 80.5}});
        apply_usage(&mut s, &v, true);
        assert_eq!((s.input_tokens, s.output_tokens, s.prompt_tokens), (9, 4, 10));
        // The metrics count the whole prompt (usage's, as no cache_n says otherwise).
        let u = Counts::of(&v);
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.prompt_ms), (Some(10), Some(4), Some(25.0)));
        assert_eq!(s.time_to_first_token, 0.025);
        assert_eq!(s.tokens_per_second, 80.5);
        let mut s2 = Stats::default();
        apply_usage(&mut s2, &serde_json::json!({"usage": {"input_tokens": 3, "output_tokens": 2}}), false);
        assert_eq!((s2.input_tokens, s2.output_tokens, s2.prompt_tokens), (3, 2, 0));
        // A stream's final timings: processed plus cached tokens make the whole prompt.
        let last = serde_json::json!({"timings": {"prompt_n": 1, "cache_n": 35}});
        apply_usage(&mut s2, &last, false);
        assert_eq!((s2.input_tokens, s2.prompt_tokens), (1, 36));
        assert_eq!(Counts::of(&last).prompt_tokens, Some(36));
    }

    #[test]
    fn error_frame_is_valid_json() {
        let f = error_frame("boom \"quoted\"\nline");
        let s = std::str::from_utf8(&f).unwrap();
        assert!(s.starts_with("data: ") && s.ends_with("\n\n"));
        let v: Value = serde_json::from_str(s.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["error"]["type"], "streaming_error");
        assert_eq!(v["error"]["message"], "boom \"quoted\"\nline");
    }
}
