//! Faults: backends killed mid-stream, at load and idle, a stopped (wedged) backend, one that
//! never becomes ready, an unload racing a load, a full disk during a pull, lemonade killed during a pull, during
//! registrations and while it saves a prompt-cache slot.

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

use crate::{orphans_after, our_processes, Report};

fn kill(pid: u32, sig: i32) {
    // SAFETY: a plain kill(2) on a process this suite started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The one backend child of `l`, once it exists (bounded).
async fn backend_of(l: &Lemonade) -> Option<u32> {
    let pid = l.pid();
    wait_for(Duration::from_secs(30), || async move { child_pids(pid).first().copied() }).await
}

/// A chat request succeeds, retrying (bounded, 40 s) while the model is in its crash back-off
/// (503 `model_failed`: repeated crashes wait 1 s, 2 s, … before the model loads again), as a
/// client honouring the 503 would.
async fn chat_ok(l: &Lemonade, model: &str) -> bool {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let r =
            l.http.post(l.url("/api/v1/chat/completions")).json(&body).timeout(Duration::from_secs(60)).send().await;
        match r.map(|r| r.status().as_u16()) {
            Ok(200) => return true,
            Ok(503) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            _ => return false,
        }
    }
}

/// The subset `cargo xtask test` runs on every CI run (`LEMONADE_SOAK_ONLY=ci`).
pub async fn run_ci(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    kill_lemonade_mid_registration(bin, report).await?;
    kill_lemonade_mid_config_sets(bin, report).await?;
    kill_lemonade_mid_pull(bin, report).await?;
    kill_mid_stream(bin, report).await?;
    disk_full(bin, report).await?;
    kill_lemonade_mid_cache_save(bin, report).await?;
    Ok(())
}

pub async fn run(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    kill_mid_stream(bin, report).await?;
    kill_at_load_and_idle(bin, report).await?;
    wedged_and_never_ready(bin, report).await?;
    unload_during_load(bin, report).await?;
    disk_full(bin, report).await?;
    kill_lemonade_mid_pull(bin, report).await?;
    kill_lemonade_mid_registration(bin, report).await?;
    kill_lemonade_mid_config_sets(bin, report).await?;
    kill_lemonade_mid_cache_save(bin, report).await?;
    Ok(())
}

/// Real llama-server, killed with SIGKILL while it streams: the client's stream ends within
/// its deadline (with an error frame), and the next request reloads the model.
async fn kill_mid_stream(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 5;
    let before = our_processes();
    let l = Lemonade::start(bin, &["--llamacpp-args", "--threads 1"]).await;
    let mut held = 0;
    let mut notes = Vec::new();
    for _ in 0..TRIALS {
        let body = json!({"model": SMOL, "messages": [{"role": "user", "content": "Tell a long story."}],
                          "max_tokens": 2000, "ignore_eos": true, "stream": true});
        let r = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await?;
        let mut stream = r.bytes_stream();
        // Up to the first token: while the model loads (the first trial, a reload after a
        // crash) the stream only says `: loading` in SSE comments.
        let first = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(c) = stream.next().await {
                match c {
                    Ok(c) if c.windows(6).any(|w| w == b"data: ") => return true,
                    Ok(_) => continue,
                    Err(_) => return false,
                }
            }
            false
        })
        .await;
        let Some(pid) = backend_of(&l).await else {
            notes.push("no backend".to_string());
            continue;
        };
        if first != Ok(true) {
            notes.push("no first chunk".into());
            continue;
        }
        kill(pid, libc::SIGKILL);
        let mut rest = String::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(c) = stream.next().await {
                match c {
                    Ok(c) => rest.push_str(&String::from_utf8_lossy(&c)),
                    Err(_) => break,
                }
            }
        })
        .await
        .is_ok();
        let reported = rest.contains("streaming_error");
        let reloaded = chat_ok(&l, SMOL).await;
        if ended && reported && reloaded {
            held += 1;
        } else {
            notes.push(format!("ended {ended}, error frame {reported}, reloaded {reloaded}"));
        }
    }
    drop(l);
    let left = orphans_after(&before).await;
    report.add(
        "faults",
        "kill -9 llama-server mid-stream (real model)",
        TRIALS,
        if left.is_empty() { held } else { 0 },
        format!("stream ends with a streaming_error frame within 10 s; the next request reloads (after the crash back-off from the second crash on). {}", notes.join("; ")),
    );
    Ok(())
}

