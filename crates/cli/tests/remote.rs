//! Beyond one machine, on loopback: remote providers (recipe `cloud`) played by a real
//! llama-server and by a second lemonade, and llama.cpp RPC through two real rpc-servers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use host::supervisor::free_port;
use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const KEY: &str = "sk-upstream-5f1d2c9a";

/// A real llama-server standing in for a vLLM/SGLang/TGI endpoint: `alias` is its model id,
/// `KEY` its API key. Killed on drop.
struct Upstream {
    child: Child,
    port: u16,
}

impl Upstream {
    async fn start(file: &str, alias: &str, extra: &[&str], port: u16) -> Upstream {
        let child = Command::new(llama_server())
            .args(["-m", &model(file).display().to_string(), "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--alias", alias, "--api-key", KEY, "-c", "2048", "--no-webui"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let u = Upstream { child, port };
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{port}/health");
        let up = wait_for(Duration::from_secs(60), || async {
            http.get(&url).send().await.ok().filter(|r| r.status() == 200).map(|_| ())
        })
        .await;
        assert!(up.is_some(), "the upstream llama-server started");
        u
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.pid(), libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Name one colour."}], "max_tokens": 8,
           "temperature": 0, "stream": stream})
}

async fn post_text(l: &Lemonade, path: &str, body: &Value) -> (u16, String) {
    let r = reqwest::Client::new().post(l.url(path)).json(body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn upstream_of<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == name).unwrap_or(&Value::Null)
}

/// Every file under `dir` whose bytes contain `needle`.

#[tokio::test]
async fn real_llama_server_remote_providers_are_discovered_named_and_serve_chat_streams_and_embeddings_with_the_key_kept_secret(
) {
    let chat = Upstream::start(SMOL_FILE, "smol-chat", &[], free_port().unwrap()).await;
    let embed = Upstream::start(MINILM_FILE, "minilm-embed", &["--embeddings"], free_port().unwrap()).await;
    // The embedding provider's key comes from the environment; the chat one's from the CLI.
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_EMB_API_KEY", KEY)]).await;
    let (code, out, err) = l.cli(&["cloud", "install", "vllm", "--base-url", &chat.url(), "--api-key", KEY]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 model(s): vllm.smol-chat"), "{out}");
    let (code, out, err) = l.cli(&["cloud", "install", "emb", "--base-url", &format!("{}/v1/", embed.url())]).await;
    assert_eq!(code, 0, "{out}{err}");

    // Discovery and naming: `<provider>.<id>`, recipe cloud, a type, the upstream named.
    let (_, v) = l.get("/api/v1/models").await;
    let by_id = |id: &str| v["data"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned().unwrap_or_default();
    let m = by_id("vllm.smol-chat");
    assert_eq!(
        (m["recipe"].as_str(), m["type"].as_str(), m["upstream"].as_str()),
        (Some("cloud"), Some("llm"), Some("vllm")),
        "{v}"
    );
    assert_eq!(by_id("emb.minilm-embed")["type"], "embedding", "{v}");
    assert_eq!(l.get("/api/v1/models/vllm.smol-chat").await.1["checkpoint"], "smol-chat");

    // Chat, whole and streamed, and embeddings, through the remotes.
    let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    // The answer names the model as the client asked for it, not the upstream's own id.
    assert_eq!(v["model"], "vllm.smol-chat", "{v}");
    let (s, text) = post_text(&l, "/api/v1/chat/completions", &chat_body("vllm.smol-chat", true)).await;
    let frames = sse_data(&text);
    assert_eq!((s, frames.last().map(String::as_str)), (200, Some("[DONE]")), "{text}");
    assert!(frames.iter().filter(|f| f.contains("\"content\":\"")).count() >= 2, "{text}");
    let chunks: Vec<Value> = frames.iter().filter_map(|f| serde_json::from_str(f).ok()).collect();
    assert!(
        chunks.len() >= 2 && chunks.iter().all(|c| c["model"] == "vllm.smol-chat"),
        "every chunk names vllm.smol-chat: {text}"
    );
    let (s, v) = l.post("/api/v1/embeddings", &json!({"model": "emb.minilm-embed", "input": ["a", "b"]})).await;
    assert_eq!((s, v["data"][1]["embedding"].as_array().map(Vec::len)), (200, Some(384)), "{v}");

    // The other text endpoints and both dialects, translated here, answered by the upstream.
    let prompt = json!({"model": "vllm.smol-chat", "prompt": "Once upon", "max_tokens": 4});
    let (s, v) = l.post("/api/v1/completions", &prompt).await;
    assert!(s == 200 && v["choices"][0]["text"].is_string(), "{v}");
    assert_eq!(v["model"], "vllm.smol-chat", "{v}");
    let (s, v) =
        l.post("/api/v1/responses", &json!({"model": "vllm.smol-chat", "input": "hi", "max_output_tokens": 4})).await;
    assert!(s == 200 && v["output"].is_array(), "{v}");
    let msg = json!({"model": "vllm.smol-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let (s, v) = l.post("/v1/messages", &msg).await;
    assert!(s == 200 && v["type"] == "message" && v["content"][0]["text"].is_string(), "{v}");
    let (s, v) = l
        .post(
            "/api/chat",
            &json!({"model": "vllm.smol-chat", "stream": false, "options": {"num_predict": 4},
        "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert!(s == 200 && v["message"]["content"].is_string() && v["done"] == true, "{v}");
    assert_eq!(v["model"], "vllm.smol-chat", "{v}");
    // Audio and image requests are shaped for lemonade's own backends: refused, not forwarded.
    let (s, v) = l.post("/api/v1/images/generations", &json!({"model": "vllm.smol-chat", "prompt": "x"})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("unsupported_model_type")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("remote provider 'vllm'"), "{v}");

    // No local slot: nothing is loaded here.
    let (_, h) = l.get("/api/v1/health").await;
    assert!(loaded_names(&h).is_empty(), "{h}");
    let up = upstream_of(&h, "vllm");
    assert_eq!((up["state"].as_str(), up["api_key"].as_str()), (Some("up"), Some("memory")), "{h}");
    assert_eq!(upstream_of(&h, "emb")["api_key"], "env", "{h}");
    assert_eq!(upstream_of(&l.get("/v1/admin/models").await.1, "vllm")["last_probe"]["ok"], true);

    // A wrong key is the upstream's refusal, named (502), not the client's 401; `auth` mends it.
    let (code, _, err) = l.cli(&["cloud", "auth", "vllm", "--api-key", "wrong-key"]).await;
    assert_eq!(code, 0, "{err}");
    let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await;
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((s, v["error"]["code"].as_str()), (502, Some("upstream_error")), "{v}");
    assert!(msg.contains("Upstream 'vllm'") && msg.contains("401") && msg.contains("cloud auth vllm"), "{msg}");
    l.secret(KEY);
    let (code, _, err) = l.cli_stdin(&["cloud", "auth", "vllm"], KEY).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await.0, 200);

    // The key never shows: not in list outputs, answers, the log or any file lemonade wrote.
    for args in [&["cloud", "list"][..], &["list"], &["cloud", "list", "--refresh"]] {
        let (code, out, err) = l.cli(args).await;
        assert_eq!(code, 0, "{err}");
        assert!(!out.contains(KEY) && !err.contains(KEY), "{args:?}: {out}");
    }
    assert!(l.cli(&["cloud", "list"]).await.1.contains("vllm.smol-chat"));
    for path in ["/api/v1/cloud", "/api/v1/health", "/v1/admin/models", "/api/v1/models"] {
        assert!(!l.get(path).await.1.to_string().contains(KEY), "{path}");
    }
    assert!(!l.log().contains(KEY), "the log names the key");
    assert_eq!(files_containing(&l.sandbox.cache(), KEY), Vec::<PathBuf>::new());
    let saved = std::fs::read_to_string(l.sandbox.cache().join("cloud_providers.json")).unwrap();
    assert!(saved.contains("smol-chat") && !saved.contains("key"), "{saved}");

    // Uninstall: its models go.
    assert_eq!(l.cli(&["cloud", "uninstall", "emb"]).await.0, 0);
    let (s, v) = l.post("/api/v1/embeddings", &json!({"model": "emb.minilm-embed", "input": "a"})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (404, Some("model_not_found")), "{v}");
}

#[tokio::test]
async fn real_llama_server_an_upstream_killed_gives_502_and_recovers_a_hanging_one_504_and_a_restart_keeps_it_listed() {
    let port = free_port().unwrap();
    let up = Upstream::start(SMOL_FILE, "smol-chat", &[], port).await;
    let l = Lemonade::start(bin(), &["--remote-timeout", "2", "--remote-refresh", "0"]).await;
    l.secret(KEY);
    let install = json!({"recipe": "cloud", "backend": "vllm", "base_url": up.url(), "api_key": KEY});
    assert_eq!(l.post("/api/v1/install", &install).await.0, 200);
    assert_eq!(l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await.0, 200);

    // Hanging: 504 after --remote-timeout, whole and streamed (nothing was sent yet).
    unsafe {
        libc::kill(up.pid(), libc::SIGSTOP);
    }
    for stream in [false, true] {
        let t = std::time::Instant::now();
        let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", stream)).await;
        assert_eq!((s, v["error"]["code"].as_str()), (504, Some("upstream_timeout")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("Upstream 'vllm'"), "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "answered after the timeout, not much later");
    }
    unsafe {
        libc::kill(up.pid(), libc::SIGCONT);
    }
    // Killed mid-stream: the stream ends with the streaming error frame naming it.
    let long = json!({"model": "vllm.smol-chat", "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let r = reqwest::Client::new().post(l.url("/api/v1/chat/completions")).json(&long).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut body = Box::pin(r.bytes_stream());
    let mut text = String::new();
    while !text.contains("\"content\":\"") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), futures_util::StreamExt::next(&mut body)).await;
        text.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk in time").expect("more").unwrap()));
    }
    drop(up);
    let rest = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(c)) = futures_util::StreamExt::next(&mut body).await {
            text.push_str(&String::from_utf8_lossy(&c));
        }
        text
    })
    .await
    .expect("the stream ended");
    let last = sse_data(&rest).into_iter().rfind(|d| d != "[DONE]").unwrap_or_default();
    assert!(last.contains("streaming_error") && last.contains("Upstream 'vllm'"), "{last}");
    // Killed: 502 naming it, and health says down; the list keeps its model.
    let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", true)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (502, Some("upstream_error")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("Upstream 'vllm' (http://127.0.0.1:{port}/v1)")) && msg.contains("refused"), "{msg}");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(upstream_of(&h, "vllm")["state"], "down", "{h}");
    assert_eq!(upstream_of(&h, "vllm")["models"], json!(["vllm.smol-chat"]), "{h}");

    // A restart while it is down: still listed (from the saved list), still 502, never 404.
    let l = Lemonade::start_in(bin(), l.kill_keeping_sandbox(), &["--remote-timeout", "2"], &[]).await;
    let (_, v) = l.get("/api/v1/models").await;
    assert!(v["data"].as_array().unwrap().iter().any(|m| m["id"] == "vllm.smol-chat"), "{v}");
    let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await;
    assert_eq!(s, 502, "{v}");

    // It comes back: the next request is answered (the key again, as the restart forgot it).
    let _up = Upstream::start(SMOL_FILE, "smol-chat", &[], port).await;
    let auth = json!({"recipe": "cloud", "backend": "vllm", "api_key": KEY});
    assert_eq!(l.post("/api/v1/install", &auth).await.0, 200);
    let (s, v) = l.post("/api/v1/chat/completions", &chat_body("vllm.smol-chat", false)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(upstream_of(&l.get("/api/v1/health").await.1, "vllm")["state"], "up");
}

#[tokio::test]
async fn real_llama_server_a_second_lemonade_is_a_provider_and_the_openai_sdk_uses_local_and_remote_models() {
    let peer =
        Lemonade::start_in(bin(), Sandbox::new(), &["--max-loaded-models", "-1"], &[("LEMONADE_API_KEY", KEY)]).await;
    let l = Lemonade::start(bin(), &[]).await;
    l.secret(KEY);
    let install = json!({"recipe": "cloud", "backend": "peer", "base_url": peer.url("/api/v1"), "api_key": KEY});
    let (s, v) = l.post("/api/v1/install", &install).await;
    assert_eq!(s, 200, "{v}");
    let (remote_chat, remote_embed) = (format!("peer.{}", shown(SMOL)), format!("peer.{}", shown(MINILM)));
    assert!(v["upstream"]["models"].as_array().unwrap().contains(&json!(remote_chat)), "{v}");
    let base = l.url("");
    py_checks("remote_client.py", &[&base, shown(SMOL), &remote_chat, &remote_embed]).await;
    // The remote models ran on the peer; only the local one holds a slot here.
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL]);
    let mut on_peer = loaded_names(&peer.get("/api/v1/health").await.1);
    on_peer.sort();
    assert_eq!(on_peer, [MINILM, SMOL]);
}

/// A real rpc-server on `port` (127.0.0.1). Killed on drop.
struct Worker(Child);

impl Worker {
    async fn start(port: u16) -> Worker {
        let rpc = std::env::var_os("LEMONADE_TEST_RPC_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| llama_server().with_file_name("rpc-server"));
        assert!(rpc.is_file(), "rpc-server not found at {}: run `cargo xtask setup`", rpc.display());
        let child = Command::new(rpc)
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let listening = wait_for(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
        })
        .await;
        assert!(listening.is_some(), "rpc-server listens on {addr}");
        Worker(child)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn seeded(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Write a sentence about the sea."}],
           "max_tokens": 24, "temperature": 0.8, "seed": 42})
}

#[tokio::test]
async fn real_llama_server_a_model_over_two_rpc_workers_answers_as_local_and_a_lost_worker_is_noticed() {
    let (p1, p2) = (free_port().unwrap(), free_port().unwrap());
    let _w1 = Worker::start(p1).await;
    let w2 = Worker::start(p2).await;
    let l = Lemonade::start(bin(), &["--watchdog-interval-ms", "300"]).await;
    let (s, local) = l.post("/api/v1/chat/completions", &seeded(SMOL)).await;
    assert_eq!(s, 200, "{local}");

    // An unreachable worker fails the load, named.
    let closed = free_port().unwrap();
    let bad = json!({"model_name": SMOL, "rpc_servers": [format!("127.0.0.1:{p1}"), format!("127.0.0.1:{closed}")]});
    let (s, v) = l.post("/api/v1/load", &bad).await;
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((s, v["error"]["code"].as_str()), (500, Some("model_load_error")), "{v}");
    assert!(msg.contains(&format!("RPC worker 127.0.0.1:{closed} is unreachable")), "{msg}");
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "rpc_servers": ["no port"]})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("rpc_servers")), "{v}");

    // Through both workers, saved as the model's options: the same answer as local.
    let workers = json!([format!("127.0.0.1:{p1}"), format!("127.0.0.1:{p2}")]);
    let load = json!({"model_name": SMOL, "rpc_servers": workers, "save_options": true});
    let (s, v) = l.post("/api/v1/load", &load).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(l.get(&format!("/api/v1/models/{SMOL}")).await.1["recipe_options"]["rpc_servers"], workers);
    let (s, remote) = l.post("/api/v1/chat/completions", &seeded(SMOL)).await;
    assert_eq!(s, 200, "{remote}");
    let text = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    assert!(!text(&local).is_empty());
    assert_eq!(text(&remote), text(&local), "the same seed gives the same answer over RPC");
    let pid = child_pids(l.pid())[0];
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap().replace('\0', " ");
    assert!(cmdline.contains(&format!("--rpc 127.0.0.1:{p1},127.0.0.1:{p2}")), "{cmdline}");

    // A worker dies while the model is idle: the watchdog stops the model, naming the worker.
    drop(w2);
    let err = wait_for(Duration::from_secs(15), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        let row = v["models"].as_array()?.iter().find(|m| m["name"] == SMOL)?.clone();
        row["last_error"].as_str().filter(|e| e.contains("RPC worker")).map(str::to_string)
    })
    .await
    .expect("the lost worker was noticed");
    assert!(err.contains(&format!("127.0.0.1:{p2}")), "{err}");
    assert!(!alive(pid), "its llama-server was stopped");
    // While it is gone, the reload fails naming it; once it is back, the model reloads.
    let (s, v) = l.post("/api/v1/chat/completions", &seeded(SMOL)).await;
    assert_eq!(s, 500, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains(&format!("127.0.0.1:{p2} is unreachable")), "{v}");
    let _w2 = Worker::start(p2).await;
    let answered = wait_for(Duration::from_secs(20), || async {
        let (s, v) = l.post("/api/v1/chat/completions", &seeded(SMOL)).await;
        (s == 200).then_some(v)
    })
    .await
    .expect("reloaded once the worker is back");
    assert_eq!(text(&answered), text(&local));
}

