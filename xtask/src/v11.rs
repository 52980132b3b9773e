//! `cargo xtask v11 [--repo GIT_DIR] [--only FILE] [-- unittest args]`: Lemonade v11.7.0's own
//! test files (`test/server_endpoints.py`, `test/test_ollama.py`,
//! `test/server_streaming_errors.py`, taken from a local clone or mirror of
//! lemonade-sdk/lemonade at tag v11.7.0; never copied into this project) against the release
//! build of lemonade. The models the tests name are stand-ins: the provisioned small GGUFs under
//! the catalogue's repository ids, served by the project's Hugging Face Hub double on
//! 127.0.0.1; nothing reaches the internet. Prints each file's counts and the failing tests,
//! and keeps the logs under `target/v11/`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::{cargo, provision, root, run};

const TAG: &str = "v11.7.0";
const FILES: &[&str] = &["server_endpoints.py", "test_ollama.py", "server_streaming_errors.py"];
const PORT: &str = "13305";
const NO_FAILFAST: &str = "import runpy, sys, unittest\n\
    R = unittest.TextTestRunner\n\
    unittest.TextTestRunner = lambda *a, **k: R(*a, **{**k, 'failfast': False})\n\
    sys.argv = sys.argv[1:]\n\
    runpy.run_path(sys.argv[0], run_name='__main__')\n";

