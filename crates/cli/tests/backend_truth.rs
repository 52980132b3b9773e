//! Backend truth, against real llama-server: lemonade's command lines fit the llama.cpp that
//! runs them (both builds setup provides: the newest, b11434, and the oldest lemonade supports,
//! b9093, which has `--no-mmap` and neither `--load-mode` nor `--kv-unified-per-slot`), a
//! user's arguments are checked against the binary before anything starts, and the memory
//! ledger counts what llama-server holds (its prompt cache included) under a prompt storm.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const MIB: u64 = 1 << 20;

fn entry<'a>(health: &'a Value, name: &str) -> &'a Value {
    health["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == name).unwrap_or(&Value::Null)
}

/// The backend's command line as health shows it, one string.
async fn command(l: &Lemonade, model: &str) -> String {
    let (_, h) = l.get("/api/v1/health").await;
    let c = entry(&h, model)["command"].as_array().cloned().unwrap_or_default();
    c.iter().map(|a| a.as_str().unwrap_or_default()).collect::<Vec<_>>().join(" ")
}

/// A stand-in hardware tree with an AMD iGPU (gfx1151, Strix Halo): lemonade applies v9's
/// no-mmap rule there.
fn igpu_hardware() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |p: &str, s: &str| {
        let p = dir.path().join("sys").join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };
    write("class/kfd/kfd/topology/nodes/0/properties", "simd_count 0\ngfx_target_version 0\n");
    write("class/kfd/kfd/topology/nodes/1/properties", "simd_count 40\ngfx_target_version 110501\n");
    dir
}

