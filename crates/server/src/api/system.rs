//! `GET system-info` and `GET system-stats` (what they hold is `engine::system`'s), each read
//! off the async threads.

use api_types::{SystemInfo, SystemStats};
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;

use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct SystemInfoQuery {
    /// Add details: versions, paths, the backend binaries in use, free memory.
    #[serde(default)]
    pub verbose: Option<String>,
}

/// Hardware and backend states.
#[utoipa::path(get, path = "/api/v1/system-info", tag = "System", params(SystemInfoQuery),
    description = "`OS Version`, `Processor`, `Physical Memory`, `devices` (cpu, amd_igpu, amd_dgpu, nvidia_dgpu, \
        amd_npu, each with `available`; an absent device has `available: false`) and `recipes` (each backend's \
        `state`: unsupported, installable, update_required or installed, and its `release_url` where the backend \
        has releases). A machine without GPUs answers 200 with empty lists. `compute_devices` lists each GPU and NPU \
        models can be placed on (`gpu0`, `npu0`: the `device` load option's ids), with its memory.",
    responses((status = 200, description = "System information", body = SystemInfo)))]
pub async fn system_info(State(rt): State<AppState>, Query(q): Query<SystemInfoQuery>) -> Json<SystemInfo> {
    let verbose = q.verbose.as_deref().is_some_and(|s| matches!(s, "true" | "1" | "yes"));
    let info = tokio::task::spawn_blocking(move || engine::system::info(&rt.engine, verbose)).await;
    Json(info.unwrap_or_default())
}

/// CPU (since the previous call) and memory use.
#[utoipa::path(get, path = "/api/v1/system-stats", tag = "System",
    description = "`cpu_percent` is the use since the previous call (0 on the first). GPU figures are null \
        where no AMD GPU reports them.",
    responses((status = 200, description = "Usage", body = SystemStats)))]
pub async fn system_stats() -> Json<SystemStats> {
    let stats = tokio::task::spawn_blocking(engine::system::stats).await;
    Json(stats.unwrap_or_else(|e| SystemStats { error: Some(e.to_string()), ..Default::default() }))
}
