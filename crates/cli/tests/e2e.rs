//! End-to-end tests: the real `lemonade` binary, real llama-server, real GGUF models
//! (provisioned by `cargo xtask setup`). The reranker is MiniLM with a random head: its tests
//! check plumbing only, never relevance.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn chat(model: &str, content: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

/// No path of this machine in `text`: neither the sandbox (caches, extra models dir) nor the
/// provisioned models the sandbox links to.
fn assert_no_local_paths(l: &Lemonade, text: &str) {
    let sandbox = l.sandbox.dir.path().display().to_string();
    assert!(!text.contains(&sandbox), "{sandbox} leaked: {text}");
    assert!(!text.contains(".cache/"), "a cache path leaked: {text}");
}

async fn stream_text(l: &Lemonade, path: &str, body: &Value) -> (u16, String, String) {
    let r = l.http.post(l.url(path)).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

#[tokio::test]
async fn chat_non_streaming_autoloads_and_records_stats() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, h) = l.get("/api/v1/health").await;
    assert_eq!(s, 200);
    assert_eq!(h["all_models_loaded"], json!([]));
    assert_eq!(h["model_loaded"], Value::Null);
    // Before any request: 200 with every figure 0 (as Lemonade), not a 404 that reads as
    // "route not registered".
    let (s, st) = l.get("/api/v1/stats").await;
    assert_eq!(s, 200, "{st}");
    assert_eq!((st["input_tokens"].as_u64(), st["output_tokens"].as_u64()), (Some(0), Some(0)), "{st}");
    assert_eq!(st["tokens_per_second"].as_f64(), Some(0.0), "{st}");

    let (s, v) = l.post("/api/v1/chat/completions", &chat(SMOL, "Which city is the capital of France?", 16)).await;
    assert_eq!(s, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.trim().is_empty(), "{v}");
    assert!(text.contains("Paris"), "SmolLM2 should know this: {text}");
    let completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion_tokens > 0 && completion_tokens <= 16);
    // The answer names the model the client asked for, never the GGUF's path.
    assert_eq!(v["model"], SMOL, "{v}");
    assert_no_local_paths(&l, &v.to_string());

    let (_, h) = l.get("/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL]);
    assert_eq!(h["model_loaded"], SMOL);
    let m = &h["all_models_loaded"][0];
    assert_eq!(m["type"], "llm");
    assert_eq!(m["recipe"], "llamacpp");
    assert_eq!(m["checkpoint"], "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1");
    assert_eq!(m["recipe_options"]["llamacpp_backend"], "cpu");
    assert!(m["backend_url"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    assert_eq!(h["max_models"]["llm"], 1);

    let (s, st) = l.get("/api/v0/stats").await;
    assert_eq!(s, 200);
    assert_eq!(st["output_tokens"].as_u64().unwrap(), completion_tokens);
    assert!(st["input_tokens"].as_u64().unwrap() > 0);
    assert!(st["tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(st["time_to_first_token"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn chat_streaming_relays_chunks_and_ends_with_one_done() {
    let l = Lemonade::start(bin(), &[]).await;
    let mut body = chat(SMOL, "Count from one to five.", 24);
    body["stream"] = json!(true);
    let (s, ct, text) = stream_text(&l, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let data = sse_data(&text);
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{text}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        data.iter().filter(|d| *d != "[DONE]").filter_map(|d| serde_json::from_str(d).ok()).collect();
    assert!(!chunks.is_empty(), "{text}");
    for c in &chunks {
        assert_eq!(c["model"], SMOL, "every chunk names the requested model: {c}");
    }
    assert_no_local_paths(&l, &text);
    let content: String = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert!(!content.trim().is_empty(), "{text}");
    let (_, st) = l.get("/api/v1/stats").await;
    assert!(st["output_tokens"].as_u64().unwrap() > 0, "{st}");
}

#[tokio::test]
async fn completions_and_max_completion_tokens() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l
        .post(
            "/api/v1/completions",
            &json!({"model": GEMMA, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty(), "{v}");
    // Gemma is a base model with no chat template; the streaming path works too.
    let (s, _, text) = stream_text(
        &l,
        "/api/v1/completions",
        &json!({"model": GEMMA, "prompt": "One, two,", "max_tokens": 6, "stream": true}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    // max_completion_tokens is honoured through the copy into max_tokens.
    let mut body = chat(SMOL, "Tell me a long story about a dragon.", 0);
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(3);
    let (s, v) = l.post("/api/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[tokio::test]
async fn embeddings_float_and_base64_from_real_minilm() {
    let l = Lemonade::start(bin(), &[]).await;
    let input = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."];
    let (s, v) = l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": input})).await;
    assert_eq!(s, 200, "{v}");
    let vecs: Vec<Vec<f64>> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();
    assert_eq!(vecs.len(), 3);
    assert!(vecs.iter().all(|e| e.len() == 384));
    // The conversion is faithful: related sentences are closer than unrelated ones.
    assert!(
        cosine(&vecs[0], &vecs[1]) > cosine(&vecs[0], &vecs[2]) + 0.2,
        "{} vs {}",
        cosine(&vecs[0], &vecs[1]),
        cosine(&vecs[0], &vecs[2])
    );

    let (s, b) = l.post("/v1/embeddings", &json!({"model": MINILM, "input": input, "encoding_format": "base64"})).await;
    assert_eq!(s, 200, "{b}");
    for (i, d) in b["data"].as_array().unwrap().iter().enumerate() {
        let raw = base64::engine::general_purpose::STANDARD.decode(d["embedding"].as_str().unwrap()).unwrap();
        let floats: Vec<f64> = raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect();
        assert_eq!(floats.len(), 384);
        assert!(cosine(&floats, &vecs[i]) > 0.9999, "base64 vector {i} differs from the float one");
    }
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["type"], "embedding");
}

#[tokio::test]
async fn reranking_plumbing_with_random_head() {
    let l = Lemonade::start(bin(), &[]).await;
    let docs = ["pandas are bears", "the stock market fell", "bamboo is food for pandas"];
    for path in ["/api/v1/reranking", "/v1/rerank"] {
        let (s, v) = l.post(path, &json!({"model": RERANKER, "query": "what do pandas eat?", "documents": docs})).await;
        assert_eq!(s, 200, "{path}: {v}");
        let results = v["results"].as_array().unwrap();
        let mut idx: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
        idx.sort();
        assert_eq!(idx, [0, 1, 2]);
        // Plumbing only: the scores are finite numbers, nothing is said about their order.
        assert!(results.iter().all(|r| r["relevance_score"].as_f64().is_some_and(f64::is_finite)));
    }
}

#[tokio::test]
async fn responses_streaming_and_not() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) =
        l.post("/api/v1/responses", &json!({"model": SMOL, "input": "Say hello.", "max_output_tokens": 12})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["model"], SMOL, "{v}");
    let said: String = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "output_text")
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .collect();
    assert!(!said.trim().is_empty(), "output_text with text: {v}");
    let (s, ct, body) = stream_text(
        &l,
        "/api/v1/responses",
        &json!({"model": SMOL, "input": "Say hello.", "max_output_tokens": 12, "stream": true}),
    )
    .await;
    assert_eq!(s, 200);
    assert!(ct.starts_with("text/event-stream"));
    assert!(body.contains("response.output_text.delta"), "{body}");
    assert!(body.contains("response.completed"), "{body}");
    assert_no_local_paths(&l, &body);
}

#[tokio::test]
async fn models_list_retrieve_and_lookup_errors() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.get("/api/v1/models").await;
    assert_eq!(s, 200);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    for id in [SMOL, SMOL_COPY, GEMMA, MINILM, RERANKER].map(shown) {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    assert!(!ids.contains(&"Qwen3-0.6B-GGUF"), "not downloaded, so not listed by default");
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "sorted by id");
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["downloaded"] == true && m["created"] == 1234567890 && m["owned_by"] == "lemonade"));

    let (_, all) = l.get("/api/v1/models?show_all=true").await;
    let qwen =
        all["data"].as_array().unwrap().iter().find(|m| m["id"] == "Qwen3-0.6B-GGUF").expect("catalogue model listed");
    assert_eq!(qwen["downloaded"], false);
    assert_eq!(qwen["checkpoint"], "unsloth/Qwen3-0.6B-GGUF:Q4_0");

    let (s, m) = l.get(&format!("/api/v1/models/{MINILM}")).await;
    assert_eq!(s, 200);
    assert_eq!(m["type"], "embedding", "type read from the GGUF metadata: {m}");
    // An extra model's checkpoint is its file in the extra models dir the user named (absolute,
    // as Lemonade v9 and v11 show it); no other path of this machine is in the listing.
    let extra = l.sandbox.extra().display().to_string();
    assert_eq!(m["checkpoint"], format!("{extra}/all-MiniLM-L6-v2-F32.gguf"), "{m}");
    assert_no_local_paths(&l, &all.to_string().replace(&extra, "<extra-models-dir>"));
    let (_, r) = l.get(&format!("/v1/models/{RERANKER}")).await;
    assert_eq!(r["type"], "reranking");

    let (s, e) = l.get("/api/v1/models/nope").await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "model_not_found");
    let (s, e) = l.get("/api/v1/models/Gemma3-1b-it-FLM").await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "model_not_supported");
    let (s, w) = l.get("/api/v1/models/Whisper-Tiny").await;
    assert_eq!((s, w["recipe"].as_str()), (200, Some("whispercpp")), "{w}");
    assert!(w["labels"].as_array().unwrap().contains(&serde_json::json!("transcription")), "{w}");
}

#[tokio::test]
async fn http_errors_are_json_with_the_right_status() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, e) = l.get("/api/v1/nonexistent").await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["type"], "not_found");
    assert_eq!(e["error"]["path"], "/api/v1/nonexistent");
    let (s, e) = l.get("/api/v1/chat/completions").await;
    assert_eq!(s, 405);
    assert_eq!(e["error"]["message"], "Method Not Allowed. Use POST for this endpoint");
    let (s, e) = l.post("/api/v1/health", &json!({})).await;
    assert_eq!(s, 405);
    assert!(e["error"]["message"].as_str().unwrap().contains("Use GET"));

    let (s, e) = l.post_raw("/api/v1/chat/completions", "{\"model\": ").await;
    assert_eq!(s, 400);
    assert!(e["error"]["message"].as_str().unwrap().starts_with("Invalid JSON"), "{e}");
    let (s, e) = l.post("/api/v1/chat/completions", &json!({"model": SMOL})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("messages")), "{e}");
    let (s, e) = l.post("/api/v1/chat/completions", &json!({"model": SMOL, "messages": [], "max_tokens": "ten"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("max_tokens")), "{e}");
    let (s, e) = l.post("/api/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["message"], "No model loaded and no model specified in request");
    let (s, e) = l.post("/api/v1/chat/completions", &chat("nope", "hi", 1)).await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "model_not_found");
    assert_eq!(e["error"]["requested_model"], "nope");
    let (s, e) = l.post("/api/v1/chat/completions", &chat(MINILM, "hi", 1)).await;
    assert_eq!(s, 400, "chat to an embedding model");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let (s, _) = l.post("/api/v1/embeddings", &json!({"model": SMOL, "input": "x"})).await;
    assert_eq!(s, 400, "embeddings from an LLM");
    // Not downloaded: pulled first, and here the Hub (a closed loopback port) is unreachable.
    let (s, e) = l.post("/api/v1/chat/completions", &chat("Qwen3-0.6B-GGUF", "hi", 1)).await;
    assert_eq!(s, 502, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().starts_with("Download failed"), "{e}");

    // Over the body limit (64 MiB): a JSON 413, not a dropped connection.
    let big = format!("{{\"model\":\"{SMOL}\",\"messages\":[],\"pad\":\"{}\"}}", "x".repeat(65 << 20));
    let (s, e) = l.post_raw("/api/v1/chat/completions", big).await;
    assert_eq!(s, 413, "{e}");
    assert_eq!(e["error"]["code"], "payload_too_large");
    // Nothing above loaded a model.
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]));
    let (s, v) = l.get("/live").await;
    assert_eq!((s, v), (200, json!({"status": "ok"})));
}

