//! Lemonade's model lifecycle: health, stats, load, unload, and `/live`.

use api_types::*;
use axum::extract::State;
use axum::Json;
use bytes::Bytes;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Server status and loaded models.
#[utoipa::path(get, path = "/api/v1/health", tag = "Lemonade")]
pub async fn health(State(rt): State<AppState>, headers: http::HeaderMap) -> Json<Health> {
    let logs = rt.engine.logs();
    Json(Health {
        log_streaming: LogStreaming { sse: logs.is_some(), websocket: logs.is_some() },
        websocket_port: logs.and_then(|_| host_port(&headers)),
        telemetry: TelemetryState { enabled: logs.is_some_and(|h| h.telemetry_enabled()) },
        ..engine::models::health(&rt.engine)
    })
}

/// The port of the request's `Host` header (where the client reached this server).
fn host_port(headers: &http::HeaderMap) -> Option<u16> {
    let host = headers.get(http::header::HOST)?.to_str().ok()?;
    host.rsplit_once(':').filter(|(h, _)| !h.contains(':') || h.ends_with(']')).and_then(|(_, p)| p.parse().ok())
}

/// Empties the prompt cache.
#[utoipa::path(delete, path = "/api/v1/prompt-cache", tag = "Lemonade")]
pub async fn clear_prompt_cache(State(rt): State<AppState>) -> Json<PromptCacheCleared> {
    let (files, bytes) = rt.engine.clear_prompt_cache().await;
    Json(PromptCacheCleared { status: "success".into(), files_removed: files, bytes_freed: bytes })
}

/// Telemetry of the last request of the most recently used model.
#[utoipa::path(get, path = "/api/v1/stats", tag = "Lemonade")]
pub async fn stats(State(rt): State<AppState>) -> Json<Stats> {
    Json(rt.engine.stats())
}

/// Loads a model (or reloads it with other options; the same options are a no-op).
#[utoipa::path(post, path = "/api/v1/load", tag = "Lemonade", request_body = LoadRequest)]
pub async fn load(State(rt): State<AppState>, body: JsonBody<LoadRequest>) -> Result<Json<LoadResponse>, ApiError> {
    Ok(Json(engine::loads::load_named(&rt.engine, &body.value).await?))
}

/// Unloads one model (after its in-flight requests finish), or every model.
#[utoipa::path(
    post,
    path = "/api/v1/unload",
    tag = "Lemonade",
    request_body(content = UnloadRequest, description = "Optional")
)]
pub async fn unload(State(rt): State<AppState>, body: Bytes) -> Result<Json<UnloadResponse>, ApiError> {
    let req: UnloadRequest =
        if body.iter().all(u8::is_ascii_whitespace) { UnloadRequest::default() } else { crate::extract::parse(&body)? };
    let name = req.model_name.or(req.model).filter(|n| !n.is_empty());
    engine::loads::unload(&rt.engine, name.as_deref()).await?;
    let message = if name.is_some() { "Model unloaded successfully" } else { "All models unloaded successfully" };
    Ok(Json(UnloadResponse { status: "success".into(), message: message.into(), model_name: name }))
}

/// Liveness probe; answers as long as the process serves HTTP.
#[utoipa::path(get, path = "/live", tag = "Lemonade")]
pub async fn live() -> Json<Live> {
    Json(Live { status: "ok".into() })
}

/// The liveness probe under the name vLLM, SGLang and llama-server serve it: routers in front
/// of several nodes (vllm-router, the SGLang router) wait for `GET /health` on each.
#[utoipa::path(get, path = "/health", tag = "Lemonade")]
pub async fn root_health() -> Json<Live> {
    live().await
}

/// This node's load as the SGLang router protocol reads it (vllm-router's `power_of_two`).
#[utoipa::path(get, path = "/get_load", tag = "Lemonade")]
pub async fn get_load(State(rt): State<AppState>) -> Json<NodeLoad> {
    let (running, waiting) = rt.engine.lifecycle().node_load();
    Json(NodeLoad { load: running + waiting, running, waiting })
}

/// Pins a loaded model (never evicted nor unloaded for idleness), or unpins it.
#[utoipa::path(post, path = "/api/v1/pin", tag = "Lemonade", request_body = PinRequest)]
pub async fn pin(State(rt): State<AppState>, body: JsonBody<PinRequest>) -> Result<Json<PinResponse>, ApiError> {
    let req = body.value;
    let pinned = req.pinned.unwrap_or(true);
    rt.engine.catalogue().get(&req.model_name)?;
    rt.engine.lifecycle().pin(&req.model_name, pinned).await?;
    Ok(Json(PinResponse { status: "success".into(), model_name: req.model_name, pinned }))
}

/// The scheduler's settings in force.
#[utoipa::path(get, path = "/api/v1/params", tag = "Lemonade")]
pub async fn params(State(rt): State<AppState>) -> Json<Params> {
    Json(engine::configure::current(rt.engine.lifecycle()))
}

/// Changes the scheduler's settings while it runs, and saves them.
#[utoipa::path(post, path = "/api/v1/params", tag = "Lemonade", request_body = ParamsUpdate)]
pub async fn set_params(State(rt): State<AppState>, body: JsonBody<ParamsUpdate>) -> Result<Json<Params>, ApiError> {
    Ok(Json(engine::configure::update_params(&rt.engine, &body.value).await?))
}
