//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`, and under the other
//! prefixes): translated by `dialects::anthropic`, served by the same leases and backends as
//! the OpenAI routes; errors in Anthropic's shape, also mid-stream.

use api_types::*;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dialects::anthropic::{self as dialect, EventStream};
use serde_json::json;

use crate::error::{AnthropicApiError, ApiError};
use crate::extract::DialectJson;
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;
use axum::Extension;
use engine::lease::Endpoint;

/// A message id: `msg_` and 64 random bits (from the standard library's hasher keys, which
/// are random per process and change with every `RandomState`).
fn message_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("msg_{:016x}", h.finish())
}

fn bad(e: dialects::BadRequest) -> AnthropicApiError {
    AnthropicApiError::from(ApiError::bad_request(e.0, None))
}

/// Messages (Anthropic).
#[utoipa::path(post, path = "/api/v1/messages", tag = "Anthropic", request_body = MessagesRequest)]
pub async fn messages(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: DialectJson<MessagesRequest, AnthropicApiError>,
) -> Result<Response, AnthropicApiError> {
    let req = body.value;
    let openai = dialect::request(&req, &req.model).map_err(bad)?;
    // A router collection: the candidate its policy picks answers, as if asked directly.
    let (model, openai, routed) = engine::router::route_value(&rt.engine, &req.model, Endpoint::Messages, openai).await;
    let a = answer(&rt, &edge, &model, openai, req.stream == Some(true)).await?;
    let Some(d) = routed else { return Ok(a) };
    Ok(crate::api::router::decorate(a, &d, req.route_trace == Some(true), req.stream == Some(true)).await)
}

async fn answer(
    rt: &AppState,
    edge: &Edge,
    model: &str,
    openai: serde_json::Value,
    stream: bool,
) -> Result<Response, AnthropicApiError> {
    let lease = rt.engine.lease(edge.request(model, Endpoint::Messages)).await?;
    if stream {
        let t = Box::new(EventStream::new(model, &message_id()));
        return Ok(proxy::forward_translated(lease, "/v1/chat/completions", &openai, t).await?);
    }
    let v = proxy::call_json(&lease, "/v1/chat/completions", &openai, true).await?;
    Ok(crate::propagate::spilled(
        lease.spilled.as_deref(),
        Json(dialect::response(&v, model, &message_id())).into_response(),
    ))
}

/// Tokens of a conversation (Anthropic), counted by the model's own template and tokenizer.
#[utoipa::path(post, path = "/api/v1/messages/count_tokens", tag = "Anthropic", request_body = CountTokensRequest)]
pub async fn count_tokens(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: DialectJson<CountTokensRequest, AnthropicApiError>,
) -> Result<Json<CountTokensResponse>, AnthropicApiError> {
    let req = body.value;
    let templated = dialect::count_request(&req).map_err(bad)?;
    let lease = rt.engine.lease(edge.request(&req.model, Endpoint::CountTokens)).await?;
    let prompt = proxy::call_json(&lease, "/apply-template", &templated, false).await?;
    let prompt = prompt["prompt"].as_str().unwrap_or_default();
    let tokens = json!({"content": prompt, "add_special": false, "parse_special": true});
    let tokens = proxy::call_json(&lease, "/tokenize", &tokens, false).await?;
    let n = tokens["tokens"].as_array().map_or(0, Vec::len) as u64;
    Ok(Json(CountTokensResponse { input_tokens: n }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_ids_are_unique() {
        let (a, b) = (super::message_id(), super::message_id());
        assert!(a.starts_with("msg_") && a != b, "{a} {b}");
    }
}
