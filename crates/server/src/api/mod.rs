//! The HTTP handlers, one module per API area, each with its `#[utoipa::path]` documentation.
//! Handlers are thin: parse, call down (runtime, pulls, installs, proxy, host), answer.

pub mod admin;
pub mod anthropic;
pub mod audio;
pub mod explain;
pub mod images;
pub mod install;
pub mod internal;
pub mod lifecycle;
pub mod logs;
pub mod mcp;
pub mod metrics;
pub mod native;
pub mod ollama;
pub mod omni;
pub mod openai;
pub mod options;
pub mod pull;
pub mod router;
pub mod system;

/// What one of lemonade's own handlers answered, when a route runs another's request (the MCP
/// gateway's tools, an omni model's tools): its bytes and content type, or the message of its
/// error.
pub(crate) async fn own_answer(
    r: Result<axum::response::Response, crate::error::ApiError>,
) -> Result<(bytes::Bytes, String), routing::omni::Failure> {
    use axum::response::IntoResponse;
    let r = r.unwrap_or_else(IntoResponse::into_response);
    let ok = r.status().is_success();
    let mime = r.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await.map_err(|e| e.to_string())?;
    if ok {
        return Ok((bytes, mime));
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    let message = v["error"]["message"].as_str().or(v["error"].as_str()).map(str::to_string);
    Err(routing::omni::Failure(message.unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned())))
}
