//! `cargo xtask bench`: lemonade against direct llama-server, side by side in one run.
//!
//! One lemonade (release build) serves SmolLM2; the same llama-server child is also reached
//! directly through the `backend_url` lemonade reports. Streaming requests alternate between
//! the two paths so drift affects both alike. Reported: median time to first token and
//! median decode tokens/s per path, their ratio and difference. Loopback only; the number of
//! requests is fixed. More sections (concurrency and swaps against llama-server's router mode,
//! footprint, endpoint throughput, the Ollama and Anthropic dialects' cost) are in `more.rs`;
//! the other modalities against their backends direct in `modalities.rs`; the web UI's size
//! and load time in `webui.rs`; the prompt cache's restore against none in `prompt_cache.rs`.

mod cluster;
mod modalities;
mod more;
mod parallel;
mod prompt_cache;
mod routing;
mod scaling;
mod startup;
mod twin;
mod webui;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::{Lemonade, SMOL};

pub(crate) const RUNS: usize = 20;
/// llama-server computes on one core, leaving the other to the client and the proxy, so the
/// proxy's cost is not hidden by (or confused with) CPU contention on this 2-core machine.
pub(crate) const LLAMA_ARGS: &str = "--threads 1 --threads-batch 1";
const MAX_TOKENS: u32 = 128;

pub(crate) struct Sample {
    ttft_ms: f64,
    decode_tps: f64,
    tokens: usize,
}

/// Reads a streamed answer's SSE `data:` events (JSON; `[DONE]` skipped) as they arrive,
/// calling `f` with the time their chunk arrived and the event.
pub(crate) async fn each_event(resp: reqwest::Response, mut f: impl FnMut(Instant, &Value)) -> anyhow::Result<()> {
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
                f(now, &serde_json::from_str(data)?);
            }
        }
    }
    Ok(())
}

/// One streamed chat completion; times are taken at the client as chunks arrive.
pub(crate) async fn stream_once(http: &reqwest::Client, url: &str, model: Option<&str>) -> anyhow::Result<Sample> {
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
    let (mut first, mut last, mut tokens) = (None, None, 0usize);
    each_event(resp, |now, v| {
        if v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            tokens += 1;
            first.get_or_insert(now);
            last = Some(now);
        }
    })
    .await?;
    let (first, last) = (first.ok_or_else(|| anyhow::anyhow!("no content"))?, last.unwrap());
    let decode = (last - first).as_secs_f64();
    Ok(Sample {
        ttft_ms: (first - start).as_secs_f64() * 1e3,
        decode_tps: if decode > 0.0 { (tokens - 1) as f64 / decode } else { 0.0 },
        tokens,
    })
}

/// `with` against `base`, run by run: the median TTFT added (ms) and the median decode ratio.
fn paired(base: &[Sample], with: &[Sample]) -> (f64, f64) {
    let added = median(base.iter().zip(with).map(|(a, b)| b.ttft_ms - a.ttft_ms).collect());
    let ratio = median(base.iter().zip(with).map(|(a, b)| b.decode_tps / a.decode_tps).collect());
    (added, ratio)
}

