//! The HTTP side of lemonade's metrics: a layer that counts every answered request by its
//! route template, method and status. The families and the exposition are the engine's
//! (`engine::metrics`).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

pub use engine::metrics::{Metrics, CONTENT_TYPE};

/// Counts every answered request. It runs outside access control, so refusals count too.
/// Each request is also a `http.request` span for OpenTelemetry (target `lemonade::spans`,
/// level debug: with no exporter configured it is never created).
pub async fn layer(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    use tracing::Instrument;
    let endpoint = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    let method = req.method().clone();
    let span = tracing::debug_span!(target: "lemonade::spans", "http.request", http.request.method = %method,
        http.route = endpoint.as_deref().unwrap_or("unmatched"), http.response.status_code = tracing::field::Empty);
    let resp = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", resp.status().as_u16());
    m.request(endpoint.as_deref(), method.as_str(), resp.status().as_u16());
    resp
}
