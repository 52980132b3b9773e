//! Three lemonade nodes behind vllm-router against one node, on this machine: aggregate
//! decode tokens/s of concurrent streaming clients, and the time to first token the router
//! adds. On 2 cores three nodes share the same CPUs, so this measures the router's overhead
//! and that nothing is lost through it, not the capacity more machines would bring.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use host::supervisor::free_port;
use serde_json::{json, Value};
use test_support::{wait_for, Lemonade, Sandbox, SMOL};

use crate::median;
use crate::parallel::{burst, one};
use crate::scaling::Killed;

const TOKENS: u32 = 32;
const CLIENTS: usize = 6;
const REPS: usize = 3;
const TTFT_REPS: usize = 10;

pub async fn router(bin: &Path) -> anyhow::Result<Value> {
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let l = Lemonade::start_in(bin, Sandbox::new(), &["--log-level", "info"], &[]).await;
        let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "ctx_size": 512, "parallel": 2})).await;
        anyhow::ensure!(s == 200, "load: {v}");
        nodes.push(l);
    }
    let exe = test_support::python().with_file_name("vllm-router");
    let port = free_port()?;
    let mut cmd = Command::new(&exe);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--policy", "round_robin", "--log-level", "warning"])
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &free_port()?.to_string(), "--worker-urls"])
        .args(nodes.iter().map(|l| l.url("")))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _router = Killed(cmd.spawn().map_err(|e| anyhow::anyhow!("{}: {e}", exe.display()))?);
    let base = format!("http://127.0.0.1:{port}");
    let up = wait_for(Duration::from_secs(60), || async {
        http.get(format!("{base}/get_loads")).send().await.ok().filter(|r| r.status() == 200).map(|_| ())
    })
    .await;
    anyhow::ensure!(up.is_some(), "vllm-router did not start");
    let direct = nodes[0].url("/v1/chat/completions");
    let routed = format!("{base}/v1/chat/completions");
    for url in [&direct, &routed, &routed, &routed] {
        one(&http, url, 4).await?; // warm every node
    }
    let mut ttft = [Vec::new(), Vec::new()];
    for _ in 0..TTFT_REPS {
        for (i, url) in [&direct, &routed].into_iter().enumerate() {
            ttft[i].push(one(&http, url, 4).await?.1 * 1000.0);
        }
    }
    let mut tps = [Vec::new(), Vec::new()];
    for _ in 0..REPS {
        for (i, url) in [&direct, &routed].into_iter().enumerate() {
            tps[i].push(burst(&http, url, CLIENTS, TOKENS).await?);
        }
    }
    // One node with as many slots as the three together (6), so slots are not what differs.
    let six = json!({"model_name": SMOL, "ctx_size": 512, "parallel": 6});
    let (s, v) = nodes[0].post("/api/v1/load", &six).await;
    anyhow::ensure!(s == 200, "load parallel 6: {v}");
    one(&http, &direct, 4).await?;
    let mut wide = Vec::new();
    for _ in 0..REPS {
        wide.push(burst(&http, &direct, CLIENTS, TOKENS).await?);
    }
    let [t1, t3] = ttft.map(median);
    let [one_node, three] = tps.map(median);
    let one_wide = median(wide);
    println!("\nThree nodes behind vllm-router vs one node: SmolLM2, {CLIENTS} clients × {TOKENS} tokens (median of {REPS}); TTFT median of {TTFT_REPS} single streams\n");
    println!("| | one node, 2 slots | one node, 6 slots | three nodes × 2 slots behind vllm-router |");
    println!("|---|---:|---:|---:|");
    println!(
        "| aggregate tokens/s | {one_node:.1} | {one_wide:.1} | {three:.1} (×{:.2} of one node with 6 slots) |",
        three / one_wide
    );
    println!("| time to first token (ms) | {t1:.1} | | {t3:.1} (+{:.1} ms) |", t3 - t1);
    Ok(json!({"one_node_tps": one_node, "one_node_6_slots_tps": one_wide, "three_nodes_tps": three,
              "ttft_direct_ms": t1, "ttft_router_ms": t3}))
}
