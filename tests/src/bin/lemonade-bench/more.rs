//! The benchmark sections beyond single-stream streaming: concurrency against direct
//! llama-server and llama-server's router mode, swaps against router mode, lemonade's own
//! footprint, and the throughput of `health` and `models`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::Lemonade;

use crate::{median, stream_once};

/// llama-server's own multi-model router (`--models-dir`, `--models-max`), with the same model
/// flags lemonade gives its children.
pub struct Router {
    pub child: Child,
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Router {
    pub async fn start(models: &[(&str, PathBuf)], max: u32) -> anyhow::Result<Router> {
        let dir = tempfile::tempdir()?;
        for (name, file) in models {
            std::os::unix::fs::symlink(file, dir.path().join(format!("{name}.gguf")))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new(test_support::llama_server())
            .args(["--models-dir", &dir.path().display().to_string(), "--models-max", &max.to_string()])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(model_flags()?)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder().no_proxy().build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if matches!(http.get(format!("{base}/v1/models")).send().await, Ok(r) if r.status() == 200) {
                break;
            }
            if Instant::now() > deadline || child.try_wait()?.is_some() {
                let _ = child.kill();
                anyhow::bail!("llama-server router mode did not start");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Router { child, base, _dir: dir })
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        // SAFETY: plain syscall on our own child; the router stops its children on SIGTERM.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// The flags lemonade passes to llama-server for an LLM, minus those the router sets per child
/// (model, host, port): the three paths run the same model configuration.
fn model_flags() -> anyhow::Result<Vec<String>> {
    let args = crate::llama_command_line(std::path::Path::new("x.gguf"))?;
    let mut out = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if matches!(a.as_str(), "-m" | "--model" | "--port" | "--host" | "--alias") {
            it.next();
        } else {
            out.push(a);
        }
    }
    Ok(out)
}

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit_once(')').map(|x| x.1).unwrap_or_default().split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Resident memory of a process in MiB.
fn rss_mib(pid: u32) -> f64 {
    host::hardware::process_rss(pid).unwrap_or(0) as f64 / (1u64 << 20) as f64
}

struct Batch {
    /// Content tokens per second over the batch's wall time.
    tps: f64,
    ttft_ms: f64,
    tokens: usize,
}

/// `n` concurrent streams to `url`.
async fn batch(http: &reqwest::Client, url: &str, model: Option<&str>, n: usize) -> anyhow::Result<Batch> {
    let t = Instant::now();
    let runs = futures_util::future::join_all((0..n).map(|_| stream_once(http, url, model))).await;
    let wall = t.elapsed().as_secs_f64();
    let mut tokens = 0;
    let mut ttfts = Vec::new();
    for r in runs {
        let s = r?;
        tokens += s.tokens;
        ttfts.push(s.ttft_ms);
    }
    Ok(Batch { tps: tokens as f64 / wall, ttft_ms: median(ttfts), tokens })
}

/// Aggregate decode throughput and TTFT at 1, 4 and 16 concurrent streams: direct llama-server,
/// through lemonade, through llama-server's router mode. Also lemonade's CPU time per token.
pub async fn concurrency(l: &Lemonade, direct: &str, router: &Router, router_model: &str) -> anyhow::Result<Value> {
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_max_idle_per_host(0).build()?;
    let via = l.url("/api/v1/chat/completions");
    let routed = format!("{}/v1/chat/completions", router.base);
    // Warm the router's child (its first request loads the model).
    stream_once(&http, &routed, Some(router_model)).await?;
    let mut rows = Vec::new();
    let (mut cpu, mut proxied) = (0.0, 0usize);
    println!("\nConcurrent streams ({} tokens each): aggregate decode tokens/s and median TTFT\n", crate::MAX_TOKENS);
    println!("| streams | direct tok/s | lemonade tok/s | router tok/s | lemonade / direct | router / direct | TTFT direct / lemonade / router (ms) |");
    println!("|---:|---:|---:|---:|---:|---:|---|");
    for (n, reps) in [(1usize, 6usize), (4, 4), (16, 2)] {
        let (mut d, mut p, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            // Rotate the order of the three paths.
            for k in 0..3 {
                match (rep + k) % 3 {
                    0 => d.push(batch(&http, direct, None, n).await?),
                    1 => {
                        let c0 = cpu_seconds(l.pid());
                        let b = batch(&http, &via, Some(test_support::SMOL), n).await?;
                        cpu += cpu_seconds(l.pid()) - c0;
                        proxied += b.tokens;
                        p.push(b);
                    }
                    _ => r.push(batch(&http, &routed, Some(router_model), n).await?),
                }
            }
        }
        let ratio = |a: &[Batch]| median(a.iter().zip(&d).map(|(x, y)| x.tps / y.tps).collect());
        let (lr, rr) = (ratio(&p), ratio(&r));
        let med = |a: &[Batch], f: fn(&Batch) -> f64| median(a.iter().map(f).collect());
        let row = json!({
            "streams": n, "reps": reps,
            "direct": {"tps": med(&d, |b| b.tps), "ttft_ms": med(&d, |b| b.ttft_ms)},
            "lemonade": {"tps": med(&p, |b| b.tps), "ttft_ms": med(&p, |b| b.ttft_ms)},
            "router": {"tps": med(&r, |b| b.tps), "ttft_ms": med(&r, |b| b.ttft_ms)},
            "lemonade_over_direct": lr, "router_over_direct": rr,
        });
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} | ×{lr:.3} | ×{rr:.3} | {:.1} / {:.1} / {:.1} |",
            row["direct"]["tps"].as_f64().unwrap_or(0.0),
            row["lemonade"]["tps"].as_f64().unwrap_or(0.0),
            row["router"]["tps"].as_f64().unwrap_or(0.0),
            row["direct"]["ttft_ms"].as_f64().unwrap_or(0.0),
            row["lemonade"]["ttft_ms"].as_f64().unwrap_or(0.0),
            row["router"]["ttft_ms"].as_f64().unwrap_or(0.0),
        );
        rows.push(row);
    }
    let us_per_token = cpu / proxied.max(1) as f64 * 1e6;
    println!("\nlemonade CPU time per proxied token: {us_per_token:.1} µs ({proxied} tokens)");
    Ok(json!({"rows": rows, "lemonade_cpu_us_per_token": us_per_token, "tokens_proxied": proxied}))
}

/// Time of a 1-token chat for `model` (which makes the server load it, evicting the other).
async fn one_token(http: &reqwest::Client, url: &str, model: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let r = http
        .post(url)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}))
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "{url} {model}: HTTP {}", r.status());
    r.bytes().await?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Swaps with one slot, A→B→A, each timed as the 1-token request that causes it: lemonade