/// `with` against `base` (ms), run by run: the median added (ms) and the median ratio.
pub(crate) fn paired_ms(base: &[f64], with: &[f64]) -> (f64, f64) {
    let added = median(base.iter().zip(with).map(|(a, b)| b - a).collect());
    let ratio = median(base.iter().zip(with).map(|(a, b)| b / a).collect());
    (added, ratio)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The sandbox's cost (`LEMONADE_BENCH_ONLY=sandbox`): two lemonades, one with its backends
/// under `--sandbox strict`, one `--sandbox off`, the same model and arguments, streamed in
/// alternation (which goes first alternates); the paired ratio of decode speed and the paired
/// difference of TTFT, in one run.
async fn sandbox(bin: &std::path::Path) -> anyhow::Result<Value> {
    let args = |mode| ["--llamacpp-args", LLAMA_ARGS, "--log-level", "info", "--sandbox", mode];
    let strict = Lemonade::start_in(bin, test_support::Sandbox::new(), &args("strict"), &[]).await;
    let off = Lemonade::start_in(bin, test_support::Sandbox::new(), &args("off"), &[]).await;
    let http =
        reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_idle_timeout(Duration::from_secs(3)).build()?;
    let (a, b) = (strict.url("/api/v1/chat/completions"), off.url("/api/v1/chat/completions"));
    stream_once(&http, &a, Some(SMOL)).await?;
    stream_once(&http, &b, Some(SMOL)).await?;
    let (_, h) = strict.get("/api/v1/health").await;
    anyhow::ensure!(h["all_models_loaded"][0]["sandbox"]["mode"] == "strict", "not sandboxed: {h}");
    let (mut s, mut o) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        if i % 2 == 0 {
            s.push(stream_once(&http, &a, Some(SMOL)).await?);
            o.push(stream_once(&http, &b, Some(SMOL)).await?);
        } else {
            o.push(stream_once(&http, &b, Some(SMOL)).await?);
            s.push(stream_once(&http, &a, Some(SMOL)).await?);
        }
    }
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let (ttft, ratio) = paired(&o, &s);
    println!(
        "\nSandbox on and off, SmolLM2-135M Q4_1 streamed through lemonade, {MAX_TOKENS} tokens, {RUNS} runs each\n"
    );
    println!("| backends | TTFT (ms, median) | decode tokens/s (median) |");
    println!("|---|---:|---:|");
    println!("| `--sandbox off` | {:.2} | {:.1} |", med(&o, |x| x.ttft_ms), med(&o, |x| x.decode_tps));
    println!("| `--sandbox strict` | {:.2} | {:.1} |", med(&s, |x| x.ttft_ms), med(&s, |x| x.decode_tps));
    println!("| strict vs off (median of paired runs) | {ttft:+.2} ms | {ratio:.3}× |");
    Ok(json!({"added_ttft_ms": ttft, "decode_ratio": ratio}))
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
    match std::env::var("LEMONADE_BENCH_ONLY").as_deref() {
        Ok("pull") => return pull_throughput(&bin).await.map(|_| ()),
        Ok("footprint") => return more::footprint(&bin).await.map(|_| ()),
        Ok("alternating") => return more::alternating(&bin).await.map(|_| ()),
        Ok("memory") => return more::memory_estimate(&bin).await.map(|_| ()),
        Ok("dialects") => return more::dialects(&bin).await.map(|_| ()),
        Ok("webui") => return webui::webui(&bin).await.map(|_| ()),
        Ok("prompt_cache") => return prompt_cache::prompt_cache(&bin).await.map(|_| ()),
        Ok("scaling") => return scaling::scaling(&bin).await.map(|_| ()),
        Ok("twin") => return twin::twin(&bin).await.map(|_| ()),
        Ok("startup") => return startup::startup(&bin).await.map(|_| ()),
        Ok("routing") => return routing::routing(&bin).await.map(|_| ()),
        Ok("omni") => return routing::omni(&bin).await.map(|_| ()),
        Ok("parallel") => return parallel::parallel(&bin).await.map(|_| ()),
        Ok("draft") => return parallel::draft(&bin).await.map(|_| ()),
        Ok("router") => return cluster::router(&bin).await.map(|_| ()),
        Ok("sandbox") => return sandbox(&bin).await.map(|_| ()),
        Ok("modalities") => {
            modalities::transcription(&bin).await?;
            modalities::images(&bin).await?;
            return modalities::speech(&bin).await.map(|_| ());
        }
        _ => {}
    }
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
    if std::env::var("LEMONADE_BENCH_ONLY").as_deref() == Ok("lifecycle") {
        // Load-to-ready and swap against the same work by hand, alone.
        return lifecycle(&l).await.map(|_| ());
    }

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
    let (added_ttft, ratio) = paired(&d, &p);

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
    if std::env::var("LEMONADE_BENCH_ONLY").as_deref() == Ok("streaming") {
        return Ok(());
    }
    let mut out = out;
    let router = more::Router::start(
        &[
            ("smol", test_support::model(test_support::SMOL_FILE)),
            ("gemma", test_support::model(test_support::GEMMA_FILE)),
        ],
        1,
    )
    .await?;
    out["concurrency"] = more::concurrency(&l, &direct, &router, "smol").await?;
    out["endpoints"] = more::endpoints(&l, backend.trim_end_matches("/v1")).await?;
    out["swap_vs_router"] = more::swaps(&l, &router).await?;
    drop(router);
    out["lifecycle"] = lifecycle(&l).await?;
    out["footprint"] = more::footprint(&bin).await?;
    out["memory_estimate"] = more::memory_estimate(&bin).await?;
    out["alternating"] = more::alternating(&bin).await?;
    out["dialects"] = more::dialects(&bin).await?;
    out["pull"] = pull_throughput(&bin).await?;
    out["transcription"] = modalities::transcription(&bin).await?;
    out["images"] = modalities::images(&bin).await?;
    out["speech"] = modalities::speech(&bin).await?;
    out["webui"] = webui::webui(&bin).await?;
    out["prompt_cache"] = prompt_cache::prompt_cache(&bin).await?;
    out["scaling"] = scaling::scaling(&bin).await?;
    out["twin"] = twin::twin(&bin).await?;
    out["startup"] = startup::startup(&bin).await?;
    out["routing"] = routing::routing(&bin).await?;
    out["omni"] = routing::omni(&bin).await?;
    out["parallel"] = parallel::parallel(&bin).await?;
    out["draft"] = parallel::draft(&bin).await?;
    out["router"] = cluster::router(&bin).await?;
    if let Some(path) = std::env::var_os("LEMONADE_BENCH_OUT") {
        std::fs::write(&path, serde_json::to_vec_pretty(&out)?)?;
        println!("\nwritten to {}", PathBuf::from(path).display());
    }
    drop(l);
    Ok(())
}

