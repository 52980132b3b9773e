//! Safe by default against the browser (docs/SECURITY.md), through the real binary with the
//! fake backend: cross-origin simple requests, preflights, DNS rebinding (`Host`), bodies
//! without a content type, and the admin key.

use std::path::Path;

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::release;
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const EVIL: &str = "http://evil.example";
const DEV: &str = "http://localhost:5173";
const M: &str = "extra.m";

async fn server(env: &[(&str, &str)]) -> Lemonade {
    let s = fake_sandbox(&[("m", None, json!({}))]);
    let fake = fake_llama_server();
    let mut all = vec![("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())];
    all.extend_from_slice(env);
    Lemonade::start_in(bin(), s, &[], &all).await
}

/// A browser's "simple" cross-origin POST: `text/plain`, no preflight.
async fn simple_post(l: &Lemonade, origin: &str, path: &str, body: &Value) -> (u16, HeaderMap, String) {
    let r = l
        .http
        .post(l.url(path))
        .header("origin", origin)
        .header("content-type", "text/plain;charset=UTF-8")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.headers().clone(), r.text().await.unwrap())
}

fn loaded(h: &Value) -> usize {
    h["all_models_loaded"].as_array().map(Vec::len).unwrap_or(0)
}

fn user_models(l: &Lemonade) -> String {
    std::fs::read_to_string(l.sandbox.cache().join("user_models.json")).unwrap_or_default()
}

fn control_requests() -> Vec<(&'static str, Value)> {
    vec![
        ("/api/v1/load", json!({"model_name": M})),
        ("/api/v1/pull", json!({"model": "user.Evil", "checkpoint": "org/other-GGUF:Q4_0", "recipe": "llamacpp"})),
        ("/api/v1/delete", json!({"model": "user.Kept"})),
        ("/api/v1/install", json!({"recipe": "llamacpp", "backend": "cpu"})),
    ]
}

#[tokio::test]
async fn a_foreign_page_can_change_nothing_and_read_nothing() {
    // A Hub double with one small model, so pulls really download.
    let hub = tempfile::tempdir().unwrap();
    for (repo, file) in [("org/tiny-GGUF", "tiny-Q4_0.gguf"), ("org/other-GGUF", "other-Q4_0.gguf")] {
        std::fs::create_dir_all(hub.path().join(repo)).unwrap();
        let bytes: Vec<u8> = (0..64u32 << 10).map(|i| (i % 251) as u8).collect();
        std::fs::write(hub.path().join(repo).join(file), bytes).unwrap();
    }
    // The same double serves a llama.cpp release archive (holding the provisioned llama-server).
    release::write_archive(hub.path(), "b9999", 0);
    let double = HubDouble::start(hub.path(), Knobs::default()).await;
    let l = server(&[("HF_ENDPOINT", &double.url), ("LEMONADE_RELEASES_URL", &double.url)]).await;
    release::pin(&l.sandbox.cache(), "b9999", None);
    // A model pulled by a local tool (no Origin) that the page will try to delete.
    let kept = json!({"model": "user.Kept", "checkpoint": "org/tiny-GGUF:Q4_0", "recipe": "llamacpp"});
    let (s, v) = l.post("/api/v1/pull", &kept).await;
    assert_eq!(s, 200, "{v}");
    assert!(user_models(&l).contains("Kept"));
    let hf_repo = l.sandbox.hf_cache().join("models--org--tiny-GGUF");
    assert!(hf_repo.exists());

    for (path, body) in control_requests() {
        let (s, h, text) = simple_post(&l, EVIL, path, &body).await;
        assert_eq!(s, 403, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "origin_not_allowed", "{path}: {v}");
        assert!(h.get("access-control-allow-origin").is_none(), "{path}: the page may not read the answer");
    }
    assert_eq!(loaded(&l.get("/api/v1/health").await.1), 0, "nothing loaded");
    let users = user_models(&l);
    assert!(!users.contains("Evil") && users.contains("Kept"), "nothing registered or removed: {users}");
    assert!(hf_repo.exists(), "the downloaded files are still there");
    assert!(!l.sandbox.hf_cache().join("models--org--other-GGUF").exists(), "nothing downloaded");
    assert!(!l.sandbox.cache().join("bin/llamacpp").exists(), "nothing installed");
    // Reads too: the answer is a 403, never the data.
    let r = l.http.get(l.url("/api/v1/models")).header("origin", EVIL).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // `null` (sandboxed frames, file:// pages) is refused unless listed.
    let (s, _, _) = simple_post(&l, "null", "/api/v1/load", &json!({"model_name": M})).await;
    assert_eq!(s, 403);
    // A preflight from that origin is refused.
    let r = l
        .http
        .request(reqwest::Method::OPTIONS, l.url("/api/v1/load"))
        .header("origin", EVIL)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());

    // The same requests from a local dev server's origin reach their handlers, origin echoed.
    let r = l
        .http
        .request(reqwest::Method::OPTIONS, l.url("/api/v1/load"))
        .header("origin", DEV)
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], DEV);
    // Loaded, pulled, deleted, installed.
    let expected = [200, 200, 200, 200];
    for ((path, body), want) in control_requests().into_iter().zip(expected) {
        let (s, h, text) = simple_post(&l, DEV, path, &body).await;
        assert_eq!(s, want, "{path}: {text}");
        assert_eq!(h["access-control-allow-origin"], DEV, "{path}");
        assert_eq!(h["vary"], "Origin", "{path}");
    }
    assert_eq!(loaded(&l.get("/api/v1/health").await.1), 1, "the allowed origin loaded the model");
    let users = user_models(&l);
    assert!(users.contains("Evil") && !users.contains("Kept"), "the allowed origin pulled and deleted: {users}");
    assert_eq!(l.get("/api/v1/models/user.Evil").await.1["downloaded"], true);
    let installed = std::fs::read_to_string(l.sandbox.cache().join("bin/llamacpp/cpu/version.txt")).unwrap();
    assert_eq!(installed.trim(), "b9999", "the allowed origin installed the backend");
}

