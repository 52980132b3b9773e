//! The model calls the engine composes, in process: the omni tool loop and the MCP tools, each
//! driven by the engine through the fake launcher, whose processes answer HTTP at a server the
//! test runs on 127.0.0.1 (a scripted planner, an image model, a speech model). Every request
//! really travels through `Engine::lease` and `engine::call`; nothing here is the server's.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use lemonade_engine as engine;
use parking_lot::Mutex;
use serde_json::{json, Value};

use engine::fake::{self, FakeLauncher};
use engine::{Config, Engine};
use routing::omni::End;

const PLANNER: &str = "extra.planner";
const SD: &str = "SD-Turbo";
const KOKORO: &str = "kokoro-v1";
/// A 1×1 PNG, base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// What one stand-in backend was asked: (path, body) per request.
type Asked = Arc<Mutex<Vec<(String, Value)>>>;

/// A backend on 127.0.0.1: a chat model answering `replies[n]` (n: the assistant messages in
/// the request, `{last}` replaced by the last message's content), an image model answering one
/// PNG, a speech model answering a WAV. Returns its base URL and what it was asked.
async fn backend(replies: Vec<Value>) -> (String, Asked) {
    let asked: Asked = Arc::default();
    let log = asked.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, body: Bytes| {
        let (log, replies) = (log.clone(), replies.clone());
        async move {
            let path = uri.path().to_string();
            if path == "/health" {
                return axum::Json(json!({"status": "ok"})).into_response();
            }
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            log.lock().push((path.clone(), v.clone()));
            answer(&path, &v, &replies)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, asked)
}

fn answer(path: &str, v: &Value, replies: &[Value]) -> Response {
    match path {
        "/v1/chat/completions" => {
            let messages = v["messages"].as_array().cloned().unwrap_or_default();
            let n = messages.iter().filter(|m| m["role"] == "assistant").count();
            let mut reply = replies.get(n).cloned().unwrap_or(json!({"content": "no more replies"}));
            let last = messages.last().and_then(|m| m["content"].as_str()).unwrap_or_default().to_string();
            if let Some(c) = reply["content"].as_str() {
                reply["content"] = c.replace("{last}", &last).into();
            }
            reply["role"] = "assistant".into();
            let finish = if reply.get("tool_calls").is_some() { "tool_calls" } else { "stop" };
            axum::Json(json!({"object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}))
            .into_response()
        }
        "/v1/images/generations" => axum::Json(json!({"created": 0, "data": [{"b64_json": PNG}]})).into_response(),
        p if p == backends::kokoro::SPEECH_PATH => {
            let mut wav = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
            wav.extend([0u8; 32]);
            ([(axum::http::header::CONTENT_TYPE, "audio/wav")], wav).into_response()
        }
        _ => (axum::http::StatusCode::NOT_FOUND, "no such path").into_response(),
    }
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

struct Setup {
    engine: Engine,
    _launcher: Arc<FakeLauncher>,
    planner: Asked,
    sd: Asked,
    kokoro: Asked,
    _tmp: tempfile::TempDir,
}

/// An engine whose planner answers `replies`, with SD-Turbo and kokoro-v1 as its image and
/// speech models, and the omni collection `user.Omni` of the three.
async fn setup(replies: Vec<Value>) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(tmp.path().join("cache"), tmp.path().join("hub"));
    cfg.remote_refresh = None;
    cfg.watchdog_interval = None;
    let launcher = FakeLauncher::new();
    let (planner_url, planner) = backend(replies).await;
    let (sd_url, sd) = backend(vec![]).await;
    let (kokoro_url, kokoro) = backend(vec![]).await;
    launcher.serve(PLANNER, &planner_url);
    launcher.serve(SD, &sd_url);
    launcher.serve(KOKORO, &kokoro_url);
    let repos: &[(&str, &[&str])] =
        &[("stabilityai/sd-turbo", &["sd_turbo.safetensors"]), ("mikkoph/kokoro-onnx", &["index.json"])];
    let catalogue = fake::catalogue_with(&cfg.cache_dir, &["planner.gguf"], repos);
    for m in [SD, KOKORO] {
        assert!(catalogue.get(m).unwrap().downloaded, "{m} is downloaded: no test may pull");
    }
    let engine = fake::engine(cfg, catalogue, launcher.clone());
    let def = json!({"model": "user.Omni", "recipe": "collection.omni", "components": [PLANNER, SD, KOKORO]});
    let name = engine::router::register(&engine, &serde_json::from_value(def).unwrap()).await.unwrap();
    assert_eq!(name, "user.Omni");
    Setup { engine, _launcher: launcher, planner, sd, kokoro, _tmp: tmp }
}

impl Setup {
    async fn omni(&self, prompt: &str) -> (routing::omni::Loop, End) {
        let reg = self.engine.catalogue().registry();
        let c = reg.collection("user.Omni").cloned().expect("the collection is registered");
        let o = c.omni().cloned().expect("an omni collection");
        let body = json!({"model": "user.Omni", "messages": [{"role": "user", "content": prompt}]});
        engine::omni::run(&self.engine, &c, &o, body, Default::default(), None).await.expect("the loop ends")
    }
}

/// The loop, driven by the engine on real HTTP: a tool that fails before any model is asked
/// (a bad size) is told to the planner and the request goes on; the next call draws on the
/// image model; the planner's last answer ends the loop with the medium beside the text.
#[tokio::test]
async fn the_omni_loop_tells_a_failed_tool_to_the_planner_then_draws_and_answers() {
    let s = setup(vec![
        json!({"content": "", "tool_calls": [call("a", "generate_image", json!({"prompt": "a lemon", "size": "huge"}))]}),
        json!({"content": "", "tool_calls": [call("b", "generate_image", json!({"prompt": "a lemon", "size": "256x256"}))]}),
        json!({"content": "Done. Last tool said: {last}"}),
    ])
    .await;
    let (l, end) = s.omni("Draw a lemon").await;
    let End::Text(text) = &end else { panic!("a text answer, not {end:?}") };
    assert!(text.starts_with("Done. Last tool said: "), "{text}");
    assert_eq!(l.media().len(), 1, "one image made");
    assert!(l.media()[0].contains(PNG), "the image model's PNG: {}", l.media()[0]);
    let trace = l.trace();
    let calls = trace["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{trace}");
    assert!(calls[0]["error"].as_str().is_some_and(|e| e.contains("size")), "the refusal, named: {trace}");
    assert_eq!((calls[1]["component"].clone(), calls[1]["error"].clone()), (json!(SD), Value::Null), "{trace}");
    // The refused size never reached the image model; the good call did, once.
    let sd = s.sd.lock().clone();
    assert_eq!(sd.len(), 1, "{sd:?}");
    assert_eq!((sd[0].0.as_str(), sd[0].1["size"].clone()), ("/v1/images/generations", json!("256x256")));
    // The planner was asked three times, the second time told of the failure.
    let planner = s.planner.lock().clone();
    assert_eq!(planner.len(), 3);
    let told = planner[1].1["messages"].to_string();
    assert!(told.contains("size") && told.contains("huge"), "the planner read the failure: {told}");
    assert!(s.kokoro.lock().is_empty(), "no speech was asked for");
}

/// The loop runs what the planner chose and nothing else: a planner that only speaks makes
/// the speech model talk and never asks the image model.
#[tokio::test]
async fn a_planner_that_only_speaks_never_reaches_the_image_model() {
    let s = setup(vec![
        json!({"content": "", "tool_calls": [call("h", "text_to_speech", json!({"input": "Hello."}))]}),
        json!({"content": "I said hello."}),
    ])
    .await;
    let (l, end) = s.omni("Say hello").await;
    assert!(matches!(&end, End::Text(t) if t == "I said hello."), "{end:?}");
    assert_eq!(l.media().len(), 1);
    assert!(l.media()[0].starts_with("<audio>data:audio/wav;base64,"), "{}", l.media()[0]);
    let kokoro = s.kokoro.lock().clone();
    assert_eq!((kokoro.len(), kokoro[0].1["input"].clone()), (1, json!("Hello.")), "{kokoro:?}");
    assert!(s.sd.lock().is_empty(), "the image model was never asked");
}

/// The planner's call of a client's own tool ends the loop: it goes back to the client, and no
/// component runs.
#[tokio::test]
async fn a_client_tool_call_goes_back_to_the_client() {
    let s = setup(vec![
        json!({"content": "Let me look.", "tool_calls": [call("w", "get_weather", json!({"city": "Paris"}))]}),
    ])
    .await;
    let (_, end) = s.omni("Weather in Paris?").await;
    let End::ClientCalls(text, calls) = &end else { panic!("the client's call, not {end:?}") };
    assert_eq!((text.as_str(), calls.len()), ("Let me look.", 1));
    assert!(s.sd.lock().is_empty() && s.kokoro.lock().is_empty());
}

/// The MCP image tool on the engine: a path outside the image folder is refused before the
/// (served, working) image model is asked; a path inside gets the model's PNG written there.
#[tokio::test]
async fn the_mcp_image_tool_checks_its_path_before_drawing_then_writes_the_png() {
    let s = setup(vec![]).await;
    let args = |out: &str| {
        json!({"model": SD, "prompt": "a lemon", "size": "256x256", "output_path": out}).as_object().unwrap().clone()
    };
    for out in ["../../escape.png", "/etc/escape.png"] {
        let v = engine::mcp::tool(&s.engine, "lemonade_generate_image", &args(out), 1 << 20).await.unwrap();
        assert_eq!(v["isError"], true, "{out}: {v}");
        assert!(v["content"][0]["text"].as_str().unwrap().contains("is outside the MCP image folder"), "{v}");
    }
    assert!(s.sd.lock().is_empty(), "refused before the image model was asked");
    let v = engine::mcp::tool(&s.engine, "lemonade_generate_image", &args("lemon.png"), 1 << 20).await.unwrap();
    assert_eq!(v["isError"], false, "{v}");
    let path = v["content"][0]["text"].as_str().unwrap();
    assert!(path.ends_with("mcp-images/lemon.png"), "{path}");
    use base64::Engine as _;
    let png = base64::engine::general_purpose::STANDARD.decode(PNG).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), png, "the model's PNG, as it answered");
    assert_eq!(s.sd.lock().len(), 1);
}

/// A remote upstream on 127.0.0.1 listing model `m1`: each chat request takes the next status
/// of `script` (a 503 says `Retry-After: 1`), then answers 200. Returns its base URL and how
/// many chat requests reached it.
async fn upstream(script: Vec<u16>) -> (String, Arc<Mutex<usize>>) {
    let asked = Arc::new(Mutex::new(0usize));
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
    let n = asked.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (n, script) = (n.clone(), script.clone());
        async move {
            match uri.path() {
                "/v1/models" => axum::Json(json!({"object": "list", "data": [{"id": "m1", "object": "model"}]}))
                    .into_response(),
                "/v1/chat/completions" => {
                    *n.lock() += 1;
                    match script.lock().pop_front() {
                        Some(503) => {
                            (axum::http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], "busy").into_response()
                        }
                        Some(s) => (axum::http::StatusCode::from_u16(s).unwrap(), "failed").into_response(),
                        None => axum::Json(json!({"object": "chat.completion", "model": "m1",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "from upstream"}, "finish_reason": "stop"}]}))
                        .into_response(),
                    }
                }
                _ => (axum::http::StatusCode::NOT_FOUND, "no").into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, asked)
}

