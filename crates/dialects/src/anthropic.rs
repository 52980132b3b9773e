//! Anthropic's Messages API over llama-server's OpenAI API: requests (system, text, image,
//! tool_use and tool_result blocks, tools, thinking), answers, and the event stream.

use api_types::{
    AnthropicContent, AnthropicMessage, AnthropicTool, AnthropicUsage, ContentBlock, CountTokensRequest, ImageSource,
    MessagesRequest, MessagesResponse, Thinking,
};
use serde_json::{json, Map, Value};

use crate::{arguments_object, choice, text, BadRequest, Counts, StreamTranslator, ToolCalls};

/// The text of a string or of text blocks (other blocks are left out).
fn plain_text(c: &AnthropicContent) -> String {
    match c {
        AnthropicContent::Text(s) => s.clone(),
        AnthropicContent::Blocks(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn image_part(source: &ImageSource) -> Value {
    let url = match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url.clone(),
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// A tool result's content as text (text blocks joined; an error is marked as one).
fn tool_result_text(content: Option<&Value>, is_error: bool) -> String {
    let text = match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        Some(other) => other.to_string(),
        None => String::new(),
    };
    if is_error {
        format!("Error: {text}")
    } else {
        text
    }
}

/// The conversation as OpenAI messages: `system` first; a user turn's `tool_result` blocks
/// become `tool` messages before the rest of it; an assistant turn's `tool_use` blocks its
/// `tool_calls`, its thinking its `reasoning_content`.
fn messages(system: Option<&AnthropicContent>, turns: &[AnthropicMessage]) -> Result<Vec<Value>, BadRequest> {
    let mut out = Vec::new();
    if let Some(s) = system {
        let s = plain_text(s);
        if !s.is_empty() {
            out.push(json!({"role": "system", "content": s}));
        }
    }
    for (i, m) in turns.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(BadRequest(format!(
                "messages.{i}.role: must be \"user\" or \"assistant\", got \"{}\" (put a system prompt in the top-level \"system\" field)",
                m.role
            )));
        }
        let blocks = match &m.content {
            AnthropicContent::Text(s) => {
                out.push(json!({"role": m.role, "content": s}));
                continue;
            }
            AnthropicContent::Blocks(b) => b,
        };
        let mut parts = Vec::new();
        let mut calls = Vec::new();
        let mut reasoning = String::new();
        for b in blocks {
            match b {
                ContentBlock::Text { text } => parts.push(json!({"type": "text", "text": text})),
                ContentBlock::Image { source } => parts.push(image_part(source)),
                ContentBlock::ToolUse { id, name, input } if m.role == "assistant" => calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}),
                ),
                ContentBlock::ToolResult { tool_use_id, content, is_error } if m.role == "user" => out.push(json!({
                    "role": "tool", "tool_call_id": tool_use_id,
                    "content": tool_result_text(content.as_ref(), is_error.unwrap_or(false)),
                })),
                ContentBlock::Thinking { thinking, .. } => reasoning.push_str(thinking),
                ContentBlock::RedactedThinking { .. } => {}
                ContentBlock::ToolUse { .. } => {
                    return Err(BadRequest(format!("messages.{i}: tool_use blocks belong in assistant messages")))
                }
                ContentBlock::ToolResult { .. } => {
                    return Err(BadRequest(format!("messages.{i}: tool_result blocks belong in user messages")))
                }
            }
        }
        if parts.is_empty() && calls.is_empty() && reasoning.is_empty() {
            continue; // a turn of tool results only
        }
        let mut msg = Map::new();
        msg.insert("role".into(), m.role.clone().into());
        // Text alone is sent as a string: every chat template takes that.
        let all_text = parts.iter().all(|p| p["type"] == "text");
        let content = if all_text {
            Value::String(parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"))
        } else {
            Value::Array(parts)
        };
        msg.insert("content".into(), content);
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        if !reasoning.is_empty() {
            msg.insert("reasoning_content".into(), reasoning.into());
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

fn tools(tools: &[AnthropicTool]) -> Value {
    tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description.clone().unwrap_or_default(), "parameters": t.input_schema}})
        })
        .collect()
}

fn tool_choice(c: &Value) -> Result<Value, BadRequest> {
    match c.get("type").and_then(Value::as_str) {
        Some("auto") => Ok("auto".into()),
        Some("any") => Ok("required".into()),
        Some("none") => Ok("none".into()),
        Some("tool") => match c.get("name").and_then(Value::as_str) {
            Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
            None => Err(BadRequest("tool_choice.name: required when tool_choice.type is \"tool\"".into())),
        },
        _ => Err(BadRequest(format!("tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\", got {c}"))),
    }
}

