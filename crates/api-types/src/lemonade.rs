//! Lemonade's own endpoints: models, health, stats, live.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a model does; decides its endpoint family and its slot pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    Llm,
    Embedding,
    Reranking,
    Audio,
    Image,
    Tts,
}

impl ModelType {
    pub const ALL: [ModelType; 6] = [
        ModelType::Llm,
        ModelType::Embedding,
        ModelType::Reranking,
        ModelType::Audio,
        ModelType::Image,
        ModelType::Tts,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ModelType::Llm => "llm",
            ModelType::Embedding => "embedding",
            ModelType::Reranking => "reranking",
            ModelType::Audio => "audio",
            ModelType::Image => "image",
            ModelType::Tts => "tts",
        }
    }
}

/// An entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"id": "SmolLM2-135M-Instruct-GGUF", "object": "model", "created": 1234567890,
    "owned_by": "lemonade", "checkpoint": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1",
    "checkpoints": {"main": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"}, "recipe": "llamacpp",
    "downloaded": true, "suggested": true, "labels": [], "recipe_options": {}, "size": 0.1})))]
pub struct Model {
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Always 1234567890 (as Lemonade v9).
    pub created: u64,
    /// Always `lemonade`.
    pub owned_by: String,
    /// Main checkpoint, `org/repo[:VARIANT]` or an absolute path for extra models.
    pub checkpoint: String,
    /// `main` plus secondary checkpoints such as `mmproj`.
    pub checkpoints: BTreeMap<String, String>,
    /// Backend family: `llamacpp`, `flm`, `ryzenai-llm`, `whispercpp`, `sd-cpp`, `kokoro`.
    pub recipe: String,
    /// Every file of the main checkpoint is present and complete.
    pub downloaded: bool,
    pub suggested: bool,
    pub labels: Vec<String>,
    /// Saved per-model options (`recipe_options.json`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub recipe_options: crate::LoadOptions,
    /// Approximate size in GB; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<f64>,
    /// Model type lemonade serves it as (`llm`, `embedding`, `reranking`, …).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<ModelType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub image_defaults: Option<Value>,
    /// A remote model's provider (recipe `cloud`; see `GET /api/v1/cloud`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The context the model was trained for, in tokens, from its GGUF header (Lemonade v11);
    /// absent when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    /// Whether the Hub has a newer commit of its repository than the one pulled (Lemonade v11);
    /// absent until an update check ran (`POST /models/check-updates`, `serve --check-updates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_available: Option<bool>,
    /// A loaded llama.cpp model's slots (requests it serves at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
    /// A loaded llama.cpp model's context per request, in tokens (a slot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_ctx_size: Option<u32>,
    /// A collection's models (recipe `collection.router` or `collection.omni`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<Vec<String>>,
    /// A `collection.router`'s policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub routing: Option<Value>,
    /// A `collection.omni`'s own system prompt template, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// How a `collection.omni` asks its planner for tool calls: `native` or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_format: Option<String>,
    /// The tools a `collection.omni` offers (OpenAI function definitions from the one tool
    /// table, each with the component that runs it as `component`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub omni_tools: Option<Vec<Value>>,
    /// A collection's schema version (`"1"`), as its file and v11's `/models/{id}` give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The registry its files come from (Lemonade v11): `huggingface` for a model pulled from
    /// the Hub; absent for an imported file, a remote provider's model or a collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_source: Option<String>,
}

/// Lemonade v11's `telemetry` object in health.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TelemetryState {
    pub enabled: bool,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<Model>,
}

/// Query of `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct ModelsQuery {
    /// `true` lists every model of the catalogue, downloaded or not.
    #[serde(default)]
    pub show_all: Option<String>,
}

