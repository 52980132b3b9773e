//! Access control (API key on every route family, CORS) and the log endpoints, through the
//! real binary (with the fake backend where a model is needed).

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const KEY: &str = "s3cret-key";

async fn keyed() -> Lemonade {
    let s = fake_sandbox(&[("m", None, json!({}))]);
    let fake = fake_llama_server();
    Lemonade::start_in(
        bin(),
        s,
        &[],
        &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()), ("LEMONADE_API_KEY", KEY)],
    )
    .await
}

/// (method, path, body) for every route family; each under every API prefix.
fn routes() -> Vec<(&'static str, String, Option<Value>)> {
    let chat = json!({"model": "extra.m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let mut v = Vec::new();
    for prefix in ["/api/v0", "/api/v1", "/v0", "/v1"] {
        let p = |s: &str| format!("{prefix}{s}");
        v.extend([
            ("POST", p("/chat/completions"), Some(chat.clone())),
            ("POST", p("/completions"), Some(json!({"model": "extra.m", "prompt": "hi", "max_tokens": 2}))),
            ("POST", p("/responses"), Some(json!({"model": "extra.m", "input": "hi"}))),
            ("POST", p("/embeddings"), Some(json!({"model": "extra.m", "input": "hi"}))),
            ("POST", p("/reranking"), Some(json!({"model": "extra.m", "query": "q", "documents": ["a"]}))),
            ("GET", p("/models"), None),
            ("GET", p("/models/extra.m"), None),
            ("GET", p("/models/extra.m/options"), None),
            ("POST", p("/models/extra.m/options"), Some(json!({"ctx_size": 2048, "dry_run": true}))),
            ("DELETE", p("/models/extra.m/options"), None),
            ("POST", p("/models/register"), Some(json!({"model_name": "user.R"}))),
            ("GET", p("/pull/variants"), None),
            ("GET", p("/registry/search?query=ab"), None),
            ("GET", p("/models/extra.m/files"), None),
            ("POST", p("/models/check-updates"), Some(json!({}))),
            ("GET", p("/downloads"), None),
            ("POST", p("/cloud/auth"), Some(json!({"provider": "nope", "api_key": "x"}))),
            ("DELETE", p("/cloud/auth/nope"), None),
            ("POST", p("/downloads/control"), Some(json!({"id": "model:nope", "action": "remove"}))),
            ("GET", p("/stats"), None),
            ("GET", p("/system-info"), None),
            ("GET", p("/system-stats"), None),
            ("POST", p("/load"), Some(json!({"model_name": "extra.m"}))),
            ("POST", p("/unload"), Some(json!({}))),
            ("POST", p("/pull"), Some(json!({"model": "nope"}))),
            ("POST", p("/delete"), Some(json!({"model": "nope"}))),
            ("POST", p("/install"), Some(json!({}))),
            ("POST", p("/uninstall"), Some(json!({}))),
            ("POST", p("/log-level"), Some(json!({"level": "info"}))),
            ("GET", p("/admin/models"), None),
            ("POST", p("/routing/validate"), Some(json!({"policy": {}}))),
            ("POST", p("/classify"), Some(json!({}))),
            ("GET", p("/scheduler"), None),
            ("POST", p("/scheduler/plan"), Some(json!({"model_name": "extra.m"}))),
            ("GET", p("/admin/gpu-memory"), None),
            ("POST", p("/admin/models/extra.m/unload"), Some(json!({}))),
            ("GET", p("/props?model=extra.m"), None),
            ("POST", p("/tokenize"), Some(json!({"model": "extra.m", "content": "hi"}))),
            ("POST", p("/audio/speech"), Some(json!({"model": "extra.m", "input": "hi"}))),
            ("POST", p("/images/generations"), Some(json!({"model": "extra.m", "prompt": "a lemon"}))),
            ("GET", p("/cloud"), None),
            ("GET", p("/log-level"), None),
            (
                "POST",
                p("/messages"),
                Some(json!({"model": "extra.m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})),
            ),
            ("POST", p("/messages/count_tokens"), Some(json!({"model": "extra.m", "messages": "not a list"}))),
            ("GET", p("/params"), None),
            ("POST", p("/params"), Some(json!({"swap_hold_ms": 2000}))),
            ("POST", p("/pin"), Some(json!({"model": "extra.m", "pinned": false}))),
            ("DELETE", p("/prompt-cache"), None),
            ("POST", p("/admin/models/extra.m/load"), Some(json!({}))),
            ("GET", p("/no-such-endpoint"), None),
        ]);
    }
    v.extend([
        ("POST", "/completion".to_string(), Some(json!({"model": "extra.m", "prompt": "hi"}))),
        ("GET", "/props?model=extra.m".to_string(), None),
        ("GET", "/metrics?model=extra.m".to_string(), None),
        ("GET", "/api/tags".to_string(), None),
        ("GET", "/api/ps".to_string(), None),
        ("GET", "/api/version".to_string(), None),
        (
            "POST",
            "/api/chat".to_string(),
            Some(json!({"model": "extra.m", "stream": false, "messages": [{"role": "user", "content": "hi"}]})),
        ),
        ("POST", "/api/generate".to_string(), Some(json!({"model": "extra.m", "stream": false, "prompt": "hi"}))),
        ("POST", "/api/embed".to_string(), Some(json!({"model": "extra.m", "input": "hi"}))),
        ("POST", "/api/embeddings".to_string(), Some(json!({"model": "extra.m", "prompt": "hi"}))),
        ("POST", "/api/show".to_string(), Some(json!({"model": "extra.m"}))),
        ("POST", "/api/pull".to_string(), Some(json!({"model": "nobody/nope:Q4_0", "stream": false}))),
        ("DELETE", "/api/delete".to_string(), None),
        ("GET", "/slots?model=extra.m".to_string(), None),
        ("POST", "/tokenize".to_string(), Some(json!({"model": "extra.m", "content": "hi"}))),
        ("GET", "/internal/aliases".to_string(), None),
        ("POST", "/internal/aliases".to_string(), Some(json!({"alias": "a1", "target": "extra.m"}))),
        ("DELETE", "/internal/aliases/nope".to_string(), None),
        ("GET", "/internal/config".to_string(), None),
        ("GET", "/internal/config/defaults".to_string(), None),
        ("POST", "/internal/set".to_string(), Some(json!({"swap_hold_ms": 2000}))),
        ("POST", "/internal/pin".to_string(), Some(json!({"model": "extra.m", "pinned": false}))),
        ("POST", "/internal/cleanup-cache".to_string(), Some(json!({"dry_run": true}))),
        ("POST", "/mcp".to_string(), Some(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))),
    ]);
    v
}

async fn call(l: &Lemonade, method: &str, path: &str, body: &Option<Value>, key: Option<&str>) -> (u16, String) {
    let mut r = match method {
        "GET" => l.http.get(l.url(path)),
        "DELETE" => l.http.delete(l.url(path)),
        _ => l.http.post(l.url(path)).json(body.as_ref().unwrap_or(&json!({}))),
    };
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.timeout(Duration::from_secs(30)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// What each route of [`routes`] answers with the key, by (method, path without its prefix):
/// the exact status, as security.rs pins the admin endpoints' answers. The fake backend
/// answers 404 for what it does not serve (`/completions`, `/responses`, `/props`, …).
const WITH_THE_KEY: &[(&str, &str, u16)] = &[
    ("DELETE", "/api/delete", 400),
    ("DELETE", "/cloud/auth/nope", 404),
    ("DELETE", "/internal/aliases/nope", 404),
    ("DELETE", "/models/extra.m/options", 200),
    ("DELETE", "/prompt-cache", 200),
    ("GET", "/admin/gpu-memory", 200),
    ("GET", "/admin/models", 200),
    ("GET", "/api/ps", 200),
    ("GET", "/api/tags", 200),
    ("GET", "/api/version", 200),
    ("GET", "/cloud", 200),
    ("GET", "/downloads", 200),
    ("GET", "/internal/aliases", 200),
    ("GET", "/internal/config", 200),
    ("GET", "/internal/config/defaults", 200),
    ("GET", "/log-level", 200),
    ("GET", "/metrics?model=extra.m", 404),
    ("GET", "/models", 200),
    ("GET", "/models/extra.m", 200),
    ("GET", "/models/extra.m/files", 200),
    ("GET", "/models/extra.m/options", 200),
    ("GET", "/no-such-endpoint", 404),
    ("GET", "/params", 200),
    ("GET", "/props?model=extra.m", 404),
    ("GET", "/pull/variants", 400),
    ("GET", "/registry/search?query=ab", 400),
    ("GET", "/scheduler", 200),
    ("GET", "/slots?model=extra.m", 200),
    ("GET", "/stats", 200),
    ("GET", "/system-info", 200),
    ("GET", "/system-stats", 200),
    ("POST", "/admin/models/extra.m/load", 200),
    ("POST", "/admin/models/extra.m/unload", 200),
    ("POST", "/api/chat", 200),
    ("POST", "/api/embed", 400),
    ("POST", "/api/embeddings", 400),
    ("POST", "/api/generate", 200),
    ("POST", "/api/pull", 404),
    ("POST", "/api/show", 200),
    ("POST", "/audio/speech", 400),
    ("POST", "/chat/completions", 200),
    ("POST", "/classify", 400),
    ("POST", "/cloud/auth", 404),
    ("POST", "/completion", 404),
    ("POST", "/completions", 404),
    ("POST", "/delete", 422),
    ("POST", "/downloads/control", 200),
    ("POST", "/embeddings", 400),
    ("POST", "/images/generations", 400),
    ("POST", "/install", 400),
    ("POST", "/internal/aliases", 200),
    ("POST", "/internal/cleanup-cache", 200),
    ("POST", "/internal/pin", 200),
    ("POST", "/internal/set", 200),
    ("POST", "/load", 200),
    ("POST", "/log-level", 200),
    ("POST", "/mcp", 200),
    ("POST", "/messages", 200),
    ("POST", "/messages/count_tokens", 400),
    ("POST", "/models/check-updates", 200),
    ("POST", "/models/extra.m/options", 200),
    ("POST", "/models/register", 400),
    ("POST", "/params", 200),
    ("POST", "/pin", 400),
    ("POST", "/pull", 400),
    ("POST", "/reranking", 400),
    ("POST", "/responses", 404),
    ("POST", "/routing/validate", 400),
    ("POST", "/scheduler/plan", 200),
    ("POST", "/tokenize", 404),
    ("POST", "/uninstall", 400),
    ("POST", "/unload", 200),
];

/// The status [`WITH_THE_KEY`] gives `method path` (any prefix); it must list every route.
fn expected(method: &str, path: &str) -> u16 {
    let bare =
        ["/api/v0/", "/api/v1/", "/v0/", "/v1/"].iter().find_map(|p| path.strip_prefix(p).map(|r| format!("/{r}")));
    let bare = bare.unwrap_or_else(|| path.to_string());
    match WITH_THE_KEY.iter().find(|(m, p, _)| *m == method && *p == bare) {
        Some((_, _, s)) => *s,
        None => panic!("{method} {path} is not in WITH_THE_KEY: add its answer"),
    }
}

#[tokio::test]
async fn every_route_family_needs_the_key() {
    let l = keyed().await;
    let routes = routes();
    assert!(routes.len() > 90);
    for (method, path, body) in &routes {
        for key in [None, Some("wrong"), Some("s3cret-ke"), Some("s3cret-key2")] {
            let (s, text) = call(&l, method, path, body, key).await;
            assert_eq!(
                (s, text.as_str()),
                (401, r#"{"error": "Invalid or missing API key"}"#),
                "{method} {path} with {key:?}"
            );
        }
        // With the key, the route itself answers: its result, or its own error about the request.
        let (s, text) = call(&l, method, path, body, Some(KEY)).await;
        assert_eq!(s, expected(method, path), "{method} {path} with the key: {text}");
        assert!(!text.contains("API key"), "{method} {path} with the key: {text}");
        if s >= 400 {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: {text}"));
            // The dialect's own shape: `{"error": {"message"}}` (OpenAI, Anthropic), or
            // `{"error": "…"}` (Ollama's; Lemonade v11's management routes).
            let v11 = ["/pull", "/pull/variants", "/registry/search", "/routing/validate"]
                .iter()
                .any(|r| path.split('?').next().is_some_and(|p| p.ends_with(r)));
            let msg = v["error"]["message"]
                .as_str()
                .or(v["error"].as_str().filter(|_| v11 || (path.starts_with("/api/") && !path.starts_with("/api/v"))))
                .unwrap_or_default();
            assert!(!msg.is_empty(), "{method} {path}: an error names its cause: {text}");
        } else {
            assert!(!text.trim().is_empty(), "{method} {path}: an empty answer");
        }
    }
    // The key in a different scheme is not accepted.
    let r = l.http.get(l.url("/api/v1/models")).header("authorization", format!("Basic {KEY}")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // Public: liveness, health (for monitors), the API document and its UI, CORS preflights.
    for path in
        ["/live", "/api/v1/health", "/v1/health", "/api/v0/health", "/v0/health", "/api/v1/openapi.json", "/docs/"]
    {
        let (s, text) = call(&l, "GET", path, &None, None).await;
        assert_eq!(s, 200, "{path}: {text}");
    }
    let r = l.http.request(reqwest::Method::OPTIONS, l.url("/api/v1/chat/completions")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 204);
    // The CLI sends the key from --api-key or LEMONADE_API_KEY.
    let (code, _, err) = l.cli(&["list"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("Invalid or missing API key"), "{err}");
    let (code, out, _) = l.cli(&["list", "--api-key", KEY, "--json"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("\"id\": \"m\"") || out.contains("\"id\":\"m\""), "listed by its bare name: {out}");
    let (code, _, _) = l.cli_env(&["status"], &[("LEMONADE_API_KEY", KEY)]).await;
    assert_eq!(code, 0);
    // Shutting the server down needs the key too (and with it, it goes).
    assert_eq!(call(&l, "POST", "/internal/shutdown", &None, None).await.0, 401);
    assert_eq!(call(&l, "GET", "/logs/stream", &None, None).await.0, 401, "the WebSocket log stream too");
    assert_eq!(call(&l, "GET", "/api/v1/scheduler/events", &None, None).await.0, 401, "the scheduler's events too");
    assert_eq!(call(&l, "GET", "/api/v1/models", &None, Some(KEY)).await.0, 200, "still up");
}

#[tokio::test]
async fn cors_echoes_allowed_origins_and_refuses_others() {
    // The rest of the origin rules are in tests/security.rs.
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    let r = l.http.get(l.url("/api/v1/models")).header("origin", "http://localhost:3000").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:3000", "echoed, never *");
    assert_eq!(h["access-control-allow-headers"], "Content-Type, Authorization, X-Lemonade-Priority");
    assert_eq!(h["access-control-allow-methods"], "GET, POST, PUT, DELETE, OPTIONS");
    assert_eq!(h["vary"], "Origin");
    let r = l
        .http
        .request(reqwest::Method::OPTIONS, l.url("/anything/at/all"))
        .header("origin", "http://127.0.0.1:8080")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "http://127.0.0.1:8080");
    assert_eq!(r.text().await.unwrap(), "");
    drop(l);

    let l = Lemonade::start_in(
        bin(),
        Sandbox::empty(),
        &[],
        &[("LEMONADE_ALLOWED_ORIGINS", "http://app.test, https://ui.example")],
    )
    .await;
    for (origin, allowed) in [("http://app.test", true), ("https://ui.example", true), ("http://evil.test", false)] {
        let r = l.http.get(l.url("/api/v1/models")).header("origin", origin).send().await.unwrap();
        assert_eq!(r.status().as_u16(), if allowed { 200 } else { 403 }, "{origin}");
        let h = r.headers();
        assert_eq!(
            h.get("access-control-allow-origin").map(|v| v.to_str().unwrap()),
            allowed.then_some(origin),
            "{origin}"
        );
        assert_eq!(h["vary"], "Origin");
    }
}

#[tokio::test]
async fn a_public_address_without_a_key_is_refused_unless_the_operator_says_so() {
    // Refused before anything starts, saying how to set a key.
    let s = Sandbox::empty();
    let mut cmd = std::process::Command::new(bin());
    s.apply(&mut cmd);
    let out = cmd.args(["serve", "--host", "0.0.0.0", "--port", "0"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to listen on 0.0.0.0:") && err.contains("with no API key"), "{err}");
    assert!(err.contains("LEMONADE_API_KEY=") && err.contains("--allow-no-api-key"), "{err}");
    // With a key it serves, with no warning.
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &["--host", "0.0.0.0"], &[("LEMONADE_API_KEY", "k-open-bind")])
        .await;
    assert!(!l.log().contains("with no API key"), "{}", l.log());
    drop(l);
    // Said explicitly: it serves, and warns.
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &["--host", "0.0.0.0", "--allow-no-api-key"], &[]).await;
    assert!(l.log().contains("with no API key"), "{}", l.log());
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    assert!(!l.log().contains("with no API key"));
}

/// Reads an SSE stream until `needle` shows up in a `data:` line (bounded).
async fn read_until(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    seen: &mut String,
    needle: &str,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.lines().any(|l| l.starts_with("data: ") && l.contains(needle)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Ok(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            _ => return false,
        }
    }
    true
}

#[tokio::test]
async fn log_level_changes_what_logs_stream_shows() {
    let mut l = Lemonade::start_in(bin(), Sandbox::empty(), &["--log-level", "info"], &[]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["log_streaming"]["sse"], true);
    let r = l.http.get(l.url("/api/v1/logs/stream")).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    // The past: the start-up line is in the kept tail.
    assert!(read_until(&mut stream, &mut seen, "listening on http://").await, "{seen}");

    // A rejected request is logged at debug level: not shown at info.
    let (s, _) = l.post("/api/v1/unload", &json!({"model_name": "first-marker"})).await;
    assert_eq!(s, 404);
    let (s, v) = l.post("/api/v1/log-level", &json!({"level": "debug"})).await;
    assert_eq!((s, v), (200, json!({"status": "success", "level": "debug"})));
    let (s, _) = l.post("/api/v1/unload", &json!({"model_name": "second-marker"})).await;
    assert_eq!(s, 404);
    assert!(read_until(&mut stream, &mut seen, "second-marker").await, "{seen}");
    assert!(!seen.contains("first-marker"), "a debug line was shown at info level: {seen}");

    let (s, v) = l.post("/api/v1/log-level", &json!({"level": "loud"})).await;
    assert_eq!(s, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("critical, error, warning, info, debug, trace"), "{v}");
    let (s, _) = l.post("/api/v1/log-level", &json!({})).await;
    assert_eq!(s, 400);

    // Shutting down ends the open stream (it does not hold the shutdown up until the 10 s cap).
    l.signal(libc::SIGTERM);
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(end.is_ok(), "the log stream did not end at shutdown: {seen}");
    let code = tokio::task::spawn_blocking(move || (l.wait_exit(Duration::from_secs(20)), l.log())).await.unwrap();
    assert!(code.0.is_some_and(|c| c.success()), "{code:?}");
    assert!(!code.1.contains("connections still open"), "{}", code.1);
}

#[tokio::test]
async fn the_key_guards_real_inference() {
    // The same check against real llama-server: the key is the only difference between a 401
    // and a real answer.
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_API_KEY", KEY)]).await;
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8});
    let r = l.http.post(l.url("/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(child_pids(l.pid()).is_empty(), "nothing was loaded for an unauthenticated request");
    let r = l.http.post(l.url("/v1/chat/completions")).bearer_auth(KEY).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    drop(l);

    // With an admin key too, against real llama-server: the API key answers inference but may
    // not unload the model it serves; the admin key may, and the backend process goes.
    const ADMIN: &str = "adm1n-7c2e";
    let l =
        Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_API_KEY", KEY), ("LEMONADE_ADMIN_API_KEY", ADMIN)])
            .await;
    for key in [KEY, ADMIN] {
        let r = l.http.post(l.url("/v1/chat/completions")).bearer_auth(key).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{key}");
    }
    let unload = json!({"model_name": SMOL});
    let r = l.http.post(l.url("/api/v1/unload")).bearer_auth(KEY).json(&unload).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(child_pids(l.pid()).len(), 1, "the model is still loaded");
    let r = l.http.post(l.url("/api/v1/unload")).bearer_auth(ADMIN).json(&unload).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(child_pids(l.pid()).is_empty(), "the admin key unloaded it");
}

/// The operations of the route table (the OpenAPI document, which the server's router is
/// checked against) that [`routes`] does not exercise with the key, and why. A route in
/// neither list fails [`every_operation_of_the_route_table_under_every_prefix_needs_the_key`]:
/// a new route must join the access tests.
const NOT_IN_ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/live", "public: liveness"),
    ("GET", "/api/v1/health", "public: health, for monitors"),
    ("GET", "/health", "public: a router's health probe"),
    ("GET", "/get_load", "public: a router's load probe"),
    ("GET", "/api/v1/logs/stream", "a stream: log_level_changes_what_logs_stream_shows"),
    ("GET", "/logs/stream", "a WebSocket: the websocket tests"),
    ("GET", "/api/v1/scheduler/events", "a stream that never ends"),
    ("POST", "/internal/shutdown", "stops the server: cli.rs"),
    ("POST", "/internal/telemetry/flush", "config.rs's OTLP test"),
    ("POST", "/api/v1/audio/transcriptions", "multipart: audio.rs"),
    ("POST", "/api/v1/audio/translations", "multipart: audio.rs"),
    ("POST", "/api/v1/images/edits", "multipart: images.rs"),
    ("POST", "/api/v1/images/variations", "multipart: images.rs"),
    ("POST", "/api/create", "501 by design (the bad-input corpus checks that it always is)"),
];

/// The operations only the admin key may use when one is set (the API key gets a 403
/// `admin_key_required`), as `(method, path)` of the route table.
const ADMIN_OPS: &[(&str, &str)] = &[
    ("POST", "/api/v1/pull"),
    ("POST", "/api/v1/delete"),
    ("POST", "/api/v1/install"),
    ("POST", "/api/v1/uninstall"),
    ("POST", "/api/v1/load"),
    ("POST", "/api/v1/unload"),
    ("POST", "/api/v1/log-level"),
    ("POST", "/api/v1/downloads/control"),
    ("POST", "/api/v1/cloud/auth"),
    ("DELETE", "/api/v1/cloud/auth/{provider}"),
    ("DELETE", "/api/v1/prompt-cache"),
    ("POST", "/api/v1/models/{id}/options"),
    ("DELETE", "/api/v1/models/{id}/options"),
    ("POST", "/api/v1/models/register"),
    ("POST", "/v1/admin/models/{model_name}/load"),
    ("POST", "/v1/admin/models/{model_name}/unload"),
    ("POST", "/api/pull"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/create"),
    ("GET", "/internal/aliases"),
    ("POST", "/internal/aliases"),
    ("DELETE", "/internal/aliases/{alias}"),
    ("GET", "/internal/config"),
    ("GET", "/internal/config/defaults"),
    ("POST", "/internal/set"),
    ("POST", "/internal/pin"),
    ("POST", "/internal/cleanup-cache"),
    ("POST", "/internal/shutdown"),
    ("POST", "/internal/telemetry/flush"),
];

/// Every operation of the OpenAPI document: (method, path as documented).
async fn route_table(l: &Lemonade) -> Vec<(String, String)> {
    let (s, doc) = l.get("/api/v1/openapi.json").await;
    assert_eq!(s, 200, "the route table is public");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "delete", "put", "patch"] {
            if item.get(method).is_some() {
                ops.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    assert!(ops.len() > 80, "{ops:?}");
    ops
}

/// A documented path made concrete, under each prefix it is served at (`/api/v1/…` also under
/// `/api/v0`, `/v0` and `/v1`).
fn concrete(path: &str) -> Vec<String> {
    let p = path
        .replace("{id}", "extra.m")
        .replace("{model_name}", "extra.m")
        .replace("{provider}", "nope")
        .replace("{alias}", "nope");
    match p.strip_prefix("/api/v1") {
        Some(rest) => ["/api/v0", "/api/v1", "/v0", "/v1"].iter().map(|pre| format!("{pre}{rest}")).collect(),
        None => vec![p],
    }
}

/// A path of [`routes`] as the route table documents it (`/api/v1` form, parameters named).
fn documented(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let path = ["/api/v0", "/v0", "/v1"]
        .iter()
        .find_map(|pre| path.strip_prefix(pre).filter(|r| !r.starts_with("/admin")).map(|r| format!("/api/v1{r}")))
        .unwrap_or_else(|| path.to_string());
    let path = path.replace("/models/extra.m/", "/models/{id}/");
    let path = if path.ends_with("/models/extra.m") { path.replace("extra.m", "{id}") } else { path };
    path.replace("/admin/models/{id}/", "/admin/models/{model_name}/")
        .replace("/api/v1/admin/models/extra.m/", "/v1/admin/models/{model_name}/")
        .replace("/cloud/auth/nope", "/cloud/auth/{provider}")
        .replace("/internal/aliases/nope", "/internal/aliases/{alias}")
}

#[tokio::test]
async fn every_operation_of_the_route_table_under_every_prefix_needs_the_key() {
    let l = keyed().await;
    let public = ["/live", "/health", "/get_load"];
    let listed: std::collections::BTreeSet<(String, String)> =
        routes().into_iter().map(|(m, p, _)| (m.to_string(), documented(&p))).collect();
    let mut unlisted = Vec::new();
    let mut tried = 0;
    for (method, path) in route_table(&l).await {
        let known = NOT_IN_ROUTES.iter().any(|(m, p, _)| *m == method && *p == path);
        if !known && !listed.contains(&(method.clone(), path.clone())) {
            unlisted.push(format!("{method} {path}"));
        }
        for p in concrete(&path) {
            let health = p.ends_with("/health");
            let open = public.contains(&p.as_str()) || health;
            for key in [None, Some("wrong")] {
                let (s, text) = call(&l, &method, &p, &None, key).await;
                tried += 1;
                match open {
                    true => assert!(s < 400 && method == "GET", "{method} {p} is public: {s} {text}"),
                    false => assert_eq!(
                        (s, text.as_str()),
                        (401, r#"{"error": "Invalid or missing API key"}"#),
                        "{method} {p} with {key:?}"
                    ),
                }
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "routes the access tests do not exercise (add them to routes() or NOT_IN_ROUTES): {unlisted:?}"
    );
    assert!(tried > 400, "{tried}");
}

#[tokio::test]
async fn the_admin_operations_of_the_route_table_refuse_the_api_key_and_the_others_take_it() {
    let s = fake_sandbox(&[("m", None, json!({}))]);
    let fake = fake_llama_server();
    let env = [
        ("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()),
        ("LEMONADE_API_KEY", KEY),
        ("LEMONADE_ADMIN_API_KEY", "adm1n-7c2e"),
    ];
    let l = Lemonade::start_in(bin(), s, &[], &env).await;
    let forbidden = r#"{"error":{"message":"This endpoint changes the server: it needs LEMONADE_ADMIN_API_KEY, not the API key","type":"forbidden","code":"admin_key_required"}}"#;
    let never_ending = ["/logs/stream", "/scheduler/events"];
    for (method, path) in route_table(&l).await {
        let admin = ADMIN_OPS.iter().any(|(m, p)| *m == method && *p == path);
        for p in concrete(&path) {
            if !admin && never_ending.iter().any(|n| p.ends_with(n)) {
                continue;
            }
            let (s, text) = call(&l, &method, &p, &Some(json!({})), Some(KEY)).await;
            match admin {
                true => assert_eq!((s, text.as_str()), (403, forbidden), "{method} {p} with the API key"),
                false => assert!(s != 401 && s != 403, "{method} {p} with the API key: {s} {text}"),
            }
        }
    }
}
