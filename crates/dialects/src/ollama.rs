//! The Ollama API over llama-server's OpenAI API: model names, `keep_alive`, `options`, chat
//! and generate requests, their answers and NDJSON streams.

use api_types::{
    OllamaChatRequest, OllamaChatResponse, OllamaDetails, OllamaEmbedResponse, OllamaFunctionCall,
    OllamaGenerateRequest, OllamaGenerateResponse, OllamaMessage, OllamaMetrics, OllamaOptions, OllamaToolCall,
};
use serde_json::{json, Map, Value};

use crate::{arguments_object, choice, text, BadRequest, Counts, StreamTranslator, ToolCalls};

/// What `GET /api/version` answers (Lemonade v9's figure: clients check for a recent Ollama).
pub const VERSION: &str = "0.16.1";
/// A digest for every model (lemonade keeps no Ollama blobs).
pub const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// A name as clients send it, without Ollama's `:latest` tag.
pub fn strip_latest(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// A name as Ollama lists it: with the `:latest` tag.
pub fn tagged(name: &str) -> String {
    format!("{}:latest", strip_latest(name))
}

/// `0.6B` from `Qwen3-0.6B-GGUF`, `270M` from `gemma-3-270m-it`: the last hyphen-separated
/// part made of digits and dots and a `B`/`M` (upper-cased); "" when there is none.
pub fn parameter_size(name: &str) -> String {
    name.split('-')
        .rev()
        .find(|p| {
            let (num, unit) = p.split_at(p.len().saturating_sub(1));
            num.starts_with(|c: char| c.is_ascii_digit())
                && num.chars().all(|c| c.is_ascii_digit() || c == '.')
                && matches!(unit, "B" | "b" | "M" | "m")
        })
        .map(str::to_ascii_uppercase)
        .unwrap_or_default()
}

/// `Q4_K_M` from `unsloth/Qwen3-0.6B-GGUF:Qwen3-0.6B-Q4_K_M.gguf`: the first `[I]Q<digit>…`
/// token after a non-alphanumeric character (in the variant after `:` when there is one).
pub fn quantization_level(checkpoint: &str) -> String {
    let part = checkpoint.rsplit_once(':').map(|(_, v)| v).unwrap_or(checkpoint);
    let b = part.as_bytes();
    for i in 0..b.len() {
        if i > 0 && b[i - 1].is_ascii_alphanumeric() {
            continue;
        }
        let start = if b[i] == b'I' { i + 1 } else { i };
        if b.get(start) == Some(&b'Q') && b.get(start + 1).is_some_and(u8::is_ascii_digit) {
            let end = (start..b.len()).find(|&j| !(b[j].is_ascii_alphanumeric() || b[j] == b'_')).unwrap_or(b.len());
            return part[i..end].to_string();
        }
    }
    String::new()
}

/// `details` of a model in tags, show and ps.
pub fn details(name: &str, checkpoint: &str, recipe: &str) -> OllamaDetails {
    OllamaDetails {
        parent_model: String::new(),
        format: "gguf".into(),
        family: recipe.into(),
        families: vec![recipe.into()],
        parameter_size: parameter_size(name),
        quantization_level: quantization_level(checkpoint),
    }
}

/// What a request's `keep_alive` asks of the model's residency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// `0`: unload it once the answer is done.
    UnloadAfter,
    /// A duration: unload it after this long (ms) without requests.
    For(u64),
    /// Negative: keep it loaded until it is unloaded.
    Forever,
}

impl KeepAlive {
    /// The model's idle timeout it asks for, in the scheduler's terms (ms; 0 = never): `0`
    /// is 1 ms, so the model unloads as soon as it is idle (after this answer, unless other
    /// requests use it).
    pub fn idle_timeout_ms(self) -> u64 {
        match self {
            KeepAlive::UnloadAfter => 1,
            KeepAlive::For(ms) => ms,
            KeepAlive::Forever => 0,
        }
    }
}

