//! A streamed request that has to wait (for its model to load, or for a place on it) is
//! answered at once, and until the model takes it SSE comment lines say where it is:
//! `: queued 2` (the 2nd in line for a place on the loaded model) or `: loading 3 s`. Every
//! SSE client ignores comments, so the stream is the one it would have been, with the wait
//! visible. A request granted within [`PATIENCE`] is answered exactly as before, its status
//! included; after that the status is 200, and a failure (the load failed, the queue refused
//! it, the backend refused the request) is a `data: {"error": …}` event and `data: [DONE]`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use engine::lease::{Endpoint, PRIORITIES};
use engine::Lease;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::proxy;
use crate::state::AppState;

/// How long a streamed request waits quietly before its answer starts with comments.
pub const PATIENCE: Duration = Duration::from_millis(250);
/// How often a waiting stream says where it is.
pub const EVERY: Duration = Duration::from_secs(1);

/// The header that gives a request's priority when its body gives none.
pub const PRIORITY_HEADER: &str = "x-lemonade-priority";

tokio::task_local! {
    /// The priority the request's header gave, for the handler that reads the body.
    static HEADER_PRIORITY: i32;
}

/// Reads `X-Lemonade-Priority` (an integer in [`PRIORITIES`]) for the handler; a bad
/// value is a 400 naming the header.
pub async fn priority_header(req: axum::extract::Request, next: axum::middleware::Next) -> Result<Response, ApiError> {
    let Some(v) = req.headers().get(PRIORITY_HEADER) else { return Ok(next.run(req).await) };
    let p = v.to_str().ok().and_then(|s| s.trim().parse::<i32>().ok()).filter(|n| PRIORITIES.contains(n));
    let p = p.ok_or_else(|| {
        let shown = String::from_utf8_lossy(v.as_bytes()).chars().take(40).collect::<String>();
        ApiError::bad_request(
            format!(
                "X-Lemonade-Priority must be a whole number from -10 to 10 (higher is served first), got '{shown}'"
            ),
            Some("X-Lemonade-Priority"),
        )
    })?;
    Ok(HEADER_PRIORITY.scope(p, next.run(req)).await)
}

/// A request's `priority` (lemonade's; an integer in [`PRIORITIES`]): its body's, else
/// its `X-Lemonade-Priority` header's, else 0. The body is read only when it names one.
pub fn priority_of(body: &[u8]) -> Result<i32, ApiError> {
    let from_header = || HEADER_PRIORITY.try_with(|p| *p).unwrap_or(0);
    if memchr::memmem::find(body, b"\"priority\"").is_none() {
        return Ok(from_header());
    }
    #[derive(serde::Deserialize)]
    struct P {
        priority: Option<serde_json::Value>,
    }
    let p: P = serde_json::from_slice(body)?;
    match p.priority {
        None | Some(serde_json::Value::Null) => Ok(from_header()),
        Some(v) => v.as_i64().and_then(|n| i32::try_from(n).ok()).filter(|n| PRIORITIES.contains(n)).ok_or_else(|| {
            ApiError::bad_request(
                format!("'priority' must be a whole number from -10 to 10 (higher is served first), got {v}"),
                Some("priority"),
            )
        }),
    }
}

/// How a waiting stream speaks its dialect: its content type, the line that says where the
/// request is (given the words: `queued 2`, `loading 3 s`), and the end it gets on a failure.
pub struct Voice {
    pub content_type: &'static str,
    pub place: Box<dyn Fn(&str) -> Bytes + Send>,
    pub failure: Box<dyn Fn(&ApiError) -> Bytes + Send>,
}

impl Voice {
    /// OpenAI's SSE: a comment line each (`: queued 2`), which every SSE client ignores; a
    /// failure is a `data: {"error": …}` event and `data: [DONE]`.
    pub fn sse() -> Voice {
        Voice {
            content_type: "text/event-stream",
            place: Box::new(|words| Bytes::from(format!(": {words}\n\n"))),
            failure: Box::new(|e| {
                let event = serde_json::json!({"error": e.body().error});
                Bytes::from(format!("data: {event}\n\ndata: [DONE]\n\n"))
            }),
        }
    }
}

/// Forwards a streamed request to `model` once it is granted, saying meanwhile where it is.
pub async fn stream(rt: &AppState, model: &str, endpoint: Endpoint, body: Bytes) -> Result<Response, ApiError> {
    let priority = priority_of(&body)?;
    let (rt1, req) = (rt.clone(), crate::propagate::request(model, endpoint).priority(priority));
    let lease = async move { rt1.lease(req).await };
    let answer = move |l: Lease| async move { proxy::forward_stream(l, endpoint.path(), body).await };
    when_granted(rt, model, priority, lease, answer, Voice::sse()).await
}

/// Answers with `answer(lease)` once `lease` is granted. Granted within [`PATIENCE`], that is
/// the answer as it is (its status included); otherwise the answer starts at once, in `voice`,
/// with a line every [`EVERY`] saying where the request is, then the answer's bytes, or
/// `voice`'s failure. A client that leaves withdraws the request.
pub async fn when_granted<L, A, F>(
    rt: &AppState,
    model: &str,
    priority: i32,
    lease: L,
    answer: A,
    voice: Voice,
) -> Result<Response, ApiError>
where
    L: std::future::Future<Output = Result<Lease, engine::EngineError>> + Send + 'static,
    A: FnOnce(Lease) -> F + Send + 'static,
    F: std::future::Future<Output = Result<Response, ApiError>> + Send,
{
    let since = rt.lifecycle.now_ms();
    let mut lease = Box::pin(lease);
    if let Ok(l) = tokio::time::timeout(PATIENCE, &mut lease).await {
        return answer(l?).await;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let (rt2, model) = (rt.clone(), model.to_string());
    let content_type = voice.content_type;
    let forwarded = crate::propagate::current();
    tokio::spawn(crate::propagate::within(forwarded, async move {
        let mut tick = tokio::time::interval(EVERY);
        let lease = loop {
            tokio::select! {
                l = &mut lease => break l,
                _ = tick.tick() => {
                    if tx.send((voice.place)(&rt2.lifecycle.place_words(&model, since, priority))).await.is_err() {
                        return; // the client left; dropping the lease future withdraws the request
                    }
                }
            }
        };
        let answered = match lease {
            Ok(l) => answer(l).await,
            Err(e) => Err(ApiError::from(e)),
        };
        match answered {
            Ok(r) => {
                let mut body = r.into_body().into_data_stream();
                while let Some(Ok(chunk)) = body.next().await {
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send((voice.failure)(&e)).await;
            }
        }
    }));
    let events = futures_util::stream::unfold(rx, |mut rx| async { Some((Ok::<_, Infallible>(rx.recv().await?), rx)) });
    let mut r = crate::sse::response(&rt.lifecycle, events);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    Ok(r)
}
