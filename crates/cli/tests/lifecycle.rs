//! Model lifecycle against real llama-server: load/unload, slots and LRU, options, auto-load.

use std::path::Path;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

#[tokio::test]
async fn two_slots_three_llms_lru_eviction_visible_in_health() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "2"]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["max_models"]["llm"], 2);
    for m in [SMOL, GEMMA] {
        let (s, v) = l.post("/api/v1/load", &json!({"model_name": m})).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["status"], "success");
        assert_eq!(v["model_name"], m);
    }
    // Using SMOL makes GEMMA the least recently used.
    assert_eq!(l.chat(SMOL).await.0, 200);
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": SMOL_COPY})).await;
    assert_eq!(s, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL, SMOL_COPY], "GEMMA was evicted");
    // An embedding model has its own slots.
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": "x"})).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h).len(), 3);
    let children = child_pids(l.pid());
    assert_eq!(children.len(), 3, "one llama-server per loaded model");

    let (s, v) = l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
    assert_eq!((s, v["message"].as_str()), (200, Some("Model unloaded successfully")));
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL_COPY, MINILM]);
    let (s, e) = l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "model_not_loaded");
    let (s, v) = l.post_raw("/api/v1/unload", "").await;
    assert_eq!((s, v["message"].as_str()), (200, Some("All models unloaded successfully")));
    let (_, h) = l.get("/api/v1/health").await;
    assert!(loaded_names(&h).is_empty());
    let gone =
        wait_for(std::time::Duration::from_secs(5), || async { children.iter().all(|p| !alive(*p)).then_some(()) })
            .await;
    assert!(gone.is_some(), "unloaded backends exited");
}

#[tokio::test]
async fn load_options_reload_in_place_and_save() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 2048})).await;
    assert_eq!(s, 200);
    let (_, h) = l.get("/api/v1/health").await;
    let first = h["all_models_loaded"][0].clone();
    assert_eq!(first["recipe_options"]["ctx_size"], 2048);
    let pid = child_pids(l.pid());
    // Same options: nothing restarts.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 2048})).await.0, 200);
    assert_eq!(child_pids(l.pid()), pid, "same options: same process");
    // Other options: restarted in place, one slot.
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 1024, "save_options": true})).await;
    assert_eq!(s, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL]);
    assert_eq!(h["all_models_loaded"][0]["recipe_options"]["ctx_size"], 1024);
    assert_ne!(child_pids(l.pid()), pid, "other options: a new process");
    let (_, props) = l.get(&format!("/props?model={SMOL}")).await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1024);
    // Saved: the file holds the request's options, and an auto-load uses them.
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("recipe_options.json")).unwrap()).unwrap();
    assert_eq!(saved, json!({SMOL: {"ctx_size": 1024}}));
    let (_, m) = l.get(&format!("/api/v1/models/{SMOL}")).await;
    assert_eq!(m["recipe_options"]["ctx_size"], 1024);
    assert_eq!(l.post_raw("/api/v1/unload", "").await.0, 200);
    assert_eq!(l.chat(SMOL).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["recipe_options"]["ctx_size"], 1024, "saved options apply to auto-loads");
}

#[tokio::test]
async fn load_rejects_bad_input_precisely() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "llamacpp_args": "--threads 1 --port 9"})).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["param"], "llamacpp_args");
    assert!(e["error"]["message"].as_str().unwrap().contains("'--port'"), "{e}");
    let (s, e) = l.post("/api/v1/load", &json!({"model": SMOL})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("model_name")));
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": "nope"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("model_not_found")));
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "llamacpp_backend": "cuda"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("llamacpp_backend")));
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 0})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("ctx_size")));
    let (s, _) = l.post_raw("/api/v1/unload", "{not json").await;
    assert_eq!(s, 400, "garbage is not 'unload everything'");
    let (_, h) = l.get("/api/v1/health").await;
    assert!(loaded_names(&h).is_empty(), "nothing was loaded by bad requests");
}

#[tokio::test]
async fn no_auto_load_rejects_with_machine_readable_codes() {
    let l = Lemonade::start(bin(), &["--no-auto-load"]).await;
    let (s, e) = l.chat(SMOL).await;
    assert_eq!(s, 409, "{e}");
    assert_eq!(e["error"]["code"], "model_not_loaded");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    assert_eq!(l.chat(SMOL).await.0, 200);
}