/// against llama-server's router mode with `--models-max 1`.
pub async fn swaps(l: &Lemonade, router: &Router) -> anyhow::Result<Value> {
    const REPS: usize = 4;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let via = l.url("/api/v1/chat/completions");
    let routed = format!("{}/v1/chat/completions", router.base);
    let (a, b) = (test_support::SMOL, test_support::GEMMA);
    one_token(&http, &via, a).await?;
    one_token(&http, &routed, "smol").await?;
    let (mut lem, mut rou) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for side in [rep % 2 == 0, rep % 2 != 0] {
            if side {
                lem.push(one_token(&http, &via, b).await? + one_token(&http, &via, a).await?);
            } else {
                rou.push(one_token(&http, &routed, "gemma").await? + one_token(&http, &routed, "smol").await?);
            }
        }
    }
    let ratio = median(lem.iter().zip(&rou).map(|(l, r)| l / r).collect());
    let (lm, rm) = (median(lem), median(rou));
    println!("\nSwap A→B→A with one slot (SmolLM2 → Gemma 270M → SmolLM2, two 1-token requests), {REPS} reps\n");
    println!("| server | A→B→A (ms, median) |");
    println!("|---|---:|");
    println!("| llama-server router mode (--models-max 1) | {rm:.0} |");
    println!("| lemonade (--max-loaded-models 1) | {lm:.0} |");
    println!("| lemonade / router (paired median) | ×{ratio:.3} |");
    Ok(json!({"reps": REPS, "router_ms": rm, "lemonade_ms": lm, "ratio": ratio}))
}

