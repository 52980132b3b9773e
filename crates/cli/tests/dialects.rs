//! The dialects through their official clients (the `ollama` and `anthropic` Python
//! libraries from the test venv) against real llama-server.

use std::path::Path;

use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

#[tokio::test]
async fn real_llama_server_the_ollama_library_lists_shows_chats_generates_embeds_pulls_and_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    // The catalogue's Qwen3-0.6B-GGUF, played by SmolLM2's bytes, to pull from the Hub double.
    let qwen = tmp.path().join("unsloth/Qwen3-0.6B-GGUF");
    std::fs::create_dir_all(&qwen).unwrap();
    std::os::unix::fs::symlink(model(SMOL_FILE), qwen.join("Qwen3-0.6B-Q4_0.gguf")).unwrap();
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::new(), &["--max-loaded-models", "-1"], &[("HF_ENDPOINT", &double.url)])
        .await;
    let base = l.url("");
    // The names /api/tags lists (current Lemonade's: bare), which requests take too.
    py_checks("ollama_client.py", &[&base, shown(SMOL), shown(MINILM), "Qwen3-0.6B-GGUF"]).await;
}

#[tokio::test]
async fn real_llama_server_the_anthropic_sdk_creates_streams_sends_tool_history_and_counts_tokens() {
    // SmolLM2's own template has no tools: serve it with one that renders them. The operator
    // names the file (a sandboxed backend reads the files of the operator's arguments, never
    // those a client names in a load's `llamacpp_args`).
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/chatml-tools.jinja");
    let args = format!("--chat-template-file {}", template.canonicalize().unwrap().display());
    let l = Lemonade::start(bin(), &["--llamacpp-args", &args]).await;
    let (s, v) = l.post("/api/v1/load", &serde_json::json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    let base = l.url("");
    py_checks("anthropic_client.py", &[&base, SMOL]).await;
}

#[tokio::test]
async fn real_llama_server_prometheus_metrics_count_the_traffic_of_three_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let qwen = tmp.path().join("unsloth/Qwen3-0.6B-GGUF");
    std::fs::create_dir_all(&qwen).unwrap();
    std::os::unix::fs::symlink(model(SMOL_FILE), qwen.join("Qwen3-0.6B-Q4_0.gguf")).unwrap();
    let size = std::fs::metadata(model(SMOL_FILE)).unwrap().len().to_string();
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &[("HF_ENDPOINT", &double.url)]).await;
    let base = l.url("");
    py_checks("metrics_client.py", &[&base, SMOL, MINILM, "Qwen3-0.6B-GGUF", &size]).await;
}

/// A long prompt asked twice: the second answer says how much of it llama-server read from its
/// prompt cache, in every dialect: OpenAI's `usage.prompt_tokens_details.cached_tokens`
/// (llama-server's own), Anthropic's `usage.cache_read_input_tokens` (with `input_tokens` the
/// rest of the prompt), Ollama's `prompt_eval_cached_count` (within `prompt_eval_count`), in
/// whole answers and at the end of streams.
#[tokio::test]
async fn real_llama_server_a_repeated_long_prompt_reports_its_cached_tokens_in_every_dialect() {
    use serde_json::{json, Value};
    let l = Lemonade::start(bin(), &[]).await;
    let long: String = (0..60).map(|i| format!("Fact {i}: lemons are yellow and sour. ")).collect();
    let http = reqwest::Client::new();
    let text = |path: &str, body: Value| {
        let (http, url) = (http.clone(), l.url(path));
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let messages = json!([{"role": "user", "content": long}]);

    // OpenAI: llama-server's own count, passed through; the same prompt twice.
    let body = json!({"model": SMOL, "messages": messages, "max_tokens": 4, "temperature": 0});
    let (s, first) = l.post("/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{first}");
    let (_, again) = l.post("/v1/chat/completions", &body).await;
    let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(prompt > 400 && cached > prompt / 2 && cached < prompt, "{again}");

    // Anthropic, whole: input_tokens is the part not read from the cache.
    let body = json!({"model": SMOL, "max_tokens": 4, "messages": messages});
    let (s, a) = l.post("/v1/messages", &body).await;
    assert_eq!(s, 200, "{a}");
    let u = &a["usage"];
    let (input, read) = (u["input_tokens"].as_u64().unwrap(), u["cache_read_input_tokens"].as_u64().unwrap());
    assert!(read > input && input + read > 400, "{a}");
    // Streamed: the message_delta event carries the same usage.
    let sse = text("/v1/messages", json!({"model": SMOL, "max_tokens": 4, "messages": messages, "stream": true})).await;
    let delta = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta in {sse}"));
    let read = delta["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read > delta["usage"]["input_tokens"].as_u64().unwrap(), "{delta}");

    // Ollama, whole and streamed: prompt_eval_count is the whole prompt, the cached part within.
    let body = json!({"model": SMOL, "messages": messages, "stream": false, "options": {"num_predict": 4}});
    let (s, o) = l.post("/api/chat", &body).await;
    assert_eq!(s, 200, "{o}");
    let (count, cached) = (o["prompt_eval_count"].as_u64().unwrap(), o["prompt_eval_cached_count"].as_u64().unwrap());
    assert!(count > 400 && cached > count / 2 && cached < count, "{o}");
    let ndjson = text("/api/chat", json!({"model": SMOL, "messages": messages, "options": {"num_predict": 4}})).await;
    let last: Value = serde_json::from_str(ndjson.lines().last().unwrap()).unwrap();
    assert_eq!(last["done"], true, "{ndjson}");
    assert!(last["prompt_eval_cached_count"].as_u64().unwrap() > count / 2, "{last}");

    // What llama-server read from its cache is counted under Lemonade v11's series and /stats.
    let (_, m) = l.get("/metrics").await;
    let metrics = m.as_str().unwrap_or_default().to_string();
    let sample = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
    };
    let total = sample(&format!("lemonade_model_cache_tokens_total{{model=\"{SMOL}\"}}"));
    assert!(total > 4 * (count / 2), "four answers above read more than half their prompt each: {total}");
    assert_eq!(sample("lemonade_cache_tokens_total "), total, "one model: the total is its own");
    let (_, stats) = l.get("/api/v1/stats").await;
    assert!(stats["cache_tokens"].as_u64().is_some_and(|n| n > count / 2), "{stats}");
}
