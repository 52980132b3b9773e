//! The runtime admin API (`/v1/admin/...`, spec: runtime-admin-api): configured models
//! with their live runtime state, synchronous load with backend-specific overrides, graceful
//! unload, and GPU memory through NVML.
//!
//! Runtime states: `unloaded` (known, no backend; inference rejected unless auto-load),
//! `loading` (a backend is starting), `loaded` (serving), `unloading` (no new requests; in-flight
//! ones finish, then the backend stops), `failed` (the last load failed or the backend died;
//! `last_error` says why; loading again is allowed).

use api_types::{AdminLoadRequest, AdminModel, AdminModels, GpuMemory, GpuModel};
use axum::extract::{Path, State};
use axum::Json;
use bytes::Bytes;
use engine::admin;

use crate::error::ApiError;
use crate::state::AppState;

/// Every configured (downloaded) model and every model the runtime has seen, with its state.
#[utoipa::path(get, path = "/v1/admin/models", tag = "Admin")]
pub async fn models(State(rt): State<AppState>) -> Json<AdminModels> {
    Json(AdminModels { models: admin::models(&rt.engine), upstreams: rt.engine.remotes().views() })
}

/// Loads a model and waits until it is loaded (or failed).
#[utoipa::path(
    post,
    path = "/v1/admin/models/{model_name}/load",
    tag = "Admin",
    params(("model_name" = String, Path, description = "Model name")),
    request_body(content = AdminLoadRequest, description = "Optional overrides")
)]
pub async fn load(
    State(rt): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<AdminModel>, ApiError> {
    rt.engine.catalogue().get(&name)?;
    // An empty body is no overrides; a body that fails the schema is a 422.
    let req: AdminLoadRequest = if body.iter().all(u8::is_ascii_whitespace) {
        AdminLoadRequest::default()
    } else {
        crate::extract::parse(&body).map_err(|e| ApiError::Unprocessable(e.to_string()))?
    };
    Ok(Json(admin::load(&rt.engine, &name, &req).await?))
}

/// Unloads a model gracefully: no new requests, in-flight ones finish, then the backend stops.
#[utoipa::path(
    post,
    path = "/v1/admin/models/{model_name}/unload",
    tag = "Admin",
    params(("model_name" = String, Path, description = "Model name"))
)]
pub async fn unload(State(rt): State<AppState>, Path(name): Path<String>) -> Result<Json<AdminModel>, ApiError> {
    Ok(Json(admin::unload(&rt.engine, &name).await?))
}

/// GPU memory (NVML) and per-model VRAM estimates.
#[utoipa::path(get, path = "/v1/admin/gpu-memory", tag = "Admin")]
pub async fn gpu_memory(State(rt): State<AppState>) -> Json<GpuMemory> {
    let (gpus, error) = tokio::task::spawn_blocking(host::hardware::gpu_memory)
        .await
        .unwrap_or_else(|e| (Vec::new(), Some(e.to_string())));
    let Json(AdminModels { models, .. }) = models(State(rt)).await;
    let models = models
        .into_iter()
        .map(|m| GpuModel {
            name: m.name,
            runtime_state: m.runtime_state,
            is_loaded: m.is_loaded,
            configured_target_inflight: m.configured_target_inflight,
            effective_target_inflight: m.effective_target_inflight,
            vram_estimate_mib: m.vram_estimate_mib,
            vram_estimate_replica_count: m.vram_estimate_replica_count,
            vram_estimate_source: m.vram_estimate_source,
        })
        .collect();
    Json(GpuMemory { gpus, models, error })
}
