//! `collection.router`: what a routing decision costs (the pure decision, in process, for a
//! deterministic policy) and the time to first token it adds end to end, against asking the
//! model it picks directly through lemonade, paired runs in the same process.

use std::time::Instant;

use serde_json::{json, Value};
use test_support::*;

use crate::{median, paired_ms, stream_once, timed_post, RUNS};

/// Five deterministic rules; the lighthouse prompt of [`stream_once`] matches none, so each
/// decision evaluates all of them and falls open to SmolLM2.
fn policy() -> Value {
    json!({
        "model": "user.Bench-Route", "recipe": "collection.router", "version": "1", "components": [SMOL, GEMMA],
        "routing": {"candidates": [SMOL, GEMMA], "default_model": SMOL, "rules": [
            {"id": "private", "match": {"metadata": {"key": "consent", "equals": "denied"}}, "route_to": SMOL},
            {"id": "code", "match": {"any": [{"keywords_any": ["def ", "function", "stack trace", "compile"]}, {"regex": "fn [a-z_]+\\("}]}, "route_to": GEMMA},
            {"id": "ticket", "match": {"regex": "TICKET-[0-9]+"}, "route_to": GEMMA},
            {"id": "long", "match": {"min_chars": 4000}, "route_to": GEMMA},
            {"id": "tools", "match": {"all": [{"has_tools": true}, {"not": {"has_images": true}}]}, "route_to": GEMMA}
        ]}
    })
}

pub async fn routing(bin: &std::path::Path) -> anyhow::Result<Value> {
    // The decision alone: the request's features read and the policy evaluated.
    let p = routing::Policy::parse(&policy())?;
    let body = json!({"model": "user.Bench-Route", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a story about a lighthouse keeper."}], "stream": true});
    let none = Default::default();
    const N: u32 = 200_000;
    let t = Instant::now();
    let mut defaults = 0;
    for _ in 0..N {
        let f = routing::Features::of_request(std::hint::black_box(&body));
        if let routing::Outcome::Decided(d) = routing::decide(&p, &f, &none, false) {
            defaults += usize::from(d.default_used);
        }
    }
    let decision_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(N);
    anyhow::ensure!(defaults == N as usize, "every decision falls open");

    // End to end: streamed TTFT through the collection vs naming SmolLM2, paired.
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--llamacpp-args", crate::LLAMA_ARGS], &[]).await;
    let (s, v) = l.post("/api/v1/pull", &policy()).await;
    anyhow::ensure!(s == 200, "registering the collection: {v}");
    let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?;
    let url = l.url("/api/v1/chat/completions");
    stream_once(&http, &url, Some(SMOL)).await?;
    stream_once(&http, &url, Some("user.Bench-Route")).await?;
    let (mut direct, mut routed) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        let (a, b) = if i % 2 == 0 {
            let a = stream_once(&http, &url, Some(SMOL)).await?;
            (a, stream_once(&http, &url, Some("user.Bench-Route")).await?)
        } else {
            let b = stream_once(&http, &url, Some("user.Bench-Route")).await?;
            (stream_once(&http, &url, Some(SMOL)).await?, b)
        };
        direct.push(a.ttft_ms);
        routed.push(b.ttft_ms);
    }
    let (added, ratio) = paired_ms(&direct, &routed);
    let (d, r) = (median(direct), median(routed));
    println!("\ncollection.router, 5 deterministic rules, none matching (every rule evaluated), {RUNS} paired streamed runs\n");
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| decision (features + 5 rules, in process, {N} runs) | {decision_us:.2} µs |");
    println!("| TTFT naming SmolLM2 | {d:.2} ms |");
    println!("| TTFT through the collection | {r:.2} ms |");
    println!("| added (median of pairs) | {added:+.2} ms ({ratio:.3}×) |");
    Ok(
        json!({"decision_us": decision_us, "ttft_direct_ms": d, "ttft_routed_ms": r, "added_ttft_ms": added, "ttft_ratio": ratio, "runs": RUNS}),
    )
}

/// `collection.omni`: what the tool loop adds to the one planner call an answer in text takes.
/// The collection's only component is SmolLM2 (so no tool is offered and the planner answers
/// in text); the same planner request the loop sends (built by `routing::omni::Loop`, the
/// machine the engine drives) is also sent to SmolLM2 directly, and the two whole answers are
/// timed in pairs: the difference is the loop, its parsing and the answer's shaping.
pub async fn omni(bin: &std::path::Path) -> anyhow::Result<Value> {
    const OMNI: &str = "user.Bench-Omni";
    let l = Lemonade::start_in(bin, Sandbox::new(), &["--llamacpp-args", crate::LLAMA_ARGS], &[]).await;
    let def = json!({"model": OMNI, "recipe": "collection.omni", "components": [SMOL], "tool_format": "json"});
    let (s, v) = l.post("/api/v1/pull", &def).await;
    anyhow::ensure!(s == 200, "registering the collection: {v}");
    let (_, listed) = l.get(&format!("/api/v1/models/{OMNI}")).await;
    anyhow::ensure!(listed["omni_tools"].as_array().is_some_and(|t| t.is_empty()), "tools offered: {listed}");
    let body = json!({"model": OMNI, "temperature": 0, "seed": 7, "max_tokens": 48, "messages": [
        {"role": "user", "content": "Write a story about a lighthouse keeper."}]});
    let format = routing::omni::Omni::parse(None, Some(&json!("json"))).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let routing::omni::Action::Ask(planner) = routing::omni::Loop::new(&format, SMOL, vec![], body.clone()).start()
    else {
        anyhow::bail!("the loop does not ask the planner first")
    };
    let timed = |b: Value| timed_post(&l, "/api/v1/chat/completions", b);
    timed(planner.clone()).await?;
    timed(body.clone()).await?;
    let (mut direct, mut looped) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        if i % 2 == 0 {
            direct.push(timed(planner.clone()).await?);
            looped.push(timed(body.clone()).await?);
        } else {
            looped.push(timed(body.clone()).await?);
            direct.push(timed(planner.clone()).await?);
        }
    }
    let (added, ratio) = paired_ms(&direct, &looped);
    let (d, o) = (median(direct), median(looped));
    println!("\ncollection.omni, SmolLM2 planning alone (no tool offered), {RUNS} paired whole answers\n");
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| the planner's request, sent to SmolLM2 directly | {d:.2} ms |");
    println!("| the same answer through the omni collection | {o:.2} ms |");
    println!("| added (median of pairs) | {added:+.2} ms ({ratio:.3}×) |");
    Ok(json!({"direct_ms": d, "omni_ms": o, "added_ms": added, "ratio": ratio, "runs": RUNS}))
}
