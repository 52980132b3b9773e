//! `system-info`, `system-stats`, `install`/`uninstall` and `log-level`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET system-info`: the machine and every recipe's backends (Lemonade v9's keys).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemInfo {
    #[serde(rename = "OS Version")]
    pub os_version: String,
    #[serde(rename = "Processor")]
    pub processor: String,
    #[serde(rename = "Physical Memory")]
    pub physical_memory: String,
    pub devices: Devices,
    /// Each GPU and NPU models can be placed on, with its memory (lemonade's addition).
    #[serde(default)]
    pub compute_devices: Vec<ComputeDevice>,
    /// By recipe name (`llamacpp`, `whispercpp`, `sd-cpp`, `kokoro`, `flm`, `ryzenai-llm`).
    pub recipes: BTreeMap<String, RecipeInfo>,
    /// With `?verbose=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<SystemDetails>,
    /// The remote providers (Lemonade v11's `cloud.providers`).
    #[serde(default)]
    pub cloud: CloudInfo,
}

/// A device the scheduler places models on: a GPU (its memory is a ledger of its own) or an
/// NPU (one model at a time).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ComputeDevice {
    /// How the `device` load option and `/scheduler` name it: `gpu0`, `gpu1`, `npu0`.
    pub id: String,
    /// `gpu` or `npu`.
    pub kind: String,
    /// `nvidia` or `amd`.
    pub vendor: String,
    pub name: String,
    /// An integrated GPU (its memory is its VRAM carve-out plus the GTT it may map).
    pub integrated: bool,
    /// Bytes of memory it has (0 for an NPU, which uses system memory).
    pub total_bytes: u64,
    /// Bytes free when lemonade looked, where the driver says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Its index for CUDA (`CUDA_VISIBLE_DEVICES`), HIP (`HIP_VISIBLE_DEVICES`) and Vulkan
    /// (`GGML_VK_VISIBLE_DEVICES`), where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hip_index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vulkan_index: Option<u32>,
    /// Where it was found: `nvml`, `amdgpu sysfs` or `amdxdna`.
    pub source: String,
}

/// The devices lemonade looks for. A device that is absent has `available: false`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Devices {
    pub cpu: CpuDevice,
    pub amd_igpu: GpuDevice,
    pub amd_dgpu: Vec<GpuDevice>,
    /// Every AMD GPU, integrated (when there is one) then discrete: Lemonade v11's list.
    #[serde(default)]
    pub amd_gpu: Vec<GpuDevice>,
    pub nvidia_dgpu: Vec<GpuDevice>,
    /// Why NVIDIA GPUs could not be listed (no driver), when they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_dgpu_error: Option<String>,
    pub amd_npu: NpuDevice,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CpuDevice {
    pub name: String,
    pub cores: usize,
    pub threads: usize,
    pub available: bool,
    /// `x86_64` or `arm64`.
    pub family: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuDevice {
    pub name: String,
    pub available: bool,
    pub vram_gb: f64,
    /// `gfx1151`, `gfx110X`, … for AMD GPUs; empty when unknown or absent.
    #[serde(default)]
    pub family: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NpuDevice {
    pub name: String,
    pub available: bool,
    /// `XDNA2`, `XDNA`, or empty.
    pub family: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One recipe's backends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecipeInfo {
    pub default_backend: String,
    /// The release page of the default backend's pinned version, where the recipe has releases.
    #[serde(default)]
    pub release_url: String,
    pub backends: BTreeMap<String, BackendInfo>,
}

/// One backend's state on this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackendInfo {
    /// Devices it would run on here (`cpu`, `amd_igpu`, `amd_dgpu`, `amd_npu`, `metal`).
    pub devices: Vec<String>,
    /// `unsupported`, `installable`, `update_required` or `installed`.
    pub state: String,
    pub message: String,
    /// The command that makes it usable, if any.
    pub action: String,
    /// The pinned version.
    pub version: String,
    /// The release page of the pinned version (empty where the backend has no releases).
    pub release_url: String,
    /// The archive an install downloads on this platform (empty if none).
    pub download_filename: String,
    pub can_uninstall: bool,
}

/// `system-info?verbose=true` details.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemDetails {
    pub lemonade_version: String,
    pub kernel: Option<String>,
    pub host_name: Option<String>,
    pub cpu_arch: String,
    pub available_memory_gb: Option<f64>,
    pub cache_dir: String,
    pub hf_cache: String,
    pub releases_url: String,
    /// `recipe:backend` → the executable in use.
    pub backend_binaries: BTreeMap<String, String>,
    pub llamacpp_backend: String,
}