/// Lemonade v11's cloud surface against a real llama-server upstream: install with
/// `backend: "cloud"`, `POST /v1/cloud/auth` (in memory; 404 unknown, 409 when the environment's
/// key wins), `DELETE /v1/cloud/auth/{provider}`, the cloud uninstall; and the http:// rule: a key
/// is never sent in plain text to another machine without `allow_insecure_http` (the refusal
/// is made before any connection, so this test reaches nothing beyond loopback).
#[tokio::test]
async fn real_llama_server_v11_cloud_install_auth_clear_uninstall_and_the_http_key_rule() {
    let up = Upstream::start(SMOL_FILE, "smol-chat", &[], free_port().unwrap()).await;
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_ENVP_API_KEY", KEY)]).await;
    let install = json!({"backend": "cloud", "provider": "up", "base_url": up.url()});
    let (s, v) = l.post("/v1/install", &install).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["backend"].clone(), v["provider"].clone(), v["models_discovered"].clone()),
        (json!("cloud"), json!("up"), json!(0)),
        "no key yet: {v}"
    );
    assert_eq!(v["auth_state"], json!({"env_var_set": false, "runtime_key_set": false}));
    // No key, no call (v11): the provider offers nothing, and a request to it says why.
    let (s, e) = l.post("/api/v1/chat/completions", &chat_body("up.smol-chat", false)).await;
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(s, 404, "{e}");
    assert!(msg.contains("No API key for cloud provider 'up'") && msg.contains("LEMONADE_UP_API_KEY"), "{e}");
    // A key over plain http:// (loopback too) needs the opt-in, as v11 asks.
    let (s, e) = l.post("/v1/cloud/auth", &json!({"provider": "up", "api_key": KEY})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("insecure_http_requires_opt_in")), "{e}");
    let auth = json!({"provider": "up", "api_key": KEY, "allow_insecure_http": true});
    let (s, v) = l.post("/v1/cloud/auth", &auth).await;
    assert_eq!(
        (s, v["auth_state"].clone(), v["models_discovered"].clone(), v["allow_insecure_http"].clone()),
        (200, json!({"env_var_set": false, "runtime_key_set": true}), json!(1), json!(true)),
        "{v}"
    );
    assert!(v["warnings"].to_string().contains("Bearer token"), "{v}");
    let (_, info) = l.get("/api/v1/system-info").await;
    let entry = info["cloud"]["providers"].as_array().unwrap().iter().find(|p| p["name"] == "up").cloned();
    assert_eq!(
        entry.map(|p| (p["runtime_key_set"].clone(), p["models_discovered"].clone(), p["allow_insecure_http"].clone())),
        Some((json!(true), json!(1), json!(true))),
        "{info}"
    );
    assert_eq!(l.post("/api/v1/chat/completions", &chat_body("up.smol-chat", false)).await.0, 200);
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": "up.smol-chat"})).await.0, 200);
    let (s, e) = l.post("/v1/cloud/auth", &json!({"provider": "nope", "api_key": "x"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("not_found")), "{e}");
    let (s, e) = l.post("/v1/cloud/auth", &json!({"provider": "up"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("api_key")), "{e}");

    // The environment's key wins over one given at run time: 409, nothing stored.
    let envp = json!({"backend": "cloud", "provider": "envp", "base_url": up.url()});
    let (_, v) = l.post("/v1/install", &envp).await;
    assert_eq!(
        (v["models_discovered"].clone(), v["auth_state"]["env_var_set"].clone()),
        (json!(1), json!(true)),
        "{v}"
    );
    let (s, e) = l.post("/v1/cloud/auth", &json!({"provider": "envp", "api_key": "other"})).await;
    assert_eq!(
        (s, e["error"]["type"].as_str(), e["error"]["env_var"].as_str()),
        (409, Some("auth_conflict"), Some("LEMONADE_ENVP_API_KEY")),
        "{e}"
    );

    // Clearing the key held in memory drops the models nothing can reach any more.
    let (s, v) = l.delete("/v1/cloud/auth/up").await;
    assert_eq!(
        (s, v),
        (
            200,
            json!({"provider": "up", "auth_state": {"env_var_set": false, "runtime_key_set": false}, "cleared_runtime_key": true})
        )
    );
    let listed = l.get("/api/v1/models").await.1;
    assert!(!listed["data"].as_array().unwrap().iter().any(|m| m["id"] == "up.smol-chat"), "{listed}");
    // A model a client had loaded answers the missing-key error (v11), naming the provider.
    let (s, e) = l.post("/api/v1/chat/completions", &chat_body("up.smol-chat", false)).await;
    assert_eq!((s, e["error"]["code"].as_str()), (503, Some("missing_credentials")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap_or_default().contains("'up'"), "{e}");
    assert_eq!(l.delete("/v1/cloud/auth/nope").await.0, 404);
    let (s, v) = l.post("/v1/uninstall", &json!({"backend": "cloud", "provider": "envp"})).await;
    assert_eq!(
        (s, v),
        (200, json!({"status": "success", "backend": "cloud", "provider": "envp", "models_evicted": 1}))
    );
    assert_eq!(l.post("/v1/uninstall", &json!({"backend": "cloud", "provider": "envp"})).await.0, 404);

    // A key for a plain-http provider needs the opt-in: refused before anything is registered
    // or sent. Without a key, the install is taken, with v11's warning.
    let far = json!({"backend": "cloud", "provider": "far", "base_url": "http://10.255.255.1:9/v1", "api_key": "k"});
    let (s, e) = l.post("/v1/install", &far).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("insecure_http_requires_opt_in")), "{e}");
    let (_, c) = l.get("/api/v1/cloud").await;
    assert!(!c.to_string().contains("\"far\""), "nothing registered: {c}");
    let keyless = json!({"backend": "cloud", "provider": "far", "base_url": "http://10.255.255.1:9/v1"});
    let (s, v) = l.post("/v1/install", &keyless).await;
    assert_eq!(
        (s, v["models_discovered"].clone(), v["allow_insecure_http"].clone()),
        (200, json!(0), json!(false)),
        "{v}"
    );
    assert!(v["warning"].as_str().is_some_and(|w| w.contains("http://")), "{v}");

    // SSRF: a cloud metadata address or an unspecified one, in any spelling, is never a
    // provider (a 400 naming base_url; nothing registered). Loopback stays the user's choice.
    for url in [
        "http://169.254.169.254/latest",
        "http://0.0.0.0:8000/v1",
        "http://[::]:8000",
        "http://[::ffff:169.254.169.254]/v1",
    ] {
        let body = json!({"backend": "cloud", "provider": "meta", "base_url": url, "api_key": "k"});
        let (s, v) = l.post("/v1/install", &body).await;
        assert_eq!((s, v["error"]["param"].as_str()), (400, Some("base_url")), "{url}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("link-local")
                || v["error"]["message"].as_str().unwrap().contains("unspecified"),
            "{v}"
        );
    }
    let (_, c) = l.get("/api/v1/cloud").await;
    assert!(!c.to_string().contains("\"meta\""), "nothing registered: {c}");
}

