//! HTTP handlers. Each is thin: parse, acquire a lease on the model (loading it if needed),
//! forward to the backend. The `#[utoipa::path]` beside each handler is its documentation.

use std::collections::BTreeMap;
use std::sync::Arc;

use api_types::*;
use axum::extract::{Path, Query, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http::Method;
use serde_json::Value;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::proxy;
use crate::runtime::Runtime;

pub type AppState = Arc<Runtime>;

const LLM: &[ModelType] = &[ModelType::Llm];
const EMBEDDING: &[ModelType] = &[ModelType::Embedding];
const RERANKING: &[ModelType] = &[ModelType::Reranking];
const ANY: &[ModelType] = &ModelType::ALL;

/// The model a request names; v9's messages when it names none.
fn require_model<'a>(rt: &Runtime, model: Option<&'a str>) -> Result<&'a str, ApiError> {
    match model {
        Some(m) if !m.is_empty() => Ok(m),
        _ if rt.loaded().is_empty() => {
            Err(ApiError::bad_request("No model loaded and no model specified in request", Some("model")))
        }
        _ => Err(ApiError::bad_request("No model specified in request", Some("model"))),
    }
}

/// `enable_thinking: false` → `/no_think\n` before the last user message whose content is a
/// string; `max_completion_tokens` → `max_tokens` when absent. Returns the original bytes
/// when nothing changed.
fn rewrite_chat(mut req: ChatCompletionRequest, raw: Bytes) -> Result<Bytes, ApiError> {
    let mut changed = false;
    if req.enable_thinking == Some(false) {
        if let Some(msg) =
            req.messages.iter_mut().rev().find(|m| m.role == "user" && matches!(m.content, Some(Value::String(_))))
        {
            if let Some(Value::String(s)) = &mut msg.content {
                s.insert_str(0, "/no_think\n");
                changed = true;
            }
        }
    }
    if req.max_tokens.is_none() && req.max_completion_tokens.is_some() {
        req.max_tokens = req.max_completion_tokens;
        changed = true;
    }
    if !changed {
        return Ok(raw);
    }
    serde_json::to_vec(&req).map(Bytes::from).map_err(|e| ApiError::Internal(e.to_string()))
}

async fn dispatch(
    rt: &AppState,
    model: &str,
    want: &[ModelType],
    endpoint: &str,
    path: &str,
    body: Bytes,
    stream: bool,
) -> Result<Response, ApiError> {
    let lease = rt.acquire(model, want, endpoint).await?;
    if stream {
        proxy::forward_stream(lease, path, body).await
    } else {
        proxy::forward(lease, Method::POST, path, Some(body), true).await
    }
}

/// Chat completion (OpenAI). Streams SSE when `stream` is true.
#[utoipa::path(post, path = "/api/v1/chat/completions", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. Loads the model on demand. Fields not listed in the schema \
                   (top_k, min_p, tools, response_format, …) are passed to llama-server unchanged. With `stream: true` \
                   the answer is `text/event-stream`, ending with `data: [DONE]`; a backend failure mid-stream becomes a \
                   `data: {\"error\": …}` frame.",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "Completion (JSON), or SSE chunks when streaming", body = ChatCompletionResponse),
        (status = 400, description = "Malformed body, missing or wrong-typed field, no model, or a model that is not an LLM", body = ErrorResponse),
        (status = 404, description = "Unknown model (`model_not_found`) or not available on this system (`model_not_supported`)", body = ErrorResponse),
        (status = 413, description = "Body larger than the limit", body = ErrorResponse),
        (status = 500, description = "The model failed to load (`model_load_error`)", body = ErrorResponse),
        (status = 502, description = "The backend died or could not be reached", body = ErrorResponse),
    ))]
pub async fn chat_completions(
    State(rt): State<AppState>,
    body: JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let req = body.value;
    let model = require_model(&rt, req.model.as_deref())?.to_string();
    let stream = req.stream.unwrap_or(false);
    let bytes = rewrite_chat(req, body.raw)?;
    dispatch(&rt, &model, LLM, "chat/completions", "/v1/chat/completions", bytes, stream).await
}

/// Text completion (OpenAI legacy).
#[utoipa::path(post, path = "/api/v1/completions", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. As chat/completions, for a raw prompt.",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "Completion, or SSE chunks when streaming"),
        (status = 400, description = "Invalid request or not an LLM", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "Model failed to load", body = ErrorResponse),
        (status = 502, description = "Backend failure", body = ErrorResponse),
    ))]
