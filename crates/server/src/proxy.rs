//! Forwarding to a backend. Streaming is a byte pipe: chunks are relayed as they arrive and
//! only a small tail is kept, to read the final usage/timings for `/stats`.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

use dialects::echo::EchoLines;
use dialects::quiet::{Idle, Quiet};
use dialects::relay::Relay;
use dialects::StreamTranslator;

use crate::error::ApiError;
use crate::propagate::spilled;
use engine::{Lease, Target};

pub use dialects::quiet::{EVERY, PATIENCE};

/// Forwards a request whose answer is a byte stream other than SSE (speech audio): the
/// backend's content type and bytes, relayed as they come, the lease held until the end. A
/// failure mid-stream aborts the response, so the client sees a cut stream rather than audio
/// that merely ends early.
pub async fn forward_bytes(lease: Lease, path: &str, body: Bytes) -> Result<Response, ApiError> {
    let resp = lease.send(http::Method::POST, path, Some(body), true).await?;
    if !resp.status().is_success() {
        return Err(lease.error_of(resp).await.into());
    }
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let ct = ct.unwrap_or("application/octet-stream").to_string();
    let spill = lease.spilled.clone();
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
    Ok(spilled(spill.as_deref(), r))
}

/// Forwards a multipart form (a transcription) and returns the backend's answer labelled
/// `content_type`, or its error.
pub async fn forward_form(
    lease: Lease,
    path: &str,
    form: reqwest::multipart::Form,
    content_type: &'static str,
) -> Result<Response, ApiError> {
    let answer = lease.whole(lease.send_form(path, form).await?).await?;
    Ok(spilled(lease.spilled.as_deref(), ([(header::CONTENT_TYPE, content_type)], answer.body).into_response()))
}

