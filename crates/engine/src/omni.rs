//! Omni collections (Lemonade v11's `collection.omni`): which component plans (the first chat
//! model) and which runs each tool (the first whose labels the tool needs), and [`run`], the
//! driver of the tool loop: `routing::omni::Loop` (sans-IO) says what to do, this module asks
//! the planner and runs each tool on its component through [`crate::call`], as any in-process
//! model call.

use api_types::{ModelType, SdParameters};
use base64::Engine as _;
use registry::{Collection, Registry};
use routing::omni::{self as pure, Action, End, Failure, Loop, Omni, Tool, ToolOutcome, ToolRun};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::call::{call, Payload};
use crate::error::{EngineError, Result};
use crate::lease::{Endpoint, Forwarded, LeaseRequest};
use crate::{tools, Engine};

/// The planner: the first component that is a chat model (local or a remote provider's).
pub fn planner(rt: &Engine, components: &[String]) -> Option<String> {
    let reg = rt.catalogue.registry();
    components
        .iter()
        .find(|c| reg.get(c).map_or_else(|_| rt.remotes.model(c).is_some(), |i| i.model_type == ModelType::Llm))
        .cloned()
}

/// A component's labels, with the ones its type implies (`image`, `tts`, `transcription`).
fn labels(reg: &Registry, component: &str) -> Vec<String> {
    let Ok(info) = reg.get(component) else { return vec!["chat".into()] };
    let mut l = info.labels.clone();
    l.push(
        match info.model_type {
            ModelType::Image => "image",
            ModelType::Tts => "tts",
            ModelType::Audio => "transcription",
            ModelType::Llm => "chat",
            ModelType::Embedding | ModelType::Reranking => "embeddings",
        }
        .into(),
    );
    l
}

/// The tools `components` offer, each with the component that runs it.
pub fn tools(rt: &Engine, components: &[String]) -> Vec<(&'static Tool, String)> {
    let reg = rt.catalogue.registry();
    let labelled: Vec<(String, Vec<String>)> = components.iter().map(|c| (c.clone(), labels(&reg, c))).collect();
    routing::omni::offered(&labelled)
}

/// The tools as `/models/{id}` lists them: each function definition with its `component`.
pub fn listed_tools(rt: &Engine, components: &[String]) -> Vec<Value> {
    tools(rt, components)
        .into_iter()
        .map(|(t, c)| {
            let mut f = t.function.clone();
            f["component"] = c.into();
            f
        })
        .collect()
}

/// Runs omni collection `c`'s tool loop for the client's chat request `body`: the planner is
/// asked, each tool it calls runs on its component, the result goes back to it, until it
/// answers. Each medium is sent on `media` the moment its tool finishes (a streaming client's
/// content deltas). A tool that fails tells the planner so; it never fails the request. The
/// planner's first failure is the request's (its status kept); a later one ends it.
pub async fn run(
    rt: &Engine,
    c: &Collection,
    o: &Omni,
    body: Value,
    forwarded: Forwarded,
    media: Option<mpsc::Sender<String>>,
) -> Result<(Loop, End)> {
    let planner = planner(rt, &c.components).ok_or_else(|| {
        EngineError::invalid(format!("Omni model '{}' has no chat model to plan with", c.name), Some("model"))
    })?;
    let mut l = Loop::new(o, &planner, tools(rt, &c.components), body);
    let mut action = l.start();
    let mut asked = 0;
    loop {
        action = match action {
            Action::Done(end) => return Ok((l, end)),
            Action::Ask(req) => {
                tracing::debug!(collection = %c.name, request = %req, "omni planner request");
                let lease = LeaseRequest::new(&planner, Endpoint::ChatCompletions).forwarded(forwarded.clone());
                let reply = call(rt, lease, Payload::Json(req)).await;
                let reply = match reply.and_then(|a| a.json()) {
                    Ok(v) => v,
                    Err(e) if asked == 0 => return Err(e),
                    Err(e) => {
                        return Err(EngineError::BadAnswer { what: format!("The planner '{planner}' failed: {e}") })
                    }
                };
                asked += 1;
                l.planned(&reply)
            }
            Action::Run(run) => {
                let outcome = run_tool(rt, &run, &forwarded).await;
                tracing::debug!(collection = %c.name, tool = %run.tool, component = %run.component, ok = outcome.is_ok(), "omni tool");
                if let (Some(tx), Ok((_, Some(m)))) = (&media, &outcome) {
                    let _ = tx.send(m.clone()).await;
                }
                l.ran(outcome)
            }
        };
    }
}