pub async fn completions(State(rt): State<AppState>, body: JsonBody<CompletionRequest>) -> Result<Response, ApiError> {
    let mut req = body.value;
    let model = require_model(&rt, req.model.as_deref())?.to_string();
    let stream = req.stream.unwrap_or(false);
    let bytes = if req.max_tokens.is_none() && req.max_completion_tokens.is_some() {
        req.max_tokens = req.max_completion_tokens;
        Bytes::from(serde_json::to_vec(&req).map_err(|e| ApiError::Internal(e.to_string()))?)
    } else {
        body.raw
    };
    dispatch(&rt, &model, LLM, "completions", "/v1/completions", bytes, stream).await
}

/// Responses API (OpenAI), as llama-server implements it.
#[utoipa::path(post, path = "/api/v1/responses", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1.",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "Response object, or SSE events when streaming"),
        (status = 400, description = "Invalid request or not an LLM", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "Model failed to load", body = ErrorResponse),
        (status = 502, description = "Backend failure", body = ErrorResponse),
    ))]
pub async fn responses(State(rt): State<AppState>, body: JsonBody<ResponsesRequest>) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    let stream = body.value.stream.unwrap_or(false);
    dispatch(&rt, &model, LLM, "responses", "/v1/responses", body.raw, stream).await
}

/// Embeddings (OpenAI). `encoding_format: "base64"` returns little-endian f32 in base64.
#[utoipa::path(post, path = "/api/v1/embeddings", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. The model must be an embedding model.",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "Embedding list", body = EmbeddingResponse),
        (status = 400, description = "Invalid request or not an embedding model", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "Model failed to load", body = ErrorResponse),
        (status = 502, description = "Backend failure", body = ErrorResponse),
    ))]
pub async fn embeddings(State(rt): State<AppState>, body: JsonBody<EmbeddingRequest>) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    dispatch(&rt, &model, EMBEDDING, "embeddings", "/v1/embeddings", body.raw, false).await
}

/// Reranking: scores `documents` against `query`.
#[utoipa::path(post, path = "/api/v1/reranking", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1, and as /v1/rerank. The model must be a reranking model.",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "Scores per document", body = RerankResponse),
        (status = 400, description = "Invalid request or not a reranking model", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "Model failed to load", body = ErrorResponse),
        (status = 502, description = "Backend failure", body = ErrorResponse),
    ))]
pub async fn reranking(State(rt): State<AppState>, body: JsonBody<RerankRequest>) -> Result<Response, ApiError> {
    let model = require_model(&rt, body.value.model.as_deref())?.to_string();
    dispatch(&rt, &model, RERANKING, "reranking", "/v1/rerank", body.raw, false).await
}

/// Models available on this host; downloaded ones only unless `show_all=true`.
#[utoipa::path(get, path = "/api/v1/models", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. Sorted by id.",
    params(ModelsQuery),
    responses((status = 200, description = "Model list", body = ModelList)))]
pub async fn list_models(State(rt): State<AppState>, Query(q): Query<ModelsQuery>) -> Json<ModelList> {
    let show_all = q.show_all.as_deref() == Some("true");
    let reg = rt.registry();
    let data = reg.models().filter(|m| show_all || m.downloaded).map(|m| reg.to_api(m)).collect();
    Json(ModelList { object: "list".into(), data })
}

/// One model by id (the id may contain `/` and `.`).
#[utoipa::path(get, path = "/api/v1/models/{id}", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1.",
    params(("id" = String, Path, description = "Model id")),
    responses(
        (status = 200, description = "The model", body = Model),
        (status = 404, description = "Unknown (`model_not_found`) or not available here (`model_not_supported`)", body = ErrorResponse),
    ))]
pub async fn get_model(State(rt): State<AppState>, Path(id): Path<String>) -> Result<Json<Model>, ApiError> {
    let reg = rt.registry();
    let m = reg.get(&id)?;
    Ok(Json(reg.to_api(m)))
}

/// Server status and loaded models.
#[utoipa::path(get, path = "/api/v1/health", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1.",
    responses((status = 200, description = "Status", body = Health)))]
pub async fn health(State(rt): State<AppState>) -> Json<Health> {
    let loaded = rt.loaded();
    let max_models: BTreeMap<String, i64> =
        ModelType::ALL.iter().map(|t| (t.as_str().to_string(), rt.cfg.max_loaded_models.get(*t))).collect();
    Json(Health {
        status: "ok".into(),
        version: crate::VERSION.into(),
        model_loaded: rt.most_recent().map(|m| m.info.name.clone()),
        all_models_loaded: loaded.iter().map(|(r, v)| rt.health_entry(r, v)).collect(),
        max_models,
        log_streaming: LogStreaming { sse: crate::logging::hub().is_some(), websocket: false },
    })
}

/// Telemetry of the last request of the most recently used model.
#[utoipa::path(get, path = "/api/v1/stats", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Input/output tokens, time to first token (s) and decode tokens/s, \
                   from the usage/timings of the last completed request.",
    responses(
        (status = 200, description = "Telemetry", body = Stats),
        (status = 404, description = "No model is loaded (`model_not_loaded`)", body = ErrorResponse),
    ))]
