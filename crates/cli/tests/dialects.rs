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
    py_checks("ollama_client.py", &[&base, SMOL, MINILM, "Qwen3-0.6B-GGUF"]).await;
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
