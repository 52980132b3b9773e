//! Lemonade v11's internal endpoints (`/internal/*`, at the root of the port, not under the
//! API prefixes): aliases, configuration, pinning, shutdown, cache clean-up, telemetry. They need the admin key when one is set.

use api_types::*;
use axum::extract::{Path, State};
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Every alias and its target.
#[utoipa::path(get, path = "/internal/aliases", tag = "Lemonade",
    description = "Lemonade v11. Each alias (`aliases.json` in lemonade's cache dir) with its target and, when the \
        target is a model here, whether it is downloaded and its recipe. Needs the admin key when one is set.",
    responses((status = 200, description = "The aliases", body = AliasList)))]
pub async fn aliases(State(rt): State<AppState>) -> Json<AliasList> {
    Json(engine::aliases::list(&rt.engine))
}

/// Creates an alias, or points it at another model.
#[utoipa::path(post, path = "/internal/aliases", tag = "Lemonade",
    description = "Lemonade v11. An alias works wherever a model name does (every dialect, `/load`, `/pin`, the \
        options API) and is listed in `/v1/models` under its own id while its target is. A model's own name always \
        wins over an alias, so an alias may not take one; the target need not exist yet. Needs the admin key when \
        one is set. With `params` (request fields forced through the alias) or `strip` (fields removed), the alias is \
        a parameter variant, as llama-swap's `setParamsByID`: it shares its target's backend, no reload; the fields \
        that say what is asked of which model (`model`, `messages`, `prompt`, `input`, `stream`, `route_trace`) are \
        refused. Kept in `alias_params.json`.",
    request_body = AliasRequest,
    responses(
        (status = 200, description = "Set", body = AliasResponse),
        (status = 400, description = "A missing or invalid `alias` or `target`, a reserved prefix, or the name of a model (`alias_conflict`)", body = ErrorResponse),
    ))]
pub async fn set_alias(
    State(rt): State<AppState>,
    body: JsonBody<AliasRequest>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::set(&rt.engine, &body.value).await?))
}

/// Removes an alias.
#[utoipa::path(delete, path = "/internal/aliases/{alias}", tag = "Lemonade",
    description = "Lemonade v11. Needs the admin key when one is set.",
    params(("alias" = String, Path, description = "The alias")),
    responses(
        (status = 200, description = "Removed", body = AliasResponse),
        (status = 404, description = "No such alias (`not_found`)", body = ErrorResponse),
    ))]
pub async fn delete_alias(
    State(rt): State<AppState>,
    Path(alias): Path<String>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::remove(&rt.engine, &alias).await?))
}

/// The configuration in force.
#[utoipa::path(get, path = "/internal/config", tag = "Lemonade",
    description = "Lemonade v11. Every key of `config.json` with the value in force now: the defaults, under \
        `config.json`, under the flags and `LEMONADE_*` variables this run was started with, under every \
        `POST /internal/set` since; Lemonade v11.7's nested sections (`llamacpp`, `sdcpp`, `whispercpp`) and \
        `global_timeout` are listed beside the flat keys. Needs the admin key when one is set.",
    responses((status = 200, description = "Every key, and the v11.7 sections", body = Object)))]
pub async fn config(State(rt): State<AppState>) -> Json<serde_json::Map<String, serde_json::Value>> {
    let mut m = engine::configure::snapshot(&rt.engine);
    let level = rt.http.logs.as_ref().map_or_else(|| "info".to_string(), |h| h.level());
    m.insert("log_level".into(), level.into());
    Json(m)
}

/// The factory defaults.
#[utoipa::path(get, path = "/internal/config/defaults", tag = "Lemonade",
    description = "Lemonade v11. What a fresh `config.json` means, independent of this instance. Needs the admin key \
        when one is set.",
    responses((status = 200, description = "Flat object of every key", body = Object)))]
pub async fn config_defaults() -> Json<serde_json::Map<String, serde_json::Value>> {
    Json(engine::config::file::defaults())
}

/// Changes the configuration: every key checked first, saved to `config.json`, applied.
#[utoipa::path(post, path = "/internal/set", tag = "Lemonade",
    description = "Lemonade v11. A flat object of keys to change (see `GET /internal/config`); `null` resets a key to \
        its default. All keys are checked before any applies: a 400 names the first unknown key or bad value and \
        nothing changes. `config.json` is written atomically (keys this build does not know are kept). At once: \
        `log_level`, `extra_models_dir` (rescanned before the answer), the timeouts, the scheduler's settings; at the \
        next load: the load options (`ctx_size`, `llamacpp_backend`, `llamacpp_args`, `sdcpp_backend`, \
        `whispercpp_backend`, `whispercpp_args`, `steps`, `cfg_scale`, `width`, `height`). Lemonade v11.7's nested sections are taken as \
        these keys (`{\"llamacpp\": {\"backend\": \"vulkan\"}}` or `\"llamacpp.backend\"`; `\"auto\"` is the default), and \
        `global_timeout` sets `load_timeout` and `remote_timeout`. Needs the admin key when one is set.",
    request_body(content = Object, description = "e.g. {\"ctx_size\": 8192, \"max_loaded_models\": 3, \"log_level\": \"debug\"}"),
    responses(
        (status = 200, description = "Applied", body = ConfigSetResponse),
        (status = 400, description = "Unknown key or bad value (`param` names it); nothing changed", body = ErrorResponse),
    ))]