pub async fn stats(State(rt): State<AppState>) -> Result<Json<Stats>, ApiError> {
    let m = rt.most_recent().ok_or(ApiError::NoModelLoaded)?;
    let s = m.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Json(s))
}

const LLAMACPP_BACKENDS: &[&str] = &["cpu", "vulkan", "rocm", "metal", "system"];

/// The request's recipe options, validated (400 naming the field).
fn request_options(req: &LoadRequest) -> Result<RecipeOptions, ApiError> {
    let mut o = RecipeOptions::new();
    if let Some(c) = req.ctx_size {
        if c == 0 {
            return Err(ApiError::bad_request("ctx_size must be at least 1", Some("ctx_size")));
        }
        o.insert("ctx_size".into(), c.into());
    }
    if let Some(b) = &req.llamacpp_backend {
        if !LLAMACPP_BACKENDS.contains(&b.as_str()) {
            return Err(ApiError::bad_request(
                format!("llamacpp_backend must be one of {}, got '{b}'", LLAMACPP_BACKENDS.join(", ")),
                Some("llamacpp_backend"),
            ));
        }
        o.insert("llamacpp_backend".into(), b.clone().into());
    }
    if let Some(a) = &req.llamacpp_args {
        let check = backends::llamacpp::tokenize(a).and_then(|t| backends::llamacpp::validate_user_args(&t));
        if let Err(e) = check {
            return Err(ApiError::BadRequest {
                message: e.to_string(),
                param: Some("llamacpp_args".into()),
                code: Some("invalid_llamacpp_args"),
            });
        }
        o.insert("llamacpp_args".into(), a.clone().into());
    }
    Ok(o)
}

/// Loads a model (or reloads it with other options; the same options are a no-op).
#[utoipa::path(post, path = "/api/v1/load", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Options take precedence over saved per-model options, which take \
                   precedence over the server's flags. A loaded model with other options is restarted in place (it \
                   never takes a second slot). `save_options` stores the request's options as the model's defaults.",
    request_body = LoadRequest,
    responses(
        (status = 200, description = "Loaded", body = LoadResponse),
        (status = 400, description = "Invalid body or option (e.g. a reserved llama-server flag), or the model is not downloaded", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "The load failed (`model_load_error`)", body = ErrorResponse),
    ))]
pub async fn load(State(rt): State<AppState>, body: JsonBody<LoadRequest>) -> Result<Json<LoadResponse>, ApiError> {
    let req = body.value;
    let info = rt.registry().get(&req.model_name)?.clone();
    let opts = request_options(&req)?;
    let info = crate::pull::ensure_downloaded(&rt, &info).await?;
    if req.save_options == Some(true) {
        registry::save_recipe_options(&rt.cfg.cache_dir, &info.name, Some(&opts))
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        rt.reload_registry().map_err(|e| ApiError::Internal(e.to_string()))?;
    }
    let effective = rt.effective_options(&info, &opts);
    rt.load(&info, effective).await.map_err(|message| ApiError::load_failed(&info.name, message))?;
    Ok(Json(LoadResponse {
        status: "success".into(),
        model_name: info.name.clone(),
        checkpoint: info.checkpoint.clone(),
        recipe: info.recipe.clone(),
    }))
}

/// Unloads one model (after its in-flight requests finish), or every model.
#[utoipa::path(post, path = "/api/v1/unload", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. An empty body, or one without a name, unloads every model. \
                   New requests for the model are not admitted once the unload starts; requests in flight finish first.",
    request_body(content = UnloadRequest, description = "Optional"),
    responses(
        (status = 200, description = "Unloaded", body = UnloadResponse),
        (status = 400, description = "Malformed body", body = ErrorResponse),
        (status = 404, description = "The named model is not loaded (`model_not_loaded`)", body = ErrorResponse),
    ))]
pub async fn unload(State(rt): State<AppState>, body: Bytes) -> Result<Json<UnloadResponse>, ApiError> {
    let req: UnloadRequest =
        if body.iter().all(u8::is_ascii_whitespace) { UnloadRequest::default() } else { crate::extract::parse(&body)? };
    let name = req.model_name.or(req.model).filter(|n| !n.is_empty());
    match rt.unload(name.as_deref()).await {
        Ok(_) => Ok(Json(match name {
            Some(n) => UnloadResponse {
                status: "success".into(),
                message: "Model unloaded successfully".into(),
                model_name: Some(n),
            },
            None => UnloadResponse {
                status: "success".into(),
                message: "All models unloaded successfully".into(),
                model_name: None,
            },
        })),
        Err(message) => Err(ApiError::NotLoaded { message }),
    }
}

