//! Lemonade v11's live configuration through `lemonade serve` on real llama-server:
//! `config.json` read at start under the flags, `GET /internal/config`, `POST /internal/set`
//! (checked whole, written atomically, applied where it takes effect), a corrupt file refused,
//! `settings.json` folded in, `POST /params` writing the same file, and `lemonade config`.

use std::path::Path;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn file(l: &Lemonade) -> Value {
    serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("config.json")).unwrap()).unwrap()
}

#[tokio::test]
async fn real_llama_server_config_json_flags_and_internal_set() {
    let s = Sandbox::new();
    std::fs::create_dir_all(s.cache()).unwrap();
    let saved = json!({"ctx_size": 2048, "max_loaded_models": 2, "log_level": "debug", "future_key": {"kept": true}});
    std::fs::write(s.cache().join("config.json"), saved.to_string()).unwrap();
    std::fs::write(s.cache().join("settings.json"), r#"{"swap_hold_ms": 1500}"#).unwrap();
    let l = Lemonade::start_in(bin(), s, &["--max-loaded-models", "3"], &[]).await;

    // Defaults < config.json < flags; settings.json folded into config.json once.
    let (s, c) = l.get("/internal/config").await;
    assert_eq!(s, 200, "{c}");
    assert_eq!((c["ctx_size"].clone(), c["log_level"].clone()), (json!(2048), json!("debug")), "{c}");
    assert_eq!(c["max_loaded_models"], 3, "the flag wins over the file for this run");
    assert_eq!((c["swap_hold_ms"].clone(), c["load_timeout"].clone()), (json!(1500), json!(600)));
    assert_eq!(file(&l)["max_loaded_models"], 2, "flags are never written back");
    assert_eq!(file(&l)["swap_hold_ms"], 1500);
    assert!(l.sandbox.cache().join("settings.json.migrated").exists());
    assert!(!l.sandbox.cache().join("settings.json").exists());
    let (_, d) = l.get("/internal/config/defaults").await;
    assert_eq!((d["ctx_size"].clone(), d["max_loaded_models"].clone()), (json!(4096), json!(1)));

    // A bad key or value: 400 naming it, nothing changes.
    let before = (l.get("/internal/config").await.1, file(&l));
    for (body, param) in [
        (json!({"ctx_size": 3072, "nope": 1}), "nope"),
        (json!({"log_level": "loud"}), "log_level"),
        (json!({"llamacpp_args": "--port 9"}), "llamacpp_args"),
        (json!({"memory_budget": "lots"}), "memory_budget"),
    ] {
        let (s, e) = l.post("/internal/set", &body).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
    assert_eq!((l.get("/internal/config").await.1, file(&l)), before, "refused updates changed nothing");

    // A good one: saved (unknown keys kept), applied at once or at the next load.
    let extra = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(model(SMOL_FILE), extra.path().join("tiny.gguf")).unwrap();
    let set = json!({"ctx_size": 3072, "max_loaded_models": 4, "log_level": "info",
                     "extra_models_dir": extra.path().display().to_string(), "load_timeout": 120});
    let (s, v) = l.post("/internal/set", &set).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("success")), "{v}");
    assert_eq!(v["updated"]["ctx_size"], 3072);
    let f = file(&l);
    assert_eq!((f["ctx_size"].clone(), f["future_key"].clone()), (json!(3072), json!({"kept": true})), "{f}");
    assert_eq!(l.get("/api/v1/params").await.1["max_loaded_models"]["llm"], 4, "the scheduler at once");
    assert_eq!(l.get("/api/v1/log-level").await.1["level"], "info", "the log level at once");
    let (s, m) = l.get("/api/v1/models/extra.tiny").await;
    assert_eq!((s, m["downloaded"].clone()), (200, json!(true)), "the new extra models dir is scanned: {m}");
    assert_eq!(l.get("/internal/config").await.1["load_timeout"], 120);
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let (_, props) = l.get(&format!("/props?model={SMOL}")).await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 3072, "options at the next load");

    // null resets a key to its default and removes it from the file.
    let (s, v) = l.post("/internal/set", &json!({"ctx_size": null})).await;
    assert_eq!((s, v["updated"]["ctx_size"].clone()), (200, json!(4096)));
    assert!(file(&l).get("ctx_size").is_none());
    // POST /params writes the same store.
    assert_eq!(l.post("/api/v1/params", &json!({"max_queue": 8})).await.0, 200);
    assert_eq!(file(&l)["max_queue"], 8);
    assert_eq!(l.get("/internal/config").await.1["max_queue"], 8);

    // The CLI.
    let (code, out, err) = l.cli(&["config", "set", "swap_hold_ms=0", "idle_timeout=30"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = l.cli(&["config", "--json"]).await;
    let shown: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("{out}"));
    assert_eq!((code, shown["swap_hold_ms"].clone(), shown["idle_timeout"].clone()), (0, json!(0), json!(30)));
    let (code, _, err) = l.cli(&["config", "set", "nope=1"]).await;
    assert!(code != 0 && err.contains("nope"), "{err}");

    // Lemonade v11.7's nested sections, dotted keys and global_timeout.
    let v11 = json!({"llamacpp": {"args": "--no-mmap"}, "sdcpp": {"steps": 4}, "global_timeout": 900});
    let (s, v) = l.post("/internal/set", &v11).await;
    assert_eq!((s, v["updated"]["llamacpp_args"].clone()), (200, json!("--no-mmap")), "{v}");
    let (_, c) = l.get("/internal/config").await;
    assert_eq!(
        (c["llamacpp"]["args"].clone(), c["llamacpp_args"].clone(), c["sdcpp"]["steps"].clone()),
        (json!("--no-mmap"), json!("--no-mmap"), json!(4)),
        "{c}"
    );
    // An empty string clears the server-wide arguments (v11's clients restore "" so).
    assert_eq!(l.post("/internal/set", &json!({"llamacpp_args": ""})).await.0, 200);
    assert_eq!(l.get("/internal/config").await.1["llamacpp"]["args"], "", "cleared");
    assert_eq!(l.post("/internal/set", &v11).await.0, 200);
    assert_eq!(
        (c["load_timeout"].clone(), c["remote_timeout"].clone(), c["global_timeout"].clone()),
        (json!(900), json!(900), json!(900))
    );
    let (s, e) = l.post("/internal/set", &json!({"llamacpp": {"cpu_bin": "latest"}})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("llamacpp.cpu_bin")), "{e}");
    let (code, out, err) = l.cli(&["config", "set", "llamacpp.backend=auto", "llamacpp.args=null"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, c) = l.get("/internal/config").await;
    assert_eq!(c["llamacpp"], json!({"backend": "cpu", "args": ""}), "auto is the default; null resets");
}

