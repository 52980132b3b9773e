//! The downloader against the Hub double on 127.0.0.1 (real files, injected faults).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lemonade_host::catalogue::{self, CatalogueConfig};
use lemonade_host::hub::{Download, Hub, HubError, RetryPolicy};
use registry::plan::plan;
use test_support::hub::{HubDouble, Knobs, COMMIT};

fn fast(hub: &mut Hub) {
    *hub.policy_mut() = RetryPolicy {
        attempts: 4,
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        stall: Duration::from_secs(5),
    };
}

/// A repo of the double: `files` = (relative path, contents).
fn repo(root: &Path, repo: &str, files: &[(&str, Vec<u8>)]) {
    for (p, bytes) in files {
        let path = root.join(repo).join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

async fn pull(hub: &Hub, cache: &Path, repo: &str, variant: &str) -> Result<Vec<PathBuf>, HubError> {
    let (commit, files) = hub.list(repo, "main").await?;
    let listings = BTreeMap::from([(repo.to_string(), files.clone())]);
    let ck = BTreeMap::from([("main".to_string(), format!("{repo}:{variant}"))]);
    let planned = plan(&ck, &listings).expect("plan");
    let mut out = Vec::new();
    for p in planned {
        let f = files.iter().find(|f| f.path == p.path).unwrap();
        let job = Download { repo: &p.repo, commit: &commit, file: f, dest_repo: repo, dest: &p.dest };
        out.push(hub.download(cache, &job, &mut |_, _| true).await?);
    }
    Ok(out)
}

#[tokio::test]
async fn a_real_gguf_lands_in_the_huggingface_hub_layout_and_the_registry_sees_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    let smol = std::fs::read(test_support::model(test_support::SMOL_FILE)).unwrap();
    repo(
        &root,
        "HuggingFaceTB/SmolLM2-GGUF",
        &[
            ("SmolLM2-135M-Instruct.Q4_1.gguf", smol.clone()),
            ("config.json", b"{}".to_vec()),
            ("README.md", b"x".to_vec()),
        ],
    );
    let double = HubDouble::start(&root, Knobs::default()).await;
    let hub = Hub::new(&double.url, None);
    let cache = tmp.path().join("cache");
    let paths = pull(&hub, &cache, "HuggingFaceTB/SmolLM2-GGUF", "Q4_1").await.unwrap();
    assert_eq!(paths.len(), 2, "the GGUF and config.json, not the README");

    let repo_dir = cache.join("models--HuggingFaceTB--SmolLM2-GGUF");
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), COMMIT);
    let link = repo_dir.join("snapshots").join(COMMIT).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let sha = double.sha256("HuggingFaceTB/SmolLM2-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(std::fs::read_link(&link).unwrap(), PathBuf::from("../../blobs").join(&sha));
    assert_eq!(std::fs::read(&link).unwrap(), smol, "the blob holds the exact bytes");
    assert!(!repo_dir.join("blobs").join(format!("{sha}.incomplete")).exists());

    let lemonade_dir = tmp.path().join("lemonade");
    std::fs::create_dir_all(&lemonade_dir).unwrap();
    std::fs::write(
        lemonade_dir.join("user_models.json"),
        r#"{"Smol": {"checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"}}"#,
    )
    .unwrap();
    let cfg = CatalogueConfig {
        cache_dir: lemonade_dir,
        hf_cache: cache,
        extra_models_dir: None,
        physical_memory_gb: None,
        disable_filtering: false,
    };
    let reg = catalogue::load(&cfg).unwrap();
    assert!(reg.get("user.Smol").unwrap().downloaded);

    // huggingface_hub itself finds the file and reads the cache without warnings.
    let script = r#"
import json, sys
from huggingface_hub import try_to_load_from_cache, scan_cache_dir
cache = sys.argv[1]
path = try_to_load_from_cache("HuggingFaceTB/SmolLM2-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf", cache_dir=cache)
info = scan_cache_dir(cache)
repo = [r for r in info.repos if r.repo_id == "HuggingFaceTB/SmolLM2-GGUF"][0]
print(json.dumps({"path": str(path), "size": repo.size_on_disk, "refs": sorted(repo.refs),
                  "files": sorted(f.file_name for rev in repo.revisions for f in rev.files),
                  "warnings": [str(w) for w in info.warnings]}))
"#;
    let out =
        std::process::Command::new(test_support::python()).args(["-c", script]).arg(&cfg.hf_cache).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["path"], link.display().to_string());
    assert_eq!(v["files"], serde_json::json!(["SmolLM2-135M-Instruct.Q4_1.gguf", "config.json"]));
    assert_eq!(v["refs"], serde_json::json!(["main"]));
    assert_eq!(v["warnings"], serde_json::json!([]));
    assert_eq!(v["size"].as_u64().unwrap(), smol.len() as u64 + 2);

    // A second pull finds the blob and fetches nothing.
    let before = double.log().len();
    pull(&hub, &cfg.hf_cache, "HuggingFaceTB/SmolLM2-GGUF", "Q4_1").await.unwrap();
    assert_eq!(double.log().len(), before);
}