/// The llama-server command line lemonade uses for an LLM at `model`, with [`LLAMA_ARGS`].
pub(crate) fn llama_command_line(model: &std::path::Path) -> anyhow::Result<Vec<String>> {
    llama_command_line_rpc(model, vec![])
}

/// [`llama_command_line`] with llama.cpp RPC workers (`--rpc`, every layer offloaded to them).
pub(crate) fn llama_command_line_rpc(model: &std::path::Path, rpc: Vec<String>) -> anyhow::Result<Vec<String>> {
    Ok(backends::llamacpp::command_line(
        &backends::llamacpp::LlamaServerConfig {
            model_path: model.to_path_buf(),
            mmproj_path: None,
            model_type: api_types::ModelType::Llm,
            ctx_size: backends::llamacpp::DEFAULT_CTX_SIZE,
            parallel: None,
            backend: "cpu".into(),
            user_args: LLAMA_ARGS.into(),
            amd_igpu: false,
            alias: "bench".into(),
            rpc,
            draft: None,
            // The prompt cache's size does not change a start or a first token.
            cache_ram_mib: None,
        },
        None,
    )?)
}

/// Starts llama-server by hand with the command line lemonade would use and waits until
/// `/health` answers 200. Returns the process and the time it took.
async fn start_by_hand(http: &reqwest::Client, model: &std::path::Path) -> anyhow::Result<(std::process::Child, f64)> {
    let (child, ms, _) = start_args_by_hand(http, llama_command_line(model)?).await?;
    Ok((child, ms))
}

