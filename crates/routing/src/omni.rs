//! `collection.omni` (Lemonade v11's omni models), the pure part: the tool table (one table,
//! the one `/models/{id}` lists and the web UI shows), which tools a collection's components
//! offer, the planner's system prompt and requests, the reading of its replies, the guard that
//! ends the loop, and the media as the answer embeds them. The caller (the server) sends the
//! requests and runs the tools on the components.
//!
//! Two ways to ask the planner for tool calls: `native` (v11's: OpenAI `tools`, for a model
//! whose chat template calls tools) and `json` (lemonade's, for a model whose template cannot:
//! the reply is constrained by a JSON schema to one tool call or a final answer).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::policy::PolicyError;

/// The tool table (Lemonade v11's `toolDefinitions.json` shape).
pub const TOOLS_JSON: &str = include_str!("omni_tools.json");
/// The most planner rounds one request takes; the last one must answer in text.
pub const MAX_ROUNDS: usize = 4;
/// A `json` planner reply's bound (tokens) when the request sets none.
pub const JSON_MAX_TOKENS: u64 = 384;

/// How the planner is asked for tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Native,
    Json,
}

/// An omni collection's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Omni {
    /// A template replacing the table's (`{tool_list}` and `{tool_guidance}` required).
    pub system_prompt: Option<String>,
    pub tool_format: ToolFormat,
}

impl Omni {
    /// Checks an omni definition's `system_prompt` and `tool_format`.
    pub fn parse(system_prompt: Option<&Value>, tool_format: Option<&Value>) -> Result<Omni, PolicyError> {
        let bad = |path: &str, m: String| Err(PolicyError { path: path.into(), message: m });
        let system_prompt = match system_prompt {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.contains("{tool_list}") && s.contains("{tool_guidance}") => Some(s.clone()),
            Some(Value::String(_)) => {
                return bad("system_prompt", "must contain the {tool_list} and {tool_guidance} placeholders".into())
            }
            Some(v) => return bad("system_prompt", format!("must be a string, got {v}")),
        };
        let tool_format = match tool_format.and_then(Value::as_str) {
            None if tool_format.is_none_or(Value::is_null) => ToolFormat::Native,
            Some("native") => ToolFormat::Native,
            Some("json") => ToolFormat::Json,
            _ => return bad("tool_format", format!("must be \"native\" or \"json\", got {}", tool_format.unwrap())),
        };
        Ok(Omni { system_prompt, tool_format })
    }
}

/// One tool of the table.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    /// A component with any of these labels runs it.
    pub requires: Vec<String>,
    pub guidance: Option<String>,
    /// The OpenAI function definition (`name`, `description`, `parameters`).
    pub function: Value,
}

/// The table: the default canvas, the default system prompt template, the tools.
#[derive(Debug)]
pub struct Table {
    pub image_size: String,
    pub system_prompt: String,
    pub tools: Vec<Tool>,
}

/// The tool table, read once.
pub fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let v: Value = serde_json::from_str(TOOLS_JSON).expect("omni_tools.json is JSON (a unit test reads it)");
        let tools = v["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| Tool {
                name: t["function"]["name"].as_str().unwrap_or_default().to_string(),
                requires: t["requires_labels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
                guidance: t["prompt_guidance"].as_str().map(str::to_string),
                function: t["function"].clone(),
            })
            .collect();
        Table {
            image_size: v["image_size"].as_str().unwrap_or("512x512").to_string(),
            system_prompt: v["system_prompt"].as_str().unwrap_or_default().to_string(),
            tools,
        }
    })
}

/// The tools `components` (name, labels) offer, each with the component that runs it (the
/// first one with a matching label), in the table's order.
pub fn offered(components: &[(String, Vec<String>)]) -> Vec<(&'static Tool, String)> {
    table()
        .tools
        .iter()
        .filter_map(|t| {
            let c = components.iter().find(|(_, labels)| labels.iter().any(|l| t.requires.contains(l)))?;
            Some((t, c.0.clone()))
        })
        .collect()
}