#[tokio::test]
async fn llama_cpp_native_endpoints_are_routed_by_model() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post("/tokenize", &json!({"model": SMOL, "content": "Hello world"})).await;
    assert_eq!(s, 200, "{v}");
    assert!(!v["tokens"].as_array().unwrap().is_empty());
    let (s, d) = l.post("/api/v1/detokenize", &json!({"model": SMOL, "tokens": v["tokens"]})).await;
    assert_eq!(s, 200);
    assert!(d["content"].as_str().unwrap().contains("Hello world"), "{d}");
    let (s, slots) = l.get(&format!("/slots?model={SMOL}")).await;
    assert_eq!(s, 200);
    assert!(slots.as_array().is_some_and(|a| !a.is_empty()), "{slots}");
    let (s, props) = l.get(&format!("/v1/props?model={SMOL}")).await;
    assert_eq!(s, 200);
    assert_eq!(props["model_path"], SMOL, "the model's name, not a path of this machine: {props}");
    assert_no_local_paths(&l, &props.to_string());
    let r = l.http.get(l.url(&format!("/metrics?model={SMOL}"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("llamacpp:"));
    let (s, e) = l.get("/props").await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["param"], "model");
}

#[tokio::test]
async fn one_llm_slot_swaps_models_lru() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, _) = l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await;
    assert_eq!(s, 200);
    let (s, _) = l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": "x"})).await;
    assert_eq!(s, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL, MINILM], "an LLM and an embedding model side by side");
    let (s, _) = l.post("/api/v1/completions", &json!({"model": GEMMA, "prompt": "a", "max_tokens": 2})).await;
    assert_eq!(s, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [MINILM, GEMMA], "the second LLM replaced the first");
    assert_eq!(h["model_loaded"], GEMMA);
}