/// A router collection with a remote candidate (v11's cloud candidates): a `consent: denied`
/// request stays on the local model, a heavy one goes to the provider (a second lemonade), and
/// the remote model never takes a slot here.
#[tokio::test]
async fn real_llama_server_a_router_collection_sends_heavy_requests_to_a_remote_candidate() {
    let peer = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("LEMONADE_API_KEY", KEY)]).await;
    let l = Lemonade::start(bin(), &[]).await;
    l.secret(KEY);
    let install = json!({"recipe": "cloud", "backend": "peer", "base_url": peer.url("/api/v1"), "api_key": KEY});
    assert_eq!(l.post("/api/v1/install", &install).await.0, 200);
    let remote = format!("peer.{}", shown(SMOL));
    let policy = json!({"model": "user.Split", "recipe": "collection.router", "version": "1", "components": [SMOL, remote],
        "routing": {"candidates": [SMOL, remote], "default_model": SMOL, "rules": [
            {"id": "private", "match": {"metadata": {"key": "consent", "equals": "denied"}}, "route_to": SMOL},
            {"id": "heavy", "match": {"keywords_any": ["analyze"]}, "route_to": remote}]}});
    let (s, v) = l.post("/api/v1/pull", &policy).await;
    assert_eq!(s, 200, "{v}");
    let ask = |text: &str, consent: &str| {
        json!({"model": "user.Split", "max_tokens": 2, "metadata": {"consent": consent}, "route_trace": true,
               "messages": [{"role": "user", "content": text}]})
    };
    let (s, v) = l.post("/api/v1/chat/completions", &ask("Please analyze this.", "granted")).await;
    assert_eq!(
        (s, v["x_lemonade_route"]["route_to"].clone(), v["model"].clone()),
        (200, json!(remote), json!(remote)),
        "{v}"
    );
    let (s, v) = l.post("/api/v1/chat/completions", &ask("Please analyze this.", "denied")).await;
    assert_eq!(
        (s, v["x_lemonade_route"]["matched_rule"].clone(), v["model"].clone()),
        (200, json!("private"), json!(SMOL)),
        "{v}"
    );
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL], "the remote candidate holds no slot here");
    assert_eq!(loaded_names(&peer.get("/api/v1/health").await.1), [SMOL], "it ran on the peer");
}

