//! Scheduler v2 against real llama-server: pinning, preload, the memory budget, the bounded
//! queue with per-model concurrency, per-model idle timeouts, and live settings.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn entry<'a>(health: &'a Value, name: &str) -> &'a Value {
    health["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == name).unwrap_or(&Value::Null)
}

async fn stream(l: &Lemonade, model: &str, tokens: u32) -> reqwest::Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
                      "max_tokens": tokens, "ignore_eos": true, "stream": true});
    l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap()
}

#[tokio::test]
async fn real_llama_server_a_pinned_model_survives_a_load_of_another_and_the_409_names_it() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "pinned": true})).await;
    assert_eq!(s, 200, "{v}");
    let pid = child_pids(l.pid());
    assert_eq!(pid.len(), 1);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(entry(&h, SMOL)["pinned"], true, "{h}");
    let (s, e) = l.chat(GEMMA).await;
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("slots_pinned")), "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(SMOL) && msg.contains("pinned"), "{msg}");
    assert_eq!(child_pids(l.pid()), pid, "the pinned model's llama-server runs on, untouched");
    assert_eq!(l.chat(SMOL).await.0, 200);
    // Unpinned with the CLI, it gives way as before.
    let (code, out, err) = l.cli(&["unpin", SMOL]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Unpinned"), "{out}");
    assert_eq!(l.chat(GEMMA).await.0, 200);
    assert!(!alive(pid[0]), "SMOL was evicted once unpinned");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), vec![GEMMA.to_string()]);
    // Pinning with the CLI, and pinning what is not loaded.
    assert_eq!(l.cli(&["pin", GEMMA]).await.0, 0);
    assert_eq!(entry(&l.get("/api/v1/health").await.1, GEMMA)["pinned"], true);
    let (s, e) = l.post("/api/v1/pin", &json!({"model_name": SMOL})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("model_not_loaded")), "{e}");
}

#[tokio::test]
async fn real_llama_server_preload_loads_the_model_without_a_request() {
    let l = Lemonade::start(bin(), &["--preload", SMOL]).await;
    // Listening (the harness waited for it) while the model loads: health lists it on its way.
    let (s, h) = l.get("/api/v1/health").await;
    assert_eq!(s, 200);
    let on_its_way = h["models_loading"].as_array().unwrap().iter().any(|m| m == SMOL);
    assert!(on_its_way || loaded_names(&h).contains(&SMOL.to_string()), "{h}");
    let loaded = wait_for(Duration::from_secs(30), || async {
        let (_, h) = l.get("/api/v1/health").await;
        loaded_names(&h).contains(&SMOL.to_string()).then_some(h)
    })
    .await
    .expect("preloaded");
    assert_eq!(loaded["models_loading"], json!([]));
    assert_eq!(child_pids(l.pid()).len(), 1);
    assert!(!l.log().contains("/chat/completions"), "no request was made");
}

#[tokio::test]
async fn real_llama_server_a_memory_budget_smaller_than_a_model_is_refused_with_the_figures() {
    let l = Lemonade::start(bin(), &["--memory-budget", "100M"]).await;
    let (s, e) = l.chat(SMOL).await;
    assert_eq!((s, e["error"]["code"].as_str()), (507, Some("insufficient_memory")), "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("needs an estimated") && msg.contains("MiB") && msg.contains("budget is 100.0 MiB"), "{msg}");
    assert!(child_pids(l.pid()).is_empty(), "no backend was started to die out of memory");
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (507, Some("insufficient_memory")), "{e}");
}

#[tokio::test]
async fn real_llama_server_a_gpu_load_over_the_vram_budget_is_refused_naming_vram_and_the_cpu_one_runs() {
    let l = Lemonade::start(bin(), &["--vram-budget", "100M", "--memory-budget", "none"]).await;
    let (_, p) = l.get("/api/v1/params").await;
    assert_eq!((p["vram_budget"].as_u64(), p["memory_budget"].as_u64()), (Some(100 << 20), None), "{p}");
    // On vulkan every layer is offloaded: weights, KV cache and buffers are counted in VRAM.
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": GEMMA, "llamacpp_backend": "vulkan"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (507, Some("insufficient_memory")), "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("of VRAM but the VRAM budget is 100.0 MiB") && msg.contains("--vram-budget"), "{msg}");
    assert!(child_pids(l.pid()).is_empty(), "nothing was installed or started");
    // The same model on the CPU takes no VRAM.
    assert_eq!(l.chat(GEMMA).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    let m = entry(&h, GEMMA);
    assert!(m["memory_estimate"].as_u64().unwrap() > 300 << 20 && m["vram_estimate"] == 0, "{m}");
    let (_, p) = l.get("/api/v1/params").await;
    assert_eq!(p["vram_in_use"], 0, "{p}");
    // Live: no VRAM budget, and a bad one is named.
    let (s, p) = l.post("/api/v1/params", &json!({"vram_budget": "none"})).await;
    assert_eq!((s, &p["vram_budget"]), (200, &Value::Null), "{p}");
    let (s, e) = l.post("/api/v1/params", &json!({"vram_budget": "lots"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("vram_budget")), "{e}");
}

#[tokio::test]
async fn real_llama_server_the_memory_budget_evicts_across_types_to_fit() {
    // SmolLM2 (~311 MiB estimated, its 90 MiB prompt cache included) and MiniLM (~120 MiB) fit
    // together in 500M; Gemma (~400 MiB) fits only alone, though the slot limits would let all
    // three run.
    let l = Lemonade::start(bin(), &["--memory-budget", "500M", "--max-loaded-models", "-1"]).await;
    assert_eq!(l.chat(SMOL).await.0, 200);
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": "q"})).await.0, 200);
    assert_eq!(child_pids(l.pid()).len(), 2);
    let (_, p) = l.get("/api/v1/params").await;
    let in_use = p["memory_in_use"].as_u64().unwrap();
    assert!(in_use > 0 && in_use <= 500 << 20, "{p}");
    assert_eq!(l.chat(GEMMA).await.0, 200);
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), vec![GEMMA.to_string()]);
    assert_eq!(child_pids(l.pid()).len(), 1);
}