/// The fake backend killed while it loads (load answered with an error, the next load works)
/// and while idle (health drops it, the next request reloads it).
async fn kill_at_load_and_idle(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 5;
    let before = our_processes();
    let s = fake_sandbox(&[("slow", None, json!({"load_delay_ms": 1500})), ("quick", None, json!({}))]);
    let fake = fake_llama_server();
    let l = Lemonade::start_in(bin, s, &[], &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())]).await;
    let (mut at_load, mut idle) = (0, 0);
    for _ in 0..TRIALS {
        l.post("/api/v1/unload", &json!({})).await;
        let url = l.url("/api/v1/load");
        let http = l.http.clone();
        let load = tokio::spawn(async move {
            http.post(url).json(&json!({"model_name": "extra.slow"})).timeout(Duration::from_secs(30)).send().await
        });
        let Some(pid) = backend_of(&l).await else { continue };
        kill(pid, libc::SIGKILL);
        // The machine retries a failed load once, so it succeeds (200); a 500 must name the
        // killed backend. Anything else (no answer, another status) does not hold.
        let answered = match load.await {
            Ok(Ok(r)) => {
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                status == 200
                    || (status == 500
                        && v["error"]["code"] == "model_load_error"
                        && v["error"]["message"].as_str().is_some_and(|m| m.contains("signal 9")))
            }
            _ => false,
        };
        if answered && chat_ok(&l, "extra.slow").await {
            at_load += 1;
        }

        let (s, _) = l.post("/api/v1/load", &json!({"model_name": "extra.quick"})).await;
        let Some(pid) = (s == 200).then(|| child_pids(l.pid()).first().copied()).flatten() else { continue };
        kill(pid, libc::SIGKILL);
        let gone = wait_for(Duration::from_secs(10), || async {
            (!loaded_names(&l.get("/api/v1/health").await.1).contains(&"extra.quick".to_string())).then_some(())
        })
        .await
        .is_some();
        if gone && chat_ok(&l, "extra.quick").await {
            idle += 1;
        }
    }
    drop(l);
    let clean = orphans_after(&before).await.is_empty();
    report.add(
        "faults",
        "kill -9 a backend while it loads",
        TRIALS,
        if clean { at_load } else { 0 },
        "the load is answered within 30 s (a failed load is retried once, so it may succeed); the model then serves",
    );
    report.add(
        "faults",
        "kill -9 an idle backend",
        TRIALS,
        if clean { idle } else { 0 },
        "health drops the model within 10 s; the next request reloads it (after the crash back-off from the second crash on)",
    );
    Ok(())
}

