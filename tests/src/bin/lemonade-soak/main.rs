//! `cargo xtask soak`: the reliability suite. Faults (killed, stopped and never-ready backends,
//! a full disk, lemonade itself killed mid-pull and mid-registration), load (500 concurrent
//! requests over three one-slot models with random disconnects, invariants sampled on the live
//! server) and bad input (a hand-written corpus against every endpoint, then schemathesis
//! against the OpenAPI document). Every loop is bounded in count and time; loopback only.
//! Prints one table and writes target/soak.json.

mod badinput;
mod faults;
mod load;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One scenario's outcome.
pub struct Row {
    pub area: &'static str,
    pub scenario: String,
    pub trials: usize,
    pub held: usize,
    pub note: String,
    /// Not run here (what it needs is missing); `note` says why.
    pub skipped: bool,
    /// Whether the CI subset may skip it (it needs what only `cargo xtask soak` installs).
    pub optional_in_ci: bool,
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn add(&mut self, area: &'static str, scenario: &str, trials: usize, held: usize, note: impl Into<String>) {
        let note = note.into();
        println!("[{area}] {scenario}: {held}/{trials} held. {note}");
        let (skipped, optional_in_ci) = (false, false);
        self.rows.push(Row { area, scenario: scenario.into(), trials, held, note, skipped, optional_in_ci });
    }

    /// A scenario that cannot run here, and why. A skipped row fails the soak unless it is
    /// `optional_in_ci` and this is the CI subset: a scenario never passes by not running.
    pub fn skip(&mut self, area: &'static str, scenario: &str, why: &str, optional_in_ci: bool) {
        println!("[{area}] {scenario}: SKIPPED: {why}");
        let note = format!("skipped: {why}");
        self.rows.push(Row {
            area,
            scenario: scenario.into(),
            trials: 0,
            held: 0,
            note,
            skipped: true,
            optional_in_ci,
        });
    }
}

pub fn lemonade_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LEMONADE_SOAK_BIN") {
        return p.into();
    }
    std::env::current_exe().expect("current exe").parent().expect("target dir").join("lemonade")
}

/// Processes whose executable is one of ours (lemonade, llama-server, the fake backend), for
/// the orphan check.
pub fn our_processes() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if !test_support::alive(pid) {
            continue;
        }
        if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if matches!(name.as_str(), "lemonade" | "llama-server" | "fake-llama-server") {
                out.push((pid, name));
            }
        }
    }
    out
}

/// Waits (bounded) until none of `before`'s complement is left: processes of ours that were
/// not there when the scenario started.
pub async fn orphans_after(before: &[(u32, String)]) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let extra: Vec<_> = our_processes().into_iter().filter(|p| !before.contains(p)).collect();
        if extra.is_empty() || Instant::now() > deadline {
            return extra;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let bin = lemonade_bin();
    anyhow::ensure!(bin.is_file(), "{} not found: build it with `cargo build -p lemonade-cli`", bin.display());
    let only = std::env::var("LEMONADE_SOAK_ONLY").unwrap_or_default();
    let t = Instant::now();
    let before = our_processes();
    let mut report = Report::default();
    if only == "ci" {
        // The bounded subset `cargo xtask test` runs: kills mid-write, mid-pull and mid-stream,
        // a full disk where a tmpfs can be mounted, one short load round, the bad-input corpus.
        faults::run_ci(&bin, &mut report).await?;
        load::run_ci(&bin, &mut report).await?;
        badinput::run(&bin, &mut report).await?;
    }
    if only.is_empty() || only == "faults" {
        faults::run(&bin, &mut report).await?;
    }
    if only.is_empty() || only == "load" {
        load::run(&bin, &mut report).await?;
    }
    if only.is_empty() || only == "badinput" {
        badinput::run(&bin, &mut report).await?;
    }
    let left = orphans_after(&before).await;
    report.add(
        "all",
        "no lemonade, llama-server or fake backend left behind",
        1,
        left.is_empty() as usize,
        format!("{left:?}"),
    );

    println!("\n| area | scenario | trials | held | notes |");
    println!("|---|---|---:|---:|---|");
    for r in &report.rows {
        println!("| {} | {} | {} | {} | {} |", r.area, r.scenario, r.trials, r.held, r.note.replace('|', "/"));
    }
    let failed: Vec<&Row> = report.rows.iter().filter(|r| r.held < r.trials).collect();
    let skipped: Vec<&Row> = report.rows.iter().filter(|r| r.skipped).collect();
    let must_run: Vec<&str> =
        skipped.iter().filter(|r| !(only == "ci" && r.optional_in_ci)).map(|r| r.scenario.as_str()).collect();
    let names: Vec<&str> = skipped.iter().map(|r| r.scenario.as_str()).collect();
    println!(
        "\n{} scenarios, {} failed, {} skipped{}, {:.0} s",
        report.rows.len(),
        failed.len(),
        skipped.len(),
        if names.is_empty() { String::new() } else { format!(" ({})", names.join("; ")) },
        t.elapsed().as_secs_f64()
    );
    let out: Vec<Value> = report
        .rows
        .iter()
        .map(|r| json!({"area": r.area, "scenario": r.scenario, "trials": r.trials, "held": r.held, "note": r.note, "skipped": r.skipped}))
        .collect();
    if let Some(path) = std::env::var_os("LEMONADE_SOAK_OUT") {
        std::fs::write(&path, serde_json::to_vec_pretty(&json!({"seconds": t.elapsed().as_secs_f64(), "rows": out}))?)?;
        println!("written to {}", PathBuf::from(path).display());
    }
    anyhow::ensure!(failed.is_empty(), "{} scenario(s) did not hold", failed.len());
    anyhow::ensure!(must_run.is_empty(), "required scenario(s) were skipped: {}", must_run.join("; "));
    Ok(())
}
