//! A stand-in for llama-server (and for ryzenai-server, which takes its port from the caller),
//! for fast and deterministic fault tests. It accepts
//! llama-server's command line, prints the same `listening on http://HOST:PORT` line once
//! "loaded", and answers `/health`, `/v1/chat/completions` (streaming or not),
//! `/v1/embeddings` and `/slots`.
//!
//! Fault knobs come from `<model>.json` next to the `-m` file (all optional):
//! `load_delay_ms`, `token_delay_ms`, `tokens` (default 8), `crash_after_tokens` (exit 1 in the
//! middle of a stream), `refuse_start` (exit `exit_code`, default 1, before listening),
//! `fail_first_start` (a marker file path: the first start creates it and exits 1),
//! `ignore_sigterm` (needs SIGKILL to stop), `omit_done` (a stream ends without `data: [DONE]`),
//! `token_bytes` (each streamed token padded to this many bytes, for long streams),
//! `replies` (a scripted planner: a whole chat answer's message is `replies[n]`, n the number
//! of assistant messages in the request, with `{last}` in its content replaced by the last
//! message's content), `script` (one answer per chat request, in order, before the normal
//! ones: `{"status": 429, "retry_after": "1"}`), `headers_log` (a file each chat request's
//! headers are appended to, a JSON object per line). It also lists its model at `/v1/models`
//! (`--alias`) and serves `metrics` (a knob: Prometheus text) at `/metrics`, to stand in for a
//! remote upstream. `hostile` makes it a compromised backend for the sandbox's tests: before it
//! listens it tries `{"read": [paths], "write": [paths], "connect": [ports], "bind": [ports],
//! "shell": "command"}` (the command run by `/bin/sh -c`; `{ppid}` in any of them is lemonade's
//! pid), the reading of lemonade's `/proc/<pid>/environ` and a signal 0 to lemonade, and
//! reports each outcome at `GET /hostile`.
//! Never a substitute for the end-to-end tests against real llama-server.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Clone, Default)]
struct Knobs {
    token_delay_ms: u64,
    tokens: u64,
    crash_after_tokens: Option<u64>,
    omit_done: bool,
    token_bytes: usize,
    replies: Vec<Value>,
    script: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Value>>>,
    headers_log: Option<String>,
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    // A stand-in lists no flags: lemonade runs it as the newest llama-server and checks nothing.
    if args.iter().any(|a| a == "--help" || a == "--version") {
        eprintln!("fake llama-server: no help here");
        std::process::exit(2);
    }
    let model = arg(&args, "-m").expect("-m MODEL");
    let knobs: Value =
        std::fs::read(format!("{model}.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(json!({}));
    let n = |k: &str| knobs.get(k).and_then(Value::as_u64);
    eprintln!("fake llama-server: loading model '{model}'");
    if knobs.get("ignore_sigterm") == Some(&json!(true)) {
        // SAFETY: installing SIG_IGN for SIGTERM.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    if let Some(ms) = n("load_delay_ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(marker) = knobs.get("fail_first_start").and_then(Value::as_str) {
        if std::fs::metadata(marker).is_err() {
            std::fs::write(marker, b"failed once").unwrap();
            eprintln!("error: simulated out-of-memory on first start");
            std::process::exit(1);
        }
    }
    if knobs.get("refuse_start") == Some(&json!(true)) {
        eprintln!("error: failed to load model (refuse_start)");
        std::process::exit(n("exit_code").unwrap_or(1) as i32);
    }
    let hostile = knobs.get("hostile").map(attempt).unwrap_or(Value::Null);
    let state = Knobs {
        token_delay_ms: n("token_delay_ms").unwrap_or(0),
        tokens: n("tokens").unwrap_or(8),
        crash_after_tokens: n("crash_after_tokens"),
        omit_done: knobs.get("omit_done") == Some(&json!(true)),
        token_bytes: n("token_bytes").unwrap_or(0) as usize,
        replies: knobs.get("replies").and_then(Value::as_array).cloned().unwrap_or_default(),
        script: std::sync::Arc::new(std::sync::Mutex::new(
            knobs.get("script").and_then(Value::as_array).cloned().unwrap_or_default().into(),
        )),
        headers_log: knobs.get("headers_log").and_then(Value::as_str).map(str::to_string),
    };
    let alias = arg(&args, "--alias").unwrap_or_else(|| "fake".into());
    // Without the knob, no /metrics (as llama-server without --metrics): a 404.
    let metrics = knobs.get("metrics").and_then(Value::as_str).map(str::to_string);
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/hostile", get(move || async move { Json(hostile) }))
        .route("/slots", get(|| async { Json(json!([{"id": 0, "is_processing": false}])) }))
        .route("/v1/chat/completions", post(chat))
        .route(
            "/metrics",
            get(move || async move {
                use axum::response::IntoResponse;
                match metrics {
                    Some(m) => m.into_response(),
                    None => (axum::http::StatusCode::NOT_FOUND, Json(json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}))).into_response(),
                }
            }),
        )
        .route("/v1/models", get(move || async move { Json(json!({"object": "list", "data": [{"id": alias, "object": "model", "owned_by": "fake"}]})) }))
        .route("/v1/embeddings", post(|| async { Json(json!({"object": "list", "model": "fake", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.5]}]})) }))
        .with_state(state);
    // llama-server style (--port 0, the real port logged) or a port chosen by the caller
    // (ryzenai-server style: `-m <dir> --port P --ctx-size N`).
    let port = arg(&args, "--port").unwrap_or_else(|| "0".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await.unwrap();
    eprintln!("main: server is listening on http://{} - starting the main loop", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}

async fn chat(
    State(k): State<Knobs>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(path) = &k.headers_log {
        use std::io::Write;
        let seen: serde_json::Map<String, Value> =
            headers.iter().map(|(n, v)| (n.to_string(), json!(String::from_utf8_lossy(v.as_bytes())))).collect();
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{}", Value::Object(seen)).unwrap();
    }
    let next = k.script.lock().unwrap().pop_front();
    if let Some(step) = next.filter(|s| s["status"].as_u64() != Some(200)) {
        let status = axum::http::StatusCode::from_u16(step["status"].as_u64().unwrap_or(500) as u16).unwrap();
        let mut r = (status, Json(json!({"error": {"message": format!("scripted {status}"), "type": "scripted"}})))
            .into_response();
        if let Some(ra) = step["retry_after"].as_str() {
            r.headers_mut().insert("retry-after", ra.parse().unwrap());
        }
        return r;
    }
    // At most a context's worth, as llama-server (a fuzzer's max_tokens of 10^12 would
    // otherwise build an answer that never ends and starve /health).
    let tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(k.tokens).min(4096);
    if body.get("stream") != Some(&json!(true)) && !k.replies.is_empty() {
        return Json(scripted(&k.replies, &body)).into_response();
    }
    if body.get("stream") != Some(&json!(true)) {
        tokio::time::sleep(Duration::from_millis(k.token_delay_ms * tokens)).await;
        let mut text: String = (0..tokens).map(|i| format!("tok{i} ")).collect();
        // A JSON schema held to (llama-server's grammar): an object with each required
        // property, integers at their minimum (how /classify's scores are asked for).
        if let Some(required) = body.pointer("/response_format/json_schema/schema/required").and_then(Value::as_array) {
            let props = body.pointer("/response_format/json_schema/schema/properties");
            let value = |k: &str| props.and_then(|p| p[k]["minimum"].as_i64()).map_or(json!("x"), |m| json!(m));
            let o: serde_json::Map<String, Value> =
                required.iter().filter_map(Value::as_str).map(|k| (k.to_string(), value(k))).collect();
            text = Value::Object(o).to_string();
        }
        return Json(json!({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}}))
        .into_response();
    }
    let stream = async_stream(k, tokens);
    ([("content-type", "text/event-stream")], Body::from_stream(stream)).into_response()
}

