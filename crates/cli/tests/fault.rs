//! Scheduling rules and faults, through the real `lemonade` binary with the fake backend
//! (tests/src/bin/fake-llama-server.rs) for deterministic timing and failures.
//!
//! These rules also run against real llama-server (lifecycle.rs, e2e.rs): LRU eviction and
//! per-type limits `3 2 1` with real models, draining a busy model before eviction, an unload
//! that waits for a stream and then a waiting request that reloads, a failed start's exit status
//! and log tail (a corrupt GGUF), an unload during a load killing the starting process, a start
//! past `--load-timeout` (frozen with SIGSTOP), a missing file evicting nothing, a killed backend
//! reloading, a crash loop refused with `Retry-After`, the idle timeout, the watchdog. Only the
//! fake can show these: evict-all-and-retry ending in success (real llama-server cannot fail once
//! and then succeed), a backend that ignores SIGTERM, the back-off's growth and reset (minutes of
//! real crashes), the NPU exclusion (no NPU here), and a stream without `[DONE]`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

async fn start(models: &[(&str, Option<u32>, Value)], args: &[&str]) -> Lemonade {
    let fake = fake_llama_server();
    let fake = fake.to_str().unwrap().to_string();
    Lemonade::start_in(bin(), fake_sandbox(models), args, &[("LEMONADE_LLAMACPP_CPU_BIN", &fake)]).await
}

fn x(name: &str) -> String {
    format!("extra.{name}")
}

async fn state(l: &Lemonade, model: &str) -> Value {
    let (_, v) = l.get("/v1/admin/models").await;
    v["models"].as_array().unwrap().iter().find(|m| m["name"] == model).cloned().unwrap_or(Value::Null)
}

/// Waits (at most 10 s) until `model`'s admin state is `want`; returns its admin row.
async fn until_state(l: &Lemonade, model: &str, want: &str) -> Value {
    let row = wait_for(Duration::from_secs(10), || async {
        let row = state(l, model).await;
        (row["runtime_state"] == want).then_some(row)
    })
    .await;
    match row {
        Some(row) => row,
        None => panic!("{model} never reached {want}: {}", state(l, model).await),
    }
}

