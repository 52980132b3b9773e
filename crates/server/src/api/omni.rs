//! Lemonade v11's omni collections on the wire: `POST /v1/chat/completions` naming a
//! `collection.omni` runs the tool loop here. The planner (the collection's chat model) is
//! asked, each tool it calls runs on the component that serves it (as the same request to
//! lemonade's own handler would), the result goes back to the planner, and the answer is one
//! OpenAI chat completion with the media embedded in its content (a markdown image, an
//! `<audio>` data URI), whole or streamed (each medium as a content delta the moment its tool
//! finishes). A tool that fails tells the planner so; it never fails the request. The prompts,
//! the tool table, the reading of replies and the loop's bounds are `routing::omni`'s (pure).

use api_types::*;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use registry::Collection;
use routing::omni::{self, Call, Failure, Guard, Omni, Step, Tool, ToolFormat};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::extract::{Form, JsonBody, Part};
use crate::state::AppState;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// One omni request in progress.
struct Run {
    rt: AppState,
    collection: String,
    planner: String,
    omni: Omni,
    tools: Vec<(&'static Tool, String)>,
    body: Value,
    /// The client's messages (where the tools find the media it sent).
    client: Vec<Value>,
    /// What the planner sees.
    messages: Vec<Value>,
    /// The media made so far, as the answer embeds them.
    media: Vec<String>,
    /// Each tool call with its outcome (`x_lemonade_omni`).
    trace: Vec<Value>,
    guard: Guard,
    /// Media deltas for a streaming client.
    events: Option<mpsc::Sender<Bytes>>,
}

/// How the loop ended.
enum End {
    Text(String),
    /// The planner called tools of the client's: they go back to the client (finish_reason
    /// `tool_calls`), as v11 does.
    ClientCalls(String, Vec<Call>),
}

/// Answers a chat completion to omni collection `c`.
pub async fn answer(rt: &AppState, c: &Collection, o: &Omni, body: Bytes, stream: bool) -> Result<Response, ApiError> {
    let body: Value = serde_json::from_slice(&body)?;
    let mut run = Run::new(rt, c, o, body)?;
    let first = match run.ask().await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    if !stream {
        let end = run.run(first).await.map_err(|e| ApiError::BackendUnavailable(e.0))?;
        return Ok(Json(run.completion(end)).into_response());
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    run.events = Some(tx.clone());
    let forwarded = crate::propagate::current();
    tokio::spawn(crate::propagate::within(forwarded, async move {
        let id = format!("chatcmpl-omni-{}", run.created());
        let _ = tx.send(run.chunk(&id, json!({"role": "assistant", "content": ""}), None)).await;
        let last = match run.run(first).await {
            Ok(end) => run.last_chunks(&id, end),
            Err(e) => format!("data: {}\n\n", json!({"error": {"message": e.0, "type": "server_error"}})).into(),
        };
        let _ = tx.send(last).await;
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }));
    let events =
        futures_util::stream::unfold(rx, |mut rx| async { Some((Ok::<_, axum::Error>(rx.recv().await?), rx)) });
    Ok(([(http::header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(events)).into_response())
}

impl Run {
    fn new(rt: &AppState, c: &Collection, o: &Omni, body: Value) -> Result<Run, ApiError> {
        let planner = engine::omni::planner(rt, &c.components).ok_or_else(|| {
            ApiError::bad_request(format!("Omni model '{}' has no chat model to plan with", c.name), Some("model"))
        })?;
        let tools = engine::omni::tools(rt, &c.components);
        let offered: Vec<&Tool> = tools.iter().map(|(t, _)| *t).collect();
        let client = body["messages"].as_array().cloned().unwrap_or_default();
        let messages = omni::planner_messages(&omni::system_prompt(o, &offered), &client);
        let (collection, omni) = (c.name.clone(), o.clone());
        let (media, trace, guard, events) = (Vec::new(), Vec::new(), Guard::default(), None);
        Ok(Run {
            rt: rt.clone(),
            collection,
            planner,
            omni,
            tools,
            body,
            client,
            messages,
            media,
            trace,
            guard,
            events,
        })
    }

    /// One planner request; its JSON answer, or the error response it gave.
    async fn ask(&self) -> Result<Value, Response> {
        let offered: Vec<&Tool> = self.tools.iter().map(|(t, _)| *t).collect();
        let req = omni::planner_request(
            &self.planner,
            &self.messages,
            &offered,
            &self.body,
            self.omni.tool_format,
            self.guard.text_only(),
        );
        let value: ChatCompletionRequest = serde_json::from_value(req.clone()).map_err(|e| {
            ApiError::bad_request(format!("Invalid request for the planner: {e}"), None).into_response()
        })?;
        let raw = Bytes::from(req.to_string());
        tracing::debug!(collection = %self.collection, request = %req, "omni planner request");
        let r = crate::api::openai::chat_completions(State(self.rt.clone()), JsonBody { value, raw }).await;
        let r = r.unwrap_or_else(IntoResponse::into_response);
        if !r.status().is_success() {
            return Err(r);
        }
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await.map_err(|e| {
            ApiError::BackendUnavailable(format!("The planner's answer was cut off: {e}")).into_response()
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::BackendUnavailable(format!("The planner answered with invalid JSON: {e}")).into_response()
        })
    }

    /// The loop, from the planner's `first` reply to its answer.
    async fn run(&mut self, first: Value) -> Result<End, Failure> {
        let mut reply = first;
        loop {
            let forced = self.guard.text_only();
            let (content, calls) = match omni::parse_step(&reply, self.omni.tool_format, self.guard.rounds()) {
                Step::Text(t) => return Ok(End::Text(t)),
                Step::Calls { content, .. } if forced => return Ok(End::Text(content)),
                Step::Calls { content, calls } => (content, calls),
            };
            let client: Vec<Call> = calls.iter().filter(|c| self.tool(&c.name).is_none()).cloned().collect();
            if !client.is_empty() {
                return Ok(End::ClientCalls(content, client));
            }
            let fresh = self.guard.round(&calls);
            let mut results = Vec::new();
            for (call, new) in calls.iter().zip(fresh) {
                results.push(if new {
                    self.call(call).await
                } else {
                    omni::tool_error("already done: do not repeat it")
                });
            }
            omni::after_calls(&mut self.messages, self.omni.tool_format, &content, &calls, &results);
            reply = self.ask().await.map_err(|r| Failure(format!("the planner failed with HTTP {}", r.status())))?;
        }
    }

    fn tool(&self, name: &str) -> Option<&(&'static Tool, String)> {
        self.tools.iter().find(|(t, _)| t.name == name)
    }

    /// Runs one tool call on its component; what it tells the planner.
    async fn call(&mut self, call: &Call) -> Value {
        let component = self.tool(&call.name).map(|(_, c)| c.clone()).unwrap_or_default();
        let outcome = match &call.arguments {
            Err(raw) => Err(Failure(format!("the arguments are not a JSON object: {raw}"))),
            Ok(args) => self.tool_run(&call.name, &component, args).await,
        };
        let args = call.arguments.clone().map_or_else(|e| Value::String(e.0), Value::Object);
        let (result, error) = match outcome {
            Ok((fields, medium)) => {
                if let Some(m) = medium {
                    self.emit(&m).await;
                    self.media.push(m);
                }
                (omni::tool_ok(fields), Value::Null)
            }
            Err(e) => (omni::tool_error(&e.0), Value::from(e.0)),
        };
        tracing::debug!(collection = %self.collection, tool = %call.name, %component, ok = error.is_null(), "omni tool");
        self.trace.push(json!({"name": call.name, "arguments": args, "component": component, "error": error}));
        result
    }

    async fn tool_run(&self, name: &str, model: &str, args: &Map<String, Value>) -> ToolOutcome {
        match name {
            "generate_image" => generate_image(&self.rt, model, args).await,
            "edit_image" => edit_image(&self.rt, model, args, self.latest_image()).await,
            "text_to_speech" => speak(&self.rt, model, args).await,
            "transcribe_audio" => transcribe(&self.rt, model, args, omni::latest_audio(&self.client)).await,
            "analyze_image" => analyze(&self.rt, model, args, self.latest_image()).await,
            other => Err(Failure(format!("unknown tool '{other}'"))),
        }
    }

    /// The most recent image: one made in this request, else one in the conversation.
    fn latest_image(&self) -> Option<String> {
        let made = self.media.iter().rev().map(|m| json!({"content": m})).collect::<Vec<_>>();
        omni::latest_image(&made).or_else(|| omni::latest_image(&self.client))
    }

    async fn emit(&self, medium: &str) {
        if let Some(tx) = &self.events {
            let _ = tx.send(self.chunk("chatcmpl-omni", json!({"content": format!("{medium}\n\n")}), None)).await;
        }
    }

    fn created(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    fn chunk(&self, id: &str, delta: Value, finish: Option<&str>) -> Bytes {
        let c = json!({"id": id, "object": "chat.completion.chunk", "created": self.created(), "model": self.collection,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}\n\n").into()
    }

    /// The message an `end` makes: the answer (media after the text) or the client's calls.
    fn message(&self, end: End, with_media: bool) -> (Value, &'static str) {
        let media = if with_media { self.media.join("\n\n") } else { String::new() };
        let join = |t: &str| {
            [t.trim(), media.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join("\n\n")
        };
        match end {
            End::Text(t) => (json!({"role": "assistant", "content": join(&t)}), "stop"),
            End::ClientCalls(content, calls) => {
                let mut m = vec![];
                omni::after_calls(&mut m, ToolFormat::Native, &join(&content), &calls, &[]);
                (m.remove(0), "tool_calls")
            }
        }
    }

    fn completion(&self, end: End) -> Value {
        let (message, finish) = self.message(end, true);
        json!({"id": format!("chatcmpl-omni-{}", self.created()), "object": "chat.completion", "created": self.created(),
               "model": self.collection, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "x_lemonade_omni": self.trace_value()})
    }

    /// A stream's last events: the text (the media went out as their tools finished), then the
    /// finish with the trace.
    fn last_chunks(&self, id: &str, end: End) -> Bytes {
        let (mut message, finish) = self.message(end, false);
        if let Some(o) = message.as_object_mut() {
            o.remove("role");
        }
        let mut out = self.chunk(id, message, None).to_vec();
        let mut done: Value = json!({"id": id, "object": "chat.completion.chunk", "created": self.created(), "model": self.collection,
                                     "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
        done["x_lemonade_omni"] = self.trace_value();
        out.extend(format!("data: {done}\n\n").into_bytes());
        out.into()
    }

    fn trace_value(&self) -> Value {
        json!({"planner": self.planner, "tool_format": engine::omni::format_name(self.omni.tool_format), "tool_calls": self.trace})
    }
}

/// What a tool tells the planner, and the medium it made (embedded in the answer).
type ToolOutcome = Result<(Value, Option<String>), Failure>;

fn first_image(bytes: &Bytes) -> Result<String, Failure> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| Failure(e.to_string()))?;
    v["data"][0]["b64_json"].as_str().map(str::to_string).ok_or_else(|| "the image model answered no image".into())
}

fn arg<'a>(args: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str).filter(|s| !s.is_empty())
}

async fn generate_image(rt: &AppState, model: &str, args: &Map<String, Value>) -> ToolOutcome {
    let prompt = arg(args, "prompt").ok_or("'prompt' is required")?;
    let mut req = json!({"model": model, "prompt": prompt, "response_format": "b64_json"});
    for k in ["size", "steps", "seed"] {
        if let Some(v) = args.get(k).filter(|v| !v.is_null()) {
            req[k] = v.clone();
        }
    }
    let value: ImageGenerationRequest = serde_json::from_value(req.clone()).map_err(|e| e.to_string())?;
    let r = crate::api::images::generations(State(rt.clone()), JsonBody { value, raw: Bytes::from(req.to_string()) });
    let png = first_image(&crate::api::own_answer(r.await).await?.0)?;
    Ok((json!({"image": "generated and shown to the user", "prompt": prompt}), Some(omni::image_markdown(&png))))
}

fn field(name: &str, v: &str) -> Part {
    Part { name: name.into(), file_name: None, content_type: None, data: Bytes::from(v.to_string()) }
}

fn file(name: &str, file_name: &str, b64: &str) -> Result<Part, Failure> {
    let data = B64.decode(b64).map_err(|e| Failure(format!("the {name} is not base64: {e}")))?;
    Ok(Part { name: name.into(), file_name: Some(file_name.into()), content_type: None, data: Bytes::from(data) })
}

async fn edit_image(rt: &AppState, model: &str, args: &Map<String, Value>, source: Option<String>) -> ToolOutcome {
    let prompt = arg(args, "prompt").ok_or("'prompt' is required")?;
    let source = source.ok_or("there is no image in the conversation to edit")?;
    let mut parts = vec![field("model", model), field("prompt", prompt), field("response_format", "b64_json")];
    if let Some(size) = arg(args, "size") {
        parts.push(field("size", size));
    }
    parts.push(file("image", "image.png", &source)?);
    let r = crate::api::images::edits(State(rt.clone()), Form { parts }).await;
    let png = first_image(&crate::api::own_answer(r).await?.0)?;
    Ok((json!({"image": "edited and shown to the user", "prompt": prompt}), Some(omni::image_markdown(&png))))
}

async fn speak(rt: &AppState, model: &str, args: &Map<String, Value>) -> ToolOutcome {
    let input = arg(args, "input").ok_or("'input' is required")?;
    let mut req = json!({"model": model, "input": input});
    if let Some(v) = arg(args, "voice") {
        req["voice"] = v.into();
    }
    let value: SpeechRequest = serde_json::from_value(req.clone()).map_err(|e| e.to_string())?;
    let r = crate::api::audio::speech(State(rt.clone()), JsonBody { value, raw: Bytes::from(req.to_string()) }).await;
    let (audio, mime) = crate::api::own_answer(r).await?;
    let mut audio = audio.to_vec();
    omni::seal_wav(&mut audio);
    let mime = if mime.starts_with("audio/") { mime } else { "audio/wav".into() };
    Ok((json!({"audio": "spoken to the user", "input": input}), Some(omni::audio_tag(&mime, &B64.encode(&audio)))))
}

async fn transcribe(
    rt: &AppState,
    model: &str,
    args: &Map<String, Value>,
    audio: Option<(String, String)>,
) -> ToolOutcome {
    let (format, data) = audio.ok_or("the user sent no audio (an input_audio part) to transcribe")?;
    let mut parts = vec![field("model", model), field("response_format", "json")];
    if let Some(lang) = arg(args, "language") {
        parts.push(field("language", lang));
    }
    parts.push(file("file", &format!("audio.{format}"), &data)?);
    let r = crate::api::audio::transcriptions(State(rt.clone()), Form { parts }).await;
    let v: Value = serde_json::from_slice(&crate::api::own_answer(r).await?.0).map_err(|e| e.to_string())?;
    Ok((json!({"text": v["text"].as_str().unwrap_or_default().trim()}), None))
}

async fn analyze(rt: &AppState, model: &str, args: &Map<String, Value>, image: Option<String>) -> ToolOutcome {
    let question = arg(args, "question").unwrap_or("Describe the image.");
    let image = image.ok_or("there is no image in the conversation to look at")?;
    let url = format!("data:image/png;base64,{image}");
    let req = json!({"model": model, "stream": false, "messages": [{"role": "user", "content": [
        {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]}]});
    let value: ChatCompletionRequest = serde_json::from_value(req.clone()).map_err(|e| e.to_string())?;
    let r =
        crate::api::openai::chat_completions(State(rt.clone()), JsonBody { value, raw: Bytes::from(req.to_string()) });
    let v: Value = serde_json::from_slice(&crate::api::own_answer(r.await).await?.0).map_err(|e| e.to_string())?;
    Ok((json!({"answer": v["choices"][0]["message"]["content"]}), None))
}