#[tokio::test]
async fn real_llama_server_the_queue_bound_gives_503_with_retry_after() {
    let l = Lemonade::start(bin(), &["--max-queue", "1", "--max-concurrent", "1"]).await;
    // Loaded first: a cold request would be answered at once with `: loading` comments.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    // One request runs (the model's one place), one waits (the queue's one place).
    let running = stream(&l, SMOL, 48).await;
    assert_eq!(running.status(), 200);
    let l2 = l.http.clone();
    let url = l.url("/api/v1/chat/completions");
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let waiting = tokio::spawn(async move { l2.post(url).json(&body).send().await.unwrap().status().as_u16() });
    let queued = wait_for(Duration::from_secs(10), || async {
        let (_, h) = l.get("/api/v1/health").await;
        (entry(&h, SMOL)["queued"] == 1).then_some(())
    })
    .await;
    assert!(queued.is_some(), "the second request waits in lemonade's queue");
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "queue_full", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("--max-queue"), "{e}");
    let text = running.text().await.unwrap();
    assert!(text.contains("[DONE]"), "the running stream completed");
    assert_eq!(waiting.await.unwrap(), 200, "the waiting request was served after it");
}

#[tokio::test]
async fn real_llama_server_a_per_model_idle_timeout_unloads_it_and_health_says_when() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "idle_timeout": 2})).await;
    assert_eq!(s, 200, "{v}");
    let (_, h) = l.get("/api/v1/health").await;
    let e = entry(&h, SMOL);
    assert_eq!(e["idle_timeout"], 2, "{h}");
    let left = e["unloads_in_ms"].as_u64().expect("a deadline while idle");
    assert!(left <= 2000, "{h}");
    let (_, a) = l.get("/v1/admin/models").await;
    let row = a["models"].as_array().unwrap().iter().find(|m| m["name"] == SMOL).unwrap();
    assert!(row["unloads_in_ms"].as_u64().is_some_and(|ms| ms <= 2000), "{row}");
    let pid = child_pids(l.pid());
    let gone = wait_for(Duration::from_secs(10), || async {
        let (_, a) = l.get("/v1/admin/models").await;
        let row = a["models"].as_array().unwrap().iter().find(|m| m["name"] == SMOL).cloned().unwrap_or_default();
        (row["runtime_state"] == "unloaded").then_some(())
    })
    .await;
    assert!(gone.is_some(), "unloaded after its own timeout (the server has none)");
    assert!(!alive(pid[0]), "its llama-server stopped");
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
}

#[tokio::test]
async fn real_llama_server_settings_change_live_are_saved_and_read_at_start_under_the_flags() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, p) = l.get("/api/v1/params").await;
    assert_eq!(s, 200);
    assert_eq!(
        (p["max_queue"].as_u64(), p["idle_timeout"].as_u64(), p["swap_hold_ms"].as_u64()),
        (Some(256), Some(0), Some(2000)),
        "{p}"
    );
    assert!(p["memory_budget"].as_u64().is_some_and(|b| b > 0), "auto by default: {p}");
    let update = json!({"max_loaded_models": 2, "idle_timeout": 30, "max_queue": 8, "memory_budget": "1G"});
    let (s, p) = l.post("/api/v1/params", &update).await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["max_loaded_models"]["llm"], 2);
    assert_eq!((p["idle_timeout"].as_u64(), p["max_queue"].as_u64()), (Some(30), Some(8)));
    assert_eq!(p["memory_budget"].as_u64(), Some(1 << 30));
    assert_eq!(l.get("/api/v1/params").await.1, p, "GET reads what POST set");
    // In force at once: two LLMs now stay loaded side by side.
    assert_eq!(l.chat(SMOL).await.0, 200);
    assert_eq!(l.chat(GEMMA).await.0, 200);
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1).len(), 2);
    assert_eq!(l.get("/api/v1/health").await.1["max_models"]["llm"], 2, "health shows the live limit");
    assert_eq!(child_pids(l.pid()).len(), 2);
    let (s, e) = l.post("/api/v1/params", &json!({"memory_budget": "lots"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("memory_budget")), "{e}");
    let (s, e) = l.post("/api/v1/params", &json!({"max_loaded_models": 0})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("max_loaded_models")), "{e}");
    let (s, e) = l.post("/api/v1/params", &json!({"idle_timeuot": 3})).await;
    assert_eq!(s, 400, "an unknown field is named: {e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("idle_timeuot"), "{e}");
    // The largest values are "a very long time", not an overflow: schemathesis found
    // `idle_timeout: 2^63` stopped the scheduler, and every later load, pin or unload hung.
    let huge = json!({"idle_timeout": 1u64 << 63, "swap_hold_ms": u64::MAX});
    let (s, p) = l.post("/api/v1/params", &huge).await;
    assert_eq!(s, 200, "{p}");
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        (l.chat(SMOL).await.0, l.post("/api/v1/pin", &json!({"model_name": SMOL})).await.0)
    });
    assert_eq!(answered.await.expect("the scheduler still answers"), (200, 200));
    let update = json!({"idle_timeout": 30, "swap_hold_ms": 2000});
    assert_eq!(l.post("/api/v1/params", &update).await.0, 200);
    assert_eq!(l.post("/api/v1/pin", &json!({"model_name": SMOL, "pinned": false})).await.0, 200);
    // Saved: a restart reads them; a flag wins over the file.
    let sandbox = l.kill_keeping_sandbox();
    let l = Lemonade::start_in(bin(), sandbox, &["--idle-timeout", "7"], &[]).await;
    let (_, p) = l.get("/api/v1/params").await;
    assert_eq!(p["max_loaded_models"]["llm"], 2, "{p}");
    assert_eq!((p["idle_timeout"].as_u64(), p["max_queue"].as_u64()), (Some(7), Some(8)), "{p}");
    assert_eq!(p["memory_budget"].as_u64(), Some(1 << 30));
}

