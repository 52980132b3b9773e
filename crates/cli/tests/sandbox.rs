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
    l.placed(&token);
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
    assert!(String::from_utf8_lossy(&out.stderr).contains("'on' is not strict, best-effort, off or auto"));
}

/// Every key lemonade holds (its API key, its admin key, the Hub token, a provider's key):
/// after a session of requests (answers, errors, a model loaded, a failed pull, the CLI), none
/// of them is in an answer, the log, a file under the test's home, or the loaded backend's
/// command line or environment.
#[tokio::test]
async fn no_key_reaches_an_answer_a_log_a_file_or_a_backend() {
    const API: &str = "lk-API-5f1e9c2b7a63";
    const ADMIN: &str = "lk-ADMIN-8d3a6e0f4c19";
    const HF: &str = "hf_TOKEN4b9e2d7c1a08";
    const PROVIDER: &str = "sk-PROVIDER7e3c9a1f55";
    let env = [
        ("LEMONADE_API_KEY", API),
        ("LEMONADE_ADMIN_API_KEY", ADMIN),
        ("HF_TOKEN", HF),
        ("LEMONADE_ACME_API_KEY", PROVIDER),
    ];
    let l = Lemonade::start_in(bin(), Sandbox::new(), &[], &env).await;
    let mut seen = String::new();
    let asks: Vec<(&str, &str, Option<Value>, Option<&str>)> = vec![
        ("GET", "/api/v1/health", None, None),
        ("GET", "/api/v1/models", None, Some(API)),
        ("GET", "/api/v1/models", None, Some("wrong")),
        ("POST", "/api/v1/chat/completions", Some(chat(SMOL, "hi", 2)), Some(API)),
        ("GET", "/api/v1/health", None, Some(API)),
        ("GET", "/api/v1/system-info", None, Some(API)),
        ("GET", "/api/v1/scheduler", None, Some(API)),
        ("GET", "/metrics", None, Some(API)),
        ("GET", "/internal/config", None, Some(ADMIN)),
        ("GET", "/api/v1/cloud", None, Some(API)),
        ("POST", "/api/v1/load", Some(json!({"model_name": SMOL})), Some(API)),
        (
            "POST",
            "/api/v1/pull",
            Some(json!({"model_name": "user.Nope-GGUF", "checkpoint": "nobody/nope-GGUF:Q4_0", "recipe": "llamacpp"})),
            Some(ADMIN),
        ),
        ("GET", "/v1/admin/models", None, Some(ADMIN)),
    ];
    for (method, path, body, key) in asks {
        let mut r = match method {
            "GET" => l.http.get(l.url(path)),
            _ => l.http.post(l.url(path)).json(&body.unwrap_or(json!({}))),
        };
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        seen.push_str(&format!("{method} {path} {} {:?}\n", r.status(), r.headers()));
        seen.push_str(&r.text().await.unwrap_or_default());
    }
    assert!(seen.contains("Invalid or missing API key"), "the wrong key was refused");
    let (_, out, err) = l.cli_env(&["status"], &[("LEMONADE_API_KEY", API)]).await;
    seen.push_str(&out);
    seen.push_str(&err);
    let (_, h) = {
        let r = l.http.get(l.url("/api/v1/health")).bearer_auth(API).send().await.unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    let pid = h["all_models_loaded"][0]["pid"].as_u64().expect("a backend runs");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let log = l.log();
    let home = l.sandbox.dir.path().to_path_buf();
    for key in [API, ADMIN, HF, PROVIDER] {
        // The whole key and its distinctive middle: a key cut or quoted is still found.
        for needle in [key, &key[3..key.len() - 3]] {
            assert!(!seen.contains(needle), "{needle} in an answer");
            assert!(!log.contains(needle), "{needle} in the log");
            let hit = |b: &[u8]| b.windows(needle.len()).any(|w| w == needle.as_bytes());
            assert!(!hit(&cmdline) && !hit(&environ), "{needle} reached the backend");
            assert_eq!(files_containing(&home, needle), Vec::<std::path::PathBuf>::new(), "{needle} written");
        }
    }
}

/// `sandbox` is a configuration key like the others: `config.json` sets it, `/internal/set`
/// changes it for the next backends (checked: a bad value is a 400 naming it), the flag wins
/// over the file.
#[tokio::test]
async fn the_sandbox_is_a_configuration_key_for_the_next_backends() {
    let s = Sandbox::new();
    std::fs::write(s.cache().join("config.json"), r#"{"sandbox": "off"}"#).unwrap();
    let l = Lemonade::start_in(bin(), s, &[], &[]).await;
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["sandbox"]["mode"], "off", "{h}");
    let (_, c) = l.get("/internal/config").await;
    assert_eq!(c["sandbox"], "off", "{c}");
    let (code, e) = l.post("/internal/set", &json!({"sandbox": "on"})).await;
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("sandbox")), "{e}");
    assert_eq!(l.post("/internal/set", &json!({"sandbox": "strict"})).await.0, 200);
    assert_eq!(l.post("/api/v1/chat/completions", &chat(SMOL, "hi", 2)).await.0, 200);
    let (_, h) = l.get("/api/v1/health").await;
    assert_strict(&h["all_models_loaded"][0]["sandbox"]);
    assert_strict(&h["sandbox"]);
    // The flag wins over the file.
    let s = Sandbox::new();
    std::fs::write(s.cache().join("config.json"), r#"{"sandbox": "off"}"#).unwrap();
    let l = Lemonade::start_in(bin(), s, &["--sandbox", "best-effort"], &[]).await;
    assert_eq!(l.get("/api/v1/health").await.1["sandbox"]["mode"], "best-effort");
}

/// Kokoro installed as lemonade installs a backend: its launcher copied into a folder of its
/// own (`bin/kokoro/cpu/koko`, as `cargo xtask setup` and the demo have it), exec'ing a venv's
/// Python and a script kept elsewhere. Under the strict sandbox it still speaks: the launcher's
/// interpreter, script and venv are granted (the demo caught this; the other speech tests run
/// the launcher beside its venv).
#[tokio::test]
async fn real_kokoro_installed_apart_from_its_venv_speaks_sandboxed() {
    let s = Sandbox::new().with_kokoro();
    let installed = s.cache().join("bin/kokoro/cpu");
    std::fs::create_dir_all(&installed).unwrap();
    std::fs::copy(koko(), installed.join("koko")).unwrap();
    let launcher = installed.join("koko");
    let l = Lemonade::start_in(bin(), s, &[], &[("LEMONADE_KOKORO_CPU_BIN", launcher.to_str().unwrap())]).await;
    let r = l
        .http
        .post(l.url("/api/v1/audio/speech"))
        .json(&json!({"model": KOKORO, "input": "Hello from the sandbox."}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert!(bytes.starts_with(b"RIFF") && bytes.len() > 10_000, "a WAV: {} bytes", bytes.len());
    let (_, h) = l.get("/api/v1/health").await;
    assert_strict(&h["all_models_loaded"][0]["sandbox"]);
}