/// SIGSTOP on a loaded backend (the watchdog kills it; requests are answered within their
/// deadline) and a backend that never becomes ready (the load fails at --load-timeout).
async fn wedged_and_never_ready(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 3;
    let before = our_processes();
    let s = fake_sandbox(&[("m", None, json!({})), ("never", None, json!({"load_delay_ms": 600000}))]);
    let fake = fake_llama_server();
    let l = Lemonade::start_in(
        bin,
        s,
        &["--watchdog-interval-ms", "200", "--load-timeout", "2"],
        &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())],
    )
    .await;
    let (mut wedged, mut never) = (0, 0);
    let mut notes = Vec::new();
    for _ in 0..TRIALS {
        if !chat_ok(&l, "extra.m").await {
            continue;
        }
        let Some(pid) = child_pids(l.pid()).first().copied() else { continue };
        kill(pid, libc::SIGSTOP);
        let t = Instant::now();
        let body = json!({"model": "extra.m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        let r =
            l.http.post(l.url("/api/v1/chat/completions")).json(&body).timeout(Duration::from_secs(20)).send().await;
        // The request in flight on the stopped backend fails once the watchdog kills it: a 502
        // that says the backend went away (never a hang, never another status).
        let (status, body) = match r {
            Ok(r) => (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null)),
            Err(_) => (0, Value::Null),
        };
        let answered = status == 502 && body["error"]["message"].as_str().is_some_and(|m| !m.is_empty());
        let killed = wait_for(Duration::from_secs(10), || async move { (!alive(pid)).then_some(()) }).await.is_some();
        if answered && killed && chat_ok(&l, "extra.m").await {
            wedged += 1;
        }
        notes.push(format!("answered {status} in {:.1} s", t.elapsed().as_secs_f64()));

        let t = Instant::now();
        let (s, v) = l.post("/api/v1/load", &json!({"model_name": "extra.never"})).await;
        let quick = t.elapsed() < Duration::from_secs(10);
        let no_child = wait_for(Duration::from_secs(10), || async { child_pids(l.pid()).is_empty().then_some(()) })
            .await
            .is_some();
        if s >= 400 && quick && no_child && v["error"]["message"].is_string() {
            never += 1;
        }
    }
    drop(l);
    let clean = orphans_after(&before).await.is_empty();
    report.add("faults", "SIGSTOP a loaded backend (wedged)", TRIALS, if clean { wedged } else { 0 }, format!("watchdog 200 ms; the request in flight is answered, the stopped process killed, the next request reloads: {}", notes.join(", ")));
    report.add(
        "faults",
        "a backend that never becomes ready",
        TRIALS,
        if clean { never } else { 0 },
        "--load-timeout 2: the load fails with a message in about 2 s and the process is stopped",
    );
    Ok(())
}

/// Real llama-server: an unload sent while the model loads, at three points of the load (at
/// once, once the admin state says `loading`, once the backend process exists). Both requests
/// are answered; when the unload answers, no backend process is left and nothing is loaded; the
/// model then loads and serves again.
async fn unload_during_load(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 12;
    let before = our_processes();
    let l = Lemonade::start(bin, &["--llamacpp-args", "--threads 1"]).await;
    let (mut held, mut outcomes) = (0, std::collections::BTreeMap::<String, usize>::new());
    let body = json!({"model_name": SMOL});
    for trial in 0..TRIALS {
        let load = l.post("/api/v1/load", &body);
        let unload = async {
            match trial % 3 {
                0 => {}
                1 => {
                    wait_for(Duration::from_secs(10), || async {
                        let (_, v) = l.get("/v1/admin/models").await;
                        let row = v["models"].as_array()?.iter().find(|m| m["name"] == SMOL)?.clone();
                        (row["runtime_state"] != "unloaded").then_some(())
                    })
                    .await;
                }
                _ => {
                    wait_for(Duration::from_secs(10), || async { child_pids(l.pid()).first().copied() }).await;
                }
            }
            l.post("/api/v1/unload", &json!({"model_name": SMOL})).await
        };
        let deadline = Duration::from_secs(60);
        let Ok(((ls, _), (us, _))) = tokio::time::timeout(deadline, async { tokio::join!(load, unload) }).await else {
            continue;
        };
        *outcomes.entry(format!("load {ls} / unload {us}")).or_default() += 1;
        // The unload may come before the load registered the model (404: not loaded), then the
        // load completes; unload again so each trial ends with nothing loaded.
        if us == 404 && ls == 200 {
            l.post("/api/v1/unload", &json!({"model_name": SMOL})).await;
        }
        let nothing_left = child_pids(l.pid()).is_empty() && loaded_names(&l.get("/api/v1/health").await.1).is_empty();
        if nothing_left && matches!(ls, 200 | 409) && matches!(us, 200 | 404) && chat_ok(&l, SMOL).await {
            held += 1;
        }
        l.post("/api/v1/unload", &json!({})).await;
    }
    drop(l);
    let clean = orphans_after(&before).await.is_empty();
    report.add(
        "faults",
        "unload while the model loads (at once, while loading, once the process exists)",
        TRIALS,
        if clean { held } else { 0 },
        format!(
            "when the unload answers no backend is left and nothing is loaded; the model serves again: {outcomes:?}"
        ),
    );
    Ok(())
}

