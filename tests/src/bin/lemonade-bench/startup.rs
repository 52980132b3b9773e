//! Start-up with many models (`LEMONADE_BENCH_ONLY=startup`): `lemonade serve` over an extra
//! models dir of 500 GGUFs (hard links to one file holding SmolLM2's first 8 MB, its whole
//! header), timed from spawn to the first accepted connection and to the listing of all 500;
//! then five registrations, each a rescan of the same 500 unchanged files, timed by lemonade's
//! own debug line (`model catalogue rescanned … us=…`).

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::median;

const MODELS: usize = 500;
const HEADER_BYTES: u64 = 8 << 20;

pub(crate) async fn startup(bin: &std::path::Path) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let one = dir.path().join("one.gguf");
    let mut head = Vec::new();
    std::fs::File::open(test_support::model(test_support::SMOL_FILE))?.take(HEADER_BYTES).read_to_end(&mut head)?;
    std::fs::write(&one, head)?;
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models)?;
    for i in 0..MODELS {
        std::fs::hard_link(&one, models.join(format!("m{i}.gguf")))?;
    }
    let port = host::supervisor::free_port()?;
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path)?;
    let t = Instant::now();
    let mut child = std::process::Command::new(bin)
        .args(["serve", "--port", &port.to_string(), "--log-level", "debug", "--extra-models-dir"])
        .arg(&models)
        .env("LEMONADE_CACHE_DIR", dir.path().join("cache"))
        .env("HF_HOME", dir.path().join("hf"))
        // Registrations below are not downloaded: nothing listens there.
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let listening = loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break t.elapsed().as_secs_f64() * 1e3;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "lemonade never listened");
        std::thread::yield_now();
    };
    let http = reqwest::Client::builder().no_proxy().build()?;
    let base = format!("http://127.0.0.1:{port}");
    let listed: Value = http.get(format!("{base}/api/v1/models?show_all=true")).send().await?.json().await?;
    let listed_ms = t.elapsed().as_secs_f64() * 1e3;
    let extra = listed["data"]
        .as_array()
        .map_or(0, |d| d.iter().filter(|m| m["id"].as_str().is_some_and(|i| i.starts_with("extra."))).count());
    anyhow::ensure!(extra == MODELS, "{extra} extra models listed, not {MODELS}");
    for i in 0..5 {
        let body = json!({"model": format!("user.r{i}"), "checkpoint": "org/r-GGUF:Q4_0", "recipe": "llamacpp"});
        // The download fails (nothing listens at HF_ENDPOINT); the registration's rescan is done.
        let _ = http.post(format!("{base}/api/v1/pull")).json(&body).send().await?;
    }
    // SAFETY: a plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait()?;
    let text = without_ansi(&std::fs::read_to_string(&log_path)?);
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(|v| v.trim_start_matches("Some(").trim_end_matches(')').to_string())
    };
    let rescans: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| l.contains("model catalogue rescanned"))
        .filter_map(|l| {
            Some((field(l, "us=")?.parse::<f64>().ok()? / 1e3, field(l, "gguf_headers_read=")?.parse().ok()?))
        })
        .collect();
    anyhow::ensure!(rescans.len() == 6, "expected the first scan and 5 rescans: {rescans:?}");
    let (first, rest) = (rescans[0], &rescans[1..]);
    let rescan_ms = median(rest.iter().map(|r| r.0).collect());
    let reads: u64 = rest.iter().map(|r| r.1).sum();
    println!("\nStart-up with {MODELS} GGUFs in the extra models dir (hard links, 8 MB headers each)\n");
    println!("| what | time |");
    println!("|---|---:|");
    println!("| spawn to listening | {listening:.1} ms |");
    println!("| spawn to all {MODELS} listed (the first scan, in the background) | {listed_ms:.0} ms |");
    println!("| the first scan itself ({} headers read) | {:.0} ms |", first.1, first.0);
    println!("| a rescan of the {MODELS} unchanged files (median of 5; {reads} headers read) | {rescan_ms:.1} ms |");
    Ok(json!({
        "models": MODELS, "listening_ms": listening, "listed_ms": listed_ms,
        "first_scan_ms": first.0, "first_scan_headers_read": first.1,
        "rescan_ms": rescan_ms, "rescan_headers_read": reads,
    }))
}

/// `text` without its terminal colour sequences (`ESC [ … m`), as the log writes its fields.
fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
