//! The Ollama API at the root of the port (`/api/chat`, `/api/tags`, …): requests are
//! translated by `dialects::ollama` and served by the same leases and backends as the OpenAI
//! routes; errors are Ollama's `{"error": "…"}`.

use std::convert::Infallible;
use std::time::SystemTime;

use api_types::*;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dialects::ollama::{self as dialect, KeepAlive, NdjsonStream};
use http::{header, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::{ApiError, OllamaApiError};
use crate::extract::DialectJson;
use crate::propagate::Edge;
use crate::state::AppState;
use crate::{proxy, sse};
use axum::Extension;
use engine::lease::{Endpoint, LeaseRequest};
use engine::pulls::{self, PullEvent};
use engine::Lease;

type Body_<T> = DialectJson<T, OllamaApiError>;
type Answer = Result<Response, OllamaApiError>;

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn required(model: Option<&str>, what: &str) -> Result<String, OllamaApiError> {
    let m = model.map(dialect::strip_latest).filter(|m| !m.is_empty());
    m.map(str::to_string)
        .ok_or_else(|| OllamaApiError::from(ApiError::bad_request(format!("{what} is required"), Some(what))))
}

/// The request's `keep_alive`, if any; 400 for a bad one.
fn keep_alive(v: Option<&Value>) -> Result<Option<KeepAlive>, OllamaApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    Ok(Some(dialect::keep_alive(v).map_err(|e| ApiError::bad_request(e.0, Some("keep_alive")))?))
}

/// A lease request for `model` at `endpoint`, its idle timeout set when `keep` is given.
fn request(edge: &Edge, model: &str, endpoint: Endpoint, keep: Option<KeepAlive>) -> LeaseRequest {
    edge.request(model, endpoint).keep_alive(keep.map(KeepAlive::idle_timeout_ms))
}

fn bad(e: dialects::BadRequest) -> OllamaApiError {
    OllamaApiError::from(ApiError::bad_request(e.0, None))
}

/// Empty messages (or prompt): Ollama's load, or unload with `keep_alive: 0`.
async fn load_or_unload(rt: &AppState, edge: &Edge, model: &str, keep: Option<KeepAlive>, chat: bool) -> Answer {
    let reason = if keep == Some(KeepAlive::UnloadAfter) {
        let _ = rt.engine.lifecycle().unload(Some(model)).await;
        "unload"
    } else {
        drop(rt.engine.lease(request(edge, model, Endpoint::ollama(chat), keep)).await?);
        "load"
    };
    Ok(Json(dialect::done_answer(model, &now(), chat, reason)).into_response())
}

/// An Ollama chat or generate request: its model, its `keep_alive`, which of the two it is,
/// and whether it asked for a router collection's decision in the answer.
#[derive(Clone, Copy)]
struct Turn<'a> {
    model: &'a str,
    keep: Option<KeepAlive>,
    chat: bool,
    trace: bool,
}

/// Serves a translated chat or generate request: NDJSON as the backend streams, or one answer.
async fn serve(rt: &AppState, edge: &Edge, t: Turn<'_>, path: &str, body: Value) -> Answer {
    // A router collection: the candidate its policy picks answers, as if asked directly.
    let (model, body, routed) = engine::router::route_value(&rt.engine, t.model, Endpoint::ollama(t.chat), body).await;
    let stream = body["stream"] == true;
    let a = answer(rt, edge, Turn { model: &model, ..t }, path, body).await?;
    let Some(d) = routed else { return Ok(a) };
    Ok(crate::api::router::decorate(a, &d, t.trace, stream).await)
}

async fn answer(rt: &AppState, edge: &Edge, t: Turn<'_>, path: &str, body: Value) -> Answer {
    if body["stream"] == true {
        return Ok(streamed(rt, edge, t, path, body).await?);
    }
    let (model, chat) = (t.model, t.chat);
    let lease = rt.engine.lease(request(edge, model, Endpoint::ollama(chat), t.keep)).await?;
    let v = proxy::call_json(&lease, path, &body, true).await?;
    Ok(crate::propagate::spilled(
        lease.spilled.as_deref(),
        if chat {
            Json(dialect::chat_response(&v, model, &now())).into_response()
        } else {
            Json(dialect::generate_response(&v, model, &now())).into_response()
        },
    ))
}