/// Whether any slot of the model's llama-server is still generating.
async fn processing(l: &Lemonade, model: &str) -> bool {
    let (_, slots) = l.get(&format!("/slots?model={model}")).await;
    slots.as_array().unwrap().iter().any(|s| s["is_processing"] == true)
}

#[tokio::test]
async fn client_disconnect_stops_generation() {
    let l = Lemonade::start(bin(), &[]).await;
    // Loaded first: a cold request would be answered at once with `: loading` comments.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Write a very long essay about the sea."}],
                      "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let r = l.http.post(l.url("/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert!(processing(&l, SMOL).await, "generating while the client reads");
    drop(stream);
    // 4000 tokens take far longer than this deadline: only a cancelled request stops in time.
    let stopped = wait_for(Duration::from_secs(5), || async { (!processing(&l, SMOL).await).then_some(()) }).await;
    assert!(stopped.is_some(), "llama-server kept generating after the client left");
    let (s, _) = l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await;
    assert_eq!(s, 200, "the model serves the next request");
}

#[tokio::test]
async fn killed_backend_mid_stream_gives_error_frame_and_recovers() {
    let l = Lemonade::start(bin(), &[]).await;
    // Loaded first: a cold request would be answered at once with `: loading` comments.
    assert_eq!(l.post("/api/v1/load", &json!({"model_name": SMOL})).await.0, 200);
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Write a very long essay about the sea."}],
                      "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let r = l.http.post(l.url("/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut stream = r.bytes_stream();
    let _ = stream.next().await.unwrap().unwrap();
    let children = child_pids(l.pid());
    assert_eq!(children.len(), 1, "one llama-server");
    unsafe {
        libc::kill(children[0] as i32, libc::SIGKILL);
    }
    let mut rest = Vec::new();
    let read_all = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => rest.extend_from_slice(&c),
                Err(e) => panic!("the stream should end cleanly with an error frame, got {e}"),
            }
        }
    })
    .await;
    assert!(read_all.is_ok(), "stream did not end after the backend died");
    let text = String::from_utf8_lossy(&rest);
    let last = sse_data(&text).pop().unwrap_or_default();
    let v: Value = serde_json::from_str(&last).unwrap_or_else(|_| panic!("last frame is not an error frame: {text}"));
    assert_eq!(v["error"]["type"], "streaming_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("killed by signal 9"), "{v}");

    let (s, _) = l.get("/live").await;
    assert_eq!(s, 200, "the server stays up");
    let gone = wait_for(Duration::from_secs(5), || async {
        l.get("/api/v1/health").await.1["all_models_loaded"].as_array().unwrap().is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the dead model is no longer reported loaded");
    let (s, v) = l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await;
    assert_eq!(s, 200, "the next request reloads the model: {v}");
}

#[tokio::test]
async fn no_backend_outlives_the_server() {
    // Graceful: SIGTERM stops every child before the server exits.
    let mut l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 1)).await.0, 200);
    assert_eq!(l.post("/api/v1/embeddings", &json!({"model": MINILM, "input": "x"})).await.0, 200);
    let children = child_pids(l.pid());
    assert_eq!(children.len(), 2);
    l.signal(libc::SIGTERM);
    let status = l.wait_exit(Duration::from_secs(20)).expect("server exits on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(children.iter().all(|p| !alive(*p)), "children left after a graceful stop");

    // Abrupt: SIGKILL of the server; the parent-death signal takes the children down.
    let mut l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 1)).await.0, 200);
    let children = child_pids(l.pid());
    assert_eq!(children.len(), 1);
    l.signal(libc::SIGKILL);
    l.wait_exit(Duration::from_secs(5)).expect("killed");
    let gone = wait_for(Duration::from_secs(5), || async { children.iter().all(|p| !alive(*p)).then_some(()) }).await;
    assert!(gone.is_some(), "llama-server survived a SIGKILLed lemonade");
}

