//! llama-server's own routes (forwarded to the model's backend), the fallback for unknown
//! paths, and the JSON 405.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::Method;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;
use axum::Extension;
use engine::lease::Endpoint;

/// Body of llama-server's own POST endpoints: the model plus whatever llama-server reads.
#[derive(serde::Deserialize)]
pub struct NativeRequest {
    pub model: String,
    #[serde(default)]
    pub stream: Option<bool>,
    /// The rest of llama-server's body (its native fields are range-checked).
    #[serde(flatten)]
    pub extra: api_types::Extra,
}

/// llama-server's own POST endpoints (`/completion`, `/tokenize`, `/detokenize`,
/// `/apply-template`, `/infill`), routed by the `model` field of the body.
#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "llama.cpp",
    request_body(content = Object, description = "llama-server request with a `model` field")
)]
pub async fn native_post(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    uri: http::Uri,
    body: JsonBody<NativeRequest>,
) -> Result<Response, ApiError> {
    let path = native_path(uri.path());
    crate::api::openai::check_native(&body.value.extra)?;
    let lease = rt.engine.lease(edge.request(&body.value.model, native_endpoint(path)?)).await?;
    if body.value.stream == Some(true) {
        proxy::forward_stream(lease, path, body.raw).await
    } else {
        proxy::forward_native(lease, Method::POST, path, Some(body.raw), path == "/completion").await
    }
}

/// llama-server's own GET endpoints (`/props`, `/slots`, `/metrics`), routed by `?model=`.
#[utoipa::path(
    get,
    path = "/slots",
    tag = "llama.cpp",
    params(("model" = String, Query, description = "Model whose backend answers"))
)]
pub async fn native_get(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    uri: http::Uri,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    get(&rt, &edge, uri.path(), query.as_deref()).await
}

/// llama-server's GET endpoint `uri_path`, for the model `query` names (also lemonade's
/// `/metrics?model=`).
pub async fn get(rt: &AppState, edge: &Edge, uri_path: &str, query: Option<&str>) -> Result<Response, ApiError> {
    let path = native_path(uri_path);
    let mut model = None;
    let rest = {
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
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
    let lease = rt.engine.lease(edge.request(&model, native_endpoint(path)?)).await?;
    let target = if rest.is_empty() { path.to_string() } else { format!("{path}?{rest}") };
    proxy::forward_native(lease, Method::GET, &target, None, false).await
}

/// The endpoint of llama-server's route `path` (one of the route table's).
fn native_endpoint(path: &str) -> Result<Endpoint, ApiError> {
    Endpoint::native(path).ok_or_else(|| ApiError::UnknownPath(path.to_string()))
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
    fn native_paths() {
        assert_eq!(native_path("/api/v1/tokenize"), "/tokenize");
        assert_eq!(native_path("/v1/slots"), "/slots");
        assert_eq!(native_path("/metrics"), "/metrics");
    }
}