/// A Lemonade v11.7 `config.json` (nested sections, keys lemonade lacks) is read at start:
/// what lemonade has applies, the rest is kept in the file untouched.
#[tokio::test]
async fn a_v11_config_json_with_nested_sections_is_read_at_start() {
    let s = Sandbox::empty();
    std::fs::create_dir_all(s.cache()).unwrap();
    let v11 = json!({"config_version": 2, "port": 13305, "global_timeout": 120, "ctx_size": -1,
                     "llamacpp": {"backend": "auto", "args": "--no-mmap", "cpu_bin": "builtin", "prefer_system": true},
                     "sdcpp": {"steps": 3, "cpu_bin": "builtin"}, "telemetry": {"enabled": false}});
    std::fs::write(s.cache().join("config.json"), v11.to_string()).unwrap();
    let l = Lemonade::start_in(bin(), s, &[], &[]).await;
    let (_, c) = l.get("/internal/config").await;
    assert_eq!(
        (
            c["llamacpp_args"].clone(),
            c["llamacpp_backend"].clone(),
            c["steps"].clone(),
            c["load_timeout"].clone(),
            c["ctx_size"].clone()
        ),
        (json!("--no-mmap"), json!("cpu"), json!(3), json!(120), json!(-1)),
        "{c}"
    );
    assert_eq!(file(&l), v11, "the file is not rewritten at start");
    assert_eq!(l.post("/internal/set", &json!({"sdcpp.steps": 5})).await.0, 200);
    let f = file(&l);
    assert_eq!((f["steps"].clone(), f["sdcpp"].clone()), (json!(5), json!({"cpu_bin": "builtin"})), "{f}");
}

#[tokio::test]
async fn a_corrupt_config_json_is_refused_at_start_naming_it() {
    let cache = tempfile::tempdir().unwrap();
    std::fs::write(cache.path().join("config.json"), "{\"ctx_size\": ").unwrap();
    let out = std::process::Command::new(bin())
        .args(["serve", "--port", "0"])
        .env("LEMONADE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json") && err.contains("EOF"), "{err}");
    assert_eq!(std::fs::read_to_string(cache.path().join("config.json")).unwrap(), "{\"ctx_size\": ", "never reset");
    // A bad value in it is named too.
    std::fs::write(cache.path().join("config.json"), r#"{"llamacpp_backend": "cuda"}"#).unwrap();
    let out = std::process::Command::new(bin())
        .args(["serve", "--port", "0"])
        .env("LEMONADE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("llamacpp_backend") && err.contains("config.json"), "{err}");
}

#[tokio::test]
async fn real_llama_server_internal_pin_then_shutdown_unloads_and_exits() {
    let mut l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let (s, e) = l.post("/internal/pin", &json!({"model": SMOL})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("pinned")), "{e}");
    let (s, e) = l.post("/internal/pin", &json!({"pinned": true})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("model")), "{e}");
    let (s, v) = l.post("/internal/pin", &json!({"model": SMOL, "pinned": true})).await;
    assert_eq!((s, v), (200, json!({"status": "success", "model_name": SMOL, "pinned": true})));
    assert_eq!(l.get("/api/v1/health").await.1["all_models_loaded"][0]["pinned"], true);
    let backend = child_pids(l.pid());
    assert_eq!(backend.len(), 1);
    let (s, v) = l.post("/internal/shutdown", &json!({})).await;
    assert_eq!((s, v), (200, json!({"status": "shutting down"})));
    assert!(!alive(backend[0]), "the backend was stopped before the answer");
    let status = l.wait_exit(std::time::Duration::from_secs(15)).expect("lemonade exits after /internal/shutdown");
    assert!(status.success(), "{status:?}");
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text message of `ws` as JSON (bounded: 10 s).
async fn next(ws: &mut Ws) -> Value {
    use futures_util::StreamExt;
    match tokio::time::timeout(std::time::Duration::from_secs(10), ws.next()).await {
        Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t)))) => serde_json::from_str(&t).unwrap(),
        other => panic!("no message: {other:?}"),
    }
}