#[tokio::test]
async fn invalid_llamacpp_args_are_rejected_at_start() {
    let out = std::process::Command::new(bin())
        .args(["serve", "--port", "0", "--llamacpp-args", "-t 1 --port 9"])
        .env("LEMONADE_CACHE_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("argument '--port' is managed by lemonade"), "{err}");
}

#[tokio::test]
async fn cli_settings_reach_the_backend_command_line() {
    let l = Lemonade::start(bin(), &["--ctx-size", "2048", "--llamacpp-args", "--threads 1"]).await;
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 1)).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    let opts = &h["all_models_loaded"][0]["recipe_options"];
    assert_eq!(opts["ctx_size"], 2048);
    assert_eq!(opts["llamacpp_args"], "--threads 1");
    let (_, props) = l.get(&format!("/props?model={SMOL}")).await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 2048, "{props}");
}

#[tokio::test]
async fn backend_errors_keep_their_status_and_message() {
    let l = Lemonade::start(bin(), &[]).await;
    for stream in [false, true] {
        let mut body = chat(SMOL, "hi", 2);
        body["response_format"] = json!({"type": "bogus"});
        body["stream"] = json!(stream);
        let (s, e) = l.post("/api/v1/chat/completions", &body).await;
        assert_eq!(s, 400, "stream={stream}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("response_format type must be one of"), "{e}");
    }
    // The model stays loaded and healthy.
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await.0, 200);
}

