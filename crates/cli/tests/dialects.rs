//! The dialects through their official clients (the `ollama` and `anthropic` Python
//! libraries from the test venv) against real llama-server.

use std::path::Path;
use std::process::Command;

use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// Runs `tests/py/<script>` with `args`; panics with its output unless it exits 0.
fn run_client(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/py").join(script);
    let out = Command::new(python()).arg(path).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script}:\n{text}");
    text
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
    let out =
        tokio::task::spawn_blocking(move || run_client("ollama_client.py", &[&base, SMOL, MINILM, "Qwen3-0.6B-GGUF"]))
            .await
            .unwrap();
    assert!(out.contains("every check held"), "{out}");
}
