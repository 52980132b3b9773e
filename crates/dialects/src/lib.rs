//! Pure translation between the OpenAI chat API that llama-server speaks and the dialects
//! clients speak: Ollama ([`ollama`]) and Anthropic Messages ([`anthropic`]). Requests become
//! OpenAI bodies; answers and streams are translated back, a stream one SSE event at a time
//! ([`StreamTranslator`], fed by [`SseDecoder`]), so nothing is buffered but the tool-call
//! arguments a dialect wants whole. No I/O and no clock: timestamps and ids come in as values.

pub mod annotate;
pub mod anthropic;
pub mod echo;
pub mod mcp;
pub mod ollama;
pub mod quiet;
pub mod relay;
mod sse;

use serde_json::Value;

pub use sse::SseDecoder;

/// Turns the backend's OpenAI stream into a dialect's stream.
pub trait StreamTranslator: Send {
    /// The answer's `Content-Type`.
    fn content_type(&self) -> &'static str;
    /// Bytes to send for one `data:` event of the upstream stream (a parsed chunk).
    fn chunk(&mut self, chunk: &Value) -> Vec<u8>;
    /// Bytes to send when the upstream stream ended well (`[DONE]`, or its end).
    fn end(&mut self) -> Vec<u8>;
    /// Bytes to send when it failed part way: the dialect's error, in-stream.
    fn error(&mut self, message: &str) -> Vec<u8>;
    /// Bytes that keep the connection alive while the backend has sent nothing yet (a long
    /// prefill), saying `words`: an SSE comment, which every SSE client ignores.
    fn keepalive(&mut self, words: &str) -> Vec<u8> {
        format!(": {words}\n\n").into_bytes()
    }
}

/// A request a dialect cannot translate: the message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// llama-server's `timings` (and the OpenAI `usage`) of an answer or a stream's last chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub prompt_tokens: Option<u64>,
    /// The part of the prompt read from the backend's cache (llama-server's `cache_n`, or
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub prompt_ms: Option<f64>,
    pub predicted_ms: Option<f64>,
}

impl Counts {
    /// What an answer reports.
    pub fn of(v: &Value) -> Counts {
        let mut c = Counts::default();
        c.take(v);
        c
    }

    /// Takes in what `v` (an answer or a chunk) reports: `timings` over `usage`.
    pub fn take(&mut self, v: &Value) {
        let u = |o: &Value, k: &str| o.get(k).and_then(Value::as_u64);
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = u(usage, "prompt_tokens").or(self.prompt_tokens);
            self.completion_tokens = u(usage, "completion_tokens").or(self.completion_tokens);
            let details = usage.get("prompt_tokens_details").filter(|d| d.is_object());
            self.cached_tokens = details.and_then(|d| u(d, "cached_tokens")).or(self.cached_tokens);
        }
        if let Some(t) = v.get("timings").filter(|t| t.is_object()) {
            // The whole prompt: the part processed now plus the part reused from the cache
            // (without `cache_n`, `usage` says it better than the processed part alone).
            self.cached_tokens = u(t, "cache_n").or(self.cached_tokens);
            if let Some(n) = u(t, "prompt_n") {
                self.prompt_tokens = match u(t, "cache_n") {
                    Some(cached) => Some(n + cached),
                    None => self.prompt_tokens.or(Some(n)),
                };
            }
            self.completion_tokens = u(t, "predicted_n").or(self.completion_tokens);
            self.prompt_ms = t.get("prompt_ms").and_then(Value::as_f64).or(self.prompt_ms);
            self.predicted_ms = t.get("predicted_ms").and_then(Value::as_f64).or(self.predicted_ms);
        }
    }
}

impl Counts {
    /// The decode rate (tokens/s), from the generated tokens and their time.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let (n, ms) = (self.completion_tokens?, self.predicted_ms.filter(|ms| *ms > 0.0)?);
        Some(n as f64 * 1000.0 / ms)
    }
}

/// Tool calls of a stream, put together from their fragments (by index).
#[derive(Debug, Clone, Default)]
pub struct ToolCalls {
    pub calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// Its id, or `toolu_<index>` when the backend gave none.
    pub fn id_or_index(&self, index: usize) -> String {
        if self.id.is_empty() {
            format!("toolu_{index}")
        } else {
            self.id.clone()
        }
    }
}

impl ToolCalls {
    /// The tool calls of an answer's `message`.
    pub fn of(message: &Value) -> Vec<ToolCall> {
        let mut t = ToolCalls::default();
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            t.add(calls);
        }
        t.calls
    }

    /// Adds a chunk's `delta.tool_calls`; returns, for each fragment, its call's index and
    /// whether it started that call.
    pub fn add(&mut self, deltas: &[Value]) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        for d in deltas {
            let i = d.get("index").and_then(Value::as_u64).map(|i| i as usize).unwrap_or(self.calls.len());
            let new = i >= self.calls.len();
            while self.calls.len() <= i {
                self.calls.push(ToolCall::default());
            }
            let c = &mut self.calls[i];
            if let Some(id) = d.get("id").and_then(Value::as_str) {
                c.id = id.to_string();
            }
            if let Some(f) = d.get("function") {
                if let Some(n) = f.get("name").and_then(Value::as_str) {
                    c.name.push_str(n);
                }
                if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                    c.arguments.push_str(a);
                }
            }
            out.push((i, new));
        }
        out
    }
}

/// A tool call's arguments as an object: the JSON string the backend wrote, parsed; a string
/// that is not a JSON object is kept under `"arguments"`.
pub fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => Value::Object(Default::default()),
        _ => serde_json::json!({ "arguments": arguments }),
    }
}

/// The first choice of an answer or chunk.
fn choice(v: &Value) -> Option<&Value> {
    v.get("choices")?.get(0)
}

/// A non-empty string at `key`.
fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_prefer_timings_and_add_the_cached_prompt() {
        let mut c = Counts::default();
        c.take(&json!({"usage": {"prompt_tokens": 10, "completion_tokens": 5}}));
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(10), Some(5)));
        c.take(&json!({"timings": {"prompt_n": 2, "cache_n": 9, "predicted_n": 6, "prompt_ms": 1.5, "predicted_ms": 30.0}}));
        assert_eq!(
            (c.prompt_tokens, c.completion_tokens, c.prompt_ms, c.predicted_ms),
            (Some(11), Some(6), Some(1.5), Some(30.0))
        );
        assert_eq!(c.tokens_per_second(), Some(200.0));
        // Without cache_n, usage's whole prompt stays.
        let c = Counts::of(&json!({"usage": {"prompt_tokens": 10}, "timings": {"prompt_n": 9}}));
        assert_eq!(c.prompt_tokens, Some(10));
        assert_eq!(Counts::of(&json!({"timings": {"prompt_n": 9}})).prompt_tokens, Some(9));
    }

    #[test]
    fn tool_call_fragments_are_put_together_by_index() {
        let mut t = ToolCalls::default();
        let first =
            t.add(&[json!({"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": "{\"ci"}})]);
        let more = t.add(&[json!({"index": 0, "function": {"arguments": "ty\": \"Paris\"}"}})]);
        assert_eq!((first, more), (vec![(0, true)], vec![(0, false)]));
        assert_eq!(
            t.calls[0],
            ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: "{\"city\": \"Paris\"}".into() }
        );
        assert_eq!(arguments_object(&t.calls[0].arguments), json!({"city": "Paris"}));
        assert_eq!(arguments_object("not json"), json!({"arguments": "not json"}));
        assert_eq!(arguments_object(""), json!({}));
    }
}
