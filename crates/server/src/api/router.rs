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
use futures_util::StreamExt;
use serde_json::Value;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// The header naming the rule that routed a request.
pub const ROUTE_HEADER: &str = "x-lemonade-route";

/// `answer` with the route header, and the decision in its body when asked for.
pub async fn decorate(answer: Response, decision: &RouteDecision, trace: bool, stream: bool) -> Response {
    let (mut parts, body) = answer.into_parts();
    let rule = if decision.matched_rule.is_empty() { "default" } else { decision.matched_rule.as_str() };
    if let Ok(h) = http::HeaderValue::from_str(rule) {
        parts.headers.insert(ROUTE_HEADER, h);
    }
    if !trace || !parts.status.is_success() {
        return Response::from_parts(parts, body);
    }
    let value = serde_json::to_value(decision).unwrap_or(Value::Null);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    if stream {
        let ndjson = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|c| c.as_bytes().starts_with(b"application/x-ndjson"));
        let end: &'static [u8] = if ndjson { b"\n" } else { b"\n\n" };
        return Response::from_parts(parts, Body::from_stream(first_event_with(body, value, end)));
    }
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(mut o)) => {
            o.insert("x_lemonade_route".into(), value);
            serde_json::to_vec(&o).map(Bytes::from).unwrap_or(bytes)
        }
        _ => bytes,
    };
    Response::from_parts(parts, Body::from(out))
}

/// The SSE (or NDJSON, `end` a single newline) `body` with `x_lemonade_route` added to the
/// JSON of its first event (what was held back waiting for that event's end goes out as it was
/// if the stream ends first).
fn first_event_with(
    body: Body,
    value: Value,
    end: &'static [u8],
) -> impl futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send + 'static {
    let pending = std::sync::Arc::new(parking_lot::Mutex::new(Some((Vec::<u8>::new(), value))));
    let left = pending.clone();
    let events = body.into_data_stream().map(move |chunk| {
        let chunk = chunk?;
        let mut held = pending.lock();
        let Some((buf, value)) = held.as_mut() else { return Ok(chunk) };
        buf.extend_from_slice(&chunk);
        let (out, done) = take_first_event(buf, value, end);
        if done {
            *held = None;
        }
        Ok(Bytes::from(out))
    });
    let rest =
        futures_util::stream::once(
            async move { Ok(Bytes::from(left.lock().take().map(|(b, _)| b).unwrap_or_default())) },
        );
    events.chain(rest)
}

/// What of `buf` can go out: comments (`: queued 2` while the request waits) as they are, then
/// the first event with data, `value` added, and the rest; true once that event went out.
fn take_first_event(buf: &mut Vec<u8>, value: &Value, end: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    while let Some(at) = buf.windows(end.len()).position(|w| w == end) {
        if buf.starts_with(b":") {
            out.extend(buf.drain(..at + end.len()));
            continue;
        }
        let (event, rest) = buf.split_at(at);
        out.extend(inject(event, value));
        out.extend_from_slice(rest);
        return (out, true);
    }
    (out, false)
}

/// One SSE event with `value` as `x_lemonade_route` in its `data:` JSON, or one NDJSON line
/// with it in its JSON (unchanged if it has none).
fn inject(event: &[u8], value: &Value) -> Vec<u8> {
    if let Ok(Value::Object(mut o)) = serde_json::from_slice::<Value>(event) {
        o.insert("x_lemonade_route".into(), value.clone());
        return serde_json::to_vec(&o).unwrap_or_else(|_| event.to_vec());
    }
    let text = String::from_utf8_lossy(event);
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("data: ").map(serde_json::from_str::<Value>) {
            Some(Ok(Value::Object(mut o))) => {
                o.insert("x_lemonade_route".into(), value.clone());
                format!("data: {}", Value::Object(o))
            }
            _ => l.to_string(),
        })
        .collect();
    lines.join("\n").into_bytes()
}

/// Checks a routing policy and decides for a sample request.
#[utoipa::path(post, path = "/api/v1/routing/validate", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Lemonade v11. Checks a `collection.router` definition without \
        registering it (its components need not exist, but every model it names must be one of them) and returns the \
        decision for the sample `prompt`, `has_images`, `has_tools` and `metadata`, with its trace. Model-backed \
        conditions run on their models. `normalized_policy` writes a `routing.router` block out as its classifier and \
        rules.",
    request_body = RoutingValidateRequest,
    responses(
        (status = 200, description = "The decision", body = RoutingValidateResponse),
        (status = 400, description = "A bad policy (`param` names the field), or a sample field of the wrong type", body = ErrorResponse),
    ))]
pub async fn validate(
    State(rt): State<AppState>,
    body: JsonBody<RoutingValidateRequest>,
) -> Result<Json<RoutingValidateResponse>, ApiError> {
    Ok(Json(engine::router::validate(&rt.engine, &body.value).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_goes_into_the_first_event_only() {
        let v = serde_json::json!({"route_to": "A"});
        let out = inject(b"data: {\"id\":\"1\"}", &v);
        assert_eq!(String::from_utf8(out).unwrap(), r#"data: {"id":"1","x_lemonade_route":{"route_to":"A"}}"#);
        assert_eq!(inject(b"data: [DONE]", &v), b"data: [DONE]");
        let mut buf = b": queued 1\n\n: loading 0 s\n\ndata: {}\n\ndata: [DONE]\n\n".to_vec();
        let (out, done) = take_first_event(&mut buf, &v, b"\n\n");
        assert!(done);
        let want =
            ": queued 1\n\n: loading 0 s\n\ndata: {\"x_lemonade_route\":{\"route_to\":\"A\"}}\n\ndata: [DONE]\n\n";
        assert_eq!(String::from_utf8(out).unwrap(), want, "comments pass, the first data event gets it");
        let line = inject(br#"{"model":"A","done":false}"#, &v);
        assert_eq!(
            String::from_utf8(line).unwrap(),
            r#"{"done":false,"model":"A","x_lemonade_route":{"route_to":"A"}}"#
        );
    }
}

/// Label scores for a text from a chat model.
#[utoipa::path(post, path = "/api/v1/classify", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Lemonade v11 serves encoder classifiers (onnxruntime) here; lemonade \
        has no such backend, so a chat model scores the request's `labels` (v11's LLM-as-classifier, the path a router's \
        `classifier` condition takes): its reply is constrained to one number per label, each from 0 to 1. `input` (or \
        `text`) and `labels` are required; `top_k` keeps the best k.",
    request_body = ClassifyRequest,
    responses(
        (status = 200, description = "The scores", body = ClassifyResponse),
        (status = 400, description = "A missing model, input or labels, or a bad top_k", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 502, description = "The model answered no score for each label", body = ErrorResponse),
    ))]
pub async fn classify(
    State(rt): State<AppState>,
    body: JsonBody<ClassifyRequest>,
) -> Result<Json<ClassifyResponse>, ApiError> {
    Ok(Json(engine::router::classify(&rt.engine, &body.value).await?))
}