#[tokio::test]
async fn killed_backend_is_failed_then_reloaded_by_the_next_request() {
    let l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.chat(SMOL).await.0, 200);
    let children = child_pids(l.pid());
    unsafe {
        libc::kill(children[0] as i32, libc::SIGKILL);
    }
    let gone = wait_for(std::time::Duration::from_secs(5), || async {
        loaded_names(&l.get("/api/v1/health").await.1).is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the dead model is no longer loaded");
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
    assert_ne!(child_pids(l.pid()), children, "a new llama-server");
}

fn admin_row<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["models"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("{name} not in {v}"))
}

#[tokio::test]
async fn admin_api_states_overrides_and_errors() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.get("/v1/admin/models").await;
    assert_eq!(s, 200);
    let row = admin_row(&v, SMOL);
    assert_eq!((row["runtime_state"].as_str(), row["is_loaded"].as_bool()), (Some("unloaded"), Some(false)));
    assert_eq!(row["load_constraints"]["gguf_flash_attn"]["allowed_values"], json!(["on", "off", "auto"]));
    assert!(row["vram_estimate_mib"].as_u64().unwrap() > 50, "{row}");

    let path = format!("/v1/admin/models/{SMOL}/load");
    let (s, e) = l.post(&path, &json!({"gguf_n_ctx": 0})).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = l.post(&path, &json!({"gguf_n_ctx": "big"})).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = l.post(&path, &json!({"gguf_type_k": "q8-0"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("invalid_load_request")), "{e}");
    let (s, e) = l.post(&path, &json!({"exllama_cache_size": 4096})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("invalid_load_request")), "{e}");
    let (s, _) = l.post("/v1/admin/models/nope/load", &json!({})).await;
    assert_eq!(s, 404);

    let (s, row) = l
        .post(
            &path,
            &json!({"gguf_n_ctx": 1536, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0", "gguf_flash_attn": "on"}),
        )
        .await;
    assert_eq!(s, 200, "{row}");
    assert_eq!(row["runtime_state"], "loaded");
    assert_eq!(
        row["load_override"],
        json!({"gguf_n_ctx": 1536, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0", "gguf_flash_attn": "on"})
    );
    let (_, props) = l.get(&format!("/props?model={SMOL}")).await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1536, "override reached llama-server");
    let (s, e) = l.post(&path, &json!({"gguf_n_ctx": 2048})).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (400, Some("invalid_load_request")),
        "overrides need an unload first: {e}"
    );
    assert_eq!(l.post(&path, &json!({})).await.0, 200, "already loaded");

    let (s, row) = l.post(&format!("/v1/admin/models/{SMOL}/unload"), &json!({})).await;
    assert_eq!((s, row["runtime_state"].as_str()), (200, Some("unloaded")));
    assert_eq!(row["load_override"], json!({}));
    assert_eq!(l.post(&format!("/v1/admin/models/{SMOL}/unload"), &json!({})).await.0, 200, "already unloaded");

    let (s, g) = l.get("/v1/admin/gpu-memory").await;
    assert_eq!(s, 200, "{g}");
    assert!(g["gpus"].is_array());
    if g["gpus"].as_array().unwrap().is_empty() {
        assert!(g["error"].as_str().is_some_and(|e| !e.is_empty()), "an empty GPU list says why: {g}");
    }
    assert!(g["models"].as_array().unwrap().iter().any(|m| m["name"] == SMOL));

    // A killed backend shows as failed with its last error, and the next request reloads it.
    assert_eq!(l.chat(SMOL).await.0, 200);
    unsafe {
        libc::kill(child_pids(l.pid())[0] as i32, libc::SIGKILL);
    }
    let failed = wait_for(std::time::Duration::from_secs(5), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        let row = admin_row(&v, SMOL).clone();
        (row["runtime_state"] == "failed").then_some(row)
    })
    .await
    .expect("reported failed");
    assert!(failed["last_error"].as_str().unwrap().contains("killed by signal 9"), "{failed}");
    assert_eq!(l.chat(SMOL).await.0, 200);
    let (_, v) = l.get("/v1/admin/models").await;
    assert_eq!(admin_row(&v, SMOL)["runtime_state"], "loaded");
}