#[tokio::test]
async fn a_corrupt_gguf_fails_with_the_backend_log_and_no_local_path() {
    // Real llama-server on a truncated GGUF: the load fails with its exit status and last log
    // lines, and the paths in them are placeholders, not this machine's.
    let s = Sandbox::new();
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&[0xff; 64]);
    std::fs::write(s.extra().join("broken.gguf"), bytes).unwrap();
    let l = Lemonade::start_in(bin(), s, &[], &[]).await;
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": "extra.broken"})).await;
    assert_eq!(s, 500, "{e}");
    assert_eq!(e["error"]["code"], "model_load_error", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("backend exited (exit code 1) before it was ready"), "the exit status: {msg}");
    assert!(msg.contains("Last log lines:") && msg.contains("failed to load model"), "llama-server's log tail: {msg}");
    assert!(msg.contains("<extra-models-dir>/broken.gguf"), "the file, by placeholder: {msg}");
    assert_no_local_paths(&l, &e.to_string());
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]));
}

/// llama.cpp's native fields (CVE-2026-21869 was a negative `n_discard`) outside their range
/// are a 400 naming the field at lemonade's edge, on every route that reaches llama-server,
/// before any model loads.
#[tokio::test]
async fn llama_cpp_native_fields_outside_their_range_are_refused_before_reaching_a_backend() {
    let l = Lemonade::start(bin(), &[]).await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (path, body, field) in [
        ("/api/v1/chat/completions", json!({"model": SMOL, "messages": msgs, "n_discard": -5}), "n_discard"),
        ("/v1/completions", json!({"model": SMOL, "prompt": "hi", "n_probs": 100000}), "n_probs"),
        ("/completion", json!({"model": SMOL, "prompt": "hi", "id_slot": -9}), "id_slot"),
        ("/api/v1/chat/completions", json!({"model": SMOL, "messages": msgs, "n_keep": "all"}), "n_keep"),
    ] {
        let (s, e) = l.post(path, &body).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(field)), "{path} {body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(&format!("'{field}' must be")), "{e}");
    }
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]), "nothing was loaded for them");
    let (s, _) = l
        .post(
            "/api/v1/chat/completions",
            &json!({"model": SMOL, "messages": msgs, "max_tokens": 2, "n_probs": 2, "n_keep": -1}),
        )
        .await;
    assert_eq!(s, 200, "in range, they pass");
}

