//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) as lemonade serves
//! it for coding agents and the `anthropic` SDKs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnthropicError {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
    /// `request_too_large`, `rate_limit_error`, `api_error` or `overloaded_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl AnthropicError {
    pub fn new(kind: &str, message: impl Into<String>) -> AnthropicError {
        AnthropicError {
            kind: "error".into(),
            error: AnthropicErrorDetail { kind: kind.into(), message: message.into() },
        }
    }
}

/// A message's content: a string, or content blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum AnthropicContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// A content block of a request or an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    ToolUse {
        id: String,
        name: String,
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        /// A string or text (and image) blocks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        content: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    pub content: AnthropicContent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnthropicTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the tool's input.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input_schema: Value,
}

/// `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]})))]
pub struct MessagesRequest {
    /// Lemonade: with a router collection, add its decision (`x_lemonade_route`) to the answer
    /// (to the first event, `message_start`, when streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_trace: Option<bool>,
    pub model: String,
    pub max_tokens: u64,
    pub messages: Vec<AnthropicMessage>,
    /// A string or text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<AnthropicContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AnthropicTool>>,
    /// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub tool_choice: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// `{"type": "enabled", "budget_tokens"}` or `{"type": "disabled"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    Enabled {
        #[serde(default)]
        budget_tokens: Option<u64>,
    },
    Disabled,
    Adaptive,
}

/// `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SmolLM2-135M-Instruct-GGUF", "messages": [{"role": "user", "content": "Hello"}]})))]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<AnthropicMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<AnthropicContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AnthropicTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub tool_choice: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CountTokensResponse {
    pub input_tokens: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnthropicUsage {
    /// The prompt's tokens not read from the cache (Anthropic's meaning: the whole prompt is
    /// `input_tokens + cache_read_input_tokens`).
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The prompt's tokens read from the backend's prompt cache, when the backend says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

/// The answer of `POST /v1/messages` (and the `message` of a stream's `message_start`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MessagesResponse {
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (null in `message_start`).
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: AnthropicUsage,
}