#[tokio::test]
async fn real_llama_server_busy_model_drains_before_eviction() {
    use futures_util::StreamExt;
    let l = Lemonade::start(bin(), &[]).await;
    let r = long_stream(&l, 48).await;
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8_lossy(&stream.next().await.unwrap().unwrap()).into_owned();
    let smol_pid = child_pids(l.pid());
    // GEMMA needs SMOL's slot; it is asked for while SMOL has 47 tokens to go, and waits until
    // SMOL's stream is over (were it not made to wait, it would be answered long before).
    assert!(!text.contains("[DONE]"), "SMOL's stream is still running: {text}");
    let gemma = {
        let (http, url) = (l.http.clone(), l.url("/api/v1/completions"));
        tokio::spawn(async move {
            let r = http.post(url).json(&json!({"model": GEMMA, "prompt": "a", "max_tokens": 2})).send().await.unwrap();
            (std::time::Instant::now(), r.status().as_u16())
        })
    };
    while let Some(c) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&c.unwrap()));
    }
    let stream_done = std::time::Instant::now();
    assert!(text.trim_end().ends_with("data: [DONE]"), "SMOL's stream was not cut: {text}");
    let tokens = content_chunks(&text);
    assert_eq!(tokens, 48, "all 48 tokens arrived");
    let (gemma_done, status) = gemma.await.unwrap();
    assert_eq!(status, 200);
    assert!(gemma_done >= stream_done, "GEMMA was served after SMOL drained");
    assert!(smol_pid.len() == 1 && !alive(smol_pid[0]), "SMOL's llama-server gave its slot up");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [GEMMA]);
}

#[tokio::test]
async fn real_llama_server_wedged_is_killed_by_the_watchdog() {
    let l = Lemonade::start(bin(), &["--watchdog-interval-ms", "300"]).await;
    assert_eq!(l.chat(SMOL).await.0, 200);
    let child = child_pids(l.pid())[0];
    unsafe {
        libc::kill(child as i32, libc::SIGSTOP);
    }
    let failed = wait_for(std::time::Duration::from_secs(10), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        let row = v["models"].as_array().unwrap().iter().find(|m| m["name"] == SMOL).cloned()?;
        (row["runtime_state"] == "failed").then_some(row)
    })
    .await
    .expect("the stopped llama-server was noticed");
    assert!(failed["last_error"].as_str().unwrap().contains("stopped answering its health checks"), "{failed}");
    assert!(!alive(child));
    assert_eq!(l.chat(SMOL).await.0, 200, "reloaded by the next request");
}

/// A streamed chat of exactly `tokens` tokens from SMOL (EOS ignored).
async fn long_stream(l: &Lemonade, tokens: u32) -> reqwest::Response {
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Tell me about the sea."}],
                      "max_tokens": tokens, "ignore_eos": true, "stream": true});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r
}

/// How many chunks of an SSE chat stream carry content.
fn content_chunks(text: &str) -> usize {
    sse_data(text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()))
        .count()
}

/// The llama-server children of the server, by pid.
fn backends(l: &Lemonade) -> Vec<u32> {
    child_pids(l.pid())
}

