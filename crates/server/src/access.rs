//! Access control in front of every route, before routing: the Host and Origin checks against
//! DNS rebinding and cross-site requests, the API keys, and CORS. docs/SECURITY.md gives the
//! threat model; the rules:
//!
//! * **Host.** On a loopback bind only loopback names and addresses (`localhost`,
//!   `*.localhost`, `127.0.0.0/8`, `[::1]`) and the names in `LEMONADE_ALLOWED_HOSTS` are
//!   served; beyond loopback also `--host` and any IP address (a rebinding attack needs a
//!   name). Anything else: 403 `host_not_allowed`.
//! * **Origin.** A request without `Origin` (curl, SDKs, the CLI) passes. A browser origin
//!   passes when it is loopback (`http(s)://localhost`, `127.0.0.1`, `[::1]`, `*.localhost`,
//!   any port), the server's own (`http(s)://<Host>`), a desktop-app scheme (`app://`,
//!   `tauri://`, `vscode-webview://`, `vscode-file://`), or listed in
//!   `LEMONADE_ALLOWED_ORIGINS` (`*`: every origin). Anything else, `null` included, is a
//!   403 `origin_not_allowed` for every method: simple requests (a `text/plain` POST needs no
//!   preflight) never reach a handler. CORS headers echo the allowed origin (`*` only in
//!   allow-all mode), with `Vary: Origin`.
//! * **Keys.** `LEMONADE_ADMIN_API_KEY` guards the endpoints that change what is on the
//!   machine or how it runs ([`admin_path`]); `LEMONADE_API_KEY` the others under the API
//!   prefixes and llama-server's routes, except `/live`, `health` and the OpenAPI document. The
//!   admin key is accepted wherever the API key is; with only the API key set, it guards
//!   everything (Lemonade v11). A missing or wrong key is v9's 401 `{"error": "Invalid or
//!   missing API key"}`; the API key on an admin endpoint is a 403.

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};

pub use crate::state::{host_name, Access, Origins};

/// Schemes of desktop apps that embed a web view (as Lemonade allows them).
const APP_SCHEMES: [&str; 4] = ["app", "tauri", "vscode-webview", "vscode-file"];