#[tokio::test]
async fn dns_rebinding_is_refused_unless_the_host_is_listed() {
    let l = server(&[]).await;
    let port = l.base.rsplit(':').next().unwrap().to_string();
    let attacker = format!("attacker.example:{port}");
    let get = |host: String| {
        let r = l.http.get(l.url("/api/v1/models")).header("host", host);
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (s, text) = get(attacker.clone()).await;
    assert_eq!(s, 403, "{text}");
    assert!(text.contains("host_not_allowed"), "{text}");
    let (s, _, _) = {
        let r = l
            .http
            .post(l.url("/api/v1/load"))
            .header("host", attacker.clone())
            .body(json!({"model_name": M}).to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), (), ())
    };
    assert_eq!(s, 403);
    assert_eq!(loaded(&l.get("/api/v1/health").await.1), 0);
    for ok in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("lemonade.localhost:{port}")] {
        assert_eq!(get(ok.clone()).await.0, 200, "{ok}");
    }
    drop(l);
    let l = server(&[("LEMONADE_ALLOWED_HOSTS", "attacker.example")]).await;
    let port = l.base.rsplit(':').next().unwrap().to_string();
    let r =
        l.http.get(l.url("/api/v1/models")).header("host", format!("attacker.example:{port}")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "listed hosts are served");
}