/// A loaded model as reported by `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoadedModel {
    pub model_name: String,
    /// The id `GET /models` lists the model under (current Lemonade's naming: a registered
    /// model by its bare name), to match a loaded model with its listing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    pub checkpoint: String,
    #[serde(rename = "type")]
    pub model_type: ModelType,
    /// `gpu`, `npu`, `cpu` or `none`.
    pub device: String,
    /// Base URL of the backend process, `http://127.0.0.1:<port>/v1`.
    pub backend_url: String,
    pub recipe: String,
    /// Effective options the model was loaded with.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub recipe_options: crate::LoadOptions,
    /// Milliseconds of a monotonic clock at the model's last use.
    pub last_use: u64,
    /// Never evicted nor unloaded for idleness (`POST /api/v1/pin`, or `load` with `pinned`).
    #[serde(default)]
    pub pinned: bool,
    /// The pool it holds a place in, as v11 names them: `standard/<type>`, the slots
    /// `max_loaded_models` bounds, or `routing_helper/<type>`: a model a router collection's
    /// classifier uses, which takes no slot (asked for directly, it moves back).
    #[serde(default)]
    pub slot_pool: String,
    /// The idle timeout that applies to it, in seconds; absent: it never times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<u64>,
    /// Milliseconds until it is unloaded for idleness if no request comes; absent while it
    /// is busy, pinned or has no timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unloads_in_ms: Option<u64>,
    /// Bytes lemonade counts it for against the memory budget (its estimate).
    #[serde(default)]
    pub memory_estimate: u64,
    /// Bytes counted against the VRAM budget (0 on a CPU backend).
    #[serde(default)]
    pub vram_estimate: u64,
    /// Requests running on it, and waiting for it.
    #[serde(default)]
    pub in_flight: u64,
    #[serde(default)]
    pub queued: u64,
    /// Prompts of this model saved in the prompt cache, and their bytes.
    #[serde(default)]
    pub prompt_cache_files: u64,
    #[serde(default)]
    pub prompt_cache_bytes: u64,
    /// The backend's process id (Lemonade v11); absent for a backend that is not a process
    /// of this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The confinement its process runs under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxStatus>,
    /// Requests are being served (v11).
    #[serde(default)]
    pub is_busy: bool,
    /// A streamed answer has sent its first chunk and not ended (v11).
    #[serde(default)]
    pub is_streaming: bool,
    /// How the backend was started: the program's name and its arguments, this machine's
    /// paths as placeholders (`<hf-cache>`, `<lemonade-cache>`, `<extra-models-dir>`, `~`).
    #[serde(default)]
    pub command: Vec<String>,
    /// The environment lemonade set for it (the devices it may see: `CUDA_VISIBLE_DEVICES`,
    /// `HIP_VISIBLE_DEVICES`, `GGML_VK_VISIBLE_DEVICES`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// llama.cpp: requests served at once (its slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
    /// llama.cpp: the context one request may use, in tokens (a slot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_ctx_size: Option<u32>,
    /// llama.cpp: KV cache cells in all (`slot_ctx_size × parallel` with the `parallel` option;
    /// `slot_ctx_size` when llama-server's slots share one context), as the memory estimate
    /// counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cells: Option<u64>,
    /// The devices it was placed on (`gpu0`, `npu0`), with the bytes of its estimate it holds
    /// on each (absent: none chosen, as on a machine without GPUs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub placed_on: BTreeMap<String, u64>,
}

/// The prompt cache: what it holds, and its bound (`--prompt-cache-size`; 0: off).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PromptCacheUsage {
    pub files: u64,
    pub bytes: u64,
    pub limit: u64,
}

/// Answer of `DELETE /api/v1/prompt-cache`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PromptCacheCleared {
    pub status: String,
    pub files_removed: u64,
    pub bytes_freed: u64,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `ok` while the server answers.
    pub status: String,
    pub version: String,
    /// The most recently used loaded model, or null.
    pub model_loaded: Option<String>,
    /// Loaded models, in load order.
    pub all_models_loaded: Vec<LoadedModel>,
    /// Models on their way in: loading now, or `--preload` models still pulling or queued.
    #[serde(default)]
    pub models_loading: Vec<String>,
    /// Slot limit per model type; -1 means unlimited.
    pub max_models: BTreeMap<String, i64>,
    pub log_streaming: LogStreaming,
    /// The prompt cache on disk (every model together).
    #[serde(default)]
    pub prompt_cache: PromptCacheUsage,
    /// Remote providers (recipe `cloud`): their models take no local slot.
    #[serde(default)]
    pub upstreams: Vec<crate::Upstream>,
    /// Pinned models loaded now, per model type, in the standard slots and in the
    /// routing-helper pool (Lemonade v11).
    #[serde(default)]
    pub pinned_models: BTreeMap<String, i64>,
    #[serde(default)]
    pub pinned_helper_models: BTreeMap<String, i64>,
    /// Where v11's WebSocket log stream (`/logs/stream`) answers: this server's own port, as
    /// the request reached it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_port: Option<u16>,
    /// Lemonade v11: whether an update check has completed since the start (then the models of
    /// `/models` carry `update_available`).
    #[serde(default)]
    pub update_check_done: bool,
    /// Lemonade v11: whether OpenTelemetry spans are exported (`--otlp-endpoint`).
    #[serde(default)]
    pub telemetry: TelemetryState,
    /// How backends are confined (`--sandbox`) and what this kernel cannot enforce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxStatus>,
}

/// The confinement a backend process runs under (Landlock, with `no_new_privs`), or the one
/// lemonade applies to every backend it starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxStatus {
    /// `strict`, `best-effort` or `off`.
    pub mode: String,
    /// The kernel's Landlock ABI version (0: no Landlock).
    pub landlock_abi: u32,
    /// Files: it reads only the system's libraries, its install and its model's files, and
    /// writes only its scratch and slot-save folders.
    pub filesystem: bool,
    /// TCP: it binds only its own port and connects only to its RPC workers.
    pub network: bool,
    /// It cannot signal lemonade or other processes outside its sandbox, nor reach their
    /// abstract UNIX sockets.
    pub scoped: bool,
    /// It cannot gain privileges (setuid programs, file capabilities) through exec.
    pub no_new_privs: bool,
    /// What of the confinement this kernel cannot enforce, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogStreaming {
    pub sse: bool,
    pub websocket: bool,
}