/// `<org>/<repo>/<file>` the tests pull, and the provisioned model that stands in for it.
const STAND_INS: &[(&str, &str)] = &[
    ("unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-UD-IQ2_M.gguf", "serve/gemma-3-270m-Q4_K_M.gguf"),
    ("unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_0.gguf", "serve/SmolLM2-135M-Instruct.Q4_1.gguf"),
    (
        "unsloth/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf",
        "serve/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    ("LiquidAI/LFM2-1.2B-GGUF/LFM2-1.2B-Q4_K_M.gguf", "serve/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("unsloth/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q2_K.gguf", "serve/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("unsloth/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_K_M.gguf", "serve/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q2_K.gguf", "serve/SmolLM2-135M-Instruct.Q4_1.gguf"),
    (
        "mradermacher/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q2_K.gguf",
        "serve/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    ("nomic-ai/nomic-embed-text-v2-moe-GGUF/nomic-embed-text-v2-moe.Q8_0.gguf", "serve/all-MiniLM-L6-v2-F32.gguf"),
    (
        "mradermacher/jina-reranker-v1-tiny-en-GGUF/jina-reranker-v1-tiny-en.Q8_0.gguf",
        "plumbing/minilm-random-rerank-F32.gguf",
    ),
    ("Comfy-Org/z_image/split_files/vae/ae.safetensors", "plumbing/sdxs-512-random-F16.safetensors"),
];

pub fn v11(rest: &[String]) -> Result<()> {
    let mut repo = std::env::var_os("LEMONADE_V11_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/.mirror/lemonade-sdk+lemonade/repo"));
    let mut only: Option<String> = None;
    let mut extra = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repo" => repo = it.next().context("--repo needs a path")?.into(),
            "--only" => only = Some(it.next().context("--only needs a file name")?.clone()),
            "--" => extra.extend(it.by_ref().cloned()),
            other => bail!("unknown argument {other}"),
        }
    }
    let p = provision::setup()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "lemonade-cli",
        "-p",
        "lemonade-test-support",
        "--bin",
        "lemonade",
        "--bin",
        "hub-double",
    ]))?;

    let work = root().join("target/v11");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let tar = Command::new("git")
        .arg("--git-dir")
        .arg(&repo)
        .args(["archive", TAG, "test"])
        .output()
        .with_context(|| format!("git archive {TAG} in {}", repo.display()))?;
    if !tar.status.success() {
        bail!(
            "no tag {TAG} in {} (a clone of lemonade-sdk/lemonade; --repo or LEMONADE_V11_REPO): {}",
            repo.display(),
            String::from_utf8_lossy(&tar.stderr)
        );
    }
    let mut untar = Command::new("tar").args(["-x", "-C"]).arg(&work).stdin(Stdio::piped()).spawn()?;
    std::io::Write::write_all(untar.stdin.as_mut().context("tar stdin")?, &tar.stdout)?;
    drop(untar.stdin.take());
    anyhow::ensure!(untar.wait()?.success(), "tar failed");

    let hub_root = work.join("hub");
    for (at, model) in STAND_INS {
        let dest = hub_root.join(at);
        fs::create_dir_all(dest.parent().context("a stand-in's folder")?)?;
        std::os::unix::fs::symlink(p.models_dir.join(model), &dest)?;
    }
    let cache = work.join("lemonade-cache");
    release_stand_in(&hub_root, &cache, &p.llama_server)?;
    let mut hub = Command::new(root().join("target/release/hub-double"))
        .arg(&hub_root)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the Hub double")?;
    let mut url = String::new();
    BufReader::new(hub.stdout.take().context("hub stdout")?).read_line(&mut url)?;
    let url = url.trim().to_string();
    anyhow::ensure!(url.starts_with("http://127.0.0.1:"), "the Hub double said {url:?}");

    let hf_cache = work.join("hf-cache");
    let log = fs::File::create(work.join("server.log"))?;
    let mut server = Command::new(root().join("target/release/lemonade"))
        .args(["serve", "--port", PORT])
        .env("HF_ENDPOINT", &url)
        .env("HF_HUB_CACHE", &hf_cache)
        .env("LEMONADE_CACHE_DIR", &cache)
        .env("LEMONADE_LLAMACPP_CPU_BIN", &p.llama_server)
        .env("LEMONADE_RELEASES_URL", &url)
        .env("LEMONADE_CHECK_UPDATES", "false")
        .env_remove("LEMONADE_API_KEY")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start lemonade")?;
    let result = (|| -> Result<()> {
        wait_live()?;
        let mut totals = BTreeMap::<&str, usize>::new();
        let mut failing = Vec::new();
        for file in FILES.iter().filter(|f| only.as_deref().is_none_or(|o| o == **f)) {
            let out = work.join(format!("{file}.log"));
            // The files' runner stops at the first failure (failfast); every test is counted here.
            let status = Command::new(&p.python)
                .arg("-c")
                .arg(NO_FAILFAST)
                .arg(file)
                .args(&extra)
                .current_dir(work.join("test"))
                .env("LEMONADE_TEST_PORT", PORT)
                .env("HF_HUB_CACHE", &hf_cache)
                .env("HF_ENDPOINT", &url)
                .env("PYTHONUNBUFFERED", "1")
                .stdout(fs::File::create(&out)?)
                .stderr(Stdio::from(fs::OpenOptions::new().append(true).open(&out)?))
                .status()?;
            let text = fs::read_to_string(&out)?;
            let counts = count(&text);
            println!("{file}: {counts:?} (exit {status}; log {})", out.display());
            for (k, v) in &counts {
                *totals.entry(k).or_default() += v;
            }
            failing.extend(failures(&text).into_iter().map(|t| format!("{file} {t}")));
        }
        println!("\ntotal: {totals:?}");
        for f in &failing {
            println!("  {f}");
        }
        Ok(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    let _ = hub.kill();
    let _ = hub.wait();
    result
}

/// The llama.cpp release the install tests download, as a stand-in: the provisioned
/// llama-server packed as llama.cpp's release packs it, under the pinned version's asset name
/// in the Hub double's release layout, and the pins (the built-in file) with its sha256 in
/// lemonade's cache, so the archive is checked as a real one is.
fn release_stand_in(hub_root: &std::path::Path, cache: &std::path::Path, llama_server: &std::path::Path) -> Result<()> {
    let pins_text = fs::read_to_string(root().join("crates/registry/data/backend_versions.json"))?;
    let mut pins: serde_json::Value = serde_json::from_str(&pins_text)?;
    let version = pins["llamacpp"]["cpu"].as_str().context("no llamacpp cpu pin")?.to_string();
    let asset = format!("llama-{version}-bin-ubuntu-x64.tar.gz");
    let top = format!("llama-{version}");
    let stage = hub_root.parent().context("the Hub's parent")?.join("release");
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(stage.join(&top))?;
    fs::copy(llama_server, stage.join(&top).join("llama-server"))?;
    let dir = hub_root.join("ggml-org/llama.cpp/releases/download").join(&version);
    fs::create_dir_all(&dir)?;
    let archive = dir.join(&asset);
    run(Command::new("tar").arg("-czf").arg(&archive).arg("-C").arg(&stage).arg(&top))?;
    let out = Command::new("sha256sum").arg(&archive).output()?;
    anyhow::ensure!(out.status.success(), "sha256sum failed");
    let sha = String::from_utf8(out.stdout)?.split_whitespace().next().context("sha256sum said nothing")?.to_string();
    pins["sha256"] = serde_json::json!({ asset: sha });
    fs::create_dir_all(cache)?;
    fs::write(cache.join("backend_versions.json"), serde_json::to_vec_pretty(&pins)?)?;
    Ok(())
}

fn wait_live() -> Result<()> {
    for _ in 0..600 {
        let ok = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &format!("http://localhost:{PORT}/live")])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bail!("lemonade did not answer /live on port {PORT} within a minute (target/v11/server.log)")
}

/// The counts unittest's summary gives: `Ran N tests`, then `OK` or `FAILED (failures=F,
/// errors=E, skipped=S)` (and `OK (skipped=S)`).
fn count(text: &str) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    let ran: usize =
        text.lines().find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    let summary = text.lines().rev().find(|l| l.starts_with("FAILED") || l.starts_with("OK")).unwrap_or("");
    let field = |name: &str| -> usize {
        summary
            .split(['(', ')', ','])
            .find_map(|part| part.trim().strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    let (failed, errors, skipped) = (field("failures"), field("errors"), field("skipped"));
    m.insert("ran", ran);
    m.insert("passed", ran.saturating_sub(failed + errors + skipped));
    m.insert("failed", failed + errors);
    m.insert("skipped", skipped);
    m
}

/// The tests unittest's report names: `FAIL: test_x (…)` and `ERROR: test_x (…)`.
fn failures(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let (kind, rest) = l.split_once(": ")?;
            matches!(kind, "FAIL" | "ERROR")
                .then(|| format!("{} ({})", rest.split(' ').next().unwrap_or(rest), kind.to_lowercase()))
        })
        .collect()
}
