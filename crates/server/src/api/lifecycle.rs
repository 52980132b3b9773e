//! Lemonade's model lifecycle: health, stats, load, unload, and `/live`.

use api_types::*;
use axum::extract::State;
use axum::Json;
use bytes::Bytes;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Server status and loaded models.
#[utoipa::path(get, path = "/api/v1/health", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1.",
    responses((status = 200, description = "Status", body = Health)))]
pub async fn health(State(rt): State<AppState>, headers: http::HeaderMap) -> Json<Health> {
    let logs = rt.http.logs.as_ref();
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
#[utoipa::path(delete, path = "/api/v1/prompt-cache", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Removes every saved prompt of every model (the KV state lemonade \
        saves before it stops a llama-server). Needs the admin key when one is set.",
    responses((status = 200, description = "Emptied", body = PromptCacheCleared)))]
pub async fn clear_prompt_cache(State(rt): State<AppState>) -> Json<PromptCacheCleared> {
    let (files, bytes) = rt.engine.clear_prompt_cache().await;
    Json(PromptCacheCleared { status: "success".into(), files_removed: files, bytes_freed: bytes })
}

/// Telemetry of the last request of the most recently used model.
#[utoipa::path(get, path = "/api/v1/stats", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Input/output tokens, time to first token (s) and decode tokens/s, \
                   from the usage/timings of the last completed request. Before any request has run (or with no model \
                   loaded) every figure is 0, as in Lemonade.",
    responses((status = 200, description = "Telemetry", body = Stats)))]
pub async fn stats(State(rt): State<AppState>) -> Json<Stats> {
    let last = rt.engine.lifecycle().most_recent().map(|m| m.stats());
    Json(last.unwrap_or_default())
}

/// Loads a model (or reloads it with other options; the same options are a no-op).
#[utoipa::path(post, path = "/api/v1/load", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Options take precedence over saved per-model options, which take \
                   precedence over the server's flags. A loaded model with other options is restarted in place (it \
                   never takes a second slot). `save_options` stores the request's options as the model's defaults.",
    request_body = LoadRequest,
    responses(
        (status = 200, description = "Loaded", body = LoadResponse),
        (status = 400, description = "Invalid body or option (e.g. a reserved llama-server flag), or the model is not downloaded", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 409, description = "`slots_pinned`: the slot it needs is held by pinned models (named)", body = ErrorResponse),
        (status = 500, description = "The load failed (`model_load_error`)", body = ErrorResponse),
        (status = 507, description = "`insufficient_memory`: its estimate can never fit the memory budget (figures named)", body = ErrorResponse),
    ))]
pub async fn load(State(rt): State<AppState>, body: JsonBody<LoadRequest>) -> Result<Json<LoadResponse>, ApiError> {
    Ok(Json(engine::loads::load_named(&rt.engine, &body.value).await?))
}

/// Unloads one model (after its in-flight requests finish), or every model.
#[utoipa::path(post, path = "/api/v1/unload", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. An empty body, or one without a name, unloads every model. \
                   New requests for the model are not admitted once the unload starts; requests in flight finish first.",
    request_body(content = UnloadRequest, description = "Optional"),
    responses(
        (status = 200, description = "Unloaded", body = UnloadResponse),
        (status = 400, description = "Malformed body", body = ErrorResponse),
        (status = 404, description = "The named model is not loaded (`model_not_loaded`)", body = ErrorResponse),
    ))]
pub async fn unload(State(rt): State<AppState>, body: Bytes) -> Result<Json<UnloadResponse>, ApiError> {
    let req: UnloadRequest =
        if body.iter().all(u8::is_ascii_whitespace) { UnloadRequest::default() } else { crate::extract::parse(&body)? };
    let name = req.model_name.or(req.model).filter(|n| !n.is_empty());
    rt.engine.lifecycle().unload(name.as_deref()).await?;
    Ok(Json(match name {
        Some(n) => UnloadResponse {
            status: "success".into(),
            message: "Model unloaded successfully".into(),
            model_name: Some(n),
        },
        None => UnloadResponse {
            status: "success".into(),
            message: "All models unloaded successfully".into(),
            model_name: None,
        },
    }))
}

/// Liveness probe; answers as long as the process serves HTTP.
#[utoipa::path(get, path = "/live", tag = "Lemonade", responses((status = 200, description = "Alive", body = Live)))]
pub async fn live() -> Json<Live> {
    Json(Live { status: "ok".into() })
}

/// The liveness probe under the name vLLM, SGLang and llama-server serve it: routers in front
/// of several nodes (vllm-router, the SGLang router) wait for `GET /health` on each.
#[utoipa::path(get, path = "/health", tag = "Lemonade", responses((status = 200, description = "Alive", body = Live)))]
pub async fn root_health() -> Json<Live> {
    live().await
}

/// This node's load as the SGLang router protocol reads it (vllm-router's `power_of_two`).
#[utoipa::path(get, path = "/get_load", tag = "Lemonade", responses((status = 200, description = "Requests running and waiting", body = NodeLoad)))]
pub async fn get_load(State(rt): State<AppState>) -> Json<NodeLoad> {
    let (running, waiting) = rt.engine.lifecycle().node_load();
    Json(NodeLoad { load: running + waiting, running, waiting })
}

/// Pins a loaded model (never evicted nor unloaded for idleness), or unpins it.
#[utoipa::path(post, path = "/api/v1/pin", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. A pinned model keeps its slot against LRU eviction, memory \
                   pressure and the idle timeout; a load that needs a slot only pinned models hold fails at once \
                   with 409 `slots_pinned`. An explicit unload still unloads it (and unpins it).",
    request_body = PinRequest,
    responses(
        (status = 200, description = "Pinned or unpinned", body = PinResponse),
        (status = 400, description = "Malformed body", body = ErrorResponse),
        (status = 404, description = "The model is not loaded (`model_not_loaded`)", body = ErrorResponse),
    ))]
pub async fn pin(State(rt): State<AppState>, body: JsonBody<PinRequest>) -> Result<Json<PinResponse>, ApiError> {
    let req = body.value;
    let pinned = req.pinned.unwrap_or(true);
    rt.engine.catalogue().get(&req.model_name)?;
    rt.engine.lifecycle().pin(&req.model_name, pinned).await?;
    Ok(Json(PinResponse { status: "success".into(), model_name: req.model_name, pinned }))
}

/// The scheduler's settings in force.
#[utoipa::path(get, path = "/api/v1/params", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Slot limits, idle timeout, queue bound, memory budget (and the \
                   memory counted now) and the anti-thrash hold.",
    responses((status = 200, description = "Settings", body = Params)))]
pub async fn params(State(rt): State<AppState>) -> Json<Params> {
    Json(engine::configure::current(rt.engine.lifecycle()))
}

/// Changes the scheduler's settings while it runs, and saves them.
#[utoipa::path(post, path = "/api/v1/params", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Absent fields stay as they are. The change applies at once \
                   (lower limits take effect at the next load: nothing running is stopped) and is saved to \
                   `config.json` in lemonade's cache dir (the same keys as `POST /internal/set`), which \
                   `lemonade serve` reads at start; flags and LEMONADE_* variables given at start take precedence \
                   over the file until the next change.",
    request_body = ParamsUpdate,
    responses(
        (status = 200, description = "The settings now in force", body = Params),
        (status = 400, description = "An invalid value (named)", body = ErrorResponse),
    ))]
pub async fn set_params(State(rt): State<AppState>, body: JsonBody<ParamsUpdate>) -> Result<Json<Params>, ApiError> {
    Ok(Json(engine::configure::update_params(&rt.engine, &body.value).await?))
}
