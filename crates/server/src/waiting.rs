//! A streamed request that has to wait (for its model to load, or for a place on it) is
//! answered at once, and until the model takes it SSE comment lines say where it is:
//! `: queued 2` (the 2nd in line for a place on the loaded model) or `: loading 3 s`. Every
//! SSE client ignores comments, so the stream is the one it would have been, with the wait
//! visible. A request granted within [`PATIENCE`] is answered exactly as before, its status
//! included; after that the status is 200, and a failure (the load failed, the queue refused
//! it, the backend refused the request) is a `data: {"error": …}` event and `data: [DONE]`.

use std::convert::Infallible;

use axum::response::Response;
use bytes::Bytes;
use engine::lease::Endpoint;
use engine::Lease;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;

pub use crate::proxy::{EVERY, PATIENCE};

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
pub async fn stream(
    rt: &AppState,
    edge: &Edge,
    model: &str,
    endpoint: Endpoint,
    body: Bytes,
) -> Result<Response, ApiError> {
    let priority = edge.priority_of(&body)?;
    let (rt1, req) = (rt.clone(), edge.request(model, endpoint).priority(priority));
    let lease = async move { rt1.engine.lease(req).await };
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
    let since = rt.engine.lifecycle().now_ms();
    let mut lease = Box::pin(lease);
    if let Ok(l) = tokio::time::timeout(PATIENCE, &mut lease).await {
        return answer(l?).await;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let (rt2, model) = (rt.clone(), model.to_string());
    let content_type = voice.content_type;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        let lease = loop {
            tokio::select! {
                l = &mut lease => break l,
                _ = tick.tick() => {
                    if tx.send((voice.place)(&rt2.engine.lifecycle().place_words(&model, since, priority))).await.is_err() {
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
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async { Some((Ok::<_, Infallible>(rx.recv().await?), rx)) });
    let mut r = crate::sse::response(rt.engine.lifecycle(), events);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    Ok(r)
}