/// `keep_alive` as Ollama takes it: a number of seconds, or a duration string (`"10m"`,
/// `"1h30m"`, `"300ms"`, `"-1"`, `"2.5s"`).
pub fn keep_alive(v: &Value) -> Result<KeepAlive, BadRequest> {
    let bad = || {
        BadRequest(format!(
            "keep_alive must be a number of seconds or a duration such as \"5m\", \"1h30m\" or \"-1\", got {v}"
        ))
    };
    let seconds = match v {
        Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        Value::String(s) => duration_seconds(s.trim()).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    Ok(if seconds < 0.0 {
        KeepAlive::Forever
    } else if seconds == 0.0 {
        KeepAlive::UnloadAfter
    } else {
        KeepAlive::For(((seconds * 1000.0).ceil() as u64).max(1))
    })
}

/// Seconds of a Go-style duration (`1h30m`, `300ms`, `-5m`), or of a bare number.
fn duration_seconds(s: &str) -> Option<f64> {
    if let Ok(n) = s.parse::<f64>() {
        return n.is_finite().then_some(n);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let n: f64 = rest[..n_end].parse().ok()?;
        rest = &rest[n_end..];
        let u_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u_end..];
        total += n * unit;
    }
    Some(sign * total)
}

/// `options` (and the `format`/`think` fields) onto an OpenAI body for llama-server.
fn apply_options(out: &mut Map<String, Value>, options: Option<&OllamaOptions>) {
    let Some(o) = options else { return };
    for (key, value) in o {
        let to = match key.as_str() {
            // -1 (infinite) and -2 (fill the context) are llama-server's default.
            "num_predict" => {
                if value.as_i64().is_some_and(|n| n < 0) {
                    continue;
                }
                "max_tokens"
            }
            "num_keep" => "n_keep",
            "temperature" | "top_k" | "top_p" | "min_p" | "typical_p" | "seed" | "stop" | "repeat_penalty"
            | "repeat_last_n" | "presence_penalty" | "frequency_penalty" | "mirostat" | "mirostat_tau"
            | "mirostat_eta" => key.as_str(),
            _ => continue, // num_ctx (a load option), num_gpu, num_thread, …: not per request
        };
        out.insert(to.into(), value.clone());
    }
}

fn apply_format(out: &mut Map<String, Value>, format: Option<&Value>) -> Result<(), BadRequest> {
    match format {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::String(s)) if s.is_empty() => {}
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(other) => return Err(BadRequest(format!("format must be \"json\" or a JSON schema object, got {other}"))),
    }
    Ok(())
}

fn apply_think(out: &mut Map<String, Value>, think: Option<&Value>) -> Result<(), BadRequest> {
    let on = match think {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => true,
        Some(other) => {
            return Err(BadRequest(format!("think must be true, false, \"low\", \"medium\" or \"high\", got {other}")))
        }
    };
    out.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    Ok(())
}

fn image_url(b64: &str) -> Value {
    let mime = if b64.starts_with("/9j/") { "image/jpeg" } else { "image/png" };
    json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{b64}")}})
}

