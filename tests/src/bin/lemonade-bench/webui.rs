//! The web UI: the embedded files' size as served (gzip) and the time from opening `/` in a
//! fresh headless Chromium to a usable page (the chat view's model list filled), on loopback.
//! The browser side is tests/py/webui_client.py's `bench` scenario.

use std::path::Path;

use serde_json::Value;
use test_support::{Lemonade, Sandbox};

const RUNS: usize = 15;

pub async fn webui(bin: &Path) -> anyhow::Result<Value> {
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--log-level", "info"], &[]).await;
    let out = test_support::py_checks("webui_client.py", &["bench", &l.base, "target/webui", &RUNS.to_string()]).await;
    let line = out.lines().find_map(|l| l.strip_prefix("BENCH ")).ok_or_else(|| anyhow::anyhow!("no result: {out}"))?;
    let v: Value = serde_json::from_str(line)?;
    let kb = |k: &str| v[k].as_f64().unwrap_or_default() / 1000.0;
    let files = v["files"].as_object().map_or(0, |f| f.len());
    println!("\nWeb UI, {RUNS} cold loads of / in headless Chromium (a fresh context each), loopback\n");
    println!("| | value |");
    println!("|---|---:|");
    println!("| the UI's files (all five views), as is | {files} files, {:.1} KB |", kb("bytes"));
    println!("| the same, gzip (as a browser gets them) | {:.1} KB |", kb("gzip"));
    println!("| document received (median) | {:.0} ms |", v["document_ms_median"].as_f64().unwrap_or_default());
    println!(
        "| DOMContentLoaded (median) | {:.0} ms |",
        v["dom_content_loaded_ms_median"].as_f64().unwrap_or_default()
    );
    println!(
        "| open `/` → usable (model list filled), median / p90 | {:.0} / {:.0} ms |",
        v["ready_ms_median"].as_f64().unwrap_or_default(),
        v["ready_ms_p90"].as_f64().unwrap_or_default()
    );
    Ok(v)
}