/// `GET /v1/stats`: telemetry of the last completed request of the most recently used model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stats {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Seconds (llama.cpp's prompt processing time).
    pub time_to_first_token: f64,
    pub tokens_per_second: f64,
    /// Always empty (as Lemonade v9).
    pub decode_token_times: Vec<f64>,
    pub prompt_tokens: u64,
    /// Prompt tokens of that request read from the backend's prefix cache (Lemonade v11);
    /// null when the backend did not say.
    #[serde(default)]
    pub cache_tokens: Option<u64>,
    /// The model's prompt tokens read from its prefix cache since it was loaded.
    #[serde(default)]
    pub cache_tokens_total: u64,
    /// `collection.router` decisions since start, and those that changed a conversation's
    /// candidate (Lemonade v11).
    #[serde(default)]
    pub routing_decisions_total: u64,
    #[serde(default)]
    pub routing_switches_total: u64,
}

/// `GET /live`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Live {
    pub status: String,
}

/// `GET /get_load`: the load signal of the SGLang router protocol, which vllm-router's and
/// SGLang's `power_of_two` policies poll on each worker: `load` is `running` plus `waiting`,
/// over every model of this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeLoad {
    pub load: u64,
    /// Requests being served, and requests waiting (for a model to load, or for a slot).
    pub running: u64,
    pub waiting: u64,
}

/// `POST /v1/load`. Each option is three-state, as Lemonade v11's: absent keeps the model's
/// saved value, `null` ignores the saved value for this load (the server's, then the recipe's
/// default applies), a value overrides it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 8192, "save_options": true})))]
pub struct LoadRequest {
    pub model_name: String,
    /// Context size for this load; `-1`: the largest the model was trained for that fits.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>, nullable))]
    pub ctx_size: Option<Option<crate::CtxSize>>,
    /// llama.cpp: requests served at once (1 to 64), each in a slot with its own `ctx_size` of
    /// context; unset: llama-server's 4 slots sharing one `ctx_size`.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, nullable))]
    pub parallel: Option<Option<u32>>,
    /// Where the model runs: `auto`, a device id from system-info's `compute_devices`
    /// (`gpu1`), or several to split it over (`gpu0,gpu1`).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub device: Option<Option<String>>,
    /// FastFlowLM: extra `flm serve` flags from Lemonade v11.7's safe list (`--pmode turbo`).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub flm_args: Option<Option<String>>,
    /// llama.cpp: speculative decoding with this catalogue model as the draft (same
    /// vocabulary; its memory is counted with the model's).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub draft_model: Option<Option<String>>,
    /// Remote models (`<provider>.<id>`) a request goes to, in order, when this model is
    /// saturated: the first with capacity by its `/metrics` (saved with `save_options`).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>, nullable))]
    pub spillover: Option<Option<Vec<String>>>,
    /// Requests this model serves at once (1 to 1024); the rest wait in lemonade's queue.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, nullable))]
    pub max_concurrent: Option<Option<u32>>,
    /// llama.cpp: llama-server's host-memory prompt cache in MiB (`--cache-ram`; 0: off),
    /// counted in the model's memory. Unset: the size of its KV cache.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, nullable))]
    pub cache_ram: Option<Option<u64>>,
    /// The model's priority (-10 to 10): among models waiting to load, a higher one loads first.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i32>, nullable))]
    pub priority: Option<Option<i32>>,
    /// `cpu`, `vulkan`, `rocm`, `metal`, or `system` (the llama-server on PATH).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub llamacpp_backend: Option<Option<String>>,
    /// Extra llama-server arguments; flags lemonade manages are rejected.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub llamacpp_args: Option<Option<String>>,
    /// llama.cpp RPC workers (`host:port` of each `rpc-server`): llama-server spreads the
    /// model's layers over them (`--rpc`). An empty list clears saved ones.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>, nullable))]
    pub rpc_servers: Option<Option<Vec<String>>>,
    /// whisper.cpp's backend (`cpu`, `vulkan`, `npu`).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub whispercpp_backend: Option<Option<String>>,
    /// Extra whisper-server arguments; `-m`, `--model`, `--host` and `--port` are rejected.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub whispercpp_args: Option<Option<String>>,
    /// Merge the model's `*_args` with the server's (default true, as Lemonade v11: the
    /// model's flags win) or replace them (`false`).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<bool>, nullable))]
    pub merge_args: Option<Option<bool>>,
    /// sd.cpp's backend (`cpu`, `rocm`).
    #[serde(
        rename = "sd-cpp_backend",
        default,
        deserialize_with = "crate::nullable",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub sdcpp_backend: Option<Option<String>>,
    /// sd.cpp models: default sampling steps (1 to 150).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, nullable))]
    pub steps: Option<Option<u32>>,
    /// sd.cpp models: default guidance scale (0 to 30).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, nullable))]
    pub cfg_scale: Option<Option<f64>>,
    /// sd.cpp models: default image width in pixels.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, nullable))]
    pub width: Option<Option<u32>>,
    /// sd.cpp models: default image height in pixels.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, nullable))]
    pub height: Option<Option<u32>>,
    /// sd.cpp models: default sampler (`euler`, `euler_a`, `dpm++2m`, …).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub sampling_method: Option<Option<String>>,
    /// sd.cpp models: the flow shift of flow models.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, nullable))]
    pub flow_shift: Option<Option<f64>>,
    /// sd.cpp models: extra sd-server arguments (the flags lemonade sets are refused).
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable))]
    pub sdcpp_args: Option<Option<String>>,
    /// Save these options as the model's saved options in `recipe_options.json`, replacing
    /// what was saved (a `null` keeps the saved value of its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_options: Option<bool>,
    /// Pin it: never evicted nor unloaded for idleness until unpinned or unloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<bool>,
    /// Unload it after this many seconds without a request (0 = never), instead of the
    /// server's `--idle-timeout`. Saved by `save_options`.
    #[serde(default, deserialize_with = "crate::nullable", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, nullable))]
    pub idle_timeout: Option<Option<u64>>,
}