/// [`start_by_hand`] with these arguments; returns the child, ms until /health said 200, and
/// its port.
pub(crate) async fn start_args_by_hand(
    http: &reqwest::Client,
    args: Vec<String>,
) -> anyhow::Result<(std::process::Child, f64, u16)> {
    use std::io::BufRead;
    let t = Instant::now();
    let mut child = std::process::Command::new(test_support::llama_server())
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().unwrap();
    let port = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stderr).lines();
        let port = lines.by_ref().map_while(Result::ok).find_map(|l| host::supervisor::parse_listening_port(&l));
        // Keep draining so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        port
    })
    .await?
    .ok_or_else(|| anyhow::anyhow!("llama-server printed no port"))?;
    let url = format!("http://127.0.0.1:{port}/health");
    loop {
        if matches!(http.get(&url).send().await, Ok(r) if r.status() == 200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((child, t.elapsed().as_secs_f64() * 1e3, port))
}

/// SIGTERM and wait, as lemonade stops a backend.
fn stop_by_hand(child: &mut std::process::Child) -> anyhow::Result<()> {
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait()?;
    Ok(())
}

pub(crate) async fn timed_post(l: &Lemonade, path: &str, body: Value) -> anyhow::Result<f64> {
    let t = Instant::now();
    let (s, v) = l.post(path, &body).await;
    anyhow::ensure!(s == 200, "{path}: {s} {v}");
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Load-to-ready and one-slot swap, lemonade against the same work done by hand.
async fn lifecycle(l: &Lemonade) -> anyhow::Result<Value> {
    const REPS: usize = 8;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let (a_file, b_file) =
        (test_support::model(test_support::SMOL_FILE), test_support::model(test_support::GEMMA_FILE));
    let (a, b) = (test_support::SMOL, test_support::GEMMA);
    let (mut lem_load, mut hand_load, mut lem_swap, mut hand_swap) = (vec![], vec![], vec![], vec![]);
    for rep in 0..REPS {
        // Alternate which side goes first, so order effects (page cache, CPU state) cancel.
        let lemonade_first = rep % 2 == 0;
        for side in [lemonade_first, !lemonade_first] {
            if side {
                // Load-to-ready from nothing loaded, then a swap A -> B with one LLM slot.
                l.post("/api/v1/unload", &json!({})).await;
                lem_load.push(timed_post(l, "/api/v1/load", json!({"model_name": a})).await?);
                lem_swap.push(timed_post(l, "/api/v1/load", json!({"model_name": b})).await?);
                l.post("/api/v1/unload", &json!({})).await;
            } else {
                let (mut ca, ms) = start_by_hand(&http, &a_file).await?;
                hand_load.push(ms);
                let t = Instant::now();
                stop_by_hand(&mut ca)?;
                let (mut cb, _) = start_by_hand(&http, &b_file).await?;
                hand_swap.push(t.elapsed().as_secs_f64() * 1e3);
                stop_by_hand(&mut cb)?;
            }
        }
    }
    let load_overhead = median(lem_load.iter().zip(&hand_load).map(|(l, h)| l - h).collect());
    let swap_ratio = median(lem_swap.iter().zip(&hand_swap).map(|(l, h)| l / h).collect());
    let (ll, hl, ls, hs) = (median(lem_load), median(hand_load), median(lem_swap), median(hand_swap));
    println!("\nLoad and swap, llama-server {LLAMA_ARGS}, {REPS} reps (medians)\n");
    println!("| operation | by hand (ms) | through lemonade (ms) | lemonade overhead |");
    println!("|---|---:|---:|---:|");
    println!("| load-to-ready SmolLM2 | {hl:.1} | {ll:.1} | {load_overhead:+.1} ms (paired median) |");
    println!("| swap SmolLM2 → Gemma 270M (one slot) | {hs:.1} | {ls:.1} | ×{swap_ratio:.3} (paired median) |");
    Ok(json!({"reps": REPS, "load_to_ready_ms": {"by_hand": hl, "lemonade": ll, "overhead_ms": load_overhead},
              "swap_ms": {"by_hand": hs, "lemonade": ls, "ratio": swap_ratio}}))
}

/// Pull throughput for SmolLM2 (98 MB) and Gemma 270M (253 MB): fixed per-pull costs (Hub API
/// requests, registration, fsyncs) weigh less on the larger file.
async fn pull_throughput(bin: &std::path::Path) -> anyhow::Result<Value> {
    let mut out = serde_json::Map::new();
    for (label, rel) in [("SmolLM2", test_support::SMOL_FILE), ("Gemma 270M", test_support::GEMMA_FILE)] {
        out.insert(label.into(), pull_one(bin, label, rel).await?);
    }
    Ok(Value::Object(out))
}

/// `POST /api/v1/pull` of one model file from the Hub double, against a plain streamed HTTP copy
/// of the same bytes from the same double into a file.
async fn pull_one(bin: &std::path::Path, label: &str, rel: &str) -> anyhow::Result<Value> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    const REPS: usize = 4;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("hub");
    let repo = root.join("org/smol-GGUF");
    std::fs::create_dir_all(&repo)?;
    let file = "model-Q4_1.gguf";
    std::fs::copy(test_support::model(rel), repo.join(file))?;
    let bytes = std::fs::metadata(repo.join(file))?.len() as f64;
    let double = test_support::hub::HubDouble::start(&root, Default::default()).await;
    let l = Lemonade::start_in(
        bin,
        test_support::Sandbox::empty(),
        &["--log-level", "info"],
        &[("HF_ENDPOINT", &double.url)],
    )
    .await;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let url = format!("{}/org/smol-GGUF/resolve/main/{file}", double.url);
    let body = json!({"model": "user.Smol", "checkpoint": "org/smol-GGUF:Q4_1", "recipe": "llamacpp"});
    let (mut plain, mut lem) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for side in [rep % 2 == 0, rep % 2 != 0] {
            if side {
                let ms = timed_post(&l, "/api/v1/pull", body.clone()).await?;
                lem.push(bytes / (ms / 1e3) / 1e6);
                l.post("/api/v1/delete", &json!({"model": "user.Smol"})).await;
            } else {
                let dest = tmp.path().join("copy.gguf");
                let t = Instant::now();
                let mut out = tokio::fs::File::create(&dest).await?;
                let mut stream = http.get(&url).send().await?.bytes_stream();
                while let Some(c) = stream.next().await {
                    out.write_all(&c?).await?;
                }
                out.flush().await?;
                plain.push(bytes / t.elapsed().as_secs_f64() / 1e6);
                std::fs::remove_file(&dest)?;
            }
        }
    }
    let ratio = median(lem.iter().zip(&plain).map(|(l, p)| l / p).collect());
    let (p, lm) = (median(plain), median(lem));
    println!("\nPull of {label} ({:.0} MB) from the Hub double, {REPS} reps (medians)\n", bytes / 1e6);
    println!("| path | MB/s |");
    println!("|---|---:|");
    println!("| plain HTTP copy to a file | {p:.0} |");
    println!("| lemonade pull (HF cache layout, sha256, fsync, atomic rename) | {lm:.0} |");
    println!("| lemonade / plain (paired median) | ×{ratio:.3} |");
    Ok(json!({"reps": REPS, "bytes": bytes, "plain_mb_s": p, "lemonade_mb_s": lm, "ratio": ratio}))
}
