//! `collection.omni` (Lemonade v11's omni models), the pure part: the tool table (one table,
//! the one `/models/{id}` lists and the web UI shows), which tools a collection's components
//! offer, the planner's system prompt and requests, the reading of its replies, the guard that
//! ends the loop, and the media as the answer embeds them; and the loop itself as a sans-IO
//! machine ([`Loop`]): it says what to do next ([`Action`]: ask the planner, run a tool, done)
//! and is told what came of it. The engine drives it, sending the requests and running the
//! tools on the components.
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

impl ToolFormat {
    /// The name `tool_format` is stored and shown under.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Native => "native",
            ToolFormat::Json => "json",
        }
    }
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
    // As chat/completions reads it for a client: `max_completion_tokens` when no `max_tokens`.
    if let (None, Some(m)) = (req.get("max_tokens"), req.get("max_completion_tokens").cloned()) {
        req.insert("max_tokens".into(), m);
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

/// How the loop ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The planner's answer.
    Text(String),
    /// The planner called tools of the client's: they go back to the client (finish_reason
    /// `tool_calls`), as v11 does.
    ClientCalls(String, Vec<Call>),
}

/// A tool to run on its component.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRun {
    pub tool: String,
    pub component: String,
    pub arguments: Map<String, Value>,
    /// The most recent image: one made in this request, else one in the conversation.
    pub image: Option<String>,
    /// The most recent audio the user sent: its format and base64 data.
    pub audio: Option<(String, String)>,
}

/// What a tool that ran came to: what it tells the planner and the medium it made (embedded in
/// the answer), or why it failed.
pub type ToolOutcome = Result<(Value, Option<String>), Failure>;

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this chat request to the planner; report its answer with [`Loop::planned`].
    Ask(Value),
    /// Run this tool; report what came of it with [`Loop::ran`].
    Run(ToolRun),
    /// The loop ended.
    Done(End),
}

/// The round being run: the planner's calls and what each came to so far.
#[derive(Debug)]
struct Round {
    content: String,
    calls: Vec<Call>,
    fresh: Vec<bool>,
    results: Vec<Value>,
}