impl LoadRequest {
    /// The request's options: what it sets and what it clears (`null`).
    pub fn patch(&self) -> crate::OptionsPatch {
        use crate::OptionKey as K;
        let mut p = crate::OptionsPatch::default();
        fn one<T: Clone>(p: &mut crate::OptionsPatch, key: K, v: &Option<Option<T>>) -> Option<T> {
            match v {
                Some(None) => {
                    p.cleared.push(key);
                    None
                }
                Some(Some(v)) => Some(v.clone()),
                None => None,
            }
        }
        p.set.ctx_size = one(&mut p, K::CtxSize, &self.ctx_size);
        p.set.parallel = one(&mut p, K::Parallel, &self.parallel);
        p.set.device = one(&mut p, K::Device, &self.device);
        p.set.flm_args = one(&mut p, K::FlmArgs, &self.flm_args);
        p.set.draft_model = one(&mut p, K::DraftModel, &self.draft_model);
        p.set.cache_ram = one(&mut p, K::CacheRam, &self.cache_ram);
        p.set.max_concurrent = one(&mut p, K::MaxConcurrent, &self.max_concurrent);
        p.set.spillover = one(&mut p, K::Spillover, &self.spillover);
        p.set.priority = one(&mut p, K::Priority, &self.priority);
        p.set.llamacpp_backend = one(&mut p, K::LlamacppBackend, &self.llamacpp_backend);
        p.set.llamacpp_args = one(&mut p, K::LlamacppArgs, &self.llamacpp_args);
        p.set.rpc_servers = one(&mut p, K::RpcServers, &self.rpc_servers);
        p.set.whispercpp_backend = one(&mut p, K::WhispercppBackend, &self.whispercpp_backend);
        p.set.whispercpp_args = one(&mut p, K::WhispercppArgs, &self.whispercpp_args);
        p.set.merge_args = one(&mut p, K::MergeArgs, &self.merge_args);
        p.set.sdcpp_backend = one(&mut p, K::SdcppBackend, &self.sdcpp_backend);
        p.set.steps = one(&mut p, K::Steps, &self.steps);
        p.set.cfg_scale = one(&mut p, K::CfgScale, &self.cfg_scale);
        p.set.width = one(&mut p, K::Width, &self.width);
        p.set.height = one(&mut p, K::Height, &self.height);
        p.set.sampling_method = one(&mut p, K::SamplingMethod, &self.sampling_method);
        p.set.flow_shift = one(&mut p, K::FlowShift, &self.flow_shift);
        p.set.sdcpp_args = one(&mut p, K::SdcppArgs, &self.sdcpp_args);
        p.set.idle_timeout = one(&mut p, K::IdleTimeout, &self.idle_timeout);
        p
    }
}

/// `GET`, `POST` and `DELETE /v1/models/{id}/options`: a model's options by layer (Lemonade
/// v11). `effective` and `defaults` are complete `/load` bodies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model_name": "Qwen3-0.6B-GGUF", "recipe": "llamacpp",
    "saved": {"llamacpp_args": "--no-mmap"},
    "effective": {"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 4096, "llamacpp_backend": "cpu", "llamacpp_args": "--no-mmap", "rpc_servers": [], "idle_timeout": 0},
    "defaults": {"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 4096, "llamacpp_backend": "cpu", "llamacpp_args": "", "rpc_servers": [], "idle_timeout": 0},
    "resolved_ctx_size": 4096})))]
pub struct ModelOptions {
    /// The id from the URL.
    pub model_name: String,
    pub recipe: String,
    /// The model's own entry in `recipe_options.json`, as written (`{}` when none).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub saved: Map<String, Value>,
    /// The `/load` body a load now uses: every option the recipe takes, resolved through
    /// request > saved > server configuration > recipe default.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub effective: Map<String, Value>,
    /// What `effective` becomes once `saved` is erased.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub defaults: Map<String, Value>,
    /// The context size a load now would use (`-1` resolved); absent for recipes without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_ctx_size: Option<u32>,
}

