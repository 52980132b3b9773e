//! Forwarding to a backend. Streaming is a byte pipe: chunks are relayed as they arrive and
//! only a small tail is kept, to read the final usage/timings for `/stats`.

use std::convert::Infallible;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

use backends::cloud::EchoLines;
use dialects::{SseDecoder, StreamTranslator};

use crate::error::ApiError;
use crate::propagate::spilled;
use engine::{Lease, Target};

/// Bytes of a stream kept to find the last usage/timings chunk and the `[DONE]` marker.
const TAIL_KEEP: usize = 16 * 1024;
const DONE: &[u8] = b"data: [DONE]";

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

async fn stream_with(
    lease: Lease,
    path: &str,
    body: Bytes,
    translate: Option<Box<dyn StreamTranslator>>,
) -> Result<Response, ApiError> {
    let resp = lease.send(http::Method::POST, path, Some(body), true).await?;
    if !resp.status().is_success() {
        return Err(lease.error_of(resp).await.into());
    }
    let content_type = translate.as_ref().map_or("text/event-stream", |t| t.content_type());
    let echo = match &lease.target {
        Target::Remote(r) => Some(EchoLines::new(&r.id, &r.name)),
        Target::Local { .. } => None,
    };
    let spill = lease.spilled.clone();
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
                        let msg = st.lease.remote_timed_out(route).to_string();
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
                    let msg = st.lease.transport_failed(&e).await.to_string();
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
    Ok(spilled(spill.as_deref(), r))
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

struct StreamState {
    upstream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    /// A remote model's stream: its model id echoed as the client asked for it.
    echo: Option<EchoLines>,
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
            Some(e) => Bytes::from(e.push(&chunk)),
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
        let rest = Bytes::from(self.echo.as_mut().map(EchoLines::rest).unwrap_or_default());
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
    /// Records the stream's usage (from its tail) into the model's stats.
    fn finish(&self) {
        self.lease.record_stream_tail(&self.tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