fn thinking(out: &mut Map<String, Value>, t: Option<&Thinking>) {
    let on = match t {
        None => return,
        Some(Thinking::Enabled { .. } | Thinking::Adaptive) => true,
        Some(Thinking::Disabled) => false,
    };
    out.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
}

/// `/v1/messages` as an OpenAI chat body for `model`.
pub fn request(req: &MessagesRequest, model: &str) -> Result<Value, BadRequest> {
    if req.messages.is_empty() {
        return Err(BadRequest("messages: at least one message is required".into()));
    }
    if req.max_tokens == 0 {
        return Err(BadRequest("max_tokens: must be at least 1".into()));
    }
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    out.insert("messages".into(), Value::Array(messages(req.system.as_ref(), &req.messages)?));
    out.insert("max_tokens".into(), req.max_tokens.into());
    if let Some(t) = req.tools.as_deref().filter(|t| !t.is_empty()) {
        out.insert("tools".into(), tools(t));
    }
    if let Some(c) = &req.tool_choice {
        out.insert("tool_choice".into(), tool_choice(c)?);
        if c.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), false.into());
        }
    }
    if let Some(s) = req.stop_sequences.as_ref().filter(|s| !s.is_empty()) {
        out.insert("stop".into(), json!(s));
    }
    for (k, v) in [("temperature", req.temperature.map(Value::from)), ("top_p", req.top_p.map(Value::from))] {
        if let Some(v) = v {
            out.insert(k.into(), v);
        }
    }
    if let Some(k) = req.top_k {
        out.insert("top_k".into(), k.into());
    }
    thinking(&mut out, req.thinking.as_ref());
    let stream = req.stream.unwrap_or(false);
    out.insert("stream".into(), stream.into());
    if stream {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(out))
}

/// `/v1/messages/count_tokens` as the body of llama-server's `/apply-template` (the prompt
/// the model would see, which `/tokenize` then counts).
pub fn count_request(req: &CountTokensRequest) -> Result<Value, BadRequest> {
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages(req.system.as_ref(), &req.messages)?));
    if let Some(t) = req.tools.as_deref().filter(|t| !t.is_empty()) {
        out.insert("tools".into(), tools(t));
    }
    thinking(&mut out, req.thinking.as_ref());
    Ok(Value::Object(out))
}

/// OpenAI's finish reason as Anthropic's stop reason. A stop on one of `stop_sequences` is
/// reported as `end_turn`: llama-server's OpenAI answer does not say which stop was hit.
fn stop_reason(finish: Option<&str>) -> String {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        _ => "end_turn",
    }
    .into()
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens not read from the cache, which
/// `cache_read_input_tokens` counts (together, the whole prompt).
fn usage(c: &Counts) -> AnthropicUsage {
    let cached = c.cached_tokens.map(|n| n.min(c.prompt_tokens.unwrap_or(0)));
    AnthropicUsage {
        input_tokens: c.prompt_tokens.unwrap_or(0) - cached.unwrap_or(0),
        output_tokens: c.completion_tokens.unwrap_or(0),
        cache_read_input_tokens: cached,
    }
}

/// A non-streaming OpenAI chat answer as a Messages answer with id `id`.
pub fn response(v: &Value, model: &str, id: &str) -> MessagesResponse {
    let c = choice(v);
    let msg = c.and_then(|c| c.get("message")).cloned().unwrap_or(Value::Null);
    let mut content = Vec::new();
    if let Some(t) = text(&msg, "reasoning_content") {
        content.push(ContentBlock::Thinking { thinking: t.into(), signature: String::new() });
    }
    let calls = ToolCalls::of(&msg);
    let said = msg.get("content").and_then(Value::as_str).unwrap_or_default();
    if !said.is_empty() || calls.is_empty() {
        content.push(ContentBlock::Text { text: said.into() });
    }
    for (i, call) in calls.iter().enumerate() {
        let (id, name, input) = (call.id_or_index(i), call.name.clone(), arguments_object(&call.arguments));
        content.push(ContentBlock::ToolUse { id, name, input });
    }
    let counts = Counts::of(v);
    MessagesResponse {
        id: id.into(),
        kind: "message".into(),
        role: "assistant".into(),
        model: model.into(),
        content,
        stop_reason: Some(stop_reason(c.and_then(|c| c.get("finish_reason")).and_then(Value::as_str))),
        stop_sequence: None,
        usage: usage(&counts),
    }
}

/// The kind of content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Thinking,
    Text,
    Tool(usize),
}