/// `POST /api/v1/pin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinRequest {
    pub model_name: String,
    /// `false` unpins. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<bool>,
}

/// Answer of `POST /api/v1/pin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinResponse {
    pub status: String,
    pub model_name: String,
    pub pinned: bool,
}

/// A memory budget: bytes, `"auto"` (free memory at start minus a margin) or `"none"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum MemoryBudget {
    Bytes(u64),
    Word(String),
}

/// Slot limits: one value for every type, or up to three for llm, embedding and reranking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum SlotLimits {
    One(i64),
    Per(Vec<i64>),
}

/// `POST /api/v1/params`: the scheduler settings to change (absent fields stay). They apply at
/// once and are saved to `config.json` in lemonade's cache dir (the keys of `POST
/// /internal/set`), which `serve` reads at start (flags and environment variables given at
/// start take precedence over it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ParamsUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loaded_models: Option<SlotLimits>,
    /// Seconds; 0 = never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<u64>,
    /// Requests that may wait for models, all together; 0 = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<MemoryBudget>,
    /// The same for GPU memory, which models on GPU backends are counted against (`auto`:
    /// free VRAM less a margin; no budget when there is no GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_budget: Option<MemoryBudget>,
    /// How long (ms) a model that serves requests keeps its slot against a load caused by
    /// requests for another model (anti-thrash); 0 = swap at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_hold_ms: Option<u64>,
}

/// `GET /api/v1/params`, and the answer of `POST`: the settings in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Params {
    /// Slot limit per model type; -1 means unlimited.
    pub max_loaded_models: BTreeMap<String, i64>,
    /// Seconds; 0 = never.
    pub idle_timeout: u64,
    /// 0 = unbounded.
    pub max_queue: u64,
    /// Bytes; null = no budget.
    pub memory_budget: Option<u64>,
    /// Bytes counted for the backends alive now.
    pub memory_in_use: u64,
    /// Bytes of VRAM; null = no budget.
    pub vram_budget: Option<u64>,
    pub vram_in_use: u64,
    pub swap_hold_ms: u64,
}

/// Answer of `POST /v1/load`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoadResponse {
    pub status: String,
    pub model_name: String,
    pub checkpoint: String,
    pub recipe: String,
}

/// `POST /v1/unload`: one model, or every model when no name is given (or the body is empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UnloadRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// Accepted as an alias of `model_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Answer of `POST /v1/unload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UnloadResponse {
    pub status: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
}

/// `POST /v1/pull`: download a catalogue model, or register and download a `user.*` model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "user.SmolLM2-GGUF", "checkpoint": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", "recipe": "llamacpp", "stream": true})))]
pub struct PullRequest {
    /// A collection's models (Lemonade v11, with `recipe: "collection.router"`): names of
    /// registered models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>))]
    pub components: Option<Value>,
    /// A `collection.router`'s policy (see `POST /v1/routing/validate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub routing: Option<Value>,
    /// A collection definition's schema version (`"1"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub version: Option<Value>,
    /// A `collection.omni`'s system prompt template (`{tool_list}` and `{tool_guidance}`
    /// required); absent: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub system_prompt: Option<Value>,
    /// How a `collection.omni` asks its planner for tool calls: `native` (OpenAI tools, the
    /// default) or `json` (a reply constrained by a JSON schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub tool_format: Option<Value>,
    /// Inline component definitions (refused: register each component first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub models: Option<Value>,
    /// Model name (`model_name` is accepted too; `model` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// `org/repo[:VARIANT]`; registering needs the `user.` prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// `{main, mmproj?, …}`; `main` is required when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<BTreeMap<String, String>>,
    /// The registry the checkpoint is in (Lemonade v11): `huggingface` (`hf`), the one lemonade
    /// pulls from. A checkpoint URL (`https://huggingface.co/org/repo`) names its own, which
    /// this must agree with. `registry_source` is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reranking: Option<bool>,
    /// Legacy mmproj file name in the main repo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<String>,
    /// An sd.cpp model's image defaults (`steps`, `cfg_scale`, `width`, `height`,
    /// `sampling_method`, `flow_shift`): kept with the registration and, as Lemonade v11 does,
    /// saved as its options under the request's `recipe_options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub image_defaults: Option<Value>,
    /// Answer with SSE `progress` / `complete` / `error` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Do nothing when the model is already downloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_not_upgrade: Option<bool>,
    /// With `stream: true`, `false` makes the download a server-owned job (Lemonade v11): the
    /// answer is the job's snapshot at once, the download outlives the request, and
    /// `GET /v1/downloads` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<bool>,
    /// Options saved for the model as it is registered (`recipe_options.json`), kept to its
    /// recipe's own, e.g. `{"sd-cpp_backend": "cpu"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub recipe_options: Option<Map<String, Value>>,
}

