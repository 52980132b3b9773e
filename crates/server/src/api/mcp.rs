//! Lemonade v11's MCP gateway: `POST /mcp` (Streamable HTTP, JSON-RPC 2.0, single messages
//! and batches) with `initialize`, `notifications/initialized`, `ping`, `tools/list` and
//! `tools/call`. The protocol is `dialects::mcp`'s, the tools `engine::mcp`'s (each runs as the
//! same request to lemonade would: collections, variants and loading on demand apply); a
//! failing tool answers `isError: true`, never a JSON-RPC error.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use dialects::mcp::{self, Message, RpcError};
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::state::AppState;

/// The MCP gateway.
#[utoipa::path(
    post,
    path = "/mcp",
    tag = "Lemonade",
    request_body(content = Object, description = "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"tools/list\"}")
)]
pub async fn mcp(State(rt): State<AppState>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return rejected(&Value::Null, &RpcError::new(mcp::PARSE_ERROR, format!("Parse error: {e}"))),
    };
    let answers: Vec<Value> = match &v {
        Value::Array(batch) if batch.is_empty() => {
            return rejected(&Value::Null, &RpcError::new(mcp::INVALID_REQUEST, "an empty batch"));
        }
        Value::Array(batch) => {
            let mut out = Vec::new();
            for m in batch {
                out.extend(one(&rt, m).await);
            }
            out
        }
        single => match mcp::parse(single) {
            Err((id, e)) => return rejected(&id, &e),
            _ => one(&rt, single).await.into_iter().collect(),
        },
    };
    match (v.is_array(), answers.len()) {
        (_, 0) => StatusCode::ACCEPTED.into_response(),
        (false, _) => Json(answers.into_iter().next().unwrap_or(Value::Null)).into_response(),
        (true, _) => Json(Value::Array(answers)).into_response(),
    }
}

/// A message that is not JSON-RPC (or not JSON): 400 with the JSON-RPC error.
fn rejected(id: &Value, e: &RpcError) -> Response {
    (StatusCode::BAD_REQUEST, Json(mcp::error(id, e))).into_response()
}

/// The answer to one message (none for a notification).
async fn one(rt: &AppState, m: &Value) -> Option<Value> {
    let (id, method, params) = match mcp::parse(m) {
        Err((id, e)) => return Some(mcp::error(&id, &e)),
        Ok(Message::Notification { .. }) => return None,
        Ok(Message::Request { id, method, params }) => (id, method, params),
    };
    let result = match method.as_str() {
        "initialize" => Ok(mcp::initialize(&params, engine::VERSION)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": mcp::tools()})),
        "tools/call" => call(rt, &params).await,
        other => Err(RpcError::new(mcp::METHOD_NOT_FOUND, format!("Method not found: {other}"))),
    };
    Some(match result {
        Ok(r) => mcp::result(&id, r),
        Err(e) => mcp::error(&id, &e),
    })
}

/// `tools/call`: an unknown tool or malformed params is a JSON-RPC error; a tool that fails is
/// an `isError` result (the engine's `mcp` runs the tools).
async fn call(rt: &AppState, params: &Value) -> Result<Value, RpcError> {
    let name = params["name"].as_str().ok_or_else(|| RpcError::new(mcp::INVALID_PARAMS, "'name' is required"))?;
    let args = match &params["arguments"] {
        Value::Null => Map::new(),
        Value::Object(o) => o.clone(),
        _ => return Err(RpcError::new(mcp::INVALID_PARAMS, "'arguments' must be an object")),
    };
    let limit = rt.http.body_limit as u64;
    engine::mcp::tool(&rt.engine, name, &args, limit)
        .await
        .ok_or_else(|| RpcError::new(mcp::INVALID_PARAMS, format!("Unknown tool: {name}")))
}
