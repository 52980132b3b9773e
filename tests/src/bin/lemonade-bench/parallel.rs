//! Parallel slots: aggregate decode tokens/s of 4 and 8 concurrent clients streaming SmolLM2
//! through lemonade with `parallel: 0` (auto: as many slots as the memory budget holds), with
//! `parallel` = the number of clients, with `parallel: 1` (Lemonade's pinned default after its
//! #3276) and with llama-server's own default (4 slots sharing one context), all in the same
//! run on the same server.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use test_support::{Lemonade, Sandbox, SMOL};

use crate::median;

/// Tokens each client asks for (`ignore_eos`: always that many).
const TOKENS: u32 = 48;
const REPS: usize = 3;

/// One streamed request of `tokens` tokens: (the content chunks it got, seconds to the first).
pub(crate) async fn one(http: &reqwest::Client, url: &str, tokens: u32) -> anyhow::Result<(u32, f64)> {
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Tell me about lemons."}],
                      "max_tokens": tokens, "ignore_eos": true, "stream": true});
    let t = Instant::now();
    let mut r = http.post(url).json(&body).send().await?;
    anyhow::ensure!(r.status().is_success(), "HTTP {}", r.status());
    let (mut n, mut first) = (0, None);
    while let Some(chunk) = r.chunk().await? {
        let k = String::from_utf8_lossy(&chunk).matches("\"content\":\"").count() as u32;
        if k > 0 {
            first.get_or_insert(t.elapsed().as_secs_f64());
        }
        n += k;
    }
    Ok((n, first.unwrap_or(f64::NAN)))
}

/// `clients` streams of `tokens` at once: tokens per second, all together (first request sent
/// to last token received).
pub(crate) async fn burst(http: &reqwest::Client, url: &str, clients: usize, tokens: u32) -> anyhow::Result<f64> {
    let t = Instant::now();
    let all = futures_util::future::join_all((0..clients).map(|_| one(http, url, tokens))).await;
    let got: u32 = all.into_iter().collect::<anyhow::Result<Vec<_>>>()?.iter().map(|(n, _)| n).sum();
    Ok(f64::from(got) / t.elapsed().as_secs_f64())
}

pub async fn parallel(bin: &Path) -> anyhow::Result<Value> {
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--log-level", "info"], &[]).await;
    let url = l.url("/api/v1/chat/completions");
    let mut out = serde_json::Map::new();
    println!("\nParallel slots: SmolLM2, {TOKENS} tokens per client, median of {REPS} bursts\n");
    println!("| clients | slots | aggregate tokens/s | vs parallel 1 |");
    println!("|---:|---|---:|---:|");
    for clients in [4usize, 8] {
        let mut row = serde_json::Map::new();
        let configs: [(&str, Value); 4] = [
            ("parallel_1", json!(1)),
            ("llama_server_default", Value::Null),
            ("parallel_auto", json!(0)),
            ("parallel_clients", json!(clients)),
        ];
        for (label, parallel) in configs {
            let body = json!({"model_name": SMOL, "ctx_size": 512, "parallel": parallel});
            let (s, v) = l.post("/api/v1/load", &body).await;
            anyhow::ensure!(s == 200, "load {label}: {v}");
            burst(&http, &url, 1, TOKENS).await?; // warm
            let mut tps = Vec::new();
            for _ in 0..REPS {
                tps.push(burst(&http, &url, clients, TOKENS).await?);
            }
            row.insert(label.into(), json!(median(tps)));
        }
        let base = row["parallel_1"].as_f64().unwrap_or(1.0);
        for (label, name) in [
            ("parallel_1", "`parallel: 1`".to_string()),
            ("llama_server_default", "llama-server's default (4 shared)".into()),
            ("parallel_auto", "`parallel: 0` (auto: 8 here)".into()),
            ("parallel_clients", format!("`parallel: {clients}`")),
        ] {
            let v = row[label].as_f64().unwrap_or(0.0);
            println!("| {clients} | {name} | {v:.1} | ×{:.2} |", v / base);
        }
        out.insert(format!("clients_{clients}"), Value::Object(row));
    }
    Ok(Value::Object(out))
}

/// Speculative decoding: decode tokens/s of SmolLM2 without a draft and with itself as the
/// draft (the only same-vocabulary pair the provisioned packages ship), alternating, in the
/// same run; and the share of drafted tokens accepted.
pub async fn draft(bin: &Path) -> anyhow::Result<Value> {
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--log-level", "info"], &[]).await;
    let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Count from one to twenty."}],
                      "max_tokens": 64, "temperature": 0});
    let (mut plain, mut drafted, mut accepted) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 * REPS + 2 {
        let with = i % 2 == 1;
        let load = if with { json!({"model_name": SMOL, "draft_model": SMOL}) } else { json!({"model_name": SMOL}) };
        let (s, v) = l.post("/api/v1/load", &load).await;
        anyhow::ensure!(s == 200, "load: {v}");
        let (s, c) = l.post("/api/v1/chat/completions", &body).await;
        anyhow::ensure!(s == 200, "chat: {c}");
        let t = &c["timings"];
        let tps = t["predicted_per_second"].as_f64().unwrap_or(0.0);
        if i < 2 {
            continue; // one warm-up of each
        }
        if with {
            drafted.push(tps);
            let n = t["draft_n"].as_f64().unwrap_or(0.0);
            accepted.push(if n > 0.0 { t["draft_n_accepted"].as_f64().unwrap_or(0.0) / n } else { 0.0 });
        } else {
            plain.push(tps);
        }
    }
    let (p, d, a) = (median(plain), median(drafted), median(accepted));
    println!("\nSpeculative decoding: SmolLM2, 64 tokens at temperature 0, median of {REPS} each\n");
    println!("| load | decode tokens/s | drafted tokens accepted |");
    println!("|---|---:|---:|");
    println!("| no draft | {p:.1} | |");
    println!("| `draft_model`: itself | {d:.1} (×{:.2}) | {:.0} % |", d / p, a * 100.0);
    Ok(json!({"plain_tps": p, "draft_tps": d, "ratio": d / p, "accepted": a}))
}
