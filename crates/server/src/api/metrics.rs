//! `GET /metrics`: lemonade's own Prometheus metrics (see crate::metrics). Not part of the
//! OpenAPI document: its body is the OpenMetrics text format, not JSON.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::header;

use crate::api::native;
use crate::error::ApiError;
use crate::metrics::CONTENT_TYPE;
use crate::propagate::Edge;
use crate::state::AppState;
use axum::Extension;

/// lemonade's metrics; with `?model=`, that model's llama-server's own `/metrics` (as under
/// the API prefixes).
pub async fn metrics(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    uri: http::Uri,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let names_a_model = form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()).any(|(k, _)| k == "model");
    if names_a_model {
        return native::get(&rt, &edge, uri.path(), query.as_deref()).await;
    }
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], rt.engine.metrics_text().await).into_response())
}
