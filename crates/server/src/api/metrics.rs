//! `GET /metrics`: lemonade's own Prometheus metrics (see crate::metrics). Not part of the
//! OpenAPI document: its body is the OpenMetrics text format, not JSON, which the classic
//! Prometheus text format reads the same; it is labelled OpenMetrics for a scraper that asks
//! for it (`Accept`, as Prometheus sends), else `text/plain; version=0.0.4` (as Lemonade v11).

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::header;

use crate::api::native;
use crate::error::ApiError;
use crate::metrics::CONTENT_TYPE;

/// The classic Prometheus text format's content type.
const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
use crate::propagate::Edge;
use crate::state::AppState;
use axum::Extension;

/// lemonade's metrics; with `?model=`, that model's llama-server's own `/metrics` (as under
/// the API prefixes).
pub async fn metrics(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    uri: http::Uri,
    headers: http::HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let names_a_model = form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()).any(|(k, _)| k == "model");
    if names_a_model {
        return native::get(&rt, &edge, uri.path(), query.as_deref()).await;
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let ct = if accept.contains("application/openmetrics-text") { CONTENT_TYPE } else { TEXT_CONTENT_TYPE };
    Ok(([(header::CONTENT_TYPE, ct)], rt.engine.metrics_text().await).into_response())
}