/// Idle RSS, RSS with 1,000 idle streaming connections (`logs/stream`), cold start to
/// listening.
pub async fn footprint(bin: &Path) -> anyhow::Result<Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CONNS: usize = 1000;
    let l = Lemonade::start_in(bin, test_support::Sandbox::new(), &["--log-level", "info"], &[]).await;
    let http = reqwest::Client::builder().no_proxy().build()?;
    // Settle: one request of each kind the idle figure should include.
    http.get(l.url("/api/v1/models")).send().await?.bytes().await?;
    http.get(l.url("/api/v1/health")).send().await?.bytes().await?;
    let idle = rss_mib(l.pid());
    let addr = l.base.trim_start_matches("http://").to_string();
    let mut conns = Vec::with_capacity(CONNS);
    for _ in 0..CONNS {
        let mut s = tokio::net::TcpStream::connect(&addr).await?;
        s.write_all(b"GET /api/v1/logs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await?;
        conns.push(s);
    }
    // Every stream answered (its headers and the first lines arrived).
    for s in &mut conns {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await??;
        anyhow::ensure!(n > 0 && buf.starts_with(b"HTTP/1.1 200"), "a logs/stream connection was not answered");
    }
    let loaded = rss_mib(l.pid());
    drop(conns);
    let mut starts = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let l2 = Lemonade::start_in(bin, test_support::Sandbox::empty(), &["--log-level", "info"], &[]).await;
        starts.push(t.elapsed().as_secs_f64() * 1e3);
        drop(l2);
    }
    let start_ms = median(starts);
    println!("\nlemonade's footprint\n");
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| RSS idle (catalogue loaded, nothing running) | {idle:.1} MiB |");
    println!(
        "| RSS with {CONNS} idle streaming connections | {loaded:.1} MiB (+{:.1} KiB per connection) |",
        (loaded - idle) * 1024.0 / CONNS as f64
    );
    println!("| cold start to listening (median of 5) | {start_ms:.0} ms |");
    Ok(json!({"rss_idle_mib": idle, "rss_1000_streams_mib": loaded, "connections": CONNS, "cold_start_ms": start_ms}))
}

/// Requests per second and latency of `GET url` from `conc` keep-alive clients for `secs`
/// (bounded in time and count).
async fn hammer(url: &str, conc: usize, secs: f64) -> anyhow::Result<(f64, f64, f64)> {
    const MAX: usize = 400_000;
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let t = Instant::now();
    let tasks = (0..conc).map(|_| {
        let http = http.clone();
        let url = url.to_string();
        tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline && lat.len() < MAX / conc {
                let t = Instant::now();
                let r = http.get(&url).send().await?;
                anyhow::ensure!(r.status().is_success(), "{url}: HTTP {}", r.status());
                r.bytes().await?;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
            }
            Ok::<_, anyhow::Error>(lat)
        })
    });
    let mut all = Vec::new();
    for r in futures_util::future::join_all(tasks).await {
        all.extend(r??);
    }
    let rps = all.len() as f64 / t.elapsed().as_secs_f64();
    all.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    Ok((rps, p(0.5), p(0.99)))
}

/// Throughput of `health`, `models`, `live` and `/metrics` (and llama-server's own `/health`
/// for scale).
pub async fn endpoints(l: &Lemonade, direct_base: &str) -> anyhow::Result<Value> {
    const CONC: usize = 32;
    const SECS: f64 = 3.0;
    println!("\nNon-inference endpoints: {CONC} keep-alive clients for {SECS} s each (loopback, same machine)\n");
    println!("| endpoint | requests/s | p50 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|");
    let mut out = serde_json::Map::new();
    for (label, url) in [
        ("lemonade GET /api/v1/health", l.url("/api/v1/health")),
        ("lemonade GET /api/v1/models", l.url("/api/v1/models")),
        ("lemonade GET /live", l.url("/live")),
        ("lemonade GET /metrics", l.url("/metrics")),
        ("llama-server GET /health (for scale)", format!("{direct_base}/health")),
    ] {
        let (rps, p50, p99) = hammer(&url, CONC, SECS).await?;
        println!("| {label} | {rps:.0} | {p50:.2} | {p99:.2} |");
        out.insert(label.into(), json!({"rps": rps, "p50_ms": p50, "p99_ms": p99}));
    }
    Ok(Value::Object(out))
}

