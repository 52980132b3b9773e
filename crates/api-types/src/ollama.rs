//! The Ollama API (`/api/chat`, `/api/generate`, `/api/tags`, …) as lemonade serves it at the
//! root of its port. Request types keep unknown fields out (Ollama ignores them too); every
//! field is optional so that a missing one gets Ollama's own message (`model is required`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Ollama's error body: `{"error": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaError {
    pub error: String,
}

/// `options` of chat, generate and embed: `num_ctx`, `num_predict`, `temperature`, `top_k`,
/// `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`, `repeat_last_n`, `presence_penalty`,
/// `frequency_penalty`, `typical_p`, `num_keep`, … (others are ignored).
pub type OllamaOptions = Map<String, Value>;

/// A tool call as Ollama writes it: the arguments are an object, not a JSON string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaToolCall {
    pub function: OllamaFunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaFunctionCall {
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub arguments: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaMessage {
    /// `system`, `user`, `assistant` or `tool` (default `user`).
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
    /// Base64 images (vision models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<OllamaToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The tool a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "messages": [{"role": "user", "content": "Hello"}], "stream": false})))]
pub struct OllamaChatRequest {
    /// Lemonade: with a router collection, add its decision (`x_lemonade_route`) to the answer
    /// (to the first NDJSON line when streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_trace: Option<bool>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<OllamaMessage>>,
    /// OpenAI-style function tools.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub tools: Option<Vec<Value>>,
    /// `"json"` or a JSON schema: structured output.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub format: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub options: Option<OllamaOptions>,
    /// Default true.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `0` unloads the model after the answer; a duration (`"10m"`, `300` seconds) sets its
    /// idle timeout; a negative value keeps it loaded until it is unloaded.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub keep_alive: Option<Value>,
    /// Thinking on or off (`true`/`false`, or `"low"`/`"medium"`/`"high"` = on).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub think: Option<Value>,
}

/// `POST /api/generate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "prompt": "Why is the sky blue?", "stream": false})))]
pub struct OllamaGenerateRequest {
    /// Lemonade: with a router collection, add its decision (`x_lemonade_route`) to the answer
    /// (to the first NDJSON line when streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_trace: Option<bool>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    /// A system prompt (the chat template applies it unless `raw`).
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub images: Option<Vec<String>>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub format: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub options: Option<OllamaOptions>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// The prompt is sent as it is, without the chat template.
    #[serde(default)]
    pub raw: Option<bool>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub keep_alive: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub think: Option<Value>,
}

/// `POST /api/embed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "all-MiniLM-L6-v2-GGUF", "input": ["hello", "world"]})))]
pub struct OllamaEmbedRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string or an array of strings.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub input: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub keep_alive: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub options: Option<OllamaOptions>,
}

/// `POST /api/embeddings` (the older single-prompt form).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "all-MiniLM-L6-v2-GGUF", "prompt": "hello"})))]
pub struct OllamaEmbeddingsRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub keep_alive: Option<Value>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub options: Option<OllamaOptions>,
}

/// `POST /api/show`, `/api/pull`, `DELETE /api/delete`: a model by `model` (or `name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF"})))]
pub struct OllamaModelRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// `/api/pull` only: NDJSON progress (default true).
    #[serde(default)]
    pub stream: Option<bool>,
}

/// `GET /api/version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaVersion {
    pub version: String,
}

/// `details` of tags, show and ps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaDetails {
    pub parent_model: String,
    pub format: String,
    pub family: String,
    pub families: Vec<String>,
    pub parameter_size: String,
    pub quantization_level: String,
}

/// One model of `GET /api/tags`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaModel {
    pub name: String,
    pub model: String,
    pub modified_at: String,
    pub size: u64,
    pub digest: String,
    pub details: OllamaDetails,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaTags {
    pub models: Vec<OllamaModel>,
}

/// One loaded model of `GET /api/ps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaRunning {
    pub name: String,
    pub model: String,
    /// Bytes lemonade counts it for (system memory and VRAM).
    pub size: u64,
    pub digest: String,
    pub details: OllamaDetails,
    /// When it unloads for idleness if nothing uses it; far in the future when it never does.
    pub expires_at: String,
    pub size_vram: u64,
    pub context_length: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaPs {
    pub models: Vec<OllamaRunning>,
}

/// `POST /api/show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaShow {
    pub modelfile: String,
    pub parameters: String,
    pub template: String,
    pub details: OllamaDetails,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub model_info: Value,
    /// `completion`, `embedding`, `vision`, `tools`, `thinking`, as they apply.
    pub capabilities: Vec<String>,
    pub modified_at: String,
}

/// A non-streaming `/api/chat` answer, and each NDJSON line of a streaming one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaChatResponse {
    pub model: String,
    pub created_at: String,
    pub message: OllamaMessage,
    pub done: bool,
    /// `stop`, `length` or `unload` (on the last line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    #[serde(flatten)]
    pub metrics: OllamaMetrics,
}

/// A non-streaming `/api/generate` answer, and each NDJSON line of a streaming one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaGenerateResponse {
    pub model: String,
    pub created_at: String,
    pub response: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<i64>>,
    #[serde(flatten)]
    pub metrics: OllamaMetrics,
}

/// Counts and durations (nanoseconds) of the last line, from llama-server's timings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaMetrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_duration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_duration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_eval_count: Option<u64>,
    /// The part of `prompt_eval_count` read from the prompt cache (Ollama's
    /// `prompt_eval_cached_count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_eval_cached_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_eval_duration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_duration: Option<u64>,
}

/// `POST /api/embed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaEmbedResponse {
    pub model: String,
    pub embeddings: Vec<Vec<f32>>,
    #[serde(flatten)]
    pub metrics: OllamaMetrics,
}

/// `POST /api/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaEmbeddingsResponse {
    pub embedding: Vec<f32>,
}

/// One NDJSON line of `POST /api/pull`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OllamaPullStatus {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}
