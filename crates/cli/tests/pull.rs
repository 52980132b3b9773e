//! Pull and delete through the real binary, against the Hub double on 127.0.0.1; the pulled
//! model is then served by real llama-server.

use std::path::Path;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

async fn setup(knobs: Knobs) -> (tempfile::TempDir, HubDouble, Lemonade) {
    setup_with(knobs, &[], &[]).await
}

/// The Hub double's repositories (the real models are symlinked, not copied), and lemonade
/// started with `args` and `env` against it.
async fn setup_with(knobs: Knobs, args: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, HubDouble, Lemonade) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    let smol = root.join("HuggingFaceTB/SmolLM2-GGUF");
    std::fs::create_dir_all(&smol).unwrap();
    std::os::unix::fs::symlink(model(SMOL_FILE), smol.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    std::fs::write(smol.join("config.json"), "{}").unwrap();
    // The catalogue's Qwen3-0.6B-GGUF (unsloth/Qwen3-0.6B-GGUF:Q4_0), played by SmolLM2's bytes.
    let qwen = root.join("unsloth/Qwen3-0.6B-GGUF");
    std::fs::create_dir_all(&qwen).unwrap();
    std::os::unix::fs::symlink(model(SMOL_FILE), qwen.join("Qwen3-0.6B-Q4_0.gguf")).unwrap();
    let big = root.join("org/big-GGUF");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(big.join("big-Q4_0.gguf"), (0..3u32 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
    let shard = root.join("org/shard-GGUF");
    std::fs::create_dir_all(&shard).unwrap();
    for f in ["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf", "m-Q8_0.gguf", "mmproj-f16.gguf"] {
        std::fs::write(shard.join(f), f.as_bytes()).unwrap();
    }
    let double = HubDouble::start(&root, knobs).await;
    let url = double.url.clone();
    let mut env = env.to_vec();
    env.push(("HF_ENDPOINT", &url));
    let l = Lemonade::start_in(bin(), Sandbox::empty(), args, &env).await;
    (tmp, double, l)
}

/// v9's `test_021_pull_multi`: a multi-checkpoint sd-cpp pull with `recipe_options` keeps the
/// recipe's own options (the backend included) as the model's saved options; a bad option
/// value registers nothing.
#[tokio::test]
async fn a_pull_with_recipe_options_saves_the_recipes_own() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let checkpoints = json!({"main": "org/shard-GGUF:m-Q8_0.gguf", "text_encoder": "org/shard-GGUF:mmproj-f16.gguf",
                             "vae": "org/big-GGUF:big-Q4_0.gguf"});
    let bad =
        json!({"model": "user.Bad", "checkpoints": checkpoints, "recipe": "sd-cpp", "recipe_options": {"steps": 0}});
    let (s, e) = l.post("/api/v1/pull", &bad).await;
    assert_eq!((s, e["param"].as_str()), (400, Some("steps")), "{e}");
    assert_eq!(l.get("/api/v1/models/user.Bad").await.0, 404, "a refused pull registers nothing");

    let body = json!({"model": "user.Dummy", "checkpoints": checkpoints, "recipe": "sd-cpp",
                      "recipe_options": {"sd-cpp_backend": "cpu", "steps": 3, "ctx_size": 2048}});
    let (s, v) = l.post("/api/v1/pull", &body).await;
    assert_eq!(s, 200, "{v}");
    let (_, m) = l.get("/api/v1/models/user.Dummy").await;
    assert!(m["labels"].as_array().unwrap().contains(&json!("image")), "{m}");
    assert_eq!(m["recipe_options"], json!({"sd-cpp_backend": "cpu", "steps": 3}), "ctx_size is no sd-cpp option");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("recipe_options.json")).unwrap()).unwrap();
    assert_eq!(saved, json!({"user.Dummy": {"sd-cpp_backend": "cpu", "steps": 3}}));
    let (_, o) = l.get("/api/v1/models/user.Dummy/options").await;
    assert_eq!((o["effective"]["steps"].clone(), o["defaults"]["steps"].clone()), (json!(3), json!(20)), "{o}");
}