/// Anthropic's event stream from the backend's OpenAI stream: `message_start` and a `ping`,
/// then per block `content_block_start`, its deltas as they come (`thinking_delta`,
/// `text_delta`, `input_json_delta`) and `content_block_stop`; at the end `message_delta`
/// with the stop reason and usage, and `message_stop`.
pub struct EventStream {
    id: String,
    model: String,
    started: bool,
    open: Option<Open>,
    index: usize,
    tools: ToolCalls,
    finish: Option<String>,
    counts: Counts,
}

impl EventStream {
    pub fn new(model: &str, id: &str) -> EventStream {
        EventStream {
            id: id.into(),
            model: model.into(),
            started: false,
            open: None,
            index: 0,
            tools: ToolCalls::default(),
            finish: None,
            counts: Counts::default(),
        }
    }

    fn event(out: &mut Vec<u8>, name: &str, data: Value) {
        out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = MessagesResponse {
            id: self.id.clone(),
            kind: "message".into(),
            role: "assistant".into(),
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: usage(&self.counts),
        };
        Self::event(out, "message_start", json!({"type": "message_start", "message": message}));
        Self::event(out, "ping", json!({"type": "ping"}));
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.open.take().is_some() {
            Self::event(out, "content_block_stop", json!({"type": "content_block_stop", "index": self.index}));
            self.index += 1;
        }
    }

    /// Makes `kind` the open block (closing another), starting it with `block`.
    fn open(&mut self, out: &mut Vec<u8>, kind: Open, block: Value) {
        if self.open == Some(kind) {
            return;
        }
        self.close(out);
        self.open = Some(kind);
        Self::event(
            out,
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        );
    }

    fn delta(&self, out: &mut Vec<u8>, delta: Value) {
        Self::event(
            out,
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        );
    }
}

impl StreamTranslator for EventStream {
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }

    fn chunk(&mut self, v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        self.start(&mut out);
        self.counts.take(v);
        let Some(c) = choice(v) else { return out };
        let delta = c.get("delta").unwrap_or(&Value::Null);
        if let Some(t) = text(delta, "reasoning_content") {
            self.open(&mut out, Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}));
            self.delta(&mut out, json!({"type": "thinking_delta", "thinking": t}));
        }
        if let Some(t) = text(delta, "content") {
            self.open(&mut out, Open::Text, json!({"type": "text", "text": ""}));
            self.delta(&mut out, json!({"type": "text_delta", "text": t}));
        }
        if let Some(Value::Array(calls)) = delta.get("tool_calls") {
            for (d, (i, _)) in calls.iter().zip(self.tools.add(calls)) {
                let call = self.tools.calls[i].clone();
                let id = if call.id.is_empty() { format!("toolu_{i}") } else { call.id.clone() };
                self.open(
                    &mut out,
                    Open::Tool(i),
                    json!({"type": "tool_use", "id": id, "name": call.name, "input": {}}),
                );
                if let Some(a) = d.get("function").and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                    if !a.is_empty() {
                        self.delta(&mut out, json!({"type": "input_json_delta", "partial_json": a}));
                    }
                }
            }
        }
        if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        out
    }

    fn end(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.start(&mut out);
        if self.index == 0 && self.open.is_none() {
            // Nothing was said: one empty text block, as Anthropic sends.
            self.open(&mut out, Open::Text, json!({"type": "text", "text": ""}));
        }
        self.close(&mut out);
        let u = usage(&self.counts);
        Self::event(
            &mut out,
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": null},
                   "usage": u}),
        );
        Self::event(&mut out, "message_stop", json!({"type": "message_stop"}));
        out
    }

    fn error(&mut self, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        Self::event(&mut out, "error", json!({"type": "error", "error": {"type": "api_error", "message": message}}));
        out
    }
}