/// The "alternating clients" workload of scheduler v2: two clients, each sending short requests
/// (8 tokens) one after another to its own model (SmolLM2 and Gemma 270M), with one LLM slot,
/// for `ALT_SECS` each against lemonade with the anti-thrash hold (default 2 s), lemonade
/// without it (`--swap-hold-ms 0`) and llama-server's router mode (`--models-max 1`). Swaps are
/// counted as the backend processes started (the server's children, sampled every 20 ms; a
/// start takes far longer than that).
pub async fn alternating(bin: &Path) -> anyhow::Result<Value> {
    const ALT_SECS: u64 = 40;
    let mut rows = Vec::new();
    for (label, hold) in [
        ("lemonade, anti-thrash on (2 s)", Some("2000")),
        ("lemonade, anti-thrash off", Some("0")),
        ("router mode", None),
    ] {
        let (pid, url, models, _keep): (u32, String, [&str; 2], Box<dyn std::any::Any>) = match hold {
            Some(h) => {
                let l = Lemonade::start_in(
                    bin,
                    test_support::Sandbox::new(),
                    &["--llamacpp-args", crate::LLAMA_ARGS, "--log-level", "info", "--swap-hold-ms", h],
                    &[],
                )
                .await;
                (l.pid(), l.url("/api/v1/chat/completions"), [test_support::SMOL, test_support::GEMMA], Box::new(l))
            }
            None => {
                let r = Router::start(
                    &[
                        ("smol", test_support::model(test_support::SMOL_FILE)),
                        ("gemma", test_support::model(test_support::GEMMA_FILE)),
                    ],
                    1,
                )
                .await?;
                (r.child.id(), format!("{}/v1/chat/completions", r.base), ["smol", "gemma"], Box::new(r))
            }
        };
        let http = reqwest::Client::builder().no_proxy().build()?;
        one_token(&http, &url, models[0]).await?;
        let end = Instant::now() + Duration::from_secs(ALT_SECS);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
        let sampler = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while Instant::now() < end {
                    seen.lock().unwrap().extend(test_support::child_pids(pid));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let before = test_support::child_pids(pid).len();
        let clients = models.map(|m| {
            let (http, url, m) = (http.clone(), url.clone(), m.to_string());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, 0u32);
                while Instant::now() < end {
                    let body =
                        json!({"model": m, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8});
                    match http.post(&url).json(&body).send().await {
                        Ok(r) if r.status().is_success() => {
                            let _ = r.bytes().await;
                            ok += 1;
                        }
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            })
        });
        let mut done = Vec::new();
        for c in clients {
            done.push(c.await?);
        }
        sampler.await?;
        let starts = seen.lock().unwrap().len().saturating_sub(before) as f64;
        let minutes = ALT_SECS as f64 / 60.0;
        let ok: u32 = done.iter().map(|d| d.0).sum();
        let failed: u32 = done.iter().map(|d| d.1).sum();
        rows.push(json!({"server": label, "completed_per_min": ok as f64 / minutes, "swaps_per_min": starts / minutes,
                         "per_client": [done[0].0, done[1].0], "failed": failed}));
    }
    println!("\nAlternating clients: two clients, 8-token requests back to back, one to SmolLM2 and one to Gemma 270M, one LLM slot, {ALT_SECS} s each\n");
    println!("| server | completed requests / min | swaps / min | per client (SmolLM2, Gemma) | failed |");
    println!("|---|---:|---:|---|---:|");
    for r in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {}, {} | {} |",
            r["server"].as_str().unwrap_or_default(),
            r["completed_per_min"].as_f64().unwrap_or_default(),
            r["swaps_per_min"].as_f64().unwrap_or_default(),
            r["per_client"][0],
            r["per_client"][1],
            r["failed"]
        );
    }
    Ok(json!({"secs": ALT_SECS, "rows": rows}))
}