#[tokio::test]
async fn real_llama_server_unload_waits_for_the_stream_then_a_waiting_request_reloads() {
    use futures_util::StreamExt;
    let l = Lemonade::start(bin(), &[]).await;
    // Loaded first: a cold request would be answered at once with `: loading` comments.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let r = long_stream(&l, 64).await;
    let first_pid = backends(&l);
    assert_eq!(first_pid.len(), 1);
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8_lossy(&stream.next().await.unwrap().unwrap()).into_owned();
    let unload = tokio::spawn({
        let (http, url) = (l.http.clone(), l.url("/api/v1/unload"));
        async move { http.post(url).json(&json!({"model_name": SMOL})).send().await.unwrap().status().as_u16() }
    });
    let unloading = wait_for(std::time::Duration::from_secs(10), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        (admin_row(&v, SMOL)["runtime_state"] == "unloading").then_some(())
    })
    .await;
    assert!(unloading.is_some(), "the model is unloading while it streams");
    // A request sent while it unloads waits, then loads the model again.
    let waiting = tokio::spawn({
        let (http, url) = (l.http.clone(), l.url("/api/v1/chat/completions"));
        let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        async move { http.post(url).json(&body).send().await.unwrap().status().as_u16() }
    });
    let mut after_unloading = 0;
    while let Some(c) = stream.next().await {
        let c = String::from_utf8_lossy(&c.unwrap()).into_owned();
        after_unloading += c.matches("\"content\":\"").count();
        text.push_str(&c);
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "the stream was not cut: {text}");
    let tokens = content_chunks(&text);
    assert_eq!(tokens, 64, "every token arrived");
    assert!(after_unloading > 0, "llama-server kept streaming after the unload began");
    assert_eq!(unload.await.unwrap(), 200);
    assert_eq!(waiting.await.unwrap(), 200, "the waiting request was served");
    assert!(!alive(first_pid[0]), "the first llama-server stopped");
    let now = backends(&l);
    assert!(now.len() == 1 && now != first_pid, "a new llama-server serves the model: {now:?}");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL]);
}

/// `POST /api/v1/load` of `model` in the background: its status and JSON body.
fn load_in_background(l: &Lemonade, model: &str) -> tokio::task::JoinHandle<(u16, Value)> {
    let (http, url, body) = (l.http.clone(), l.url("/api/v1/load"), json!({"model_name": model}));
    tokio::spawn(async move {
        let r = http.post(url).json(&body).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    })
}

/// Freezes (SIGSTOP) the next backend `l` spawns that is not in `seen`, the moment it exists.
/// llama-server needs well over that moment to load even SmolLM2, so it is caught while it
/// starts. Its pid.
async fn freeze_next_backend(l: &Lemonade, seen: &[u32]) -> Option<u32> {
    signal_next_backend(l.pid(), seen, libc::SIGSTOP).await
}

#[tokio::test]
async fn real_llama_server_a_start_past_the_load_timeout_is_stopped_and_fails_clearly() {
    let l = Lemonade::start(bin(), &["--load-timeout", "1"]).await;
    let load = load_in_background(&l, SMOL);
    // Both attempts (the first, and the retry after evict-all) are frozen while they start.
    let first = freeze_next_backend(&l, &[]).await.expect("llama-server was spawned");
    let second = freeze_next_backend(&l, &[first]).await.expect("the load was retried");
    let (s, v) = load.await.unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (500, Some("model_load_error")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("backend was not ready after 1 s. Last log lines:"), "{msg}");
    for p in [first, second] {
        assert!(wait_for(std::time::Duration::from_secs(10), || async { (!alive(p)).then_some(()) }).await.is_some());
    }
    let (_, v) = l.get("/v1/admin/models").await;
    assert_eq!(admin_row(&v, SMOL)["runtime_state"], "failed");
    assert!(backends(&l).is_empty());
}

