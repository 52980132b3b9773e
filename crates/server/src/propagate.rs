//! The headers a request carries on to whatever serves it: W3C trace context (`traceparent`,
//! `tracestate`) and the session header (`x-session-id`, `--session-header`), forwarded as
//! they came to local backends and remote upstreams, so a trace continues through lemonade and
//! a router's session affinity holds past it. A value too long to be what it claims is
//! dropped, never forwarded. It also carries back spillover's decision for the request, which
//! the response gets as `x-lemonade-upstream`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderName, HeaderValue};

/// The longest value forwarded (W3C caps `tracestate` at 512 characters; `traceparent` is 55).
const MAX_LEN: usize = 512;

pub use engine::lease::Forwarded;

tokio::task_local! {
    static FORWARDED: Forwarded;
    static SPILLED: Arc<parking_lot::Mutex<Option<String>>>;
}

/// The response header that says where spillover sent a request, and why.
pub const UPSTREAM_HEADER: &str = "x-lemonade-upstream";

/// Which headers are forwarded: the trace context and `session` (lowercase).
#[derive(Clone)]
pub struct Names(pub Arc<[HeaderName]>);

impl Names {
    pub fn new(session: &str) -> Names {
        let mut names = vec![HeaderName::from_static("traceparent"), HeaderName::from_static("tracestate")];
        if let Ok(h) = HeaderName::from_bytes(session.as_bytes()) {
            names.push(h);
        }
        Names(names.into())
    }
}

/// Reads the forwarded headers of a request for the handler and the proxy.
pub async fn layer(State(names): State<Names>, req: Request, next: Next) -> Response {
    let found: Vec<(String, String)> = names
        .0
        .iter()
        .filter_map(|n| {
            let v = req.headers().get(n).filter(|v| v.len() <= MAX_LEN)?.to_str().ok()?;
            Some((n.as_str().to_string(), v.to_string()))
        })
        .collect();
    let spilled = Arc::new(parking_lot::Mutex::new(None));
    let mut resp = SPILLED.scope(spilled.clone(), FORWARDED.scope(Arc::new(found), next.run(req))).await;
    if let Some(v) = spilled.lock().take().and_then(|v| HeaderValue::from_str(&v).ok()) {
        resp.headers_mut().insert(UPSTREAM_HEADER, v);
    }
    resp
}

/// Records spillover's decision for the request being handled (a no-op outside one).
pub fn spilled(decision: Option<&str>) {
    if let Some(d) = decision {
        let shown: String = d.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
        let _ = SPILLED.try_with(|s| *s.lock() = Some(shown));
    }
}

/// The headers the request being handled forwards (none outside one).
pub fn current() -> Forwarded {
    FORWARDED.try_with(Arc::clone).unwrap_or_default()
}

/// Runs `f` (a task spawned for the request) with `headers` forwarded.
pub async fn within<F: std::future::Future>(headers: Forwarded, f: F) -> F::Output {
    FORWARDED.scope(headers, f).await
}

/// A lease request for `model` at `endpoint`, with the headers the request being handled
/// forwards.
pub fn request(model: &str, endpoint: engine::lease::Endpoint) -> engine::lease::LeaseRequest {
    engine::lease::LeaseRequest::new(model, endpoint).forwarded(current())
}
