//! Lemonade v11's omni collections on the wire: `POST /v1/chat/completions` naming a
//! `collection.omni` is answered by the engine's tool loop (`engine::omni::run`, driving the
//! sans-IO `routing::omni::Loop`) as one OpenAI chat completion with the media embedded in its
//! content (a markdown image, an `<audio>` data URI), whole or streamed (each medium as a
//! content delta the moment its tool finishes, then the text, then the finish with the trace).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use registry::Collection;
use routing::omni::{End, Loop, Omni};
use serde_json::{json, Value};
use tokio::sync::mpsc;

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
    let name = c.name.clone();
    if !stream {
        let (l, end) = engine::omni::run(&rt.engine, c, o, body, forwarded, None).await?;
        return Ok(Json(completion(&name, &l, &end)).into_response());
    }
    Ok(streamed(rt, c, o, body, forwarded).await)
}

/// The answer as SSE: the role, each medium as its tool finishes, the text, the finish with
/// the trace, `[DONE]`.
async fn streamed(
    rt: &AppState,
    c: &Collection,
    o: &Omni,
    body: Value,
    forwarded: engine::lease::Forwarded,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let (media_tx, media_rx) = mpsc::channel::<String>(4);
    let (engine, c, o, name) = (rt.engine.clone(), c.clone(), o.clone(), c.name.clone());
    let id = format!("chatcmpl-omni-{}", created());
    let _ = tx.send(chunk(&id, &name, json!({"role": "assistant", "content": ""}), None)).await;
    let relay = tokio::spawn(relay_media(tx.clone(), id.clone(), name.clone(), media_rx));
    tokio::spawn(async move {
        let ran = engine::omni::run(&engine, &c, &o, body, forwarded, Some(media_tx)).await;
        // Every medium is out before the text.
        let _ = relay.await;
        let last = match ran {
            Ok((l, end)) => last_chunks(&id, &name, &l, &end),
            Err(e) => {
                format!("data: {}\n\n", json!({"error": {"message": e.to_string(), "type": "server_error"}})).into()
            }
        };
        let _ = tx.send(last).await;
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let events =
        futures_util::stream::unfold(rx, |mut rx| async { Some((Ok::<_, axum::Error>(rx.recv().await?), rx)) });
    ([(http::header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(events)).into_response()
}

/// Each medium, as a content delta the moment its tool finishes.
async fn relay_media(tx: mpsc::Sender<Bytes>, id: String, name: String, mut media: mpsc::Receiver<String>) {
    while let Some(m) = media.recv().await {
        let _ = tx.send(chunk(&id, &name, json!({"content": format!("{m}\n\n")}), None)).await;
    }
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn chunk(id: &str, model: &str, delta: Value, finish: Option<&str>) -> Bytes {
    let c = json!({"id": id, "object": "chat.completion.chunk", "created": created(), "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n").into()
}

fn completion(model: &str, l: &Loop, end: &End) -> Value {
    let (message, finish) = l.message(end, true);
    json!({"id": format!("chatcmpl-omni-{}", created()), "object": "chat.completion", "created": created(),
           "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "x_lemonade_omni": l.trace()})
}

/// A stream's last events: the text (the media went out as their tools finished), then the
/// finish with the trace.
fn last_chunks(id: &str, model: &str, l: &Loop, end: &End) -> Bytes {
    let (mut message, finish) = l.message(end, false);
    if let Some(o) = message.as_object_mut() {
        o.remove("role");
    }
    let mut out = chunk(id, model, message, None).to_vec();
    let mut done = json!({"id": id, "object": "chat.completion.chunk", "created": created(), "model": model,
                          "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
    done["x_lemonade_omni"] = l.trace();
    out.extend(format!("data: {done}\n\n").into_bytes());
    out.into()
}