/// An engine with the remote provider `up` at `url`, its breaker opening after `failures`.
async fn remote_engine(url: &str, failures: u32) -> (Engine, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(tmp.path().join("cache"), tmp.path().join("hub"));
    cfg.remote_refresh = None;
    cfg.watchdog_interval = None;
    cfg.breaker = backends::upstream::BreakerSettings { failures, open_ms: 60_000 };
    let catalogue = fake::catalogue_at(&cfg.cache_dir, &[]);
    let e = fake::engine(cfg, catalogue, FakeLauncher::new());
    e.remotes().install("up", Some(url), None).await.expect("the provider installs");
    (e, tmp)
}

fn chat() -> engine::call::Payload {
    engine::call::Payload::Json(json!({"model": "up.m1", "messages": [{"role": "user", "content": "hi"}]}))
}

fn to_up() -> engine::lease::LeaseRequest {
    engine::lease::LeaseRequest::new("up.m1", engine::lease::Endpoint::ChatCompletions)
}

/// The remote provider's retry, driven by the engine on real HTTP: its backpressure (a 503
/// with `Retry-After`) is waited out and the request sent again; the answer is the upstream's,
/// naming the model the client asked for.
#[tokio::test]
async fn a_remote_upstreams_backpressure_is_waited_out_and_the_request_sent_again() {
    let (url, asked) = upstream(vec![503]).await;
    let (e, _tmp) = remote_engine(&url, 5).await;
    let a = engine::call::call(&e, to_up(), chat()).await.expect("answered after the wait");
    let v = a.json().unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "from upstream", "{v}");
    assert_eq!(v["model"], "up.m1", "the id the client asked for");
    assert_eq!(*asked.lock(), 2, "the 503, then the retry");
}