/// The scripted answer to a whole chat request (the `replies` knob).
fn scripted(replies: &[Value], body: &Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let turn = messages.iter().filter(|m| m["role"] == "assistant").count();
    let mut message = replies.get(turn).or(replies.last()).cloned().unwrap_or(json!({}));
    let last = messages.last().map(|m| m["content"].as_str().unwrap_or_default().to_string()).unwrap_or_default();
    if let Some(c) = message["content"].as_str() {
        message["content"] = c.replace("{last}", &last).into();
    }
    message["role"] = "assistant".into();
    let finish = if message["tool_calls"].is_array() { "tool_calls" } else { "stop" };
    json!({"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
}

fn async_stream(k: Knobs, tokens: u64) -> impl futures_util::Stream<Item = Result<String, Infallible>> {
    futures_util::stream::unfold(0u64, move |i| {
        let k = k.clone();
        async move {
            if i > tokens {
                return None;
            }
            if k.crash_after_tokens == Some(i) {
                // Mid-stream means after the tokens sent so far reached the client: give the
                // server a moment to flush them (and the headers) before dying.
                tokio::time::sleep(Duration::from_millis(k.token_delay_ms.max(200))).await;
                eprintln!("fake llama-server: crashing mid-stream");
                std::process::exit(1);
            }
            tokio::time::sleep(Duration::from_millis(k.token_delay_ms)).await;
            let chunk = if i == tokens {
                format!(
                    "data: {}\n\n{}",
                    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}),
                    if k.omit_done { "" } else { "data: [DONE]\n\n" }
                )
            } else {
                let text = format!("{:<width$}", format!("tok{i} "), width = k.token_bytes);
                format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": text}}]}))
            };
            Some((Ok(chunk), i + 1))
        }
    })
}