/// An Ollama message as OpenAI's; `ids` gives tool calls ids and hands them to the `tool`
/// messages that answer them, in order.
fn message(m: &OllamaMessage, index: usize, ids: &mut Vec<String>) -> Value {
    let role = m.role.as_deref().filter(|r| !r.is_empty()).unwrap_or("user");
    let content = m.content.clone().unwrap_or_default();
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    match m.images.as_deref() {
        Some(images) if !images.is_empty() => {
            let mut parts = Vec::new();
            if !content.is_empty() {
                parts.push(json!({"type": "text", "text": content}));
            }
            parts.extend(images.iter().map(|i| image_url(i)));
            out.insert("content".into(), Value::Array(parts));
        }
        _ => {
            out.insert("content".into(), content.into());
        }
    }
    if let Some(calls) = m.tool_calls.as_deref().filter(|c| !c.is_empty()) {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let id = format!("call_{index}_{i}");
                ids.push(id.clone());
                let args = match &c.function.arguments {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                json!({"id": id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(t) = m.thinking.as_deref().filter(|t| !t.is_empty()) {
        out.insert("reasoning_content".into(), t.into());
    }
    if role == "tool" && !ids.is_empty() {
        out.insert("tool_call_id".into(), ids.remove(0).into());
    }
    Value::Object(out)
}

/// `/api/chat` as an OpenAI chat body for `model` (streaming asks for the usage too).
pub fn chat_request(req: &OllamaChatRequest, model: &str) -> Result<Value, BadRequest> {
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    let mut ids = Vec::new();
    let messages = req.messages.as_deref().unwrap_or_default();
    out.insert("messages".into(), messages.iter().enumerate().map(|(i, m)| message(m, i, &mut ids)).collect());
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        out.insert("tools".into(), Value::Array(tools.clone()));
    }
    finish_request(&mut out, req.options.as_ref(), req.format.as_ref(), req.think.as_ref(), req.stream)?;
    Ok(Value::Object(out))
}

fn finish_request(
    out: &mut Map<String, Value>,
    options: Option<&OllamaOptions>,
    format: Option<&Value>,
    think: Option<&Value>,
    stream: Option<bool>,
) -> Result<(), BadRequest> {
    apply_options(out, options);
    apply_format(out, format)?;
    apply_think(out, think)?;
    let stream = stream.unwrap_or(true);
    out.insert("stream".into(), stream.into());
    if stream {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(())
}

/// `/api/generate` as an OpenAI body and the path it goes to: the chat endpoint (so the
/// model's template applies, with `system`), or `/v1/completions` for a `raw` prompt.
pub fn generate_request(req: &OllamaGenerateRequest, model: &str) -> Result<(&'static str, Value), BadRequest> {
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    let prompt = req.prompt.clone().unwrap_or_default();
    let path = if req.raw == Some(true) {
        out.insert("prompt".into(), prompt.into());
        "/v1/completions"
    } else {
        let mut ids = Vec::new();
        let mut messages = Vec::new();
        if let Some(s) = req.system.as_deref().filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": s}));
        }
        let user = OllamaMessage {
            role: Some("user".into()),
            content: Some(prompt),
            images: req.images.clone(),
            ..OllamaMessage::default()
        };
        messages.push(message(&user, 0, &mut ids));
        out.insert("messages".into(), Value::Array(messages));
        "/v1/chat/completions"
    };
    finish_request(&mut out, req.options.as_ref(), req.format.as_ref(), req.think.as_ref(), req.stream)?;
    Ok((path, Value::Object(out)))
}

fn metrics(c: &Counts) -> OllamaMetrics {
    let ns = |ms: Option<f64>| ms.map(|ms| (ms * 1e6) as u64);
    let (p, e) = (ns(c.prompt_ms), ns(c.predicted_ms));
    OllamaMetrics {
        total_duration: Some(p.unwrap_or(0) + e.unwrap_or(0)),
        load_duration: Some(0),
        prompt_eval_count: Some(c.prompt_tokens.unwrap_or(0)),
        prompt_eval_cached_count: c.cached_tokens,
        prompt_eval_duration: Some(p.unwrap_or(0)),
        eval_count: Some(c.completion_tokens.unwrap_or(0)),
        eval_duration: Some(e.unwrap_or(0)),
    }
}

/// OpenAI's finish reason as Ollama's `done_reason`.
fn done_reason(finish: Option<&str>) -> String {
    match finish {
        Some("length") => "length",
        _ => "stop",
    }
    .into()
}

fn tool_calls(calls: &[crate::ToolCall]) -> Option<Vec<OllamaToolCall>> {
    (!calls.is_empty()).then(|| {
        calls
            .iter()
            .map(|c| OllamaToolCall {
                function: OllamaFunctionCall { name: c.name.clone(), arguments: arguments_object(&c.arguments) },
            })
            .collect()
    })
}

/// A non-streaming OpenAI chat answer as `/api/chat`'s.
pub fn chat_response(v: &Value, model: &str, created_at: &str) -> OllamaChatResponse {
    let c = choice(v);
    let msg = c.and_then(|c| c.get("message")).cloned().unwrap_or(Value::Null);
    let counts = Counts::of(v);
    OllamaChatResponse {
        model: model.into(),
        created_at: created_at.into(),
        message: OllamaMessage {
            role: Some("assistant".into()),
            content: Some(msg.get("content").and_then(Value::as_str).unwrap_or_default().into()),
            thinking: text(&msg, "reasoning_content").map(str::to_string),
            tool_calls: tool_calls(&ToolCalls::of(&msg)),
            ..OllamaMessage::default()
        },
        done: true,
        done_reason: Some(done_reason(c.and_then(|c| c.get("finish_reason")).and_then(Value::as_str))),
        metrics: metrics(&counts),
    }
}

/// A non-streaming OpenAI answer (chat or completion) as `/api/generate`'s.
pub fn generate_response(v: &Value, model: &str, created_at: &str) -> OllamaGenerateResponse {
    let c = choice(v);
    let msg = c.and_then(|c| c.get("message"));
    let response = msg
        .and_then(|m| m.get("content"))
        .or_else(|| c.and_then(|c| c.get("text")))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let counts = Counts::of(v);
    OllamaGenerateResponse {
        model: model.into(),
        created_at: created_at.into(),
        response: response.into(),
        thinking: msg.and_then(|m| text(m, "reasoning_content")).map(str::to_string),
        done: true,
        done_reason: Some(done_reason(c.and_then(|c| c.get("finish_reason")).and_then(Value::as_str))),
        context: Some(Vec::new()),
        metrics: metrics(&counts),
    }
}

/// The answer to a chat (or generate) request with nothing to say: Ollama's load, or its
/// unload (`reason`).
pub fn done_answer(model: &str, created_at: &str, chat: bool, reason: &str) -> Value {
    let (model, created_at, done_reason) = (model.to_string(), created_at.to_string(), Some(reason.to_string()));
    let v = if chat {
        let message =
            OllamaMessage { role: Some("assistant".into()), content: Some(String::new()), ..Default::default() };
        serde_json::to_value(OllamaChatResponse {
            model,
            created_at,
            message,
            done: true,
            done_reason,
            ..Default::default()
        })
    } else {
        serde_json::to_value(OllamaGenerateResponse {
            model,
            created_at,
            done: true,
            done_reason,
            ..Default::default()
        })
    };
    v.unwrap_or(Value::Null)
}

/// The vectors of an OpenAI embeddings answer, in input order.
pub fn vectors(v: &Value) -> Vec<Vec<f32>> {
    let mut data: Vec<&Value> = v["data"].as_array().map(|d| d.iter().collect()).unwrap_or_default();
    data.sort_by_key(|d| d["index"].as_u64().unwrap_or(0));
    data.iter()
        .map(|d| d["embedding"].as_array().map(|e| e.iter().filter_map(|x| x.as_f64()).map(|x| x as f32).collect()))
        .map(Option::unwrap_or_default)
        .collect()
}

/// An OpenAI embeddings answer as `/api/embed`'s.
pub fn embed_response(v: &Value, model: String) -> OllamaEmbedResponse {
    let metrics = OllamaMetrics {
        prompt_eval_count: v["usage"]["prompt_tokens"].as_u64(),
        total_duration: Some(0),
        load_duration: Some(0),
        ..Default::default()
    };
    OllamaEmbedResponse { model, embeddings: vectors(v), metrics }
}

/// `v` as one NDJSON line.
pub fn line(v: impl serde::Serialize) -> Vec<u8> {
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// A line of a stream that waits for its model: no text (an empty chunk to Ollama's clients),
/// where it is in `lemonade_status` (`queued 2`, `loading 3 s`).
pub fn waiting_line(model: &str, created_at: &str, chat: bool, words: &str) -> Vec<u8> {
    let mut v = json!({"model": model, "created_at": created_at, "done": false, "lemonade_status": words});
    if chat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = json!("");
    }
    line(v)
}

/// The line that ends a stream with an error, as Ollama ends one.
pub fn error_line(message: &str) -> Vec<u8> {
    line(json!({"error": message}))
}

/// The NDJSON stream of `/api/chat` (or `/api/generate`) from the backend's OpenAI stream: a
/// line per content or thinking delta as it comes, the tool calls whole once the backend has
/// finished them, and a last `done: true` line with the counts and durations.
pub struct NdjsonStream {
    model: String,
    created_at: String,
    generate: bool,
    finish: Option<String>,
    tools: ToolCalls,
    counts: Counts,
}

impl NdjsonStream {
    pub fn chat(model: &str, created_at: &str) -> NdjsonStream {
        NdjsonStream {
            model: model.into(),
            created_at: created_at.into(),
            generate: false,
            finish: None,
            tools: ToolCalls::default(),
            counts: Counts::default(),
        }
    }

    pub fn generate(model: &str, created_at: &str) -> NdjsonStream {
        NdjsonStream { generate: true, ..NdjsonStream::chat(model, created_at) }
    }

    fn line(&self, content: &str, thinking: Option<&str>, calls: Option<Vec<OllamaToolCall>>, last: bool) -> Vec<u8> {
        let (done_reason, metrics, context) = if last {
            (Some(done_reason(self.finish.as_deref())), metrics(&self.counts), Some(Vec::new()))
        } else {
            (None, OllamaMetrics::default(), None)
        };
        if self.generate {
            line(OllamaGenerateResponse {
                model: self.model.clone(),
                created_at: self.created_at.clone(),
                response: content.into(),
                thinking: thinking.map(str::to_string),
                done: last,
                done_reason,
                context,
                metrics,
            })
        } else {
            line(OllamaChatResponse {
                model: self.model.clone(),
                created_at: self.created_at.clone(),
                message: OllamaMessage {
                    role: Some("assistant".into()),
                    content: Some(content.into()),
                    thinking: thinking.map(str::to_string),
                    tool_calls: calls,
                    ..OllamaMessage::default()
                },
                done: last,
                done_reason,
                metrics,
            })
        }
    }
}

impl StreamTranslator for NdjsonStream {
    fn keepalive(&mut self, words: &str) -> Vec<u8> {
        waiting_line(&self.model, &self.created_at, !self.generate, words)
    }

    fn content_type(&self) -> &'static str {
        "application/x-ndjson"
    }

    fn chunk(&mut self, v: &Value) -> Vec<u8> {
        self.counts.take(v);
        let Some(c) = choice(v) else { return Vec::new() };
        let delta = c.get("delta").unwrap_or(&Value::Null);
        let mut out = Vec::new();
        let content = text(delta, "content").or_else(|| text(c, "text"));
        let thinking = text(delta, "reasoning_content");
        if content.is_some() || thinking.is_some() {
            out.extend(self.line(content.unwrap_or_default(), thinking, None, false));
        }
        if let Some(Value::Array(calls)) = delta.get("tool_calls") {
            self.tools.add(calls);
        }
        if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
            // Ollama sends tool calls whole, in one line, once they are complete.
            if let Some(calls) = tool_calls(&std::mem::take(&mut self.tools).calls) {
                out.extend(self.line("", None, Some(calls), false));
            }
        }
        out
    }

    fn end(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(calls) = tool_calls(&std::mem::take(&mut self.tools).calls) {
            out.extend(self.line("", None, Some(calls), false));
        }
        out.extend(self.line("", None, None, true));
        out
    }

    fn error(&mut self, message: &str) -> Vec<u8> {
        error_line(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sizes_and_quantizations_read_as_lemonade_v9_reads_them() {
        assert_eq!(strip_latest("Qwen3-0.6B-GGUF:latest"), "Qwen3-0.6B-GGUF");
        assert_eq!(tagged("Qwen3-0.6B-GGUF"), "Qwen3-0.6B-GGUF:latest");
        assert_eq!(tagged("x:latest"), "x:latest");
        assert_eq!(parameter_size("Qwen3-0.6B-GGUF"), "0.6B");
        assert_eq!(parameter_size("Gemma-3-270m-it-GGUF"), "270M");
        assert_eq!(parameter_size("SmolLM2-135M-Instruct-GGUF"), "135M");
        assert_eq!(parameter_size("all-MiniLM-L6-v2-GGUF"), "");
        assert_eq!(quantization_level("unsloth/gemma-3-270m-it-GGUF:gemma-3-270m-it-UD-IQ2_M.gguf"), "IQ2_M");
        assert_eq!(quantization_level("unsloth/Qwen3-0.6B-GGUF:Q4_0"), "Q4_0");
        assert_eq!(quantization_level("x/SmolLM2-135M-Instruct-GGUF:SmolLM2.Q4_1.gguf"), "Q4_1");
        assert_eq!(quantization_level("x/all-MiniLM:F32"), "");
    }

    #[test]
    fn keep_alive_takes_seconds_durations_and_negatives_and_names_a_bad_value() {
        assert_eq!(keep_alive(&json!(0)), Ok(KeepAlive::UnloadAfter));
        assert_eq!(keep_alive(&json!("0")), Ok(KeepAlive::UnloadAfter));
        assert_eq!(keep_alive(&json!(300)), Ok(KeepAlive::For(300_000)));
        assert_eq!(keep_alive(&json!("10m")), Ok(KeepAlive::For(600_000)));
        assert_eq!(keep_alive(&json!("1h30m")), Ok(KeepAlive::For(5_400_000)));
        assert_eq!(keep_alive(&json!("300ms")), Ok(KeepAlive::For(300)));
        assert_eq!(keep_alive(&json!("2.5s")), Ok(KeepAlive::For(2_500)));
        assert_eq!(keep_alive(&json!(-1)), Ok(KeepAlive::Forever));
        assert_eq!(keep_alive(&json!("-1m")), Ok(KeepAlive::Forever));
        let ms: Vec<u64> =
            [KeepAlive::UnloadAfter, KeepAlive::For(5), KeepAlive::Forever].map(KeepAlive::idle_timeout_ms).into();
        assert_eq!(ms, [1, 5, 0]);
        for bad in [json!("soon"), json!("5 parsecs"), json!(true), json!([1]), json!("-"), json!("m")] {
            let e = keep_alive(&bad).unwrap_err();
            assert!(e.0.starts_with("keep_alive must be") && e.0.contains(&bad.to_string()), "{e}");
        }
    }

    #[test]
    fn chat_maps_options_format_think_images_and_tool_history() {
        let req: OllamaChatRequest = serde_json::from_value(json!({
            "model": "m:latest",
            "messages": [
                {"role": "user", "content": "look", "images": ["iVBORw0KGgo="]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "42", "tool_name": "f"}
            ],
            "options": {"num_predict": 8, "temperature": 0.1, "top_k": 5, "repeat_penalty": 1.1, "num_ctx": 4096, "stop": ["\n"]},
            "format": "json", "think": false, "stream": true
        }))
        .unwrap();
        let v = chat_request(&req, "m").unwrap();
        assert_eq!(v["model"], "m");
        assert_eq!((v["max_tokens"].as_u64(), &v["temperature"], &v["top_k"]), (Some(8), &json!(0.1), &json!(5)));
        assert_eq!((&v["repeat_penalty"], &v["stop"]), (&json!(1.1), &json!(["\n"])));
        assert!(v.get("num_ctx").is_none());
        assert_eq!(v["response_format"], json!({"type": "json_object"}));
        assert_eq!(v["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(v["stream_options"], json!({"include_usage": true}));
        assert_eq!(v["messages"][0]["content"][1]["image_url"]["url"], "data:image/png;base64,iVBORw0KGgo=");
        let call = &v["messages"][1]["tool_calls"][0];
        assert_eq!((&call["function"]["arguments"], &call["id"]), (&json!("{\"x\":1}"), &json!("call_1_0")));
        assert_eq!(v["messages"][2]["tool_call_id"], "call_1_0");
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let req = OllamaChatRequest { format: Some(schema.clone()), stream: Some(false), ..Default::default() };
        let v = chat_request(&req, "m").unwrap();
        assert_eq!(v["response_format"]["json_schema"]["schema"], schema);
        assert_eq!((v["stream"].as_bool(), v.get("stream_options")), (Some(false), None));
        let bad = OllamaChatRequest { format: Some(json!(3)), ..Default::default() };
        assert!(chat_request(&bad, "m").unwrap_err().0.starts_with("format must be"));
        let bad = OllamaChatRequest { think: Some(json!("very")), ..Default::default() };
        assert!(chat_request(&bad, "m").unwrap_err().0.starts_with("think must be"));
    }

    #[test]
    fn generate_uses_the_chat_template_unless_raw() {
        let req =
            OllamaGenerateRequest { prompt: Some("hi".into()), system: Some("be brief".into()), ..Default::default() };
        let (path, v) = generate_request(&req, "m").unwrap();
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(
            v["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        let req = OllamaGenerateRequest { prompt: Some("hi".into()), raw: Some(true), ..Default::default() };
        let (path, v) = generate_request(&req, "m").unwrap();
        assert_eq!((path, &v["prompt"]), ("/v1/completions", &json!("hi")));
    }

    #[test]
    fn answers_carry_thinking_tool_calls_counts_and_durations_in_nanoseconds() {
        let v = json!({"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": "",
            "reasoning_content": "hmm", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}, "timings": {"prompt_n": 7, "prompt_ms": 2.5, "predicted_n": 3, "predicted_ms": 10.0}});
        let r = chat_response(&v, "m", "2026-11-23T00:00:00Z");
        assert_eq!(r.message.thinking.as_deref(), Some("hmm"));
        assert_eq!(r.message.tool_calls.as_ref().unwrap()[0].function.arguments, json!({"x": 1}));
        assert_eq!((r.done, r.done_reason.as_deref()), (true, Some("stop")));
        assert_eq!((r.metrics.prompt_eval_count, r.metrics.eval_count), (Some(7), Some(3)));
        assert_eq!((r.metrics.prompt_eval_duration, r.metrics.eval_duration), (Some(2_500_000), Some(10_000_000)));
        let g = generate_response(&json!({"choices": [{"text": "abc", "finish_reason": "length"}]}), "m", "t");
        assert_eq!((g.response.as_str(), g.done_reason.as_deref(), g.context), ("abc", Some("length"), Some(vec![])));
    }

    #[test]
    fn the_stream_is_a_line_per_delta_tool_calls_whole_and_one_last_done_line() {
        let mut s = NdjsonStream::chat("m", "t");
        let mut out = Vec::new();
        for chunk in [
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"delta": {"reasoning_content": "think"}}]}),
            json!({"choices": [{"delta": {"content": "Hel"}}]}),
            json!({"choices": [{"delta": {"content": "lo"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{\"x\""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":2}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "timings": {"prompt_n": 4, "predicted_n": 5, "prompt_ms": 1.0, "predicted_ms": 2.0}}),
            json!({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5}}),
        ] {
            out.extend(s.chunk(&chunk));
        }
        out.extend(s.end());
        let lines: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert_eq!(lines[0]["message"]["thinking"], "think");
        assert_eq!((&lines[1]["message"]["content"], &lines[2]["message"]["content"]), (&json!("Hel"), &json!("lo")));
        assert_eq!(lines[3]["message"]["tool_calls"][0]["function"], json!({"name": "f", "arguments": {"x": 2}}));
        assert!(lines[..4].iter().all(|l| l["done"] == false && l.get("done_reason").is_none()));
        let last = &lines[4];
        assert_eq!(
            (&last["done"], &last["done_reason"], &last["eval_count"]),
            (&json!(true), &json!("stop"), &json!(5))
        );
        assert_eq!((&last["prompt_eval_count"], &last["eval_duration"]), (&json!(4), &json!(2_000_000)));
        let e: Value = serde_json::from_slice(&s.error("backend died")).unwrap();
        assert_eq!(e, json!({"error": "backend died"}));
        let mut g = NdjsonStream::generate("m", "t");
        let line: Value = serde_json::from_slice(&g.chunk(&json!({"choices": [{"text": "x"}]}))).unwrap();
        assert_eq!((&line["response"], &line["done"]), (&json!("x"), &json!(false)));
        let last: Value = serde_json::from_slice(&g.end()).unwrap();
        assert_eq!((&last["done"], &last["context"]), (&json!(true), &json!([])));
    }

    #[test]
    fn loads_embeddings_and_waiting_lines_are_ollamas_shapes() {
        let chat = done_answer("m", "t", true, "unload");
        assert_eq!((chat["done_reason"].as_str(), chat["message"]["content"].as_str()), (Some("unload"), Some("")));
        assert!(done_answer("m", "t", false, "load").get("message").is_none());
        let v = json!({"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0, 0.5]}],
                       "usage": {"prompt_tokens": 3}});
        let e = embed_response(&v, "m".into());
        assert_eq!(e.embeddings, vec![vec![1.0, 0.5], vec![2.0]], "in input order");
        assert_eq!(e.metrics.prompt_eval_count, Some(3));
        let w: Value = serde_json::from_slice(&waiting_line("m", "t", false, "queued 2")).unwrap();
        assert_eq!(
            (w["lemonade_status"].as_str(), w["response"].as_str(), w["done"].as_bool()),
            (Some("queued 2"), Some(""), Some(false))
        );
        assert_eq!(error_line("x"), b"{\"error\":\"x\"}\n");
    }

    #[test]
    fn a_cached_prompt_is_counted_whole_with_its_cached_part_beside() {
        let v = json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                       "timings": {"prompt_n": 20, "cache_n": 480, "predicted_n": 3}});
        let r = chat_response(&v, "m", "t");
        assert_eq!((r.metrics.prompt_eval_count, r.metrics.prompt_eval_cached_count), (Some(500), Some(480)));
        let plain = chat_response(&json!({"choices": [], "usage": {"prompt_tokens": 5}}), "m", "t");
        assert!(serde_json::to_value(&plain).unwrap().get("prompt_eval_cached_count").is_none());
    }
}
