//! Lemonade v11's router collections on the wire: a request naming a `collection.router` is
//! sent to the candidate its policy picks (`engine::router`), answered as that model answers,
//! with the `x-lemonade-route` header (the matched rule or `default`) and, when the request
//! asks with `"route_trace": true`, the decision as `x_lemonade_route` in the body (in the
//! first event of a stream). And `POST /v1/routing/validate`.

use api_types::*;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use bytes::Bytes;
use dialects::annotate::{self, FirstEvent};
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::Arc;

use crate::error::{ApiError, V11ApiError};
use crate::extract::{DialectJson, JsonBody};
use crate::state::AppState;

/// The body field the decision goes in.
const FIELD: &str = "x_lemonade_route";

/// The header naming the rule that routed a request.
pub const ROUTE_HEADER: &str = "x-lemonade-route";

/// `answer` with the route header, and the decision in its body (`x_lemonade_route`, as
/// Lemonade v11.7 answers: always, its `trace` only when asked for with `route_trace`).
pub async fn decorate(answer: Response, decision: &RouteDecision, trace: bool, stream: bool) -> Response {
    let (mut parts, body) = answer.into_parts();
    let rule = if decision.matched_rule.is_empty() { "default" } else { decision.matched_rule.as_str() };
    if let Ok(h) = http::HeaderValue::from_str(rule) {
        parts.headers.insert(ROUTE_HEADER, h);
    }
    if !parts.status.is_success() {
        return Response::from_parts(parts, body);
    }
    let shown = RouteDecision { trace: if trace { decision.trace.clone() } else { Vec::new() }, ..decision.clone() };
    let value = serde_json::to_value(&shown).unwrap_or(Value::Null);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    if stream {
        let ct = parts.headers.get(http::header::CONTENT_TYPE);
        let ndjson = ct.is_some_and(|c| c.as_bytes().starts_with(b"application/x-ndjson"));
        let first = Arc::new(Mutex::new(FirstEvent::new(FIELD, value, ndjson)));
        let (feed, end) = (first.clone(), first);
        let events =
            body.into_data_stream().map(move |chunk| Ok::<_, axum::Error>(Bytes::from(feed.lock().push(&chunk?))));
        let rest = futures_util::stream::once(async move { Ok(Bytes::from(end.lock().rest())) });
        return Response::from_parts(parts, Body::from_stream(events.chain(rest)));
    }
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    let out = annotate::with_field(&bytes, FIELD, &value).map(Bytes::from).unwrap_or(bytes);
    Response::from_parts(parts, Body::from(out))
}

/// Checks a routing policy and decides for a sample request.
#[utoipa::path(post, path = "/api/v1/routing/validate", tag = "Lemonade", request_body = RoutingValidateRequest)]
pub async fn validate(
    State(rt): State<AppState>,
    body: DialectJson<RoutingValidateRequest, V11ApiError>,
) -> Result<Json<RoutingValidateResponse>, V11ApiError> {
    Ok(Json(engine::router::validate(&rt.engine, &body.value).await?))
}

/// Label scores for a text from a chat model.
#[utoipa::path(post, path = "/api/v1/classify", tag = "Lemonade", request_body = ClassifyRequest)]
pub async fn classify(
    State(rt): State<AppState>,
    body: JsonBody<ClassifyRequest>,
) -> Result<Json<ClassifyResponse>, ApiError> {
    Ok(Json(engine::router::classify(&rt.engine, &body.value).await?))
}
