//! The web UI: the files of `crates/server/ui`, embedded in the binary at build time
//! (rust-embed), gzipped once when the app is built, and served from `/ui/*` with an ETag.
//!
//! * `GET /` is content-negotiated: a client that asks for JSON and not HTML (an API client
//!   probing the server) gets `/live`'s `{"status":"ok"}`; everything else, a browser or curl's
//!   `*/*`, gets the page (Lemonade v9: `GET /` always answers 200 with `text/html`).
//! * Other UI paths fall back to the page, as v9's SPA fallback: a GET that accepts HTML, on a
//!   path outside the API prefixes and `/live`, `/metrics`, `/docs`, `/static`, `/internal`,
//!   `/status`, whose last segment has no extension (or `.html`). Anything else keeps the API's
//!   JSON 404.
//! * The page carries a Content-Security-Policy that lets it reach its own origin only.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};

use crate::error::ApiError;

#[derive(rust_embed::RustEmbed)]
#[folder = "ui/"]
struct Files;

/// The page's policy: scripts, styles and requests from its own origin only; images and audio
/// also from `data:` and `blob:` (generated images, recordings); nobody may frame it (it can
/// manage the server).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
    img-src 'self' data: blob:; media-src 'self' data: blob:; font-src 'self'; manifest-src 'self'; \
    frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Paths the page never answers for (v9's SPA fallback exclusions, plus ours).
const NOT_UI: [&str; 13] = [
    "/api",
    "/v0",
    "/v1",
    "/live",
    "/health",
    "/get_load",
    "/metrics",
    "/docs",
    "/static",
    "/internal",
    "/status",
    "/ui",
    "/openapi",
];

struct Asset {
    raw: bytes::Bytes,
    gzip: Option<bytes::Bytes>,
    etag: HeaderValue,
    mime: &'static str,
}

/// The embedded files, ready to serve. Built once per app; handlers reach it as an
/// [`Extension`].
#[derive(Clone)]
pub struct WebUi(Arc<HashMap<String, Asset>>);

impl WebUi {
    pub fn load() -> WebUi {
        let mut files = HashMap::new();
        for name in Files::iter() {
            let Some(file) = Files::get(&name) else { continue };
            let raw = bytes::Bytes::from(file.data.into_owned());
            let hash: String = file.metadata.sha256_hash().iter().take(16).map(|b| format!("{b:02x}")).collect();
            let etag = HeaderValue::from_str(&format!("\"{hash}\"")).expect("hex is a header value");
            let mime = mime(&name);
            let gzip = mime.starts_with("text/") || mime.contains("javascript") || mime.contains("svg");
            let gzip = gzip.then(|| gzipped(&raw)).flatten();
            files.insert(name.to_string(), Asset { raw, gzip, etag, mime });
        }
        WebUi(Arc::new(files))
    }

    /// Every file as served: (name, bytes, gzipped bytes if compressed).
    #[cfg(test)]
    fn sizes(&self) -> Vec<(String, usize, usize)> {
        let mut v: Vec<_> = self
            .0
            .iter()
            .map(|(n, a)| (n.clone(), a.raw.len(), a.gzip.as_ref().map_or(a.raw.len(), |g| g.len())))
            .collect();
        v.sort();
        v
    }

    fn serve(&self, name: &str, headers: &HeaderMap, page: bool) -> Option<Response> {
        let a = self.0.get(name)?;
        let mut resp = if headers.get(header::IF_NONE_MATCH).is_some_and(|v| etag_matches(v, &a.etag)) {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            match a.gzip.as_ref().filter(|_| accepts_gzip(headers)) {
                Some(gz) => {
                    let mut r = Body::from(gz.clone()).into_response();
                    r.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                    r
                }
                None => Body::from(a.raw.clone()).into_response(),
            }
        };
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
        h.insert(header::ETAG, a.etag.clone());
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        if page {
            h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
            h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
            h.append(header::VARY, HeaderValue::from_static("Accept"));
        }
        Some(resp)
    }

    fn page(&self, headers: &HeaderMap) -> Response {
        self.serve("index.html", headers, true).unwrap_or_else(|| ApiError::UnknownPath("/".into()).into_response())
    }
}

fn gzipped(raw: &[u8]) -> Option<bytes::Bytes> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(raw).ok()?;
    enc.finish().ok().map(bytes::Bytes::from)
}

fn mime(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        _ => "application/octet-stream",
    }
}