#[tokio::test]
async fn pull_registers_downloads_and_the_model_then_answers() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let body = json!({"model": "user.Smol", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"});
    let (s, v) = l.post("/api/v1/pull", &body).await;
    // Listed (and named in the answer) by its bare name, as current Lemonade lists it.
    assert_eq!((s, v.clone()), (200, json!({"status": "success", "model_name": "Smol"})));
    let (_, m) = l.get("/api/v1/models/user.Smol").await;
    assert_eq!(m["downloaded"], true, "{m}");
    assert_eq!(m["labels"], json!(["custom"]));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(saved["Smol"]["checkpoint"], "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "stored without the user. prefix");
    let (s, v) = l.post("/api/v1/chat/completions", &json!({"model": "user.Smol", "messages": [{"role": "user", "content": "Which city is the capital of France?"}], "max_tokens": 12, "temperature": 0})).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("Paris"), "{v}");

    // Delete: unloads, removes the files and the registration.
    let (s, v) = l.post("/api/v1/delete", &json!({"model": "user.Smol"})).await;
    assert_eq!((s, v["message"].as_str()), (200, Some("Deleted model: user.Smol")));
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
    assert!(!l.sandbox.hf_cache().join("models--HuggingFaceTB--SmolLM2-GGUF").exists());
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(saved, json!({}));
    let (s, _) = l.post("/api/v1/delete", &json!({"model": "user.Smol"})).await;
    assert_eq!(s, 422);
}

#[tokio::test]
async fn streaming_pull_reports_progress_and_survives_a_dropped_connection() {
    let (_tmp, double, l) = setup(Knobs { drop_after: Some(1 << 20), drop_times: 1, ..Default::default() }).await;
    let body = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp", "stream": true});
    let r = l.http.post(l.url("/api/v1/pull")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    // Read as it comes: the moment `complete` arrives, the model already lists as downloaded
    // (a client such as the web UI refreshes its list on `complete`).
    let mut text = String::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if text.contains("event: complete") {
            let (_, m) = l.get("/api/v1/models/user.Big").await;
            assert_eq!(m["downloaded"], true, "listed as downloaded when `complete` is sent");
        }
    }
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let kind = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap().to_string();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (kind, serde_json::from_str(data).unwrap())
        })
        .collect();
    let progress: Vec<&Value> = events.iter().filter(|(k, _)| k == "progress").map(|(_, v)| v).collect();
    assert!(progress.len() >= 2, "{text}");
    for p in &progress {
        for key in ["file", "file_index", "total_files", "bytes_downloaded", "bytes_total", "percent"] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
    }
    assert_eq!(progress[0]["percent"], 0);
    assert_eq!(progress.last().unwrap()["percent"], 100);
    assert_eq!(events.iter().filter(|(k, _)| k == "complete").count(), 1, "{text}");
    assert_eq!(events.last().unwrap().1["percent"], 100);
    let ranges: Vec<Option<String>> = double.log().into_iter().map(|l| l.range).collect();
    assert_eq!(ranges, [None, Some("bytes=1048576-".into())], "resumed where the connection dropped");
    let (_, m) = l.get("/api/v1/models/user.Big").await;
    assert_eq!(m["downloaded"], true);
}

