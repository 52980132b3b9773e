//! The prompt cache with real llama-server and SmolLM2: a conversation swapped out for Gemma
//! and back resumes with only its new tokens prefilled (llama-server's own `timings.prompt_n`
//! says how many it processed); a changed context size does not restore; a corrupt file is
//! discarded and the request still answers; the cache shows in health, the admin API and
//! /metrics, and `lemonade cleanup-cache --prompt-cache` empties it.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// A first turn of about 700 tokens.
fn first_turn() -> Vec<Value> {
    let facts: String = (0..60).map(|i| format!("Fact {i}: lemon tree number {i} grows in row {}. ", i % 7)).collect();
    vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": format!("Read these notes. {facts}Which row has the most trees?")}),
    ]
}

async fn chat(l: &Lemonade, model: &str, messages: &[Value]) -> Value {
    let body = json!({"model": model, "messages": messages, "max_tokens": 12, "temperature": 0});
    let (s, v) = l.post("/api/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    v
}

fn prompt_n(v: &Value) -> u64 {
    v["timings"]["prompt_n"].as_u64().unwrap_or_else(|| panic!("no timings.prompt_n in {v}"))
}

/// Turn one on SmolLM2, then Gemma (which takes the one LLM slot: SmolLM2 is saved and
/// stopped). Returns the conversation with the answer and a new question.
async fn converse_then_swap(l: &Lemonade) -> (Vec<Value>, u64) {
    let mut messages = first_turn();
    let v = chat(l, SMOL, &messages).await;
    let first = prompt_n(&v);
    assert!(first > 500, "the first turn prefills everything: {first}");
    messages.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "Answer in one word."}));
    chat(l, GEMMA, &[json!({"role": "user", "content": "Hi"})]).await;
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [GEMMA], "SmolLM2 was swapped out");
    (messages, first)
}

fn cache_files(l: &Lemonade) -> Vec<PathBuf> {
    let root = l.sandbox.cache().join("prompt-cache");
    let mut out = Vec::new();
    for d in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            if f.path().extension().is_some_and(|e| e == "bin") {
                out.push(f.path());
            }
        }
    }
    out
}

#[tokio::test]
async fn real_llama_server_a_swapped_out_conversation_resumes_with_only_its_new_tokens_prefilled() {
    let l = Lemonade::start(bin(), &[]).await;
    let (messages, first) = converse_then_swap(&l).await;
    // The save shows while SmolLM2 is not loaded: in the admin API and health's total.
    let (_, admin) = l.get("/v1/admin/models").await;
    let smol = admin["models"].as_array().unwrap().iter().find(|m| m["name"] == SMOL).unwrap().clone();
    assert!(smol["prompt_cache_files"].as_u64().unwrap() >= 1, "{smol}");
    let bytes = smol["prompt_cache_bytes"].as_u64().unwrap();
    assert!(bytes > 1_000_000, "{smol}");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["prompt_cache"]["bytes"].as_u64(), Some(bytes), "{h}");
    assert_eq!(h["prompt_cache"]["limit"].as_u64(), Some(4 << 30));
    assert_eq!(cache_files(&l).len() as u64, smol["prompt_cache_files"].as_u64().unwrap());

    let v = chat(&l, SMOL, &messages).await;
    let (again, cached) = (prompt_n(&v), v["timings"]["cache_n"].as_u64().unwrap_or(0));
    assert!(again <= 40, "only the new turn is prefilled after the swap: {again} of {first} ({v})");
    assert!(cached >= first, "the conversation came from the restored slot: cache_n {cached}");
    assert!(l.log().contains("prompt cache: restored a saved prompt"), "{}", l.log());
    let (_, h) = l.get("/api/v1/health").await;
    assert!(h["all_models_loaded"][0]["prompt_cache_files"].as_u64().unwrap() >= 1, "{h}");
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let restores = format!("lemonade_prompt_cache_restores_total{{model=\"{SMOL}\"}} 1");
    assert!(metrics.contains(&restores), "{metrics}");
    let tokens = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("lemonade_prompt_cache_restored_tokens_total{{model=\"{SMOL}\"}} ")))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(tokens >= first, "restored tokens counted: {tokens}");

    // A request that continues nothing saved is served as usual.
    let other = chat(&l, SMOL, &[json!({"role": "user", "content": "Name a colour."})]).await;
    assert!(prompt_n(&other) > 0);

    // cleanup-cache empties it (SmolLM2's next stop saves again, so unload first).
    assert_eq!(l.post("/api/v1/unload", &json!({})).await.0, 200);
    assert!(!cache_files(&l).is_empty());
    let (code, out, err) = l.cli(&["cleanup-cache", "--prompt-cache", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["files_removed"].as_u64().unwrap() >= 1 && v["bytes_freed"].as_u64().unwrap() > 0, "{v}");
    assert!(cache_files(&l).is_empty());
    assert_eq!(l.get("/api/v1/health").await.1["prompt_cache"]["files"], 0);
}

#[tokio::test]
async fn real_llama_server_a_changed_context_size_does_not_restore() {
    let l = Lemonade::start(bin(), &[]).await;
    let (messages, first) = converse_then_swap(&l).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 2048})).await;
    assert_eq!(s, 200, "{v}");
    let v = chat(&l, SMOL, &messages).await;
    assert!(prompt_n(&v) >= first, "a cache saved at another context size is not restored: {v}");
    assert!(!l.log().contains("prompt cache: restored"), "{}", l.log());
}

#[tokio::test]
async fn real_llama_server_a_corrupt_cache_file_is_discarded_and_the_request_still_answers() {
    let l = Lemonade::start(bin(), &[]).await;
    let (messages, first) = converse_then_swap(&l).await;
    let files = cache_files(&l);
    assert!(!files.is_empty());
    // Same size, one byte changed in the middle of the KV data: llama-server would abort on
    // some such files; lemonade must never hand it one.
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(f, bytes).unwrap();
    }
    let v = chat(&l, SMOL, &messages).await;
    assert!(prompt_n(&v) >= first, "nothing restored from a corrupt file: {v}");
    assert!(l.log().contains("saved prompt discarded"), "{}", l.log());
    assert!(files.iter().all(|f| !f.exists()), "the corrupt file is removed");
    // The backend is the one that answered, still up.
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL]);
}

#[tokio::test]
async fn real_llama_server_no_cache_with_prompt_cache_size_0() {
    let l = Lemonade::start(bin(), &["--prompt-cache-size", "0"]).await;
    let (messages, first) = converse_then_swap(&l).await;
    assert!(cache_files(&l).is_empty(), "nothing saved");
    let v = chat(&l, SMOL, &messages).await;
    assert!(prompt_n(&v) >= first);
    assert_eq!(l.get("/api/v1/health").await.1["prompt_cache"]["limit"], 0);
}