/// One omni request's tool loop, sans-IO.
#[derive(Debug)]
pub struct Loop {
    omni: Omni,
    planner: String,
    tools: Vec<(&'static Tool, String)>,
    body: Value,
    /// The client's messages (where the tools find the media it sent).
    client: Vec<Value>,
    /// What the planner sees.
    messages: Vec<Value>,
    guard: Guard,
    round: Option<Round>,
    /// The media made so far, as the answer embeds them.
    media: Vec<String>,
    /// Each tool call with its outcome (`x_lemonade_omni`).
    trace: Vec<Value>,
}

impl Loop {
    /// A loop for the client's chat request `body`, planned by `planner` with `tools` (each
    /// with the component that runs it).
    pub fn new(omni: &Omni, planner: &str, tools: Vec<(&'static Tool, String)>, body: Value) -> Loop {
        let offered: Vec<&Tool> = tools.iter().map(|(t, _)| *t).collect();
        let client = body["messages"].as_array().cloned().unwrap_or_default();
        let messages = planner_messages(&system_prompt(omni, &offered), &client);
        Loop {
            omni: omni.clone(),
            planner: planner.to_string(),
            tools,
            body,
            client,
            messages,
            guard: Guard::default(),
            round: None,
            media: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// The first action: the first planner request.
    pub fn start(&self) -> Action {
        Action::Ask(self.ask())
    }

    fn ask(&self) -> Value {
        let offered: Vec<&Tool> = self.tools.iter().map(|(t, _)| *t).collect();
        let text_only = self.guard.text_only();
        planner_request(&self.planner, &self.messages, &offered, &self.body, self.omni.tool_format, text_only)
    }

    /// The planner answered `reply` (its chat completion).
    pub fn planned(&mut self, reply: &Value) -> Action {
        let forced = self.guard.text_only();
        let (content, calls) = match parse_step(reply, self.omni.tool_format, self.guard.rounds()) {
            Step::Text(t) => return Action::Done(End::Text(t)),
            Step::Calls { content, .. } if forced => return Action::Done(End::Text(content)),
            Step::Calls { content, calls } => (content, calls),
        };
        let client: Vec<Call> = calls.iter().filter(|c| self.tool(&c.name).is_none()).cloned().collect();
        if !client.is_empty() {
            return Action::Done(End::ClientCalls(content, client));
        }
        let fresh = self.guard.round(&calls);
        self.round = Some(Round { content, calls, fresh, results: Vec::new() });
        self.next()
    }

    /// The tool [`Action::Run`] named came to `outcome`.
    pub fn ran(&mut self, outcome: ToolOutcome) -> Action {
        let Some(round) = &self.round else { return self.next() };
        let call = round.calls[round.results.len()].clone();
        self.record(&call, outcome);
        self.next()
    }

    /// The next call of the round (answered in place when it cannot run), or the next planner
    /// request once every call has its result.
    fn next(&mut self) -> Action {
        loop {
            let Some(round) = &self.round else { return Action::Ask(self.ask()) };
            let i = round.results.len();
            if i == round.calls.len() {
                let round = self.round.take().expect("a round");
                after_calls(&mut self.messages, self.omni.tool_format, &round.content, &round.calls, &round.results);
                return Action::Ask(self.ask());
            }
            let call = round.calls[i].clone();
            if !round.fresh[i] {
                self.push_result(tool_error("already done: do not repeat it"));
                continue;
            }
            match &call.arguments {
                Err(raw) => {
                    let e = Failure(format!("the arguments are not a JSON object: {raw}"));
                    self.record(&call, Err(e));
                }
                Ok(args) => {
                    return Action::Run(ToolRun {
                        tool: call.name.clone(),
                        component: self.tool(&call.name).map(|(_, c)| c.clone()).unwrap_or_default(),
                        arguments: args.clone(),
                        image: self.latest_image(),
                        audio: latest_audio(&self.client),
                    })
                }
            }
        }
    }

    fn push_result(&mut self, v: Value) {
        if let Some(r) = &mut self.round {
            r.results.push(v);
        }
    }

    /// Records what `call` came to: its result for the planner, its medium, its trace entry.
    fn record(&mut self, call: &Call, outcome: ToolOutcome) {
        let component = self.tool(&call.name).map(|(_, c)| c.clone()).unwrap_or_default();
        let args = call.arguments.clone().map_or_else(|e| Value::String(e.0), Value::Object);
        let (result, error) = match outcome {
            Ok((fields, medium)) => {
                self.media.extend(medium);
                (tool_ok(fields), Value::Null)
            }
            Err(e) => (tool_error(&e.0), Value::from(e.0)),
        };
        self.trace.push(json!({"name": call.name, "arguments": args, "component": component, "error": error}));
        self.push_result(result);
    }

    fn tool(&self, name: &str) -> Option<&(&'static Tool, String)> {
        self.tools.iter().find(|(t, _)| t.name == name)
    }

    fn latest_image(&self) -> Option<String> {
        let made = self.media.iter().rev().map(|m| json!({"content": m})).collect::<Vec<_>>();
        latest_image(&made).or_else(|| latest_image(&self.client))
    }

    /// The media made so far, as the answer embeds them.
    pub fn media(&self) -> &[String] {
        &self.media
    }

    /// The planner's name.
    pub fn planner(&self) -> &str {
        &self.planner
    }

    /// `x_lemonade_omni`: the planner, the tool format and each tool call with its outcome.
    pub fn trace(&self) -> Value {
        json!({"planner": self.planner, "tool_format": self.omni.tool_format.name(), "tool_calls": self.trace})
    }

    /// The whole answer as one OpenAI chat completion of `model`, made at `created` (Unix s),
    /// the media after the text, the loop's trace in `x_lemonade_omni`.
    pub fn completion(&self, end: &End, model: &str, created: u64) -> Value {
        let (message, finish) = self.message(end, true);
        json!({"id": format!("chatcmpl-omni-{created}"), "object": "chat.completion", "created": created,
               "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "x_lemonade_omni": self.trace()})
    }

    /// A stream's last events: the text (the media went out as their tools finished), then the
    /// finish with the trace.
    pub fn last_events(&self, end: &End, id: &str, model: &str, created: u64) -> String {
        let (mut message, finish) = self.message(end, false);
        if let Some(o) = message.as_object_mut() {
            o.remove("role");
        }
        chunk_event(id, model, created, message, None, None)
            + &chunk_event(id, model, created, json!({}), Some(finish), Some(self.trace()))
    }

    /// The assistant message `end` makes (the media after the text when `with_media`), and its
    /// finish reason.
    pub fn message(&self, end: &End, with_media: bool) -> (Value, &'static str) {
        let media = if with_media { self.media.join("\n\n") } else { String::new() };
        let join = |t: &str| {
            [t.trim(), media.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join("\n\n")
        };
        match end {
            End::Text(t) => (json!({"role": "assistant", "content": join(t)}), "stop"),
            End::ClientCalls(content, calls) => {
                let mut m = vec![];
                after_calls(&mut m, ToolFormat::Native, &join(content), calls, &[]);
                (m.remove(0), "tool_calls")
            }
        }
    }
}

/// One OpenAI chat completion chunk as an SSE event (`trace`: the loop's, on the last one).
pub fn chunk_event(
    id: &str,
    model: &str,
    created: u64,
    delta: Value,
    finish: Option<&str>,
    trace: Option<Value>,
) -> String {
    let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    if let Some(t) = trace {
        c["x_lemonade_omni"] = t;
    }
    format!("data: {c}\n\n")
}

#[cfg(test)]
mod loop_tests {
    use super::*;

    fn omni_loop(format: ToolFormat) -> Loop {
        let components =
            [("sd".to_string(), vec!["image".to_string(), "edit".into()]), ("kokoro".into(), vec!["tts".into()])];
        let o = Omni { system_prompt: None, tool_format: format };
        let body = json!({"messages": [{"role": "user", "content": "draw a cat"}], "max_completion_tokens": 50,
                          "tools": [{"type": "function", "function": {"name": "client_fn", "parameters": {}}}]});
        Loop::new(&o, "planner", offered(&components), body)
    }

    fn calls(calls: &[(&str, Value)]) -> Value {
        let tc: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (n, a))| json!({"id": format!("c{i}"), "function": {"name": n, "arguments": a.to_string()}}))
            .collect();
        json!({"choices": [{"message": {"content": "", "tool_calls": tc}}]})
    }

    fn text(t: &str) -> Value {
        json!({"choices": [{"message": {"content": t}}]})
    }

    #[test]
    fn a_tool_call_runs_on_its_component_its_result_goes_back_and_the_answer_embeds_the_medium() {
        let mut l = omni_loop(ToolFormat::Native);
        let Action::Ask(first) = l.start() else { panic!("asks first") };
        assert_eq!(first["max_tokens"], 50, "max_completion_tokens read as chat/completions reads it");
        assert_eq!(first["tool_choice"], "auto");
        let Action::Run(run) = l.planned(&calls(&[("generate_image", json!({"prompt": "a cat"}))])) else {
            panic!("runs the tool")
        };
        assert_eq!((run.tool.as_str(), run.component.as_str()), ("generate_image", "sd"));
        assert_eq!(run.arguments["prompt"], "a cat");
        let Action::Ask(second) = l.ran(Ok((json!({"image": "shown"}), Some(image_markdown("UE5H"))))) else {
            panic!("asks again")
        };
        let last = second["messages"].as_array().unwrap().last().unwrap().clone();
        assert_eq!((last["role"].as_str(), last["name"].as_str()), (Some("tool"), Some("generate_image")));
        assert!(last["content"].as_str().unwrap().contains("\"status\":\"ok\""), "{last}");
        let Action::Done(end) = l.planned(&text("Here is your cat.")) else { panic!("done") };
        let (message, finish) = l.message(&end, true);
        assert_eq!(finish, "stop");
        assert_eq!(message["content"], format!("Here is your cat.\n\n{}", image_markdown("UE5H")));
        assert_eq!(l.trace()["tool_calls"][0]["component"], "sd");
        // A later edit finds the image made in this request.
        let Action::Run(edit) = l.planned(&calls(&[("edit_image", json!({"prompt": "blue"}))])) else { panic!() };
        assert_eq!(edit.image.as_deref(), Some("UE5H"));
    }

    #[test]
    fn a_repeated_call_is_not_run_again_and_a_stalled_round_asks_for_text() {
        let mut l = omni_loop(ToolFormat::Native);
        let speak = calls(&[("text_to_speech", json!({"input": "hi"}))]);
        assert!(matches!(l.planned(&speak), Action::Run(_)));
        assert!(matches!(l.ran(Ok((json!({}), None))), Action::Ask(_)));
        // The same call again: answered without running, and the next request wants text.
        let Action::Ask(req) = l.planned(&speak) else { panic!("not run again") };
        let last = req["messages"].as_array().unwrap().last().unwrap().clone();
        assert!(last["content"].as_str().unwrap().contains("already done"), "{last}");
        assert_eq!(req["tool_choice"], "none");
        // Tool calls when text was demanded end the loop with the text written.
        let Action::Done(End::Text(t)) = l.planned(&speak) else { panic!("forced text") };
        assert_eq!(t, "");
    }

    #[test]
    fn bad_arguments_and_failures_tell_the_planner_and_client_tools_go_back_to_the_client() {
        let mut l = omni_loop(ToolFormat::Native);
        let bad = json!({"choices": [{"message": {"content": "", "tool_calls": [
            {"id": "x", "function": {"name": "generate_image", "arguments": "not json"}}]}}]});
        let Action::Ask(req) = l.planned(&bad) else { panic!("no run for bad arguments") };
        let told = req["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
        assert!(told.contains("not a JSON object"), "{told}");
        assert!(l.trace()["tool_calls"][0]["error"].as_str().unwrap().contains("not a JSON object"));
        assert!(matches!(l.planned(&calls(&[("generate_image", json!({"prompt": "x"}))])), Action::Run(_)));
        let Action::Ask(req) = l.ran(Err(Failure("the image model is down".into()))) else { panic!() };
        let told = req["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
        assert!(told.contains("the image model is down") && told.contains("\"status\":\"error\""), "{told}");
        assert!(l.media().is_empty());
        let Action::Done(end @ End::ClientCalls(..)) = l.planned(&calls(&[("client_fn", json!({}))])) else {
            panic!("the client's own tool goes back to it")
        };
        let (message, finish) = l.message(&end, false);
        assert_eq!((finish, message["tool_calls"][0]["function"]["name"].as_str()), ("tool_calls", Some("client_fn")));
    }

    #[test]
    fn a_json_planner_is_asked_for_one_call_or_an_answer_and_the_rounds_are_bounded() {
        let mut l = omni_loop(ToolFormat::Json);
        let Action::Ask(first) = l.start() else { panic!() };
        assert_eq!(first["response_format"]["type"], "json_schema");
        for round in 0..MAX_ROUNDS - 1 {
            let reply = text(&json!({"tool": "text_to_speech", "with": {"input": format!("say {round}")}}).to_string());
            assert!(matches!(l.planned(&reply), Action::Run(_)), "round {round}");
            let Action::Ask(next) = l.ran(Ok((json!({}), None))) else { panic!() };
            if round + 2 == MAX_ROUNDS {
                let schema = next["response_format"]["json_schema"]["schema"].to_string();
                assert!(!schema.contains("\"tool\""), "the last round may only answer: {schema}");
            }
        }
        let Action::Done(End::Text(t)) = l.planned(&text(r#"{"response": "done"}"#)) else { panic!() };
        assert_eq!(t, "done");
    }
}