/// A Hub double serving SmolLM2's file (98 MB) as `org/smol-GGUF`.
async fn hub_with_smol(knobs: Knobs) -> anyhow::Result<(tempfile::TempDir, HubDouble)> {
    let tmp = tempfile::tempdir()?;
    let repo = tmp.path().join("org/smol-GGUF");
    std::fs::create_dir_all(&repo)?;
    std::fs::copy(model(SMOL_FILE), repo.join("smol-Q4_1.gguf"))?;
    let double = HubDouble::start(tmp.path(), knobs).await;
    Ok((tmp, double))
}

fn tree_has_no_counted_partial(hf: &Path) -> bool {
    // Every snapshot link points at a complete blob (no `.incomplete` is ever linked).
    let mut ok = true;
    for e in walk(hf) {
        if std::fs::symlink_metadata(&e).map(|m| m.file_type().is_symlink()).unwrap_or(false) {
            let target = std::fs::read_link(&e).unwrap_or_default();
            ok &= !target.to_string_lossy().ends_with(".incomplete");
        }
    }
    ok
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The HF cache on a 40 MiB tmpfs: a 98 MB pull fails with 507 and keeps its partial file; the
/// model is not downloaded; after the tmpfs grows, the pull resumes and completes.
async fn disk_full(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    let (_hub_tmp, double) = hub_with_smol(Knobs::default()).await?;
    let sandbox = Sandbox::empty();
    let mnt = sandbox.dir.path().join("small-disk");
    std::fs::create_dir_all(&mnt)?;
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        report.skip("faults", "disk full while pulling", "cannot mount a tmpfs here (needs root)", false);
        return Ok(());
    }
    let hf = mnt.join("hub");
    let l =
        Lemonade::start_in(bin, sandbox, &[], &[("HF_ENDPOINT", &double.url), ("HF_HUB_CACHE", hf.to_str().unwrap())])
            .await;
    let body = json!({"model": "user.Smol", "checkpoint": "org/smol-GGUF:Q4_1", "recipe": "llamacpp"});
    let (s, v) = l.post("/api/v1/pull", &body).await;
    // `/pull` answers v11's `{"error": "…"}`.
    let full = s == 507 && v["error"].as_str().is_some_and(|m| m.contains("No space left"));
    let (_, m) = l.get("/api/v1/models/user.Smol").await;
    let not_counted = m["downloaded"] == false && tree_has_no_counted_partial(&hf);
    let partial_kept = walk(&hf).iter().any(|p| p.to_string_lossy().ends_with(".incomplete"));
    let grown = std::process::Command::new("mount")
        .args(["-o", "remount,size=300m"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let (s2, _) = l.post("/api/v1/pull", &body).await;
    let resumed = double.log().iter().any(|r| r.range.is_some());
    let (_, m) = l.get("/api/v1/models/user.Smol").await;
    let complete = s2 == 200 && m["downloaded"] == true;
    let sha_ok = walk(&hf)
        .iter()
        .filter(|p| p.to_string_lossy().contains("/blobs/"))
        .any(|p| sha256_file(p) == double.sha256("org/smol-GGUF", "smol-Q4_1.gguf"));
    drop(l);
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    let held = full && not_counted && partial_kept && grown && complete && resumed && sha_ok;
    report.add(
        "faults",
        "disk full while pulling (40 MiB tmpfs, 98 MB file)",
        1,
        held as usize,
        format!("507 insufficient_storage {full}; not counted as downloaded {not_counted}; partial kept {partial_kept}; after growing the disk the pull resumed with Range {resumed} and completed {complete}, sha256 matches {sha_ok}"),
    );
    Ok(())
}

fn sha256_file(p: &Path) -> String {
    host::download::sha256_file(p).unwrap_or_default()
}

/// SIGKILL lemonade while it downloads; restart on the same files: the model is not counted as
/// downloaded, the pull resumes with Range and the file matches its sha256. No orphan.
async fn kill_lemonade_mid_pull(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 3;
    let mut held = 0;
    let mut notes = Vec::new();
    for trial in 0..TRIALS {
        let before = our_processes();
        let knobs = Knobs { chunk_delay: Some(Duration::from_millis(2)), ..Default::default() };
        let (_hub_tmp, double) = hub_with_smol(knobs).await?;
        let l = Lemonade::start_in(bin, Sandbox::empty(), &[], &[("HF_ENDPOINT", &double.url)]).await;
        let body = json!({"model": "user.Smol", "checkpoint": "org/smol-GGUF:Q4_1", "recipe": "llamacpp"});
        let (url, http) = (l.url("/api/v1/pull"), l.http.clone());
        let pull = tokio::spawn(async move { http.post(url).json(&body).send().await });
        let hf = l.sandbox.hf_cache();
        // Kill at a different point each trial: after 5, 25 or 50 MB.
        let at = [5u64, 25, 50][trial] << 20;
        let got = wait_for(Duration::from_secs(120), || {
            let hf = hf.clone();
            async move {
                walk(&hf)
                    .into_iter()
                    .find(|p| p.to_string_lossy().ends_with(".incomplete"))
                    .and_then(|p| std::fs::metadata(p).ok())
                    .filter(|m| m.len() >= at)
                    .map(|m| m.len())
            }
        })
        .await;
        let sandbox = l.kill_keeping_sandbox();
        let _ = pull.await;
        let orphans = orphans_after(&before).await;
        double.set_knobs(Knobs::default());
        let l = Lemonade::start_in(bin, sandbox, &[], &[("HF_ENDPOINT", &double.url)]).await;
        let (_, m) = l.get("/api/v1/models/user.Smol").await;
        // Listed by its bare name (current Lemonade's naming).
        let registered = m["id"] == "Smol";
        let not_counted = m["downloaded"] == false;
        let (s, _) = l.post("/api/v1/pull", &json!({"model": "user.Smol"})).await;
        let resumed = double.log().last().and_then(|r| r.range.clone()).is_some();
        let (_, m) = l.get("/api/v1/models/user.Smol").await;
        let sha_ok = walk(&l.sandbox.hf_cache())
            .iter()
            .filter(|p| p.to_string_lossy().contains("/blobs/") && !p.to_string_lossy().ends_with(".incomplete"))
            .any(|p| sha256_file(p) == double.sha256("org/smol-GGUF", "smol-Q4_1.gguf"));
        let ok = got.is_some()
            && orphans.is_empty()
            && registered
            && not_counted
            && s == 200
            && resumed
            && m["downloaded"] == true
            && sha_ok;
        if ok {
            held += 1;
        } else {
            notes.push(format!("killed at {got:?} B: orphans {orphans:?}, registered {registered}, not counted {not_counted}, pull {s}, resumed {resumed}, sha {sha_ok}"));
        }
    }
    report.add("faults", "kill -9 lemonade during a pull, restart", TRIALS, held, format!("killed after 5, 25 and 50 MB: registration kept, model not counted as downloaded, pull resumes with Range, sha256 matches. {}", notes.join("; ")));
    Ok(())
}

/// SIGKILL lemonade while 16 registrations (`pull` of new `user.*` models) write
/// `user_models.json`; restart: the file parses, every entry is whole, the server starts.
async fn kill_lemonade_mid_registration(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 10;
    let tmp = tempfile::tempdir()?;
    let repo = tmp.path().join("org/tiny-GGUF");
    std::fs::create_dir_all(&repo)?;
    test_support::write_gguf(&repo.join("tiny-Q4_0.gguf"), "llama", None);
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let mut held = 0;
    let mut seen = Vec::new();
    let mut notes = Vec::new();
    let mut killed_temps = Vec::new();
    let mut sandbox = Sandbox::empty();
    for trial in 0..TRIALS {
        let l = Lemonade::start_in(bin, sandbox, &[], &[("HF_ENDPOINT", &double.url)]).await;
        let reqs: Vec<_> = (0..16)
            .map(|i| {
                let (url, http) = (l.url("/api/v1/pull"), l.http.clone());
                let body = json!({"model": format!("user.T{trial}-{i}"), "checkpoint": "org/tiny-GGUF:Q4_0", "recipe": "llamacpp"});
                tokio::spawn(async move { http.post(url).json(&body).send().await })
            })
            .collect();
        // Kill after a pseudo-random 0–40 ms, while the writes are under way.
        tokio::time::sleep(Duration::from_millis((trial as u64 * 7919) % 41)).await;
        sandbox = l.kill_keeping_sandbox();
        for r in reqs {
            let _ = r.await;
        }
        let path = sandbox.cache().join("user_models.json");
        let parsed: Option<Value> =
            std::fs::read(&path).ok().map(|b| serde_json::from_slice(&b).unwrap_or(Value::Null));
        let whole = match &parsed {
            None => true, // nothing written yet
            Some(Value::Object(m)) => {
                m.values().all(|e| e["checkpoint"] == "org/tiny-GGUF:Q4_0" && e["recipe"] == "llamacpp")
            }
            Some(_) => false,
        };
        let count = parsed.as_ref().and_then(Value::as_object).map(|m| m.len()).unwrap_or(0);
        seen.push(count);
        let left = leftovers(&sandbox);
        killed_temps.push(left);
        if whole {
            held += 1;
        } else {
            notes.push(format!("trial {trial}: user_models.json is not whole"));
        }
    }
    // The last state must load: the server starts and lists every registration the file holds.
    let l = Lemonade::start_in(bin, sandbox, &[], &[("HF_ENDPOINT", &double.url)]).await;
    let (s, v) = l.get("/api/v1/models?show_all=true").await;
    let listed =
        v["data"].as_array().map(|a| a.iter().filter(|m| m["checkpoint"] == "org/tiny-GGUF:Q4_0").count()).unwrap_or(0);
    // A kill mid-write may leave a temp file; the restart removes it.
    let cleaned = leftovers(&l.sandbox);
    let starts = s == 200 && listed == *seen.last().unwrap_or(&0) && cleaned == 0;
    report.add(
        "faults",
        "kill -9 lemonade during user_models.json writes (16 concurrent registrations)",
        TRIALS,
        if starts { held } else { 0 },
        format!("registrations in the file after each kill: {seen:?}; every entry whole; temp files left by the kills {killed_temps:?}, {cleaned} after the restart; the server restarts and lists them ({listed}). {}", notes.join("; ")),
    );
    Ok(())
}

/// Two clients changing the configuration at once (`POST /internal/set`, 32 changes each) while
/// a model loads, lemonade killed with SIGKILL at a pseudo-random moment: `config.json` always
/// parses, holds only whole values of one change or another, keeps a key this build does not
/// know, and the restarted server serves exactly what the file says.
async fn kill_lemonade_mid_config_sets(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 10;
    let fake = fake_llama_server();
    let env = [("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap_or_default())];
    let mut sandbox = fake_sandbox(&[("m", None, json!({"load_delay_ms": 50}))]);
    std::fs::create_dir_all(sandbox.cache())?;
    std::fs::write(sandbox.cache().join("config.json"), r#"{"future_key": {"kept": true}}"#)?;
    let (mut held, mut notes, mut changes) = (0, Vec::new(), Vec::new());
    for trial in 0..TRIALS {
        let l = Lemonade::start_in(bin, sandbox, &[], &env).await;
        let client = |body: fn(usize) -> Value| {
            let (url, http) = (l.url("/internal/set"), l.http.clone());
            tokio::spawn(async move {
                let mut ok = 0;
                for i in 0..32 {
                    let sent = http.post(url.as_str()).json(&body(i)).timeout(Duration::from_secs(10)).send().await;
                    ok += sent.is_ok_and(|r| r.status().is_success()) as usize;
                }
                ok
            })
        };
        let a = client(|i| json!({"ctx_size": 1000 + i, "swap_hold_ms": i}));
        let b = client(|i| json!({"max_queue": 100 + i, "idle_timeout": i}));
        let load = {
            let (url, http) = (l.url("/api/v1/load"), l.http.clone());
            tokio::spawn(async move { http.post(url).json(&json!({"model_name": "extra.m"})).send().await })
        };
        tokio::time::sleep(Duration::from_millis((trial as u64 * 7919) % 23)).await;
        sandbox = l.kill_keeping_sandbox();
        changes.push(a.await.unwrap_or(0) + b.await.unwrap_or(0));
        let _ = load.await;
        let text = std::fs::read_to_string(sandbox.cache().join("config.json")).unwrap_or_default();
        let whole = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => {
                let n = |k: &str, lo: u64, hi: u64| {
                    m.get(k).is_none_or(|v| v.as_u64().is_some_and(|x| (lo..hi).contains(&x)))
                };
                m["future_key"] == json!({"kept": true})
                    && n("ctx_size", 1000, 1032)
                    && n("swap_hold_ms", 0, 32)
                    && n("max_queue", 100, 132)
                    && n("idle_timeout", 0, 32)
            }
            _ => false,
        };
        if whole {
            held += 1;
        } else {
            notes.push(format!("trial {trial}: config.json is {text:?}"));
        }
    }
    let file: Value =
        serde_json::from_slice(&std::fs::read(sandbox.cache().join("config.json"))?).unwrap_or(Value::Null);
    let l = Lemonade::start_in(bin, sandbox, &[], &env).await;
    let (s, c) = l.get("/internal/config").await;
    let same = ["ctx_size", "swap_hold_ms", "max_queue", "idle_timeout"]
        .iter()
        .all(|k| file.get(k).is_none_or(|v| c[k] == *v));
    let restarts = s == 200 && same && leftovers(&l.sandbox) == 0;
    report.add(
        "faults",
        "kill -9 lemonade during config.json writes (two clients' POST /internal/set racing a load)",
        TRIALS,
        if restarts { held } else { 0 },
        format!("changes answered before each kill {changes:?}; the file parsed whole with the unknown key kept after every kill; the restart serves what it says: {restarts}. {}", notes.join("; ")),
    );
    Ok(())
}

/// Temp files of interrupted writes in the sandbox's cache dir.
fn leftovers(s: &Sandbox) -> usize {
    std::fs::read_dir(s.cache())
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).count())
        .unwrap_or(0)
}

/// lemonade killed (SIGKILL) while llama-server saves a slot for the prompt cache (the unload
/// of a model with a conversation): at the moment the partial file appears, once the whole
/// file is in place, once its entry is written, and at a fixed delay. After a restart the
/// cache holds only whole entries (nothing partial, no file without its entry or entry
/// without its file), and the next turn of the conversation is answered exactly as with no
/// cache: restored (few tokens prefilled) or skipped (all of them).
async fn kill_lemonade_mid_cache_save(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    const TRIALS: usize = 4;
    let facts: String = (0..50).map(|i| format!("Fact {i}: lemon tree {i} grows in row {}. ", i % 5)).collect();
    let first = vec![json!({"role": "user", "content": format!("Notes: {facts}Which row has most trees?")})];
    let ask = |l: &Lemonade, messages: Vec<Value>| {
        let body = json!({"model": SMOL, "messages": messages, "max_tokens": 8, "temperature": 0});
        let (http, url) = (l.http.clone(), l.url("/api/v1/chat/completions"));
        async move {
            let r = http.post(url).json(&body).timeout(Duration::from_secs(120)).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            r.json::<Value>().await.ok()
        }
    };
    let next_turn = |answer: &Value| {
        let mut m = first.clone();
        m.push(json!({"role": "assistant", "content": answer["choices"][0]["message"]["content"]}));
        m.push(json!({"role": "user", "content": "One word?"}));
        m
    };
    // The reference: the same two turns with no cache at all.
    let reference = {
        let l = Lemonade::start_in(bin, Sandbox::new(), &["--prompt-cache-size", "0"], &[]).await;
        let a = ask(&l, first.clone()).await.ok_or_else(|| anyhow::anyhow!("no first answer"))?;
        let b = ask(&l, next_turn(&a)).await.ok_or_else(|| anyhow::anyhow!("no second answer"))?;
        (a["choices"][0]["message"]["content"].clone(), b["choices"][0]["message"]["content"].clone())
    };
    let files = |root: &Path| -> Vec<std::path::PathBuf> { walk(&root.join("prompt-cache")) };
    let (mut held, mut notes, mut restored, mut moments) = (0, Vec::new(), 0, Vec::new());
    for trial in 0..TRIALS {
        let before = our_processes();
        let l = Lemonade::start(bin, &[]).await;
        let a = ask(&l, first.clone()).await;
        let root = l.sandbox.cache();
        let (http, url) = (l.http.clone(), l.url("/api/v1/unload"));
        let unload = tokio::spawn(async move { http.post(url).json(&json!({})).send().await });
        // Kill when the partial file appears (polled every millisecond: llama-server writes
        // the file in about 10 ms; a miss is reported as such), when the whole file is in
        // place, or 20 ms into the unload.
        let deadline = Instant::now() + Duration::from_secs(10);
        let seen = loop {
            let fs = files(&root);
            let part = fs.iter().any(|p| p.to_string_lossy().ends_with(".part"));
            let whole = fs.iter().any(|p| p.extension().is_some_and(|e| e == "bin"));
            let entry = fs.iter().any(|p| p.to_string_lossy().ends_with(".bin.json"));
            let hit = match trial {
                0 if part => Some("the partial file"),
                0 | 1 if whole => Some("the whole file"),
                2 => Some("20 ms"),
                3 if entry => Some("its entry"),
                _ => None,
            };
            if hit.is_some() || Instant::now() > deadline {
                break hit;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        if trial == 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let sandbox = l.kill_keeping_sandbox();
        let _ = unload.await;
        let orphans = orphans_after(&before).await;
        let l = Lemonade::start_in(bin, sandbox, &[], &[]).await;
        let fs = files(&l.sandbox.cache());
        let partial = fs.iter().any(|p| p.to_string_lossy().ends_with(".part"));
        let unpaired = fs.iter().any(|p| {
            let s = p.to_string_lossy();
            (s.ends_with(".bin") && !Path::new(&format!("{s}.json")).exists())
                || (s.ends_with(".bin.json") && !Path::new(s.trim_end_matches(".json")).exists())
        });
        let second = match &a {
            Some(a) => ask(&l, next_turn(a)).await,
            None => None,
        };
        let prefilled = second.as_ref().and_then(|v| v["timings"]["prompt_n"].as_u64());
        let same = a.as_ref().map(|a| a["choices"][0]["message"]["content"].clone()) == Some(reference.0.clone())
            && second.as_ref().map(|b| b["choices"][0]["message"]["content"].clone()) == Some(reference.1.clone());
        if prefilled.is_some_and(|n| n < 40) {
            restored += 1;
        }
        drop(l);
        moments.push(seen.unwrap_or("never"));
        let ok = seen.is_some() && orphans.is_empty() && !partial && !unpaired && same;
        if ok {
            held += 1;
        } else {
            notes.push(format!(
                "trial {trial}: killed at {seen:?}, orphans {orphans:?}, partial left {partial}, unpaired {unpaired}, \
                 same answers {same}, prefilled {prefilled:?}"
            ));
        }
    }
    report.add(
        "faults",
        "kill -9 lemonade while it saves a prompt-cache slot, restart",
        TRIALS,
        held,
        format!(
            "killed at {moments:?}: nothing partial or unpaired after the restart, the next turn answered as with \
             no cache; {restored} of {TRIALS} restored, the rest skipped. {}",
            notes.join("; ")
        ),
    );
    Ok(())
}
