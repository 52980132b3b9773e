//! `cargo xtask sim`: runs seeds of the engine's simulation.
//!
//! ```text
//! lemonade-sim [--seeds N] [--first S] [--seed S [--trace]] [--mutate NAME] [--jobs J]
//! ```
//! `--seeds N` runs seeds `first..first+N` on `jobs` threads (each seed single-threaded), prints
//! each invariant's hit count and fails when one stayed at zero (500 seeds or more) or a seed
//! failed; `--seed S` runs one seed, `--trace` prints its trace. `--mutate` puts a past bug back
//! and reports the first seed that finds it (failing when none does).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lemonade_sim::{run, Hits, Mutation, INVARIANTS};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let number = |flag: &str, default: u64| match value(flag) {
        Some(v) => v.parse::<u64>().unwrap_or_else(|_| fail(&format!("{flag} takes a number, not {v:?}"))),
        None => default,
    };
    let mutation = value("--mutate").map(|m| match m.as_str() {
        "hung-up-wait-kept" => Mutation::HungUpWaitKept,
        "config-written-in-place" => Mutation::ConfigWrittenInPlace,
        "start-after-shutdown" => Mutation::StartAfterShutdown,
        "spill-without-settle" => Mutation::SpillWithoutSettle,
        "reload-published-unlocked" => Mutation::ReloadPublishedUnlocked,
        "cache-key-without-options" => Mutation::CacheKeyWithoutOptions,
        other => fail(&format!(
            "--mutate: no mutation {other:?} (hung-up-wait-kept, config-written-in-place, start-after-shutdown, spill-without-settle, reload-published-unlocked, cache-key-without-options)"
        )),
    });
    if !lemonade_sim::REPLAYABLE {
        eprintln!("warning: built without --cfg tokio_unstable: tokio's own randomness is not seeded, so a seed may not replay exactly (`cargo xtask sim` builds it right)");
    }
    if let Some(n) = value("--replays") {
        let n: u64 = n.parse().unwrap_or_else(|_| fail("--replays takes a number"));
        if !lemonade_sim::REPLAYABLE {
            fail("--replays needs the build `cargo xtask sim` makes");
        }
        let first = number("--first", 0);
        let started = Instant::now();
        for seed in first..first + n {
            let (a, b) = (run(seed, mutation), run(seed, mutation));
            if let Some(i) = (0..a.trace.len().max(b.trace.len())).find(|i| a.trace.get(*i) != b.trace.get(*i)) {
                fail(&format!(
                    "seed {seed} did not replay: trace line {i} was\n  {:?}\nthen\n  {:?}",
                    a.trace.get(i),
                    b.trace.get(i)
                ));
            }
        }
        println!("{n} seeds from {first} replayed byte for byte ({:.1} s)", started.elapsed().as_secs_f64());
        return;
    }
    if let Some(seed) = value("--seed") {
        let seed = seed.parse().unwrap_or_else(|_| fail("--seed takes a number"));
        let r = run(seed, mutation);
        if args.iter().any(|a| a == "--trace") {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for line in &r.trace {
                if writeln!(out, "{line}").is_err() {
                    break;
                }
            }
        }
        match r.failure {
            Some(f) => fail(&format!("seed {seed} failed: {f}\nreplay: cargo xtask sim --seed {seed} --trace")),
            None => println!("seed {seed} passed ({} trace lines)", r.trace.len()),
        }
        return;
    }
    let (seeds, first) = (number("--seeds", 1000), number("--first", 0));
    // The seeds that found bugs, whatever the range asked for.
    if mutation.is_none() {
        for (seed, what) in lemonade_sim::REGRESSIONS {
            if let Some(f) = run(*seed, None).failure {
                fail(&format!(
                    "regression seed {seed} ({what}) failed: {f}\nreplay: cargo xtask sim --seed {seed} --trace"
                ));
            }
        }
    }
    let jobs = number("--jobs", std::thread::available_parallelism().map_or(1, |n| n.get() as u64)).max(1);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(first));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..jobs)
        .map(|_| {
            let (next, stop) = (next.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut hits, mut failed) = (Hits::default(), None::<(u64, String)>);
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= first + seeds || stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = run(seed, mutation);
                    hits.add(&r.hits);
                    if let Some(f) = r.failure {
                        stop.store(true, Ordering::SeqCst);
                        failed = Some((seed, f));
                        break;
                    }
                }
                (hits, failed)
            })
        })
        .collect();
    let (mut hits, mut failures) = (Hits::default(), vec![]);
    for w in workers {
        let (h, f) = w.join().unwrap_or_else(|_| fail("a simulation thread panicked"));
        hits.add(&h);
        failures.extend(f);
    }
    failures.sort();
    let secs = started.elapsed().as_secs_f64();
    if let Some(m) = mutation {
        match failures.first() {
            Some((seed, f)) => println!("mutation {m:?} found by seed {seed} ({secs:.1} s): {f}"),
            None => fail(&format!("mutation {m:?} was not found in {seeds} seeds")),
        }
        return;
    }
    println!("{seeds} seeds from {first}, {secs:.1} s on {jobs} threads; cases judged per invariant:");
    for (name, what) in INVARIANTS {
        println!("  {:>9}  {name}: {what}", hits.0.get(name).copied().unwrap_or(0));
    }
    if let Some((seed, f)) = failures.first() {
        fail(&format!("seed {seed} failed: {f}\nreplay: cargo xtask sim --seed {seed} --trace"));
    }
    let silent = hits.silent();
    if seeds >= 500 && !silent.is_empty() {
        fail(&format!("invariants that judged no case in {seeds} seeds: {silent:?}"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(1)
}