/// An uploaded file as a part of the form sent on (named `default` when it came unnamed, if
/// given).
pub fn upload(p: &api_types::form::Part, default: Option<&str>) -> reqwest::multipart::Part {
    let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::from(p.data.clone()), p.data.len() as u64);
    match p.file_name.as_deref().or(default) {
        Some(name) => part.file_name(name.to_string()),
        None => part,
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
/// for the dialects that translate it (their answer takes the lease's spillover decision with
/// [`spilled`]).
pub async fn call_json(lease: &Lease, path: &str, body: &Value, record_stats: bool) -> Result<Value, ApiError> {
    let body = Some(Bytes::from(serde_json::to_vec(body)?));
    let v = lease.fetch(http::Method::POST, path, body).await?.json()?;
    if record_stats {
        lease.record_usage(&v, true);
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
    let answer = lease.fetch(method, path_and_query, body).await?;
    if record_stats {
        if let Ok(v) = serde_json::from_slice::<Value>(&answer.body) {
            lease.record_usage(&v, true);
        }
    }
    let ct = answer.content_type.unwrap_or_else(|| "application/json".into());
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let r = (status, [(header::CONTENT_TYPE, ct)], rewrite(&lease, answer.body)).into_response();
    Ok(spilled(lease.spilled.as_deref(), r))
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

/// The backend's answer to a streamed request, once it comes, with the lease that sent it.
type Sent = std::pin::Pin<Box<dyn std::future::Future<Output = (Lease, engine::Result<reqwest::Response>)> + Send>>;

/// Where a streamed answer is: waiting for the backend's first byte (llama-server answers a
/// stream once the prompt is prefilled), or relaying its bytes. When a quiet stream gets a
/// keep-alive and when it is cut is `dialects::quiet`'s decision; this only waits and sends.
enum Phase {
    Prefill { sent: Sent, relay: Relay, quiet: Quiet, stalled: String },
    Piping(StreamState),
}

async fn stream_with(
    lease: Lease,
    path: &str,
    body: Bytes,
    translate: Option<Box<dyn StreamTranslator>>,
) -> Result<Response, ApiError> {
    let echo = match &lease.target {
        Target::Remote(r) => Some(EchoLines::new(&r.id, &r.name)),
        Target::Local { .. } => None,
    };
    let relay = Relay::new(translate, echo);
    let content_type = relay.content_type();
    let spill = lease.spilled.clone();
    // A local backend's prefill may go quiet for its stall timeout; a remote provider's
    // headers are awaited within its own `--remote-timeout`.
    let limit = lease.local().map(|_| lease.quiet_timeout());
    let stalled = ApiError::from(lease.stalled()).message();
    let t0 = tokio::time::Instant::now();
    let path = path.to_string();
    let mut sent: Sent = Box::pin(async move {
        let resp = lease.send(http::Method::POST, &path, Some(body), true).await;
        (lease, resp)
    });
    // Answered within PATIENCE, the answer keeps the backend's status (an error included);
    // after that a local backend's answer starts at once, kept alive until its first byte. A
    // remote provider's keeps its status: its headers are awaited.
    let patience = if limit.is_some() { PATIENCE } else { Duration::MAX };
    let phase = match tokio::time::timeout(patience, &mut sent).await {
        Ok((lease, resp)) => {
            let resp = resp?;
            if !resp.status().is_success() {
                return Err(lease.error_of(resp).await.into());
            }
            let now = t0.elapsed();
            Phase::Piping(StreamState::new(lease, resp, relay, Quiet::new(None, now), now))
        }
        Err(_) => Phase::Prefill { sent, relay, quiet: Quiet::prefill(limit, Duration::ZERO), stalled },
    };
    let stream = futures_util::stream::unfold(Some(phase), move |phase| async move {
        let mut phase = phase?;
        loop {
            phase = match phase {
                Phase::Prefill { mut sent, mut relay, mut quiet, stalled } => {
                    let wait = quiet.wait(t0.elapsed());
                    tokio::select! {
                        (lease, resp) = &mut sent => match resp {
                            Ok(r) if r.status().is_success() => {
                                Phase::Piping(StreamState::new(lease, r, relay, quiet, t0.elapsed()))
                            }
                            Ok(r) => {
                                let e = ApiError::from(lease.error_of(r).await);
                                return Some((Ok(relay.failed(&e.message())), None));
                            }
                            Err(e) => return Some((Ok(relay.failed(&ApiError::from(e).message())), None)),
                        },
                        () = tokio::time::sleep(wait) => match quiet.idle(t0.elapsed()) {
                            Idle::Cut => {
                                tracing::warn!(error = %stalled, "prefill stalled");
                                return Some((Ok(relay.failed(&stalled)), None));
                            }
                            Idle::KeepAlive(words) => {
                                let keepalive = relay.keepalive(&words);
                                return Some((Ok(keepalive), Some(Phase::Prefill { sent, relay, quiet, stalled })));
                            }
                        },
                    }
                }
                Phase::Piping(mut st) => {
                    let next = match tokio::time::timeout(st.quiet.wait(t0.elapsed()), st.upstream.next()).await {
                        Ok(next) => next,
                        Err(_) => match st.quiet.idle(t0.elapsed()) {
                            Idle::Cut => {
                                let msg = ApiError::from(st.lease.went_quiet()).message();
                                tracing::warn!(model = %st.lease.name(), error = %msg, "stream from backend stalled");
                                return Some((Ok(st.relay.failed(&msg)), None));
                            }
                            Idle::KeepAlive(words) => {
                                let keepalive = st.relay.keepalive(&words);
                                return Some((Ok(keepalive), Some(Phase::Piping(st))));
                            }
                        },
                    };
                    match next {
                        Some(Ok(chunk)) => {
                            st.first_byte();
                            st.quiet.chunk(t0.elapsed());
                            if let Some(out) = st.relay.chunk(chunk) {
                                return Some((Ok::<Bytes, Infallible>(out), Some(Phase::Piping(st))));
                            }
                            Phase::Piping(st)
                        }
                        Some(Err(e)) => {
                            let msg = st.lease.transport_failed(&e).await.to_string();
                            tracing::warn!(model = %st.lease.name(), error = %msg, "stream from backend failed");
                            return Some((Ok(st.relay.failed(&msg)), None));
                        }
                        // `st` is dropped here, which records the stats (see `Drop`).
                        None => return st.relay.ended().map(|out| (Ok(out), None)),
                    }
                }
            };
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(spilled(spill.as_deref(), r))
}

/// The pipe's state: the upstream's bytes, the lease (held until the stream ends or the
/// client goes away), and the relay that decides what each chunk becomes.
struct StreamState {
    upstream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    lease: Lease,
    relay: Relay,
    /// Whether the first byte has come (for the time to first token).
    started: bool,
    /// Its silences: when it gets a keep-alive, when it is cut.
    quiet: Quiet,
}

impl StreamState {
    /// The pipe from the backend's answer; `quiet` goes on from the wait for it, bounded now
    /// by the backend's quiet timeout (a remote provider's `--remote-timeout`, a local one's
    /// `stream_timeout`).
    fn new(lease: Lease, resp: reqwest::Response, relay: Relay, mut quiet: Quiet, now: Duration) -> StreamState {
        quiet.answered(lease.quiet_timeout(), now);
        StreamState { upstream: Box::pin(resp.bytes_stream()), lease, relay, started: false, quiet }
    }

    fn first_byte(&mut self) {
        if !self.started {
            self.started = true;
            self.lease.streaming();
            self.lease.metrics().first_token(self.lease.name(), self.lease.asked.elapsed());
        }
    }
}

/// Records the stats however the stream ends: at the upstream's end, or when the client closes
/// the connection first, as clients do once they read `[DONE]` (before the upstream's end has
/// been polled).
impl Drop for StreamState {
    fn drop(&mut self) {
        self.lease.record_stream_tail(self.relay.tail());
    }
}
