//! The OpenAI endpoints: chat/completions, completions, responses, embeddings, reranking and
//! models. Each handler parses, takes a lease on the model (loading it if needed) and forwards.

use api_types::*;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http::Method;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;
use axum::Extension;
use backends::llamacpp;
use engine::lease::Endpoint;
use engine::router::Resolved;

/// The model a request names; v9's messages when it names none.
/// llama.cpp's native fields of a body, each in its range (a 400 naming the first that is not).
pub(crate) fn check_native(extra: &api_types::Extra) -> Result<(), ApiError> {
    backends::llamacpp::check_native(extra).map_err(|(message, field)| ApiError::bad_request(message, Some(field)))
}

fn require_model<'a>(rt: &AppState, model: Option<&'a str>) -> Result<&'a str, ApiError> {
    match model {
        Some(m) if !m.is_empty() => Ok(m),
        _ if rt.engine.lifecycle().loaded().is_empty() => {
            Err(ApiError::bad_request("No model loaded and no model specified in request", Some("model")))
        }
        _ => Err(ApiError::bad_request("No model specified in request", Some("model"))),
    }
}

/// Forwards to `model`, or, when it names a router collection, to the candidate its policy
/// picks for this request (with the route header and, when asked, the decision).
async fn dispatch(
    rt: &AppState,
    edge: &Edge,
    model: &str,
    endpoint: Endpoint,
    body: Bytes,
    stream: bool,
) -> Result<Response, ApiError> {
    match engine::router::resolve(&rt.engine, model, endpoint, body).await? {
        Resolved::Omni { collection, omni, body } => {
            crate::api::omni::answer(rt, edge, &collection, &omni, body, stream).await
        }
        Resolved::Model { model, body, routed: None } => forward_to(rt, edge, &model, endpoint, body, stream).await,
        Resolved::Model { model, body, routed: Some((decision, trace)) } => {
            let answer = forward_to(rt, edge, &model, endpoint, body, stream).await?;
            Ok(crate::api::router::decorate(answer, &decision, trace, stream).await)
        }
    }
}

async fn forward_to(
    rt: &AppState,
    edge: &Edge,
    model: &str,
    endpoint: Endpoint,
    body: Bytes,
    stream: bool,
) -> Result<Response, ApiError> {
    if stream {
        return crate::waiting::stream(rt, edge, model, endpoint, body).await;
    }
    let priority = edge.priority_of(&body)?;
    let lease = rt.engine.lease(edge.request(model, endpoint).priority(priority)).await?;
    proxy::forward(lease, Method::POST, endpoint.path(), Some(body), true).await
}

/// Chat completion (OpenAI). Streams SSE when `stream` is true.
#[utoipa::path(post, path = "/api/v1/chat/completions", tag = "OpenAI", request_body = ChatCompletionRequest)]
pub async fn chat_completions(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let mut req = body.value;
    let model = require_model(&rt, req.model.as_deref())?.to_string();
    check_native(&req.extra)?;
    let stream = req.stream.unwrap_or(false);
    let edge = edge.with_load_fields(&req.extra);
    let bytes = if llamacpp::adapt_chat(&mut req) { Bytes::from(serde_json::to_vec(&req)?) } else { body.raw };
    dispatch(&rt, &edge, &model, Endpoint::ChatCompletions, bytes, stream).await
}

/// Text completion (OpenAI legacy).
#[utoipa::path(post, path = "/api/v1/completions", tag = "OpenAI", request_body = CompletionRequest)]
pub async fn completions(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let mut req = body.value;
    let model = require_model(&rt, req.model.as_deref())?.to_string();
    check_native(&req.extra)?;
    let stream = req.stream.unwrap_or(false);
    let edge = edge.with_load_fields(&req.extra);
    let bytes = if llamacpp::adapt_completion(&mut req) { Bytes::from(serde_json::to_vec(&req)?) } else { body.raw };
    dispatch(&rt, &edge, &model, Endpoint::Completions, bytes, stream).await
}

/// Responses API (OpenAI), as llama-server implements it.
#[utoipa::path(post, path = "/api/v1/responses", tag = "OpenAI", request_body = ResponsesRequest)]
pub async fn responses(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    let stream = body.value.stream.unwrap_or(false);
    dispatch(&rt, &edge, &model, Endpoint::Responses, body.raw, stream).await
}

/// Embeddings (OpenAI). `encoding_format: "base64"` returns little-endian f32 in base64.
#[utoipa::path(post, path = "/api/v1/embeddings", tag = "OpenAI", request_body = EmbeddingRequest)]
pub async fn embeddings(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<EmbeddingRequest>,
) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    dispatch(&rt, &edge, &model, Endpoint::Embeddings, body.raw, false).await
}

/// Reranking: scores `documents` against `query`.
#[utoipa::path(post, path = "/api/v1/reranking", tag = "Lemonade", request_body = RerankRequest)]
pub async fn reranking(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<RerankRequest>,
) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    dispatch(&rt, &edge, &model, Endpoint::Rerank, body.raw, false).await
}

/// Models available on this host; downloaded ones only unless `show_all=true`.
#[utoipa::path(get, path = "/api/v1/models", tag = "OpenAI", params(ModelsQuery))]
pub async fn list_models(State(rt): State<AppState>, Query(q): Query<ModelsQuery>) -> Json<ModelList> {
    Json(engine::models::list(&rt.engine, q.show_all.as_deref() == Some("true")))
}

/// One model by id (the id may contain `/` and `.`).
#[utoipa::path(
    get,
    path = "/api/v1/models/{id}",
    tag = "OpenAI",
    params(("id" = String, Path, description = "Model id"))
)]
pub async fn get_model(
    State(rt): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<FilesQuery>,
) -> Result<Response, ApiError> {
    if let Some(model) = id.strip_suffix("/options").filter(|m| !m.is_empty()) {
        return Ok(crate::api::options::get_options(&rt, model).await?.into_response());
    }
    if let Some(model) = id.strip_suffix("/files").filter(|m| !m.is_empty()) {
        return Ok(crate::api::options::files(&rt, model, &q).await?.into_response());
    }
    Ok(Json(engine::models::get(&rt.engine, &id)?).into_response())
}