#[tokio::test]
async fn curl_without_a_content_type_still_works() {
    let l = server(&[]).await;
    // `curl -d` sends `application/x-www-form-urlencoded` and no Origin: the README's examples.
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--noproxy", "*"])
        .arg(l.url("/api/v1/chat/completions"))
        .arg("-d")
        .arg(json!({"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string())
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "200", "{body}");
    let v: Value = serde_json::from_str(body).unwrap();
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    // And with no content type at all.
    let r = l.http.post(l.url("/api/v1/load")).body(json!({"model_name": M}).to_string()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

const ADMIN: &str = "adm1n-key";
const API: &str = "api-key-4e1b";

/// Every control endpoint under one prefix, with a body its handler accepts or rejects
/// without side effects on this sandbox, and what the handler answers it once past access
/// control.
fn admin_requests() -> Vec<(&'static str, Value)> {
    admin_answers().into_iter().map(|(p, b, _)| (p, b)).collect()
}

fn admin_answers() -> Vec<(&'static str, Value, u16)> {
    vec![
        ("/api/v1/load", json!({"model_name": M}), 200),
        ("/api/v1/unload", json!({}), 200),
        ("/v1/pull", json!({"model": "nope"}), 400),
        ("/v1/delete", json!({"model": "nope"}), 422),
        ("/api/v0/install", json!({}), 400),
        ("/api/v0/uninstall", json!({}), 400),
        ("/v0/log-level", json!({"level": "info"}), 200),
        ("/v1/admin/models/extra.m/load", json!({}), 200),
        ("/v1/admin/models/extra.m/unload", json!({}), 200),
        ("/v1/models/extra.m/options", json!({"ctx_size": 2048, "dry_run": true}), 200),
        ("/internal/aliases", json!({"alias": "a1", "target": M}), 200),
        ("/internal/set", json!({"swap_hold_ms": 2000}), 200),
        ("/api/v0/models/register", json!({"model_name": "user.R"}), 400),
        ("/v1/downloads/control", json!({"id": "model:nope", "action": "pause"}), 404),
        ("/v1/cloud/auth", json!({"provider": "nope", "api_key": "x"}), 404),
        ("/internal/telemetry/flush", json!({}), 200),
        ("/internal/cleanup-cache", json!({"dry_run": true}), 200),
    ]
}

async fn post_key(l: &Lemonade, path: &str, body: &Value, key: Option<&str>) -> (u16, String) {
    let mut r = l.http.post(l.url(path)).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn the_admin_key_guards_control_endpoints_and_not_inference() {
    let chat = json!({"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    // Only the admin key: inference and reads stay open.
    let l = server(&[("LEMONADE_ADMIN_API_KEY", ADMIN)]).await;
    for (path, body, answer) in admin_answers() {
        let (s, text) = post_key(&l, path, &body, None).await;
        assert_eq!(s, 401, "{path}: {text}");
        let (s, text) = post_key(&l, path, &body, Some("wrong")).await;
        assert_eq!(s, 401, "{path}: {text}");
        // Past access control: the handler's own answer, exactly.
        let (s, text) = post_key(&l, path, &body, Some(ADMIN)).await;
        assert_eq!(s, answer, "{path} with the admin key: {text}");
    }
    let (s, text) = post_key(&l, "/api/v1/chat/completions", &chat, None).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(l.get("/api/v1/models").await.0, 200);
    // The CLI sends the admin key from its environment.
    let (code, _, err) = l.cli(&["load", M]).await;
    assert_eq!(code, 1, "{err}");
    let (code, out, err) = l.cli_env(&["load", M], &[("LEMONADE_ADMIN_API_KEY", ADMIN)]).await;
    assert_eq!(code, 0, "{out}{err}");
    drop(l);

    // Both keys: the API key serves inference but not the control endpoints.
    let l = server(&[("LEMONADE_ADMIN_API_KEY", ADMIN), ("LEMONADE_API_KEY", API)]).await;
    for (path, body) in admin_requests() {
        let (s, text) = post_key(&l, path, &body, Some(API)).await;
        assert_eq!(s, 403, "{path}: {text}");
        assert!(text.contains("admin_key_required"), "{text}");
    }
    for key in [API, ADMIN] {
        let (s, text) = post_key(&l, "/api/v1/chat/completions", &chat, Some(key)).await;
        assert_eq!(s, 200, "{key}: {text}");
    }
    assert_eq!(post_key(&l, "/api/v1/chat/completions", &chat, None).await.0, 401);
    assert_eq!(l.get("/api/v1/health").await.0, 200, "health stays public");
}

#[tokio::test]
async fn allowed_origins_star_restores_allow_all() {
    let l = server(&[("LEMONADE_ALLOWED_ORIGINS", "*")]).await;
    assert!(l.log().contains("LEMONADE_ALLOWED_ORIGINS=* with no API key"), "{}", l.log());
    let (s, h, text) = simple_post(&l, EVIL, "/api/v1/load", &json!({"model_name": M})).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(h["access-control-allow-origin"], "*");
    drop(l);
    // A listed origin is echoed; others stay refused.
    let l = server(&[("LEMONADE_ALLOWED_ORIGINS", "https://ui.example")]).await;
    let mut h = HeaderMap::new();
    h.insert("origin", HeaderValue::from_static("https://ui.example"));
    let r = l.http.get(l.url("/api/v1/models")).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://ui.example");
    let (s, _, _) = simple_post(&l, EVIL, "/api/v1/load", &json!({"model_name": M})).await;
    assert_eq!(s, 403);
}