/// An SSE `progress` (or `complete`) event of `POST /v1/pull`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullProgress {
    pub file: String,
    /// 1-based over every file of the pull.
    pub file_index: usize,
    pub total_files: usize,
    /// Of the current file, including a resumed part.
    pub bytes_downloaded: u64,
    pub bytes_total: u64,
    /// Of the current file.
    pub percent: u64,
}

/// `POST /v1/delete`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeleteRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
}

/// Answer of `pull`, `delete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatusResponse {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An entry of `GET /internal/aliases` (Lemonade v11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasEntry {
    pub alias: String,
    /// The model name the alias points at, as it was given.
    pub target: String,
    /// Whether the target is a model here and downloaded.
    pub downloaded: bool,
    /// The target's recipe; absent while the target is not a model here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
    /// A parameter variant's forced fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Map<String, Value>>,
    /// A parameter variant's removed fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip: Option<Vec<String>>,
}

/// `GET /internal/aliases`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasList {
    pub aliases: Vec<AliasEntry>,
}

/// `POST /internal/aliases`: point `alias` at `target` (`model` is accepted for `target`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"alias": "default-llm", "target": "Qwen3-0.6B-GGUF"})))]
pub struct AliasRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A parameter variant (as llama-swap's `setParamsByID`): request fields forced on every
    /// request through the alias (e.g. `{"reasoning_effort": "high"}`). No reload: the alias
    /// shares its target's backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Map<String, Value>>,
    /// Request fields removed from every request through the alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip: Option<Vec<String>>,
}

/// A parameter variant's forced and removed request fields (`alias_params.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasParams {
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strip: Vec<String>,
}

/// The answer of `POST /internal/aliases` (`status: "ok"`) and of `DELETE
/// /internal/aliases/{alias}` (`status: "deleted"`, no `target`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasResponse {
    pub status: String,
    pub alias: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The answer of `POST /internal/set` (Lemonade v11): `status: "success"` and the values set
/// (a `null` that reset a key shows the default it restored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConfigSetResponse {
    pub status: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub updated: Map<String, Value>,
}

/// `POST /v1/models/register` (Lemonade v11): a `user.*` model definition, registered (or
/// updated) without downloading anything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model_name": "user.Phi-4-Mini-GGUF",
    "checkpoint": "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M", "recipe": "llamacpp"})))]
pub struct RegisterRequest {
    /// `user.<name>`.
    #[serde(default)]
    pub model_name: String,
    #[serde(default)]
    pub recipe: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<BTreeMap<String, String>>,
    /// `huggingface` (the only source lemonade pulls from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
}

/// The model part of [`RegisterResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisteredModel {
    pub id: String,
    pub recipe: String,
    pub downloaded: bool,
}

/// The answer of `POST /v1/models/register`: `model_name` is the public id (the bare name
/// when no other source's model of that name outranks it), `canonical_model_name` the
/// `user.*` id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisterResponse {
    pub status: String,
    pub model_name: String,
    pub canonical_model_name: String,
    pub model: RegisteredModel,
}

/// One GGUF variant of a repository (`GET /v1/pull/variants`, Lemonade v11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullVariant {
    /// What to put after `:` in a checkpoint to pull exactly these files.
    pub name: String,
    pub primary_file: String,
    pub files: Vec<String>,
    pub sharded: bool,
    pub size_bytes: u64,
}

/// `GET /v1/pull/variants?checkpoint=org/repo` (Lemonade v11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullVariants {
    pub checkpoint: String,
    pub recipe: String,
    pub suggested_name: String,
    pub suggested_labels: Vec<String>,
    pub mmproj_files: Vec<String>,
    /// At most 5, the most used quantizations first.
    pub variants: Vec<PullVariant>,
}

/// The query of `GET /v1/pull/variants`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct VariantsQuery {
    /// A Hugging Face repository id, `org/repo`, or its URL (`https://huggingface.co/org/repo`).
    pub checkpoint: Option<String>,
    /// The registry (`huggingface`, `hf`); a checkpoint URL's must agree.
    pub source: Option<String>,
}

/// The query of `GET /v1/registry/search` (Lemonade v11).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct SearchQuery {
    /// Search text, at least 3 characters after trimming (`q` is accepted too).
    pub query: Option<String>,
    pub q: Option<String>,
    /// `huggingface` (default; `hf` too). ModelScope is not searched by lemonade.
    pub source: Option<String>,
    /// 1 to 50; default 12.
    pub limit: Option<String>,
    /// Only `gguf`: GGUF repositories only.
    pub format: Option<String>,
}

/// One repository found by `GET /v1/registry/search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResult {
    pub repository_id: String,
    pub display_name: String,
    pub source: String,
    pub repository_type: String,
    pub description: String,
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    pub downloads: u64,
    pub likes: u64,
    /// A hint from the registry's tags; `/v1/pull/variants` checks the files.
    pub has_gguf: bool,
}

/// `GET /v1/registry/search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResults {
    pub source: String,
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Matches the registry reports (may exceed the results returned).
    pub total: u64,
    pub results: Vec<SearchResult>,
}

