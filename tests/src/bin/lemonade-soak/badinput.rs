//! Bad input: a hand-written corpus against every endpoint (malformed JSON, wrong types, huge
//! bodies, unknown fields, traversal and odd characters in names and checkpoints, flag
//! injection through `llamacpp_args`), then schemathesis generating requests from the OpenAPI
//! document. Required: no 5xx, every rejection a 4xx with a JSON error message, the server up.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

use crate::{orphans_after, our_processes, Report};

const POSTS: &[&str] = &[
    "/chat/completions",
    "/completions",
    "/responses",
    "/embeddings",
    "/reranking",
    "/load",
    "/unload",
    "/pull",
    "/delete",
    "/install",
    "/uninstall",
    "/log-level",
    "/tokenize",
    "/admin/models/extra.m/load",
    "/admin/models/extra.m/unload",
    "/models/extra.m/options",
    "/models/register",
    "/routing/validate",
    "/classify",
    "/scheduler/plan",
    "/downloads/control",
    "/cloud/auth",
    "/messages",
    "/messages/count_tokens",
    "/audio/transcriptions",
    "/audio/translations",
    "/audio/speech",
    "/images/generations",
    "/images/edits",
    "/images/variations",
];

/// The multipart routes, for the malformed-form corpus.
const MULTIPART_POSTS: &[&str] =
    &["/audio/transcriptions", "/audio/translations", "/images/edits", "/images/variations"];

/// Malformed and hostile multipart bodies: (label, content type, body).
fn forms(names: &[String]) -> Vec<(String, String, Vec<u8>)> {
    let ct = "multipart/form-data; boundary=XyZ".to_string();
    let part = |name: &str, file: Option<&str>, data: &[u8]| {
        let disp = match file {
            Some(f) => format!("form-data; name=\"{name}\"; filename=\"{f}\""),
            None => format!("form-data; name=\"{name}\""),
        };
        let mut v = format!("--XyZ\r\nContent-Disposition: {disp}\r\n\r\n").into_bytes();
        v.extend_from_slice(data);
        v.extend_from_slice(b"\r\n");
        v
    };
    let wav = b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0";
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    let end = b"--XyZ--\r\n".to_vec();
    let mut out = vec![
        ("no boundary".to_string(), "multipart/form-data".to_string(), b"--XyZ--\r\n".to_vec()),
        ("empty form".into(), ct.clone(), end.clone()),
        (
            "truncated part".into(),
            ct.clone(),
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nRIFF".to_vec(),
        ),
        ("no closing boundary".into(), ct.clone(), part("model", None, b"x")),
        ("garbage".into(), ct.clone(), vec![0xff; 4096]),
        (
            "invalid UTF-8 model".into(),
            ct.clone(),
            [part("model", None, &[0xff, 0xfe]), part("file", Some("a.wav"), wav), end.clone()].concat(),
        ),
        (
            "odd numbers".into(),
            ct.clone(),
            [
                part("model", None, b"extra.m"),
                part("temperature", None, b"1e400"),
                part("n", None, b"-1"),
                part("steps", None, b"99999999999"),
                part("file", Some("a.wav"), wav),
                part("image", Some("a.png"), png),
                end.clone(),
            ]
            .concat(),
        ),
    ];
    for n in names {
        let body = [
            part("model", None, n.as_bytes()),
            part("file", Some(n), wav),
            part("image", Some(n), png),
            part("prompt", None, b"x"),
            end.clone(),
        ]
        .concat();
        out.push((format!("model and file named {:?}", n.chars().take(40).collect::<String>()), ct.clone(), body));
    }
    out
}

/// The Ollama API at the root (POST, then `DELETE /api/delete`). `/api/create` is checked on
/// its own: it answers 501 to everything.
const ROOT_POSTS: &[&str] = &[
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/api/pull",
    "/internal/aliases",
    "/internal/set",
    "/internal/pin",
    "/internal/cleanup-cache",
    "/mcp",
];

