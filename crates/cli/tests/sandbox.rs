//! The kernel's confinement of backends (`--sandbox`, Landlock with no_new_privs), through the
//! real `lemonade` binary: a hostile backend (the fake llama-server told to misbehave) reaches
//! none of the user's secrets, files, ports or lemonade itself and still serves; the real
//! llama-server runs sandboxed and says so. Every other real-backend test runs under the same
//! default (strict on this kernel), so a kernel that cannot confine fails here, loudly.

use std::path::Path;

use serde_json::{json, Value};
use test_support::*;

fn chat(model: &str, content: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// What `/api/v1/health` says lemonade confines its backends with: strict, every part enforced.
fn assert_strict(sandbox: &Value) {
    assert_eq!(sandbox["mode"], "strict", "{sandbox}");
    for part in ["filesystem", "network", "scoped", "no_new_privs"] {
        assert_eq!(sandbox[part], true, "{part}: {sandbox}");
    }
    assert!(sandbox["landlock_abi"].as_u64().unwrap() >= 6, "{sandbox}");
    assert!(sandbox.get("missing").is_none(), "{sandbox}");
}

#[tokio::test]
async fn a_hostile_backend_reaches_no_secret_file_port_or_lemonade_and_still_serves() {
    let s = Sandbox::empty();
    let dir = s.extra().join("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("hostile.gguf");
    write_gguf(&model, "llama", None);
    // Another model, a token, a file of the user's: all beside, none its own.
    let other = s.extra().join("other.gguf");
    write_gguf(&other, "llama", None);
    let token = s.dir.path().join("hf-home").join("token");
    std::fs::create_dir_all(token.parent().unwrap()).unwrap();
    std::fs::write(&token, "hf_SECRETSECRETSECRET").unwrap();
    let ssh = s.dir.path().join(".ssh").join("id_ed25519");
    std::fs::create_dir_all(ssh.parent().unwrap()).unwrap();
    std::fs::write(&ssh, "-----BEGIN OPENSSH PRIVATE KEY-----").unwrap();
    let note = s.cache().join("user_models.json");
    std::fs::write(&note, "{}").unwrap();
    let fake = fake_llama_server();
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()), ("HF_TOKEN", "hf_SECRETSECRETSECRET")];
    let l = Lemonade::start_in(bin(), s, &[], &env).await;
    let (_, health) = l.get("/api/v1/health").await;
    assert_strict(&health["sandbox"]);

    // A port that is not its own, listening: lemonade's.
    let outside = s_path(&l, "outside.txt");
    let knobs = json!({"hostile": {
        "read": [token, ssh, other, note],
        "write": [outside, dir.join("dropped.gguf"), l.sandbox.cache().join("config.json")],
        "connect": [l.port()],
        "bind": [l.port() + 1],
        "shell": format!("cat {}; echo pwned > {}; kill -0 {{ppid}}", token.display(), s_path(&l, "shell.txt").display()),
    }});
    std::fs::write(format!("{}.json", model.display()), knobs.to_string()).unwrap();

    let name = "extra.hostile";
    let (code, answer) = l.post("/api/v1/chat/completions", &chat(name, "hi", 2)).await;
    assert_eq!(code, 200, "it still serves: {answer}");
    let (_, h) = l.get("/api/v1/health").await;
    let entry = h["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == name).unwrap().clone();
    assert_strict(&entry["sandbox"]);
    let base = entry["backend_url"].as_str().unwrap().trim_end_matches("/v1").to_string();
    let report: Value = l.http.get(format!("{base}/hostile")).send().await.unwrap().json().await.unwrap();
    let tried = report.as_object().unwrap();
    assert!(tried.len() >= 11, "{report:#}");
    for (what, outcome) in tried {
        if what == "shell" {
            continue;
        }
        let outcome = outcome.as_str().unwrap();
        assert!(
            outcome.contains("Permission denied") || outcome.contains("Operation not permitted"),
            "{what} was not refused: {outcome}"
        );
    }
    let shell = &report["shell"];
    assert!(!shell["stdout"].as_str().unwrap().contains("SECRET"), "the shell read the token: {shell}");
    assert_ne!(shell["status"], 0, "{shell}");
    let said = shell["stderr"].as_str().unwrap();
    assert!(said.contains("Permission denied") && said.contains("kill"), "{shell}");
    for p in [s_path(&l, "outside.txt"), s_path(&l, "shell.txt"), dir.join("dropped.gguf")] {
        assert!(!p.exists(), "{} was written", p.display());
    }
    // And nothing lemonade keeps was touched.
    let config = std::fs::read_to_string(l.sandbox.cache().join("config.json")).unwrap_or_default();
    assert!(!config.contains("pwned"));
}

/// A path in the test's temporary folder (the user's home there), outside every backend's.
fn s_path(l: &Lemonade, name: &str) -> std::path::PathBuf {
    l.sandbox.dir.path().join(name)
}

#[tokio::test]
async fn the_real_llama_server_serves_sandboxed_and_its_process_says_so() {
    let l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    let m = &h["all_models_loaded"][0];
    assert_strict(&m["sandbox"]);
    let pid = m["pid"].as_u64().unwrap();
    // The kernel's own word: the process has no_new_privs and sits in a Landlock domain (a
    // Landlock-confined process cannot read its parent's environment).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{status}");
    let (_, sched) = l.get("/api/v1/scheduler").await;
    let row = sched["models"].as_array().unwrap().iter().find(|r| r["model_name"] == SMOL).unwrap();
    assert_strict(&row["sandbox"]);
}

#[tokio::test]
async fn strict_is_refused_where_asked_off_is_said_and_a_bad_mode_is_an_error() {
    let l = Lemonade::start(bin(), &["--sandbox", "off"]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["sandbox"]["mode"], "off");
    assert_eq!(h["sandbox"]["filesystem"], false);
    assert!(h["sandbox"]["missing"][0].as_str().unwrap().contains("all of the user's rights"), "{h}");
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["sandbox"]["mode"], "off");
    drop(l);
    let out = std::process::Command::new(bin()).args(["serve", "--sandbox", "on"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("'on' is not strict, best-effort or off"));
}