#[tokio::test]
async fn real_llama_server_crash_loop_is_refused_with_retry_after_then_reloads() {
    let l = Lemonade::start(bin(), &[]).await;
    let kill_and_wait = || async {
        let pid = backends(&l)[0];
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        let failed = wait_for(std::time::Duration::from_secs(10), || async {
            let (_, v) = l.get("/v1/admin/models").await;
            (admin_row(&v, SMOL)["runtime_state"] == "failed").then_some(())
        })
        .await;
        assert!(failed.is_some(), "the crash of {pid} was noticed");
    };
    assert_eq!(l.chat(SMOL).await.0, 200);
    kill_and_wait().await;
    assert_eq!(l.chat(SMOL).await.0, 200, "the first crash reloads at once");
    kill_and_wait().await;
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_failed", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("keeps failing and is backing off") && msg.contains("killed by signal 9"), "{msg}");
    let served = wait_for(std::time::Duration::from_secs(10), || async { (l.chat(SMOL).await.0 == 200).then_some(()) });
    assert!(served.await.is_some(), "served again once the pause is over");
    // /metrics saw both crashes of the real llama-server, both restarts and the three loads.
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        format!(r#"lemonade_backend_crashes_total{{model="{SMOL}"}} 2"#),
        format!(r#"lemonade_backend_restarts_total{{model="{SMOL}"}} 2"#),
        format!(r#"lemonade_model_load_seconds_count{{model="{SMOL}"}} 3"#),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in:\n{metrics}");
    }
}

#[tokio::test]
async fn real_llama_server_an_idle_model_is_unloaded_after_the_idle_timeout() {
    let l = Lemonade::start(bin(), &["--idle-timeout", "1"]).await;
    assert_eq!(l.chat(SMOL).await.0, 200);
    let answered = std::time::Instant::now();
    let pid = backends(&l);
    assert_eq!(pid.len(), 1);
    let unloaded = wait_for(std::time::Duration::from_secs(10), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        (admin_row(&v, SMOL)["runtime_state"] == "unloaded").then(std::time::Instant::now)
    })
    .await
    .expect("unloaded once idle");
    assert!(unloaded - answered >= std::time::Duration::from_millis(900), "not before a second of idleness");
    assert!(!alive(pid[0]), "its llama-server stopped");
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
}

#[tokio::test]
async fn real_llama_server_unload_during_its_load_kills_the_starting_process() {
    let l = Lemonade::start(bin(), &["--stop-timeout", "1"]).await;
    // The test freezes llama-server as soon as it is spawned, so it is still starting when the
    // unload comes. A freeze that came too late (the model was already loaded) is retried, a
    // bounded number of times.
    let mut frozen = None;
    for _ in 0..5 {
        let load = load_in_background(&l, SMOL);
        let child = freeze_next_backend(&l, &[]).await.expect("llama-server was spawned");
        let (_, v) = l.get("/v1/admin/models").await;
        if admin_row(&v, SMOL)["runtime_state"] == "loading" {
            frozen = Some((child, load));
            break;
        }
        unsafe {
            libc::kill(child as i32, libc::SIGCONT);
        }
        assert_eq!(load.await.unwrap().0, 200);
        assert_eq!(l.post("/api/v1/unload", &json!({"model_name": SMOL})).await.0, 200);
    }
    let (child, load) = frozen.expect("caught llama-server while it was starting");
    let exe = std::fs::read_link(format!("/proc/{child}/exe")).unwrap();
    assert_eq!(exe, std::fs::canonicalize(llama_server()).unwrap(), "the starting process is the real llama-server");
    let (s, v) = l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = load.await.unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("conflict")), "the load was cancelled: {v}");
    assert!(!alive(child), "the starting llama-server was killed");
    assert!(backends(&l).is_empty());
    let (_, v) = l.get("/v1/admin/models").await;
    assert_eq!(admin_row(&v, SMOL)["runtime_state"], "unloaded");
}

#[tokio::test]
async fn real_llama_server_a_missing_model_file_evicts_nothing() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "-1"]).await;
    assert_eq!(l.chat(SMOL).await.0, 200);
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": "q"})).await.0, 200);
    let before = backends(&l);
    std::fs::remove_file(l.sandbox.extra().join("gemma-3-270m-Q4_K_M.gguf")).unwrap();
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": GEMMA})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (500, Some("model_load_error")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("Model file not found"), "{e}");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL, MINILM], "nothing was evicted");
    let mut after = backends(&l);
    after.sort();
    let mut before = before;
    before.sort();
    assert_eq!(after, before, "the same two llama-servers, untouched");
}

