//! Backend install and uninstall against a release double on 127.0.0.1 serving an archive
//! that holds the llama-server built by `cargo xtask setup`: success (then real inference on the
//! installed binary), checksum mismatch, a kill during extraction, uninstall, and auto-install
//! on first load.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::release::{self, asset_name};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const NEW: &str = "b9999";
const OLD: &str = "b1111";

struct Setup {
    _tmp: tempfile::TempDir,
    double: HubDouble,
    sha: String,
}

async fn releases(pad: u64) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let (_, sha) = release::write_archive(tmp.path(), NEW, pad);
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    Setup { _tmp: tmp, double, sha }
}

/// A sandbox with the SmolLM2 models and no llama-server override: the backend must come from
/// the managed directory (installed from the double).
async fn start(sandbox: Sandbox, s: &Setup) -> Lemonade {
    Lemonade::start_in(
        bin(),
        sandbox,
        &[],
        &[("LEMONADE_LLAMACPP_CPU_BIN", ""), ("LEMONADE_RELEASES_URL", &s.double.url)],
    )
    .await
}

fn backend_dir(l: &Lemonade) -> PathBuf {
    l.sandbox.cache().join("bin/llamacpp/cpu")
}

fn version(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("version.txt")).ok().map(|v| v.trim().to_string())
}

async fn cpu_state(l: &Lemonade) -> Value {
    let (s, v) = l.get("/api/v1/system-info").await;
    assert_eq!(s, 200);
    v["recipes"]["llamacpp"]["backends"]["cpu"].clone()
}