/// The scheduler explains itself, on real llama-server: `/scheduler` shows the ledgers and why
/// a model stays, a plan says what a load would evict (or why it would be refused) and changes
/// nothing, and each decision is streamed as it is taken and counted in `/metrics`.
#[tokio::test]
async fn real_llama_server_the_scheduler_explains_itself_and_plans_without_side_effects() {
    let l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let (s, st) = l.get("/api/v1/scheduler").await;
    assert_eq!(s, 200);
    let smol =
        st["models"].as_array().unwrap().iter().find(|m| m["model_name"] == SMOL).unwrap_or_else(|| panic!("{st}"));
    assert_eq!((smol["state"].clone(), smol["pinned"].clone()), (json!("loaded"), json!(false)), "{st}");
    assert!(smol["resident"].as_str().unwrap().starts_with("kept (no idle timeout)"), "{smol}");
    let memory = &st["pools"][0];
    assert_eq!((memory["pool"].clone(), st["pools"][1]["pool"].clone()), (json!("memory"), json!("vram")));
    assert!(memory["models"][SMOL].as_u64().unwrap() > 50_000_000, "its estimate in the ledger: {memory}");
    assert_eq!(st["max_loaded_models"]["llm"], 1);
    let d = st["decisions"].as_array().unwrap();
    assert!(d.iter().any(|d| d["decision"] == "load" && d["reason"] == "explicit" && d["model"] == SMOL), "{st}");

    // A plan: what loading Gemma would do; nothing happens.
    let pids = child_pids(l.pid());
    let (s, p) = l.post("/api/v1/scheduler/plan", &json!({"model_name": GEMMA})).await;
    assert_eq!((s, p["outcome"].clone(), p["evicts"].clone()), (200, json!("load"), json!([SMOL])), "{p}");
    assert_eq!(p["summary"], format!("{GEMMA} would load after evicting {SMOL}"));
    assert!(p["memory_bytes"].as_u64().unwrap() > 100_000_000, "{p}");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL], "nothing loaded or evicted");
    assert_eq!(child_pids(l.pid()), pids);
    let (_, p) = l.post("/api/v1/scheduler/plan", &json!({"model_name": SMOL})).await;
    assert_eq!(p["outcome"], "loaded", "{p}");
    assert_eq!(l.post("/api/v1/pin", &json!({"model_name": SMOL, "pinned": true})).await.0, 200);
    let (_, p) = l.post("/api/v1/scheduler/plan", &json!({"model_name": GEMMA})).await;
    assert_eq!((p["outcome"].clone(), p["refusal"]["code"].clone()), (json!("refused"), json!("slots_pinned")), "{p}");
    assert!(p["refusal"]["message"].as_str().unwrap().contains(SMOL), "{p}");
    assert_eq!(l.post("/api/v1/pin", &json!({"model_name": SMOL, "pinned": false})).await.0, 200);
    let (s, e) = l.post("/api/v1/scheduler/plan", &json!({"model_name": "user.Nope"})).await;
    assert_eq!((s, e["error"]["code"].clone()), (404, json!("model_not_found")), "{e}");
    let (s, e) = l.post("/api/v1/scheduler/plan", &json!({"model_name": GEMMA, "ctx_size": "big"})).await;
    assert_eq!(s, 400, "{e}");

    // The event stream: a request for Gemma evicts SmolLM2 to make room, then loads Gemma.
    let mut events = l.http.get(l.url("/api/v1/scheduler/events")).send().await.unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    assert_eq!(l.chat(GEMMA).await.0, 200);
    let mut seen: Vec<(String, String, String)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.iter().any(|(d, _, m)| d == "load" && m == GEMMA) {
        let chunk =
            tokio::time::timeout_at(deadline, events.chunk()).await.expect("the events within 20 s").unwrap().unwrap();
        for line in String::from_utf8_lossy(&chunk).lines().filter_map(|l| l.strip_prefix("data: ")) {
            let v: Value = serde_json::from_str(line).unwrap();
            seen.push((
                v["decision"].as_str().unwrap().into(),
                v["reason"].as_str().unwrap().into(),
                v["model"].as_str().unwrap().into(),
            ));
        }
    }
    let order: Vec<(&str, &str, &str)> = seen.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
    assert_eq!(order, [("queue", "loading", GEMMA), ("evict", "make_room", SMOL), ("load", "request", GEMMA)]);
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("lemonade_scheduler_decisions_total{decision=\"evict\",reason=\"make_room\"} 1"),
        "{metrics}"
    );
}

