//! The wire contract of the lemonade server.
//!
//! Request types model the fields lemonade itself reads and keep every other field in
//! `extra`, so parameters we do not model (`top_k`, `min_p`, `tools`, `response_format`, …)
//! reach llama-server untouched. Response types are permissive (most fields optional) so a
//! Rust client can deserialize what any backend returns.
//!
//! With the `openapi` feature (the server's), every type derives `utoipa::ToSchema`; the
//! OpenAPI document is generated from them. Without it, api-types is serde types only.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod admin;
mod anthropic;
mod audio;
mod cloud;
pub mod form;
mod images;
mod lemonade;
mod ollama;
mod options;
mod system;
pub use admin::*;
pub use anthropic::*;
pub use audio::*;
pub use cloud::*;
pub use images::*;
pub use lemonade::*;
pub use ollama::*;
pub use options::*;
pub use system::*;

/// A field that tells `null` from absent: absent is `None`, `null` is `Some(None)`.
pub(crate) fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Fields a request carries that lemonade does not model; forwarded verbatim.
pub type Extra = Map<String, Value>;

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Lemonade v11's management routes' error body: `{"error": "…"}` (v11's clients read the
/// message as a string), with the OpenAI error's `type`, `code` and `param` beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LemonadeError {
    pub error: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

/// OpenAI-style error body: `{"error": {"message", "type", "code", "param"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Human-readable description of what went wrong.
    pub message: String,
    /// Error class, e.g. `invalid_request_error`, `not_found`, `model_load_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Machine-readable code, e.g. `model_not_found`, `invalid_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The request field the error is about, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The model named in the request (model errors only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_model: Option<String>,
    /// The request path (unknown-endpoint errors only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl ErrorResponse {
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorResponse {
            error: ErrorDetail {
                message: message.into(),
                kind: kind.into(),
                code: None,
                param: None,
                requested_model: None,
                path: None,
            },
        }
    }
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.error.code = Some(code.into());
        self
    }
    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }
    pub fn requested_model(mut self, model: impl Into<String>) -> Self {
        self.error.requested_model = Some(model.into());
        self
    }
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.error.path = Some(path.into());
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Chat completions
// ---------------------------------------------------------------------------------------------

/// `POST /v1/chat/completions`. Fields not listed are forwarded to the backend unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "messages": [{"role": "user", "content": "Hello"}], "stream": false})))]
pub struct ChatCompletionRequest {
    /// Model name as listed by `GET /v1/models`. Loaded on demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Copied into `max_tokens` when `max_tokens` is absent (llama.cpp reads `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StringOrArray>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// `false` puts `/no_think\n` in front of the last user message with string content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// A string, or an array of content parts (`{"type":"text","text":…}`, images, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub content: Option<Value>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

impl ChatMessage {
    /// A message with plain text content.
    pub fn text(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: Some(Value::String(content.into())), extra: Extra::new() }
    }
}

/// A string or an array of strings (OpenAI's `stop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum StringOrArray {
    One(String),
    Many(Vec<String>),
}

/// Non-streaming chat completion, as llama-server returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama.cpp's per-request timings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatChoice {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessage>,
    /// Streaming chunks carry `delta` instead of `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatMessage>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

/// llama-server's `timings` object (prompt = prefill, predicted = decode).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Timings {
    #[serde(default)]
    pub prompt_n: u64,
    #[serde(default)]
    pub prompt_ms: f64,
    #[serde(default)]
    pub predicted_n: u64,
    #[serde(default)]
    pub predicted_ms: f64,
    #[serde(default)]
    pub predicted_per_second: f64,
}

// ---------------------------------------------------------------------------------------------
// Completions, responses
// ---------------------------------------------------------------------------------------------

/// `POST /v1/completions` (legacy text completion).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "prompt": "Once upon a time", "max_tokens": 16})))]
pub struct CompletionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A string, an array of strings, or token ids.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub prompt: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

/// `POST /v1/responses` (OpenAI Responses API, as llama-server implements it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "input": "Say hi", "max_output_tokens": 16})))]
pub struct ResponsesRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A string or an array of input items.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Embeddings, reranking
// ---------------------------------------------------------------------------------------------

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "all-MiniLM-L6-v2-GGUF", "input": ["hello", "world"]})))]
pub struct EmbeddingRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A string, an array of strings, or token ids.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    /// `float` (default) or `base64` (little-endian f32, what the OpenAI Python SDK asks for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    Float,
    Base64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbeddingResponse {
    pub object: String,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbeddingData {
    pub object: String,
    pub index: u32,
    pub embedding: EmbeddingVector,
}

/// A float array, or base64 of little-endian f32 when `encoding_format` is `base64`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

/// `POST /v1/reranking` (alias `/v1/rerank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "bge-reranker-GGUF", "query": "What is a panda?", "documents": ["hi", "The giant panda is a bear."]})))]
pub struct RerankRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_n: Option<u32>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RerankResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    pub results: Vec<RerankResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RerankResult {
    pub index: u32,
    pub relevance_score: f64,
}
