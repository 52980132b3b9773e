//! The client commands of the real binary against a running server with real llama-server:
//! their text and `--json` output, exit codes, `stop` (checked by PID), and `run` driven
//! through a pseudo-terminal for a two-turn chat with Ctrl-C.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::pty::Pty;
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test]
async fn load_status_unload_list_and_system_info() {
    let l = Lemonade::start(bin(), &[]).await;

    let (code, out, err) = l.cli(&["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!(
        (v["running"].clone(), v["pid"].clone(), v["loaded_models"].clone()),
        (json!(true), json!(l.pid()), json!([]))
    );

    let (code, out, err) = l.cli(&["load", SMOL, "--ctx-size", "1024", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out)["model_name"], SMOL);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(loaded_names(&h), [SMOL]);
    assert_eq!(h["all_models_loaded"][0]["recipe_options"]["ctx_size"], 1024, "the load setting reached the server");

    let (code, out, _) = l.cli(&["status"]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("Server is running on port {} (pid {})", l.port(), l.pid())), "{out}");
    assert!(out.contains(&format!("  {SMOL} (llm, llamacpp)")), "{out}");

    let (code, out, _) = l.cli(&["load", GEMMA]).await;
    assert_eq!((code, out.trim()), (0, format!("Model loaded successfully: {GEMMA}").as_str()));
    let (code, out, _) = l.cli(&["unload", GEMMA, "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["status"], "success");
    let (code, out, _) = l.cli(&["unload"]).await;
    assert_eq!((code, out.trim()), (0, "All models unloaded."));
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());

    // Errors: a message on stderr, exit 1.
    let (code, _, err) = l.cli(&["load", "user.NoSuchModel"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("Failed to load model") && err.contains("user.NoSuchModel"), "{err}");
    let (code, _, err) = l.cli(&["unload", SMOL]).await;
    assert_eq!(code, 1);
    assert!(err.contains("not loaded"), "{err}");
    let (code, _, err) = l.cli(&["load", SMOL, "--llamacpp-args", "--port 9"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("'--port'"), "{err}");

    let (code, out, _) = l.cli(&["list", "--json"]).await;
    assert_eq!(code, 0);
    let ids: Vec<String> =
        parse(&out)["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().into()).collect();
    assert!(ids.contains(&shown(SMOL).to_string()) && ids.contains(&shown(GEMMA).to_string()), "{ids:?}");

    let (code, out, _) = l.cli(&["system-info", "--json"]).await;
    assert_eq!(code, 0);
    let v = parse(&out);
    assert!(v["Processor"].is_string() && v["Physical Memory"].as_str().unwrap().ends_with(" GB"), "{v}");
    assert_eq!(v["devices"]["cpu"]["available"], true);
    assert!(v["devices"]["cpu"]["threads"].as_u64().unwrap() >= 1);
    // No GPU here: lists, never an error status.
    assert!(v["devices"]["amd_dgpu"].is_array() && v["devices"]["nvidia_dgpu"].is_array(), "{v}");
    // Every device key Lemonade returns is present; one that is absent says so.
    assert_eq!(v["devices"]["amd_igpu"]["available"], false, "{v}");
    assert_eq!(v["devices"]["amd_npu"]["available"], false, "{v}");
    // Release pages where the backend has releases (any platform), none for `system`.
    let b = &v["recipes"]["llamacpp"]["backends"];
    assert_eq!(b["vulkan"]["release_url"], "https://github.com/ggml-org/llama.cpp/releases/tag/b9093", "{b}");
    assert_eq!(b["metal"]["release_url"], "https://github.com/ggml-org/llama.cpp/releases/tag/b9093", "{b}");
    assert_eq!(b["system"]["release_url"], "", "{b}");
    assert_eq!(
        v["recipes"]["whispercpp"]["release_url"],
        "https://github.com/ggml-org/whisper.cpp/releases/tag/v1.8.2"
    );
    assert_eq!(v["recipes"]["llamacpp"]["release_url"], b["cpu"]["release_url"], "the default backend's");
    let cpu = &v["recipes"]["llamacpp"]["backends"]["cpu"];
    assert_eq!(cpu["state"], "installed", "the test points LEMONADE_LLAMACPP_CPU_BIN at llama-server: {cpu}");
    assert_eq!(v["recipes"]["llamacpp"]["backends"]["metal"]["state"], "unsupported");
    assert_eq!(v["recipes"]["llamacpp"]["default_backend"], "cpu");
    let (code, out, _) = l.cli(&["system-info", "--verbose", "--json"]).await;
    assert_eq!(code, 0);
    let v = parse(&out);
    assert_eq!(v["details"]["backend_binaries"]["llamacpp:cpu"], llama_server().display().to_string());
    let (code, out, _) = l.cli(&["system-info"]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("OS Version") && out.contains("Devices:") && out.contains("Recipe"), "{out}");

    let (code, out, _) = l.cli(&["recipes"]).await;
    assert_eq!(code, 0);
    let row = out.lines().find(|r| r.starts_with("llamacpp") && r.contains(" cpu ")).expect("a llamacpp cpu row");
    assert!(row.contains("installed"), "{row}");
    let first = |p: &str| out.lines().position(|r| r.starts_with(p)).unwrap();
    assert!(first("llamacpp") < first("whispercpp"), "v9's recipe order: {out}");
    let (code, out, _) = l.cli(&["recipes", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(parse(&out)["llamacpp"]["backends"]["cpu"]["state"], "installed");
    let (code, _, err) = l.cli(&["recipes", "--install", "llamacpp"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("requires format 'recipe:backend'"), "{err}");
    let (code, _, err) = l.cli(&["recipes", "--install", "nope:cpu"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("Unknown recipe: nope"), "{err}");
}

#[tokio::test]
async fn status_and_stop_when_nothing_runs() {
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[]).await;
    let port = free_port();
    let run = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.args(args)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .env("LEMONADE_CACHE_DIR", l.sandbox.cache());
        c.output().unwrap()
    };
    let out = run(&["status"]);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).trim()), (Some(1), "Server is not running"));
    let out = run(&["status", "--json"]);
    assert_eq!(parse(&String::from_utf8_lossy(&out.stdout))["running"], false);
    let out = run(&["stop"]);
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).trim()),
        (Some(0), "Lemonade Server is not running")
    );
    let out = run(&["load", SMOL]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"), "{out:?}");
    // list (like pull, delete and recipes --install) starts a temporary server, then stops it.
    let out = run(&["list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(parse(&String::from_utf8_lossy(&out.stdout))["data"].is_array());
    let pid_file = l.sandbox.cache().join(format!("run/lemonade-{port}.pid"));
    assert!(!pid_file.exists(), "the temporary server is gone");
    let out = run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
}

#[tokio::test]
async fn run_uses_a_running_server_and_leaves_it_running() {
    let l = Lemonade::start(bin(), &[]).await;
    let mut cmd = Command::new(bin());
    cmd.args(["--host", "127.0.0.1", "--port", &l.port().to_string(), "run", SMOL, "--max-tokens", "16"])
        .env("LEMONADE_CACHE_DIR", l.sandbox.cache())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"Write a long poem about the sea.\n/exit\n").unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with(&format!("Chatting with {SMOL}.")), "{stdout}");
    // SmolLM2 samples at its default temperature: any text may come (emoji too), so check that
    // an answer was printed between the greeting and the end, and that it was bounded.
    let answer = stdout.split_once('\n').map(|x| x.1).unwrap_or_default();
    assert!(!answer.trim().is_empty(), "an answer was printed: {stdout}");
    assert!(!answer.contains("Error"), "{stdout}");
    // The proxy records the stats as the stream ends, just after the client has seen it end.
    let stats = wait_for(Duration::from_secs(10), || async {
        let (_, v) = l.get("/api/v1/stats").await;
        v["output_tokens"].as_u64().filter(|n| *n > 0)
    })
    .await;
    assert_eq!(stats, Some(16), "--max-tokens 16 cuts the long poem short");
    let (s, h) = l.get("/api/v1/health").await;
    assert_eq!((s, loaded_names(&h)), (200, vec![SMOL.to_string()]), "the server run did not start keeps running");
}

/// Terminal output without escape sequences (rustyline's bracketed-paste and cursor codes).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn stop_leaves_no_lemonade_or_llama_server_behind() {
    let mut l = Lemonade::start(bin(), &[]).await;
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200);
    let backends = child_pids(l.pid());
    assert_eq!(backends.len(), 1, "one llama-server");
    let pid_file = l.sandbox.cache().join(format!("run/lemonade-{}.pid", l.port()));
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), format!("{}\n{}\n", l.pid(), l.port()));

    let (code, out, err) = l.cli(&["stop", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!(
        (v["status"].clone(), v["pid"].clone(), v["killed"].clone()),
        (json!("stopped"), json!(l.pid()), json!(0))
    );
    assert!(l.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "lemonade exited cleanly");
    assert!(!alive(backends[0]), "llama-server {} is gone", backends[0]);
    assert!(!pid_file.exists(), "the PID file is removed");
    let (code, _, _) = l.cli(&["status"]).await;
    assert_eq!(code, 1);
}

#[tokio::test]
async fn stop_kills_a_wedged_server_and_its_backends() {
    let mut l = Lemonade::start(bin(), &[]).await;
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200);
    let backends = child_pids(l.pid());
    assert_eq!(backends.len(), 1);
    l.signal(libc::SIGSTOP);
    let (code, out, err) = l.cli(&["stop", "--timeout", "1", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let v = parse(&out);
    // A stopped process cannot handle SIGTERM: it is killed after the timeout, with its backend.
    assert_eq!(v["status"], "stopped");
    assert!(v["killed"].as_u64().unwrap() >= 1, "{v}");
    assert!(l.wait_exit(Duration::from_secs(5)).is_some(), "lemonade is gone");
    assert!(!alive(backends[0]), "llama-server {} is gone", backends[0]);
}

#[tokio::test]
async fn stop_kills_what_ignores_sigterm() {
    // The fake backend ignores SIGTERM when asked; lemonade's own stop grace is longer than
    // the CLI's timeout, so the CLI has to kill both.
    let s = fake_sandbox(&[("slow-stop", None, json!({"ignore_sigterm": true}))]);
    let fake = fake_llama_server();
    let mut l = Lemonade::start_in(
        bin(),
        s,
        &["--stop-timeout", "30"],
        &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())],
    )
    .await;
    let (st, v) = l.post("/api/v1/load", &json!({"model_name": "extra.slow-stop"})).await;
    assert_eq!(st, 200, "{v}");
    let backends = child_pids(l.pid());
    assert_eq!(backends.len(), 1);
    let t = std::time::Instant::now();
    let (code, out, err) = l.cli(&["stop", "--timeout", "1", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    // SIGTERM first (lemonade began its shutdown), the 1 s timeout waited out, then SIGKILL.
    assert!(t.elapsed() >= Duration::from_millis(900), "the CLI did not wait its timeout: {:?}", t.elapsed());
    assert!(l.log().contains("shutting down: stopping backends"), "lemonade got SIGTERM first: {}", l.log());
    assert!(parse(&out)["killed"].as_u64().unwrap() >= 1, "{out}");
    assert!(l.wait_exit(Duration::from_secs(5)).is_some());
    assert!(!alive(backends[0]), "the backend {} is gone", backends[0]);
}

#[tokio::test]
async fn run_chats_in_a_terminal_and_stops_its_server() {
    let sandbox = Sandbox::new();
    let port = free_port();
    let mut cmd = Command::new(bin());
    // Answers are bounded so a rambling one cannot run to the end of the context; 200 tokens
    // leave the Ctrl-C below ample time.
    let port_s = port.to_string();
    cmd.args(["--host", "127.0.0.1", "--port", &port_s, "run", SMOL, "--max-tokens", "200", "--extra-models-dir"])
        .arg(sandbox.extra());
    sandbox.apply(&mut cmd);
    cmd.env("TERM", "xterm").env("LEMONADE_LLAMACPP_CPU_BIN", llama_server());
    let mut pty = Pty::spawn(&mut cmd);
    let t = Duration::from_secs(120);
    let mut at = pty.expect(">>> ", 0, t);
    let server_pid: u32 = std::fs::read_to_string(sandbox.cache().join(format!("run/lemonade-{port}.pid")))
        .expect("run started a server with a PID file")
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let http = reqwest::Client::new();
    let stats = || async {
        let v: Value =
            http.get(format!("http://127.0.0.1:{port}/api/v1/stats")).send().await.unwrap().json().await.unwrap();
        // The whole prompt (processed plus cached tokens) and the answer's tokens.
        (v["prompt_tokens"].as_u64().unwrap_or(0), v["output_tokens"].as_u64().unwrap_or(0))
    };

    pty.send("What is the capital of France? Answer in one word.\r");
    let answer_start = pty.expect("Answer in one word.", at, t);
    at = pty.expect(">>> ", answer_start, t);
    // SmolLM2 at its default temperature: the words vary (emoji too), so check an answer
    // streamed, and count its tokens below.
    let first = strip_ansi(&pty.output()[answer_start..at]);
    let first = first.trim().trim_end_matches(">>>").trim();
    assert!(!first.is_empty(), "first answer: {first:?}");
    assert!(!first.contains("Error"), "{first:?}");
    // The proxy records the stats as the stream ends, just after the client has seen it end.
    let got =
        wait_for(Duration::from_secs(10), || async { Some(stats().await).filter(|(i, o)| *i > 0 && *o > 0) }).await;
    let Some((in1, out1)) = got else {
        panic!("no stats of the first answer: {:?}\n{}", stats().await, pty.output());
    };

    pty.send("And what is the capital of Italy?\r");
    let start2 = pty.expect("capital of Italy?", at, t);
    at = pty.expect(">>> ", start2, t);
    let (in2, _) = wait_for(t, || async { Some(stats().await).filter(|(i, _)| *i != in1) })
        .await
        .expect("stats of the second answer");
    // The second prompt carries the first question and answer: more tokens than both new parts.
    assert!(in2 > in1 + out1, "history was sent: first prompt {in1} + answer {out1} tokens, second prompt {in2}");

    // Ctrl-C stops an answer, not the program.
    pty.send("Write a very long story about a dragon who learns to cook. Make it at least twenty paragraphs.\r");
    let start3 = pty.expect("twenty paragraphs.", at, t);
    let deadline = std::time::Instant::now() + t;
    while pty.len() < start3 + 80 {
        assert!(std::time::Instant::now() < deadline, "no answer streamed: {}", pty.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    pty.send("\x03");
    let stopped = pty.expect("[generation stopped]", start3, t);
    pty.expect(">>> ", stopped, t);
    assert!(pty.child.try_wait().unwrap().is_none(), "still running after Ctrl-C");
    // The server was not interrupted: the backend's slot is free again and answers.
    let r = http
        .post(format!("http://127.0.0.1:{port}/api/v1/chat/completions"))
        .json(&json!({"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let backends = child_pids(server_pid);
    assert_eq!(backends.len(), 1, "one llama-server");
    pty.send("/exit\r");
    let status = pty.wait(Duration::from_secs(30)).expect("run exits after /exit");
    assert!(status.success(), "{status:?}\n{}", pty.output());
    assert!(!alive(server_pid), "the server run started is stopped");
    assert!(!alive(backends[0]), "and its llama-server");
}

#[test]
fn completions_and_help_document_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin()).args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let s = String::from_utf8_lossy(&out.stdout);
        for cmd in ["serve", "run", "pull", "recipes", "system-info", "stop"] {
            assert!(s.contains(cmd), "{shell} completion lacks {cmd}");
        }
    }
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("lemonade {}", env!("CARGO_PKG_VERSION")));
    let out = Command::new(bin()).args(["recipes", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--install <RECIPE:BACKEND>") && help.contains("--api-key"), "{help}");
}

#[tokio::test]
async fn a_server_started_by_run_dies_with_it() {
    let sandbox = Sandbox::new();
    let port = free_port();
    let mut run = Command::new(bin())
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "run", SMOL, "--extra-models-dir"])
        .arg(sandbox.extra())
        .env("LEMONADE_CACHE_DIR", sandbox.cache())
        .env("HF_HUB_CACHE", sandbox.hf_cache())
        .env("LEMONADE_LLAMACPP_CPU_BIN", llama_server())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = sandbox.cache().join(format!("run/lemonade-{port}.pid"));
    let server: u32 = wait_for(Duration::from_secs(60), || async {
        let pid = std::fs::read_to_string(&pid_file).ok()?.lines().next()?.parse::<u32>().ok()?;
        // Loaded: the chat prompt is next.
        (child_pids(pid).len() == 1).then_some(pid)
    })
    .await
    .expect("run started a server and loaded the model");
    let backend = child_pids(server)[0];
    run.kill().unwrap(); // SIGKILL: run cannot clean up itself
    run.wait().unwrap();
    let gone = wait_for(Duration::from_secs(15), || async { (!alive(server) && !alive(backend)).then_some(()) }).await;
    assert!(gone.is_some(), "the server ({server}) and its llama-server ({backend}) died with run");
}