/// `parallel` slots sized honestly, on real llama-server: each slot has `ctx_size` of its own
/// (the KV pool and the memory estimate count them all), health says so, requests run two at
/// once and the third waits, and a request longer than a slot is refused with both numbers.
#[tokio::test]
async fn real_llama_server_parallel_slots_each_get_their_context_and_are_counted() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 1024})).await;
    assert_eq!(s, 200, "{v}");
    let shared = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
    assert_eq!(
        (shared["parallel"].clone(), shared["slot_ctx_size"].clone(), shared["kv_cells"].clone()),
        (json!(4), json!(1024), json!(1024)),
        "{shared}"
    );
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 1024, "parallel": 2})).await;
    assert_eq!(s, 200, "{v}");
    let (_, h) = l.get("/api/v1/health").await;
    let e = entry(&h, SMOL);
    assert_eq!(
        (e["parallel"].clone(), e["slot_ctx_size"].clone(), e["kv_cells"].clone()),
        (json!(2), json!(1024), json!(2048)),
        "{e}"
    );
    let command = e["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect::<Vec<_>>().join(" ");
    assert!(
        command.contains("--ctx-size 2048 ") && command.contains("--parallel 2 --kv-unified-per-slot 1024"),
        "{command}"
    );
    assert!(
        e["memory_estimate"].as_u64() > shared["memory_estimate"].as_u64(),
        "the whole KV cache is counted: {e} vs {shared}"
    );
    let (_, m) = l.get(&format!("/api/v1/models/{SMOL}")).await;
    assert_eq!((m["parallel"].clone(), m["slot_ctx_size"].clone()), (json!(2), json!(1024)), "{m}");
    let (_, props) = l.get(&format!("/api/v1/props?model={SMOL}")).await;
    assert_eq!(
        (props["total_slots"].clone(), props["default_generation_settings"]["n_ctx"].clone()),
        (json!(2), json!(1024)),
        "{props}"
    );

    // Two requests run at once; a third waits for a slot.
    let (a, b) = (stream(&l, SMOL, 200).await, stream(&l, SMOL, 200).await);
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let l2 = l.http.clone();
    let url = l.url("/api/v1/chat/completions");
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let third = tokio::spawn(async move { l2.post(url).json(&body).send().await.unwrap().status().as_u16() });
    let seen = wait_for(Duration::from_secs(10), || async {
        let e = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
        (e["in_flight"] == 2 && e["queued"] == 1).then_some(())
    })
    .await;
    assert!(seen.is_some(), "two in flight, one queued: {}", l.get("/api/v1/health").await.1);
    let (ta, tb) = (a.text().await.unwrap(), b.text().await.unwrap());
    assert!(ta.contains("[DONE]") && tb.contains("[DONE]"));
    assert_eq!(third.await.unwrap(), 200);

    // `parallel: 0`: as many slots as the memory budget holds (8 for SmolLM2 here), each with
    // its own context.
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 1024, "parallel": 0})).await;
    assert_eq!(s, 200, "{v}");
    let auto = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
    assert_eq!(
        (auto["parallel"].clone(), auto["slot_ctx_size"].clone(), auto["kv_cells"].clone()),
        (json!(8), json!(1024), json!(8192)),
        "{auto}"
    );
    assert!(strs(&auto["command"]).join(" ").contains("--parallel 8 --kv-unified-per-slot 1024"), "{auto}");
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 1024, "parallel": 2})).await;
    assert_eq!(s, 200, "{v}");

    // Longer than a slot: refused at once, with both numbers.
    let long =
        json!({"model": SMOL, "messages": [{"role": "user", "content": "lemon ".repeat(1500)}], "max_tokens": 2});
    let (s, e) = l.post("/api/v1/chat/completions", &long).await;
    assert_eq!(
        (s, e["error"]["type"].clone(), e["error"]["n_ctx"].clone()),
        (400, json!("exceed_context_size_error"), json!(1024)),
        "{e}"
    );
    assert!(e["error"]["n_prompt_tokens"].as_u64().unwrap() > 1024, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("(1024 tokens)"), "{e}");

    // Bad values name the option.
    for bad in [json!({"parallel": -1}), json!({"parallel": 65}), json!({"parallel": 2, "llamacpp_args": "-np 4"})] {
        let mut body = bad.clone();
        body["model_name"] = json!(SMOL);
        let (s, e) = l.post("/api/v1/load", &body).await;
        assert_eq!((s, e["error"]["param"].clone()), (400, json!("parallel")), "{bad}: {e}");
    }
}

/// Reads a stream to its end; the text.
async fn all_of(r: reqwest::Response) -> String {
    r.text().await.unwrap()
}