#[tokio::test]
async fn pull_rejects_bad_requests_precisely() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let cases = [
        (
            json!({"model": "Smol", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"}),
            "must include the `user.` prefix",
        ),
        (
            json!({"model": "user.X", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF"}),
            "provide the `checkpoint` and `recipe`",
        ),
        (
            json!({"model": "user.X", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF", "recipe": "llamacpp"}),
            "provide a 'variant'",
        ),
        (
            json!({"model": "user.X", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q9_9", "recipe": "llamacpp"}),
            "No .gguf files found for variant Q9_9",
        ),
        (json!({"model": "user.X", "checkpoint": "nobody/nothing-GGUF:Q4_0", "recipe": "llamacpp"}), "HTTP 404"),
        (json!({"model": "NotAModel"}), "must include the `user.` namespace"),
    ];
    for (body, needle) in cases {
        let (s, e) = l.post("/api/v1/pull", &body).await;
        assert_eq!(s, 400, "{body}: {e}");
        assert!(e["error"].as_str().unwrap().contains(needle), "{body}: {e}");
    }
}

#[tokio::test]
async fn inference_on_a_catalogue_model_pulls_it_first() {
    let (_tmp, double, l) = setup(Knobs::default()).await;
    let (_, m) = l.get("/api/v1/models/Qwen3-0.6B-GGUF").await;
    assert_eq!(m["downloaded"], false);
    let (s, v) = l
        .post(
            "/api/v1/chat/completions",
            &json!({"model": "Qwen3-0.6B-GGUF", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(!v["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
    let (_, m) = l.get("/api/v1/models/Qwen3-0.6B-GGUF").await;
    assert_eq!(m["downloaded"], true);
    assert!(l.log().contains("pulling it before loading"), "the wait is visible in the log");
    assert_eq!(double.log().len(), 1, "one file fetched");
}

#[tokio::test]
async fn two_concurrent_pulls_of_one_model_make_one_download() {
    let (_tmp, double, l) = setup(Knobs::default()).await;
    let body = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp"});
    let (a, b) = tokio::join!(l.post("/api/v1/pull", &body), l.post("/api/v1/pull", &body));
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    let gets: Vec<_> = double.log().into_iter().filter(|r| r.path.ends_with("big-Q4_0.gguf")).collect();
    assert_eq!(gets.len(), 1, "{gets:?}");
}

#[tokio::test]
async fn pull_by_catalogue_name_sharded_and_mmproj() {
    let (_tmp, _double, l) = setup(Knobs { fail_first: 2, ..Default::default() }).await;
    let (s, v) = l.post("/api/v1/pull", &json!({"model": "Qwen3-0.6B-GGUF"})).await;
    assert_eq!(s, 200, "two 503s were retried: {v}");
    assert_eq!(l.get("/api/v1/models/Qwen3-0.6B-GGUF").await.1["downloaded"], true);

    let body = json!({"model": "user.Shard", "checkpoint": "org/shard-GGUF:Q4_0", "recipe": "llamacpp", "mmproj": "mmproj-f16.gguf", "vision": true});
    let (s, v) = l.post("/api/v1/pull", &body).await;
    assert_eq!(s, 200, "{v}");
    let snap = l.sandbox.hf_cache().join("models--org--shard-GGUF/snapshots").join(test_support::hub::COMMIT);
    let mut files: Vec<String> =
        std::fs::read_dir(&snap).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(
        files,
        ["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf", "mmproj-f16.gguf"],
        "both shards and the mmproj, not Q8_0"
    );
    let (_, m) = l.get("/api/v1/models/user.Shard").await;
    assert_eq!(m["downloaded"], true);
    assert_eq!(m["labels"], json!(["custom", "vision"]));
    assert_eq!(m["checkpoints"]["mmproj"], "org/shard-GGUF:mmproj-f16.gguf");
}

#[tokio::test]
async fn a_sha256_mismatch_is_a_clear_error_and_nothing_counts_as_downloaded() {
    let (_tmp, _double, l) = setup(Knobs { corrupt: true, ..Default::default() }).await;
    let (s, e) = l
        .post("/api/v1/pull", &json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp"}))
        .await;
    assert_eq!(s, 502, "{e}");
    assert!(e["error"].as_str().unwrap().contains("sha256"), "{e}");
    assert_eq!(l.get("/api/v1/models/user.Big").await.1["downloaded"], false);
    let blobs = l.sandbox.hf_cache().join("models--org--big-GGUF/blobs");
    assert_eq!(std::fs::read_dir(blobs).unwrap().count(), 0, "no blob, no partial");
}

#[tokio::test]
async fn a_pull_resumes_after_lemonade_itself_was_killed() {
    let (_tmp, double, l) =
        setup(Knobs { chunk_delay: Some(std::time::Duration::from_millis(15)), ..Default::default() }).await;
    let body = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp", "stream": true});
    let r = l.http.post(l.url("/api/v1/pull")).json(&body).send().await.unwrap();
    let stream = r.bytes_stream();
    // Kill lemonade once part of the file is on disk.
    let blobs = l.sandbox.hf_cache().join("models--org--big-GGUF/blobs");
    let partial_len = || {
        std::fs::read_dir(&blobs)
            .ok()?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
            .and_then(|e| e.metadata().ok())
            .map(|m| m.len())
    };
    let on_disk = wait_for(std::time::Duration::from_secs(10), || async { partial_len().filter(|n| *n > 0) }).await;
    assert!(on_disk.is_some(), "part of the file reached the disk");
    let sandbox = l.kill_keeping_sandbox();
    drop(stream);
    double.set_knobs(Knobs::default());
    let url = double.url.clone();
    let l = Lemonade::start_in(bin(), sandbox, &[], &[("HF_ENDPOINT", &url)]).await;
    let (s, v) = l.post("/api/v1/pull", &json!({"model": "user.Big"})).await;
    assert_eq!(s, 200, "the registration survived the kill and the pull completes: {v}");
    let last = double.log().last().unwrap().clone();
    let from: u64 = last
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse().ok())
        .unwrap_or(0);
    assert!(from > 0, "resumed from the partial file: {last:?}");
    assert_eq!(l.get("/api/v1/models/user.Big").await.1["downloaded"], true);
}

#[tokio::test]
async fn delete_during_a_load_cancels_it_and_leaves_nothing_loaded_or_stored() {
    // The fake backend, told to take 30 s to load: the delete lands while it loads.
    let fake = fake_llama_server();
    let (_tmp, _double, l) =
        setup_with(Knobs::default(), &[], &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())]).await;
    let body = json!({"model": "user.Smol", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"});
    assert_eq!(l.post("/api/v1/pull", &body).await.0, 200);
    let snapshots = l.sandbox.hf_cache().join("models--HuggingFaceTB--SmolLM2-GGUF/snapshots");
    let snap = std::fs::read_dir(&snapshots).unwrap().next().unwrap().unwrap().path();
    std::fs::write(snap.join("SmolLM2-135M-Instruct.Q4_1.gguf.json"), r#"{"load_delay_ms": 30000}"#).unwrap();
    let load = tokio::spawn({
        let (http, url) = (l.http.clone(), l.url("/api/v1/load"));
        async move {
            let r = http.post(url).json(&json!({"model_name": "user.Smol"})).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    });
    let starting = wait_for(std::time::Duration::from_secs(10), || async {
        let (_, v) = l.get("/v1/admin/models").await;
        let row = v["models"].as_array()?.iter().find(|m| m["name"] == "user.Smol")?.clone();
        let children = child_pids(l.pid());
        (row["runtime_state"] == "loading" && children.len() == 1).then_some(children)
    })
    .await
    .expect("the backend is starting");
    let t = std::time::Instant::now();
    let (s, v) = l.post("/api/v1/delete", &json!({"model": "user.Smol"})).await;
    assert_eq!((s, v["message"].as_str()), (200, Some("Deleted model: user.Smol")), "{v}");
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "the delete did not wait for the 30 s load");
    let (s, v) = load.await.unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("conflict")), "the load was cancelled: {v}");
    assert!(!alive(starting[0]), "the starting backend was stopped");
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());
    assert!(!l.sandbox.hf_cache().join("models--HuggingFaceTB--SmolLM2-GGUF").exists());
    assert_eq!(l.get("/api/v1/models/user.Smol").await.0, 404, "the registration is gone");
}

#[tokio::test]
async fn an_automatic_pull_that_exceeds_the_pull_timeout_fails_and_keeps_its_partial_file() {
    let slow = Knobs { chunk_delay: Some(std::time::Duration::from_millis(50)), ..Default::default() };
    let (_tmp, double, l) = setup_with(slow, &["--pull-timeout", "1"], &[]).await;
    let t = std::time::Instant::now();
    let (s, v) = l.chat("Qwen3-0.6B-GGUF").await;
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(s, 502, "{v}");
    assert_eq!(msg, "Pulling 'Qwen3-0.6B-GGUF' took longer than 1 s; the partial download is kept", "{v}");
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
    let blobs = l.sandbox.hf_cache().join("models--unsloth--Qwen3-0.6B-GGUF/blobs");
    let partial = std::fs::read_dir(&blobs)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .map(|e| e.metadata().unwrap().len());
    assert!(partial.is_some_and(|n| n > 0), "the partial file is kept: {partial:?}");
    // At full speed the next request resumes the download and is served.
    double.set_knobs(Knobs::default());
    let (s, v) = l.chat("Qwen3-0.6B-GGUF").await;
    assert_eq!(s, 200, "{v}");
    let resumed = double.log().iter().any(|r| r.range.as_deref().is_some_and(|r| r != "bytes=0-"));
    assert!(resumed, "the download resumed from the partial file");
}

async fn cli(l: &Lemonade, args: &[&str]) -> (i32, String, String) {
    l.cli(args).await
}

#[tokio::test]
async fn cli_pull_list_and_delete() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let (code, out, err) =
        cli(&l, &["pull", "user.Big", "--checkpoint", "org/big-GGUF:Q4_0", "--recipe", "llamacpp"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Model pulled successfully: user.Big"), "{out}");
    let (code, out, _) = cli(&l, &["pull", "Qwen3-0.6B-GGUF", "--json"]).await;
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v, json!({"status": "success", "model_name": "Qwen3-0.6B-GGUF"}));

    let (code, out, _) = cli(&l, &["list", "--json"]).await;
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let big = v["data"].as_array().unwrap().iter().find(|m| m["id"] == "Big").unwrap();
    assert_eq!(big["downloaded"], true);
    let (_, table, _) = cli(&l, &["list"]).await;
    let row = table.lines().find(|r| r.starts_with("Big ")).expect("a row for Big (user.Big)");
    assert!(row.contains("Yes") && row.contains("llamacpp") && row.contains("custom"), "{row}");
    assert!(table.lines().next().unwrap().starts_with("Model Name"));

    let (code, out, _) = cli(&l, &["delete", "user.Big"]).await;
    assert_eq!((code, out.trim()), (0, "Model deleted successfully: user.Big"));
    let (code, _, err) = cli(&l, &["delete", "user.Big"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("Model not found: user.Big"), "{err}");
    let (code, _, err) = cli(&l, &["pull", "Big", "--checkpoint", "org/big-GGUF:Q4_0", "--recipe", "llamacpp"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("Error pulling model") && err.contains("user."), "{err}");
}

#[tokio::test]
async fn shutdown_ends_an_ollama_pull_stream_instead_of_waiting_for_it() {
    let (_tmp, _double, mut l) =
        setup(Knobs { chunk_delay: Some(std::time::Duration::from_millis(50)), ..Default::default() }).await;
    let r = l.http.post(l.url("/api/pull")).json(&json!({"model": "Qwen3-0.6B-GGUF"})).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    let progress = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !seen.contains("\"completed\"") {
            match futures_util::StreamExt::next(&mut stream).await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                _ => break,
            }
        }
    })
    .await;
    assert!(progress.is_ok() && seen.contains("\"completed\""), "progress lines came: {seen}");
    l.signal(libc::SIGTERM);
    let end = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut stream).await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(end.is_ok(), "the pull stream did not end at shutdown: {seen}");
    assert!(!seen.contains("success"), "a 98 MB pull at 64 KiB per 50 ms cannot have finished: {seen}");
    let (code, log) =
        tokio::task::spawn_blocking(move || (l.wait_exit(std::time::Duration::from_secs(20)), l.log())).await.unwrap();
    assert!(code.is_some_and(|c| c.success()), "{code:?}");
    assert!(!log.contains("connections still open"), "{log}");
}

/// Lemonade v11's `POST /v1/models/register`: registers (or updates) without downloading;
/// a later pull by the bare name downloads it.
#[tokio::test]
async fn register_defines_a_model_without_downloading_and_pull_by_bare_name_fetches_it() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let (s, e) = l.post("/v1/models/register", &json!({"model_name": "Reg", "recipe": "llamacpp"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("model_name")), "{e}");
    let (s, e) = l.post("/v1/models/register", &json!({"model_name": "user.Reg"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("recipe")), "{e}");
    let body = json!({"model_name": "user.Reg", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp"});
    let (s, v) = l.post("/v1/models/register", &body).await;
    assert_eq!(
        (s, v.clone()),
        (
            200,
            json!({"status": "success", "model_name": "Reg", "canonical_model_name": "user.Reg",
                     "model": {"id": "Reg", "recipe": "llamacpp", "downloaded": false}})
        )
    );
    assert!(!l.sandbox.hf_cache().join("models--org--big-GGUF").exists(), "nothing downloaded");
    // Updated in place.
    let body = json!({"model_name": "user.Reg", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"});
    assert_eq!(l.post("/api/v1/models/register", &body).await.0, 200);
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(saved["Reg"]["checkpoint"], "HuggingFaceTB/SmolLM2-GGUF:Q4_1");
    let (s, v) = l.post("/api/v1/pull", &json!({"model": "Reg"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(l.get("/api/v1/models/Reg").await.1["downloaded"], true);
}

/// Lemonade v11's `GET /v1/pull/variants` against the Hub double: the variants of a repo with
/// shards and a projector, each name pulling exactly its files.
#[tokio::test]
async fn pull_variants_lists_what_a_checkpoint_can_name_and_the_name_pulls_it() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let (s, v) = l.get("/v1/pull/variants?checkpoint=org/shard-GGUF").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((v["suggested_name"].clone(), v["recipe"].clone()), (json!("shard-GGUF"), json!("llamacpp")));
    assert_eq!(
        (v["mmproj_files"].clone(), v["suggested_labels"].clone()),
        (json!(["mmproj-f16.gguf"]), json!(["vision"]))
    );
    let names: Vec<&str> = v["variants"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Q8_0", "Q4_0"], "{v}");
    let q4 = &v["variants"][1];
    assert_eq!(q4["files"], json!(["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf"]));
    assert_eq!((q4["sharded"].clone(), q4["size_bytes"].clone()), (json!(true), json!(52)), "the two files' sizes");
    for (q, code) in [("", 400), ("?checkpoint=nope", 400), ("?checkpoint=org/nope-GGUF", 404)] {
        let (s, e) = l.get(&format!("/api/v1/pull/variants{q}")).await;
        assert_eq!(s, code, "{q}: {e}");
        assert!(e["error"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    let body = json!({"model": "user.V", "checkpoint": "org/shard-GGUF:Q4_0", "recipe": "llamacpp"});
    assert_eq!(l.post("/api/v1/pull", &body).await.0, 200);
    for f in ["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf"] {
        let found = walk(&l.sandbox.hf_cache()).iter().any(|p| p.ends_with(f));
        assert!(found, "{f} pulled");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Lemonade v11's `GET /v1/registry/search` against the Hub double's search.
#[tokio::test]
async fn registry_search_finds_hub_repositories_and_refuses_bad_queries() {
    let (_tmp, _double, l) = setup(Knobs::default()).await;
    let (s, v) = l.get("/v1/registry/search?query=gguf&limit=2&format=gguf").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["source"].clone(), v["query"].clone(), v["format"].clone()),
        (json!("huggingface"), json!("gguf"), json!("gguf"))
    );
    assert_eq!(v["total"], 4, "every repo of the double is a GGUF one: {v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "limit");
    assert_eq!(results[0]["repository_id"], "HuggingFaceTB/SmolLM2-GGUF");
    assert_eq!(
        (results[0]["display_name"].clone(), results[0]["has_gguf"].clone()),
        (json!("SmolLM2-GGUF"), json!(true))
    );
    let (s, v) = l.get("/api/v1/registry/search?q=shard").await;
    assert_eq!((s, v["results"][0]["repository_id"].clone()), (200, json!("org/shard-GGUF")), "q is query");
    for (q, param) in [
        ("query=ab", "query"),
        ("query=abc&limit=0", "limit"),
        ("query=abc&source=pypi", "source"),
        ("query=abc&format=onnx", "format"),
    ] {
        let (s, e) = l.get(&format!("/v1/registry/search?{q}")).await;
        assert_eq!((s, e["param"].as_str()), (400, Some(param)), "{q}: {e}");
    }
    let (s, e) = l.get("/v1/registry/search?query=rate-limit-me").await;
    assert_eq!((s, e["code"].as_str()), (429, Some("rate_limited")), "{e}");
}

/// Lemonade v11's provenance, `POST /v1/models/check-updates` and `GET /v1/models/{id}/files`
/// against the Hub double: a pull records the commit; an upstream commit after it is an update.
#[tokio::test]
async fn a_pull_records_provenance_check_updates_sees_a_new_commit_and_files_lists_them() {
    let (_tmp, double, l) = setup(Knobs::default()).await;
    let body = json!({"model": "user.Smol", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"});
    assert_eq!(l.post("/api/v1/pull", &body).await.0, 200);
    let prov: Value = serde_json::from_slice(
        &std::fs::read(l.sandbox.hf_cache().join("models--HuggingFaceTB--SmolLM2-GGUF/.lemonade_registry.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (prov["source"].clone(), prov["repo_id"].clone()),
        (json!("huggingface"), json!("HuggingFaceTB/SmolLM2-GGUF"))
    );
    assert_eq!(prov["snapshot_id"], test_support::hub::COMMIT);
    assert_eq!(prov["processed_models"]["user.Smol"]["snapshot_id"], test_support::hub::COMMIT);
    assert!(prov["downloaded_at"].as_u64().is_some_and(|t| t > 1_700_000_000), "{prov}");

    // Before any check: no `update_available`, `update_check_done` false (v11's fields).
    let update = |v: &Value| v.get("update_available").cloned();
    assert_eq!(update(&l.get("/v1/models/user.Smol").await.1), None);
    let (_, h) = l.get("/v1/health").await;
    assert_eq!((h["update_check_done"].clone(), h["telemetry"].clone()), (json!(false), json!({"enabled": false})));
    let (s, v) = l.post("/v1/models/check-updates", &json!({})).await;
    assert_eq!((s, v), (200, json!({"status": "success", "updates_available": 0, "models": []})));
    assert_eq!(update(&l.get("/v1/models/user.Smol").await.1), Some(json!(false)));
    assert_eq!(l.get("/v1/health").await.1["update_check_done"], true);
    double.set_knobs(Knobs { commit: Some("fedcba9876543210fedcba9876543210fedcba98".into()), ..Knobs::default() });
    let (_, v) = l.post("/api/v1/models/check-updates", &json!({})).await;
    assert_eq!(v, json!({"status": "success", "updates_available": 1, "models": ["user.Smol"]}));
    let (code, out, err) = l.cli(&["check-updates"]).await;
    assert!(code == 0 && out.contains("Updates available (1): user.Smol"), "{out}{err}");
    assert_eq!(update(&l.get("/v1/models/user.Smol").await.1), Some(json!(true)));
    let (_, list) = l.get("/v1/models").await;
    let listed = list["data"].as_array().unwrap().iter().find(|m| m["id"] == "Smol").cloned().unwrap();
    assert_eq!(update(&listed), Some(json!(true)), "{listed}");

    // `serve --check-updates` runs the check at start, in the background.
    let sandbox = l.kill_keeping_sandbox();
    let url = double.url.clone();
    let l = Lemonade::start_in(bin(), sandbox, &["--check-updates"], &[("HF_ENDPOINT", &url)]).await;
    let done = wait_for(std::time::Duration::from_secs(20), || async {
        Some(l.get("/v1/health").await.1).filter(|h| h["update_check_done"] == true)
    })
    .await;
    assert!(done.is_some(), "the start-up check completes");
    assert_eq!(update(&l.get("/v1/models/user.Smol").await.1), Some(json!(true)));

    let (s, f) = l.get("/v1/models/user.Smol/files").await;
    assert_eq!(s, 200, "{f}");
    let size = std::fs::metadata(model(SMOL_FILE)).unwrap().len();
    assert_eq!(
        f,
        json!({"model_id": "user.Smol", "files": [{"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "role": "main", "size_bytes": size, "exists": true}]})
    );
    let (_, f) = l.get("/v1/models/user.Smol/files?include_paths=true").await;
    assert!(f["files"][0]["path"].as_str().is_some_and(|p| p.starts_with('/') && p.ends_with(".gguf")), "{f}");
    assert_eq!(l.get("/v1/models/nope/files").await.0, 404);
}

/// The job `model:user.Big` as `GET /v1/downloads` lists it.
async fn job(l: &Lemonade) -> Option<Value> {
    l.get("/v1/downloads").await.1.as_array()?.iter().find(|j| j["id"] == "model:user.Big").cloned()
}

/// Lemonade v11's server-owned downloads: a job outlives its request, pauses mid-file (the
/// partial file stays), is listed as paused after lemonade is killed and restarted, resumes
/// with `Range` from exactly what is on disk and completes with the right sha256; a cancelled
/// job keeps its partial file; removal, a missing job and a bad action answer as v11.
#[tokio::test]
async fn a_download_job_pauses_survives_a_restart_as_paused_and_resumes_where_it_stopped() {
    let slow = Knobs { chunk_delay: Some(std::time::Duration::from_millis(15)), ..Default::default() };
    let (_tmp, double, l) = setup(slow.clone()).await;
    let body = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp", "stream": true, "subscribe": false});
    let (s, v) = l.post("/v1/pull", &body).await;
    assert_eq!(
        (s, v["id"].clone(), v["status"].clone(), v["running"].clone()),
        (200, json!("model:user.Big"), json!("downloading"), json!(true)),
        "{v}"
    );

    let going = wait_for(std::time::Duration::from_secs(10), || async {
        job(&l).await.filter(|j| j["bytes_downloaded"].as_u64() > Some(0))
    })
    .await;
    assert!(going.is_some(), "the job reports progress");
    let (s, v) = l.post("/v1/downloads/control", &json!({"id": "model:user.Big", "action": "pause"})).await;
    assert_eq!((s, v["id"].clone()), (200, json!("model:user.Big")), "{v}");
    let paused =
        wait_for(std::time::Duration::from_secs(10), || async { job(&l).await.filter(|j| j["running"] == false) })
            .await;
    let paused = paused.expect("the worker stops");
    assert_eq!((paused["status"].clone(), paused["complete"].clone()), (json!("paused"), json!(false)), "{paused}");
    let blobs = l.sandbox.hf_cache().join("models--org--big-GGUF/blobs");
    let partial = || {
        std::fs::read_dir(&blobs)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))?
            .metadata()
            .ok()
            .map(|m| m.len())
    };
    let kept = partial().expect("the partial file stays");
    assert!(kept > 0 && kept < 3 << 20, "{kept}");
    assert_eq!(partial(), Some(kept), "nothing is written once paused");

    // Killed and restarted: the job is listed, paused.
    let sandbox = l.kill_keeping_sandbox();
    double.set_knobs(Knobs::default());
    let url = double.url.clone();
    let l = Lemonade::start_in(bin(), sandbox, &[], &[("HF_ENDPOINT", &url)]).await;
    let after = job(&l).await.expect("the job survived the restart");
    assert_eq!((after["status"].clone(), after["running"].clone()), (json!("paused"), json!(false)), "{after}");
    let (s, v) = l.post("/v1/downloads/control", &json!({"id": "model:user.Big", "action": "resume"})).await;
    assert_eq!((s, v["status"].clone()), (200, json!("downloading")), "{v}");
    let done =
        wait_for(std::time::Duration::from_secs(20), || async { job(&l).await.filter(|j| j["status"] == "completed") })
            .await;
    let done = done.expect("the resumed job completes");
    assert_eq!(
        (done["complete"].clone(), done["percent"].clone(), done["running"].clone()),
        (json!(true), json!(100), json!(false))
    );
    let last = double.log().last().unwrap().clone();
    assert_eq!(
        last.range.as_deref(),
        Some(format!("bytes={kept}-").as_str()),
        "resumed from exactly what was on disk: {last:?}"
    );
    assert_eq!(l.get("/api/v1/models/user.Big").await.1["downloaded"], true);
    let blob = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .find(|e| !e.file_name().to_string_lossy().ends_with(".incomplete"))
        .unwrap();
    assert_eq!(host::download::sha256_file(&blob.path()).unwrap(), double.sha256("org/big-GGUF", "big-Q4_0.gguf"));

    // Cancel keeps the partial file; remove drops the job; controls of what is not there.
    double.set_knobs(slow);
    let body = json!({"model": "user.Shard", "checkpoint": "org/shard-GGUF:Q8_0", "recipe": "llamacpp", "stream": true, "subscribe": false});
    assert_eq!(l.post("/v1/pull", &body).await.0, 200);
    let (s, _) = l.post("/api/v1/downloads/control", &json!({"id": "model:user.Shard", "action": "cancel"})).await;
    assert_eq!(s, 200);
    let stopped = wait_for(std::time::Duration::from_secs(10), || async {
        l.get("/v1/downloads")
            .await
            .1
            .as_array()?
            .iter()
            .find(|j| j["id"] == "model:user.Shard" && j["running"] == false)
            .cloned()
    })
    .await;
    assert_eq!(stopped.expect("cancelled")["status"], "cancelled");
    let (s, v) = l.post("/v1/downloads/control", &json!({"id": "model:user.Shard", "action": "remove"})).await;
    assert_eq!((s, v), (200, json!({"status": "ok"})));
    let (s, v) = l.post("/v1/downloads/control", &json!({"id": "model:user.Shard", "action": "remove"})).await;
    assert_eq!((s, v), (200, json!({"status": "ok", "missing": true})));
    let (s, e) = l.post("/v1/downloads/control", &json!({"id": "model:user.Shard", "action": "pause"})).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("not_found")));
    let (s, e) = l.post("/v1/downloads/control", &json!({"id": "model:user.Big", "action": "explode"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("action")), "{e}");
    let (s, e) = l.post("/v1/downloads/control", &json!({"action": "pause"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("id")));

    // The CLI: a background pull is a job; `downloads` lists and controls it.
    let (code, out, err) =
        cli(&l, &["pull", "user.Bg", "--checkpoint", "org/shard-GGUF:Q8_0", "--recipe", "llamacpp", "--background"])
            .await;
    assert!(code == 0 && out.contains("model:user.Bg"), "{out}{err}");
    let (code, out, _) = cli(&l, &["downloads"]).await;
    assert!(code == 0 && out.contains("user.Bg"), "{out}");
    let (code, out, err) = cli(&l, &["downloads", "cancel", "user.Bg"]).await;
    assert!(code == 0 && out.contains("user.Bg: cancel done"), "{out}{err}");
    let (code, _, err) = cli(&l, &["downloads", "pause", "user.Nope"]).await;
    assert!(code != 0 && err.contains("No download job"), "{err}");
}

/// Lemonade v11's `POST /internal/cleanup-cache` and `lemonade cleanup-cache`: a dry run (the
/// default) lists a model repository's partial download and unlinked blob and removes
/// nothing; a real run removes exactly those, so the model stays downloaded and served; a
/// repository with a paused job is skipped (its partial file is its progress) and another
/// tool's repository in the same cache is never touched.
#[tokio::test]
async fn cleanup_cache_removes_orphans_of_our_repositories_only() {
    let slow = Knobs { chunk_delay: Some(std::time::Duration::from_millis(15)), ..Default::default() };
    let (_tmp, double, l) = setup(Knobs::default()).await;
    let body = json!({"model": "user.Smol", "checkpoint": "HuggingFaceTB/SmolLM2-GGUF:Q4_1", "recipe": "llamacpp"});
    assert_eq!(l.post("/api/v1/pull", &body).await.0, 200);
    let clean = json!({"orphaned_files": [], "total_bytes": 0, "dry_run": true, "skipped": []});
    assert_eq!(l.post("/internal/cleanup-cache", &json!({})).await, (200, clean));

    let hf = l.sandbox.hf_cache();
    let blobs = hf.join("models--HuggingFaceTB--SmolLM2-GGUF/blobs");
    std::fs::write(blobs.join("0123.incomplete"), [7u8; 100]).unwrap();
    std::fs::write(blobs.join("stale"), [7u8; 50]).unwrap();
    let other = hf.join("models--other--tool/blobs");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("x.incomplete"), b"not ours").unwrap();
    // A paused job in another repository.
    double.set_knobs(slow);
    let big = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp", "stream": true, "subscribe": false});
    assert_eq!(l.post("/v1/pull", &big).await.0, 200);
    let going = wait_for(std::time::Duration::from_secs(10), || async {
        job(&l).await.filter(|j| j["bytes_downloaded"].as_u64() > Some(0))
    })
    .await;
    assert!(going.is_some(), "the job reports progress");
    assert_eq!(l.post("/v1/downloads/control", &json!({"id": "model:user.Big", "action": "pause"})).await.0, 200);
    let paused =
        wait_for(std::time::Duration::from_secs(10), || async { job(&l).await.filter(|j| j["running"] == false) })
            .await;
    assert!(paused.is_some(), "the worker stops");

    let orphan = |path: &str, size: u64, kind: &str| {
        json!({"path": format!("models--HuggingFaceTB--SmolLM2-GGUF/blobs/{path}"), "size": size,
               "model": "user.Smol", "type": kind, "belongs_to": "HuggingFaceTB/SmolLM2-GGUF"})
    };
    let skipped = json!([{"repo": "org/big-GGUF", "reason": "the download job of 'user.Big' keeps its partial files"}]);
    let (s, v) = l.post("/internal/cleanup-cache", &json!({})).await;
    let found = json!([orphan("0123.incomplete", 100, "incomplete"), orphan("stale", 50, "unreferenced")]);
    assert_eq!(
        (s, v),
        (200, json!({"orphaned_files": found, "total_bytes": 150, "dry_run": true, "skipped": skipped}))
    );
    assert!(blobs.join("0123.incomplete").exists() && blobs.join("stale").exists(), "a dry run removes nothing");
    let (code, out, err) = l.cli(&["cleanup-cache", "--dry-run"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("blobs/stale (0.0 MB, unreferenced) [from user.Smol]"), "{out}");
    assert!(out.contains("Would free 0.0 MB from 2 file(s). Run without --dry-run to delete."), "{out}");

    let (code, out, err) = l.cli(&["cleanup-cache", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["dry_run"].clone(), v["total_bytes"].clone()), (json!(false), json!(150)), "{v}");
    assert!(!blobs.join("0123.incomplete").exists() && !blobs.join("stale").exists());
    assert_eq!(std::fs::read(other.join("x.incomplete")).unwrap(), b"not ours", "another tool's files untouched");
    let big_partial = std::fs::read_dir(hf.join("models--org--big-GGUF/blobs"))
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".incomplete"));
    assert!(big_partial, "the paused job's partial file is kept");
    assert_eq!(l.get("/api/v1/models/user.Smol").await.1["downloaded"], true, "the linked blob stays");
    let (s, v) = l.chat("user.Smol").await;
    assert_eq!(s, 200, "{v}");
    let (code, out, _) = l.cli(&["cleanup-cache"]).await;
    assert_eq!((code, out.trim_end()), (0, "  skipped org/big-GGUF: the download job of 'user.Big' keeps its partial files\nNo orphaned files found. Cache is clean."));

    // Bad bodies: a 400 naming the field; nothing removed.
    let (s, e) = l.post("/internal/cleanup-cache", &json!({"dry_run": "no"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("dry_run")), "{e}");
    let (s, e) = l.post("/internal/cleanup-cache", &json!({"dryrun": false})).await;
    assert_eq!(s, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("dryrun"), "{e}");
}

/// Ctrl+C in `lemonade pull` cancels the download it started: the server stops downloading
/// (the repository's download lock is free, the partial file stays for a later resume) and no
/// job is left listed.
#[tokio::test]
async fn ctrl_c_in_lemonade_pull_cancels_the_servers_download() {
    let slow = Knobs { chunk_delay: Some(std::time::Duration::from_millis(15)), ..Default::default() };
    let (_tmp, _double, l) = setup(slow).await;
    let mut cmd = std::process::Command::new(&l.bin);
    l.sandbox.apply(&mut cmd);
    cmd.args(["pull", "user.Big", "--checkpoint", "org/big-GGUF:Q4_0", "--recipe", "llamacpp"])
        .args(["--host", "127.0.0.1", "--port", &l.port().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let blobs = l.sandbox.hf_cache().join("models--org--big-GGUF/blobs");
    let partial = || {
        std::fs::read_dir(&blobs)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
            .and_then(|e| e.metadata().ok())
            .map(|m| m.len())
            .filter(|n| *n > 0)
    };
    let started = wait_for(std::time::Duration::from_secs(20), || async { partial() }).await;
    assert!(started.is_some(), "the download started");
    let running = l.post("/internal/cleanup-cache", &json!({})).await.1;
    assert_eq!(running["skipped"][0]["reason"], "a download into it is running", "{running}");

    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(!status.success(), "Ctrl+C ends the CLI");
    // The server's download stops: the repository's lock is released, its partial file is left.
    let stopped = wait_for(std::time::Duration::from_secs(10), || async {
        let v = l.post("/internal/cleanup-cache", &json!({})).await.1;
        let left = v["orphaned_files"].as_array()?.iter().any(|f| f["type"] == "incomplete");
        (left && v["skipped"].as_array()?.is_empty()).then_some(v)
    })
    .await;
    assert!(stopped.is_some(), "the server stopped the download Ctrl+C left");
    let kept = partial().expect("the partial file stays for a resume");
    assert!(kept < 3 << 20, "{kept}");
    assert_eq!(partial(), Some(kept), "nothing is written after the cancel");
    assert_eq!(l.get("/v1/downloads").await.1, json!([]), "a foreground pull leaves no job");
    assert_eq!(l.get("/api/v1/models/user.Big").await.1["downloaded"], false);
}

/// `offline`: no network call at all. A pull, a Hub search, a variants listing and an update
/// check are each a 400 naming the setting (as v11 answers offline), and the Hub double sees no request; turned off
/// with `POST /internal/set`, the pull goes through. `download_rate_limit` then paces
/// downloads: 3 MiB at 1 MiB/s take at least two seconds (a bound only a broken limit breaks).
#[tokio::test]
async fn offline_makes_no_network_call_and_a_rate_limit_paces_downloads() {
    let (_tmp, double, l) = setup_with(Knobs::default(), &["--offline"], &[]).await;
    let (_, c) = l.get("/internal/config").await;
    assert_eq!(c["offline"], true, "{c}");
    let body = json!({"model": "user.Big", "checkpoint": "org/big-GGUF:Q4_0", "recipe": "llamacpp"});
    // v11's management routes answer `{"error": "…"}`, the param beside it.
    let (s, e) = l.post("/api/v1/pull", &body).await;
    assert_eq!((s, e["param"].as_str()), (400, Some("offline")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("offline"), "{e}");
    for path in ["/api/v1/registry/search?q=smol", "/api/v1/pull/variants?checkpoint=org/big-GGUF"] {
        let (s, e) = l.get(path).await;
        assert_eq!((s, e["param"].as_str()), (400, Some("offline")), "{path}: {e}");
    }
    let (s, e) = l.post("/api/v1/models/check-updates", &json!({})).await;
    assert_eq!(s, 400, "{e}");
    assert!(double.log().is_empty(), "offline, yet the Hub was asked: {:?}", double.log());

    let (s, v) = l.post("/internal/set", &json!({"offline": false, "download_rate_limit": "1M"})).await;
    assert_eq!(s, 200, "{v}");
    let t = std::time::Instant::now();
    let (s, v) = l.post("/api/v1/pull", &body).await;
    assert_eq!(s, 200, "{v}");
    assert!(t.elapsed() >= std::time::Duration::from_secs(2), "3 MiB at 1 MiB/s in {:?}", t.elapsed());
    let (_, c) = l.get("/internal/config").await;
    assert_eq!((c["offline"].clone(), c["download_rate_limit"].clone()), (json!(false), json!(1 << 20)), "{c}");
}