async fn chat_answers(l: &Lemonade) {
    let (s, c) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{c}");
    assert!(!c["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{c}");
}

/// Every point of the capability subset against one llama-server build.
async fn holds_for(server: &Path, build: u32, newest: bool) {
    let hw = igpu_hardware();
    let env = [
        ("LEMONADE_LLAMACPP_CPU_BIN", server.to_str().unwrap()),
        ("LEMONADE_HARDWARE_ROOT", hw.path().to_str().unwrap()),
    ];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &env).await;
    let (_, info) = l.get("/api/v1/system-info").await;
    assert_eq!(info["devices"]["amd_igpu"]["available"], true, "the stand-in iGPU is seen: {info}");

    // Defaults on an AMD iGPU host: v9's no-mmap rule in the binary's own spelling, and the
    // prompt cache lemonade sized, counted and passed.
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    let c = command(&l, SMOL).await;
    assert_eq!(c.contains("--load-mode none"), newest, "{c}");
    assert_eq!(c.contains("--no-mmap"), !newest, "{c}");
    let (_, sched) = l.get("/api/v1/scheduler").await;
    let m = sched["models"].as_array().unwrap().iter().find(|m| m["model_name"] == SMOL).unwrap().clone();
    let cache = m["prompt_cache_bytes"].as_u64().expect("the prompt cache is counted");
    assert!(cache > 0 && cache % MIB == 0, "{m}");
    assert!(c.contains(&format!("--cache-ram {}", cache / MIB)), "the value the ledger counts: {c} / {m}");
    chat_answers(&l).await;

    // `parallel`: slots of their own context on both builds (`--kv-unified-per-slot` where it
    // exists; a split context per slot where it does not).
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "parallel": 2, "ctx_size": 2048})).await;
    assert_eq!(s, 200, "{v}");
    let c = command(&l, SMOL).await;
    assert!(c.contains("--ctx-size 4096") && c.contains("--parallel 2"), "{c}");
    assert_eq!(c.contains("--kv-unified-per-slot 2048"), newest, "{c}");
    let (_, slots) = l.get(&format!("/slots?model={SMOL}")).await;
    let n_ctx: Vec<u64> = slots.as_array().unwrap().iter().map(|s| s["n_ctx"].as_u64().unwrap()).collect();
    assert_eq!(n_ctx, [2048, 2048], "each slot has its own 2048: {slots}");
    chat_answers(&l).await;

    // A v9/v11 user's `--no-mmap` loads, in the binary's spelling.
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "llamacpp_args": "--no-mmap"})).await;
    assert_eq!(s, 200, "{v}");
    let c = command(&l, SMOL).await;
    // (The user's arguments come after lemonade's own defaults, which leave the flag to them.)
    let user = c.split("-ngl 0").nth(1).unwrap_or_default();
    match newest {
        true => assert!(user.contains("--load-mode none") && !c.contains("--no-mmap"), "{c}"),
        false => assert!(user.contains("--no-mmap") && !c.contains("--load-mode"), "{c}"),
    }
    chat_answers(&l).await;

    // A flag the binary lacks: a 400 naming it and the build, and no backend started.
    let before = child_pids(l.pid());
    for args in ["--no-such-flag 1", "-t 1 --no-such-flag"] {
        let (s, e) = l.post("/api/v1/load", &json!({"model_name": SMOL, "llamacpp_args": args})).await;
        assert_eq!(s, 400, "{e}");
        assert_eq!(
            (e["error"]["code"].as_str(), e["error"]["param"].as_str()),
            (Some("invalid_llamacpp_args"), Some("llamacpp_args")),
            "{e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains("'--no-such-flag'") && msg.contains(&format!("llama-server b{build}")), "{msg}");
    }
    // A refused load saves nothing; options saved without a load are checked when a request
    // would load the model.
    let bogus = json!({"model_name": GEMMA, "llamacpp_args": "--bogus", "save_options": true});
    assert_eq!(l.post("/api/v1/load", &bogus).await.0, 400);
    let (_, o) = l.get(&format!("/api/v1/models/{GEMMA}/options")).await;
    assert_eq!(o["saved"], json!({}), "{o}");
    let (s, o) = l.post(&format!("/api/v1/models/{GEMMA}/options"), &json!({"llamacpp_args": "--bogus"})).await;
    assert_eq!((s, &o["saved"]), (200, &json!({"llamacpp_args": "--bogus"})), "{o}");
    let (s, e) = l
        .post(
            "/api/v1/chat/completions",
            &json!({"model": GEMMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
        .await;
    assert_eq!(s, 400, "a chat that would load it: {e}");
    assert_eq!(child_pids(l.pid()), before, "no backend was started or stopped");
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL], "the loaded model is untouched: {h}");
    // The version the backend reports is the build's own (not `b0-unknown`).
    let (_, props) = l.get(&format!("/props?model={SMOL}")).await;
    let info = props["build_info"].as_str().unwrap_or_default();
    assert!(info.starts_with(&format!("b{build}-")) && !info.contains("unknown"), "{props}");
    let (_, c) = l.chat(SMOL).await;
    assert_eq!(c["system_fingerprint"].as_str(), Some(info), "{c}");
}

/// lemonade's prompt cache across a swap on this build: a conversation's slot saved when
/// Gemma takes SmolLM2's place, restored when it comes back, so the next turn prefills only
/// its new tokens (llama-server's `timings.prompt_n`).
async fn prompt_cache_across_a_swap(server: &Path) {
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", server.to_str().unwrap())];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &env).await;
    let facts: String = (0..60).map(|i| format!("Fact {i}: lemon tree number {i} grows in row {}. ", i % 7)).collect();
    let mut messages =
        vec![json!({"role": "user", "content": format!("Read these notes. {facts}Which row has the most trees?")})];
    let turn = |messages: Vec<Value>, model: &'static str| {
        let body = json!({"model": model, "messages": messages, "max_tokens": 8, "temperature": 0});
        let l = &l;
        async move {
            let (s, v) = l.post("/api/v1/chat/completions", &body).await;
            assert_eq!(s, 200, "{v}");
            v
        }
    };
    let v = turn(messages.clone(), SMOL).await;
    let first = v["timings"]["prompt_n"].as_u64().unwrap();
    assert!(first > 500, "{v}");
    messages.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "Answer in one word."}));
    turn(vec![json!({"role": "user", "content": "Hi"})], GEMMA).await;
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [GEMMA], "SmolLM2 was swapped out");
    let v = turn(messages, SMOL).await;
    let again = v["timings"]["prompt_n"].as_u64().unwrap();
    assert!(again <= 40, "only the new turn is prefilled after the swap: {again} of {first}: {v}");
    assert!(l.log().contains("prompt cache: restored a saved prompt"), "{}", l.log());
}

#[tokio::test]
async fn the_prompt_cache_resumes_a_conversation_across_a_swap_on_both_builds() {
    prompt_cache_across_a_swap(&llama_server_oldest()).await;
    prompt_cache_across_a_swap(&llama_server()).await;
}