pub async fn set(
    State(rt): State<AppState>,
    body: JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ConfigSetResponse>, ApiError> {
    let updated = engine::configure::set(&rt.engine, &body.value).await?;
    if let (Some(h), Some(_)) = (&rt.http.logs, updated.get("log_level")) {
        h.set_level(engine::config::file::log_level(&updated)).map_err(|e| ApiError::Internal(e.to_string()))?;
    }
    Ok(Json(ConfigSetResponse { status: "success".into(), updated }))
}

/// Pins or unpins a loaded model (Lemonade v11's form of `POST /pin`).
#[utoipa::path(post, path = "/internal/pin", tag = "Lemonade",
    description = "Lemonade v11. `model` (or `model_name`) and `pinned` (a boolean) are required. Needs the admin key \
        when one is set.",
    request_body(content = Object, description = "{\"model\": \"Qwen3-0.6B-GGUF\", \"pinned\": true}"),
    responses(
        (status = 200, description = "Pinned or unpinned", body = PinResponse),
        (status = 400, description = "A missing model or a `pinned` that is not a boolean", body = ErrorResponse),
        (status = 404, description = "The model is not loaded (`model_not_loaded`) or unknown", body = ErrorResponse),
    ))]
pub async fn pin(
    State(rt): State<AppState>,
    body: JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<PinResponse>, ApiError> {
    let b = &body.value;
    let model = b.get("model").or_else(|| b.get("model_name")).and_then(|m| m.as_str()).filter(|m| !m.is_empty());
    let model =
        model.ok_or_else(|| ApiError::bad_request("Parameter 'model' or 'model_name' is required", Some("model")))?;
    let pinned = b.get("pinned").and_then(|p| p.as_bool());
    let pinned = pinned
        .ok_or_else(|| ApiError::bad_request("Parameter 'pinned' is required and must be a boolean", Some("pinned")))?;
    rt.engine.catalogue().get(model)?;
    rt.engine.lifecycle().pin(model, pinned).await?;
    Ok(Json(PinResponse { status: "success".into(), model_name: model.into(), pinned }))
}

/// Unloads every model, answers, then stops the server as SIGTERM does.
#[utoipa::path(post, path = "/internal/shutdown", tag = "Lemonade",
    description = "Lemonade v11. Every model is unloaded (its backend stopped) before the answer; then the server stops \
        accepting connections, lets the open ones finish and exits. Needs the admin key when one is set.",
    responses((status = 200, description = "`{\"status\": \"shutting down\"}`", body = StatusResponse)))]
pub async fn shutdown(State(rt): State<AppState>) -> Result<Json<StatusResponse>, ApiError> {
    rt.engine.lifecycle().unload(None).await?;
    rt.http.shutdown.notify_one();
    Ok(Json(StatusResponse { status: "shutting down".into(), model_name: None, message: None }))
}

/// Lists, and removes unless a dry run, the orphaned files of the models' repositories.
#[utoipa::path(post, path = "/internal/cleanup-cache", tag = "Lemonade",
    description = "Lemonade v11. Looks in the Hugging Face cache folders of the repositories lemonade's models use \
        (never another tool's) for partial downloads nothing will resume (`blobs/*.incomplete`) and blobs no snapshot \
        links to. `dry_run` (default `true`, as v11) lists them; `false` removes them. A repository with a download \
        running, or a listed download job that may be resumed, is skipped and named in `skipped`. Paths are relative \
        to the cache folder. Needs the admin key when one is set.",
    request_body = CleanupCacheRequest,
    responses(
        (status = 200, description = "What was found (and removed unless a dry run)", body = CleanupCacheResponse),
        (status = 400, description = "A body that is not `{\"dry_run\": <bool>}`", body = ErrorResponse),
    ))]
pub async fn cleanup_cache(
    State(rt): State<AppState>,
    body: JsonBody<CleanupCacheRequest>,
) -> Result<Json<CleanupCacheResponse>, ApiError> {
    let dry_run = body.value.dry_run.unwrap_or(true);
    let found = tokio::task::spawn_blocking(move || engine::cleanup::cleanup(&rt.engine, dry_run))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Json(found))
}

/// Exports every finished span now.
#[utoipa::path(post, path = "/internal/telemetry/flush", tag = "Lemonade",
    description = "Lemonade v11. With `--otlp-endpoint` (`LEMONADE_OTLP_ENDPOINT`), sends the OpenTelemetry spans \
        (requests, loads, pulls) not sent yet and answers once they are; without it there is nothing to send. Needs \
        the admin key when one is set.",
    responses((status = 200, description = "`{\"status\": \"flushed\"}`, or `\"disabled\"` without an exporter", body = StatusResponse)))]
pub async fn telemetry_flush(State(rt): State<AppState>) -> Result<Json<StatusResponse>, ApiError> {
    let Some(hub) = rt.http.logs.clone() else {
        return Ok(Json(StatusResponse { status: "disabled".into(), model_name: None, message: None }));
    };
    let sent = tokio::task::spawn_blocking(move || hub.flush_telemetry())
        .await
        .map_err(|e| ApiError::Internal(format!("telemetry flush failed: {e}")))?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let status = if sent { "flushed" } else { "disabled" };
    Ok(Json(StatusResponse { status: status.into(), model_name: None, message: None }))
}