/// The ledger against what each backend's process holds (VmRSS): every kind of backend is
/// loaded with lemonade's defaults, then given `storm` requests, each different (distinct
/// prompts of about 1,400 tokens, one token generated, for the LLMs: what fills llama-server's
/// host prompt cache), and its RSS is read beside the estimate `/api/v1/scheduler` counts for
/// it at load and after every third of the storm.
pub async fn memory_estimate(bin: &Path) -> anyhow::Result<Value> {
    let storm: usize = std::env::var("LEMONADE_BENCH_STORM").ok().and_then(|n| n.parse().ok()).unwrap_or(60);
    let sandbox = test_support::Sandbox::new().with_whisper().with_sd().with_kokoro();
    let l = Lemonade::start_in(bin, sandbox, &["--max-loaded-models", "-1", "--log-level", "info"], &[]).await;
    let wav = crate::modalities::espeak_passage(l.sandbox.dir.path())?.0;
    let mut rows = Vec::new();
    let kinds = [
        (test_support::SMOL, "llama-server (LLM)"),
        (test_support::GEMMA, "llama-server (LLM)"),
        (test_support::MINILM, "llama-server (embedding)"),
        (test_support::WHISPER, "whisper-server"),
        (test_support::SD, "sd-server"),
        (test_support::KOKORO, "koko"),
    ];
    for (model, kind) in kinds {
        // SmolLM2 takes the whole storm (the table); the slower kinds a third (Gemma
        // prefills 1,400 tokens in seconds on one thread), an image a tenth.
        let n = match model {
            test_support::SMOL | test_support::MINILM => storm,
            test_support::SD => (storm / 10).max(3),
            _ => (storm / 3).max(3),
        };
        let mut steps = Vec::new();
        let before = test_support::child_pids(l.pid());
        for i in 0..=n {
            one_request(&l, model, i, &wav).await?;
            if i == 0 || i % (n / 3).max(1) == 0 {
                let pid =
                    test_support::child_pids(l.pid()).into_iter().find(|p| !before.contains(p)).unwrap_or_default();
                let rss = host::hardware::process_rss(pid).unwrap_or(0);
                let (_, s) = l.get("/api/v1/scheduler").await;
                let m = s["models"].as_array().and_then(|a| a.iter().find(|m| m["model_name"] == model)).cloned();
                let m = m.unwrap_or_default();
                steps.push(json!({"after": i, "rss": rss, "estimate": m["estimate_memory_bytes"],
                                  "counted": m["memory_bytes"], "prompt_cache": m["prompt_cache_bytes"]}));
            }
        }
        rows.push(json!({"model": model, "kind": kind, "steps": steps}));
    }
    println!("\nEach backend's RSS against the ledger, after distinct requests (lemonade's defaults)\n");
    println!("| backend | model | requests | RSS (MiB) | estimate (MiB) | of which prompt cache | counted (MiB) | RSS / counted |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mib = |v: &Value| v.as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64;
    for r in &rows {
        for st in r["steps"].as_array().into_iter().flatten() {
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} |",
                r["kind"].as_str().unwrap_or_default(),
                r["model"].as_str().unwrap_or_default(),
                st["after"],
                mib(&st["rss"]),
                mib(&st["estimate"]),
                mib(&st["prompt_cache"]),
                mib(&st["counted"]),
                mib(&st["rss"]) / mib(&st["counted"]).max(f64::MIN_POSITIVE),
            );
        }
    }
    Ok(json!(rows))
}

/// The `i`th distinct request of the memory storm to `model`.
async fn one_request(l: &Lemonade, model: &str, i: usize, wav: &[u8]) -> anyhow::Result<()> {
    // About 1,400 tokens of SmolLM2's tokenizer (240 words of 6 tokens), different from the
    // first word on; 60 words for MiniLM, whose context is 512 tokens.
    let words = |n: usize| (0..n).map(|w| format!("n{i}w{w}")).collect::<Vec<_>>().join(" ");
    let (s, v) = match model {
        test_support::MINILM => l.post("/api/v1/embeddings", &json!({"model": model, "input": words(60)})).await,
        test_support::WHISPER => {
            let form = reqwest::multipart::Form::new()
                .part("file", reqwest::multipart::Part::bytes(wav.to_vec()).file_name("passage.wav"))
                .text("model", model.to_string());
            let r = l.http.post(l.url("/api/v1/audio/transcriptions")).multipart(form).send().await?;
            (r.status().as_u16(), r.json().await?)
        }
        test_support::SD => {
            let body = json!({"model": model, "prompt": format!("a lemon, take {i}"), "size": "256x256", "steps": 1, "seed": i});
            l.post("/api/v1/images/generations", &body).await
        }
        test_support::KOKORO => {
            let body = json!({"model": model, "input": format!("Request number {i} of the storm."), "voice": "jf_alpha", "response_format": "wav"});
            let r = l.http.post(l.url("/api/v1/audio/speech")).json(&body).send().await?;
            let status = r.status().as_u16();
            let _ = r.bytes().await?;
            (status, json!({}))
        }
        _ => {
            let body = json!({"model": model, "messages": [{"role": "user", "content": words(240)}], "max_tokens": 1});
            l.post("/api/v1/chat/completions", &body).await
        }
    };
    anyhow::ensure!(s == 200, "{model} request {i}: {s} {v}");
    Ok(())
}

/// How a dialect's stream is framed, and which of its events carries a token of content.
#[derive(Clone, Copy)]
enum Dialect {
    OpenAi,
    Ollama,
    Anthropic,
}

