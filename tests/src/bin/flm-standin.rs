//! A stand-in for FastFlowLM's `flm` program, for tests on machines without an AMD NPU. It
//! follows FLM's documented command line and its OpenAI-compatible server as Lemonade v11.7
//! uses them:
//!
//! * `flm validate --json`: `{"npu": "ok", …}`, exit 0 (exit 1 with a driver message when
//!   `FLM_STANDIN_FAIL_VALIDATE` is set);
//! * `flm pull <tag> [--force]`: exit 0 (exit 1 for a tag starting with `missing`);
//! * `flm serve <tag> --ctx-len N --port P --host H [flags…] --quiet` (or `--embed 1` /
//!   `--asr 1` instead of a tag): listens on H:P and answers `GET /api/tags` (the readiness
//!   probe: FLM has no health endpoint) and `POST /v1/chat/completions`, whole or streamed,
//!   only for `"model": "<tag>"` (a 404 otherwise, as FLM routes by its tag);
//! * `flm --version`.
//!
//! Every invocation appends its arguments as a JSON array line to `$FLM_STANDIN_LOG`, so a test
//! can check the command lines lemonade ran. Never a substitute for a run on the NPU.

use std::convert::Infallible;
use std::io::Write;

use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned()
}

fn log(args: &[String]) {
    if let Some(path) = std::env::var_os("FLM_STANDIN_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{}", json!(args));
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    log(&args);
    match args.first().map(String::as_str) {
        Some("--version") | Some("version") => println!("FLM v0.9.34 (stand-in)"),
        Some("validate") => {
            if std::env::var_os("FLM_STANDIN_FAIL_VALIDATE").is_some() {
                println!("{}", json!({"npu": "missing", "error": "amdxdna driver not loaded"}));
                std::process::exit(1);
            }
            println!("{}", json!({"npu": "ok", "driver": "amdxdna", "firmware": "stand-in"}));
        }
        Some("pull") => {
            let tag = args.get(1).cloned().unwrap_or_default();
            if tag.is_empty() || tag.starts_with("missing") {
                eprintln!("Error: model '{tag}' not found in the FLM model list");
                std::process::exit(1);
            }
            println!("Model {tag} is ready.");
        }
        Some("serve") => serve(&args).await,
        _ => {
            eprintln!("usage: flm (validate|pull|serve|--version) …");
            std::process::exit(2);
        }
    }
}

async fn serve(args: &[String]) {
    let tag = match (arg(args, "--embed"), arg(args, "--asr")) {
        (Some(_), _) => "embed-gemma:300m".to_string(),
        (_, Some(_)) => "whisper-v3:turbo".to_string(),
        _ => args.get(1).cloned().unwrap_or_default(),
    };
    let port: u16 = arg(args, "--port").and_then(|p| p.parse().ok()).expect("--port P");
    let host = arg(args, "--host").unwrap_or_else(|| "127.0.0.1".into());
    let app = Router::new()
        .route("/api/tags", get(|State(tag): State<String>| async move { Json(json!({"models": [{"name": tag}]})) }))
        .route("/v1/chat/completions", post(chat))
        .with_state(tag);
    let listener = tokio::net::TcpListener::bind((host.as_str(), port)).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}

async fn chat(State(tag): State<String>, Json(body): Json<Value>) -> axum::response::Response {
    use axum::http;
    use axum::response::IntoResponse;
    if body["model"] != tag.as_str() {
        let e = json!({"error": format!("model '{}' is not served here (serving {tag})", body["model"])});
        return (http::StatusCode::NOT_FOUND, Json(e)).into_response();
    }
    let text = format!("Hello from {tag} on the NPU stand-in.");
    if body["stream"] == true {
        let words: Vec<String> = text.split_inclusive(' ').map(str::to_string).collect();
        let mut events: Vec<Result<String, Infallible>> = words
            .iter()
            .map(|w| {
                let c = json!({"object": "chat.completion.chunk", "model": tag,
                    "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]});
                Ok(format!("data: {c}\n\n"))
            })
            .collect();
        let last = json!({"object": "chat.completion.chunk", "model": tag,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        events.push(Ok(format!("data: {last}\n\n")));
        events.push(Ok("data: [DONE]\n\n".into()));
        let body = Body::from_stream(futures_util::stream::iter(events));
        return ([(http::header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    }
    Json(json!({"id": "chatcmpl-flm", "object": "chat.completion", "model": tag,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}}))
    .into_response()
}
