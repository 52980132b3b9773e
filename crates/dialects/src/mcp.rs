//! The Model Context Protocol as Lemonade v11's MCP gateway speaks it (`POST /mcp`, the
//! Streamable HTTP transport, JSON-RPC 2.0, the `tools` capability only): messages parsed with
//! JSON-RPC's error codes, the protocol version negotiated, the tool table (one table, the one
//! `tools/list` shows), a tool's arguments turned into the OpenAI request lemonade serves and
//! its answer into MCP content. Pure: the server runs the tools.

use serde_json::{json, Map, Value};

/// The handshake protocol versions this gateway speaks, oldest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The version answered to a client that asks for one not listed.
pub const DEFAULT_VERSION: &str = "2025-06-18";

/// JSON-RPC's error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// A JSON-RPC error: its code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }
}

/// One JSON-RPC message from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request: it gets an answer with its `id`.
    Request { id: Value, method: String, params: Value },
    /// A notification (no `id`): no answer. Answers the client sends (to requests this server
    /// never makes) are taken as notifications too.
    Notification { method: String },
}

/// Reads one message; an error comes with the `id` to answer it under (`null` when unknown).
pub fn parse(v: &Value) -> Result<Message, (Value, RpcError)> {
    let Some(o) = v.as_object() else {
        return Err((Value::Null, RpcError::new(INVALID_REQUEST, "a JSON-RPC message must be an object")));
    };
    let id = o.get("id").cloned();
    let bad = |m: &str| (id.clone().unwrap_or(Value::Null), RpcError::new(INVALID_REQUEST, m));
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(bad("\"jsonrpc\" must be \"2.0\""));
    }
    if let Some(i) = &id {
        if !(i.is_string() || i.is_i64() || i.is_u64()) {
            return Err((Value::Null, RpcError::new(INVALID_REQUEST, "\"id\" must be a string or an integer")));
        }
    }
    let Some(method) = o.get("method").and_then(Value::as_str) else {
        if o.contains_key("result") || o.contains_key("error") {
            return Ok(Message::Notification { method: String::new() });
        }
        return Err(bad("\"method\" is required and must be a string"));
    };
    let params = o.get("params").cloned().unwrap_or(Value::Null);
    if !(params.is_null() || params.is_object()) {
        return Err((id.unwrap_or(Value::Null), RpcError::new(INVALID_PARAMS, "\"params\" must be an object")));
    }
    Ok(match id {
        Some(id) => Message::Request { id, method: method.to_string(), params },
        None => Message::Notification { method: method.to_string() },
    })
}

/// A successful answer.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error answer.
pub fn error(id: &Value, e: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})
}

/// The `initialize` result: the client's version when this gateway speaks it, else
/// [`DEFAULT_VERSION`]; tools only.
pub fn initialize(params: &Value, version: &str) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let agreed = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(DEFAULT_VERSION);
    json!({
        "protocolVersion": agreed,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "lemonade", "version": version},
        "instructions": "Lemonade serves local models. Call lemonade_list_models first to learn the exact model names."
    })
}

/// The tools: name, description, input schema (the one table `tools/list` shows).
pub fn tools() -> Value {
    json!([
        {
            "name": "lemonade_list_models",
            "description": "What is loaded, what is downloaded, and what could be pulled. Call this first if you do not know the exact model name the other tools need.",
            "inputSchema": {"type": "object", "properties": {
                "include_available": {"type": "boolean", "description": "List the downloaded models (default true)."},
                "include_suggested": {"type": "boolean", "description": "List models that could be pulled (default true)."}
            }}
        },
        {
            "name": "lemonade_chat",
            "description": "A chat completion from any LLM (or router collection) here; the model loads on first use.",
            "inputSchema": {"type": "object", "required": ["model", "messages"], "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object"}},
                "max_tokens": {"type": "integer", "minimum": 1},
                "temperature": {"type": "number"},
                "tools": {"type": "array", "items": {"type": "object"}},
                "tool_choice": {},
                "chat_template_kwargs": {"type": "object", "description": "Thinking is off unless {\"enable_thinking\": true}."}
            }}
        },
        {
            "name": "lemonade_transcribe_audio",
            "description": "The speech in an audio file (WAV, MP3, FLAC or Ogg Vorbis), with a Whisper model. Prefer audio_path (the server runs on this machine).",
            "inputSchema": {"type": "object", "required": ["model"], "properties": {
                "model": {"type": "string"},
                "audio_path": {"type": "string"},
                "audio_base64": {"type": "string"},
                "language": {"type": "string"},
                "response_format": {"type": "string", "enum": ["json", "text", "verbose_json", "srt", "vtt"]}
            }}
        },
        {
            "name": "lemonade_generate_image",
            "description": "PNG images from a prompt. Prefer output_path or output_dir (written under the server's MCP image folder): inline images cost many tokens.",
            "inputSchema": {"type": "object", "required": ["model", "prompt"], "properties": {
                "model": {"type": "string"},
                "prompt": {"type": "string"},
                "size": {"type": "string", "description": "WIDTHxHEIGHT, e.g. 512x512"},
                "n": {"type": "integer", "minimum": 1, "maximum": 4},
                "steps": {"type": "integer", "minimum": 1},
                "output_path": {"type": "string"},
                "output_dir": {"type": "string"}
            }}
        },
        {
            "name": "lemonade_omni",
            "description": "One turn with an omni model (collection.omni): its planner calls the image and speech models as tools; the answer is its text plus each image and audio it made. Prefer output_dir (written under the server's MCP image folder). model defaults to the first omni model listed.",
            "inputSchema": {"type": "object", "required": ["messages"], "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object"}},
                "max_tokens": {"type": "integer", "minimum": 1},
                "temperature": {"type": "number"},
                "tools": {"type": "array", "items": {"type": "object"}},
                "tool_choice": {},
                "output_dir": {"type": "string"}
            }}
        }
    ])
}