/// Lemonade v11's WebSocket log stream at `/logs/stream`: an error for a bad message, a
/// snapshot after `logs.subscribe`, then live entries with increasing `seq`; `after_seq`
/// resumes; a foreign Origin is refused before the upgrade.
#[tokio::test]
async fn logs_stream_over_websocket_with_v11_messages() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(
        (h["websocket_port"].clone(), h["log_streaming"]["websocket"].clone()),
        (json!(l.port()), json!(true)),
        "{h}"
    );
    let url = format!("ws://127.0.0.1:{}/logs/stream", l.port());
    let within = std::time::Duration::from_secs(10);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    ws.send(Message::Text("hello".into())).await.unwrap();
    let e = next(&mut ws).await;
    assert_eq!(e["type"], "error", "{e}");
    ws.send(Message::Text(json!({"type": "logs.subscribe", "after_seq": null}).to_string().into())).await.unwrap();
    let snap = next(&mut ws).await;
    assert_eq!(snap["type"], "logs.snapshot");
    let entries = snap["entries"].as_array().unwrap().clone();
    assert!(entries.iter().any(|e| e["line"].as_str().unwrap().contains("listening on")), "{snap}");
    assert!(entries.windows(2).all(|w| w[1]["seq"].as_u64() == w[0]["seq"].as_u64().map(|s| s + 1)), "consecutive seq");
    let info = entries.iter().find(|e| e["line"].as_str().unwrap().contains("listening on")).unwrap();
    assert_eq!(info["severity"], "Info");
    assert!(info["tag"].as_str().is_some_and(|t| t.starts_with("lemonade")), "{info}");
    let last = entries.last().unwrap()["seq"].as_u64().unwrap();
    assert_eq!(l.post("/api/v1/log-level", &json!({"level": "info"})).await.0, 200);
    let live = tokio::time::timeout(within, async {
        loop {
            let m = next(&mut ws).await;
            if m["entry"]["line"].as_str().is_some_and(|l| l.contains("log level changed")) {
                return m;
            }
        }
    })
    .await
    .expect("the new line arrives live");
    assert_eq!(live["type"], "logs.entry");
    assert!(live["entry"]["seq"].as_u64().unwrap() > last);
    // Resuming after the last seq seen sends only what came after it.
    let (mut again, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    again.send(Message::Text(json!({"type": "logs.subscribe", "after_seq": last}).to_string().into())).await.unwrap();
    let snap = next(&mut again).await;
    let seqs: Vec<u64> = snap["entries"].as_array().unwrap().iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(!seqs.is_empty() && seqs.iter().all(|s| *s > last), "{seqs:?} after {last}");
    // A page of another origin may not open it.
    let mut req = url.as_str().into_client_request().unwrap();
    req.headers_mut().insert("origin", "http://evil.example".parse().unwrap());
    let refused = tokio_tungstenite::connect_async(req).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 403),
        other => panic!("a foreign origin got {other:?}"),
    }
}

/// An OTLP/HTTP collector on 127.0.0.1: keeps the body of every `POST /v1/traces`.
async fn collector() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        let mut chunk = [0u8; 8192];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    kept.lock().unwrap().push(buf[end + 4..end + 4 + len].to_vec());
                    buf.drain(..end + 4 + len);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, bodies)
}

/// OpenTelemetry: with `LEMONADE_OTLP_ENDPOINT`, requests, loads and pulls are spans sent over
/// OTLP/HTTP; `POST /internal/telemetry/flush` sends them at once. Without it, nothing.
#[tokio::test]
async fn real_llama_server_spans_reach_an_otlp_collector_on_flush() {
    let (url, bodies) = collector().await;
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_OTLP_ENDPOINT", &url)]).await;
    assert_eq!(l.get("/v1/health").await.1["telemetry"], json!({"enabled": true}), "v11's telemetry state");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    assert_eq!(l.chat(SMOL).await.0, 200);
    let (s, v) = l.post("/internal/telemetry/flush", &json!({})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("flushed")), "{v}");
    let all: Vec<u8> = bodies.lock().unwrap().concat();
    let has = |needle: &str| all.windows(needle.len()).any(|w| w == needle.as_bytes());
    for needle in ["lemonade", "http.request", "/api/v1/chat/completions", "load", SMOL] {
        assert!(has(needle), "no '{needle}' in the {} bytes the collector got", all.len());
    }
    drop(l);
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    let (s, v) = l.post("/internal/telemetry/flush", &json!({})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("disabled")));
    assert_eq!(l.get("/v1/health").await.1["telemetry"], json!({"enabled": false}));
}