/// A client that hangs up on a non-streamed request frees llama-server's slot: the request
/// asks for 3,000 tokens (EOS ignored), the client leaves once the slot generates, and a second
/// later the child's `/slots` says the slot is idle. lemonade drops its request to
/// llama-server (and the lease) as the client goes; llama-server looks at its client's
/// connection when its result queue has been quiet for a second, so the slot is free a second
/// or a token later. The check is one look 1.5 s after the hang-up: polling `/slots` meanwhile
/// would keep that queue busy (each `/slots` is a task whose result wakes it) and put off the
/// very check it measures.
#[tokio::test]
async fn real_llama_server_a_client_leaving_a_non_streamed_request_frees_the_slot() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, warm) = l
        .post(
            "/v1/chat/completions",
            &json!({"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(s, 200, "{warm}");
    let busy = |slots: &Value| slots.as_array().is_some_and(|a| a.iter().any(|s| s["is_processing"] == true));
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Count to ten thousand."}],
        "max_tokens": 3000, "ignore_eos": true, "stream": false});
    let leaving = reqwest::Client::new().post(l.url("/v1/chat/completions")).json(&body).send();
    // The client leaves once the slot is generating (bounded: at most 30 s).
    let watch = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, slots) = l.get(&format!("/slots?model={SMOL}")).await;
            if busy(&slots) || tokio::time::Instant::now() > deadline {
                return slots;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let slots = tokio::select! {
        r = leaving => panic!("the 3,000-token answer came before the client left: {:?}", r.map(|r| r.status())),
        s = watch => s,
    };
    assert!(busy(&slots), "the slot never started: {slots}");
    // The measured bound itself (see above), not a wait for something to happen.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, idle) = l.get(&format!("/slots?model={SMOL}")).await;
    assert!(!busy(&idle), "still generating 1.5 s after the client left: {idle}");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["in_flight"], 0, "the request still holds its lease: {h}");
}