/// What a compromised backend would try (the `hostile` knob); each outcome is `ok` or the
/// error the attempt met.
fn attempt(plan: &Value) -> Value {
    use std::io::Read;
    // SAFETY: getppid and kill(pid, 0) have no preconditions.
    let ppid = unsafe { libc::getppid() };
    let fill = |s: &str| s.replace("{ppid}", &ppid.to_string());
    let list = |k: &str| plan.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
    let text = |v: &Value| fill(&v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
    let outcome = |r: std::io::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    let mut out = serde_json::Map::new();
    for p in list("read") {
        let p = text(&p);
        let r = std::fs::File::open(&p).and_then(|mut f| f.read(&mut [0u8; 16]).map(|_| ()));
        out.insert(format!("read {p}"), json!(outcome(r)));
    }
    for p in list("write") {
        let p = text(&p);
        out.insert(format!("write {p}"), json!(outcome(std::fs::write(&p, b"pwned"))));
    }
    for port in list("connect") {
        let addr = format!("127.0.0.1:{}", text(&port));
        let r = std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).map(|_| ());
        out.insert(format!("connect {addr}"), json!(outcome(r)));
    }
    for port in list("bind") {
        let addr = format!("127.0.0.1:{}", text(&port));
        out.insert(format!("bind {addr}"), json!(outcome(std::net::TcpListener::bind(&addr).map(|_| ()))));
    }
    let environ = format!("/proc/{ppid}/environ");
    let r = std::fs::read(&environ).map(|_| ());
    out.insert(format!("read {environ}"), json!(outcome(r)));
    // SAFETY: signal 0 only checks whether a signal could be sent.
    let sent = unsafe { libc::kill(ppid, 0) };
    out.insert(
        "signal lemonade".into(),
        json!(outcome(if sent == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) })),
    );
    if let Some(cmd) = plan.get("shell").and_then(Value::as_str) {
        let r = std::process::Command::new("/bin/sh").args(["-c", &fill(cmd)]).output();
        let said = match r {
            Ok(o) => {
                json!({"status": o.status.code(), "stdout": String::from_utf8_lossy(&o.stdout), "stderr": String::from_utf8_lossy(&o.stderr)})
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        out.insert("shell".into(), said);
    }
    Value::Object(out)
}
