//! Lemonade v11's internal endpoints (`/internal/*`, at the root of the port, not under the
//! API prefixes): aliases, configuration, pinning, shutdown, cache clean-up, telemetry. They need the admin key when one is set.

use api_types::*;
use axum::extract::{Path, State};
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Every alias and its target.
#[utoipa::path(get, path = "/internal/aliases", tag = "Lemonade")]
pub async fn aliases(State(rt): State<AppState>) -> Json<AliasList> {
    Json(engine::aliases::list(&rt.engine))
}

/// Creates an alias, or points it at another model.
#[utoipa::path(post, path = "/internal/aliases", tag = "Lemonade", request_body = AliasRequest)]
pub async fn set_alias(
    State(rt): State<AppState>,
    body: JsonBody<AliasRequest>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::set(&rt.engine, &body.value).await?))
}

/// Removes an alias.
#[utoipa::path(
    delete,
    path = "/internal/aliases/{alias}",
    tag = "Lemonade",
    params(("alias" = String, Path, description = "The alias"))
)]
pub async fn delete_alias(
    State(rt): State<AppState>,
    Path(alias): Path<String>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::remove(&rt.engine, &alias).await?))
}

/// The configuration in force.
#[utoipa::path(get, path = "/internal/config", tag = "Lemonade")]
pub async fn config(State(rt): State<AppState>) -> Json<serde_json::Map<String, serde_json::Value>> {
    Json(engine::configure::snapshot(&rt.engine))
}

/// The factory defaults.
#[utoipa::path(get, path = "/internal/config/defaults", tag = "Lemonade")]
pub async fn config_defaults() -> Json<serde_json::Map<String, serde_json::Value>> {
    Json(engine::config::file::defaults())
}

/// Changes the configuration: every key checked first, saved to `config.json`, applied.
#[utoipa::path(
    post,
    path = "/internal/set",
    tag = "Lemonade",
    request_body(content = Object, description = "e.g. {\"ctx_size\": 8192, \"max_loaded_models\": 3, \"log_level\": \"debug\"}")
)]
pub async fn set(
    State(rt): State<AppState>,
    body: JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ConfigSetResponse>, ApiError> {
    let updated = engine::configure::set(&rt.engine, &body.value).await?;
    Ok(Json(ConfigSetResponse { status: "success".into(), updated }))
}

/// Pins or unpins a loaded model (Lemonade v11's form of `POST /pin`).
#[utoipa::path(
    post,
    path = "/internal/pin",
    tag = "Lemonade",
    request_body(content = Object, description = "{\"model\": \"Qwen3-0.6B-GGUF\", \"pinned\": true}")
)]
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
#[utoipa::path(post, path = "/internal/shutdown", tag = "Lemonade")]
pub async fn shutdown(State(rt): State<AppState>) -> Result<Json<StatusResponse>, ApiError> {
    rt.engine.lifecycle().unload(None).await?;
    rt.http.shutdown.notify_one();
    Ok(Json(StatusResponse { status: "shutting down".into(), model_name: None, message: None }))
}

/// Lists, and removes unless a dry run, the orphaned files of the models' repositories.
#[utoipa::path(post, path = "/internal/cleanup-cache", tag = "Lemonade", request_body = CleanupCacheRequest)]
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
#[utoipa::path(post, path = "/internal/telemetry/flush", tag = "Lemonade")]
pub async fn telemetry_flush(State(rt): State<AppState>) -> Result<Json<StatusResponse>, ApiError> {
    let sent = engine::logs::flush_telemetry(&rt.engine).await? == Some(true);
    let status = if sent { "flushed" } else { "disabled" };
    Ok(Json(StatusResponse { status: status.into(), model_name: None, message: None }))
}