/// The planner's system prompt: the template with the tools listed and their guidance, and
/// for a `json` planner the reply contract.
pub fn system_prompt(o: &Omni, tools: &[&Tool]) -> String {
    let list: Vec<String> = tools
        .iter()
        .map(|t| format!("- {}: {}", t.name, t.function["description"].as_str().unwrap_or_default()))
        .collect();
    let guidance: String = tools.iter().filter_map(|t| t.guidance.as_deref()).map(|g| format!("\n\n{g}")).collect();
    let template = o.system_prompt.as_deref().unwrap_or(&table().system_prompt);
    let mut s = template
        .replace("{tool_list}", &list.join("\n"))
        .replace("{tool_guidance}", &guidance)
        .replace("{image_size}", &table().image_size);
    if o.tool_format == ToolFormat::Json {
        s.push_str(
            "\n\nReply with one JSON object only: {\"tool\": \"<tool name>\", \"with\": {<its arguments>}} to use a tool, \
             or {\"response\": \"<your answer>\"} to answer the user.",
        );
    }
    s
}

/// The conversation the planner sees: the omni system prompt before the client's (a client
/// system message is kept, after it), then the client's messages with their media as short
/// placeholders (the tools find the media in the client's messages; a planner reads text).
pub fn planner_messages(system: &str, client: &[Value]) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": system})];
    out.extend(client.iter().map(without_media));
    out
}

/// A message with its embedded media, image parts and audio parts as placeholders.
fn without_media(m: &Value) -> Value {
    let mut m = m.clone();
    let content = match &m["content"] {
        Value::String(s) => {
            let (text, media) = split_media(s);
            let notes = media.iter().map(|x| {
                if x.mime.starts_with("image/") {
                    "[an image was shown]"
                } else {
                    "[audio was played]"
                }
            });
            Value::from(
                [text]
                    .into_iter()
                    .chain(notes.map(str::to_string))
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        }
        Value::Array(parts) => Value::Array(
            parts
                .iter()
                .map(|p| match p["type"].as_str() {
                    Some("image_url") => json!({"type": "text", "text": "[the user sent an image]"}),
                    Some("input_audio") => json!({"type": "text", "text": "[the user sent audio]"}),
                    _ => p.clone(),
                })
                .collect(),
        ),
        _ => return m,
    };
    m["content"] = content;
    m
}

/// The request fields a client's body passes on to the planner.
const PASSED: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "chat_template_kwargs",
];

/// One planner request (never streamed): `messages`, the tools to offer, the client's own
/// `client_tools` and sampling fields from `body`; `text_only` asks for a final answer.
pub fn planner_request(
    model: &str,
    messages: &[Value],
    tools: &[&Tool],
    body: &Value,
    format: ToolFormat,
    text_only: bool,
) -> Value {
    let mut req = Map::new();
    for k in PASSED {
        if let Some(v) = body.get(*k) {
            req.insert((*k).into(), v.clone());
        }
    }
    req.insert("model".into(), model.into());
    req.insert("messages".into(), Value::Array(messages.to_vec()));
    req.insert("stream".into(), false.into());
    let client_tools: Vec<Value> = body["tools"].as_array().cloned().unwrap_or_default();
    match format {
        ToolFormat::Native => {
            let mut all: Vec<Value> =
                tools.iter().map(|t| json!({"type": "function", "function": t.function})).collect();
            all.extend(client_tools);
            if !all.is_empty() {
                req.insert("tools".into(), Value::Array(all));
                req.insert("tool_choice".into(), if text_only { "none" } else { "auto" }.into());
            }
        }
        ToolFormat::Json => {
            let schema = step_schema(tools, &client_tools, text_only);
            req.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "step", "schema": schema}}),
            );
            if !req.contains_key("max_tokens") && !req.contains_key("max_completion_tokens") {
                req.insert("max_tokens".into(), JSON_MAX_TOKENS.into());
            }
        }
    }
    Value::Object(req)
}

/// A `json` planner's reply schema: one call of one of the tools, `{"tool": name, "with":
/// arguments}` (the arguments as the tool declares them), or `{"response": text}`; only the
/// latter when `text_only`.
pub fn step_schema(tools: &[&Tool], client_tools: &[Value], text_only: bool) -> Value {
    let answer = json!({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]});
    if text_only {
        return answer;
    }
    let functions = tools.iter().map(|t| &t.function).chain(client_tools.iter().map(|t| &t["function"]));
    let mut any: Vec<Value> = functions
        .filter(|f| f["name"].is_string())
        .map(|f| {
            let params = if f["parameters"].is_object() { f["parameters"].clone() } else { json!({"type": "object"}) };
            // `tool` before `with`: a grammar writes properties in the schema's order, which
            // serde_json sorts, and the planner must pick the tool before writing its arguments.
            json!({"type": "object", "properties": {"tool": {"const": f["name"]}, "with": params}, "required": ["tool", "with"]})
        })
        .collect();
    any.push(answer);
    json!({"anyOf": any})
}

