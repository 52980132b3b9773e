//! `cargo xtask bench`: lemonade against direct llama-server, side by side in one run.
//!
//! One lemonade (release build) serves SmolLM2; the same llama-server child is also reached
//! directly through the `backend_url` lemonade reports. Streaming requests alternate between
//! the two paths so drift affects both alike. Reported: median time to first token and
//! median decode tokens/s per path, their ratio and difference. Loopback only; the number of
//! requests is fixed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::{Lemonade, SMOL};

const RUNS: usize = 20;
/// llama-server computes on one core, leaving the other to the client and the proxy, so the
/// proxy's cost is not hidden by (or confused with) CPU contention on this 2-core machine.
const LLAMA_ARGS: &str = "--threads 1 --threads-batch 1";
const MAX_TOKENS: u32 = 128;

struct Sample {
    ttft_ms: f64,
    decode_tps: f64,
    tokens: usize,
}

/// One streamed chat completion; times are taken at the client as chunks arrive.
async fn stream_once(http: &reqwest::Client, url: &str, model: Option<&str>) -> anyhow::Result<Sample> {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Write a story about a lighthouse keeper."}],
        "max_tokens": MAX_TOKENS, "ignore_eos": true, "temperature": 0, "stream": true
    });
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    let start = Instant::now();
    // A fresh connection per request on both paths: llama-server closes the connection after a
    // streamed response, so reusing one would race with its FIN.
    let resp = http.post(url).header("connection", "close").json(&body).send().await?;
    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let (mut first, mut last, mut tokens) = (None, None, 0usize);
    while let Some(chunk) = stream.next().await {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if data == "[DONE]" {
                    continue;
                }
                let v: Value = serde_json::from_str(data)?;
                if v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
                    tokens += 1;
                    first.get_or_insert(now);
                    last = Some(now);
                }
            }
        }
    }
    let (first, last) = (first.ok_or_else(|| anyhow::anyhow!("no content"))?, last.unwrap());
    let decode = (last - first).as_secs_f64();
    Ok(Sample {
        ttft_ms: (first - start).as_secs_f64() * 1e3,
        decode_tps: if decode > 0.0 { (tokens - 1) as f64 / decode } else { 0.0 },
        tokens,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn lemonade_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LEMONADE_BENCH_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().expect("target dir").join("lemonade")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let bin = lemonade_bin();
    anyhow::ensure!(
        bin.is_file(),
        "{} not found: build it with `cargo build --release -p lemonade-cli`",
        bin.display()
    );
    let l = Lemonade::start_in(
        &bin,
        test_support::Sandbox::new(),
        &["--llamacpp-args", LLAMA_ARGS, "--log-level", "info"],
        &[],
    )
    .await;
    let http =
        reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_idle_timeout(Duration::from_secs(3)).build()?;
    let via = l.url("/api/v1/chat/completions");
    // Warm up (loads the model), then find the same llama-server's own address.
    stream_once(&http, &via, Some(SMOL)).await?;
    let (_, health) = l.get("/api/v1/health").await;
    let backend = health["all_models_loaded"][0]["backend_url"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(!backend.is_empty(), "no backend_url in {health}");
    let direct = format!("{backend}/chat/completions");
    stream_once(&http, &direct, None).await?;

    let (mut d, mut p) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        // Alternate which path goes first.
        if i % 2 == 0 {
            d.push(stream_once(&http, &direct, None).await?);
            p.push(stream_once(&http, &via, Some(SMOL)).await?);
        } else {
            p.push(stream_once(&http, &via, Some(SMOL)).await?);
            d.push(stream_once(&http, &direct, None).await?);
        }
    }
    let tokens = d.iter().chain(&p).map(|s| s.tokens).min().unwrap_or(0);
    let (d_ttft, p_ttft) =
        (median(d.iter().map(|s| s.ttft_ms).collect()), median(p.iter().map(|s| s.ttft_ms).collect()));
    let (d_tps, p_tps) =
        (median(d.iter().map(|s| s.decode_tps).collect()), median(p.iter().map(|s| s.decode_tps).collect()));
    // Paired: each proxied run against the direct run next to it.
    let added_ttft = median(d.iter().zip(&p).map(|(a, b)| b.ttft_ms - a.ttft_ms).collect());
    let ratio = median(d.iter().zip(&p).map(|(a, b)| b.decode_tps / a.decode_tps).collect());

    println!(
        "\nStreaming chat, SmolLM2-135M Q4_1, {MAX_TOKENS} tokens, {RUNS} runs per path, llama-server {LLAMA_ARGS}\n"
    );
    println!("| path | TTFT (ms, median) | decode tokens/s (median) |");
    println!("|---|---:|---:|");
    println!("| direct llama-server | {d_ttft:.2} | {d_tps:.1} |");
    println!("| through lemonade | {p_ttft:.2} | {p_tps:.1} |");
    println!("| lemonade vs direct (median of paired runs) | {added_ttft:+.2} ms | {ratio:.3}× |");
    let out = json!({
        "model": SMOL, "runs": RUNS, "max_tokens": MAX_TOKENS, "min_tokens_seen": tokens,
        "direct": {"ttft_ms": d_ttft, "decode_tps": d_tps},
        "lemonade": {"ttft_ms": p_ttft, "decode_tps": p_tps},
        "llama_server_args": LLAMA_ARGS,
        "added_ttft_ms": added_ttft,
        "throughput_ratio": ratio,
    });
    if let Some(path) = std::env::var_os("LEMONADE_BENCH_OUT") {
        std::fs::write(&path, serde_json::to_vec_pretty(&out)?)?;
        println!("\nwritten to {}", PathBuf::from(path).display());
    }
    drop(l);
    Ok(())
}