/// A streamed request that waits is answered at once and told where it is, on real
/// llama-server: `: loading N s` while its model loads, `: queued N` while it waits for a place
/// on the loaded model; then the same events it would have had; the official openai SDK reads
/// such a stream as any other.
#[tokio::test]
async fn real_llama_server_a_waiting_stream_says_where_it_is_with_sse_comments() {
    let l = Lemonade::start(bin(), &["--max-concurrent", "1"]).await;
    let loading = stream(&l, GEMMA, 4).await;
    assert_eq!(loading.status(), 200);
    let text = all_of(loading).await;
    let first_data = text.find("data: ").unwrap();
    assert!(text[..first_data].starts_with(": loading 0 s\n\n"), "comments before the first event: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // One request runs; the next waits in line and says so.
    let running = stream(&l, GEMMA, 200).await;
    let waiting = stream(&l, GEMMA, 2).await;
    assert_eq!(waiting.status(), 200, "answered at once");
    let (ra, wa) = tokio::join!(all_of(running), all_of(waiting));
    assert!(ra.contains("[DONE]"));
    let first_data = wa.find("data: ").unwrap();
    assert!(wa[..first_data].contains(": queued 1\n\n"), "{wa}");
    assert!(wa.trim_end().ends_with("data: [DONE]"), "{wa}");
    // While the model loads, a request behind another is told its place in line as well.
    assert_eq!(l.post("/api/v1/unload", &json!({})).await.0, 200);
    // (The first is answered once it has waited 250 ms, in line by then; Gemma takes longer
    // than that to load.)
    let first = stream(&l, GEMMA, 2).await;
    let second = stream(&l, GEMMA, 2).await;
    let (_, tb) = tokio::join!(all_of(first), all_of(second));
    let comments = &tb[..tb.find("data: ").unwrap()];
    assert!(comments.starts_with(": loading 0 s, queued 2\n\n"), "the second in line while loading: {tb}");
    // The SDK ignores the comments (the model loads again after an unload).
    assert_eq!(l.post("/api/v1/unload", &json!({})).await.0, 200);
    py_checks("queued_client.py", &[&l.url(""), SMOL]).await;
}

/// Per-request priority, on real llama-server: with one place on the model, a request of
/// priority 5 (given by the `X-Lemonade-Priority` header) that arrives after one of priority 0
/// (in the body) is served before it; a priority out of range is a 400 naming it.
#[tokio::test]
async fn real_llama_server_a_request_with_a_higher_priority_is_served_first() {
    let l = Lemonade::start(bin(), &["--max-concurrent", "1"]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let running = stream(&l, SMOL, 120).await;
    let ask = |priority: i64, header: bool| {
        let (http, url) = (l.http.clone(), l.url("/api/v1/chat/completions"));
        let mut body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let mut req = http.post(url);
        if header {
            req = req.header("X-Lemonade-Priority", priority.to_string());
        } else {
            body["priority"] = json!(priority);
        }
        tokio::spawn(async move {
            let s = req.json(&body).send().await.unwrap().status().as_u16();
            (s, std::time::Instant::now())
        })
    };
    let queued = |n: u64| {
        let l = &l;
        async move {
            wait_for(Duration::from_secs(10), || async {
                (entry(&l.get("/api/v1/health").await.1, SMOL)["queued"] == n).then_some(())
            })
            .await
        }
    };
    let low = ask(0, false);
    assert!(queued(1).await.is_some(), "the first waits");
    let high = ask(5, true);
    assert!(queued(2).await.is_some(), "the second waits too");
    let (_, st) = l.get("/api/v1/scheduler").await;
    let details: Vec<&str> = st["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["decision"] == "queue")
        .map(|d| d["detail"].as_str().unwrap())
        .collect();
    assert!(details.last().unwrap().ends_with("waits, 1 in line for it (priority 5)"), "{details:?}");
    assert!(running.text().await.unwrap().contains("[DONE]"));
    let ((sl, tl), (sh, th)) = (low.await.unwrap(), high.await.unwrap());
    assert_eq!((sl, sh), (200, 200));
    assert!(th < tl, "the higher priority was served first");
    for bad in [json!(11), json!(-11), json!("high"), json!(1.5)] {
        let body =
            json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": bad});
        let (s, e) = l.post("/api/v1/chat/completions", &body).await;
        assert_eq!((s, e["error"]["param"].clone()), (400, json!("priority")), "{e}");
    }
    for bad in ["11", "high", ""] {
        let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let r = l
            .http
            .post(l.url("/api/v1/chat/completions"))
            .header("X-Lemonade-Priority", bad)
            .json(&body)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert_eq!((s, e["error"]["param"].clone()), (400, json!("X-Lemonade-Priority")), "{bad}: {e}");
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()).unwrap_or_default()
}

/// Placement on devices, with real llama-server: on a stand-in tree of two NVIDIA GPUs and one
/// AMD GPU, system-info lists them and `/scheduler` keeps a ledger for each; a load asked onto
/// gpu1 runs with the environment that shows it only that GPU; a split over gpu0 and gpu2 gets
/// `--tensor-split` from its shares and leaves the model on gpu1 alone; `auto` goes where the
/// most is free; an unknown device is a 400 naming the devices there are. (The `vulkan`
/// backend here is the CPU build, which ignores the GPU flags and serves all the same.)
#[tokio::test]
async fn real_llama_server_models_are_placed_on_devices_and_told_which_they_may_see() {
    let hw = fake_hardware();
    let server = llama_server();
    let env = [
        ("LEMONADE_HARDWARE_ROOT", hw.path().to_str().unwrap()),
        ("LEMONADE_LLAMACPP_VULKAN_BIN", server.to_str().unwrap()),
    ];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &["--max-loaded-models", "-1"], &env).await;
    let (_, info) = l.get("/api/v1/system-info").await;
    let ids: Vec<&str> =
        info["compute_devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["gpu0", "gpu1", "gpu2", "npu0"], "{info}");
    assert_eq!(info["compute_devices"][2]["name"], "Radeon RX 7800 XT");
    let (_, s) = l.get("/api/v1/scheduler").await;
    let budgets: Vec<u64> =
        s["devices"].as_array().unwrap().iter().filter_map(|d| d["budget_bytes"].as_u64()).collect();
    assert!(budgets[0] < 7 << 30 && budgets[1] < 4 << 30 && budgets[2] > budgets[0], "free less a margin: {s}");

    // One GPU: the plan says where, the load goes there, the backend sees only that GPU.
    let on1 = json!({"model_name": SMOL, "llamacpp_backend": "vulkan", "device": "gpu1"});
    let (_, plan) = l.post("/api/v1/scheduler/plan", &on1).await;
    assert!(plan["summary"].as_str().unwrap().contains("would load on gpu1"), "{plan}");
    let (code, out, err) = l.cli(&["load", SMOL, "--llamacpp", "vulkan", "--device", "gpu1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, h) = l.get("/api/v1/health").await;
    let smol = entry(&h, SMOL).clone();
    let vram = smol["vram_estimate"].as_u64().unwrap();
    assert_eq!(smol["placed_on"], json!({"gpu1": vram}), "{smol}");
    assert_eq!(plan["devices"], smol["placed_on"], "the plan said where it went");
    assert_eq!(smol["env"], json!({"CUDA_VISIBLE_DEVICES": "1", "GGML_VK_VISIBLE_DEVICES": "1"}), "{smol}");
    let command = strs(&smol["command"]).join(" ");
    assert!(command.contains("-ngl 99") && !command.contains("--tensor-split"), "{command}");
    let (st, c) = l.chat(SMOL).await;
    assert!(st == 200 && !c["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{c}");

    // Two GPUs: split by their free memory, told both; the model on gpu1 stays.
    let split = json!({"model_name": GEMMA, "llamacpp_backend": "vulkan", "device": "gpu0,gpu2"});
    let (st, v) = l.post("/api/v1/load", &split).await;
    assert_eq!(st, 200, "{v}");
    let (_, h) = l.get("/api/v1/health").await;
    let gemma = entry(&h, GEMMA).clone();
    let shares = gemma["placed_on"].as_object().unwrap();
    assert_eq!(shares.keys().collect::<Vec<_>>(), ["gpu0", "gpu2"], "{gemma}");
    let total: u64 = shares.values().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(total, gemma["vram_estimate"].as_u64().unwrap(), "the shares sum to the model");
    assert!(shares["gpu2"].as_u64() > shares["gpu0"].as_u64(), "more on the GPU with more free: {gemma}");
    assert_eq!(
        gemma["env"],
        json!({"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0", "GGML_VK_VISIBLE_DEVICES": "0,2"}),
        "{gemma}"
    );
    let mib = |d: &str| (shares[d].as_u64().unwrap() >> 20).max(1);
    let command = strs(&gemma["command"]).join(" ");
    assert!(command.contains(&format!("--tensor-split {},{} --main-gpu 0", mib("gpu0"), mib("gpu2"))), "{command}");
    assert_eq!(l.chat(GEMMA).await.0, 200);
    assert_eq!(entry(&h, SMOL)["placed_on"], json!({"gpu1": vram}), "a load on gpu0 and gpu2 leaves gpu1 alone");

    // auto: where the most is free (gpu2, 16 GiB less Gemma's share).
    let auto = json!({"model_name": MINILM, "llamacpp_backend": "vulkan", "device": "auto"});
    assert_eq!(l.post("/api/v1/load", &auto).await.0, 200);
    let (_, s) = l.get("/api/v1/scheduler").await;
    let gpu2 = s["devices"].as_array().unwrap().iter().find(|d| d["id"] == "gpu2").unwrap().clone();
    assert!(gpu2["models"][MINILM].as_u64().unwrap() > 0 && gpu2["models"][GEMMA].as_u64().is_some(), "{gpu2}");
    let models_sum: u64 = gpu2["models"].as_object().unwrap().values().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(gpu2["in_use_bytes"].as_u64(), Some(models_sum), "{gpu2}");

    // Refusals name the option, and the devices there are.
    let (st, e) =
        l.post("/api/v1/load", &json!({"model_name": SMOL, "llamacpp_backend": "vulkan", "device": "gpu7"})).await;
    assert_eq!(
        (st, e["error"]["param"].as_str(), e["error"]["code"].as_str()),
        (400, Some("device"), Some("unknown_device")),
        "{e}"
    );
    assert!(e["error"]["message"].as_str().unwrap().contains("gpu0, gpu1, gpu2"), "{e}");
    let (st, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "device": "GPU 1"})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("device")), "{e}");
    let (st, e) = l.post(&format!("/api/v1/models/{SMOL}/options"), &json!({"device": "npu3"})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("device")), "{e}");
    assert_eq!(entry(&l.get("/api/v1/health").await.1, SMOL)["placed_on"], json!({"gpu1": vram}), "nothing moved");
}

/// `parallel: 4` decodes four streams at once, on real llama-server: each of four concurrent
/// streams of SmolLM2 gets its first token before any of them ends (their token times overlap),
/// where with `parallel: 1` and one request at a time on the model, each next stream starts
/// only after the one before it ends.
#[tokio::test]
async fn real_llama_server_parallel_four_decodes_four_streams_at_the_same_time() {
    /// Four streams at once; for each, when its first and its last token came.
    async fn four(l: &Lemonade) -> Vec<(Instant, Instant)> {
        let runs = (0..4).map(|_| async {
            let mut r = stream(l, SMOL, 24).await;
            assert_eq!(r.status(), 200);
            let (mut first, mut last) = (None, None);
            while let Some(chunk) = r.chunk().await.unwrap() {
                if String::from_utf8_lossy(&chunk).contains("\"content\"") {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                }
            }
            (first.expect("a token"), last.expect("a token"))
        });
        futures_util::future::join_all(runs).await
    }
    let l = Lemonade::start(bin(), &["--max-concurrent", "4"]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 512, "parallel": 4})).await.0, 200);
    let t = four(&l).await;
    let latest_first = t.iter().map(|(f, _)| *f).max().unwrap();
    let earliest_last = t.iter().map(|(_, e)| *e).min().unwrap();
    assert!(latest_first < earliest_last, "every stream had a token before any ended: {t:?}");
    drop(l);

    let l = Lemonade::start(bin(), &["--max-concurrent", "1"]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 512, "parallel": 1})).await.0, 200);
    let mut t = four(&l).await;
    t.sort();
    assert!(t.windows(2).all(|w| w[0].1 <= w[1].0), "one at a time: each starts after the last ended: {t:?}");
}

