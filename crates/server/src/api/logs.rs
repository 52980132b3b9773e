//! `log-level` and `logs/stream`.

use api_types::{LogLevelRequest, LogLevelResponse};
use axum::extract::State;
use axum::response::Response;
use axum::Json;

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket};

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::sse;
use crate::state::AppState;
use host::logging::LogHub;

/// The level the server logs at now.
#[utoipa::path(get, path = "/api/v1/log-level", tag = "System")]
pub async fn get_level(State(rt): State<AppState>) -> Json<LogLevelResponse> {
    Json(LogLevelResponse { status: "success".into(), level: engine::logs::level(&rt.engine) })
}

/// Changes what the server logs, at once.
#[utoipa::path(post, path = "/api/v1/log-level", tag = "System", request_body = LogLevelRequest)]
pub async fn set_level(
    State(rt): State<AppState>,
    body: JsonBody<LogLevelRequest>,
) -> Result<Json<LogLevelResponse>, ApiError> {
    let level = engine::logs::set_level(&rt.engine, &body.value.level)?;
    Ok(Json(LogLevelResponse { status: "success".into(), level }))
}

/// Server-Sent Events of the server log: the last lines kept, then each new line.
#[utoipa::path(get, path = "/api/v1/logs/stream", tag = "System")]
pub async fn stream(State(rt): State<AppState>) -> Result<Response, ApiError> {
    let hub = engine::logs::hub(&rt.engine)?;
    Ok(sse::response(rt.engine.lifecycle(), sse::log_lines(&hub)))
}

/// Lemonade v11's log stream at the root of the port. A WebSocket upgrade gets v11's
/// messages: send `{"type": "logs.subscribe", "after_seq": N|null}`, get one `logs.snapshot`
/// of the kept lines after N, then a `logs.entry` per new line (`error` answers a bad
/// message). A plain GET gets the SSE stream of `/api/v1/logs/stream`.
#[utoipa::path(get, path = "/logs/stream", tag = "System")]
pub async fn ws_stream(State(rt): State<AppState>, req: axum::extract::Request) -> Result<Response, ApiError> {
    use axum::extract::{ws::WebSocketUpgrade, FromRequestParts};
    let hub = engine::logs::hub(&rt.engine)?;
    let (mut parts, _) = req.into_parts();
    Ok(match WebSocketUpgrade::from_request_parts(&mut parts, &rt).await {
        Ok(ws) => ws.on_upgrade(move |socket| serve_ws(hub, socket)),
        Err(_) => sse::response(rt.engine.lifecycle(), sse::log_lines(&hub)),
    })
}

async fn send_json(socket: &mut WebSocket, v: serde_json::Value) -> bool {
    socket.send(Message::Text(v.to_string().into())).await.is_ok()
}

/// Waits (at most a minute) for a valid subscribe message, answering bad ones with `error`.
async fn subscribed(socket: &mut WebSocket) -> Option<Option<u64>> {
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(60), socket.recv()).await.ok()??.ok()?;
        match msg {
            Message::Text(t) => match engine::logs::subscribe_after(&t) {
                Ok(after) => return Some(after),
                Err(why) => {
                    if !send_json(socket, serde_json::json!({"type": "error", "message": why})).await {
                        return None;
                    }
                }
            },
            Message::Close(_) => return None,
            _ => {}
        }
    }
}

async fn serve_ws(hub: Arc<LogHub>, mut socket: WebSocket) {
    let Some(after) = subscribed(&mut socket).await else { return };
    let (entries, mut next, mut rx) = hub.entries_after(after);
    if !send_json(&mut socket, serde_json::json!({"type": "logs.snapshot", "entries": entries})).await {
        return;
    }
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(line) => {
                    let entry = host::logging::entry(next, &line);
                    next += 1;
                    if !send_json(&mut socket, serde_json::json!({"type": "logs.entry", "entry": entry})).await {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => next += n,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            m = socket.recv() => if matches!(m, None | Some(Err(_)) | Some(Ok(Message::Close(_)))) { return },
        }
    }
}