impl Dialect {
    fn path(self) -> &'static str {
        match self {
            Dialect::OpenAi => "/v1/chat/completions",
            Dialect::Ollama => "/api/chat",
            Dialect::Anthropic => "/v1/messages",
        }
    }

    /// The same greedy request of `max` tokens, in this dialect.
    fn body(self, model: &str, max: u32) -> Value {
        let messages = json!([{"role": "user", "content": "Write a story about a lighthouse keeper."}]);
        match self {
            Dialect::OpenAi => {
                json!({"model": model, "messages": messages, "max_tokens": max, "temperature": 0, "stream": true})
            }
            Dialect::Ollama => json!({"model": model, "messages": messages, "stream": true,
                                      "options": {"num_predict": max, "temperature": 0}}),
            Dialect::Anthropic => {
                json!({"model": model, "messages": messages, "max_tokens": max, "temperature": 0, "stream": true})
            }
        }
    }

    /// Whether one event's JSON carries content.
    fn is_content(self, v: &Value) -> bool {
        let text = match self {
            Dialect::OpenAi => &v["choices"][0]["delta"]["content"],
            Dialect::Ollama => &v["message"]["content"],
            Dialect::Anthropic => &v["delta"]["text"],
        };
        text.as_str().is_some_and(|t| !t.is_empty())
    }
}

/// One streamed request in `d`'s dialect: time to the first content and decode rate, taken at
/// the client as events arrive (SSE `data:` lines, or NDJSON lines).
async fn stream_dialect(http: &reqwest::Client, base: &str, d: Dialect, model: &str) -> anyhow::Result<(f64, f64)> {
    use futures_util::StreamExt;
    let start = Instant::now();
    let resp = http.post(format!("{base}{}", d.path())).json(&d.body(model, 128)).send().await?;
    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
    let mut stream = resp.bytes_stream();
    let (mut buf, mut first, mut last, mut tokens) = (String::new(), None, None, 0usize);
    while let Some(chunk) = stream.next().await {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..end + 1).collect();
            let data = line.trim().strip_prefix("data: ").unwrap_or(line.trim());
            if serde_json::from_str::<Value>(data).is_ok_and(|v| d.is_content(&v)) {
                tokens += 1;
                first.get_or_insert(now);
                last = Some(now);
            }
        }
    }
    let (first, last) = (first.ok_or_else(|| anyhow::anyhow!("no content"))?, last.unwrap());
    let decode = (last - first).as_secs_f64();
    Ok(((first - start).as_secs_f64() * 1e3, if decode > 0.0 { (tokens - 1) as f64 / decode } else { 0.0 }))
}

/// The dialects' cost: the same greedy streaming chat through `/api/chat` (Ollama) and
/// `/v1/messages` (Anthropic), each against `/v1/chat/completions` run next to it, on one
/// lemonade and one llama-server. Reported: medians of the paired differences in time to
/// first token and of the paired decode-rate ratios.
pub async fn dialects(bin: &Path) -> anyhow::Result<Value> {
    const RUNS: usize = 30;
    let args = ["--llamacpp-args", crate::LLAMA_ARGS, "--log-level", "info"];
    let l = Lemonade::start_in(bin, test_support::Sandbox::new(), &args, &[]).await;
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let model = test_support::SMOL;
    for d in [Dialect::OpenAi, Dialect::Ollama, Dialect::Anthropic] {
        stream_dialect(&http, &l.base, d, model).await?; // warm up
    }
    let mut out = json!({"runs": RUNS, "max_tokens": 128});
    println!("\nDialects: streaming chat, SmolLM2-135M Q4_1, 128 tokens, {RUNS} paired runs each\n");
    println!("| path | added TTFT vs /v1/chat/completions (ms, median) | decode rate ÷ /v1/chat/completions |");
    println!("|---|---:|---:|");
    for (name, d) in [("ollama /api/chat", Dialect::Ollama), ("anthropic /v1/messages", Dialect::Anthropic)] {
        let (mut added, mut ratio) = (Vec::new(), Vec::new());
        for i in 0..RUNS {
            // Alternate which goes first.
            let (a, b) = if i % 2 == 0 {
                let a = stream_dialect(&http, &l.base, Dialect::OpenAi, model).await?;
                (a, stream_dialect(&http, &l.base, d, model).await?)
            } else {
                let b = stream_dialect(&http, &l.base, d, model).await?;
                (stream_dialect(&http, &l.base, Dialect::OpenAi, model).await?, b)
            };
            added.push(b.0 - a.0);
            ratio.push(b.1 / a.1);
        }
        let (added, ratio) = (median(added), median(ratio));
        println!("| {name} | {added:+.2} | {ratio:.3}× |");
        out[name] = json!({"added_ttft_ms": added, "decode_ratio": ratio});
    }
    Ok(out)
}