/// Why a tool failed, or arguments that are no JSON object: a message told as it is (to the
/// planner, or to the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure(s)
    }
}

impl From<&str> for Failure {
    fn from(s: &str) -> Failure {
        Failure(s.to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tool call the planner made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments (an object), or the text the planner wrote when it was not one.
    pub arguments: Result<Map<String, Value>, Failure>,
}

impl Call {
    fn arguments_text(&self) -> String {
        match &self.arguments {
            Ok(m) => Value::Object(m.clone()).to_string(),
            Err(raw) => raw.0.clone(),
        }
    }
}

/// What the planner answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Tool calls (with any text it wrote beside them).
    Calls { content: String, calls: Vec<Call> },
    /// The final answer.
    Text(String),
}

/// Reads a planner's chat completion.
pub fn parse_step(reply: &Value, format: ToolFormat, round: usize) -> Step {
    let message = &reply["choices"][0]["message"];
    let content = message["content"].as_str().unwrap_or_default().to_string();
    let calls: Vec<Call> = match format {
        ToolFormat::Native => message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| {
                let raw = c["function"]["arguments"].clone();
                let arguments = match &raw {
                    Value::String(s) => match serde_json::from_str::<Value>(s) {
                        Ok(Value::Object(m)) => Ok(m),
                        _ => Err(s.clone().into()),
                    },
                    Value::Object(m) => Ok(m.clone()),
                    other => Err(other.to_string().into()),
                };
                let id = c["id"].as_str().map_or_else(|| format!("call_{round}_{i}"), str::to_string);
                Call { id, name: c["function"]["name"].as_str().unwrap_or_default().to_string(), arguments }
            })
            .collect(),
        ToolFormat::Json => match serde_json::from_str::<Value>(content.trim()) {
            Ok(v) if v["response"].is_string() => return Step::Text(v["response"].as_str().unwrap_or_default().into()),
            Ok(v) if v["tool"].is_string() => {
                let arguments = match &v["with"] {
                    Value::Object(m) => Ok(m.clone()),
                    Value::Null => Ok(Map::new()),
                    other => Err(other.to_string().into()),
                };
                let name = v["tool"].as_str().unwrap_or_default().to_string();
                return Step::Calls {
                    content: String::new(),
                    calls: vec![Call { id: format!("call_{round}_0"), name, arguments }],
                };
            }
            Err(_) => match serde_json::from_str::<Value>(&format!("{}\"}}", content.trim())) {
                // A reply cut off by max_tokens inside its answer: the answer so far.
                Ok(v) if v["response"].is_string() => {
                    return Step::Text(v["response"].as_str().unwrap_or_default().into());
                }
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
    };
    if calls.is_empty() {
        return Step::Text(content);
    }
    Step::Calls { content, calls }
}

/// The conversation after a round of `calls` with their `results` (one per call, in order).
pub fn after_calls(messages: &mut Vec<Value>, format: ToolFormat, content: &str, calls: &[Call], results: &[Value]) {
    match format {
        ToolFormat::Native => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_text()}}))
                .collect();
            messages.push(json!({"role": "assistant", "content": content, "tool_calls": tool_calls}));
            for (c, r) in calls.iter().zip(results) {
                messages.push(json!({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r.to_string()}));
            }
        }
        ToolFormat::Json => {
            for (c, r) in calls.iter().zip(results) {
                let call = json!({"tool": c.name, "with": c.arguments.clone().unwrap_or_default()});
                messages.push(json!({"role": "assistant", "content": call.to_string()}));
                messages.push(json!({"role": "user", "content": format!(
                    "Tool result of {}: {r}\nNow answer the user with {{\"response\": \"...\"}}, or call another tool.", c.name)}));
            }
        }
    }
}

/// What a tool that worked tells the planner.
pub fn tool_ok(fields: Value) -> Value {
    let mut v = json!({"status": "ok"});
    if let (Some(o), Value::Object(f)) = (v.as_object_mut(), fields) {
        o.extend(f);
    }
    v
}

/// What a tool that failed tells the planner (the request goes on).
pub fn tool_error(message: &str) -> Value {
    json!({"status": "error", "error": message})
}

/// Ends the loop: a call made before is not run again (a small planner repeats itself), and
/// once a round brings nothing new, or the rounds run out, the planner must answer in text.
#[derive(Debug, Default)]
pub struct Guard {
    seen: BTreeSet<String>,
    rounds: usize,
    stalled: bool,
}

