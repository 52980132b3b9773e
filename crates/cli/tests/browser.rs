//! A real headless Chromium against lemonade (docs/SECURITY.md): a page on another origin
//! (`http://evil.example:<port>`, resolved to a second local port by Chromium's host resolver
//! rules) `fetch`es every control endpoint; the browser must be unable to read any answer and
//! the server must change nothing. A page on a loopback origin reads its answers, lemonade's own
//! pages (the web UI and Swagger UI) keep working, and a rebound name pointing at lemonade is
//! refused.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// Serves `html` for every request on 127.0.0.1 (a second local origin); returns its port.
async fn page_server(html: String) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let html = html.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

/// A page that runs `calls` (method, path, body, content type) against `api` and writes one
/// line per call into `<pre id="out">`: `read <status> <body>` when the page could read the
/// answer, `blocked <error>` when the browser refused it.
fn page(api: &str, calls: &[(&str, &str, Option<serde_json::Value>, &str)]) -> String {
    let calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(m, p, b, ct)| json!({"method": m, "url": format!("{api}{p}"), "body": b.as_ref().map(|b| b.to_string()), "ct": ct}))
        .collect();
    format!(
        r#"<!doctype html><html><body><pre id="out"></pre><script>
const calls = {calls};
(async () => {{
  const out = [];
  for (const c of calls) {{
    try {{
      const init = {{ method: c.method }};
      if (c.body !== null) {{ init.body = c.body; init.headers = {{ "Content-Type": c.ct }}; }}
      const r = await fetch(c.url, init);
      out.push("read " + r.status + " " + (await r.text()).slice(0, 80));
    }} catch (e) {{
      out.push("blocked " + e.name);
    }}
  }}
  document.getElementById("out").textContent = out.join("\n");
  document.title = "done";
}})();
</script></body></html>"#,
        calls = serde_json::Value::Array(calls)
    )
}

/// Loads `url` in headless Chromium and returns the DOM once the page settled.
async fn chromium_dom(url: &str) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(chromium())
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-proxy-server",
                "--disable-background-networking",
                "--host-resolver-rules=MAP evil.example 127.0.0.1",
                "--virtual-time-budget=15000",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium finished within 90 s")
    .expect("chromium runs");
    (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// Loads `url` in headless Chromium and returns the lines the page wrote.
async fn run_chromium(url: &str) -> Vec<String> {
    let (dom, err) = chromium_dom(url).await;
    assert!(dom.contains("<title>done</title>"), "the page did not finish: {dom}\n{err}");
    let pre = dom.split("<pre id=\"out\">").nth(1).and_then(|s| s.split("</pre>").next()).unwrap_or_default();
    pre.lines().map(|l| l.replace("&quot;", "\"")).collect()
}

#[tokio::test]
async fn a_page_on_another_origin_can_read_nothing_and_change_nothing() {
    let s = fake_sandbox(&[("m", None, json!({}))]);
    let fake = fake_llama_server();
    let l = Lemonade::start_in(bin(), s, &[], &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())]).await;
    let api = l.base.clone();
    let plain = "text/plain";
    let json_ct = "application/json";
    let calls = [
        ("POST", "/api/v1/load", Some(json!({"model_name": "extra.m"})), plain),
        (
            "POST",
            "/api/v1/pull",
            Some(json!({"model": "user.Evil", "checkpoint": "org/evil-GGUF:Q4_0", "recipe": "llamacpp"})),
            plain,
        ),
        ("POST", "/api/v1/delete", Some(json!({"model": "extra.m"})), plain),
        ("POST", "/api/v1/install", Some(json!({"recipe": "llamacpp", "backend": "cpu"})), plain),
        ("POST", "/api/v1/load", Some(json!({"model_name": "extra.m"})), json_ct),
        ("POST", "/api/v1/chat/completions", Some(json!({"model": "extra.m", "messages": []})), plain),
        ("GET", "/api/v1/models", None, plain),
        ("GET", "/api/v1/system-info", None, plain),
    ];
    let evil_port = page_server(page(&api, &calls)).await;
    let lines = run_chromium(&format!("http://evil.example:{evil_port}/")).await;
    assert_eq!(lines.len(), calls.len(), "{lines:?}");
    for (line, call) in lines.iter().zip(&calls) {
        assert!(line.starts_with("blocked"), "{} {} was readable from another origin: {line}", call.0, call.1);
    }
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]), "nothing loaded");
    let users = std::fs::read_to_string(l.sandbox.cache().join("user_models.json")).unwrap_or_default();
    assert!(!users.contains("Evil"), "nothing registered: {users}");
    assert!(!l.sandbox.cache().join("bin/llamacpp").exists(), "nothing installed");
    assert_eq!(l.get("/api/v1/models/extra.m").await.0, 200, "nothing removed");

    // A page on a loopback origin (a local dev server) reads its answers and can load.
    let good = [
        ("GET", "/api/v1/health", None, plain),
        ("POST", "/api/v1/load", Some(json!({"model_name": "extra.m"})), json_ct),
    ];
    let good_port = page_server(page(&api, &good)).await;
    let lines = run_chromium(&format!("http://localhost:{good_port}/")).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("read 200 {\"status\":\"ok\""), "{}", lines[0]);
    assert!(lines[1].starts_with("read 200"), "{}", lines[1]);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"][0]["model_name"], "extra.m");
    assert_eq!(h["all_models_loaded"][0]["id"], "m", "the id the listings show");

    // lemonade's own pages: Swagger UI loads the API document from its own origin and renders
    // every operation; the web UI renders its chat view with the model list from the API.
    let (dom, err) = chromium_dom(&format!("{api}/docs/")).await;
    assert!(dom.contains("opblock") && dom.contains("/api/v1/chat/completions"), "Swagger UI did not render: {err}");
    let (dom, err) = chromium_dom(&format!("{api}/")).await;
    assert!(dom.contains(r#"data-ready="true""#) && dom.contains(">m<"), "the web UI did not render: {dom}\n{err}");

    // DNS rebinding in a real browser: `evil.example` resolving to lemonade's own address
    // makes the browser treat it as same-origin; the Host check refuses the page itself.
    let port = api.rsplit(':').next().unwrap();
    let (dom, _) = chromium_dom(&format!("http://evil.example:{port}/docs/")).await;
    assert!(dom.contains("host_not_allowed") && !dom.contains("opblock"), "{dom}");
    let (dom, _) = chromium_dom(&format!("http://evil.example:{port}/")).await;
    assert!(dom.contains("host_not_allowed") && !dom.contains("app.js"), "{dom}");
}