/// The answer of `POST /v1/models/check-updates` (Lemonade v11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckUpdates {
    pub status: String,
    pub updates_available: usize,
    /// The downloaded models whose repository has a newer commit than the one downloaded.
    pub models: Vec<String>,
}

/// The body of `POST /internal/cleanup-cache` (Lemonade v11).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CleanupCacheRequest {
    /// List what would be removed without removing it. Default `true`, as v11.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// A file `POST /internal/cleanup-cache` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrphanedFile {
    /// Relative to the Hugging Face cache folder (`models--org--repo/blobs/<etag>…`).
    pub path: String,
    pub size: u64,
    /// A model whose files live in that repository's folder.
    pub model: String,
    /// `incomplete` (a partial download nothing will resume) or `unreferenced` (a blob no
    /// snapshot links to).
    #[serde(rename = "type")]
    pub kind: String,
    /// The repository.
    pub belongs_to: String,
}

/// A repository `POST /internal/cleanup-cache` left alone, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkippedRepo {
    pub repo: String,
    pub reason: String,
}

/// The answer of `POST /internal/cleanup-cache` (Lemonade v11's fields, plus `skipped`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CleanupCacheResponse {
    pub orphaned_files: Vec<OrphanedFile>,
    pub total_bytes: u64,
    pub dry_run: bool,
    /// Repositories not looked at: a download into them is running, or a download job that
    /// can be resumed keeps its partial files there.
    #[serde(default)]
    pub skipped: Vec<SkippedRepo>,
}

/// One file of `GET /v1/models/{id}/files` (Lemonade v11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelFile {
    pub name: String,
    /// The absolute path; only with `?include_paths=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `main` (the first shard of a sharded model), `shard` (the others) or `mmproj`.
    pub role: String,
    pub size_bytes: u64,
    pub exists: bool,
}

/// `GET /v1/models/{id}/files`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelFiles {
    pub model_id: String,
    pub files: Vec<ModelFile>,
}

/// The query of `GET /v1/models/{id}/files`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct FilesQuery {
    /// `true`: each file's absolute path too (it may reveal the user name and cache layout).
    pub include_paths: Option<String>,
}

/// A server-owned download job (Lemonade v11's `GET /v1/downloads`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DownloadJob {
    /// `model:<model_name>`.
    pub id: String,
    /// `model`.
    #[serde(rename = "type")]
    pub kind: String,
    pub model_name: String,
    /// The id `GET /models` lists the model under (a registered model by its bare name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_id: String,
    /// `downloading`, `paused`, `cancelled`, `completed` or `error`.
    pub status: String,
    /// Whether its worker is still active.
    pub running: bool,
    /// The file being downloaded, its 1-based index and how many there are.
    pub file: String,
    pub file_index: usize,
    pub total_files: usize,
    /// Bytes of the current file, and its size.
    pub bytes_downloaded: u64,
    pub bytes_total: u64,
    /// Every file's bytes together, when known.
    pub total_download_size: u64,
    /// Bytes of the current file already on disk when this run began (a resume).
    pub bytes_previously_downloaded: u64,
    /// Bytes of the files completed before the current one.
    pub completed_files_bytes: u64,
    pub cumulative_bytes_downloaded: u64,
    /// The same as `cumulative_bytes_downloaded` (v11 keeps both).
    pub overall_bytes_downloaded: u64,
    pub percent: u64,
    pub complete: bool,
    /// Bytes per second over the last run, while it runs.
    #[serde(default)]
    pub rate_bytes_per_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/downloads/control`: `action` is `pause`, `resume`, `cancel` or `remove`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DownloadControl {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub action: String,
}

/// A `collection.router` decision (Lemonade v11's `x_lemonade_route`): the candidate that
/// answered, the rule that matched (`""` when none did and the default was used), the rule's
/// `outputs`, and with a trace each condition evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteDecision {
    /// `"1"`.
    pub version: String,
    pub route_to: String,
    pub matched_rule: String,
    pub default_used: bool,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub outputs: serde_json::Map<String, Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<RouteTraceEntry>,
}

/// One evaluated condition of a [`RouteDecision`]'s trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteTraceEntry {
    /// The condition (`keywords_any`, `regex`, `metadata`, …, or `classifier:<id>`).
    pub condition: String,
    pub result: bool,
    /// A classifier's score for the label tested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// An LLM router's stated reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
}

/// `POST /v1/routing/validate` (Lemonade v11): a policy and, optionally, a sample request's
/// features to decide on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoutingValidateRequest {
    /// A whole `collection.router` definition (`version`, `recipe`, `components`, `routing`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub policy: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_images: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_tools: Option<bool>,
    /// String values only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The answer of `POST /v1/routing/validate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoutingValidateResponse {
    pub decision: RouteDecision,
    /// The policy as evaluated (`routing.router` written out as its classifier and rules).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub normalized_policy: Value,
}

