//! The prompt cache: the time to first token of a conversation's next turn after its model
//! was swapped out and in again, with the saved prompt restored against the same without a
//! cache (`--prompt-cache-size 0`), for conversations of about 1k, 2k and 4k tokens; the time
//! the save adds to taking the model out, and the disk it takes.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use test_support::{Lemonade, Sandbox, GEMMA, SMOL};

/// The sizes measured: facts in the first turn (about 17 tokens each).
const SIZES: [(usize, usize); 3] = [(1000, 58), (2000, 116), (4000, 234)];

fn first_turn(facts: usize) -> Vec<Value> {
    let notes: String =
        (0..facts).map(|i| format!("Fact {i}: lemon tree number {i} grows in row {}. ", i % 7)).collect();
    vec![json!({"role": "user", "content": format!("Read these notes. {notes}Which row has the most trees?")})]
}

/// A streamed chat turn: (ms to the first content chunk, the answer, llama-server's prompt_n).
async fn turn(l: &Lemonade, messages: &[Value]) -> anyhow::Result<(f64, String, u64)> {
    let body = json!({"model": SMOL, "messages": messages, "max_tokens": 16, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    let t = Instant::now();
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await?;
    anyhow::ensure!(r.status().is_success(), "HTTP {}", r.status());
    let (mut first, mut text, mut prompt_n) = (None, String::new(), 0);
    crate::each_event(r, |now, v| {
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str().filter(|c| !c.is_empty()) {
            first.get_or_insert_with(|| (now - t).as_secs_f64() * 1e3);
            text.push_str(c);
        }
        if let Some(n) = v["timings"]["prompt_n"].as_u64() {
            prompt_n = n;
        }
    })
    .await?;
    Ok((first.ok_or_else(|| anyhow::anyhow!("no content"))?, text, prompt_n))
}

/// One conversation on a fresh lemonade: turn one, Gemma swapped in (SmolLM2 out), SmolLM2
/// swapped back in, then the timed next turn. Returns (next-turn TTFT ms, its prompt_n, the
/// first turn's prompt_n, ms to unload SmolLM2, prompt-cache bytes).
async fn conversation(bin: &Path, facts: usize, cache: bool) -> anyhow::Result<(f64, u64, u64, f64, u64)> {
    let mut args = vec!["--llamacpp-args", crate::LLAMA_ARGS, "--ctx-size", "8192", "--log-level", "info"];
    if !cache {
        args.extend(["--prompt-cache-size", "0"]);
    }
    let l = Lemonade::start_in(bin, Sandbox::new(), &args, &[]).await;
    let mut messages = first_turn(facts);
    let (_, answer, first_n) = turn(&l, &messages).await?;
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "Answer in one word."}));
    let t = Instant::now();
    let (s, v) = l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
    anyhow::ensure!(s == 200, "unload: {v}");
    let unload_ms = t.elapsed().as_secs_f64() * 1e3;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": GEMMA})).await;
    anyhow::ensure!(s == 200, "load gemma: {v}");
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    anyhow::ensure!(s == 200, "load smol: {v}");
    let (ttft, _, next_n) = turn(&l, &messages).await?;
    let bytes = l.get("/api/v1/health").await.1["prompt_cache"]["bytes"].as_u64().unwrap_or(0);
    Ok((ttft, next_n, first_n, unload_ms, bytes))
}

pub async fn prompt_cache(bin: &Path) -> anyhow::Result<Value> {
    let mut rows = Vec::new();
    println!("\nPrompt cache: the next turn after a swap-out/swap-in (SmolLM2, llama-server {})\n", crate::LLAMA_ARGS);
    println!("| conversation | TTFT without cache | TTFT with restore | ratio | prefilled without / with | unload without / with save | disk |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, facts) in SIZES {
        let (t0, n0, first, u0, _) = conversation(bin, facts, false).await?;
        let (t1, n1, _, u1, bytes) = conversation(bin, facts, true).await?;
        println!(
            "| {label} ({first} tokens) | {t0:.0} ms | {t1:.0} ms | {:.3} | {n0} / {n1} tokens | {u0:.0} / {u1:.0} ms | {:.1} MB |",
            t1 / t0,
            bytes as f64 / 1e6
        );
        rows.push(json!({"tokens": first, "ttft_without_ms": t0, "ttft_restored_ms": t1, "ratio": t1 / t0,
            "prefilled_without": n0, "prefilled_with": n1, "unload_without_ms": u0, "unload_with_save_ms": u1,
            "cache_bytes": bytes}));
    }
    Ok(Value::Array(rows))
}