/// Sends a POST in the background; the task answers its status and JSON body.
fn spawn_post(l: &Lemonade, path: &str, body: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let (http, url) = (l.http.clone(), l.url(path));
    tokio::spawn(async move {
        let r = http.post(url).json(&body).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// Reads a whole SSE stream; returns its text.
async fn read_stream(r: reqwest::Response) -> String {
    read_rest(Box::pin(r.bytes_stream())).await
}

async fn slow_stream(l: &Lemonade, model: &str) -> reqwest::Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": true});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r
}

const TOKEN_MS: u64 = 50;
const TOKENS: u64 = 30;
const SLOW: fn() -> Value = || json!({"token_delay_ms": TOKEN_MS, "tokens": TOKENS});

/// Reads a stream up to its first chunk; returns the rest of the stream.
async fn first_chunk(r: reqwest::Response) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let mut s = Box::pin(r.bytes_stream());
    let first = s.next().await.expect("a first chunk").unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tok0"), "{first:?}");
    s
}

async fn read_rest(mut s: impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin) -> String {
    let mut body = Vec::new();
    while let Some(c) = s.next().await {
        body.extend_from_slice(&c.unwrap());
    }
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn lru_order_with_three_models_two_slots_and_per_type_independence() {
    let l = start(
        &[("a", None, json!({})), ("b", None, json!({})), ("c", None, json!({})), ("e", Some(1), json!({}))],
        &["--max-loaded-models", "2"],
    )
    .await;
    for m in ["a", "b"] {
        assert_eq!(l.chat(&x(m)).await.0, 200);
    }
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": x("e"), "input": "q"})).await.0, 200);
    assert_eq!(l.chat(&x("a")).await.0, 200, "A is now more recent than B");
    assert_eq!(l.chat(&x("c")).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(
        loaded_names(&h),
        [x("a"), x("e"), x("c")],
        "B, the least recently used LLM, was evicted; the embedding model stayed"
    );
}

#[tokio::test]
async fn a_busy_model_is_not_evicted_until_its_stream_ends() {
    let l = start(&[("a", None, SLOW()), ("b", None, json!({}))], &[]).await;
    // B is sent once A's first token arrived: A has TOKENS - 1 sleeps of TOKEN_MS to go.
    let rest = first_chunk(slow_stream(&l, &x("a")).await).await;
    let b_sent = Instant::now();
    let reader = tokio::spawn(async move { read_rest(Box::pin(rest)).await });
    let (s, _) = l.chat(&x("b")).await;
    let b_waited = b_sent.elapsed();
    assert_eq!(s, 200);
    let text = reader.await.unwrap();
    assert!(
        text.contains(&format!("tok{}", TOKENS - 1)) && text.trim_end().ends_with("data: [DONE]"),
        "A's stream completed: {text}"
    );
    // A's stream cannot end before its remaining sleeps; B, which needed A's slot, waited for it.
    let floor = Duration::from_millis(TOKEN_MS * (TOKENS - 2));
    assert!(b_waited >= floor, "B was served after {b_waited:?}, before A's stream could end ({floor:?})");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [x("b")]);
}

#[tokio::test]
async fn graceful_unload_waits_for_the_stream_and_admits_nothing_new() {
    let l = start(&[("a", None, SLOW())], &[]).await;
    let rest = first_chunk(slow_stream(&l, &x("a")).await).await;
    let unload_sent = Instant::now();
    let reader = tokio::spawn(async move { read_rest(Box::pin(rest)).await });
    let unload = {
        let http = l.http.clone();
        let url = l.url("/api/v1/unload");
        let body = json!({"model_name": x("a")});
        tokio::spawn(async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            (Instant::now(), r.status().as_u16())
        })
    };
    // The stream has (TOKENS - 1) × TOKEN_MS = 1.45 s to go: the state is read well inside it.
    until_state(&l, &x("a"), "unloading").await; // the model is unloading while the stream runs
    assert!(!reader.is_finished(), "the stream still runs while the model is unloading");
    let (s, e) = l.post(&format!("/v1/admin/models/{}/load", x("a")), &json!({})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("conflict")), "admin load while unloading: {e}");
    let (s, e) = l.chat(&x("a")).await;
    assert_eq!(s, 200, "an inference request waits for the unload, then loads the model again: {e}");
    let text = reader.await.unwrap();
    assert!(
        text.contains(&format!("tok{}", TOKENS - 1)) && text.trim_end().ends_with("data: [DONE]"),
        "the stream finished normally: {text}"
    );
    let (unloaded_at, status) = unload.await.unwrap();
    assert_eq!(status, 200);
    // The unload cannot have been answered before the stream's remaining sleeps were over.
    let floor = Duration::from_millis(TOKEN_MS * (TOKENS - 2));
    assert!(unloaded_at - unload_sent >= floor, "the unload answered before the stream could end");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [x("a")], "loaded again by the request that waited");
}

#[tokio::test]
async fn failed_load_evicts_everything_and_retries_once() {
    let marker = tempfile::tempdir().unwrap();
    let marker = marker.path().join("failed-once");
    let l =
        // The fake writes its marker outside the folders a sandboxed backend may write.
        start(&[("x", None, json!({"fail_first_start": marker.to_str().unwrap()})), ("e", Some(1), json!({}))], &["--sandbox", "off"])
            .await;
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": x("e"), "input": "q"})).await.0, 200);
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": x("x")})).await;
    assert_eq!(s, 200, "the retry succeeded: {v}");
    assert!(marker.exists(), "the first start did fail");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [x("x")], "every other model was evicted before the retry");
}

#[tokio::test]
async fn a_missing_file_fails_without_evicting_anything() {
    let l = start(&[("gone", None, json!({})), ("e", Some(1), json!({}))], &[]).await;
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": x("e"), "input": "q"})).await.0, 200);
    std::fs::remove_file(l.sandbox.extra().join("gone.gguf")).unwrap();
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": x("gone")})).await;
    assert_eq!(s, 500, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("Model file not found"), "{e}");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [x("e")], "no evict-all for a missing file");
}