const FLM_A: &str = "Gemma3-1b-it-FLM";
const FLM_B: &str = "Llama-3.2-1B-FLM";

/// FastFlowLM on Linux, as Lemonade v11.7 runs it, with the stand-in `flm`
/// (tests/src/bin/flm-standin.rs) on a stand-in NPU (`amdxdna` in a sysfs tree): the recipe is
/// installed and its models listed on Linux; a load runs `flm validate`, `flm pull <tag>` and
/// `flm serve <tag> --ctx-len N --port P --host 127.0.0.1 <flm_args> --quiet`; the model is
/// placed on npu0 and requests reach FLM under its tag; a second FLM model takes the NPU's
/// turn (NPU exclusivity per device) while GPU-less models stay; bad `flm_args` are refused
/// naming them, and a failed `flm validate` fails the load pointing to the driver guide.
#[tokio::test]
async fn flm_standin_models_run_on_the_npu_one_at_a_time_as_v11_runs_flm() {
    let hw = fake_hardware();
    let log = hw.path().join("flm.log");
    let flm = flm_standin();
    let env = [
        ("LEMONADE_HARDWARE_ROOT", hw.path().to_str().unwrap()),
        ("LEMONADE_FLM_NPU_BIN", flm.to_str().unwrap()),
        ("FLM_STANDIN_LOG", log.to_str().unwrap()),
    ];
    // The stand-in logs its calls outside the folders a sandboxed backend may write.
    let l = Lemonade::start_in(bin(), Sandbox::new(), &["--max-loaded-models", "-1", "--sandbox", "off"], &env).await;
    let (_, info) = l.get("/api/v1/system-info").await;
    assert_eq!(info["recipes"]["flm"]["backends"]["npu"]["state"], "installed", "{}", info["recipes"]["flm"]);
    let (_, m) = l.get(&format!("/api/v1/models/{FLM_A}")).await;
    assert_eq!((m["recipe"].as_str(), m["checkpoint"].as_str()), (Some("flm"), Some("gemma3:1b")), "{m}");

    let body = json!({"model_name": FLM_A, "ctx_size": 2048, "flm_args": "--pmode turbo"});
    let (s, v) = l.post("/api/v1/load", &body).await;
    assert_eq!(s, 200, "{v}");
    let calls: Vec<Vec<String>> =
        std::fs::read_to_string(&log).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let port = calls[2].get(5).cloned().unwrap_or_default();
    let want = [
        vec!["validate", "--json"],
        vec!["pull", "gemma3:1b"],
        vec![
            "serve",
            "gemma3:1b",
            "--ctx-len",
            "2048",
            "--port",
            port.as_str(),
            "--host",
            "127.0.0.1",
            "--pmode",
            "turbo",
            "--quiet",
        ],
    ];
    assert_eq!(calls, want.map(|c| c.iter().map(|s| s.to_string()).collect::<Vec<_>>()), "what lemonade ran");
    let (_, h) = l.get("/api/v1/health").await;
    let a = entry(&h, FLM_A).clone();
    assert_eq!((a["placed_on"].clone(), a["device"].as_str()), (json!({"npu0": 0}), Some("npu")), "{a}");

    // Requests reach FLM under its tag (the stand-in answers 404 to any other name).
    let (s, c) = l.chat(FLM_A).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["choices"][0]["message"]["content"], "Hello from gemma3:1b on the NPU stand-in.");
    let text = stream(&l, FLM_A, 8).await.text().await.unwrap();
    assert!(text.contains("stand-in") && text.trim_end().ends_with("data: [DONE]"), "{text}");

    // One model per NPU: the second takes npu0's turn; the CPU model beside them stays.
    assert_eq!(l.chat(SMOL).await.0, 200);
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": FLM_B})).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    let mut names = loaded_names(&h);
    names.sort();
    assert_eq!(names, [FLM_B.to_string(), SMOL.to_string()], "{h}");
    let (_, s) = l.get("/api/v1/scheduler").await;
    let npu = s["devices"].as_array().unwrap().iter().find(|d| d["id"] == "npu0").unwrap().clone();
    assert_eq!(npu["models"], json!({FLM_B: 0}), "{npu}");
    let evicted = s["decisions"].as_array().unwrap().iter().any(|d| d["decision"] == "evict" && d["model"] == FLM_A);
    assert!(evicted, "{s}");

    // Refusals.
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": FLM_A, "flm_args": "--host 0.0.0.0"})).await;
    assert_eq!(
        (s, e["error"]["param"].as_str(), e["error"]["code"].as_str()),
        (400, Some("flm_args"), Some("invalid_flm_args")),
        "{e}"
    );
    assert!(e["error"]["message"].as_str().unwrap().contains("not allowed: --host"), "{e}");
    drop(l);
    let mut env = env.to_vec();
    env.push(("FLM_STANDIN_FAIL_VALIDATE", "1"));
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &env).await;
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": FLM_A})).await;
    assert_eq!(s, 500, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("FLM NPU validation failed") && msg.contains("driver_install"), "{msg}");
}

