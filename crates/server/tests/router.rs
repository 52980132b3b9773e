//! Router behaviour that needs no backend: status codes and JSON bodies of errors, the
//! OpenAPI document and Swagger UI.

use axum::body::Body;
use http::{Request, StatusCode};
use lemonade_server::{app, AppState, Config, Engine, Http};
use serde_json::Value;
use tower::ServiceExt;

fn router() -> (tempfile::TempDir, axum::Router) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = Config::new(tmp.path().join("cache"), tmp.path().join("hub"));
    let engine = Engine::start(cfg).unwrap();
    (tmp, app(AppState::new(engine, Http::default())))
}

async fn call(method: &str, uri: &str, body: &str) -> (StatusCode, String, Value) {
    let (_tmp, r) = router();
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = r.oneshot(req).await.unwrap();
    let status = resp.status();
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, ct, v)
}

#[tokio::test]
async fn every_prefix_serves_the_api() {
    for prefix in ["/api/v0", "/api/v1", "/v0", "/v1"] {
        let (s, _, v) = call("GET", &format!("{prefix}/health"), "").await;
        assert_eq!(s, StatusCode::OK, "{prefix}");
        assert_eq!(v["status"], "ok");
        assert_eq!(v["max_models"]["embedding"], 1);
    }
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods_are_json() {
    let (s, ct, v) = call("GET", "/api/v1/nope", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(ct.starts_with("application/json"));
    assert_eq!(v["error"]["path"], "/api/v1/nope");
    for (m, uri, allowed) in [
        ("GET", "/v1/embeddings", "POST"),
        ("DELETE", "/v1/models", "GET"),
        ("PUT", "/tokenize", "POST"),
        ("POST", "/live", "GET"),
    ] {
        let (s, ct, v) = call(m, uri, "").await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{m} {uri}");
        assert!(ct.starts_with("application/json"));
        assert_eq!(v["error"]["message"], format!("Method Not Allowed. Use {allowed} for this endpoint"));
    }
}

#[tokio::test]
async fn bad_bodies_name_the_field() {
    let (s, _, v) = call("POST", "/v1/embeddings", r#"{"model": "m"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "input");
    let (s, _, v) = call("POST", "/v1/reranking", r#"{"model": "m", "query": "q", "documents": "d"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "documents");
    let (s, _, v) = call("POST", "/v1/embeddings", r#"{"model": "m", "input": "x", "encoding_format": "hex"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "encoding_format");
    let (s, _, v) = call("POST", "/tokenize", r#"{"content": "x"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "model");
    let (s, _, v) = call("POST", "/v1/chat/completions", "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"]["message"].as_str().unwrap().contains("empty"));
}

#[tokio::test]
async fn openapi_and_swagger_ui_are_served() {
    let (s, _, v) = call("GET", "/api/v1/openapi.json", "").await;
    assert_eq!(s, StatusCode::OK);
    let expected: Value = serde_json::from_str(&lemonade_server::openapi::document_json()).unwrap();
    assert_eq!(v, expected);
    let (s, ct, body) = call("GET", "/docs/", "").await;
    assert_eq!(s, StatusCode::OK);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(body.as_str().unwrap().contains("swagger"), "Swagger UI page");
}

#[tokio::test]
async fn an_oversized_body_is_a_json_413_that_closes_the_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = Config::new(tmp.path().join("cache"), tmp.path().join("hub"));
    let http = Http { body_limit: 1024, ..Http::default() };
    let r = app(AppState::new(Engine::start(cfg).unwrap(), http));
    let body = format!("{{\"model\":\"m\",\"messages\":[],\"pad\":\"{}\"}}", "x".repeat(4096));
    let req = Request::builder().method("POST").uri("/v1/chat/completions").body(Body::from(body)).unwrap();
    let resp = r.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.headers().get("connection").map(|v| v.to_str().unwrap()), Some("close"));
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
}

/// GET `uri` with `headers`; returns (status, response headers, body bytes).
async fn get_with(method: &str, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, http::HeaderMap, Vec<u8>) {
    let (_tmp, r) = router();
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = r.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let (status, h) = (resp.status(), resp.headers().clone());
    (status, h, axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec())
}

const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

#[tokio::test]
async fn get_root_is_the_page_for_browsers_and_json_for_api_clients_and_api_404s_stay_json() {
    // A browser, curl's */*, and no Accept at all get the page with its policy.
    for accept in [Some(BROWSER), Some("*/*"), None] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let (s, h, body) = get_with("GET", "/", &headers).await;
        assert_eq!(s, StatusCode::OK, "{accept:?}");
        assert!(h["content-type"].to_str().unwrap().starts_with("text/html"), "{accept:?}");
        assert!(String::from_utf8_lossy(&body).contains(r#"<script type="module" src="/ui/app.js">"#));
        let csp = h["content-security-policy"].to_str().unwrap();
        for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
            assert!(csp.contains(part), "{csp}");
        }
        assert_eq!(h["referrer-policy"], "no-referrer");
    }
    // An API client asking for JSON gets /live's answer.
    let (s, h, body) = get_with("GET", "/", &[("accept", "application/json")]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(h["content-type"].to_str().unwrap().starts_with("application/json"));
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), serde_json::json!({"status": "ok"}));
    assert_eq!(get_with("POST", "/", &[]).await.0, StatusCode::METHOD_NOT_ALLOWED);
    // The SPA fallback: a browser's navigation to a UI path gets the page…
    for path in ["/models", "/logs", "/chat/some-id", "/system.html"] {
        let (s, h, _) = get_with("GET", path, &[("accept", BROWSER)]).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert!(h["content-type"].to_str().unwrap().starts_with("text/html"), "{path}");
    }
    // …and everything else keeps the API's JSON 404.
    for (path, accept) in [
        ("/models", "*/*"),
        ("/api/v1/nope", BROWSER),
        ("/v1/nope", BROWSER),
        ("/favicon.ico", BROWSER),
        ("/ui/nope.js", BROWSER),
        ("/live/x", BROWSER),
    ] {
        let (s, h, body) = get_with("GET", path, &[("accept", accept)]).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path} {accept}");
        assert!(h["content-type"].to_str().unwrap().starts_with("application/json"), "{path}");
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["error"]["path"], path);
    }
}

#[tokio::test]
async fn ui_files_are_gzipped_with_an_etag_and_revalidate_to_304() {
    let (s, h, gz) = get_with("GET", "/ui/app.js", &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["content-encoding"], "gzip");
    assert!(h["content-type"].to_str().unwrap().starts_with("text/javascript"));
    assert_eq!(h["cache-control"], "no-cache");
    let mut plain = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain).unwrap();
    assert!(plain.contains("function show("), "the gzipped body is app.js");
    let etag = h["etag"].to_str().unwrap().to_string();
    let (s, h2, body) = get_with("GET", "/ui/app.js", &[]).await;
    assert_eq!((s, h2.get("content-encoding")), (StatusCode::OK, None), "no gzip unless asked");
    assert_eq!(String::from_utf8(body).unwrap(), plain);
    let (s, _, body) = get_with("GET", "/ui/app.js", &[("if-none-match", &etag)]).await;
    assert_eq!((s, body.len()), (StatusCode::NOT_MODIFIED, 0));
    let (s, _, _) = get_with("GET", "/ui/app.js", &[("if-none-match", "\"other\"")]).await;
    assert_eq!(s, StatusCode::OK);
}