#[tokio::test]
async fn a_dropped_connection_resumes_with_range_and_refetches_no_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    repo(&root, "org/m", &[("m-Q4_0.gguf", pattern(3 << 20))]);
    let double =
        HubDouble::start(&root, Knobs { drop_after: Some(1 << 20), drop_times: 2, ..Default::default() }).await;
    let mut hub = Hub::new(&double.url, None);
    fast(&mut hub);
    let paths = pull(&hub, &tmp.path().join("cache"), "org/m", "Q4_0").await.unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), pattern(3 << 20));
    let ranges: Vec<Option<String>> = double.log().into_iter().map(|l| l.range).collect();
    assert_eq!(
        ranges,
        [None, Some("bytes=1048576-".into()), Some("bytes=2097152-".into())],
        "each retry starts where the last stopped"
    );
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    repo(&root, "org/m", &[("m-Q4_0.gguf", pattern(1000))]);
    let double = HubDouble::start(&root, Knobs { fail_first: 2, ..Default::default() }).await;
    let mut hub = Hub::new(&double.url, None);
    fast(&mut hub);
    pull(&hub, &tmp.path().join("cache"), "org/m", "Q4_0").await.unwrap();
    let statuses: Vec<u16> = double.log().iter().map(|l| l.status).collect();
    assert_eq!(statuses, [503, 503, 200]);

    let (commit, files) = hub.list("org/m", "main").await.unwrap();
    let mut missing = files[0].clone();
    missing.path = "absent.gguf".into();
    missing.blob = Some("absent".into());
    let before = double.log().len();
    let job = Download { repo: "org/m", commit: &commit, file: &missing, dest_repo: "org/m", dest: "absent.gguf" };
    let err = hub.download(&tmp.path().join("c2"), &job, &mut |_, _| true).await.unwrap_err();
    assert!(matches!(err, HubError::Status { status: 404, .. }), "{err}");
    assert_eq!(double.log().len(), before + 1, "a 404 is not retried");

    double.set_knobs(Knobs { token: Some("secret".into()), ..Default::default() });
    let err = pull(&hub, &tmp.path().join("c3"), "org/m", "Q4_0").await.unwrap_err();
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    let mut with_token = Hub::new(&double.url, Some("secret".into()));
    fast(&mut with_token);
    pull(&with_token, &tmp.path().join("c3"), "org/m", "Q4_0").await.unwrap();
}

#[tokio::test]
async fn a_sha256_mismatch_leaves_nothing_that_counts_as_downloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    repo(&root, "org/m", &[("m-Q4_0.gguf", pattern(4096))]);
    let double = HubDouble::start(&root, Knobs::default()).await;
    let mut hub = Hub::new(&double.url, None);
    fast(&mut hub);
    let (commit, files) = hub.list("org/m", "main").await.unwrap();
    // The file changes on the server after the listing (same size, other bytes).
    std::fs::write(root.join("org/m/m-Q4_0.gguf"), vec![7u8; 4096]).unwrap();
    let cache = tmp.path().join("cache");
    let job = Download { repo: "org/m", commit: &commit, file: &files[0], dest_repo: "org/m", dest: "m-Q4_0.gguf" };
    let err = hub.download(&cache, &job, &mut |_, _| true).await.unwrap_err();
    assert!(matches!(err, HubError::Sha256 { .. }), "{err}");
    let blobs: Vec<_> = std::fs::read_dir(cache.join("models--org--m/blobs")).unwrap().collect();
    assert!(blobs.is_empty(), "no blob and no partial file left");
    assert!(!cache.join("models--org--m/snapshots").exists(), "no snapshot link");
    let _ = double;
}

#[tokio::test]
async fn a_restart_resumes_from_the_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    repo(&root, "org/m", &[("m-Q4_0.gguf", pattern(2 << 20))]);
    let double =
        HubDouble::start(&root, Knobs { drop_after: Some(700_000), drop_times: 1, ..Default::default() }).await;
    let cache = tmp.path().join("cache");
    // First process: gives up after one attempt, as if killed mid-download.
    let mut first = Hub::new(&double.url, None);
    *first.policy_mut() = RetryPolicy { attempts: 1, ..RetryPolicy::default() };
    assert!(pull(&first, &cache, "org/m", "Q4_0").await.is_err());
    let sha = double.sha256("org/m", "m-Q4_0.gguf");
    let partial = cache.join("models--org--m/blobs").join(format!("{sha}.incomplete"));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 700_000, "the partial file is kept");
    // Second process: continues from byte 700000.
    let mut second = Hub::new(&double.url, None);
    fast(&mut second);
    let paths = pull(&second, &cache, "org/m", "Q4_0").await.unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), pattern(2 << 20));
    assert_eq!(double.log().last().unwrap().range.as_deref(), Some("bytes=700000-"));
}

/// A file with no listed size (a release archive) reports progress against the length the
/// server sends, across a dropped connection and its resume.
#[tokio::test]
async fn progress_without_a_listed_size_uses_the_length_the_server_sends() {
    use lemonade_host::download::{Downloader, Target};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    let dir = root.join("org/r/releases/download/v1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.tar.gz"), pattern(3 << 20)).unwrap();
    let double =
        HubDouble::start(&root, Knobs { drop_after: Some(1 << 20), drop_times: 1, ..Default::default() }).await;
    let mut d = Downloader::new(None);
    d.policy.first_backoff = Duration::from_millis(10);
    let target = Target { name: "a.tar.gz".into(), size: None, sha256: None };
    let mut seen = Vec::new();
    let url = format!("{}/org/r/releases/download/v1/a.tar.gz", double.url);
    d.fetch(&url, &tmp.path().join("a.tar.gz"), &target, &mut |done, total| {
        seen.push((done, total));
        true
    })
    .await
    .unwrap();
    assert!(seen.len() > 2, "{seen:?}");
    assert!(seen.iter().all(|(_, t)| *t == Some(3 << 20)), "every report knows the size: {seen:?}");
    assert!(seen.iter().any(|(d, _)| *d > 0 && *d < 3 << 20), "{seen:?}");
    assert_eq!(seen.last().unwrap().0, 3 << 20);
}
