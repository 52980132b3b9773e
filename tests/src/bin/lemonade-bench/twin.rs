//! lemonade against a twin of its own child (`LEMONADE_BENCH_ONLY=twin`). The main comparison
//! reaches lemonade's llama-server directly, so whatever lemonade does to that child costs both
//! paths alike. Here a second llama-server is started by hand with the child's exact command
//! line and environment (read from /proc), its output piped and drained as lemonade does, and
//! three paths alternate in one run: through lemonade, the child directly, the twin directly.
//! It runs twice: as lemonade starts by default, and with its watchdog off (the one thing
//! lemonade asks of an idle child: a `/health` probe every 5 s).

use std::io::BufRead;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::{child_pids, Lemonade, SMOL};

use crate::{median, stream_once, LLAMA_ARGS, RUNS};

/// A process's NUL-separated /proc file as strings.
fn proc_list(pid: u32, file: &str) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/{file}"))?;
    Ok(raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
}

/// The twin: the child's executable and arguments, with the child's environment or (`own_env`)
/// this process's, as a shell would start it; returns it and its port.
fn start_twin(child: u32, own_env: bool) -> anyhow::Result<(std::process::Child, u16)> {
    let exe = std::fs::read_link(format!("/proc/{child}/exe"))?;
    let args = proc_list(child, "cmdline")?;
    let env: Vec<(String, String)> = if own_env {
        std::env::vars().collect()
    } else {
        let vars = proc_list(child, "environ")?;
        vars.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let mut twin = std::process::Command::new(exe)
        .args(&args[1..])
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let (out, err) = (twin.stdout.take().unwrap(), twin.stderr.take().unwrap());
    // Both pipes drained line by line, as lemonade's supervisor reads its children.
    std::thread::spawn(move || for _ in std::io::BufReader::new(out).lines() {});
    let mut lines = std::io::BufReader::new(err).lines();
    let port = lines.by_ref().map_while(Result::ok).find_map(|l| host::supervisor::parse_listening_port(&l));
    std::thread::spawn(move || for _ in lines {});
    Ok((twin, port.ok_or_else(|| anyhow::anyhow!("the twin printed no port"))?))
}

/// The names of the variables in which the child's environment and this process's differ.
fn env_difference(child: u32) -> anyhow::Result<Vec<String>> {
    let theirs: std::collections::BTreeMap<String, String> = proc_list(child, "environ")?
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let ours: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let keys: std::collections::BTreeSet<&String> = theirs.keys().chain(ours.keys()).collect();
    Ok(keys.into_iter().filter(|k| theirs.get(*k) != ours.get(*k)).cloned().collect())
}

async fn one(bin: &std::path::Path, label: &str, extra: &[&str]) -> anyhow::Result<Value> {
    let mut args = vec!["--llamacpp-args", LLAMA_ARGS, "--log-level", "info"];
    args.extend_from_slice(extra);
    let l = Lemonade::start_in(bin, test_support::Sandbox::new(), &args, &[]).await;
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let via = l.url("/api/v1/chat/completions");
    stream_once(&http, &via, Some(SMOL)).await?;
    let (_, health) = l.get("/api/v1/health").await;
    let backend = health["all_models_loaded"][0]["backend_url"].as_str().unwrap_or_default().to_string();
    let child = *child_pids(l.pid()).first().ok_or_else(|| anyhow::anyhow!("no child"))?;
    let differ = env_difference(child)?;
    let (mut twin, port) = start_twin(child, false)?;
    let (mut shell_twin, shell_port) = start_twin(child, true)?;
    let twin_url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let shell_url = format!("http://127.0.0.1:{shell_port}/v1/chat/completions");
    let child_url = format!("{backend}/chat/completions");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for url in [&twin_url, &shell_url] {
        while stream_once(&http, url, None).await.is_err() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "a twin never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (mut p, mut c, mut t, mut sh) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..RUNS {
        // The four paths in a rotating order, so none is always first.
        for k in 0..4 {
            match (i + k) % 4 {
                0 => p.push(stream_once(&http, &via, Some(SMOL)).await?),
                1 => c.push(stream_once(&http, &child_url, None).await?),
                2 => t.push(stream_once(&http, &twin_url, None).await?),
                _ => sh.push(stream_once(&http, &shell_url, None).await?),
            }
        }
    }
    for t in [&mut twin, &mut shell_twin] {
        let _ = t.kill();
        let _ = t.wait();
    }
    let ttft = |a: &[crate::Sample], b: &[crate::Sample]| {
        median(a.iter().zip(b).map(|(x, y)| x.ttft_ms - y.ttft_ms).collect())
    };
    let rate = |a: &[crate::Sample], b: &[crate::Sample]| {
        median(a.iter().zip(b).map(|(x, y)| x.decode_tps / y.decode_tps).collect())
    };
    let row = json!({
        "lemonade_vs_twin": {"ttft_ms": ttft(&p, &t), "decode": rate(&p, &t)},
        "child_vs_twin": {"ttft_ms": ttft(&c, &t), "decode": rate(&c, &t)},
        "lemonade_vs_child": {"ttft_ms": ttft(&p, &c), "decode": rate(&p, &c)},
        "child_vs_twin_with_own_env": {"ttft_ms": ttft(&c, &sh), "decode": rate(&c, &sh)},
        "env_differs_in": differ,
        "twin": {"ttft_ms": median(t.iter().map(|s| s.ttft_ms).collect()), "decode_tps": median(t.iter().map(|s| s.decode_tps).collect())},
    });
    let f = |k: &str, m: &str| row[k][m].as_f64().unwrap_or_default();
    println!(
        "| {label} | {:+.2} ms, {:.3}× | {:+.2} ms, {:.3}× | {:+.2} ms, {:.3}× | {:+.2} ms, {:.3}× |",
        row["lemonade_vs_twin"]["ttft_ms"].as_f64().unwrap_or_default(),
        row["lemonade_vs_twin"]["decode"].as_f64().unwrap_or_default(),
        row["child_vs_twin"]["ttft_ms"].as_f64().unwrap_or_default(),
        row["child_vs_twin"]["decode"].as_f64().unwrap_or_default(),
        row["lemonade_vs_child"]["ttft_ms"].as_f64().unwrap_or_default(),
        row["lemonade_vs_child"]["decode"].as_f64().unwrap_or_default(),
        f("child_vs_twin_with_own_env", "ttft_ms"),
        f("child_vs_twin_with_own_env", "decode"),
    );
    println!("  (the child's environment and the bench's differ in {} variables)", differ.len());
    Ok(row)
}

/// Both configurations; TTFT differences and decode ratios are medians of paired runs.
pub(crate) async fn twin(bin: &std::path::Path) -> anyhow::Result<Value> {
    println!("\nlemonade against a twin of its child (same command line and environment), {RUNS} rounds of 3 paths\n");
    println!(
        "| lemonade | lemonade vs twin | its child direct vs twin | lemonade vs its child | its child vs a twin with the bench's environment |"
    );
    println!("|---|---:|---:|---:|---:|");
    let default = one(bin, "as started by default", &[]).await?;
    let no_watchdog = one(bin, "watchdog off", &["--watchdog-interval-ms", "0"]).await?;
    Ok(json!({"default": default, "watchdog_off": no_watchdog}))
}