#[tokio::test]
async fn real_llama_server_per_type_limits_3_2_1_are_enforced() {
    let s = Sandbox::new();
    // More models of each type than the limits allow: the real files under other names.
    for (file, name) in [
        (GEMMA_FILE, "gemma-b.gguf"),
        (MINILM_FILE, "minilm-b.gguf"),
        (MINILM_FILE, "minilm-c.gguf"),
        (RERANK_FILE, "rerank-b.gguf"),
    ] {
        std::os::unix::fs::symlink(model(file), s.extra().join(name)).unwrap();
    }
    let l = Lemonade::start_in(bin(), s, &["--max-loaded-models", "3", "2", "1"], &[]).await;
    let llms = [SMOL, SMOL_COPY, GEMMA, "extra.gemma-b"];
    let embs = [MINILM, "extra.minilm-b", "extra.minilm-c"];
    let reranks = [RERANKER, "extra.rerank-b"];
    for m in llms {
        assert_eq!(l.chat(m).await.0, 200, "{m}");
    }
    for m in embs {
        assert_eq!(l.post("/api/v1/embeddings", &json!({"model": m, "input": "q"})).await.0, 200, "{m}");
    }
    for m in reranks {
        let body = json!({"model": m, "query": "q", "documents": ["a", "b"]});
        assert_eq!(l.post("/api/v1/reranking", &body).await.0, 200, "{m}");
    }
    let (_, h) = l.get("/api/v1/health").await;
    let mut loaded = loaded_names(&h);
    loaded.sort();
    let mut expected = vec![SMOL_COPY, GEMMA, "extra.gemma-b", "extra.minilm-b", "extra.minilm-c", "extra.rerank-b"];
    expected.sort();
    assert_eq!(loaded, expected, "the least recently used of each type gave way: 3 LLMs, 2 embedding, 1 reranking");
    assert_eq!(backends(&l).len(), 6, "one llama-server per loaded model, no more");
}

/// Lemonade v11's per-model options API through `lemonade serve` on real llama-server: saving
/// never loads, the file and `/options` agree after each call, `/load` is three-state (`null`
/// ignores the saved value for one load, `-1` sizes the context from the model's header), and
/// `effective` replays as a `/load` body.
#[tokio::test]
async fn real_llama_server_per_model_options_api_and_three_state_load() {
    let l = Lemonade::start(bin(), &[]).await;
    let opts = format!("/api/v1/models/{SMOL}/options");
    let saved_file = || -> Value {
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("recipe_options.json")).unwrap_or(b"{}".to_vec()))
            .unwrap()
    };
    let n_ctx =
        || async { l.get(&format!("/props?model={SMOL}")).await.1["default_generation_settings"]["n_ctx"].clone() };

    let (s, v) = l.get(&opts).await;
    assert_eq!((s, v["saved"].clone(), v["recipe"].clone()), (200, json!({}), json!("llamacpp")), "{v}");
    assert_eq!(v["effective"], v["defaults"]);
    assert_eq!(v["effective"]["model_name"], SMOL);
    assert_eq!((v["effective"]["ctx_size"].clone(), v["resolved_ctx_size"].clone()), (json!(4096), json!(4096)));

    let (s, v) =
        l.post(&format!("/v1/models/{SMOL}/options"), &json!({"ctx_size": 2048, "llamacpp_args": "--threads 1"})).await;
    assert_eq!((s, v["saved"].clone()), (200, json!({"ctx_size": 2048, "llamacpp_args": "--threads 1"})), "{v}");
    assert_eq!(saved_file(), json!({SMOL: {"ctx_size": 2048, "llamacpp_args": "--threads 1"}}));
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty(), "saving options loads nothing");

    let (s, v) = l.post(&opts, &json!({"ctx_size": -1, "dry_run": true})).await;
    assert_eq!((s, v["effective"]["ctx_size"].clone(), v["saved"]["ctx_size"].clone()), (200, json!(-1), json!(2048)));
    assert_eq!(v["resolved_ctx_size"], 8192, "automatic: SmolLM2's trained context fits");
    assert_eq!(saved_file()[SMOL]["ctx_size"], 2048, "a dry run writes nothing");

    for (body, param) in
        [(json!({"steps": 4}), "steps"), (json!({"ctx_size": "big"}), "ctx_size"), (json!({"nope": 1}), "nope")]
    {
        let (s, e) = l.post(&opts, &body).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
    assert_eq!(l.post("/api/v1/models/nope/options", &json!({})).await.0, 404);
    assert_eq!(l.post(&format!("/api/v1/models/{SMOL}"), &json!({})).await.0, 405);
    assert_eq!(
        saved_file(),
        json!({SMOL: {"ctx_size": 2048, "llamacpp_args": "--threads 1"}}),
        "refused bodies wrote nothing"
    );

    // A load uses the saved options; null ignores the saved context for this load only.
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(n_ctx().await, 2048);
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", child_pids(l.pid())[0])).unwrap();
    assert!(cmdline.contains("--threads\u{0}1\u{0}"), "{cmdline:?}");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": null})).await.0, 200);
    assert_eq!(n_ctx().await, 4096, "null: the server's default, not the saved 2048");
    assert_eq!(l.get(&opts).await.1["saved"]["ctx_size"], 2048, "still saved");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": -1})).await.0, 200);
    assert_eq!(n_ctx().await, 8192, "-1: sized from the header");

    // merge_args (v11, default true): the model's args merge with the server's; false replaces.
    assert_eq!(l.post("/internal/set", &json!({"llamacpp_args": "--no-warmup --threads 2"})).await.0, 200);
    let cmdline = || std::fs::read_to_string(format!("/proc/{}/cmdline", child_pids(l.pid())[0])).unwrap();
    assert_eq!(
        l.get(&opts).await.1["effective"]["llamacpp_args"],
        "--threads 1 --no-warmup",
        "the model's --threads wins"
    );
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let c = cmdline();
    assert!(c.contains("--threads\u{0}1\u{0}") && c.contains("--no-warmup") && !c.contains("--threads\u{0}2"), "{c:?}");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "merge_args": false})).await.0, 200);
    let c = cmdline();
    assert!(c.contains("--threads\u{0}1\u{0}") && !c.contains("--no-warmup"), "replaced: {c:?}");
    assert_eq!(l.post("/internal/set", &json!({"llamacpp_args": null})).await.0, 200);

    // Reset, then replay `effective` as a load body.
    let (s, v) = l.delete(&opts).await;
    assert_eq!((s, v["saved"].clone()), (200, json!({})));
    assert_eq!(saved_file(), json!({}));
    let effective = l.get(&opts).await.1["effective"].clone();
    assert_eq!(l.post("/api/v1/load", &effective).await.0, 200, "{effective}");
    assert_eq!(n_ctx().await, 4096);
}