/// Speculative decoding, on real llama-server: SmolLM2 drafting for itself (the only pair of
/// one vocabulary the provisioned packages ship) loads with `-md`, counts the draft in its
/// estimate and answers with drafted tokens; Gemma as SmolLM2's draft is refused before
/// anything changes, naming both models; an unknown draft is a 400 naming `draft_model`.
#[tokio::test]
async fn real_llama_server_a_draft_model_drafts_and_a_mismatched_vocabulary_is_refused_naming_both() {
    let l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let plain = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
    let pid = plain["pid"].clone();

    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "draft_model": GEMMA})).await;
    assert_eq!(
        (s, e["error"]["param"].as_str(), e["error"]["code"].as_str()),
        (400, Some("draft_model"), Some("invalid_draft_model")),
        "{e}"
    );
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(SMOL) && msg.contains(GEMMA) && msg.contains("differ"), "{msg}");
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "draft_model": "user.Nope"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("draft_model")), "{e}");
    assert_eq!(entry(&l.get("/api/v1/health").await.1, SMOL)["pid"], pid, "a refused draft touches nothing");

    let (code, out, err) = l.cli(&["load", SMOL, "--draft-model", SMOL]).await;
    assert_eq!(code, 0, "{out}{err}");
    let drafted = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
    let command = strs(&drafted["command"]).join(" ");
    assert!(command.contains(" -md ") && command.contains("-ngld 0"), "{command}");
    assert_eq!(drafted["env"], json!({"LLAMA_ARG_SPEC_TYPE": "draft-simple"}), "{drafted}");
    let (with, without) = (drafted["memory_estimate"].as_u64().unwrap(), plain["memory_estimate"].as_u64().unwrap());
    assert!(with > without + (50 << 20), "the draft's weights and KV cache are counted: {with} vs {without}");
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Count from one to ten."}],
                      "max_tokens": 32, "temperature": 0});
    let (s, c) = l.post("/api/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{c}");
    assert!(!c["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{c}");
    // SmolLM2 drafting for itself: every drafted token is accepted.
    let t = &c["timings"];
    assert!(
        t["draft_n"].as_u64().unwrap_or(0) > 0 && t["draft_n_accepted"] == t["draft_n"],
        "llama-server drafted: {t}"
    );
}

