//! Lemonade v11's omni collections on the wire: `POST /v1/chat/completions` naming a
//! `collection.omni` is answered by the engine's tool loop (`engine::omni::run`, driving the
//! sans-IO `routing::omni::Loop`) as one OpenAI chat completion with the media embedded in its
//! content (a markdown image, an `<audio>` data URI), whole or streamed (each medium as a
//! content delta the moment its tool finishes, then the text, then the finish with the trace).

use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use registry::Collection;
use routing::omni::Omni;
use serde_json::Value;

use crate::error::ApiError;
use crate::state::AppState;

/// Answers a chat completion to omni collection `c`.
pub async fn answer(
    rt: &AppState,
    edge: &crate::propagate::Edge,
    c: &Collection,
    o: &Omni,
    body: Bytes,
    stream: bool,
) -> Result<Response, ApiError> {
    let body: Value = serde_json::from_slice(&body)?;
    let forwarded = edge.forwarded.clone();
    if !stream {
        return Ok(Json(engine::omni::answer(&rt.engine, c, o, body, forwarded).await?).into_response());
    }
    let events = engine::omni::stream(&rt.engine, c, o, body, forwarded);
    let events = futures_util::stream::unfold(events, |mut rx| async {
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(rx.recv().await?)), rx))
    });
    Ok(crate::sse::response(rt.engine.lifecycle(), events))
}