#[tokio::test]
async fn a_backend_that_refuses_to_start_leaves_the_model_failed_with_its_log() {
    let l = start(&[("r", None, json!({"refuse_start": true, "exit_code": 3}))], &[]).await;
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": x("r")})).await;
    assert_eq!(s, 500);
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("exit code 3") && msg.contains("refuse_start"), "{msg}");
    let row = state(&l, &x("r")).await;
    assert_eq!(row["runtime_state"], "failed");
    assert!(row["last_error"].as_str().unwrap().contains("exit code 3"), "{row}");
    let (s, e) = l.chat(&x("r")).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (500, Some("model_load_error")),
        "a request tries again and fails the same way"
    );
}

#[tokio::test]
async fn crash_mid_stream_ends_with_an_error_frame_and_the_model_reloads() {
    let l = start(&[("c", None, json!({"token_delay_ms": 20, "tokens": 10, "crash_after_tokens": 3}))], &[]).await;
    let text = read_stream(slow_stream(&l, &x("c")).await).await;
    let last = sse_data(&text).pop().unwrap();
    let v: Value = serde_json::from_str(&last).unwrap_or_else(|_| panic!("{text}"));
    assert_eq!(v["error"]["type"], "streaming_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("exit code 1"), "{v}");
    until_state(&l, &x("c"), "failed").await;
    assert_eq!(l.chat(&x("c")).await.0, 200, "the next request reloads it");
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let model = x("c");
    for line in [
        format!(r#"lemonade_backend_crashes_total{{model="{model}"}} 1"#),
        format!(r#"lemonade_backend_restarts_total{{model="{model}"}} 1"#),
        format!(r#"lemonade_model_load_seconds_count{{model="{model}"}} 2"#),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in:\n{metrics}");
    }
}

#[tokio::test]
async fn unloading_a_loading_model_cancels_the_load() {
    let l = start(&[("slow", None, json!({"load_delay_ms": 20000}))], &[]).await;
    let waiting = spawn_post(&l, "/api/v1/chat/completions", json!({"model": x("slow"), "messages": []}));
    until_state(&l, &x("slow"), "loading").await;
    // `loading` is published before the process is spawned: wait for the child itself.
    let children = wait_for(Duration::from_secs(5), || async {
        let c = child_pids(l.pid());
        (c.len() == 1).then_some(c)
    })
    .await;
    let children = children.expect("the backend is starting");
    let t = Instant::now();
    let (s, _) = l.post("/api/v1/unload", &json!({"model_name": x("slow")})).await;
    assert_eq!(s, 200);
    assert!(t.elapsed() < Duration::from_secs(10), "the unload did not wait for the 20 s load");
    let (s, e) = waiting.await.unwrap();
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("model_unloading")), "{e}");
    assert!(children.iter().all(|p| !alive(*p)), "the starting backend was stopped");
    assert_eq!(state(&l, &x("slow")).await["runtime_state"], "unloaded");
}

#[tokio::test]
async fn a_backend_that_ignores_sigterm_is_killed() {
    let l = start(&[("stubborn", None, json!({"ignore_sigterm": true}))], &["--stop-timeout", "1"]).await;
    assert_eq!(l.chat(&x("stubborn")).await.0, 200);
    let children = child_pids(l.pid());
    let t = Instant::now();
    assert_eq!(l.post_raw("/api/v1/unload", "").await.0, 200);
    // SIGTERM first, the 1 s grace waited out, then SIGKILL: a kill at once would be faster.
    assert!(t.elapsed() >= Duration::from_millis(900), "the grace period was not waited: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(4));
    assert!(l.log().contains("backend ignored SIGTERM; sending SIGKILL"), "{}", l.log());
    assert!(children.iter().all(|p| !alive(*p)), "SIGKILL after the grace period");
}

/// A backend killed while it loads fails that start at once with its exit status (not after
/// the load timeout); the failure policy tries once more, and a second kill fails the load,
/// naming the signal. The next request loads the model again.
#[tokio::test]
async fn a_backend_killed_during_its_load_fails_the_start_naming_its_exit_and_the_next_request_reloads() {
    let l = start(&[("slow", None, json!({"load_delay_ms": 3000}))], &["--load-timeout", "60"]).await;
    let body = json!({"model": x("slow"), "messages": [{"role": "user", "content": "hi"}]});
    let chat = spawn_post(&l, "/api/v1/chat/completions", body);
    let first = signal_next_backend(l.pid(), &[], libc::SIGKILL).await.expect("the backend was spawned");
    let second = signal_next_backend(l.pid(), &[first], libc::SIGKILL).await.expect("the start was retried once");
    let (s, e) = chat.await.unwrap();
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((s, e["error"]["code"].as_str()), (500, Some("model_load_error")), "{e}");
    assert!(msg.contains("exited (killed by signal 9) before it was ready"), "{msg}");
    let row = until_state(&l, &x("slow"), "failed").await;
    assert!(row["last_error"].as_str().unwrap_or_default().contains("killed by signal 9"), "{row}");
    assert!(!alive(first) && !alive(second));
    assert_eq!(l.chat(&x("slow")).await.0, 200, "the next request loads it again");
}

#[tokio::test]
async fn a_wedged_backend_is_detected_by_the_watchdog() {
    let l = start(&[("w", None, json!({}))], &["--watchdog-interval-ms", "200"]).await;
    assert_eq!(l.chat(&x("w")).await.0, 200);
    let child = child_pids(l.pid())[0];
    unsafe {
        libc::kill(child as i32, libc::SIGSTOP);
    }
    let stuck = spawn_post(&l, "/api/v1/chat/completions", json!({"model": x("w"), "messages": []}));
    let sent = wait_for(Duration::from_secs(10), || async {
        let (_, h) = l.get("/api/v1/health").await;
        (h["all_models_loaded"][0]["in_flight"] == 1).then_some(())
    })
    .await;
    assert!(sent.is_some(), "the request reached the stopped backend");
    let failed = until_state(&l, &x("w"), "failed").await; // the wedged backend was noticed
    assert!(failed["last_error"].as_str().unwrap().contains("stopped answering"), "{failed}");
    assert!(!alive(child), "the wedged process was killed");
    let (s, e) = stuck.await.unwrap();
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(s, 502, "{e}");
    assert!(msg.contains("stopped answering its health checks during the request and was killed"), "{msg}");
    assert_eq!(l.chat(&x("w")).await.0, 200, "and the model reloads");
}

#[tokio::test]
async fn npu_models_exclude_each_other_whatever_their_type_and_the_slots() {
    let sandbox = fake_sandbox(&[("gpu", None, json!({}))]);
    add_npu_model(&sandbox, "npu-llm", &[]);
    add_npu_model(&sandbox, "npu-emb", &["embeddings"]);
    let fake = fake_llama_server();
    let fake = fake.to_str().unwrap();
    let env = [
        ("LEMONADE_LLAMACPP_CPU_BIN", fake),
        ("LEMONADE_RYZENAISERVER_NPU_BIN", fake),
        ("LEMONADE_DISABLE_MODEL_FILTERING", "1"),
    ];
    let l = Lemonade::start_in(bin(), sandbox, &["--max-loaded-models", "-1"], &env).await;
    for m in ["user.npu-llm", &x("gpu")] {
        let (s, v) = l.post("/api/v1/load", &json!({"model_name": m})).await;
        assert_eq!(s, 200, "{m}: {v}");
    }
    let (_, h) = l.get("/api/v1/health").await;
    let devices: Vec<(String, String)> = h["all_models_loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["model_name"].as_str().unwrap().into(), m["device"].as_str().unwrap().into()))
        .collect();
    assert_eq!(devices, [("user.npu-llm".to_string(), "npu".to_string()), (x("gpu"), "gpu".to_string())]);
    // Unlimited slots, another type: the NPU model still has to go.
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": "user.npu-emb", "input": "q"})).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(
        loaded_names(&h),
        [x("gpu"), "user.npu-emb".to_string()],
        "the first NPU model was evicted, the GPU one stayed"
    );
}

#[tokio::test]
async fn per_type_slot_limits_from_the_command_line() {
    let l = start(&[], &["--max-loaded-models", "3", "2", "1"]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["max_models"], json!({"llm": 3, "embedding": 2, "reranking": 1, "audio": 1, "image": 1, "tts": 1}));
    let l = start(&[], &["--max-loaded-models", "-1"]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["max_models"]["llm"], -1);
    let out =
        std::process::Command::new(bin()).args(["serve", "--port", "0", "--max-loaded-models", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be -1 (unlimited) or at least 1"));
}

#[tokio::test]
async fn load_with_other_settings_restarts_in_place_and_same_settings_do_nothing() {
    let l = start(&[("a", None, json!({}))], &[]).await;
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": x("a"), "ctx_size": 1024})).await.0, 200);
    let first = child_pids(l.pid());
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": x("a"), "ctx_size": 1024})).await.0, 200);
    assert_eq!(child_pids(l.pid()), first, "same settings: same process");
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": x("a"), "ctx_size": 2048})).await.0, 200);
    let second = child_pids(l.pid());
    assert_eq!(second.len(), 1, "one slot, one process");
    assert_ne!(second, first, "other settings: restarted");
    assert!(first.iter().all(|p| !alive(*p)));
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["recipe_options"]["ctx_size"], 2048);
}

/// Streams from `model` (which crashes after its first token) and waits until it is `failed`.
async fn crash(l: &Lemonade, model: &str) {
    let text = read_stream(slow_stream(l, model).await).await;
    assert!(text.contains("streaming_error"), "{text}");
    until_state(l, model, "failed").await;
}

/// A chat that is refused with the back-off: its Retry-After (s) and the pause in its message.
async fn backed_off(l: &Lemonade, model: &str) -> (u64, f64) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let retry_after: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_failed", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("keeps failing") && msg.contains("exit code 1"), "{msg}");
    let secs: f64 = msg.split("loads again in ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    (retry_after, secs)
}

/// Chats until the back-off is over (bounded); returns when the model served again.
async fn until_served(l: &Lemonade, model: &str) -> Instant {
    wait_for(Duration::from_secs(10), || async { (l.chat(model).await.0 == 200).then(Instant::now) })
        .await
        .expect("served again after the back-off")
}

#[tokio::test]
async fn repeated_crashes_back_off_with_a_growing_pause_that_resets_after_stable_running() {
    const RESET: Duration = Duration::from_secs(3);
    let l = start(
        &[("c", None, json!({"crash_after_tokens": 1}))],
        &["--crash-backoff-ms", "1000", "--crash-reset-ms", &RESET.as_millis().to_string()],
    )
    .await;
    let c = x("c");
    crash(&l, &c).await;
    assert_eq!(l.chat(&c).await.0, 200, "the first crash reloads at once");
    crash(&l, &c).await;
    let (after, secs) = backed_off(&l, &c).await;
    assert!(after == 1 && secs > 0.0 && secs <= 1.0, "second crash: a 1 s pause, {after} / {secs}");
    until_served(&l, &c).await;
    crash(&l, &c).await;
    let (after, secs) = backed_off(&l, &c).await;
    assert!(after == 2 && secs > 1.0 && secs <= 2.0, "third crash: the pause doubled, {after} / {secs}");
    let loaded = until_served(&l, &c).await;
    // The rule is about time itself: the backend must run RESET before a crash stops counting.
    tokio::time::sleep_until((loaded + RESET + Duration::from_millis(200)).into()).await;
    crash(&l, &c).await;
    assert_eq!(l.chat(&c).await.0, 200, "after stable running the count started again: no pause");
}

#[tokio::test]
async fn a_load_that_exceeds_the_load_timeout_fails_and_kills_the_backend() {
    let l = start(&[("slow", None, json!({"load_delay_ms": 60_000}))], &["--load-timeout", "1"]).await;
    let t = Instant::now();
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": x("slow")})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (500, Some("model_load_error")), "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("was not ready after 1 s") && msg.contains("loading model"), "the log tail: {msg}");
    assert!(t.elapsed() < Duration::from_secs(30), "two 1 s attempts, not the 60 s load");
    assert!(child_pids(l.pid()).is_empty(), "the starting backend was stopped");
    assert_eq!(state(&l, &x("slow")).await["runtime_state"], "failed");
}

#[tokio::test]
async fn a_client_that_hangs_up_while_its_model_loads_leaves_nothing_held() {
    let l = start(&[("slow", None, json!({"load_delay_ms": 4000})), ("b", None, json!({}))], &[]).await;
    let body = json!({"model": x("slow"), "messages": [{"role": "user", "content": "hi"}]});
    let req = tokio::spawn({
        let (http, url) = (l.http.clone(), l.url("/api/v1/chat/completions"));
        async move { http.post(url).json(&body).send().await }
    });
    let loading = until_state(&l, &x("slow"), "loading").await;
    assert_eq!(loading["queue_depth"], 1, "the request waits for the load: {loading}");
    req.abort();
    assert!(req.await.unwrap_err().is_cancelled(), "the client hung up before an answer");
    // The hang-up cancels the wait while the model is still loading (the 4 s load has not
    // completed): the request leaves the queue at once, not when the load would grant it.
    let cancelled = wait_for(Duration::from_secs(3), || async {
        let row = state(&l, &x("slow")).await;
        (row["queue_depth"] == 0).then_some(row)
    })
    .await
    .expect("the abandoned request left the queue");
    assert_eq!(cancelled["runtime_state"], "loading", "cancelled during the load, not after it: {cancelled}");
    // The load carries on; nobody holds the model once it is loaded, so it gives way at once.
    let loaded = until_state(&l, &x("slow"), "loaded").await;
    assert_eq!(loaded["inflight_requests"], 0, "{loaded}");
    let t = Instant::now();
    assert_eq!(l.chat(&x("b")).await.0, 200, "another model takes the only slot");
    assert!(t.elapsed() < Duration::from_secs(5), "no wait for a request that will never finish");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [x("b")]);
}

#[tokio::test]
async fn a_stream_without_done_gets_one_and_stats_come_from_the_tail_of_a_long_stream() {
    // 300 tokens of 256 bytes: over 64 KiB, more than the tail the proxy keeps (16 to 32 KiB).
    let l = start(&[("long", None, json!({"omit_done": true, "tokens": 300, "token_bytes": 256}))], &[]).await;
    let text = read_stream(slow_stream(&l, &x("long")).await).await;
    assert!(text.len() > 64 * 1024, "{} bytes", text.len());
    assert!(text.contains("tok299"), "every token arrived");
    assert_eq!(text.matches("data: [DONE]").count(), 1, "exactly one [DONE]");
    assert!(text.trim_end().ends_with("data: [DONE]"), "and it comes last");
    let (_, st) = l.get("/api/v1/stats").await;
    assert_eq!((st["output_tokens"].as_u64(), st["input_tokens"].as_u64()), (Some(300), Some(3)), "{st}");
}

#[tokio::test]
async fn no_auto_load_answers_loading_unloading_and_failed_with_their_codes() {
    let l = start(
        &[
            ("slow", None, json!({"load_delay_ms": 3000})),
            ("a", None, SLOW()),
            ("r", None, json!({"refuse_start": true})),
        ],
        &["--no-auto-load", "--max-loaded-models", "-1"],
    )
    .await;
    let code = |e: &Value| e["error"]["code"].as_str().map(str::to_string);
    // Loading.
    let load = spawn_post(&l, "/api/v1/load", json!({"model_name": x("slow")}));
    until_state(&l, &x("slow"), "loading").await;
    let (s, e) = l.chat(&x("slow")).await;
    assert_eq!((s, code(&e).as_deref()), (409, Some("model_loading")), "{e}");
    assert_eq!(load.await.unwrap().0, 200);
    // Unloading: a stream holds the model while it unloads.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": x("a")})).await.0, 200);
    let rest = first_chunk(slow_stream(&l, &x("a")).await).await;
    let reader = tokio::spawn(async move { read_rest(Box::pin(rest)).await });
    let unload = spawn_post(&l, "/api/v1/unload", json!({"model_name": x("a")}));
    until_state(&l, &x("a"), "unloading").await;
    let (s, e) = l.chat(&x("a")).await;
    assert_eq!((s, code(&e).as_deref()), (409, Some("model_unloading")), "{e}");
    assert!(reader.await.unwrap().trim_end().ends_with("data: [DONE]"));
    assert_eq!(unload.await.unwrap().0, 200);
    // Failed.
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": x("r")})).await;
    assert_eq!(s, 500);
    let (s, e) = l.chat(&x("r")).await;
    assert_eq!((s, code(&e).as_deref()), (503, Some("model_failed")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("refuse_start"), "{e}");
}

#[tokio::test]
async fn shutdown_with_a_stream_a_pull_and_an_install_open_ends_each_and_leaves_resumable_state() {
    use test_support::hub::{HubDouble, Knobs};
    // One double plays the Hub and the release site, slowly, so both downloads are in flight.
    let root = tempfile::tempdir().unwrap();
    let big = root.path().join("org/big-GGUF");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(big.join("big-Q4_0.gguf"), (0..8u32 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
    let (_, sha) = test_support::release::write_archive(root.path(), "b9999", 0);
    let double =
        HubDouble::start(root.path(), Knobs { chunk_delay: Some(Duration::from_millis(20)), ..Default::default() })
            .await;
    let sandbox = fake_sandbox(&[("s", None, json!({"token_delay_ms": 50, "tokens": 1000}))]);
    test_support::release::pin(&sandbox.cache(), "b9999", Some(&sha));
    let fake = fake_llama_server();
    let env = [
        ("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()),
        ("HF_ENDPOINT", double.url.as_str()),
        ("LEMONADE_RELEASES_URL", double.url.as_str()),
    ];
    let mut l = Lemonade::start_in(bin(), sandbox, &[], &env).await;
    let chat = first_chunk(slow_stream(&l, &x("s")).await).await;
    let backend = child_pids(l.pid());
    let open = |path: &str, body: Value| {
        let (http, url) = (l.http.clone(), l.url(path));
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let mut s = Box::pin(r.bytes_stream());
            let first = String::from_utf8_lossy(&s.next().await.unwrap().unwrap()).into_owned();
            assert!(first.starts_with("event: progress"), "{first}");
            s
        }
    };
    let pull = open(
        "/api/v1/pull",
        json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp", "stream": true}),
    )
    .await;
    // Wait until the pull has bytes on disk, so there is a partial file to keep (its first
    // event is sent before any byte arrives; signalling then raced the first chunk).
    let mut pull = pull;
    let moved = |t: &str| t.split("\"bytes_downloaded\":").skip(1).any(|r| !r.starts_with('0'));
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while !moved(&seen) {
            seen.push_str(&String::from_utf8_lossy(&pull.next().await.unwrap().unwrap()));
        }
    })
    .await
    .expect("the pull made progress");
    let install = open("/api/v1/install", json!({"recipe": "llamacpp", "backend": "cpu", "stream": true})).await;

    l.signal(libc::SIGTERM);
    let ends = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(read_rest(Box::pin(chat)), read_rest(pull), read_rest(install))
    })
    .await
    .expect("every open response ended");
    let (chat, pull, install) = ends;
    assert!(chat.contains("streaming_error") && !chat.contains("tok999"), "the stream was cut, saying so: {chat}");
    for (what, text) in [("pull", &pull), ("install", &install)] {
        assert!(!text.contains("event: complete"), "{what}: {text}");
        assert!(text.trim_end().ends_with("the next request resumes it\"}"), "{what} ends saying why: {text}");
    }
    let status = l.wait_exit(Duration::from_secs(20)).expect("lemonade exited");
    assert!(status.success(), "a clean exit: {status:?}");
    assert!(backend.iter().all(|p| !alive(*p)), "no backend outlives the server");
    let partial = |dir: PathBuf, suffix: &str| {
        std::fs::read_dir(dir)
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with(suffix) && e.metadata().is_ok_and(|m| m.len() > 0))
    };
    assert!(
        partial(l.sandbox.hf_cache().join("models--org--big-GGUF/blobs"), ".incomplete"),
        "the pull's partial file is kept"
    );

    // Restarted on the same files: both finish, the pull resuming where it stopped.
    double.set_knobs(Knobs::default());
    let sandbox = l.kill_keeping_sandbox();
    let l = Lemonade::start_in(bin(), sandbox, &[], &env).await;
    assert_eq!(l.post("/api/v1/pull", &json!({"model": "user.Big"})).await.0, 200);
    let resumed = double.log().iter().any(|r| r.path.ends_with("big-Q4_0.gguf") && r.range.is_some());
    assert!(resumed, "the pull resumed");
    assert_eq!(l.get("/api/v1/models/user.Big").await.1["downloaded"], true);
    let (s, v) = l.post("/api/v1/install", &json!({"recipe": "llamacpp", "backend": "cpu"})).await;
    assert_eq!((s, v["version"].as_str()), (200, Some("b9999")), "{v}");
}