impl Guard {
    /// Counts a round of `calls`; returns whether each is new (to be run).
    pub fn round(&mut self, calls: &[Call]) -> Vec<bool> {
        self.rounds += 1;
        let fresh: Vec<bool> =
            calls.iter().map(|c| self.seen.insert(format!("{}{}", c.name, c.arguments_text()))).collect();
        self.stalled = !fresh.contains(&true);
        fresh
    }

    /// Whether the next planner request must ask for the final answer.
    pub fn text_only(&self) -> bool {
        self.stalled || self.rounds + 1 >= MAX_ROUNDS
    }

    /// Rounds so far.
    pub fn rounds(&self) -> usize {
        self.rounds
    }
}

/// An image as the answer embeds it (v11: a markdown image with a data URI).
pub fn image_markdown(png_base64: &str) -> String {
    format!("![generated image](data:image/png;base64,{png_base64})")
}

/// Speech as the answer embeds it (v11: an `<audio>` tag around a data URI).
pub fn audio_tag(mime: &str, base64: &str) -> String {
    format!("<audio>data:{mime};base64,{base64}</audio>")
}

/// The most recent image in `messages`: an `image_url` part with a data URI, or an image an
/// earlier answer embedded. Returns the base64 data.
pub fn latest_image(messages: &[Value]) -> Option<String> {
    messages.iter().rev().find_map(|m| {
        let parts: Vec<String> = match &m["content"] {
            Value::String(s) => s
                .split("](data:image/")
                .skip(1)
                .filter_map(|r| Some(r.split_once(";base64,")?.1.split(')').next()?.to_string()))
                .collect(),
            Value::Array(a) => a
                .iter()
                .filter_map(|p| Some(p["image_url"]["url"].as_str()?.split_once(";base64,")?.1.to_string()))
                .collect(),
            _ => Vec::new(),
        };
        parts.into_iter().last()
    })
}

/// The most recent audio the user sent (an `input_audio` part): its format and base64 data.
pub fn latest_audio(messages: &[Value]) -> Option<(String, String)> {
    messages.iter().rev().filter(|m| m["role"] == "user").find_map(|m| {
        m["content"].as_array()?.iter().rev().find_map(|p| {
            let a = &p["input_audio"];
            Some((a["format"].as_str().unwrap_or("wav").to_string(), a["data"].as_str()?.to_string()))
        })
    })
}

/// A medium an answer embeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Medium {
    pub mime: String,
    pub base64: String,
}

/// An omni answer's content split into its text (the media taken out) and its media, in the
/// order they appear.
pub fn split_media(content: &str) -> (String, Vec<Medium>) {
    let mut text = String::new();
    let mut media = Vec::new();
    let mut rest = content;
    loop {
        let image = rest.find("![generated image](data:").map(|i| (i, "![generated image](data:", ")"));
        let audio = rest.find("<audio>data:").map(|i| (i, "<audio>data:", "</audio>"));
        let Some((at, open, close)) = [image, audio].into_iter().flatten().min_by_key(|(i, _, _)| *i) else { break };
        let body = &rest[at + open.len()..];
        let Some(end) = body.find(close) else { break };
        let Some((mime, data)) = body[..end].split_once(";base64,") else { break };
        text.push_str(&rest[..at]);
        media.push(Medium { mime: mime.to_string(), base64: data.to_string() });
        rest = &body[end + close.len()..];
    }
    text.push_str(rest);
    let text = text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()).collect::<Vec<_>>().join("\n\n");
    (text, media)
}

/// A streamed WAV (its RIFF and data sizes left open, as Kokoro writes them while it speaks)
/// with both sizes set from the whole bytes, so a player knows its length. Other bytes are
/// left as they are.
pub fn seal_wav(wav: &mut [u8]) {
    if wav.len() < 12 || &wav[..4] != b"RIFF" || &wav[8..12] != b"WAVE" {
        return;
    }
    let riff = u32::try_from(wav.len() - 8).unwrap_or(u32::MAX);
    wav[4..8].copy_from_slice(&riff.to_le_bytes());
    let mut at = 12;
    while at + 8 <= wav.len() {
        let len = u32::from_le_bytes([wav[at + 4], wav[at + 5], wav[at + 6], wav[at + 7]]) as usize;
        if &wav[at..at + 4] == b"data" {
            let data = u32::try_from(wav.len() - at - 8).unwrap_or(u32::MAX);
            wav[at + 4..at + 8].copy_from_slice(&data.to_le_bytes());
            return;
        }
        at = at.saturating_add(8).saturating_add(len + (len & 1));
    }
}