fn etag_matches(given: &HeaderValue, etag: &HeaderValue) -> bool {
    given.to_str().is_ok_and(|g| g.split(',').any(|t| t.trim().trim_start_matches("W/") == etag || t.trim() == "*"))
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|e| {
            let mut parts = e.split(';');
            parts.next().is_some_and(|n| n.trim().eq_ignore_ascii_case("gzip"))
                && !parts.any(|p| p.trim().replace(' ', "") == "q=0")
        })
    })
}

/// Media ranges of `Accept` that are given a non-zero quality.
fn accepted(headers: &HeaderMap) -> Vec<String> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    accept
        .split(',')
        .filter_map(|r| {
            let mut parts = r.split(';');
            let range = parts.next()?.trim().to_ascii_lowercase();
            let refused = parts
                .any(|p| p.trim().replace(' ', "").strip_prefix("q=").is_some_and(|q| q.parse::<f32>() == Ok(0.0)));
            (!refused && !range.is_empty()).then_some(range)
        })
        .collect()
}

/// Whether a request asks for JSON and not HTML (an API client, not a browser).
pub fn wants_json(headers: &HeaderMap) -> bool {
    let ranges = accepted(headers);
    let html = ranges.iter().any(|r| r == "text/html" || r == "text/*");
    let json = ranges.iter().any(|r| r == "application/json" || r.ends_with("+json"));
    json && !html
}

/// Whether a browser navigation to `path` gets the page (the SPA fallback).
pub fn is_ui_path(path: &str) -> bool {
    let excluded = NOT_UI.iter().any(|p| path == *p || path.starts_with(&format!("{p}/")));
    let last = path.rsplit('/').next().unwrap_or("");
    let plain = match last.rsplit_once('.') {
        None => true,
        Some((_, ext)) => ext.eq_ignore_ascii_case("html") || ext.eq_ignore_ascii_case("htm"),
    };
    !excluded && plain
}

/// `GET /`.
pub async fn root(Extension(ui): Extension<WebUi>, headers: HeaderMap) -> Response {
    if wants_json(&headers) {
        let mut r = axum::Json(api_types::Live { status: "ok".into() }).into_response();
        r.headers_mut().append(header::VARY, HeaderValue::from_static("Accept"));
        return r;
    }
    ui.page(&headers)
}

/// `GET /ui/{file}`: one embedded file.
pub async fn asset(
    Extension(ui): Extension<WebUi>,
    Path(file): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let page = file == "index.html";
    ui.serve(&file, &headers, page).unwrap_or_else(|| ApiError::UnknownPath(uri.path().to_string()).into_response())
}

/// Every unrouted request: the page for a browser's navigation to a UI path, else the API's
/// JSON 404.
pub async fn fallback(Extension(ui): Extension<WebUi>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let navigation = (method == Method::GET || method == Method::HEAD)
        && accepted(&headers).iter().any(|r| r == "text/html")
        && is_ui_path(uri.path());
    if navigation {
        return ui.page(&headers);
    }
    ApiError::UnknownPath(uri.path().to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn only_a_json_only_client_gets_json_at_the_root() {
        assert!(wants_json(&accept("application/json")));
        assert!(wants_json(&accept("application/json, */*;q=0.5")));
        assert!(!wants_json(&accept("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")));
        assert!(!wants_json(&accept("*/*")));
        assert!(!wants_json(&HeaderMap::new()));
        assert!(!wants_json(&accept("application/json, text/html")));
        assert!(!wants_json(&accept("application/json;q=0")));
    }

    #[test]
    fn ui_paths_exclude_the_api_and_files() {
        for p in ["/", "/models", "/chat/3", "/logs", "/system.html"] {
            assert!(is_ui_path(p), "{p}");
        }
        for p in ["/api/v1/nope", "/v1/models", "/live", "/metrics", "/docs/", "/favicon.ico", "/x/app.js", "/ui/nope"]
        {
            assert!(!is_ui_path(p), "{p}");
        }
    }

    #[test]
    fn every_file_is_embedded_with_a_type_and_text_is_gzipped() {
        let ui = WebUi::load();
        let sizes = ui.sizes();
        assert!(sizes.iter().any(|(n, _, _)| n == "index.html"), "{sizes:?}");
        for (name, raw, gz) in sizes {
            assert_ne!(mime(&name), "application/octet-stream", "{name} has no content type");
            if !name.ends_with(".png") {
                assert!(gz < raw, "{name} is not compressed: {gz} ≥ {raw}");
            }
        }
    }
}
