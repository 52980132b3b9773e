//! `GET system-info` and `GET system-stats`: the machine (sysinfo for OS, CPU and memory; NVML
//! for NVIDIA GPUs; sysfs for AMD GPUs and NPUs) and the state of every recipe's backends.
//!
//! The hardware is detected once per process (it does not change while we run); backend states
//! are computed on every request, so an install or uninstall shows at once.

use std::collections::BTreeMap;

use api_types::{SystemDetails, SystemInfo, SystemStats};
use axum::extract::{Query, State};
use axum::Json;
use backends::releases;
use host::binary;
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
    let info = tokio::task::spawn_blocking(move || system_info_now(&rt, verbose)).await;
    Json(info.unwrap_or_default())
}

fn system_info_now(rt: &AppState, verbose: bool) -> SystemInfo {
    let d = host::hardware::detected();
    SystemInfo {
        os_version: d.os_version.clone(),
        processor: d.processor.clone(),
        physical_memory: d.memory.clone(),
        devices: d.devices.clone(),
        compute_devices: rt.engine.lifecycle().devices().to_vec(),
        recipes: engine::installs::recipes(rt.engine.cfg()),
        details: verbose.then(|| details(rt)),
    }
}

fn details(rt: &AppState) -> SystemDetails {
    let mut backend_binaries = BTreeMap::new();
    for (recipe, list) in releases::recipes() {
        let (dir, exe) = recipe.dir_and_exe();
        for backend in list {
            if let Some(r) = binary::resolve_from_env(&rt.engine.cfg().cache_dir, dir, backend, exe) {
                backend_binaries.insert(format!("{recipe}:{backend}"), r.path.display().to_string());
            }
        }
    }
    let (kernel, host_name, cpu_arch, available_memory_gb) = host::hardware::details();
    SystemDetails {
        lemonade_version: engine::VERSION.into(),
        kernel,
        host_name,
        cpu_arch,
        available_memory_gb,
        cache_dir: rt.engine.cfg().cache_dir.display().to_string(),
        hf_cache: rt.engine.cfg().hf_cache.display().to_string(),
        releases_url: host::install::releases_url(),
        backend_binaries,
        llamacpp_backend: rt.engine.cfg().live.llamacpp_backend(),
    }
}

/// CPU (since the previous call) and memory use.
#[utoipa::path(get, path = "/api/v1/system-stats", tag = "System",
    description = "`cpu_percent` is the use since the previous call (0 on the first). GPU figures are null \
        where no AMD GPU reports them.",
    responses((status = 200, description = "Usage", body = SystemStats)))]
pub async fn system_stats() -> Json<SystemStats> {
    let stats = tokio::task::spawn_blocking(host::hardware::usage).await;
    Json(stats.unwrap_or_else(|e| SystemStats { error: Some(e.to_string()), ..Default::default() }))
}