/// `POST /v1/classify` (Lemonade v11): label scores for a text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "Qwen3-0.6B-GGUF", "input": "Verify your account now at http://x.example", "labels": ["phishing", "safe"]})))]
pub struct ClassifyRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text to classify (`text` is accepted too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Only the `k` highest-scoring labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// The labels a chat model scores (lemonade: no encoder classifier backend here, so the
    /// labels are the request's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
}

/// The answer of `POST /v1/classify`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClassifyResponse {
    /// `classification`.
    pub object: String,
    pub model: String,
    /// Each label's score in `[0, 1]`.
    pub labels: BTreeMap<String, f64>,
}

/// One decision of the scheduler, with its reason (`GET /scheduler`, its event stream).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerDecision {
    /// Milliseconds since the server started.
    pub at_ms: u64,
    /// `load`, `evict`, `unload`, `queue`, `reject`, `refuse` or `crash`.
    pub decision: String,
    /// `request`, `explicit`, `reload`, `make_room`, `idle_timeout`, `retry_after_evict_all`,
    /// `loading`, `busy`, `backend_exited`, or a refusal's code (`slots_pinned`,
    /// `insufficient_memory`, `queue_full`, …).
    pub reason: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A memory pool's ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerPool {
    /// `memory` (system RAM) or `vram` (GPU memory, all GPUs together).
    pub pool: String,
    /// None: no budget.
    pub budget_bytes: Option<u64>,
    pub in_use_bytes: u64,
    /// The bytes each model holds in it.
    pub models: BTreeMap<String, u64>,
}

/// One device's ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerDevice {
    /// `gpu0`, `npu0`.
    pub id: String,
    /// `gpu` or `npu`.
    pub kind: String,
    pub name: String,
    /// What models may hold on it (None: no budget; an NPU runs one model at a time).
    pub budget_bytes: Option<u64>,
    pub in_use_bytes: u64,
    /// The bytes each model placed on it holds.
    pub models: BTreeMap<String, u64>,
}

/// A model the scheduler holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerModel {
    pub model_name: String,
    /// `loading`, `loaded`, `unloading`, `failed` or `unloaded`.
    pub state: String,
    pub pinned: bool,
    pub in_flight: usize,
    /// Requests waiting for it (to load, or for a free place).
    pub waiting: usize,
    /// Requests it serves at once (None: no limit).
    pub max_concurrent: Option<u32>,
    /// System memory counted for it: its estimate, or what its process was measured to hold
    /// when that is more.
    pub memory_bytes: u64,
    pub vram_bytes: u64,
    /// Its estimate of system memory (weights, KV cache, buffers, the prompt cache).
    #[serde(default)]
    pub estimate_memory_bytes: u64,
    /// What its process holds (RSS), as last measured (every second while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_memory_bytes: Option<u64>,
    /// What its process holds on NVIDIA GPUs (NVML), as last measured. Past its VRAM estimate,
    /// `vram_bytes` and the devices' ledgers count it instead (spread over its devices in
    /// proportion to their shares).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_vram_bytes: Option<u64>,
    /// Of the estimate, llama-server's host-memory prompt cache (`--cache-ram`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_bytes: Option<u64>,
    /// The confinement its process runs under (while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxStatus>,
    /// The devices it is placed on, with its bytes on each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, u64>,
    /// Seconds until it is unloaded for idleness, if nothing uses it.
    pub unload_in_s: Option<u64>,
    /// Why it stays: `pinned`, `serving`, `idle, unloaded in Ns`, `kept (no idle timeout)`,
    /// or what it is doing.
    pub resident: String,
}

/// `GET /scheduler`: the scheduler's ledgers, models, load queue and latest decisions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerState {
    pub pools: Vec<SchedulerPool>,
    /// A ledger per GPU and NPU: what each model placed on it holds, against its budget.
    #[serde(default)]
    pub devices: Vec<SchedulerDevice>,
    pub models: Vec<SchedulerModel>,
    /// Models waiting to load, in order.
    pub load_queue: Vec<String>,
    /// Loaded models per type (`--max-loaded-models`; -1: no limit).
    pub max_loaded_models: BTreeMap<String, i64>,
    /// The latest decisions, oldest first (at most 256).
    pub decisions: Vec<SchedulerDecision>,
}

/// `POST /scheduler/plan`: what a `/load` with this body would do now; nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulerPlan {
    pub model_name: String,
    /// `loaded` (already, with these options), `load`, `refused`, or `waits` (for models it
    /// must stop to finish their requests, or for a load in progress).
    pub outcome: String,
    /// The models it would stop, in order.
    pub evicts: Vec<String>,
    /// Why it would be refused (`code`, `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub refusal: Option<Value>,
    /// Its estimate with these options.
    pub memory_bytes: u64,
    pub vram_bytes: u64,
    /// The devices it would go on, with its bytes on each (empty: none; it takes no GPU).
    #[serde(default)]
    pub devices: BTreeMap<String, u64>,
    /// One sentence: what would happen.
    pub summary: String,
    pub decisions: Vec<SchedulerDecision>,
}