/// A provider installed with a custom key header (`auth_header_name: x-api-key`) whose base
/// answers every request with a 307 to another origin: lemonade's own provider client (its
/// discovery at install, then a chat) never follows it, so the other origin never receives the
/// key (reqwest's default would send it: it strips only `Authorization`).
#[tokio::test]
async fn a_providers_key_never_follows_its_redirect_to_another_origin() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_port = other.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = other.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).await.unwrap_or(0);
            seen2.lock().push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 25\r\nconnection: close\r\n\r\n{\"object\":\"list\",\"data\":[]}").await;
        }
    });
    let redirecting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = redirecting.local_addr().unwrap().port();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let asked2 = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = redirecting.accept().await {
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf).await;
            asked2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // `localhost`: the same machine, another origin than 127.0.0.1.
            let to = format!("http://localhost:{other_port}/v1/models");
            let reply = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = s.write_all(reply.as_bytes()).await;
        }
    });
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    let body = json!({"recipe": "cloud", "backend": "hop", "base_url": format!("http://127.0.0.1:{port}/v1"),
                      "api_key": "sk-HOPSECRET", "auth_header_name": "x-api-key", "auth_header_prefix": ""});
    let (s, v) = l.post("/api/v1/install", &body).await;
    assert_eq!(s, 200, "{v}");
    let (_, c) = l.get("/api/v1/cloud").await;
    let up = c["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == "hop").cloned().unwrap();
    assert!(up["last_probe"]["error"].as_str().is_some_and(|e| e.contains("another origin")), "{up}");
    let (s, v) = l
        .post("/api/v1/chat/completions", &json!({"model": "hop.any", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert!(s >= 400, "{s} {v}");
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 1, "the provider was asked");
    let other_saw = seen.lock().clone();
    assert!(!other_saw.contains("sk-HOPSECRET"), "the other origin got the key: {other_saw}");
    assert!(other_saw.is_empty(), "the redirect was followed: {other_saw}");
}