/// A streamed answer: NDJSON lines as the model speaks. One that waits for its model (or a
/// place on it) is answered at once, with a line each second that carries no text and says
/// where it is in `lemonade_status` (`queued 2`, `loading 3 s`): Ollama's clients read it as
/// an empty chunk. A failure after that is an `{"error": …}` line, as Ollama ends a stream.
async fn streamed(rt: &AppState, edge: &Edge, t: Turn<'_>, path: &str, body: Value) -> Result<Response, ApiError> {
    let (model, keep, chat) = (t.model, t.keep, t.chat);
    let priority = edge.priority_of(b"")?;
    let (rt1, req) = (rt.clone(), request(edge, model, Endpoint::ollama(chat), keep).priority(priority));
    let lease = async move { rt1.engine.lease(req).await };
    let (m, path) = (model.to_string(), path.to_string());
    let answer = move |l: engine::Lease| async move {
        let t: Box<dyn dialects::StreamTranslator> =
            if chat { Box::new(NdjsonStream::chat(&m, &now())) } else { Box::new(NdjsonStream::generate(&m, &now())) };
        proxy::forward_translated(l, &path, &body, t).await
    };
    crate::waiting::when_granted(rt, model, priority, lease, answer, ndjson_voice(model, chat)).await
}

/// Ollama's NDJSON as a waiting stream speaks it: an empty chunk with `lemonade_status`.
fn ndjson_voice(model: &str, chat: bool) -> crate::waiting::Voice {
    let m = model.to_string();
    crate::waiting::Voice {
        content_type: "application/x-ndjson",
        place: Box::new(move |words| dialect::waiting_line(&m, &now(), chat, words).into()),
        failure: Box::new(|e| dialect::error_line(&e.message()).into()),
    }
}

/// Chat (Ollama).
#[utoipa::path(post, path = "/api/chat", tag = "Ollama", request_body = OllamaChatRequest)]
pub async fn chat(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: Body_<OllamaChatRequest>,
) -> Answer {
    let req = body.value;
    let model = required(req.model.as_deref(), "model")?;
    let keep = keep_alive(req.keep_alive.as_ref())?;
    if req.messages.as_ref().is_none_or(|m| m.is_empty()) {
        return load_or_unload(&rt, &edge, &model, keep, true).await;
    }
    let openai = dialect::chat_request(&req, &model).map_err(bad)?;
    let turn = Turn { model: &model, keep, chat: true, trace: req.route_trace == Some(true) };
    // `num_ctx` sizes the context of a load this request causes.
    let edge = edge.with_num_ctx(req.options.as_ref().and_then(|o| o.get("num_ctx")));
    serve(&rt, &edge, turn, "/v1/chat/completions", openai).await
}

/// Generate (Ollama).
#[utoipa::path(post, path = "/api/generate", tag = "Ollama", request_body = OllamaGenerateRequest)]
pub async fn generate(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: Body_<OllamaGenerateRequest>,
) -> Answer {
    let req = body.value;
    let model = required(req.model.as_deref(), "model")?;
    let keep = keep_alive(req.keep_alive.as_ref())?;
    if req.prompt.as_deref().is_none_or(str::is_empty) && req.images.as_ref().is_none_or(|i| i.is_empty()) {
        return load_or_unload(&rt, &edge, &model, keep, false).await;
    }
    let (path, openai) = dialect::generate_request(&req, &model).map_err(bad)?;
    let turn = Turn { model: &model, keep, chat: false, trace: req.route_trace == Some(true) };
    let edge = edge.with_num_ctx(req.options.as_ref().and_then(|o| o.get("num_ctx")));
    serve(&rt, &edge, turn, path, openai).await
}

/// The embeddings of `input`, and the lease that made them (its spillover decision goes on
/// the answer).
async fn embed_values(
    rt: &AppState,
    edge: &Edge,
    model: &str,
    input: Value,
    keep: Option<KeepAlive>,
) -> Result<(Value, Lease), OllamaApiError> {
    let lease = rt.engine.lease(request(edge, model, Endpoint::OllamaEmbed, keep)).await?;
    let v = proxy::call_json(&lease, "/v1/embeddings", &json!({"model": model, "input": input}), true).await?;
    Ok((v, lease))
}

/// Embeddings (Ollama).
#[utoipa::path(post, path = "/api/embed", tag = "Ollama", request_body = OllamaEmbedRequest)]
pub async fn embed(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: Body_<OllamaEmbedRequest>,
) -> Answer {
    let req = body.value;
    let model = required(req.model.as_deref(), "model")?;
    let keep = keep_alive(req.keep_alive.as_ref())?;
    let input =
        req.input.filter(|i| !i.is_null()).ok_or_else(|| bad(dialects::BadRequest("input is required".into())))?;
    let (v, lease) = embed_values(&rt, &edge, &model, input, keep).await?;
    Ok(crate::propagate::spilled(lease.spilled.as_deref(), Json(dialect::embed_response(&v, model)).into_response()))
}