#[tokio::test]
async fn an_idle_model_is_unloaded_after_the_idle_timeout_and_a_busy_one_is_not() {
    let l = start(&[("a", None, json!({"token_delay_ms": 100, "tokens": 25}))], &["--idle-timeout", "1"]).await;
    // A 2.5 s stream: longer than the timeout, and the model stays loaded while it runs.
    let text = read_stream(slow_stream(&l, &x("a")).await).await;
    let ended = Instant::now();
    assert!(text.contains("tok24") && text.trim_end().ends_with("data: [DONE]"), "not cut while busy: {text}");
    let backend = child_pids(l.pid());
    assert_eq!(backend.len(), 1, "still loaded when the stream ends");
    let unloaded = wait_for(Duration::from_secs(10), || async {
        let row = state(&l, &x("a")).await;
        (row["runtime_state"] == "unloaded").then(Instant::now)
    })
    .await
    .expect("unloaded once idle");
    assert!(unloaded - ended >= Duration::from_millis(900), "not before a second of idleness: {:?}", unloaded - ended);
    assert!(!alive(backend[0]), "its backend stopped");
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
    assert_eq!(l.chat(&x("a")).await.0, 200, "the next request loads it again");
}

/// A streamed request whose model fails to load after it has waited past the patience gets
/// its 200 at once (with `: loading` comments), then the failure as a `data: {"error": …}`
/// event and `[DONE]`; a failure within the patience keeps its status.
#[tokio::test]
async fn a_stream_that_waited_gets_its_load_failure_as_an_error_event() {
    let slow_fail = json!({"load_delay_ms": 700, "refuse_start": true});
    let l = start(&[("slowfail", None, slow_fail), ("fastfail", None, json!({"refuse_start": true}))], &[]).await;
    let body = |m: &str| json!({"model": x(m), "messages": [{"role": "user", "content": "hi"}], "stream": true});
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body("slowfail")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = read_stream(r).await;
    assert!(text.starts_with(": loading 0 s\n\n"), "{text}");
    let event = text.lines().find_map(|l| l.strip_prefix("data: {")).map(|d| format!("{{{d}")).expect("an error event");
    let v: Value = serde_json::from_str(&event).unwrap();
    assert_eq!(v["error"]["code"], "model_load_error", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body("fastfail")).send().await.unwrap();
    assert_eq!(r.status(), 500, "a failure within the patience keeps its status");
}
