//! The web UI in a real headless Chromium (Debian's, driven by Playwright for Python from the
//! test venv) against a real `lemonade serve` with the provisioned llama-server and models:
//! chat streaming, a pull from the Hub double with its progress bar, load/pin/unload, the live
//! log, the API key prompt, the system view, transcription (an upload and a recording), an
//! image and speech on the real backends, and a backend install from the release double.
//! tests/py/webui_client.py holds the browser side; every scenario there also fails on a
//! request outside the server's origin, a CSP violation or a JavaScript error, and audits each
//! screenshot (contrast, labels, overflow). Screenshots land in target/webui/.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use test_support::hub::{HubDouble, Knobs};
use test_support::release;
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn shots() -> String {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/webui");
    std::fs::create_dir_all(&dir).unwrap();
    dir.display().to_string()
}

/// Runs one scenario of webui_client.py against `l`; panics with its output unless every
/// check held.
async fn browse(l: &Lemonade, scenario: &str, args: &[&str]) {
    let shots = shots();
    let mut all = vec![scenario, l.base.as_str(), shots.as_str()];
    all.extend(args);
    py_checks("webui_client.py", &all).await;
}

#[tokio::test]
async fn real_llama_server_chat_streams_into_the_page_keeps_conversations_and_stops() {
    let l = Lemonade::start(bin(), &[]).await;
    browse(&l, "chat", &[shown(SMOL)]).await;
}

/// A router collection (v11's `collection.router`) in the chat view: the page asks for the
/// trace and shows under each answer which model answered and by which rule.
#[tokio::test]
async fn real_llama_server_the_chat_view_shows_the_route_a_router_collection_took() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "2"]).await;
    let policy = serde_json::json!({
        "model": "user.Route", "recipe": "collection.router", "version": "1", "components": [SMOL, GEMMA],
        "routing": {"candidates": [SMOL, GEMMA], "default_model": SMOL,
                    "rules": [{"id": "code", "match": {"keywords_any": ["function"]}, "route_to": GEMMA}]}
    });
    assert_eq!(l.post("/api/v1/pull", &policy).await.0, 200);
    browse(&l, "router", &["user.Route", GEMMA, SMOL]).await;
}

/// An omni collection (v11's `collection.omni`) in the chat view, with a scripted planner (the
/// fake backend) and real sd-server and Kokoro: the image and the audio shown inline.
#[tokio::test]
async fn real_backends_the_chat_view_shows_an_omni_models_image_and_audio() {
    let call = |id: &str, name: &str, args: serde_json::Value| serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}});
    let script = serde_json::json!({"replies": [
        {"content": "", "tool_calls": [call("a", "generate_image", serde_json::json!({"prompt": "a lemon"}))]},
        {"content": "", "tool_calls": [call("b", "text_to_speech", serde_json::json!({"input": "A lemon."}))]},
        {"content": "Here is your lemon."}
    ]});
    let fake = fake_llama_server();
    let sandbox = fake_sandbox(&[("planner", None, script)]).with_sd().with_kokoro();
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())];
    let l = Lemonade::start_in(bin(), sandbox, &["--max-loaded-models", "4"], &env).await;
    let def = serde_json::json!({"model": "user.Lemon", "recipe": "collection.omni", "components": ["extra.planner", SD, KOKORO]});
    assert_eq!(l.post("/api/v1/pull", &def).await.0, 200);
    browse(&l, "omni", &["user.Lemon", "extra.planner", SD, KOKORO]).await;
}

