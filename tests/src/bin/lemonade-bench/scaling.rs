//! Beyond one machine: streaming through lemonade to a remote provider against the same
//! engine direct (added time to first token, decode ratio), and a model's decode rate over
//! two llama.cpp RPC workers on loopback against the same model local.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use test_support::{model, Lemonade, Sandbox, SMOL_FILE};

use crate::{median, stream_once, RUNS};

/// A child process killed (and reaped) when dropped.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Paired runs of `a` and `b` (alternating which goes first): (median TTFT ms of each, median
/// of the paired TTFT differences b − a, median of the paired decode ratios b ÷ a, median
/// decode tokens/s of each).
async fn paired(
    http: &reqwest::Client,
    a: (&str, Option<&str>),
    b: (&str, Option<&str>),
    runs: usize,
) -> anyhow::Result<Value> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..runs {
        if i % 2 == 0 {
            x.push(stream_once(http, a.0, a.1).await?);
            y.push(stream_once(http, b.0, b.1).await?);
        } else {
            y.push(stream_once(http, b.0, b.1).await?);
            x.push(stream_once(http, a.0, a.1).await?);
        }
    }
    Ok(json!({
        "a_ttft_ms": median(x.iter().map(|s| s.ttft_ms).collect()),
        "b_ttft_ms": median(y.iter().map(|s| s.ttft_ms).collect()),
        "added_ttft_ms": median(x.iter().zip(&y).map(|(p, q)| q.ttft_ms - p.ttft_ms).collect()),
        "decode_ratio": median(x.iter().zip(&y).map(|(p, q)| q.decode_tps / p.decode_tps).collect()),
        "a_decode_tps": median(x.iter().map(|s| s.decode_tps).collect()),
        "b_decode_tps": median(y.iter().map(|s| s.decode_tps).collect()),
    }))
}

/// The Markdown table of [`paired`]'s figures: path a, path b, then b against a.
fn table(labels: [&str; 3], v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    println!("| path | TTFT (ms, median) | decode tokens/s (median) |");
    println!("|---|---:|---:|");
    println!("| {} | {:.2} | {:.1} |", labels[0], f("a_ttft_ms"), f("a_decode_tps"));
    println!("| {} | {:.2} | {:.1} |", labels[1], f("b_ttft_ms"), f("b_decode_tps"));
    println!("| {} (median of paired runs) | {:+.2} ms | {:.3}× |", labels[2], f("added_ttft_ms"), f("decode_ratio"));
}

pub async fn scaling(bin: &Path) -> anyhow::Result<Value> {
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let smol = model(SMOL_FILE);

    // A remote provider: llama-server by hand (lemonade's command line), registered as `vllm`.
    let (engine, _, port) = crate::start_args_by_hand(&http, crate::llama_command_line(&smol)?).await?;
    let engine = Killed(engine);
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--log-level", "info"], &[]).await;
    let install = json!({"recipe": "cloud", "backend": "vllm", "base_url": format!("http://127.0.0.1:{port}")});
    let (s, v) = l.post("/api/v1/install", &install).await;
    anyhow::ensure!(s == 200, "install: {v}");
    let direct = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let via = l.url("/api/v1/chat/completions");
    stream_once(&http, &via, Some("vllm.bench")).await?;
    let remote = paired(&http, (&direct, None), (&via, Some("vllm.bench")), RUNS).await?;
    drop((l, engine));
    println!("\nRemote provider: SmolLM2 on llama-server as the upstream, {RUNS} paired runs\n");
    table(["the engine direct", "through lemonade (`vllm.bench`)", "lemonade vs direct"], &remote);

    // RPC: the same model on two rpc-servers (127.0.0.1) against it local, one at a time.
    let rpc = test_support::llama_server().with_file_name("rpc-server");
    let rpc = std::env::var_os("LEMONADE_TEST_RPC_SERVER").map(Into::into).unwrap_or(rpc);
    let mut workers = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let p = host::supervisor::free_port()?;
        let child = Command::new(&rpc)
            .args(["-H", "127.0.0.1", "-p", &p.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        workers.push(Killed(child));
        let addr = format!("127.0.0.1:{p}");
        let t = std::time::Instant::now();
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(20), "rpc-server on {addr} did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        addrs.push(addr);
    }
    let (local, _, lp) = crate::start_args_by_hand(&http, crate::llama_command_line(&smol)?).await?;
    let local = Killed(local);
    let local_url = format!("http://127.0.0.1:{lp}/v1/chat/completions");
    stream_once(&http, &local_url, None).await?;
    let (over, _, rp) = crate::start_args_by_hand(&http, crate::llama_command_line_rpc(&smol, addrs.clone())?).await?;
    let over = Killed(over);
    let rpc_url = format!("http://127.0.0.1:{rp}/v1/chat/completions");
    stream_once(&http, &rpc_url, None).await?;
    let runs = RUNS / 2;
    let rpc_figures = paired(&http, (&local_url, None), (&rpc_url, None), runs).await?;
    drop((over, local, workers));
    println!("\nllama.cpp RPC: SmolLM2 with every layer on 2 rpc-servers on loopback (1 thread each) vs local, {runs} paired runs\n");
    table(["local llama-server", "over 2 RPC workers", "RPC vs local"], &rpc_figures);
    Ok(json!({"remote": remote, "rpc": rpc_figures, "rpc_workers": addrs}))
}