#[tokio::test]
async fn the_newest_llama_cpp_gets_command_lines_in_its_own_spelling() {
    holds_for(&llama_server(), 11434, true).await;
}

#[tokio::test]
async fn the_oldest_supported_llama_cpp_gets_command_lines_in_its_own_spelling() {
    holds_for(&llama_server_oldest(), 9093, false).await;
}

/// The prompt storm: distinct long prompts fill llama-server's host prompt cache. With
/// lemonade's `cache_ram`, the child's RSS stays within what the ledger counts for it.
async fn storm(server: &Path, prompts: usize) -> (u64, u64, String) {
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", server.to_str().unwrap())];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &env).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    // About 500 tokens each (11 MiB of KV state for SmolLM2), each different from its first
    // word (nothing shared to reuse): 12 of them pass the default cache of 90 MiB.
    for i in 0..prompts {
        let text = (0..85).map(|w| format!("n{i}w{w}")).collect::<Vec<_>>().join(" ");
        let body = json!({"model": SMOL, "messages": [{"role": "user", "content": text}], "max_tokens": 1});
        let (s, v) = l.post("/api/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{v}");
    }
    // The measurement the scheduler saw (read every second): wait until it is the RSS now.
    let (_, h) = l.get("/api/v1/health").await;
    let pid = entry(&h, SMOL)["pid"].as_u64().map(|p| p as u32);
    let rss = |pid: u32| {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let pid = pid.unwrap_or_else(|| *child_pids(l.pid()).first().expect("a backend"));
    let measured = wait_for(Duration::from_secs(10), || async {
        let (_, s) = l.get("/api/v1/scheduler").await;
        let m = s["models"].as_array()?.iter().find(|m| m["model_name"] == SMOL)?.clone();
        let seen = m["measured_memory_bytes"].as_u64()?;
        (seen.abs_diff(rss(pid)) < 8 * MIB).then_some(m)
    })
    .await
    .expect("the scheduler shows the measured memory");
    let c = command(&l, SMOL).await;
    (rss(pid), measured["estimate_memory_bytes"].as_u64().unwrap(), format!("{measured} / {c}"))
}

#[tokio::test]
async fn a_prompt_storm_stays_within_the_ledger_on_real_llama_server() {
    let (rss, estimate, about) = storm(&llama_server(), 12).await;
    // The estimate is calibrated within 2 % at load; the storm adds what the prompt cache
    // holds, capped by the `--cache-ram` the estimate counts. llama.cpp trims its cache to the
    // limit after it saves a prompt, so the process may pass it by one prompt's state (11 MiB
    // here) and some allocator slack: 16 MiB. Without lemonade's cap the same storm takes
    // about 135 MiB more than the estimate without a cache (the 31.5 MiB a prompt of
    // 1,400 tokens).
    assert!(rss <= estimate + 16 * MIB, "RSS {} MiB over the ledger's {} MiB: {about}", rss / MIB, estimate / MIB);
    assert!(about.contains("--cache-ram 90"), "the cap the ledger counts: {about}");
}

/// A real llama-server (and the runs of its binary that read its flags) inherits none of
/// lemonade's secrets: its environment is an allow-list (host::supervisor), and what lemonade
/// sets for it comes on top. Read from the child's own `/proc/<pid>/environ`.
#[tokio::test]
async fn a_backend_inherits_no_secret_of_lemonades_environment() {
    let secrets = [
        ("HF_TOKEN", "hf_secret_token"),
        ("OPENAI_API_KEY", "sk-secret-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ("MY_OWN_PASSWORD", "hunter2-hunter2"),
    ];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &secrets).await;
    chat_answers(&l).await;
    let (_, h) = l.get("/api/v1/health").await;
    let pid = entry(&h, SMOL)["pid"].as_u64().expect("the backend's pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let vars: Vec<String> =
        environ.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into()).collect();
    for (name, value) in secrets {
        assert!(!vars.iter().any(|v| v.starts_with(&format!("{name}=")) || v.contains(value)), "{name}: {vars:?}");
    }
    assert!(!vars.iter().any(|v| v.starts_with("LEMONADE_")), "none of lemonade's own: {vars:?}");
    // What a backend needs still reaches it: the search path, and llama.cpp's own variables.
    assert!(vars.iter().any(|v| v.starts_with("PATH=")), "{vars:?}");
    assert!(vars.iter().any(|v| v == "LLAMA_ARG_THREADS=1"), "{vars:?}");
}