/// Hostile `collection.router` policies (for `/routing/validate`, and as pulls): deep nesting,
/// huge and catastrophic-backtracking regexes against long inputs, unknown conditions, many
/// rules, wrong types. A 400 or a decision, in bounded time.
fn hostile_policies() -> Vec<(String, Value)> {
    let with = |rules: Value, prompt: String| {
        json!({"policy": {"model": "user.Hostile", "version": "1", "recipe": "collection.router", "components": ["extra.m", "B"],
                          "routing": {"candidates": ["extra.m", "B"], "default_model": "extra.m", "rules": rules}},
               "prompt": prompt})
    };
    let rule = |m: Value| json!([{"id": "r", "match": m, "route_to": "B"}]);
    let mut nested = json!({"min_chars": 0});
    for _ in 0..40 {
        nested = json!({"not": {"any": [nested]}});
    }
    let many: Vec<Value> = (0..5000)
        .map(|i| json!({"id": format!("r{i}"), "match": {"regex": format!("x{i}y")}, "route_to": "B"}))
        .collect();
    let long = "a".repeat(1 << 20);
    vec![
        ("nested 80 deep".into(), with(rule(nested), "x".into())),
        ("(a+)+$ on 1 MiB".into(), with(rule(json!({"regex": "^(a+)+$"})), format!("{long}!"))),
        ("(.*a){20} on 1 MiB".into(), with(rule(json!({"regex": "(.*a){20}b"})), long.clone())),
        ("huge counted regex".into(), with(rule(json!({"regex": "((a{1000}){1000}){1000}"})), "a".into())),
        ("back-reference".into(), with(rule(json!({"regex": "(a)\\1"})), "aa".into())),
        ("unknown condition".into(), with(rule(json!({"sentiment": "angry"})), "x".into())),
        ("5000 rules".into(), with(Value::Array(many), long)),
        ("keywords not strings".into(), with(rule(json!({"keywords_any": [1, null, {}]})), "x".into())),
        ("classifier undeclared".into(), with(rule(json!({"classifier": "c", "label": "x"})), "x".into())),
        ("rules an object".into(), with(json!({"r": 1}), "x".into())),
        ("min_chars huge".into(), with(rule(json!({"min_chars": 1e300})), "x".into())),
    ]
}