/// Lemonade v11's aliases and naming through `lemonade serve` on real llama-server: an alias
/// (and a registered model's bare name) works in every dialect, `/load`, `/pin` and the options
/// API, is listed under its own id, is kept in `aliases.json`, may not take a model's name, and
/// once removed names nothing.
#[tokio::test]
async fn real_llama_server_aliases_and_bare_names_work_everywhere_a_model_name_does() {
    let l = Lemonade::start(bin(), &[]).await;
    let bare = SMOL.strip_prefix("user.").unwrap();
    let (s, v) = l.post("/internal/aliases", &json!({"alias": "fast", "target": bare})).await;
    assert_eq!((s, v.clone()), (200, json!({"status": "ok", "alias": "fast", "target": bare})));
    let file: Value = serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("aliases.json")).unwrap()).unwrap();
    assert_eq!(file, json!({"fast": bare}));
    let (_, v) = l.get("/internal/aliases").await;
    assert_eq!(v, json!({"aliases": [{"alias": "fast", "target": bare, "downloaded": true, "recipe": "llamacpp"}]}));
    let (_, m) = l.get("/v1/models/fast").await;
    assert_eq!((m["id"].clone(), m["recipe"].clone()), (json!("fast"), json!("llamacpp")));
    let listed = l.get("/api/v1/models").await.1;
    assert!(listed["data"].as_array().unwrap().iter().any(|m| m["id"] == "fast"), "{listed}");
    let tags = l.get("/api/tags").await.1;
    assert!(tags["models"].as_array().unwrap().iter().any(|m| m["name"] == "fast:latest"), "{tags}");

    // Every dialect, one backend: the alias means the model.
    assert_eq!(l.chat("fast").await.0, 200);
    let ollama = json!({"model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 2}});
    assert_eq!(l.post("/api/chat", &ollama).await.0, 200);
    let anthropic = json!({"model": "fast", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(l.post("/v1/messages", &anthropic).await.0, 200);
    assert_eq!(l.chat(bare).await.0, 200, "the bare name of a registered model");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL], "one model, one backend");
    assert_eq!(child_pids(l.pid()).len(), 1);
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": "fast", "ctx_size": 1024})).await.0, 200);
    let (s, v) = l.post("/api/v1/pin", &json!({"model_name": "fast"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(l.get("/api/v1/health").await.1["all_models_loaded"][0]["pinned"], true);
    let (_, o) = l.get("/v1/models/fast/options").await;
    assert_eq!(o["model_name"], SMOL, "{o}");

    // A model's name is not free for an alias; reserved prefixes neither.
    let (s, e) = l.post("/internal/aliases", &json!({"alias": bare, "target": "x"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (400, Some("alias_conflict")), "{e}");
    let (s, e) = l.post("/internal/aliases", &json!({"alias": "builtin.x", "target": "x"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("alias")), "{e}");
    let (s, e) = l.post("/internal/aliases", &json!({"alias": "y"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("target")), "{e}");

    // The CLI, then removal.
    let (code, out, err) = l.cli(&["alias", "add", "slow", SMOL]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = l.cli(&["alias", "list"]).await;
    assert!(code == 0 && out.contains("slow") && out.contains("fast"), "{out}");
    let (code, _, _) = l.cli(&["alias", "remove", "slow"]).await;
    assert_eq!(code, 0);
    let (s, v) = l.delete("/internal/aliases/fast").await;
    assert_eq!((s, v), (200, json!({"status": "deleted", "alias": "fast"})));
    let (s, e) = l.delete("/internal/aliases/fast").await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("not_found")));
    assert_eq!(l.chat("fast").await.0, 404, "a removed alias names nothing");
    let file: Value = serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("aliases.json")).unwrap()).unwrap();
    assert_eq!(file, json!({}));
}

/// Lemonade v11's health fields on real llama-server: the backend's pid, `is_busy` and
/// `is_streaming` (true once a stream's first chunk went out, false once it ended), the launch
/// command with this machine's paths as placeholders, `pinned_models`; `/models` lists the
/// context a model was trained for.
#[tokio::test]
async fn real_llama_server_health_shows_pid_busy_streaming_and_the_launch_command() {
    use futures_util::StreamExt;
    let l = Lemonade::start(bin(), &[]).await;
    let (_, m) = l.get(&format!("/api/v1/models/{SMOL}")).await;
    assert_eq!(m["context_length"], 8192, "SmolLM2's GGUF header: {m}");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "pinned": true})).await.0, 200);
    let h = l.get("/api/v1/health").await.1;
    let e = &h["all_models_loaded"][0];
    assert_eq!(e["pid"], child_pids(l.pid())[0], "{e}");
    assert_eq!((e["is_busy"].clone(), e["is_streaming"].clone()), (json!(false), json!(false)));
    assert_eq!(h["pinned_models"]["llm"], 1, "{h}");
    assert_eq!(h["pinned_models"]["embedding"], 0);
    let cmd: Vec<String> = serde_json::from_value(e["command"].clone()).unwrap();
    assert!(cmd.windows(2).any(|w| w == ["--ctx-size", "4096"]), "{cmd:?}");
    assert!(cmd.iter().any(|a| a.starts_with("<hf-cache>/")), "the model path as a placeholder: {cmd:?}");
    let home = std::env::var("HOME").unwrap();
    assert!(!cmd.iter().any(|a| a.contains(&home)), "no home directory: {cmd:?}");

    let body = json!({"model": SMOL, "stream": true, "max_tokens": 200, "temperature": 0,
                      "messages": [{"role": "user", "content": "Count from one to one hundred."}]});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut stream = r.bytes_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next()).await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "a first chunk");
    let e = l.get("/api/v1/health").await.1["all_models_loaded"][0].clone();
    assert_eq!((e["is_busy"].clone(), e["is_streaming"].clone()), (json!(true), json!(true)), "{e}");
    let drained =
        tokio::time::timeout(std::time::Duration::from_secs(60), async { while stream.next().await.is_some() {} });
    assert!(drained.await.is_ok(), "the stream ends");
    let idle = wait_for(std::time::Duration::from_secs(5), || async {
        let e = l.get("/api/v1/health").await.1["all_models_loaded"][0].clone();
        (e["is_streaming"] == false && e["is_busy"] == false).then_some(())
    })
    .await;
    assert!(idle.is_some(), "not streaming nor busy once the stream ended");
}
