//! `log-level` and `logs/stream`.

use api_types::{LogLevelRequest, LogLevelResponse};
use axum::extract::State;
use axum::response::Response;
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::logging::{filter_for, LEVELS};
use crate::sse;
use crate::state::AppState;

/// The level the server logs at now.
#[utoipa::path(get, path = "/api/v1/log-level", tag = "System",
    description = "Also under /api/v0, /v0 and /v1. The level last set by `POST log-level` or `--log-level`.",
    responses((status = 200, description = "The level in force", body = LogLevelResponse)))]
pub async fn get_level(State(rt): State<AppState>) -> Json<LogLevelResponse> {
    let level = rt.http.logs.as_ref().map_or_else(|| "info".to_string(), |h| h.level());
    Json(LogLevelResponse { status: "success".into(), level })
}

/// Changes what the server logs, at once.
#[utoipa::path(post, path = "/api/v1/log-level", tag = "System",
    description = "Also under /api/v0, /v0 and /v1. Unlike v9 (which only stores the value), the level takes effect \
        at once, for stderr and `logs/stream`.",
    request_body = LogLevelRequest,
    responses(
        (status = 200, description = "Level set", body = LogLevelResponse),
        (status = 400, description = "Missing or unknown level", body = api_types::ErrorResponse),
    ))]
pub async fn set_level(
    State(rt): State<AppState>,
    body: JsonBody<LogLevelRequest>,
) -> Result<Json<LogLevelResponse>, ApiError> {
    let level = body.value.level.trim().to_ascii_lowercase();
    if filter_for(&level).is_none() {
        return Err(ApiError::bad_request(
            format!("Unknown log level '{}'; use one of: {}", body.value.level, LEVELS.join(", ")),
            Some("level"),
        ));
    }
    if let Some(h) = &rt.http.logs {
        h.set_level(&level).map_err(ApiError::Internal)?;
    }
    tracing::info!(level = %level, "log level changed");
    Ok(Json(LogLevelResponse { status: "success".into(), level }))
}

/// Server-Sent Events of the server log: the last lines kept, then each new line.
#[utoipa::path(get, path = "/api/v1/logs/stream", tag = "System",
    description = "Also under /api/v0, /v0 and /v1. Each log entry is one SSE event (`data: <line>`), first the last \
        2,000 entries kept in memory, then new ones as they are logged. A `: heartbeat` comment is sent after 10 s \
        without a line.",
    responses(
        (status = 200, description = "text/event-stream of log lines"),
        (status = 400, description = "Log streaming is not enabled in this process (embedded use)", body = api_types::ErrorResponse),
    ))]
pub async fn stream(State(rt): State<AppState>) -> Result<Response, ApiError> {
    let Some(h) = &rt.http.logs else {
        return Err(ApiError::bad_request("Log streaming is not enabled in this process", None));
    };
    Ok(sse::response(&rt.lifecycle, h.stream()))
}