/// Hostile `collection.omni` definitions (pulls) and requests to an omni collection
/// (`user.Soak-Omni`, planned by the fake backend): a 400, or an answer in bounded time.
fn hostile_omni() -> Vec<(String, &'static str, Value)> {
    let def = |extra: Value| {
        let mut d = json!({"model": "user.Hostile-Omni", "recipe": "collection.omni", "components": ["extra.m"]});
        d.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        d
    };
    let ask = |messages: Value, extra: Value| {
        let mut b = json!({"model": "user.Soak-Omni", "messages": messages, "max_tokens": 4});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let big_media =
        format!("x ![generated image](data:image/png;base64,{}) <audio>data:audio/wav;base64,", "A".repeat(1 << 20));
    let many: Vec<String> = (0..5000).map(|i| format!("user.C{i}")).collect();
    vec![
        (
            "omni prompt 1 MiB".into(),
            "/api/v1/pull",
            def(json!({"system_prompt": format!("{{tool_list}}{{tool_guidance}}{}", "p".repeat(1 << 20))})),
        ),
        ("omni prompt not a string".into(), "/api/v1/pull", def(json!({"system_prompt": {"a": 1}}))),
        ("omni tool_format a number".into(), "/api/v1/pull", def(json!({"tool_format": 7}))),
        ("omni 5000 components".into(), "/api/v1/pull", def(json!({"components": many}))),
        ("omni nested components".into(), "/api/v1/pull", def(json!({"components": [["extra.m"]]}))),
        ("omni with a policy".into(), "/api/v1/pull", def(json!({"routing": {"rules": []}}))),
        ("omni messages not an array".into(), "/api/v1/chat/completions", ask(json!("hi"), json!({}))),
        (
            "omni 1 MiB of half-embedded media".into(),
            "/api/v1/chat/completions",
            ask(json!([{"role": "user", "content": big_media}]), json!({})),
        ),
        (
            "omni audio part not base64".into(),
            "/api/v1/chat/completions",
            ask(
                json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}]),
                json!({}),
            ),
        ),
        (
            "omni tools not objects".into(),
            "/api/v1/chat/completions",
            ask(json!([{"role": "user", "content": "hi"}]), json!({"tools": [1, "x", null]})),
        ),
        (
            "omni streamed, negative max_tokens".into(),
            "/api/v1/chat/completions",
            ask(json!([{"role": "user", "content": "hi"}]), json!({"stream": true, "max_tokens": -1})),
        ),
        ("omni completions".into(), "/api/v1/completions", json!({"model": "user.Soak-Omni", "prompt": "hi"})),
        ("omni embeddings".into(), "/api/v1/embeddings", json!({"model": "user.Soak-Omni", "input": "hi"})),
        (
            "omni via Ollama".into(),
            "/api/chat",
            json!({"model": "user.Soak-Omni", "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ]
}

fn odd_names() -> Vec<String> {
    vec![
        "../../../../etc/passwd".into(),
        "user.../../x".into(),
        "extra.../../../etc/shadow".into(),
        "user.a/b/../../c".into(),
        "/etc/passwd".into(),
        "C:\\Windows\\system32".into(),
        "user.\u{0}nul".into(),
        "user.%2e%2e%2f".into(),
        "user.ünïcödé-名前-🍋".into(),
        "user.\u{202e}rtl".into(),
        "user.".into(),
        "".into(),
        " ".into(),
        "a".repeat(100_000),
        "user.x\r\nX-Injected: 1".into(),
        "user.$(reboot)".into(),
        "user.x;rm -rf /".into(),
    ]
}

fn bodies(names: &[String]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let raw = |s: &str| s.as_bytes().to_vec();
    for bad in
        ["", "{", "}", "[]", "null", "42", "\"x\"", "{\"model\":", "{'model': 'x'}", "\u{feff}{}", "{\"a\":1}{\"b\":2}"]
    {
        out.push((format!("malformed {bad:?}"), raw(bad)));
    }
    out.push(("invalid UTF-8".into(), vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}']));
    out.push(("deep nesting".into(), format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()));
    for (label, v) in [
        (
            "wrong types",
            json!({"model": 5, "model_name": [], "messages": "hi", "stream": "yes", "ctx_size": "big", "recipe": {}, "backend": 1, "level": false}),
        ),
        (
            "negative and huge numbers",
            json!({"model": "extra.m", "model_name": "extra.m", "max_tokens": -1, "ctx_size": -5, "n": 1e308, "gguf_n_ctx": 0}),
        ),
        (
            "unknown fields",
            json!({"model": "extra.m", "model_name": "extra.m", "messages": [{"role": "user", "content": "hi"}], "zzz": {"deep": [1, 2]}, "__proto__": 1}),
        ),
        ("messages of the wrong shape", json!({"model": "extra.m", "messages": [{"role": 1}, "x", null]})),
        (
            "dialect fields of the wrong kind",
            json!({"model": "extra.m", "messages": [{"role": "system", "content": [{"type": "tool_use"}]}],
                   "keep_alive": "soon", "format": 3, "think": "very", "max_tokens": 0, "tool_choice": {"type": "x"},
                   "thinking": {"type": "sometimes"}, "options": {"num_predict": "many"}, "images": [1]}),
        ),
        (
            "null everything",
            json!({"model": null, "model_name": null, "messages": null, "input": null, "recipe": null, "backend": null, "level": null}),
        ),
    ] {
        out.push((label.into(), v.to_string().into_bytes()));
    }
    for n in names {
        let v = json!({"model": n, "model_name": n, "messages": [{"role": "user", "content": "hi"}], "input": "x",
                       "query": "q", "documents": ["d"], "checkpoint": format!("{n}:Q4_0"), "recipe": "llamacpp",
                       "backend": n, "level": n, "alias": n, "target": n});
        out.push((format!("name {:?}", n.chars().take(30).collect::<String>()), v.to_string().into_bytes()));
    }
    for ckpt in [
        "../../etc:Q4_0",
        "/etc/passwd",
        "org/repo:../../x",
        "org/../../repo:Q4",
        "org/repo:Q4_0:extra",
        "https://evil.test/x:Q4",
        "org/repo\u{0}:Q4",
    ] {
        let v = json!({"model": "user.Evil", "checkpoint": ckpt, "recipe": "llamacpp"});
        out.push((format!("checkpoint {ckpt:?}"), v.to_string().into_bytes()));
    }
    for args in [
        "--port 1",
        "-m /etc/passwd",
        "--model=/etc/passwd",
        "--host 0.0.0.0",
        "-ngl 99",
        "--api-key x --port 2",
        "'unterminated",
        "$(reboot)",
        "; rm -rf /",
        "--rpc 1.2.3.4:1",
        "--embedding",
        "-np 100000 --ctx-size 1",
    ] {
        let v = json!({"model_name": "extra.m", "llamacpp_args": args});
        out.push((format!("llamacpp_args {args:?}"), v.to_string().into_bytes()));
    }
    // Device placement: unknown, malformed, repeated, huge, wrong types.
    let huge = "gpu0,".repeat(100_000);
    for device in [
        json!("gpu9"),
        json!("GPU0"),
        json!("gpu0,gpu0"),
        json!(""),
        json!(","),
        json!("../gpu0"),
        json!(huge),
        json!(7),
        json!(["gpu0"]),
        json!({"id": "gpu0"}),
    ] {
        let v = json!({"model_name": "extra.m", "device": device});
        let label: String = device.to_string().chars().take(40).collect();
        out.push((format!("device {label}"), v.to_string().into_bytes()));
    }
    // Spillover places: not a list, not remote models, too many, huge.
    for places in [
        json!("vllm.m"),
        json!([1]),
        json!(["no-dot"]),
        json!([".m"]),
        json!(["p."]),
        json!((0..9).map(|i| format!("p.m{i}")).collect::<Vec<_>>()),
        json!([format!("p.{}", "m".repeat(100_000))]),
    ] {
        let label: String = places.to_string().chars().take(40).collect();
        let v = json!({"model_name": "extra.m", "spillover": places});
        out.push((format!("spillover {label}"), v.to_string().into_bytes()));
    }
    // A remote provider's auth header and in-flight bound: header injection, bad names, wrong types.
    for (name, prefix, max) in [
        (json!("X-Key\r\nEvil: 1"), json!("Bearer "), json!(1)),
        (json!(""), json!(""), json!(1)),
        (json!("a b"), json!(""), json!(1)),
        (json!("api-key"), json!("Bearer \n"), json!(1)),
        (json!("api-key"), json!("x".repeat(100)), json!(1)),
        (json!(7), json!(null), json!(-1)),
        (json!("api-key"), json!(""), json!("many")),
    ] {
        let v = json!({"recipe": "cloud", "backend": "soakprov", "base_url": "http://127.0.0.1:9/v1",
                       "auth_header_name": name, "auth_header_prefix": prefix, "max_in_flight": max});
        let label: String = format!("{name} {prefix} {max}").chars().take(40).collect();
        out.push((format!("cloud auth header {label}"), v.to_string().into_bytes()));
    }
    for (recipe, backend) in
        [("../../x", "cpu"), ("llamacpp", "../../../tmp"), ("llamacpp", "cpu/../../x"), ("llamacpp", "")]
    {
        let v = json!({"recipe": recipe, "backend": backend});
        out.push((format!("install {recipe:?}:{backend:?}"), v.to_string().into_bytes()));
    }
    out
}

pub async fn run(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    let before = our_processes();
    let hub_root = tempfile::tempdir()?;
    let double = HubDouble::start(hub_root.path(), Knobs::default()).await;
    let s = fake_sandbox(&[("m", None, json!({})), ("e", Some(1), json!({}))]);
    let fake = fake_llama_server();
    let l = Lemonade::start_in(
        bin,
        s,
        &["--log-level", "info"],
        &[
            ("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()),
            ("HF_ENDPOINT", &double.url),
            ("LEMONADE_RELEASES_URL", &double.url),
        ],
    )
    .await;
    // First, while nothing is loaded or registered: forged headers must change nothing.
    forged_origins_and_hosts(&l, report).await;
    let names = odd_names();
    let bodies = bodies(&names);
    let (mut sent, mut bad) = (0usize, Vec::<String>::new());
    let check = |label: String, status: u16, text: &str, bad: &mut Vec<String>| {
        let json_error = serde_json::from_str::<Value>(text)
            .ok()
            .is_some_and(|v| v["error"]["message"].is_string() || v["error"].is_string());
        if status >= 500 || (status >= 400 && !json_error) || status == 0 {
            bad.push(format!("{label}: {status} {}", text.chars().take(200).collect::<String>()));
        }
    };
    for prefix in ["/api/v1", "/v1"] {
        for path in POSTS {
            for (label, body) in &bodies {
                let r = l.http.post(l.url(&format!("{prefix}{path}"))).body(body.clone());
                let (status, text) = send(r).await;
                sent += 1;
                check(format!("POST {prefix}{path} {label}"), status, &text, &mut bad);
            }
        }
    }
    for path in MULTIPART_POSTS {
        for (label, ct, body) in forms(&names) {
            let r = l.http.post(l.url(&format!("/api/v1{path}"))).header("content-type", ct).body(body);
            let (status, text) = exchange(r).await;
            sent += 1;
            check(format!("POST /api/v1{path} multipart {label}"), status, &text, &mut bad);
        }
    }
    for (label, body) in hostile_policies() {
        for (path, b) in [("/api/v1/routing/validate", body.clone()), ("/api/v1/pull", body["policy"].clone())] {
            let (status, text) = send(l.http.post(l.url(path)).json(&b)).await;
            sent += 1;
            check(format!("POST {path} {label}"), status, &text, &mut bad);
        }
    }
    let omni = json!({"model": "user.Soak-Omni", "recipe": "collection.omni", "components": ["extra.m"]});
    let (status, text) = send(l.http.post(l.url("/api/v1/pull")).json(&omni)).await;
    if status != 200 {
        bad.push(format!("registering user.Soak-Omni: {status} {text}"));
    }
    for (label, path, body) in hostile_omni() {
        let (status, text) = send(l.http.post(l.url(path)).json(&body)).await;
        sent += 1;
        check(format!("POST {path} {label}"), status, &text, &mut bad);
    }
    for (label, body) in &bodies {
        let requests = ROOT_POSTS
            .iter()
            .map(|p| (format!("POST {p}"), l.http.post(l.url(p))))
            .chain([("DELETE /api/delete".to_string(), l.http.delete(l.url("/api/delete")))]);
        for (route, r) in requests {
            let (status, text) = send(r.body(body.clone())).await;
            sent += 1;
            check(format!("{route} {label}"), status, &text, &mut bad);
        }
        let (status, text) = send(l.http.post(l.url("/api/create")).body(body.clone())).await;
        sent += 1;
        let ollama_error = serde_json::from_str::<Value>(&text).ok().is_some_and(|v| v["error"].is_string());
        if status != 501 || !ollama_error {
            bad.push(format!("POST /api/create {label}: {status} {text} (501 with an Ollama error required)"));
        }
    }
    // Names in paths, query strings and a body over the limit.
    for n in &names {
        let enc: String = form_encode(n);
        for path in [
            format!("/api/v1/models/{enc}"),
            format!("/api/v1/props?model={enc}"),
            format!("/metrics?model={enc}"),
            format!("/v1/admin/models/{enc}/load"),
            format!("/api/v1/models/{enc}/options"),
            format!("/v1/models/{enc}/options?post"),
            format!("/v1/models/{enc}/options?delete"),
            format!("/internal/aliases/{enc}?delete"),
        ] {
            if path.len() > 8000 {
                // Longer than a URL client will build: sent by hand. hyper answers a request
                // line this long itself (before lemonade's router), so only a 4xx and a server
                // still up are required.
                let status = raw_get(&l.base, &path).await;
                sent += 1;
                if !(400..500).contains(&status) {
                    bad.push(format!("GET <{} bytes of path>: {status}", path.len()));
                }
                continue;
            }
            let r = if path.ends_with("/load") || path.ends_with("?post") {
                l.http.post(l.url(&path)).json(&json!({"ctx_size": "big", "steps": -1}))
            } else if path.ends_with("?delete") {
                l.http.delete(l.url(&path))
            } else {
                l.http.get(l.url(&path))
            };
            let (status, text) = send(r).await;
            sent += 1;
            check(path.to_string(), status, &text, &mut bad);
        }
    }
    let huge = vec![b'x'; 65 << 20];
    let (status, text) = send(l.http.post(l.url("/api/v1/chat/completions")).body(huge)).await;
    sent += 1;
    if status != 413 {
        bad.push(format!("65 MiB body: {status} {text}"));
    }
    // The metrics still encode after every odd request (each counted under its route template).
    let (status, text) = send(l.http.get(l.url("/metrics"))).await;
    sent += 1;
    if status != 200 || !text.ends_with("# EOF\n") {
        bad.push(format!("GET /metrics after the corpus: {status} {}", text.chars().take(200).collect::<String>()));
    }
    let alive = test_support::alive(l.pid()) && l.get("/api/v1/health").await.0 == 200;
    let panicked = l.log().contains("panicked");
    report.add(
        "bad input",
        "hand-written corpus: every POST endpoint (Ollama, Anthropic, audio and images included) × malformed JSON, wrong types, unknown fields, odd names, traversal, flag injection; malformed and hostile multipart forms; hostile routing policies (deep nesting, catastrophic-backtracking and huge regexes on 1 MiB inputs, 5,000 rules, unknown conditions); hostile omni definitions and requests (1 MiB prompts and half-embedded media, 5,000 components, bad audio parts, other endpoints); names in paths; a 65 MiB body",
        sent,
        if alive && !panicked { sent - bad.len() } else { 0 },
        format!(
            "0 5xx required; server up afterwards {alive}, panics in its log {panicked}; retried after a closed connection: {:?}. Failures: {:?}",
            RETRIED.lock().map(|r| r.clone()).unwrap_or_default(),
            bad.iter().take(10).collect::<Vec<_>>()
        ),
    );
    schemathesis(&l, report).await;
    drop(l);
    let left = orphans_after(&before).await;
    if !left.is_empty() {
        report.add("bad input", "no process left after the bad-input run", 1, 0, format!("{left:?}"));
    }
    Ok(())
}

/// Forged `Origin` and `Host` headers on every POST endpoint with a body its handler would
/// accept: each must be a JSON 403 before routing, so no handler runs (nothing is loaded,
/// registered or installed afterwards).
async fn forged_origins_and_hosts(l: &Lemonade, report: &mut Report) {
    let port = l.base.rsplit(':').next().unwrap_or_default().to_string();
    let body = json!({
        "model": "extra.m", "model_name": "extra.m", "messages": [{"role": "user", "content": "hi"}],
        "prompt": "hi", "input": "hi", "query": "q", "documents": ["a"], "content": "hi",
        "checkpoint": "org/forged-GGUF:Q4_0", "recipe": "llamacpp", "backend": "cpu", "level": "trace"
    });
    let origins =
        ["http://evil.example", "null", "https://localhost.evil.example", "http://127.0.0.1.evil.example", "file://"];
    let hosts = ["attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "[2001:db8::1]"];
    let (mut sent, mut bad) = (0usize, Vec::<String>::new());
    for prefix in ["/api/v1", "/v1"] {
        for path in POSTS {
            let url = l.url(&format!("{prefix}{path}"));
            let mut forged: Vec<(&str, String)> = origins.iter().map(|o| ("origin", o.to_string())).collect();
            forged.extend(hosts.iter().map(|h| ("host", format!("{h}:{port}"))));
            for (header, value) in forged {
                let r = l
                    .http
                    .post(&url)
                    .header(header, &value)
                    .header("content-type", "text/plain")
                    .body(body.to_string());
                let (status, text) = send(r).await;
                sent += 1;
                let coded = serde_json::from_str::<Value>(&text).is_ok_and(|v| {
                    matches!(v["error"]["code"].as_str(), Some("origin_not_allowed" | "host_not_allowed"))
                });
                if status != 403 || !coded {
                    bad.push(format!(
                        "POST {prefix}{path} {header}: {value}: {status} {}",
                        text.chars().take(120).collect::<String>()
                    ));
                }
            }
        }
    }
    let (_, h) = l.get("/api/v1/health").await;
    let nothing_loaded = h["all_models_loaded"].as_array().is_some_and(|a| a.is_empty());
    let users = std::fs::read_to_string(l.sandbox.cache().join("user_models.json")).unwrap_or_default();
    let nothing_registered = !users.contains("forged");
    let nothing_installed = !l.sandbox.cache().join("bin/llamacpp").exists();
    let unchanged = nothing_loaded && nothing_registered && nothing_installed;
    report.add(
        "bad input",
        "forged Origin (foreign, null, look-alike) and Host (DNS rebinding) on every POST endpoint",
        sent,
        if unchanged { sent - bad.len() } else { 0 },
        format!(
            "403 before any handler required; nothing loaded {nothing_loaded}, registered {}, installed {}. Failures: {:?}",
            !nothing_registered,
            !nothing_installed,
            bad.iter().take(5).collect::<Vec<_>>()
        ),
    );
}

/// Sends a JSON request (30 s deadline): (status, body), or (0, the error) when no answer came.
async fn send(r: reqwest::RequestBuilder) -> (u16, String) {
    exchange(r.header("content-type", "application/json")).await
}

/// Sends a request (30 s deadline). A transport error that is not a timeout (a pooled
/// keep-alive connection found closed) is retried once on a fresh connection, and the answer
/// says so; a timeout is not retried, since a hang is what the corpus looks for. (0, the error
/// with its causes and the time taken) when no answer came.
async fn exchange(r: reqwest::RequestBuilder) -> (u16, String) {
    let again = r.try_clone();
    let start = std::time::Instant::now();
    match r.timeout(Duration::from_secs(30)).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => {
            let first = format!("{} after {} ms", chain(&e), start.elapsed().as_millis());
            match again {
                Some(again) if !e.is_timeout() => match again.timeout(Duration::from_secs(30)).send().await {
                    Ok(r) => {
                        if let Ok(mut retried) = RETRIED.lock() {
                            retried.push(format!("{} {}: {first}", r.url().path(), r.status()));
                        }
                        (r.status().as_u16(), r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, format!("{first}; retried: {}", chain(&e))),
                },
                _ => (0, first),
            }
        }
    }
}

/// The requests `exchange` retried, for the report.
static RETRIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// An error with its causes, outermost first.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// A GET written on a raw socket; the status code of the answer (0 when none).
async fn raw_get(base: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await else { return 0 };
    if s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .is_err()
    {
        return 0;
    }
    let mut buf = vec![0u8; 64];
    let n =
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.ok().and_then(Result::ok).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Property-based fuzzing from the OpenAPI document (schemathesis, installed by `cargo xtask
/// soak`): every operation, generated bodies and parameters, the `not_a_server_error` check.
async fn schemathesis(l: &Lemonade, report: &mut Report) {
    let Some(st) = std::env::var_os("LEMONADE_SCHEMATHESIS") else {
        let why = "LEMONADE_SCHEMATHESIS not set (cargo xtask soak installs schemathesis and sets it)";
        report.skip("bad input", "schemathesis (OpenAPI-driven fuzzing)", why, true);
        return;
    };
    let max = std::env::var("LEMONADE_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "40".into());
    let schema = l.url("/api/v1/openapi.json");
    // schemathesis keeps a crash cache in `.schemathesis/` of its working directory: a scratch
    // folder, not the checkout.
    let scratch = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            report.add("bad input", "schemathesis (OpenAPI-driven fuzzing)", 1, 0, format!("no scratch dir: {e}"));
            return;
        }
    };
    // It fuzzes `POST /params` too, and a memory budget of a few bytes is valid there; every
    // load after it is refused with lemonade's documented 507 `insufficient_memory`, which is
    // the right answer, not a server fault.
    // `/classify` gets no 502 allowance: the fake backend holds its answer to the JSON schema
    // (as llama-server does), so a 502 there would be lemonade's fault (repeated labels were
    // one: now a 400 naming `labels`).
    let config = "[checks.not_a_server_error]\nexpected-statuses = [\"2xx\", \"3xx\", \"4xx\", \"507\"]\n";
    if let Err(e) = std::fs::write(scratch.path().join("schemathesis.toml"), config) {
        report.add("bad input", "schemathesis (OpenAPI-driven fuzzing)", 1, 0, format!("no config: {e}"));
        return;
    }
    let out = tokio::process::Command::new(st)
        .current_dir(scratch.path())
        .args(["run", &schema, "--checks", "not_a_server_error", "--max-examples", &max, "--url", &l.base])
        .args(["--request-timeout", "30", "--workers", "2", "--phases", "examples,coverage,fuzzing"])
        // Ollama's create answers 501 by design (the corpus above checks that it always does);
        // `/internal/shutdown` stops the server under test by design (an e2e test covers it).
        // The scheduler's event stream never ends: every call would wait out the request timeout.
        .args([
            "--exclude-path",
            "/api/create",
            "--exclude-path",
            "/internal/shutdown",
            "--exclude-path",
            "/api/v1/scheduler/events",
        ])
        .env("SCHEMATHESIS_HOOKS", "")
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(420), out).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            report.add(
                "bad input",
                "schemathesis (OpenAPI-driven fuzzing)",
                1,
                0,
                format!("cannot run schemathesis: {e}"),
            );
            return;
        }
        Err(_) => {
            report.add("bad input", "schemathesis (OpenAPI-driven fuzzing)", 1, 0, "did not finish within 7 minutes");
            return;
        }
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::write(std::env::temp_dir().join("lemonade-schemathesis.txt"), &text).ok();
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("passed") || l.contains("failed") || l.contains("test cases") || l.contains("Test cases")
        })
        .collect();
    let cases =
        text.lines().find_map(|l| l.trim().strip_prefix("Test cases:").map(str::trim)).unwrap_or_default().to_string();
    let panicked = l.log().contains("panicked");
    // What the row judges is lemonade's answers: a 5xx is a schemathesis *failure*. Its own
    // internal errors while generating data (listed under ERRORS, such as a flaky strategy) are
    // no finding about lemonade: the row holds when every generated case passed and nothing
    // failed, and the note names the operations schemathesis could not generate for.
    let all_passed = text.lines().any(|l| {
        let t = l.trim();
        let mut n = t.split(", ");
        let generated = n.next().and_then(|g| g.strip_suffix(" generated")).and_then(|g| g.parse::<u64>().ok());
        let passed = n.next().and_then(|p| p.strip_suffix(" passed")).and_then(|p| p.parse::<u64>().ok());
        generated.is_some() && generated == passed
    });
    let failed = text.lines().any(|l| l.trim() == "Failures:") || text.contains("unique failures");
    let tool_errors = tool_errors(&text);
    let ok = !panicked && (out.status.success() || (all_passed && !failed));
    let errors_note = match tool_errors.is_empty() {
        true => String::new(),
        false => format!("; schemathesis's own errors (no request failed): {}", tool_errors.join(", ")),
    };
    report.add(
        "bad input",
        "schemathesis: every operation of /api/v1/openapi.json, generated requests, check not_a_server_error (507 insufficient_memory allowed: the fuzzer sets tiny memory budgets; no 502 allowed, /classify's included)",
        1,
        ok as usize,
        format!(
            "{cases}; exit {}; {}{errors_note}",
            out.status,
            summary.iter().rev().take(3).cloned().collect::<Vec<_>>().join(" / ")
        ),
    );
}

/// The operations schemathesis lists under ERRORS (its own failures to generate or run a
/// case, not lemonade's answers): the `____ METHOD /path ____` headings of that section.
fn tool_errors(text: &str) -> Vec<String> {
    let Some(start) = text.find("= ERRORS =") else { return Vec::new() };
    let section = &text[start..];
    let end = section.find("= SUMMARY =").unwrap_or(section.len());
    section[..end]
        .lines()
        .filter(|l| l.starts_with("___"))
        .map(|l| l.trim_matches(|c: char| c == '_' || c.is_whitespace()).to_string())
        .collect()
}