/// The breaker, driven by the engine: failures in a row (5xx, each failing its request) open
/// it, and the next request is refused at once, saying when to come back, without reaching
/// the upstream.
#[tokio::test]
async fn a_failing_remote_upstream_opens_its_breaker_and_is_not_asked_again() {
    let (url, asked) = upstream(vec![500, 500, 500]).await;
    let (e, _tmp) = remote_engine(&url, 2).await;
    for _ in 0..2 {
        let err = engine::call::call(&e, to_up(), chat()).await.unwrap_err();
        assert!(
            matches!(
                &err,
                engine::EngineError::Upstream {
                    failure: engine::error::UpstreamFailure::Answered { key_refused: false, .. },
                    ..
                }
            ),
            "{err}"
        );
    }
    assert_eq!(*asked.lock(), 2);
    let err = engine::call::call(&e, to_up(), chat()).await.unwrap_err();
    let engine::EngineError::Upstream { provider, failure, .. } = &err else { panic!("{err}") };
    assert_eq!(provider, "up");
    assert!(matches!(failure, engine::error::UpstreamFailure::BreakerOpen { wait_ms } if *wait_ms > 0), "{err}");
    assert!(failure.retry_after().is_some_and(|s| s >= 1), "it says when to come back");
    assert_eq!(*asked.lock(), 2, "the open breaker kept the request from the upstream");
}