/// Liveness probe; answers as long as the process serves HTTP.
#[utoipa::path(get, path = "/live", tag = "Lemonade", responses((status = 200, description = "Alive", body = Live)))]
pub async fn live() -> Json<Live> {
    Json(Live { status: "ok".into() })
}

/// Body of llama-server's own POST endpoints: the model plus whatever llama-server reads.
#[derive(serde::Deserialize)]
pub struct NativeRequest {
    pub model: String,
    #[serde(default)]
    pub stream: Option<bool>,
}

/// llama-server's own POST endpoints (`/completion`, `/tokenize`, `/detokenize`,
/// `/apply-template`, `/infill`), routed by the `model` field of the body.
#[utoipa::path(post, path = "/tokenize", tag = "llama.cpp",
    description = "The same for /completion, /detokenize, /apply-template and /infill (also under the four API prefixes): \
                   the body is llama-server's, plus `model` naming the model. The answer is llama-server's.",
    request_body(content = Object, description = "llama-server request with a `model` field"),
    responses(
        (status = 200, description = "llama-server's answer"),
        (status = 400, description = "Invalid request (e.g. no `model`)", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
    ))]
pub async fn native_post(
    State(rt): State<AppState>,
    uri: http::Uri,
    body: JsonBody<NativeRequest>,
) -> Result<Response, ApiError> {
    let path = native_path(uri.path());
    let lease = rt.acquire(&body.value.model, ANY, path).await?;
    if body.value.stream == Some(true) {
        proxy::forward_stream(lease, path, body.raw).await
    } else {
        proxy::forward(lease, Method::POST, path, Some(body.raw), path == "/completion").await
    }
}

/// llama-server's own GET endpoints (`/props`, `/slots`, `/metrics`), routed by `?model=`.
#[utoipa::path(get, path = "/slots", tag = "llama.cpp",
    description = "The same for /props and /metrics (also under the four API prefixes). Other query parameters are passed on.",
    params(("model" = String, Query, description = "Model whose backend answers")),
    responses(
        (status = 200, description = "llama-server's answer"),
        (status = 400, description = "No `model` query parameter", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
    ))]
pub async fn native_get(
    State(rt): State<AppState>,
    uri: http::Uri,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let path = native_path(uri.path());
    let mut model = None;
    let rest = {
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
            if k == "model" {
                model = Some(v.into_owned());
            } else {
                rest.append_pair(&k, &v);
            }
        }
        rest.finish()
    };
    let model = model.filter(|m| !m.is_empty()).ok_or_else(|| {
        ApiError::bad_request(format!("Missing required query parameter 'model' for {path}"), Some("model"))
    })?;
    let lease = rt.acquire(&model, ANY, path).await?;
    let target = if rest.is_empty() { path.to_string() } else { format!("{path}?{rest}") };
    proxy::forward(lease, Method::GET, &target, None, false).await
}

/// `/api/v1/tokenize` → `/tokenize`.
fn native_path(p: &str) -> &str {
    for prefix in ["/api/v0", "/api/v1", "/v0", "/v1"] {
        if let Some(rest) = p.strip_prefix(prefix) {
            return rest;
        }
    }
    p
}

pub async fn unknown_path(uri: http::Uri) -> ApiError {
    ApiError::UnknownPath(uri.path().to_string())
}

pub fn method_not_allowed(allowed: &'static str) -> impl Fn() -> std::future::Ready<Response> + Clone + Send + 'static {
    move || std::future::ready(ApiError::MethodNotAllowed { allowed: allowed.into() }.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_rewrites() {
        let raw = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"}]}],"enable_thinking":false,"max_completion_tokens":5,"top_k":3}"#;
        let req: ChatCompletionRequest = serde_json::from_slice(raw).unwrap();
        let out = rewrite_chat(req, Bytes::from_static(raw)).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        // The last user message with string content is the first one (the second is an array).
        assert_eq!(v["messages"][0]["content"], "/no_think\na");
        assert_eq!(v["messages"][1]["content"][0]["text"], "b");
        assert_eq!(v["max_tokens"], 5);
        assert_eq!(v["max_completion_tokens"], 5);
        assert_eq!(v["top_k"], 3);
        assert_eq!(v["enable_thinking"], false);
    }

    #[test]
    fn unchanged_body_is_forwarded_byte_for_byte() {
        let raw = br#"{"model":"m",  "messages":[{"role":"user","content":"a"}], "max_tokens": 3}"#;
        let req: ChatCompletionRequest = serde_json::from_slice(raw).unwrap();
        assert_eq!(&rewrite_chat(req, Bytes::from_static(raw)).unwrap()[..], &raw[..]);
    }

    #[test]
    fn native_paths() {
        assert_eq!(native_path("/api/v1/tokenize"), "/tokenize");
        assert_eq!(native_path("/v1/slots"), "/slots");
        assert_eq!(native_path("/metrics"), "/metrics");
    }
}