#[tokio::test]
async fn real_llama_server_pull_shows_progress_to_100_then_load_pin_unload_delete_cancel_and_failures() {
    let tmp = tempfile::tempdir().unwrap();
    for repo in ["lemonade-test/UiPulled-GGUF", "lemonade-test/UiCancelled-GGUF"] {
        let dir = tmp.path().join(repo);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(model(SMOL_FILE), dir.join("model-Q4_1.gguf")).unwrap();
    }
    // A GGUF header and nothing a model needs: it downloads, and llama-server refuses it.
    let broken = tmp.path().join("lemonade-test/UiBroken-GGUF");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("broken-Q4_0.gguf"), b"GGUF\x03\0\0\0not a model at all").unwrap();
    // About 3 s for SmolLM2's 98 MB, so the page sees the bar move.
    let knobs = Knobs { chunk_delay: Some(Duration::from_millis(2)), ..Default::default() };
    let double = HubDouble::start(tmp.path(), knobs).await;
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[("HF_ENDPOINT", &double.url)]).await;
    browse(
        &l,
        "pull",
        &[
            "user.UiPulled-GGUF",
            "lemonade-test/UiPulled-GGUF:Q4_1",
            "user.UiCancelled-GGUF",
            "lemonade-test/UiCancelled-GGUF:Q4_1",
            "user.UiMissing-GGUF",
            "user.UiBroken-GGUF",
            "lemonade-test/UiBroken-GGUF:Q4_0",
        ],
    )
    .await;
    // A cancelled pull keeps its partial file for the next pull to resume.
    let blobs = l.sandbox.hf_cache().join("models--lemonade-test--UiCancelled-GGUF/blobs");
    let partial =
        std::fs::read_dir(&blobs).unwrap().flatten().any(|e| e.path().to_string_lossy().ends_with(".incomplete"));
    assert!(partial, "no partial file in {}", blobs.display());
}

#[tokio::test]
async fn the_log_view_shows_new_lines_and_sets_the_servers_level() {
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &["--log-level", "info"], &[]).await;
    browse(&l, "logs", &[]).await;
    let (s, v) = l.get("/api/v1/log-level").await;
    assert_eq!((s, v["level"].as_str()), (200, Some("debug")));
}

#[tokio::test]
async fn with_an_api_key_the_page_asks_for_it_once_and_for_the_admin_key_when_an_action_needs_it() {
    let keys = [("LEMONADE_API_KEY", "ui-secret-key"), ("LEMONADE_ADMIN_API_KEY", "ui-admin-key")];
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &keys).await;
    browse(&l, "key", &["ui-secret-key", "ui-admin-key"]).await;
    // The page itself needs no key; the API does.
    let r = l.http.get(l.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(l.get("/api/v1/models").await.0, 401);
}

#[tokio::test]
async fn real_llama_server_the_system_view_shows_the_running_model_and_backends() {
    let hw = fake_hardware();
    let env = [("LEMONADE_HARDWARE_ROOT", hw.path().to_str().unwrap())];
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper().with_sd().with_kokoro(), &[], &env).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    browse(&l, "system", &[SMOL, GEMMA]).await;
}

#[tokio::test]
async fn real_backends_the_media_view_transcribes_an_upload_and_a_recording_draws_and_speaks() {
    let tmp = tempfile::tempdir().unwrap();
    let wav = tmp.path().join("speech.wav");
    let out = std::process::Command::new("espeak-ng")
        .args(["-s", "140", "-w"])
        .arg(&wav)
        .arg("Lemonade serves every model on one port.")
        .output()
        .expect("espeak-ng runs (cargo xtask setup installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sandbox = Sandbox::empty().with_whisper().with_sd().with_kokoro();
    let l = Lemonade::start_in(bin(), sandbox, &[], &[]).await;
    browse(&l, "media", &[wav.to_str().unwrap(), "one port"]).await;
}

#[tokio::test]
async fn a_backend_installs_from_the_system_view_with_progress_and_uninstalls() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, sha) = release::write_archive(tmp.path(), "b9999", 8 << 20);
    let knobs = Knobs { chunk_delay: Some(Duration::from_millis(10)), ..Default::default() };
    let double = HubDouble::start(tmp.path(), knobs).await;
    let sandbox = Sandbox::empty();
    release::pin(&sandbox.cache(), "b9999", Some(&sha));
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", ""), ("LEMONADE_RELEASES_URL", double.url.as_str())];
    let l = Lemonade::start_in(bin(), sandbox, &[], &env).await;
    browse(&l, "install", &["llamacpp:cpu"]).await;
    assert!(!l.sandbox.cache().join("bin/llamacpp/cpu").exists(), "the uninstall removed the backend");
}