/// `GET system-stats`. GPU figures are null where no GPU reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemStats {
    /// CPU use since the previous call (0 on the first).
    pub cpu_percent: Option<f64>,
    pub memory_gb: Option<f64>,
    pub gpu_percent: Option<f64>,
    pub vram_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Body of `install` and `uninstall`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstallRequest {
    /// Recipe, e.g. `llamacpp`.
    pub recipe: Option<String>,
    /// Backend of the recipe, e.g. `cpu`; for recipe `cloud`, the provider's name.
    pub backend: Option<String>,
    /// Recipe `cloud`: the provider's OpenAI API base (`http://host:8000/v1`). Omitted to change
    /// only the key of a registered provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Recipe `cloud`: its API key, held in memory only (never written to disk); else
    /// `LEMONADE_<NAME>_API_KEY` is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Answer with SSE progress events (`progress`, `complete`, `error`), as `pull` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Lemonade v11's cloud form (`backend: "cloud"`): the provider's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Lemonade v11: allow the key to go over plain `http://` to another machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_http: Option<bool>,
    /// How the provider is reached besides its URL and key (each kept when omitted; a
    /// `max_in_flight` of 0 removes the bound).
    #[serde(flatten)]
    pub reach: crate::Reach,
}

/// Lemonade v11's view of where a cloud provider's key comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuthState {
    /// `LEMONADE_<PROVIDER>_API_KEY` is set (it wins).
    pub env_var_set: bool,
    /// A key is held in memory (never written).
    pub runtime_key_set: bool,
}

/// The answer of Lemonade v11's cloud `POST /v1/install` (`backend: "cloud"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudInstalled {
    pub status: String,
    pub backend: String,
    pub provider: String,
    pub base_url: String,
    pub models_discovered: usize,
    pub auth_state: AuthState,
    /// The first of `warnings`, or null (v11 answers both).
    #[serde(default)]
    pub warning: Option<String>,
    /// What to know about how the provider is reached: plain `http://`, a key sent over it, a
    /// key in the environment that wins over the one given.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// A key may go to it over plain `http://` (the opt-in v11 asks for).
    #[serde(default)]
    pub allow_insecure_http: bool,
}

/// The answer of Lemonade v11's cloud `POST /v1/uninstall`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudUninstalled {
    pub status: String,
    pub backend: String,
    pub provider: String,
    pub models_evicted: usize,
}

/// `POST /v1/cloud/auth` (Lemonade v11).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudAuthRequest {
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub api_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_http: Option<bool>,
}

/// The answer of `POST /v1/cloud/auth` and `DELETE /v1/cloud/auth/{provider}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudAuth {
    pub provider: String,
    pub auth_state: AuthState,
    /// After `POST`: the models the provider lists now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_discovered: Option<usize>,
    /// After `DELETE`: whether a key held in memory was dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_runtime_key: Option<bool>,
    /// After `POST`: the opt-in in force, and what to know about how it is reached (as
    /// [`CloudInstalled`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_http: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Lemonade v11's `cloud` block of `system-info`: every provider, its auth state and what it
/// offers (never a key).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudInfo {
    pub providers: Vec<CloudProviderInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloudProviderInfo {
    pub name: String,
    pub base_url: String,
    /// The environment variable that can hold its key.
    pub env_var: String,
    pub env_var_set: bool,
    pub runtime_key_set: bool,
    pub models_discovered: usize,
    pub allow_insecure_http: bool,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstallResponse {
    pub status: String,
    pub recipe: String,
    pub backend: String,
    /// The version now installed (install only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// What happened, when it is worth saying (an uninstall with nothing to remove).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Recipe `cloud`: the provider after discovery (its key never shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<crate::Upstream>,
}

/// Body of `log-level`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogLevelRequest {
    /// critical, error, warning, info, debug or trace.
    pub level: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogLevelResponse {
    pub status: String,
    pub level: String,
}

/// One log line as Lemonade v11's WebSocket log stream sends it (`ws://…/logs/stream`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogEntry {
    /// Increases by one per line; pass the last one seen as `after_seq` to resume.
    pub seq: u64,
    pub timestamp: String,
    /// `Trace`, `Debug`, `Info`, `Warning` or `Error`.
    pub severity: String,
    /// Where the line comes from (the module that logged it).
    pub tag: String,
    pub line: String,
}
