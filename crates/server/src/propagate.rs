//! What a request carries past lemonade, read from its headers once by a middleware and handed
//! to the handler as a value ([`Edge`], a request extension): the headers forwarded as they
//! came to local backends and remote upstreams (W3C trace context `traceparent`, `tracestate`,
//! and the session header, `x-session-id` or `--session-header`), so a trace continues through
//! lemonade and a router's session affinity holds past it (a value too long to be what it
//! claims is dropped, never forwarded); and the priority `X-Lemonade-Priority` gives (a bad
//! value is a 400 naming the header). Back out, spillover's decision for the request, which a
//! response carries as an extension ([`Spilled`]), becomes its `x-lemonade-upstream` header.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use engine::lease::{Endpoint, LeaseRequest, PRIORITIES};
use http::{HeaderName, HeaderValue};

use crate::error::ApiError;

/// The longest value forwarded (W3C caps `tracestate` at 512 characters; `traceparent` is 55).
const MAX_LEN: usize = 512;

pub use engine::lease::Forwarded;

/// The response header that says where spillover sent a request, and why.
pub const UPSTREAM_HEADER: &str = "x-lemonade-upstream";

/// The header that gives a request's priority when its body gives none.
pub const PRIORITY_HEADER: &str = "x-lemonade-priority";

/// Which headers are forwarded: the trace context (while `trust_incoming_trace_context` holds,
/// read at each request) and `session` (lowercase).
#[derive(Clone)]
pub struct Names(pub Arc<[HeaderName]>, Arc<engine::config::Config>);

/// The W3C trace context's headers.
const TRACE: [&str; 2] = ["traceparent", "tracestate"];

impl Names {
    pub fn new(cfg: &Arc<engine::config::Config>) -> Names {
        let mut names = TRACE.map(HeaderName::from_static).to_vec();
        if let Ok(h) = HeaderName::from_bytes(cfg.session_header.as_bytes()) {
            names.push(h);
        }
        Names(names.into(), cfg.clone())
    }
}

/// What a request carries past lemonade (see the module's header).
#[derive(Clone, Default)]
pub struct Edge {
    pub forwarded: Forwarded,
    /// `X-Lemonade-Priority`, when given.
    pub priority: Option<i32>,
    /// The context size the body asks for (`ctx_size`, Ollama's `num_ctx`), for a load this
    /// request causes.
    pub ctx_size: Option<api_types::CtxSize>,
}

impl Edge {
    /// A lease request for `model` at `endpoint`, with this request's forwarded headers.
    pub fn request(&self, model: &str, endpoint: Endpoint) -> LeaseRequest {
        LeaseRequest::new(model, endpoint).forwarded(self.forwarded.clone()).ctx_size(self.ctx_size)
    }

    /// This edge with the context size a request body's fields ask for (`ctx_size`: a number,
    /// or -1 for automatic; a bad value is ignored, as a sampling field the backend reads would
    /// be), for a load the request causes.
    pub fn with_load_fields(&self, fields: &api_types::Extra) -> Edge {
        Edge { ctx_size: api_types::LoadOptions::from_map_lossy(fields).0.ctx_size, ..self.clone() }
    }

    /// This edge with the context size Ollama's `num_ctx` (`v`) asks for.
    pub fn with_num_ctx(&self, v: Option<&serde_json::Value>) -> Edge {
        let ctx_size = v.and_then(|v| serde_json::from_value(v.clone()).ok());
        Edge { ctx_size, ..self.clone() }
    }

    /// The request's priority: its body's, else its header's, else 0 ([`engine::lease::priority`]).
    pub fn priority_of(&self, body: &[u8]) -> Result<i32, ApiError> {
        Ok(engine::lease::priority(body, self.priority)?)
    }
}

/// Spillover's decision for a request, put on its response by whatever answered from a lease.
#[derive(Clone)]
pub struct Spilled(pub String);

/// `response` with a lease's spillover `decision`, when it has one.
pub fn spilled(decision: Option<&str>, mut response: Response) -> Response {
    if let Some(d) = decision {
        response.extensions_mut().insert(Spilled(d.to_string()));
    }
    response
}

/// Reads a request's [`Edge`] into its extensions, and writes its response's [`Spilled`] as
/// the `x-lemonade-upstream` header.
pub async fn layer(State(names): State<Names>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let trust = names.1.live.trust_trace_context();
    let found: Vec<(String, String)> = names
        .0
        .iter()
        .filter(|n| trust || !TRACE.contains(&n.as_str()))
        .filter_map(|n| {
            let v = req.headers().get(n).filter(|v| v.len() <= MAX_LEN)?.to_str().ok()?;
            Some((n.as_str().to_string(), v.to_string()))
        })
        .collect();
    let priority = header_priority(&req)?;
    req.extensions_mut().insert(Edge { forwarded: Arc::new(found), priority, ctx_size: None });
    let mut resp = next.run(req).await;
    if let Some(Spilled(d)) = resp.extensions_mut().remove::<Spilled>() {
        let shown: String = d.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
        if let Ok(v) = HeaderValue::from_str(&shown) {
            resp.headers_mut().insert(UPSTREAM_HEADER, v);
        }
    }
    Ok(resp)
}

/// `X-Lemonade-Priority` (an integer in [`PRIORITIES`]); a bad value is a 400 naming it.
fn header_priority(req: &Request) -> Result<Option<i32>, ApiError> {
    let Some(v) = req.headers().get(PRIORITY_HEADER) else { return Ok(None) };
    let p = v.to_str().ok().and_then(|s| s.trim().parse::<i32>().ok()).filter(|n| PRIORITIES.contains(n));
    p.map(Some).ok_or_else(|| {
        let shown = String::from_utf8_lossy(v.as_bytes()).chars().take(40).collect::<String>();
        ApiError::bad_request(
            format!(
                "X-Lemonade-Priority must be a whole number from -10 to 10 (higher is served first), got '{shown}'"
            ),
            Some("X-Lemonade-Priority"),
        )
    })
}