/// `localhost`, `*.localhost`, or a loopback address.
pub fn is_loopback_name(name: &str) -> bool {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    n == "localhost" || n.ends_with(".localhost") || n.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request with this `Host` header may be served.
pub fn host_allowed(a: &Access, host: Option<&str>) -> bool {
    let Some(host) = host else { return true }; // HTTP/1.0: no Host, and no browser sends none
    let name = host_name(host).to_ascii_lowercase();
    let name = name.trim_end_matches('.');
    if is_loopback_name(name) || a.allowed_hosts.iter().any(|h| h == "*" || h == name) {
        return true;
    }
    !a.loopback_only && (name.parse::<IpAddr>().is_ok() || name == host_name(&a.listen_host).to_ascii_lowercase())
}

/// Whether a browser `origin` may use the API, given the request's `Host`.
pub fn origin_allowed(a: &Access, origin: &str, host: Option<&str>) -> bool {
    let listed = match &a.allowed_origins {
        Origins::Any => return true,
        Origins::List(l) => l.iter().any(|o| o == origin),
    };
    if listed {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else { return false }; // `null` and junk
    if APP_SCHEMES.contains(&scheme) {
        return true;
    }
    if scheme != "http" && scheme != "https" {
        return false;
    }
    // The server's own origin: a page it served itself (behind a TLS proxy, https).
    is_loopback_name(host_name(rest)) || host.is_some_and(|h| rest.eq_ignore_ascii_case(h))
}

fn protected(path: &str) -> bool {
    let native = crate::routes::NATIVE_POST.iter().chain(&crate::routes::NATIVE_GET).any(|n| *n == path);
    let api = ["/api/", "/v0/", "/v1/", "/internal/"].iter().any(|p| path.starts_with(p))
        || native
        || path == "/logs/stream"
        || path == "/mcp";
    let public = crate::routes::PREFIXES.iter().any(|p| path.strip_prefix(p) == Some("/health"))
        || path == "/api/v1/openapi.json";
    api && !public
}

/// The endpoints that change what is on the machine or how it runs: pull, delete, install (and
/// Ollama's pull, delete and create),
/// uninstall, load, unload, log-level, the admin API's load and unload, saving or erasing a
/// model's options, emptying the prompt cache, and everything under `/internal/` (Lemonade
/// v11's management endpoints, reads included, as v11 guards them).
pub fn admin_path(method: &Method, path: &str) -> bool {
    if path.starts_with("/internal/") {
        return true;
    }
    // Ollama's pull, delete and create change what is on the machine as v1's do.
    if matches!((method.as_str(), path), ("POST", "/api/pull") | ("DELETE", "/api/delete") | ("POST", "/api/create")) {
        return true;
    }
    let Some(rest) = crate::routes::PREFIXES.iter().find_map(|p| path.strip_prefix(p)) else { return false };
    const CONTROL: [&str; 9] = [
        "/pull",
        "/delete",
        "/install",
        "/uninstall",
        "/load",
        "/unload",
        "/log-level",
        "/downloads/control",
        "/cloud/auth",
    ];
    let admin_mutation = rest.starts_with("/admin/models/") && (rest.ends_with("/load") || rest.ends_with("/unload"));
    let options = rest.starts_with("/models/") && rest.ends_with("/options") || rest == "/models/register";
    (*method == Method::POST && (CONTROL.contains(&rest) || admin_mutation))
        || (*method == Method::DELETE && rest == "/prompt-cache")
        || ((*method == Method::POST || *method == Method::DELETE) && options)
        || (*method == Method::DELETE && rest.starts_with("/cloud/auth/"))
}

/// Constant-time comparison, so a key cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a request is refused before routing, if it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Host(String),
    Origin(String),
    /// No key, or a wrong one (401).
    Key,
    /// The API key on an admin endpoint (403).
    AdminKey,
}

/// The access decision for one request (pure: headers in, decision out).
pub fn check(a: &Access, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());
    let host = text(header::HOST);
    if !host_allowed(a, host) {
        return Err(Refusal::Host(host.unwrap_or_default().to_string()));
    }
    if let Some(o) = headers.get(header::ORIGIN) {
        let o = o.to_str().unwrap_or("");
        if !origin_allowed(a, o, host) {
            return Err(Refusal::Origin(o.to_string()));
        }
    }
    if *method == Method::OPTIONS || !protected(path) {
        return Ok(());
    }
    let given = text(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let is = |key: Option<&str>| key.zip(given).is_some_and(|(k, g)| same(k.as_bytes(), g.as_bytes()));
    let admin = a.effective_admin_key();
    if admin_path(method, path) {
        return match admin {
            None => Ok(()),
            Some(_) if is(admin) => Ok(()),
            Some(_) if is(a.api_key.as_deref()) => Err(Refusal::AdminKey),
            Some(_) => Err(Refusal::Key),
        };
    }
    match a.api_key.as_deref() {
        None => Ok(()),
        Some(_) if is(a.api_key.as_deref()) || is(admin) => Ok(()),
        Some(_) => Err(Refusal::Key),
    }
}

fn refusal(r: &Refusal) -> Response {
    let forbidden = |code: &str, message: String| {
        let e = api_types::ErrorResponse::new("forbidden", message).code(code);
        (StatusCode::FORBIDDEN, serde_json::to_string(&e).unwrap_or_default())
    };
    let (status, body) = match r {
        Refusal::Key => (StatusCode::UNAUTHORIZED, r#"{"error": "Invalid or missing API key"}"#.to_string()),
        Refusal::AdminKey => forbidden(
            "admin_key_required",
            "This endpoint changes the server: it needs LEMONADE_ADMIN_API_KEY, not the API key".into(),
        ),
        Refusal::Host(h) => forbidden(
            "host_not_allowed",
            format!("Host '{}' is not served here; add it to LEMONADE_ALLOWED_HOSTS to allow it", h.escape_debug()),
        ),
        Refusal::Origin(o) => forbidden(
            "origin_not_allowed",
            format!(
                "Origin '{}' may not use this server; add it to LEMONADE_ALLOWED_ORIGINS to allow it",
                o.escape_debug()
            ),
        ),
    };
    let mut resp = (status, Body::from(body)).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if *r == Refusal::Key {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

pub async fn layer(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let mut resp = match check(&access, req.method(), req.uri().path(), req.headers()) {
        Err(r) => return with_vary(refusal(&r)),
        Ok(()) if req.method() == Method::OPTIONS => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => next.run(req).await,
    };
    if let Some(o) = origin {
        let allow = if access.allowed_origins == Origins::Any { HeaderValue::from_static("*") } else { o };
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Content-Type, Authorization, X-Lemonade-Priority"),
        );
    }
    with_vary(resp)
}

fn with_vary(mut resp: Response) -> Response {
    resp.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> Access {
        Access { loopback_only: true, listen_host: "127.0.0.1".into(), ..Access::default() }
    }

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
        for p in [
            "/api/v1/pull",
            "/v1/load",
            "/v0/unload",
            "/api/v0/install",
            "/v1/admin/models/x.gguf/load",
            "/api/v1/models/user.x/options",
            "/api/v1/log-level",
        ] {
            assert!(admin_path(&Method::POST, p), "{p}");
        }
        for p in ["/api/v1/chat/completions", "/v1/admin/models", "/api/v1/models", "/api/v1/health"] {
            assert!(!admin_path(&Method::POST, p) && !admin_path(&Method::GET, p), "{p}");
        }
        assert!(admin_path(&Method::DELETE, "/v1/models/user.x/options"), "erasing options needs the admin key");
        assert!(
            admin_path(&Method::GET, "/internal/aliases") && protected("/internal/aliases"),
            "v11 guards reads too"
        );
        assert!(!admin_path(&Method::GET, "/v1/models/user.x/options"), "reading them does not");
    }

    #[test]
    fn hosts_on_a_loopback_bind_and_beyond() {
        let mut a = access();
        for ok in [
            None,
            Some("localhost:8000"),
            Some("127.0.0.1"),
            Some("127.1.2.3:80"),
            Some("[::1]:8000"),
            Some("app.localhost:9"),
        ] {
            assert!(host_allowed(&a, ok), "{ok:?}");
        }
        for bad in ["attacker.example:8000", "192.168.1.5:8000", "localhost.attacker.example", "[2001:db8::1]:8000"] {
            assert!(!host_allowed(&a, Some(bad)), "{bad}");
        }
        a.allowed_hosts = Access::hosts_from(Some("Attacker.example:8000, lemon.lan"));
        assert!(host_allowed(&a, Some("attacker.example:8000")) && host_allowed(&a, Some("lemon.lan")));
        let beyond = Access { loopback_only: false, listen_host: "box.lan".into(), ..Access::default() };
        for ok in ["192.168.1.5:8000", "box.lan:8000", "[2001:db8::1]:8000", "localhost"] {
            assert!(host_allowed(&beyond, Some(ok)), "{ok}");
        }
        assert!(!host_allowed(&beyond, Some("attacker.example")));
    }

    #[test]
    fn origins_loopback_own_apps_and_listed() {
        let mut a = access();
        let host = Some("localhost:8000");
        for ok in [
            "http://localhost:5173",
            "https://localhost",
            "http://127.0.0.1:3000",
            "http://[::1]:8080",
            "http://ui.localhost:1",
            "http://localhost:8000",
            "tauri://localhost",
            "app://lemonade",
            "vscode-webview://abc",
        ] {
            assert!(origin_allowed(&a, ok, host), "{ok}");
        }
        for bad in
            ["http://evil.example", "null", "https://localhost.evil.example", "file://", "chrome-extension://x", ""]
        {
            assert!(!origin_allowed(&a, bad, host), "{bad}");
        }
        // The server's own origin, when reached by another name that the host check allowed.
        assert!(origin_allowed(&a, "http://lemon.lan:8000", Some("lemon.lan:8000")));
        assert!(origin_allowed(&a, "https://lemon.lan", Some("lemon.lan")), "behind a TLS proxy");
        assert!(!origin_allowed(&a, "https://evil.example", Some("lemon.lan:8000")));
        a.allowed_origins = Access::origins_from(Some("https://ui.example/, null"));
        assert!(origin_allowed(&a, "https://ui.example", host) && origin_allowed(&a, "null", host));
        a.allowed_origins = Access::origins_from(Some(" * "));
        assert!(origin_allowed(&a, "http://evil.example", host));
    }

    #[test]
    fn keys_admin_and_api() {
        let req = |a: &Access, m: Method, p: &str, key: Option<&str>, origin: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8000"));
            if let Some(k) = key {
                h.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {k}")).unwrap());
            }
            if let Some(o) = origin {
                h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
            }
            check(a, &m, p, &h)
        };
        let open = access();
        assert_eq!(req(&open, Method::POST, "/api/v1/load", None, None), Ok(()));
        assert_eq!(
            req(&open, Method::POST, "/api/v1/load", None, Some("http://evil.example")),
            Err(Refusal::Origin("http://evil.example".into()))
        );
        assert!(req(&open, Method::OPTIONS, "/api/v1/load", None, Some("http://evil.example")).is_err());

        let only_api = Access { api_key: Some("k".into()), ..access() };
        assert_eq!(req(&only_api, Method::POST, "/api/v1/load", Some("k"), None), Ok(()), "the API key guards all");
        assert_eq!(req(&only_api, Method::POST, "/api/v1/load", None, None), Err(Refusal::Key));

        let only_admin = Access { admin_key: Some("a".into()), ..access() };
        assert_eq!(req(&only_admin, Method::POST, "/api/v1/chat/completions", None, None), Ok(()));
        assert_eq!(req(&only_admin, Method::POST, "/api/v1/pull", None, None), Err(Refusal::Key));
        assert_eq!(req(&only_admin, Method::POST, "/api/v1/pull", Some("a"), None), Ok(()));

        let both = Access { api_key: Some("k".into()), admin_key: Some("a".into()), ..access() };
        assert_eq!(req(&both, Method::POST, "/v1/chat/completions", Some("k"), None), Ok(()));
        assert_eq!(req(&both, Method::POST, "/v1/chat/completions", Some("a"), None), Ok(()), "admin is elevated");
        assert_eq!(req(&both, Method::POST, "/v1/chat/completions", None, None), Err(Refusal::Key));
        assert_eq!(req(&both, Method::POST, "/v1/unload", Some("k"), None), Err(Refusal::AdminKey));
        assert_eq!(req(&both, Method::POST, "/v1/admin/models/m/load", Some("a"), None), Ok(()));
        assert_eq!(req(&both, Method::GET, "/api/v1/health", None, None), Ok(()), "health stays public");
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
