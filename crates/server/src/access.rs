//! Access control in front of every route: the API key (`LEMONADE_API_KEY`) and CORS.
//!
//! * With a key, requests to `/api/…`, `/v0/…`, `/v1/…` and llama-server's routes at the root
//!   (`/completion`, `/props`, …) need `Authorization: Bearer <key>`, except `OPTIONS`, `/live`,
//!   the `health` endpoints (so a monitor needs no secret) and the OpenAPI document (for the
//!   Swagger UI at `/docs`). The answer otherwise is v9's 401 `{"error": "Invalid or missing
//!   API key"}`, before routing.
//! * CORS: every answer allows `*` (v9), or only the origins in `LEMONADE_ALLOWED_ORIGINS`
//!   (comma-separated; the matching origin is echoed with `Vary: Origin`). `OPTIONS` on any
//!   path is a 204 preflight answer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};

pub use crate::config::Access;

fn protected(path: &str) -> bool {
    let native = crate::routes::NATIVE_POST.iter().chain(&crate::routes::NATIVE_GET).any(|n| *n == path);
    let api = ["/api/", "/v0/", "/v1/"].iter().any(|p| path.starts_with(p)) || native;
    let public =
        crate::PREFIXES.iter().any(|p| path.strip_prefix(p) == Some("/health")) || path == "/api/v1/openapi.json";
    api && !public
}

/// Constant-time comparison, so the key cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn layer(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allow_origin = match (&access.allowed_origins, &origin) {
        (None, _) => Some(HeaderValue::from_static("*")),
        (Some(list), Some(o)) if o.to_str().is_ok_and(|o| list.iter().any(|a| a == o)) => Some(o.clone()),
        _ => None,
    };
    let mut resp = if req.method() == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else if let Some(key) = access.api_key.as_deref().filter(|_| protected(req.uri().path())) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            next.run(req).await
        } else {
            let body = Body::from(r#"{"error": "Invalid or missing API key"}"#);
            let mut r = (StatusCode::UNAUTHORIZED, body).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    if let Some(o) = allow_origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("Content-Type, Authorization"));
    }
    if access.allowed_origins.is_some() {
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_paths_need_the_key() {
        for p in [
            "/api/v1/models",
            "/v1/chat/completions",
            "/api/v0/pull",
            "/v0/x",
            "/api/v1/admin/models",
            "/api/tags",
            "/props",
        ] {
            assert!(protected(p), "{p}");
        }
        for p in [
            "/live",
            "/api/v1/health",
            "/v1/health",
            "/v0/health",
            "/api/v0/health",
            "/docs/",
            "/",
            "/api/v1/openapi.json",
        ] {
            assert!(!protected(p), "{p}");
        }
        assert!(protected("/api/v1/health/x"));
    }

    #[test]
    fn origins_parse() {
        assert_eq!(Access::origins_from(None), None);
        assert_eq!(Access::origins_from(Some(" * ")), None);
        assert_eq!(
            Access::origins_from(Some("http://a.test, https://b.test/")),
            Some(vec!["http://a.test".to_string(), "https://b.test".to_string()])
        );
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
