//! lemonade as a node among many: the model-server metrics contract routers and inference
//! gateways read, backpressure from remote upstreams, trace and session headers, spillover,
//! and three nodes behind a real router.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

#[tokio::test]
async fn real_llama_server_the_metrics_contract_shows_the_load_applied_under_lemonade_and_vllm_names() {
    let l = Lemonade::start(bin(), &["--metrics-names", "vllm"]).await;
    let base = l.url("");
    let out = py_checks("metrics_contract.py", &[&base, SMOL, "2", "3"]).await;
    println!("{out}");
}

/// The fake backend standing in for a remote upstream (a vLLM node): `knobs` script its
/// answers and name the file its requests' headers go to. Killed on drop.
struct FakeUpstream {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeUpstream {
    async fn start(mut knobs: Value) -> FakeUpstream {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("up.gguf");
        std::fs::write(&model, b"not a model").unwrap();
        let log = dir.path().join("headers.jsonl");
        knobs["headers_log"] = json!(log.display().to_string());
        std::fs::write(dir.path().join("up.gguf.json"), knobs.to_string()).unwrap();
        let port = host::supervisor::free_port().unwrap();
        let child = std::process::Command::new(fake_llama_server())
            .args(["-m", model.to_str().unwrap(), "--port", &port.to_string(), "--alias", "m"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{port}/health");
        let up = wait_for(Duration::from_secs(20), || async {
            http.get(&url).send().await.ok().filter(|r| r.status() == 200).map(|_| ())
        })
        .await;
        assert!(up.is_some(), "the fake upstream started");
        FakeUpstream { child, port, log, _dir: dir }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The headers of each chat request that reached it, in order.
    fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

/// A chat with trace context and a session id: (status, Retry-After, body).
async fn traced_chat(l: &Lemonade, model: &str) -> (u16, Option<String>, Value) {
    let r = l
        .http
        .post(l.url("/api/v1/chat/completions"))
        .header("traceparent", TRACEPARENT)
        .header("tracestate", "vendor=opaque")
        .header("x-session-id", "conversation-7")
        .json(&chat(model))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap_or_default())
}

async fn install(l: &Lemonade, name: &str, up: &FakeUpstream, extra: Value) {
    let mut body = json!({"recipe": "cloud", "backend": name, "base_url": up.url(), "api_key": "k-123"});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (s, v) = l.post("/api/v1/install", &body).await;
    assert_eq!(s, 200, "{v}");
}

async fn upstream_view(l: &Lemonade, name: &str) -> Value {
    let (_, v) = l.get("/api/v1/health").await;
    v["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == name).cloned().unwrap_or_default()
}

#[tokio::test]
async fn upstream_backpressure_is_waited_out_or_passed_on_as_503_with_retry_after_and_headers_reach_it() {
    let script = json!([
        {"status": 429, "retry_after": "1"}, {"status": 503, "retry_after": "1"}, {"status": 200},
        {"status": 429, "retry_after": "60"},
    ]);
    let up = FakeUpstream::start(json!({"script": script})).await;
    let l = Lemonade::start(bin(), &[]).await;
    // A gateway that wants its key bare in `api-key` (Lemonade #3222).
    install(&l, "vllm", &up, json!({"auth_header_name": "api-key", "auth_header_prefix": ""})).await;

    // 429 then 503, each with Retry-After 1: waited out, and the third try answers.
    let t = std::time::Instant::now();
    let (s, _, v) = traced_chat(&l, "vllm.m").await;
    assert_eq!(s, 200, "{v}");
    assert!(t.elapsed() >= Duration::from_secs(2), "each Retry-After was waited: {:?}", t.elapsed());
    let seen = up.requests();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for h in &seen {
        assert_eq!(h["traceparent"], TRACEPARENT, "{h}");
        assert_eq!(h["tracestate"], "vendor=opaque", "{h}");
        assert_eq!(h["x-session-id"], "conversation-7", "{h}");
        assert_eq!(h["api-key"], "k-123", "the key bare in the configured header: {h}");
        assert!(h.get("authorization").is_none(), "{h}");
    }
    let view = upstream_view(&l, "vllm").await;
    assert_eq!((view["auth_header_name"].as_str(), view["auth_header_prefix"].as_str()), (Some("api-key"), Some("")));

    // Retry-After 60 is too long to wait here: 503 with it, never 502, and no second try.
    let (s, retry, v) = traced_chat(&l, "vllm.m").await;
    assert_eq!((s, retry.as_deref()), (503, Some("60")), "{v}");
    assert_eq!(v["error"]["code"], "upstream_busy", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("retry after 60 s"), "{v}");
    assert_eq!(up.requests().len(), 4);
    // Backpressure is an answer, not a failure: the breaker stays closed.
    assert_eq!(upstream_view(&l, "vllm").await["breaker"]["state"], "closed");
}

#[tokio::test]
async fn the_circuit_breaker_opens_after_failures_refuses_without_calling_then_probes_and_closes() {
    let up = FakeUpstream::start(json!({"script": [{"status": 500}, {"status": 500}]})).await;
    let l = Lemonade::start(bin(), &["--breaker-failures", "2", "--breaker-open-ms", "1500"]).await;
    install(&l, "vllm", &up, json!({})).await;
    for _ in 0..2 {
        let (s, _, v) = traced_chat(&l, "vllm.m").await;
        assert_eq!((s, v["error"]["code"].as_str()), (502, Some("upstream_error")), "{v}");
    }
    let b = upstream_view(&l, "vllm").await["breaker"].clone();
    assert_eq!((b["state"].as_str(), b["opened"].as_u64()), (Some("open"), Some(1)), "{b}");
    // Open: refused at once with Retry-After, the upstream never called.
    let (s, retry, v) = traced_chat(&l, "vllm.m").await;
    assert_eq!((s, retry.as_deref(), v["error"]["code"].as_str()), (503, Some("2"), Some("upstream_busy")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("circuit breaker is open"), "{v}");
    assert_eq!(up.requests().len(), 2);
    // Once the pause is over, one request probes it; the upstream has recovered: closed.
    let waited = wait_for(Duration::from_secs(10), || async {
        let b = upstream_view(&l, "vllm").await["breaker"].clone();
        (b["retry_in_ms"].as_u64() == Some(0)).then_some(())
    })
    .await;
    assert!(waited.is_some(), "the breaker's pause ended");
    let (s, _, v) = traced_chat(&l, "vllm.m").await;
    assert_eq!(s, 200, "{v}");
    let b = upstream_view(&l, "vllm").await["breaker"].clone();
    assert_eq!((b["state"].as_str(), b["failures"].as_u64(), b["opened"].as_u64()), (Some("closed"), Some(0), Some(1)));
    assert_eq!(up.requests().len(), 3);
}

#[tokio::test]
async fn an_upstream_at_its_max_in_flight_refuses_more_with_503_until_one_ends() {
    let up = FakeUpstream::start(json!({"token_delay_ms": 50, "tokens": 40})).await;
    let l = Lemonade::start(bin(), &[]).await;
    install(&l, "vllm", &up, json!({"max_in_flight": 1})).await;
    let mut body = chat("vllm.m");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(40);
    let mut first = l.http.post(l.url("/api/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.chunk().await.unwrap().is_some(), "the first stream started");
    assert_eq!(upstream_view(&l, "vllm").await["in_flight"], 1);
    let (s, retry, v) = traced_chat(&l, "vllm.m").await;
    assert_eq!((s, retry.as_deref()), (503, Some("1")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("max_in_flight"), "{v}");
    while first.chunk().await.unwrap().is_some() {}
    let freed = wait_for(Duration::from_secs(10), || async {
        (upstream_view(&l, "vllm").await["in_flight"] == 0).then_some(())
    })
    .await;
    assert!(freed.is_some(), "the finished stream left the count");
    assert_eq!(traced_chat(&l, "vllm.m").await.0, 200);
    assert_eq!(up.requests().len(), 2, "the refused request never reached it");
}

#[tokio::test]
async fn trace_and_session_headers_reach_a_local_backend_and_the_session_header_is_configurable() {
    let log = tempfile::tempdir().unwrap();
    let path = log.path().join("h.jsonl");
    let knobs = json!({"headers_log": path.display().to_string()});
    let fake = fake_llama_server().to_str().unwrap().to_string();
    let l = Lemonade::start_in(
        bin(),
        fake_sandbox(&[("m", None, knobs)]),
        // The fake writes its headers log outside the folders a sandboxed backend may write.
        &["--session-header", "X-Conversation", "--sandbox", "off"],
        &[("LEMONADE_LLAMACPP_CPU_BIN", &fake)],
    )
    .await;
    let r = l
        .http
        .post(l.url("/v1/chat/completions"))
        .header("traceparent", TRACEPARENT)
        .header("x-conversation", "c-9")
        .header("x-session-id", "not-forwarded")
        .json(&chat("extra.m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = std::fs::read_to_string(&path).unwrap();
    let h: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!((h["traceparent"].as_str(), h["x-conversation"].as_str()), (Some(TRACEPARENT), Some("c-9")), "{h}");
    assert!(h.get("x-session-id").is_none(), "only the configured session header goes on: {h}");
    assert!(h.get("tracestate").is_none(), "{h}");
}

#[tokio::test]
async fn real_llama_server_three_nodes_behind_vllm_router_spread_spare_the_busy_one_keep_sessions_and_survive_a_kill() {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let l = Lemonade::start(bin(), &[]).await;
        let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL, "parallel": 4})).await;
        assert_eq!(s, 200, "{v}");
        nodes.push(l);
    }
    let logs = tempfile::tempdir().unwrap();
    let router = python().with_file_name("vllm-router");
    assert!(router.is_file(), "vllm-router not found at {}: run `cargo xtask setup`", router.display());
    let urls: Vec<String> = nodes.iter().map(|l| l.url("")).collect();
    let pid = nodes[2].pid().to_string();
    let (r, d) = (router.display().to_string(), logs.path().display().to_string());
    let out = py_checks("router_nodes.py", &[&r, SMOL, &d, &urls[0], &urls[1], &urls[2], &pid]).await;
    println!("{out}");
}

#[tokio::test]
async fn a_saturated_model_spills_to_the_first_place_with_capacity_and_the_header_says_why() {
    let vllm = |waiting: u32, kv: f64| {
        format!(
            "vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\nvllm:num_requests_running{{model_name=\"m\"}} 8\n\
             vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
        )
    };
    let busy = FakeUpstream::start(json!({"metrics": vllm(4, 0.97)})).await;
    let free = FakeUpstream::start(json!({"metrics": vllm(0, 0.25)})).await;
    let fake = fake_llama_server().to_str().unwrap().to_string();
    let local = json!({"token_delay_ms": 50, "tokens": 60});
    let l =
        Lemonade::start_in(bin(), fake_sandbox(&[("m", None, local)]), &[], &[("LEMONADE_LLAMACPP_CPU_BIN", &fake)])
            .await;
    install(&l, "busy", &busy, json!({})).await;
    install(&l, "free", &free, json!({})).await;
    let load = json!({"model_name": "extra.m", "max_concurrent": 1, "spillover": ["busy.m", "free.m"]});
    let (s, v) = l.post("/api/v1/load", &load).await;
    assert_eq!(s, 200, "{v}");
    let ask = |stream: bool| {
        let mut body = chat("extra.m");
        body["stream"] = json!(stream);
        l.http.post(l.url("/api/v1/chat/completions")).json(&body).send()
    };
    // Not saturated: served here, no decision to tell.
    let r = ask(false).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-lemonade-upstream").is_none(), "{:?}", r.headers());
    // The whole answer read, the next request follows at once: the view may still count the
    // request that ended, and spillover waits for the owner to take its release, so the
    // stream stays here.
    r.bytes().await.unwrap();
    // One long stream takes its only place: the next request goes to the first place with
    // capacity, `free.m`, as `busy.m`'s metrics show it saturated.
    let mut first = ask(true).await.unwrap();
    assert!(first.headers().get("x-lemonade-upstream").is_none(), "the stream is local: {:?}", first.headers());
    assert!(first.chunk().await.unwrap().is_some(), "the local stream started");
    let r = ask(false).await.unwrap();
    assert_eq!(r.status(), 200);
    let why = r.headers().get("x-lemonade-upstream").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    assert!(why.starts_with("free.m; reason="), "{why}");
    for part in ["local: running 1 of 1, waiting 0", "busy.m: waiting 4, running 8, KV cache 97%", "free.m: waiting 0"]
    {
        assert!(why.contains(part), "{part} missing from {why}");
    }
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 tok3 ", "{v}");
    assert_eq!((busy.requests().len(), free.requests().len()), (0, 1), "only free.m was asked");
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let line = r#"lemonade_spillover_decisions_total{model="extra.m",place="free.m",reason="saturated"} 1"#;
    assert!(metrics.lines().any(|l| l == line), "{line} missing:\n{metrics}");
    while first.chunk().await.unwrap().is_some() {}
}

fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file)
}

/// `kubernetes-validate --strict` (pinned in the test venv) on `file`: (succeeded, output).
fn kubernetes_validate(file: &Path) -> (bool, String) {
    let kv = python().with_file_name("kubernetes-validate");
    assert!(kv.is_file(), "kubernetes-validate not found at {}: run `cargo xtask setup`", kv.display());
    let o = std::process::Command::new(kv).args(["--strict", "-k", "1.33.0"]).arg(file).output().unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn the_kubernetes_example_validates_offline_and_points_the_endpoint_picker_at_lemonades_metric_names() {
    let (ok, out) = kubernetes_validate(&deploy("kubernetes/lemonade.yaml"));
    assert!(ok, "{out}");
    for r in
        ["secret/lemonade-api-key", "persistentvolumeclaim/lemonade-models", "deployment/lemonade", "service/lemonade"]
    {
        assert!(out.contains(&format!("passed for resource {r}")), "{r}: {out}");
    }
    let (ok, out) = kubernetes_validate(&deploy("kubernetes/inference-pool.yaml"));
    assert!(ok, "{out}");
    for r in ["configmap/lemonade-epp-config", "deployment/lemonade-epp", "service/lemonade-epp"] {
        assert!(out.contains(&format!("passed for resource {r}")), "{r}: {out}");
    }
    // The validator can fail: a misspelt field is refused under --strict.
    let text = std::fs::read_to_string(deploy("kubernetes/lemonade.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text.replace("readinessProbe:", "readinesProbe:")).unwrap();
    assert!(!kubernetes_validate(&broken).0, "a misspelt probe passed");
    // The probes, the key and the cache are where lemonade has them; the pool selects its pods
    // on its port; the endpoint picker reads the names `--metrics-names vllm` exports.
    for want in [
        "path: /live",
        "path: /health",
        "name: LEMONADE_API_KEY",
        "secretKeyRef:",
        "claimName: lemonade-models",
        "value: /var/lib/lemonade",
        "\"--metrics-names\", \"vllm\"",
        "runAsNonRoot: true",
    ] {
        assert!(text.contains(want), "{want} missing from lemonade.yaml");
    }
    let pool = std::fs::read_to_string(deploy("kubernetes/inference-pool.yaml")).unwrap();
    for want in [
        "kind: InferencePool",
        "app: lemonade",
        "- number: 8000",
        "=vllm:num_requests_waiting",
        "=vllm:num_requests_running",
        "=vllm:kv_cache_usage_perc",
    ] {
        assert!(pool.contains(want), "{want} missing from inference-pool.yaml");
    }
}

#[test]
fn the_systemd_unit_is_hardened_keeps_its_state_under_var_lib_and_reloads_on_sighup() {
    let unit = std::fs::read_to_string(deploy("systemd/lemonade.service")).unwrap();
    for want in [
        "DynamicUser=yes",
        "StateDirectory=lemonade",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "Environment=LEMONADE_CACHE_DIR=/var/lib/lemonade",
        "ExecStart=/usr/bin/lemonade serve",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "EnvironmentFile=-/etc/default/lemonade",
    ] {
        assert!(unit.lines().any(|l| l == want), "{want} missing from the unit");
    }
}

#[test]
fn service_install_writes_a_user_unit_systemd_verifies_and_uninstall_removes_it() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = std::process::Command::new(bin())
            .args(args)
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .unwrap();
        (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (ok, out) = run(&["service", "install", "--no-start", "--", "--port", "8001", "--metrics-names", "vllm"]);
    assert!(ok, "{out}");
    let unit = home.path().join(".config/systemd/user/lemonade.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    let exec = format!("ExecStart={} serve --port 8001 --metrics-names vllm", bin().display());
    assert!(text.lines().any(|l| l == exec), "{exec} missing from:\n{text}");
    assert!(text.contains("ExecReload=/bin/kill -HUP $MAINPID"), "{text}");
    let v = std::process::Command::new("systemd-analyze").arg("verify").arg(&unit).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr));
    assert!(v.status.success() && !said.contains(".service:"), "systemd-analyze verify: {said}");
    let (ok, out) = run(&["service", "status"]);
    assert!(ok && out.contains("(installed)"), "{out}");
    let (ok, out) = run(&["service", "uninstall"]);
    assert!(ok && out.contains("Removed"), "{out}");
    assert!(!unit.exists());
    let (ok, out) = run(&["service", "status"]);
    assert!(ok && out.contains("(not installed)"), "{out}");
}

#[tokio::test]
async fn sighup_rereads_config_json_and_applies_what_changed_as_systemctl_reload_does() {
    let l = Lemonade::start(bin(), &[]).await;
    assert_eq!(l.get("/internal/config").await.1["load_timeout"], 600);
    let file = l.sandbox.cache().join("config.json");
    let mut c: Value = std::fs::read(&file).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(json!({}));
    c["load_timeout"] = json!(123);
    std::fs::write(&file, c.to_string()).unwrap();
    unsafe {
        libc::kill(l.pid() as i32, libc::SIGHUP);
    }
    let applied = wait_for(Duration::from_secs(10), || async {
        (l.get("/internal/config").await.1["load_timeout"] == 123).then_some(())
    })
    .await;
    assert!(applied.is_some(), "config.json's new load_timeout was not applied after SIGHUP");
    // A bad file changes nothing, and the server stays up.
    c["load_timeout"] = json!("soon");
    std::fs::write(&file, c.to_string()).unwrap();
    unsafe {
        libc::kill(l.pid() as i32, libc::SIGHUP);
    }
    let logged =
        wait_for(Duration::from_secs(10), || async { l.log().contains("config.json not reloaded").then_some(()) })
            .await;
    assert!(logged.is_some(), "the refused reload was not logged");
    assert_eq!(l.get("/internal/config").await.1["load_timeout"], 123);
}

#[tokio::test]
async fn real_llama_server_the_trace_and_session_headers_arrive_at_the_llama_server_child() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": SMOL})).await;
    assert_eq!(s, 200, "{v}");
    let child = child_pids(l.pid())
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "llama-server"));
    let child = child.expect("the llama-server child");
    // llama-server logs no request headers: what it reads from its sockets is watched instead.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("strace.log");
    let mut strace = std::process::Command::new("strace")
        .args(["-f", "-e", "trace=recvfrom,read", "-s", "8192", "-o"])
        .arg(&out)
        .args(["-p", &child.to_string()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("strace (cargo xtask setup installs it)");
    // strace says on stderr when it has attached.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = strace.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("attached") {
                let _ = tx.send(());
            }
        }
    });
    let attached = rx.recv_timeout(Duration::from_secs(10));
    assert!(attached.is_ok(), "strace did not attach to llama-server {child}");
    let (s, _, v) = traced_chat(&l, SMOL).await;
    assert_eq!(s, 200, "{v}");
    let seen = wait_for(Duration::from_secs(10), || async {
        let t = std::fs::read_to_string(&out).unwrap_or_default();
        t.contains(&format!("traceparent: {TRACEPARENT}")).then_some(t)
    })
    .await;
    let _ = strace.kill();
    let _ = strace.wait();
    let t = seen.expect("llama-server never read the traceparent lemonade forwarded");
    assert!(t.contains("tracestate: vendor=opaque") && t.contains("x-session-id: conversation-7"), "{t}");
}

#[tokio::test]
async fn real_llama_server_a_saturated_model_spills_to_a_second_lemonade() {
    let peer = Lemonade::start(bin(), &[]).await;
    let l = Lemonade::start(bin(), &[]).await;
    let body = json!({"recipe": "cloud", "backend": "peer", "base_url": peer.url("/api/v1")});
    let (s, v) = l.post("/api/v1/install", &body).await;
    assert_eq!(s, 200, "{v}");
    let place = format!("peer.{}", shown(SMOL));
    let load = json!({"model_name": SMOL, "max_concurrent": 1, "spillover": [place]});
    let (s, v) = l.post("/api/v1/load", &load).await;
    assert_eq!(s, 200, "{v}");
    // A short chat answered here; the long stream sent the moment its answer is read is not
    // spilled by it, and takes the model's one place here.
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&chat(SMOL)).send().await.unwrap();
    assert!(r.headers().get("x-lemonade-upstream").is_none(), "{:?}", r.headers());
    r.bytes().await.unwrap();
    let long = json!({"model": SMOL, "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 4000,
                      "ignore_eos": true, "stream": true});
    let mut first = l.http.post(l.url("/api/v1/chat/completions")).json(&long).send().await.unwrap();
    assert!(first.headers().get("x-lemonade-upstream").is_none(), "the stream is local: {:?}", first.headers());
    assert!(first.chunk().await.unwrap().is_some(), "the local stream started");
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&chat(SMOL)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let why = r.headers().get("x-lemonade-upstream").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    assert!(why.starts_with(&format!("{place}; reason=")) && why.contains("local: running 1 of 1"), "{why}");
    let v: Value = r.json().await.unwrap();
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    // The second lemonade served it: its own metrics count the request.
    let metrics = peer.http.get(peer.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let line = format!(r#"lemonade_model_requests_total{{model="{SMOL}"}} 1"#);
    assert!(metrics.lines().any(|l| l == line), "{line} missing from the peer's metrics");
    drop(first);
}

#[tokio::test]
async fn real_llama_server_a_peer_lemonades_full_queue_is_waited_out_then_passed_on_as_503_with_retry_after() {
    // The peer: SmolLM2 on real llama-server, one request at a time and one waiting at most;
    // beyond that it answers 503 with Retry-After 1 (queue_full), as a busy vLLM node would.
    let peer = Lemonade::start(bin(), &["--max-queue", "1"]).await;
    let (s, v) = peer.post("/api/v1/load", &json!({"model_name": SMOL, "max_concurrent": 1})).await;
    assert_eq!(s, 200, "{v}");
    let l = Lemonade::start(bin(), &[]).await;
    let body = json!({"recipe": "cloud", "backend": "peer", "base_url": peer.url("/api/v1")});
    let (s, v) = l.post("/api/v1/install", &body).await;
    assert_eq!(s, 200, "{v}");
    // Two long streams sent to the peer directly: one runs, the other waits; its queue is full.
    let long = json!({"model": SMOL, "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 4000,
                      "ignore_eos": true, "stream": true});
    let url = peer.url("/api/v1/chat/completions");
    let mut running = peer.http.post(&url).json(&long).send().await.unwrap();
    assert!(running.chunk().await.unwrap().is_some(), "the peer's first stream started");
    // (Read to its end in a task, so aborting the task drops the stream.)
    let second = peer.http.post(&url).json(&long).send();
    let waiting = tokio::spawn(async move {
        let mut r = second.await?;
        while r.chunk().await?.is_some() {}
        Ok::<_, reqwest::Error>(())
    });
    let full =
        wait_for(Duration::from_secs(30), || async { (peer.get("/get_load").await.1["waiting"] == 1).then_some(()) })
            .await;
    assert!(full.is_some(), "the peer's second stream did not wait");
    // Through lemonade: the peer's 503 with Retry-After 1 is waited out on each attempt, then
    // passed on as 503 with the peer's Retry-After, never 502.
    let place = format!("peer.{}", shown(SMOL));
    let (s, retry, v) = traced_chat(&l, &place).await;
    assert_eq!((s, retry.as_deref(), v["error"]["code"].as_str()), (503, Some("1"), Some("upstream_busy")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("asking to retry after 1 s"), "{v}");
    let metrics = peer.http.get(peer.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let refused = r#"lemonade_http_requests_total{endpoint="/api/v1/chat/completions",method="POST",status="503"} 3"#;
    assert!(metrics.lines().any(|l| l == refused), "the peer refused each of the 3 attempts: {refused} missing");
    // Backpressure is an answer, not a failure: the breaker stays closed.
    assert_eq!(upstream_view(&l, "peer").await["breaker"]["state"], "closed");
    // Once the peer's queue drains, the same request is served.
    drop(running);
    waiting.abort();
    let idle =
        wait_for(Duration::from_secs(60), || async { (peer.get("/get_load").await.1["load"] == 0).then_some(()) })
            .await;
    assert!(idle.is_some(), "the peer's streams did not end");
    let (s, _, v) = traced_chat(&l, &place).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
}