/// A streamed request whose prompt takes seconds to prefill starts its answer at once and
/// keeps the connection alive until the first token: SSE comments (`: prefill 2 s`) in
/// OpenAI's stream, empty chunks with `lemonade_status` in Ollama's NDJSON. With
/// `--stream-timeout 1`, the same prefill is cut after a second with the dialect's error,
/// naming the setting.
#[tokio::test]
async fn real_llama_server_a_long_prefill_keeps_the_stream_alive_and_a_stalled_one_is_cut() {
    let l = Lemonade::start(bin(), &[]).await;
    let long = |topic: &str| -> String {
        (0..160).map(|i| format!("{topic} fact {i}: lemons are yellow and sour. ")).collect()
    };
    let raw = |l: &Lemonade, path: &str, body: Value| {
        let (http, url) = (l.http.clone(), l.url(path));
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let sse = raw(
        &l,
        "/v1/chat/completions",
        json!({"model": SMOL, "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": long("Apple")}]}),
    )
    .await;
    let first_data = sse.find("data: {").unwrap_or_else(|| panic!("no data in {sse}"));
    assert!(sse[..first_data].contains(": prefill "), "no keep-alive before the first token: {sse}");
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");

    let nd = raw(
        &l,
        "/api/chat",
        json!({"model": SMOL, "options": {"num_predict": 4},
        "messages": [{"role": "user", "content": long("Banana")}]}),
    )
    .await;
    let lines: Vec<Value> = nd.lines().map(|x| serde_json::from_str(x).unwrap()).collect();
    assert!(lines[0]["lemonade_status"].as_str().is_some_and(|s| s.starts_with("prefill")), "{nd}");
    assert_eq!(lines[0]["message"]["content"], "", "{nd}");
    assert_eq!(lines.last().unwrap()["done"], true, "{nd}");
    drop(l);

    let l = Lemonade::start(bin(), &["--stream-timeout", "1"]).await;
    let (s, _) = l
        .post(
            "/v1/chat/completions",
            &json!({"model": SMOL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(s, 200);
    let cut = raw(
        &l,
        "/v1/chat/completions",
        json!({"model": SMOL, "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": long("Cherry")}]}),
    )
    .await;
    assert!(cut.contains("\"error\"") && cut.contains("stream_timeout"), "{cut}");
    assert!(!cut.contains("\"choices\""), "the cut stream carried a token: {cut}");
}

/// A request that loads its model passes its `ctx_size` (Ollama: `options.num_ctx`) to the
/// load, and nothing else of its body (Lemonade v11's allowlist); a request to a loaded model
/// does not reload it.
#[tokio::test]
async fn real_llama_server_an_auto_load_takes_the_requests_context_size_only() {
    let l = Lemonade::start(bin(), &[]).await;
    let ctx = |h: &Value| h["all_models_loaded"][0]["recipe_options"]["ctx_size"].clone();
    let chat = json!({"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "ctx_size": 2048, "temperature": 0.5, "llamacpp_args": "--foo"});
    let (s, v) = l.post("/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{v}");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(ctx(&h), 2048, "{h}");
    let opts = &h["all_models_loaded"][0]["recipe_options"];
    assert!(opts.get("temperature").is_none() && opts["llamacpp_args"] != "--foo", "{h}");
    let (s, _) = l
        .post(
            "/v1/chat/completions",
            &json!({"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "ctx_size": 1024}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(ctx(&l.get("/api/v1/health").await.1), 2048, "a loaded model is not reloaded for it");
    assert_eq!(l.post("/api/v1/unload", &json!({"model_name": SMOL})).await.0, 200);
    let (s, v) = l
        .post(
            "/api/chat",
            &json!({"model": SMOL, "stream": false, "options": {"num_ctx": 1536, "num_predict": 2},
        "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ctx(&l.get("/api/v1/health").await.1), 1536);
}