/// The error `type` Anthropic names for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_conversation_with_system_images_tools_and_results_becomes_openai_messages() {
        let r = req(json!({
            "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "be brief"}],
            "stop_sequences": ["END"], "temperature": 0.2, "top_k": 3, "thinking": {"type": "disabled"},
            "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "calling"}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}]},
                {"role": "user", "content": "thanks"}
            ]
        }));
        let v = request(&r, "m").unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1]["content"][1]["image_url"]["url"], "data:image/png;base64,AAA");
        assert_eq!((&m[2]["content"], &m[2]["reasoning_content"]), (&json!("calling"), &json!("hm")));
        assert_eq!(
            m[2]["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        );
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}));
        assert_eq!(m[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(m.len(), 5);
        assert_eq!((&v["max_tokens"], &v["stop"], &v["top_k"]), (&json!(50), &json!(["END"]), &json!(3)));
        assert_eq!(
            (&v["tool_choice"], &v["tools"][0]["function"]["parameters"]),
            (&json!("required"), &json!({"type": "object"}))
        );
        assert_eq!(v["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(v["stream"], false);
        assert!(v.get("parallel_tool_calls").is_none(), "parallel calls stay allowed unless disabled");
        let one = req(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}));
        assert_eq!(request(&one, "m").unwrap()["parallel_tool_calls"], false);
    }

    #[test]
    fn bad_conversations_are_named() {
        let bad = |v: Value| request(&req(v), "m").unwrap_err().0;
        let base = json!({"model": "m", "max_tokens": 5, "messages": []});
        assert_eq!(bad(base.clone()), "messages: at least one message is required");
        let mut zero = base.clone();
        zero["max_tokens"] = json!(0);
        zero["messages"] = json!([{"role": "user", "content": "x"}]);
        assert_eq!(bad(zero), "max_tokens: must be at least 1");
        let mut sys = base.clone();
        sys["messages"] = json!([{"role": "system", "content": "x"}]);
        assert!(bad(sys).starts_with("messages.0.role: must be"));
        let mut choice = base;
        choice["messages"] = json!([{"role": "user", "content": "x"}]);
        choice["tool_choice"] = json!({"type": "sometimes"});
        assert!(bad(choice).starts_with("tool_choice.type"));
    }

    #[test]
    fn an_answer_has_thinking_text_and_tool_use_blocks_and_the_stop_reason() {
        let v = json!({"choices": [{"finish_reason": "tool_calls", "message": {"content": "ok", "reasoning_content": "hm",
            "tool_calls": [{"id": "call_9", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 4}});
        let r = response(&v, "m", "msg_1");
        assert_eq!(r.content.len(), 3);
        assert_eq!(
            r.content[2],
            ContentBlock::ToolUse { id: "call_9".into(), name: "f".into(), input: json!({"a": 1}) }
        );
        assert_eq!((r.stop_reason.as_deref(), r.usage.input_tokens, r.usage.output_tokens), (Some("tool_use"), 12, 4));
        let r = response(&json!({"choices": [{"finish_reason": "length", "message": {"content": ""}}]}), "m", "x");
        assert_eq!(
            (r.content, r.stop_reason.as_deref()),
            (vec![ContentBlock::Text { text: "".into() }], Some("max_tokens"))
        );
    }

    fn events(bytes: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8(bytes.to_vec())
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_string(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn the_stream_follows_anthropics_event_sequence() {
        let mut s = EventStream::new("m", "msg_1");
        let mut out = Vec::new();
        for chunk in [
            json!({"choices": [{"delta": {"role": "assistant", "content": null}}]}),
            json!({"choices": [{"delta": {"reasoning_content": "hm"}}]}),
            json!({"choices": [{"delta": {"content": "Hi"}}]}),
            json!({"choices": [{"delta": {"content": "!"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":1}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6}}),
        ] {
            out.extend(s.chunk(&chunk));
        }
        out.extend(s.end());
        let ev = events(&out);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[0].1["message"]["id"], "msg_1");
        assert_eq!(ev[3].1["delta"], json!({"type": "thinking_delta", "thinking": "hm"}));
        assert_eq!((&ev[5].1["index"], &ev[6].1["delta"]["text"]), (&json!(1), &json!("Hi")));
        assert_eq!(ev[9].1["content_block"], json!({"type": "tool_use", "id": "c1", "name": "f", "input": {}}));
        assert_eq!(ev[10].1["delta"], json!({"type": "input_json_delta", "partial_json": "{\"a\":1}"}));
        assert_eq!(ev[12].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[12].1["usage"], json!({"input_tokens": 9, "output_tokens": 6}));
        let err = events(&s.error("backend died"));
        assert_eq!(err[0].0, "error");
        assert_eq!(err[0].1["error"], json!({"type": "api_error", "message": "backend died"}));
        // A stream that says nothing still has one (empty) text block.
        let mut quiet = EventStream::new("m", "msg_2");
        let names: Vec<String> = events(&quiet.end()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["message_start", "ping", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
        );
    }

    #[test]
    fn cached_prompt_tokens_are_cache_reads_and_input_tokens_the_rest() {
        let v = json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 500, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 480}}});
        let r = response(&v, "m", "id");
        assert_eq!((r.usage.input_tokens, r.usage.cache_read_input_tokens), (20, Some(480)));
        // llama-server's timings say it too (a stream's last chunk), and a count past the
        // prompt is capped by it.
        let mut c = Counts::default();
        c.take(&json!({"timings": {"prompt_n": 1, "cache_n": 499, "predicted_n": 2}}));
        assert_eq!((usage(&c).input_tokens, usage(&c).cache_read_input_tokens), (1, Some(499)));
        let none = response(&json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}), "m", "id");
        assert_eq!(serde_json::to_value(&none.usage).unwrap(), json!({"input_tokens": 9, "output_tokens": 1}));
    }
}