fn staging_is_empty(l: &Lemonade) -> bool {
    std::fs::read_dir(l.sandbox.cache().join("bin/.staging")).map(|d| d.count() == 0).unwrap_or(true)
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[tokio::test]
async fn install_runs_a_model_then_uninstall_removes_it() {
    let s = releases(0).await;
    let sandbox = Sandbox::new();
    release::pin(&sandbox.cache(), NEW, Some(&s.sha));
    let l = start(sandbox, &s).await;
    let st = cpu_state(&l).await;
    assert_eq!((st["state"].as_str(), st["version"].as_str()), (Some("installable"), Some(NEW)), "{st}");
    assert_eq!(st["download_filename"], asset_name(NEW));

    // Through the CLI, streaming progress.
    let (code, out, err) = l.cli(&["recipes", "--install", "llamacpp:cpu", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["recipe"].as_str(), v["backend"].as_str()),
        (Some("success"), Some("llamacpp"), Some("cpu"))
    );
    assert!(v["bytes"].as_u64().unwrap() > 1_000_000, "{v}");
    let dir = backend_dir(&l);
    assert_eq!(version(&dir).as_deref(), Some(NEW));
    assert!(same_bytes(&dir.join(format!("llama-{NEW}/llama-server")), &llama_server()));
    assert!(staging_is_empty(&l), "nothing left in the staging area");
    assert!(!l.sandbox.cache().join("bin/.downloads").join(asset_name(NEW)).exists(), "the archive is removed");
    let st = cpu_state(&l).await;
    assert_eq!((st["state"].as_str(), st["can_uninstall"].as_bool()), (Some("installed"), Some(true)), "{st}");

    // Installed again: one `complete` event with 0 bytes, nothing downloaded.
    let fetched = l_fetches(&s);
    let r = l
        .http
        .post(l.url("/api/v1/install"))
        .json(&json!({"recipe": "llamacpp", "backend": "cpu", "stream": true}))
        .send()
        .await
        .unwrap();
    let events = r.text().await.unwrap();
    assert_eq!(events.matches("event: ").count(), 1, "{events}");
    assert!(events.starts_with("event: complete") && events.contains("\"bytes_downloaded\":0"), "{events}");
    assert_eq!(l_fetches(&s), fetched);

    // The installed backend serves real inference.
    let (st, v) = l.chat(SMOL).await;
    assert_eq!(st, 200, "{v}");
    let backend = child_pids(l.pid());
    assert_eq!(backend.len(), 1);
    let exe = std::fs::read_link(format!("/proc/{}/exe", backend[0])).unwrap();
    assert!(exe.starts_with(&dir), "llama-server runs from {}", exe.display());

    // Uninstall unloads the model first, then removes the directory.
    let (code, out, err) = l.cli(&["recipes", "--uninstall", "llamacpp:cpu"]).await;
    assert_eq!((code, out.trim()), (0, "Backend uninstalled successfully: llamacpp:cpu"), "{err}");
    assert!(!dir.exists());
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
    assert!(!alive(backend[0]), "the backend process stopped");
    assert_eq!(cpu_state(&l).await["state"], "installable");
    // Uninstall is idempotent (as Lemonade): nothing to remove is 200, with a message.
    let (s2, v) = l.post("/api/v1/uninstall", &json!({"recipe": "llamacpp", "backend": "cpu"})).await;
    assert_eq!(s2, 200, "{v}");
    assert_eq!(v["status"], "success", "{v}");
    assert_eq!(v["message"], "llamacpp:cpu is not installed; nothing to remove", "{v}");

    // Bad requests are 400 with precise messages.
    for (body, needle) in [
        (json!({"recipe": "llamacpp"}), "Both 'recipe' and 'backend' are required"),
        (json!({"recipe": "nope", "backend": "cpu"}), "Unknown recipe: nope"),
        (json!({"recipe": "llamacpp", "backend": "cuda"}), "Unknown backend 'cuda' for llamacpp"),
        (json!({"recipe": "llamacpp", "backend": "metal"}), "Requires macOS"),
        (
            json!({"recipe": "whispercpp", "backend": "cpu"}),
            "whispercpp:cpu has no release archive for this platform; set LEMONADE_WHISPERCPP_CPU_BIN",
        ),
        (json!({"recipe": "flm", "backend": "npu"}), "Requires AMD XDNA 2 AMD NPU"),
    ] {
        let (st, v) = l.post("/api/v1/install", &body).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
}

fn l_fetches(s: &Setup) -> usize {
    s.double.log().iter().filter(|r| r.path.ends_with(".tar.gz")).count()
}

#[tokio::test]
async fn a_checksum_mismatch_keeps_the_old_backend() {
    let s = releases(0).await;
    let sandbox = Sandbox::new();
    let old = release::install_old(&sandbox.cache(), OLD);
    release::pin(&sandbox.cache(), NEW, Some(&"0".repeat(64)));
    let l = start(sandbox, &s).await;
    assert_eq!(cpu_state(&l).await["state"], "update_required");
    let (st, v) = l.post("/api/v1/install", &json!({"recipe": "llamacpp", "backend": "cpu"})).await;
    assert_eq!(st, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("sha256") && msg.contains(&s.sha), "{msg}");
    assert_eq!(version(&old).as_deref(), Some(OLD), "the old backend is kept");
    assert!(same_bytes(&old.join("llama-server"), &llama_server()));
    assert!(staging_is_empty(&l));
    // The old backend still serves.
    let (st, v) = l.chat(SMOL).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn a_kill_during_extraction_leaves_the_old_backend_whole() {
    // 256 MiB of zeros after llama-server: extraction takes long enough to be caught in it.
    const PAD: u64 = 256 << 20;
    let s = releases(PAD).await;
    let sandbox = Sandbox::new();
    let old = release::install_old(&sandbox.cache(), OLD);
    release::pin(&sandbox.cache(), NEW, Some(&s.sha));
    let l = start(sandbox, &s).await;
    let staging = l.sandbox.cache().join("bin/.staging");
    let url = l.url("/api/v1/install");
    let http = l.http.clone();
    let install = tokio::spawn(async move {
        http.post(url).json(&json!({"recipe": "llamacpp", "backend": "cpu"})).send().await.map(|r| r.status().as_u16())
    });
    // Wait until the new tree is half written: llama-server out, the padding being written.
    let caught = wait_for(Duration::from_secs(60), || {
        let staging = staging.clone();
        async move {
            let tree = std::fs::read_dir(&staging).ok()?.filter_map(|e| e.ok()).next()?.path();
            let pad = tree.join(format!("llama-{NEW}/pad.bin"));
            let len = std::fs::metadata(&pad).ok()?.len();
            (len > 0 && len < PAD).then_some(len)
        }
    })
    .await;
    let sandbox = l.kill_keeping_sandbox();
    assert!(caught.is_some(), "never saw the extraction in progress");
    assert!(install.await.unwrap().is_err(), "the request died with the server");
    assert_eq!(version(&old).as_deref(), Some(OLD), "the old backend is whole");
    assert!(same_bytes(&old.join("llama-server"), &llama_server()));
    assert!(!old.join(format!("llama-{NEW}")).exists(), "nothing of the new one mixed in");

    // A restart removes the half-written tree; installing again completes (the verified
    // archive from the first attempt is reused, checked again).
    let l = start(sandbox, &s).await;
    assert!(staging_is_empty(&l), "leftovers removed at start-up");
    let fetched = l_fetches(&s);
    let (st, v) = l.post("/api/v1/install", &json!({"recipe": "llamacpp", "backend": "cpu"})).await;
    assert_eq!((st, v["version"].as_str()), (200, Some(NEW)), "{v}");
    assert_eq!(l_fetches(&s), fetched, "the archive was not downloaded again");
    assert_eq!(version(&old).as_deref(), Some(NEW));
    assert!(!old.join("llama-server").exists(), "the old tree was replaced as a whole");
}

#[tokio::test]
async fn the_first_load_installs_a_missing_backend() {
    let s = releases(0).await;
    let sandbox = Sandbox::new();
    release::pin(&sandbox.cache(), NEW, Some(&s.sha));
    let l = start(sandbox, &s).await;
    assert!(!backend_dir(&l).exists());
    let (st, v) = l.chat(SMOL).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(version(&backend_dir(&l)).as_deref(), Some(NEW));
    assert_eq!(l_fetches(&s), 1);
    assert!(l.log().contains("backend not installed: installing it before loading"), "{}", l.log());
}

#[tokio::test]
async fn a_backend_that_cannot_be_installed_fails_the_load_clearly() {
    // No release double: the download fails, and the load says why.
    let sandbox = Sandbox::new();
    release::pin(&sandbox.cache(), NEW, None);
    let l = Lemonade::start_in(
        bin(),
        sandbox,
        &[],
        &[
            ("LEMONADE_LLAMACPP_CPU_BIN", ""),
            ("LEMONADE_RELEASES_URL", "http://127.0.0.1:9"),
            ("LEMONADE_RETRY_BACKOFF_MS", "20"),
        ],
    )
    .await;
    let (st, v) = l.chat(SMOL).await;
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((st, v["error"]["code"].as_str()), (500, Some("model_load_error")), "{v}");
    assert!(msg.contains("Download of llamacpp:cpu failed") && msg.contains("gave up after 4 attempts"), "{msg}");
    assert!(!backend_dir(&l).exists(), "nothing half-installed");
    // The system backend: llama-server from PATH, never downloaded.
    drop(l);
    let sandbox = Sandbox::new();
    let pathdir = sandbox.dir.path().join("pathbin");
    std::fs::create_dir_all(&pathdir).unwrap();
    std::os::unix::fs::symlink(llama_server(), pathdir.join("llama-server")).unwrap();
    let path = format!("{}:{}", pathdir.display(), std::env::var("PATH").unwrap());
    let l = Lemonade::start_in(
        bin(),
        sandbox,
        &["--llamacpp", "system"],
        &[("LEMONADE_LLAMACPP_CPU_BIN", ""), ("PATH", &path), ("LEMONADE_RELEASES_URL", "http://127.0.0.1:9")],
    )
    .await;
    let st = l.get("/api/v1/system-info").await.1["recipes"]["llamacpp"]["backends"]["system"].clone();
    assert_eq!(st["state"], "installed", "{st}");
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn an_unload_during_the_install_before_a_load_cancels_it_at_once() {
    // The first load installs llama-server from a slow release site (at least 8 s of the
    // double's sleeps); an unload in the meantime finds no process yet. It must still cancel
    // the load at once, and no backend may start once the install is done.
    let s = releases(0).await;
    s.double.set_knobs(Knobs { chunk_delay: Some(Duration::from_millis(100)), ..Default::default() });
    let sandbox = Sandbox::new();
    release::pin(&sandbox.cache(), NEW, Some(&s.sha));
    let l = start(sandbox, &s).await;
    let load = tokio::spawn({
        let (http, url) = (l.http.clone(), l.url("/api/v1/load"));
        async move {
            let r = http.post(url).json(&json!({"model_name": SMOL})).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    });
    let installing = wait_for(Duration::from_secs(20), || async {
        (l.log().contains("backend not installed: installing it before loading")).then_some(())
    })
    .await;
    assert!(installing.is_some(), "the load is installing the backend");
    let t = std::time::Instant::now();
    let (st, v) = l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = load.await.unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("conflict")), "{v}");
    assert!(t.elapsed() < Duration::from_secs(4), "cancelled at once, not after the install: {:?}", t.elapsed());
    // The install itself finishes (it is shared); no llama-server is started for the cancelled load.
    let installed =
        wait_for(Duration::from_secs(60), || async { (cpu_state(&l).await["state"] == "installed").then_some(()) })
            .await;
    assert!(installed.is_some(), "the install completed");
    let (_, v) = l.get("/v1/admin/models").await;
    let row = v["models"].as_array().unwrap().iter().find(|m| m["name"] == SMOL).unwrap().clone();
    assert_eq!(row["runtime_state"], "unloaded", "{row}");
    assert!(child_pids(l.pid()).is_empty(), "no backend was started for the cancelled load");
}
