//! The runtime admin API's types (`/v1/admin/…`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A configured model with its live runtime state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminModel {
    pub name: String,
    pub resolved_backend: String,
    pub configured_enabled: bool,
    /// `unloaded`, `loading`, `loaded`, `unloading` or `failed`.
    pub runtime_state: String,
    pub is_loaded: bool,
    pub replicas: u32,
    pub replica_max: u32,
    pub loaded_replicas: u32,
    pub inflight_requests: usize,
    pub queue_depth: usize,
    pub runtime_inflight: usize,
    pub configured_target_inflight: u32,
    pub effective_target_inflight: u32,
    pub last_error: Option<String>,
    /// Never evicted nor unloaded for idleness.
    #[serde(default)]
    pub pinned: bool,
    /// Milliseconds until it is unloaded for idleness if no request comes; null while it is
    /// busy, pinned, not loaded or has no timeout.
    #[serde(default)]
    pub unloads_in_ms: Option<u64>,
    /// Bytes counted against the memory budget while it runs.
    #[serde(default)]
    pub memory_estimate: u64,
    /// Prompts of this model saved in the prompt cache, and their bytes (loaded or not).
    #[serde(default)]
    pub prompt_cache_files: u64,
    #[serde(default)]
    pub prompt_cache_bytes: u64,
    pub vram_estimate_mib: Option<u64>,
    pub vram_estimate_replica_count: u32,
    /// `model_artifact_size` or `unavailable`.
    pub vram_estimate_source: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub load_constraints: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub load_recommendations: Value,
    /// The runtime-only override active on the loaded model.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub load_override: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub capabilities: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub definition: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminModels {
    pub models: Vec<AdminModel>,
    /// Remote providers and their models (recipe `cloud`), with their last probe.
    #[serde(default)]
    pub upstreams: Vec<crate::Upstream>,
}

/// Body of `POST /v1/admin/models/{name}/load` (all optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminLoadRequest {
    /// Context size for this load (≥ 1).
    pub gguf_n_ctx: Option<u64>,
    /// `on`, `off` or `auto`.
    pub gguf_flash_attn: Option<String>,
    /// K cache type (GGML type name); null uses the default (f16).
    pub gguf_type_k: Option<String>,
    /// V cache type (GGML type name); null uses the default (f16).
    pub gguf_type_v: Option<String>,
    /// Only 1 is supported.
    pub replicas: Option<u32>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub other: Map<String, Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub used_mib: u64,
    pub total_mib: u64,
    pub used_over_total: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuModel {
    pub name: String,
    pub runtime_state: String,
    pub is_loaded: bool,
    pub configured_target_inflight: u32,
    pub effective_target_inflight: u32,
    pub vram_estimate_mib: Option<u64>,
    pub vram_estimate_replica_count: u32,
    pub vram_estimate_source: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuMemory {
    pub gpus: Vec<GpuInfo>,
    pub models: Vec<GpuModel>,
    /// Why `gpus` is empty when NVML is unavailable.
    pub error: Option<String>,
}