/// Embedding of one prompt (Ollama's older route).
#[utoipa::path(post, path = "/api/embeddings", tag = "Ollama", request_body = OllamaEmbeddingsRequest)]
pub async fn embeddings(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: Body_<OllamaEmbeddingsRequest>,
) -> Answer {
    let req = body.value;
    let model = required(req.model.as_deref(), "model")?;
    let keep = keep_alive(req.keep_alive.as_ref())?;
    let prompt = required(req.prompt.as_deref(), "prompt")?;
    let (v, lease) = embed_values(&rt, &edge, &model, Value::String(prompt), keep).await?;
    let embedding = dialect::vectors(&v).into_iter().next().unwrap_or_default();
    Ok(crate::propagate::spilled(
        lease.spilled.as_deref(),
        Json(OllamaEmbeddingsResponse { embedding }).into_response(),
    ))
}

/// The version lemonade answers as (Lemonade v9's).
#[utoipa::path(get, path = "/api/version", tag = "Ollama")]
pub async fn version() -> Json<OllamaVersion> {
    Json(OllamaVersion { version: dialect::VERSION.into() })
}

/// The downloaded models.
#[utoipa::path(get, path = "/api/tags", tag = "Ollama")]
pub async fn tags(State(rt): State<AppState>) -> Json<OllamaTags> {
    Json(OllamaTags { models: engine::ollama::tags(&rt.engine) })
}

/// The loaded models, with when each unloads.
#[utoipa::path(get, path = "/api/ps", tag = "Ollama")]
pub async fn ps(State(rt): State<AppState>) -> Json<OllamaPs> {
    Json(OllamaPs { models: engine::ollama::ps(&rt.engine) })
}

fn named(req: &OllamaModelRequest) -> Result<String, OllamaApiError> {
    required(req.model.as_deref().or(req.name.as_deref()), "model")
}

/// A model's details.
#[utoipa::path(post, path = "/api/show", tag = "Ollama", request_body = OllamaModelRequest)]
pub async fn show(
    State(rt): State<AppState>,
    body: Body_<OllamaModelRequest>,
) -> Result<Json<OllamaShow>, OllamaApiError> {
    Ok(Json(engine::ollama::show(&rt.engine, &named(&body.value)?)?))
}

/// Removes a model's files (unloading it first).
#[utoipa::path(delete, path = "/api/delete", tag = "Ollama", request_body = OllamaModelRequest)]
pub async fn delete(State(rt): State<AppState>, body: Body_<OllamaModelRequest>) -> Answer {
    let name = named(&body.value)?;
    let m = rt.engine.catalogue().get(&name)?;
    pulls::delete(&rt.engine, &m).await?;
    Ok(StatusCode::OK.into_response())
}

/// Pull progress as Ollama's NDJSON: `pulling manifest`, `pulling <file>` with total and
/// completed bytes, then `success` (or `{"error"}`). A client that leaves drops `rx`, which
/// cancels the download; shutdown ends the stream.
fn pull_lines(rt: &AppState, mut rx: mpsc::Receiver<PullEvent>) -> Response {
    use futures_util::StreamExt;
    let line = |v| bytes::Bytes::from(dialect::line(v));
    let first = line(json!(OllamaPullStatus { status: "pulling manifest".into(), ..Default::default() }));
    let rest = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .filter_map(move |ev| std::future::ready(engine::ollama::pull_status(&ev).map(line)));
    let lines = futures_util::stream::once(std::future::ready(first)).chain(rest).map(Ok::<_, Infallible>);
    ([(header::CONTENT_TYPE, "application/x-ndjson")], sse::until_shutdown(rt.engine.lifecycle(), lines))
        .into_response()
}

/// Downloads a catalogue (or registered) model.
#[utoipa::path(post, path = "/api/pull", tag = "Ollama", request_body = OllamaModelRequest)]
pub async fn pull(State(rt): State<AppState>, body: Body_<OllamaModelRequest>) -> Answer {
    let name = named(&body.value)?;
    let m = rt.engine.catalogue().get(&name)?;
    if body.value.stream == Some(false) {
        pulls::pull_now(&rt.engine, &m).await?;
        return Ok(Json(OllamaPullStatus { status: "success".into(), ..Default::default() }).into_response());
    }
    Ok(pull_lines(&rt, pulls::pull_in_background(&rt.engine, m)))
}

/// Ollama routes lemonade does not serve.
#[utoipa::path(post, path = "/api/create", tag = "Ollama")]
pub async fn not_supported() -> Response {
    let e = api_types::OllamaError {
        error: "not supported by lemonade: it serves GGUF models from the Hugging Face cache; \
                                  use POST /api/v1/pull to add one"
            .into(),
    };
    (StatusCode::NOT_IMPLEMENTED, Json(e)).into_response()
}