/// Ollama's NDJSON, on real llama-server: a streamed chat that waits for its model is answered
/// at once with lines that carry no text and say where it is (`"lemonade_status": "loading 0
/// s"`), then its tokens as any other stream; the official `ollama` library reads such streams
/// (chat and generate) as usual.
#[tokio::test]
async fn real_llama_server_an_ollama_stream_that_waits_says_where_it_is_and_the_ollama_client_reads_it() {
    let l = Lemonade::start(bin(), &[]).await;
    let body = json!({"model": GEMMA, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}});
    let r = l.http.post(l.url("/api/chat")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines: Vec<Value> = r.text().await.unwrap().lines().map(|s| serde_json::from_str(s).unwrap()).collect();
    assert_eq!(lines[0]["lemonade_status"], "loading 0 s", "{lines:?}");
    assert_eq!((lines[0]["message"]["content"].as_str(), lines[0]["done"].as_bool()), (Some(""), Some(false)));
    let text: String = lines.iter().filter_map(|v| v["message"]["content"].as_str()).collect();
    assert!(!text.is_empty() && lines.last().unwrap()["done"] == true, "{lines:?}");
    assert_eq!(l.post("/api/v1/unload", &json!({})).await.0, 200);
    py_checks("ollama_waiting_client.py", &[&l.url(""), GEMMA]).await;
}

/// Per-model scheduling options, on real llama-server: `max_concurrent` saved for a model
/// holds it to one request at a time (the second waits) without touching other models, and
/// changing it never restarts the backend; `priority` is saved beside it; bad values are 400s
/// naming them.
#[tokio::test]
async fn real_llama_server_per_model_max_concurrent_and_priority_are_saved_and_applied_without_a_restart() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post(&format!("/api/v1/models/{SMOL}/options"), &json!({"max_concurrent": 1, "priority": 5})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((v["saved"]["max_concurrent"].clone(), v["saved"]["priority"].clone()), (json!(1), json!(5)), "{v}");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let pid = entry(&l.get("/api/v1/health").await.1, SMOL)["pid"].clone();
    let (_, st) = l.get("/api/v1/scheduler").await;
    let m = st["models"].as_array().unwrap().iter().find(|m| m["model_name"] == SMOL).unwrap().clone();
    assert_eq!(m["max_concurrent"], 1, "{m}");
    let a = stream(&l, SMOL, 200).await;
    let (http, url) = (l.http.clone(), l.url("/api/v1/chat/completions"));
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let second = tokio::spawn(async move { http.post(url).json(&body).send().await.unwrap().status().as_u16() });
    let seen = wait_for(Duration::from_secs(10), || async {
        let e = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
        (e["in_flight"] == 1 && e["queued"] == 1).then_some(())
    })
    .await;
    assert!(seen.is_some(), "one at a time: {}", l.get("/api/v1/health").await.1);
    assert!(a.text().await.unwrap().contains("[DONE]"));
    assert_eq!(second.await.unwrap(), 200);
    // A load that raises it applies at once, on the same backend.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL, "max_concurrent": 3})).await.0, 200);
    let e = entry(&l.get("/api/v1/health").await.1, SMOL).clone();
    assert_eq!(e["pid"], pid, "no restart: {e}");
    let (_, st) = l.get("/api/v1/scheduler").await;
    let m = st["models"].as_array().unwrap().iter().find(|m| m["model_name"] == SMOL).unwrap().clone();
    assert_eq!(m["max_concurrent"], 3, "{m}");
    for (bad, param) in [(json!({"max_concurrent": 0}), "max_concurrent"), (json!({"priority": 11}), "priority")] {
        let mut body = bad.clone();
        body["model_name"] = json!(SMOL);
        let (s, e) = l.post("/api/v1/load", &body).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{bad}: {e}");
        let (s, e) = l.post(&format!("/api/v1/models/{SMOL}/options"), &bad).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{bad}: {e}");
    }
}
