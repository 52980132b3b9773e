//! A streamed request that has to wait (for its model to load, or for a place on it) is
//! answered at once, and until the model takes it SSE comment lines say where it is:
//! `: queued 2` (the 2nd in line for a place on the loaded model) or `: loading 3 s`. Every
//! SSE client ignores comments, so the stream is the one it would have been, with the wait
//! visible. A request granted within [`PATIENCE`] is answered exactly as before, its status
//! included; after that the status is 200, and a failure (the load failed, the queue refused
//! it, the backend refused the request) is a `data: {"error": …}` event and `data: [DONE]`.

use std::convert::Infallible;
use std::time::Duration;

use api_types::ModelType;
use axum::response::Response;
use bytes::Bytes;
use engine::pulls;
use futures_util::StreamExt;
use scheduler::State;
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

/// Reads `X-Lemonade-Priority` (an integer in [`pulls::PRIORITIES`]) for the handler; a bad
/// value is a 400 naming the header.
pub async fn priority_header(req: axum::extract::Request, next: axum::middleware::Next) -> Result<Response, ApiError> {
    let Some(v) = req.headers().get(PRIORITY_HEADER) else { return Ok(next.run(req).await) };
    let p = v.to_str().ok().and_then(|s| s.trim().parse::<i32>().ok()).filter(|n| pulls::PRIORITIES.contains(n));
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

/// A request's `priority` (lemonade's; an integer in [`pulls::PRIORITIES`]): its body's, else
/// its `X-Lemonade-Priority` header's, else 0. The body is read only when it names one.
pub fn priority_of(body: &[u8]) -> Result<i32, ApiError> {
    if memchr::memmem::find(body, b"\"priority\"").is_none() {
        return Ok(HEADER_PRIORITY.try_with(|p| *p).unwrap_or(0));
    }
    #[derive(serde::Deserialize)]
    struct P {
        priority: Option<serde_json::Value>,
    }
    let p: P = serde_json::from_slice(body)?;
    match p.priority {
        None | Some(serde_json::Value::Null) => Ok(HEADER_PRIORITY.try_with(|p| *p).unwrap_or(0)),
        Some(v) => {
            v.as_i64().and_then(|n| i32::try_from(n).ok()).filter(|n| pulls::PRIORITIES.contains(n)).ok_or_else(|| {
                ApiError::bad_request(
                    format!("'priority' must be a whole number from -10 to 10 (higher is served first), got {v}"),
                    Some("priority"),
                )
            })
        }
    }
}

/// Forwards a streamed request to `model` once it is granted, saying meanwhile where it is.
pub async fn stream(
    rt: &AppState,
    model: &str,
    want: &'static [ModelType],
    endpoint: &'static str,
    path: &str,
    body: Bytes,
) -> Result<Response, ApiError> {
    let priority = priority_of(&body)?;
    let since = rt.lifecycle.now_ms();
    let (rt1, model1) = (rt.clone(), model.to_string());
    let mut lease = Box::pin(async move { pulls::lease_at(&rt1, &model1, want, endpoint, priority).await });
    if let Ok(l) = tokio::time::timeout(PATIENCE, &mut lease).await {
        return proxy::forward_stream(l?, path, body).await;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let (rt2, model, path) = (rt.clone(), model.to_string(), path.to_string());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        let lease = loop {
            tokio::select! {
                l = &mut lease => break l,
                _ = tick.tick() => {
                    if tx.send(place(&rt2, &model, since, priority)).await.is_err() {
                        return; // the client left; dropping the lease future withdraws the request
                    }
                }
            }
        };
        let answer = match lease {
            Ok(l) => proxy::forward_stream(l, &path, body).await,
            Err(e) => Err(ApiError::from(e)),
        };
        match answer {
            Ok(r) => {
                let mut body = r.into_body().into_data_stream();
                while let Some(Ok(chunk)) = body.next().await {
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let event = serde_json::json!({"error": e.body().error});
                let _ = tx.send(Bytes::from(format!("data: {event}\n\ndata: [DONE]\n\n"))).await;
            }
        }
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async { Some((Ok::<_, Infallible>(rx.recv().await?), rx)) });
    Ok(crate::sse::response(&rt.lifecycle, events))
}

/// The comment saying where a request that started waiting at `since` is.
fn place(rt: &AppState, model: &str, since: u64, priority: i32) -> Bytes {
    let waited = rt.lifecycle.now_ms().saturating_sub(since) / 1000;
    Bytes::from(match rt.lifecycle.place(model, since, priority) {
        (Some(State::Loaded), n) if n > 0 => format!(": queued {n}\n\n"),
        (Some(State::Loaded), _) => ": starting\n\n".to_string(),
        (Some(State::Unloading), _) => format!(": waiting for {model} to restart, {waited} s\n\n"),
        _ => format!(": loading {waited} s\n\n"),
    })
}