/// Why a tool failed (its message goes back to the model as an `isError` result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError(pub String);

impl From<String> for ToolError {
    fn from(s: String) -> ToolError {
        ToolError(s)
    }
}

impl From<&str> for ToolError {
    fn from(s: &str) -> ToolError {
        ToolError(s.to_string())
    }
}

/// A tool's answer: text blocks (and others), `isError` when it failed.
pub fn tool_result(content: Vec<Value>, is_error: bool) -> Value {
    json!({"content": content, "isError": is_error})
}

/// A text content block.
pub fn text(t: impl Into<String>) -> Value {
    json!({"type": "text", "text": t.into()})
}

/// A tool failure, as MCP wants it: a result with `isError`, so the model can correct itself.
pub fn tool_error(message: impl Into<String>) -> Value {
    tool_result(vec![text(message)], true)
}

/// A string argument, required or not; the message names it.
pub fn string_arg<'a>(args: &'a Map<String, Value>, name: &str, required: bool) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) if required => Err(format!("'{name}' is required").into()),
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if required && s.is_empty() => Err(format!("'{name}' must not be empty").into()),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("'{name}' must be a string, got {v}").into()),
    }
}

/// `lemonade_chat`'s arguments as an OpenAI chat request (not streamed; thinking off unless
/// asked for).
pub fn chat_request(args: &Map<String, Value>) -> Result<Value, ToolError> {
    let model = string_arg(args, "model", true)?.unwrap_or_default();
    let messages = match args.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m.clone(),
        Some(Value::Array(_)) => return Err("'messages' must not be empty".into()),
        Some(v) => return Err(format!("'messages' must be an array of messages, got {v}").into()),
        None => return Err("'messages' is required".into()),
    };
    let mut body = json!({"model": model, "messages": messages, "stream": false,
                          "chat_template_kwargs": {"enable_thinking": false}});
    for (k, check) in [
        ("max_tokens", Value::is_u64 as fn(&Value) -> bool),
        ("temperature", Value::is_number),
        ("tools", Value::is_array),
        ("tool_choice", |_: &Value| true),
        ("chat_template_kwargs", Value::is_object),
    ] {
        match args.get(k) {
            Some(v) if check(v) => body[k] = v.clone(),
            Some(Value::Null) | None => {}
            Some(v) => return Err(format!("'{k}' has the wrong type: {v}").into()),
        }
    }
    Ok(body)
}

/// A chat completion as `lemonade_chat`'s result: the assistant's text, then its tool calls.
pub fn chat_result(answer: &Value) -> Value {
    let message = &answer["choices"][0]["message"];
    let mut content = vec![text(message["content"].as_str().unwrap_or_default())];
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        content.push(text(format!("tool_calls: {}", Value::Array(calls.clone()))));
    }
    tool_result(content, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_read_with_json_rpc_codes() {
        let req = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"});
        assert_eq!(
            parse(&req),
            Ok(Message::Request { id: json!(7), method: "tools/list".into(), params: Value::Null })
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(parse(&note), Ok(Message::Notification { method: "notifications/initialized".into() }));
        let code = |v: Value| parse(&v).unwrap_err().1.code;
        assert_eq!(code(json!([])), INVALID_REQUEST);
        assert_eq!(code(json!({"id": 1, "method": "ping"})), INVALID_REQUEST);
        assert_eq!(code(json!({"jsonrpc": "2.0", "id": 1})), INVALID_REQUEST);
        assert_eq!(code(json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"})), INVALID_REQUEST);
        assert_eq!(code(json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]})), INVALID_PARAMS);
        assert_eq!(parse(&json!({"jsonrpc": "2.0", "id": "x", "method": 3})).unwrap_err().0, json!("x"));
    }

    #[test]
    fn the_version_is_the_clients_when_spoken() {
        assert_eq!(initialize(&json!({"protocolVersion": "2025-03-26"}), "1")["protocolVersion"], "2025-03-26");
        assert_eq!(initialize(&json!({"protocolVersion": "2099-01-01"}), "1")["protocolVersion"], DEFAULT_VERSION);
        assert_eq!(initialize(&Value::Null, "1")["capabilities"], json!({"tools": {"listChanged": false}}));
    }

    #[test]
    fn chat_arguments_become_an_openai_request_and_the_answer_text() {
        let args = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        let body = chat_request(args.as_object().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false, "max_tokens": 4,
                   "chat_template_kwargs": {"enable_thinking": false}})
        );
        for (bad, says) in [
            (json!({"messages": []}), "'model' is required"),
            (json!({"model": "m"}), "'messages' is required"),
            (json!({"model": "m", "messages": "hi"}), "'messages' must be an array"),
            (json!({"model": "m", "messages": [{}], "max_tokens": "many"}), "'max_tokens' has the wrong type"),
        ] {
            assert!(chat_request(bad.as_object().unwrap()).unwrap_err().0.starts_with(says), "{bad}");
        }
        let answer = json!({"choices": [{"message": {"content": "Paris", "tool_calls": [{"id": "c"}]}}]});
        assert_eq!(
            chat_result(&answer),
            json!({"content": [{"type": "text", "text": "Paris"}, {"type": "text", "text": "tool_calls: [{\"id\":\"c\"}]"}], "isError": false})
        );
        let table = tools();
        let names: Vec<&str> = table.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "lemonade_list_models",
                "lemonade_chat",
                "lemonade_transcribe_audio",
                "lemonade_generate_image",
                "lemonade_omni"
            ]
        );
    }
}