/// Runs one tool on its component.
async fn run_tool(rt: &Engine, run: &ToolRun, forwarded: &Forwarded) -> ToolOutcome {
    let (args, model) = (&run.arguments, run.component.as_str());
    let image = |done: &str, prompt: &str, png: &str| {
        Ok((
            json!({"image": format!("{done} and shown to the user"), "prompt": prompt}),
            Some(pure::image_markdown(png)),
        ))
    };
    match run.tool.as_str() {
        "generate_image" => {
            let prompt = arg(args, "prompt").ok_or("'prompt' is required")?;
            let number = |k: &str| args.get(k).and_then(Value::as_i64);
            let steps = number("steps").and_then(|s| u32::try_from(s).ok());
            let sd = SdParameters { steps, seed: number("seed"), ..Default::default() };
            let d = tools::Drawing { prompt, n: None, size: arg(args, "size"), sd };
            image("generated", prompt, &tools::draw(rt, model, &d, forwarded).await?[0])
        }
        "edit_image" => {
            let prompt = arg(args, "prompt").ok_or("'prompt' is required")?;
            let source = run.image.as_deref().ok_or("there is no image in the conversation to edit")?;
            image("edited", prompt, &tools::redraw(rt, model, prompt, arg(args, "size"), source, forwarded).await?[0])
        }
        "text_to_speech" => {
            let input = arg(args, "input").ok_or("'input' is required")?;
            backends::kokoro::check(input, None, None).map_err(|(m, _)| Failure(m))?;
            let req = json!({"input": input, "voice": arg(args, "voice"), "response_format": null, "speed": 1.0});
            let answer = tools::on(rt, model, Endpoint::Speech, forwarded, Payload::Json(req)).await?;
            let mut audio = answer.body.to_vec();
            pure::seal_wav(&mut audio);
            let mime = answer.content_type.filter(|m| m.starts_with("audio/")).unwrap_or_else(|| "audio/wav".into());
            let medium = pure::audio_tag(&mime, &tools::B64.encode(&audio));
            Ok((json!({"audio": "spoken to the user", "input": input}), Some(medium)))
        }
        "transcribe_audio" => {
            let (format, data) =
                run.audio.clone().ok_or("the user sent no audio (an input_audio part) to transcribe")?;
            let data = tools::B64.decode(data).map_err(|e| Failure(format!("the audio is not base64: {e}")))?;
            let h = tools::Hearing {
                file_name: format!("audio.{format}"),
                data,
                language: arg(args, "language"),
                format: None,
            };
            let answer = tools::transcribe(rt, model, h, forwarded).await?;
            let v: Value = serde_json::from_slice(&answer.body).map_err(|e| Failure(e.to_string()))?;
            Ok((json!({"text": v["text"].as_str().unwrap_or_default().trim()}), None))
        }
        "analyze_image" => {
            let question = arg(args, "question").unwrap_or("Describe the image.");
            let image = run.image.as_deref().ok_or("there is no image in the conversation to look at")?;
            let url = format!("data:image/png;base64,{image}");
            let req = json!({"model": model, "stream": false, "messages": [{"role": "user", "content": [
                {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]}]});
            let answer = tools::on(rt, model, Endpoint::ChatCompletions, forwarded, Payload::Json(req)).await?;
            let v: Value = serde_json::from_slice(&answer.body).map_err(|e| Failure(e.to_string()))?;
            Ok((json!({"answer": v["choices"][0]["message"]["content"]}), None))
        }
        other => Err(Failure(format!("unknown tool '{other}'"))),
    }
}

fn arg<'a>(args: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Unix seconds now (an answer's `created`).
fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Omni collection `c`'s whole answer to chat request `body`: one OpenAI chat completion.
pub async fn answer(rt: &Engine, c: &Collection, o: &Omni, body: Value, forwarded: Forwarded) -> Result<Value> {
    let (l, end) = run(rt, c, o, body, forwarded, None).await?;
    Ok(l.completion(&end, &c.name, created()))
}

/// Omni collection `c`'s answer as SSE events, each sent as it is made: the role, each medium
/// the moment its tool finishes, the text, the finish with the trace, `[DONE]`. The loop runs
/// in its own task; dropping the receiver leaves it to finish unread.
pub fn stream(rt: &Engine, c: &Collection, o: &Omni, body: Value, forwarded: Forwarded) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>(16);
    let (media_tx, mut media_rx) = mpsc::channel::<String>(4);
    let (rt, c, o) = (rt.clone(), c.clone(), o.clone());
    let (id, name) = (format!("chatcmpl-omni-{}", created()), c.name.clone());
    tokio::spawn(async move {
        let event = {
            let (id, name) = (id.clone(), name.clone());
            move |delta: Value| pure::chunk_event(&id, &name, created(), delta, None, None)
        };
        let _ = tx.send(event(json!({"role": "assistant", "content": ""}))).await;
        let media = {
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(m) = media_rx.recv().await {
                    let _ = tx.send(event(json!({"content": format!("{m}\n\n")}))).await;
                }
            })
        };
        let ran = run(&rt, &c, &o, body, forwarded, Some(media_tx)).await;
        // Every medium is out before the text.
        let _ = media.await;
        let last = match ran {
            Ok((l, end)) => l.last_events(&end, &id, &name, created()),
            Err(e) => format!("data: {}\n\n", json!({"error": {"message": e.to_string(), "type": "server_error"}})),
        };
        let _ = tx.send(last).await;
        let _ = tx.send("data: [DONE]\n\n".into()).await;
    });
    rx
}
