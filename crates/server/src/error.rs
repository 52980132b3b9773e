//! One error type for the HTTP layer; `IntoResponse` is the single place that maps errors to
//! status codes and OpenAI-style bodies, and `From<EngineError>` below is the single place
//! where an error of the layers below (the engine's, which wraps registry, backends, host and
//! scheduler errors) becomes an HTTP error.

use api_types::ErrorResponse;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
pub use engine::error::bytes;
use engine::error::rejection_message;
use engine::EngineError;
use registry::LookupError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed or invalid request; `param` names the offending field.
    #[error("{message}")]
    BadRequest { message: String, param: Option<String>, code: Option<&'static str> },
    #[error(transparent)]
    Lookup(LookupError),
    /// The model exists but cannot serve this endpoint (e.g. chat to an embedding model).
    #[error("{0}")]
    WrongModelType(String),
    /// The model could not be loaded.
    #[error("Failed to load model '{model}': {message}")]
    LoadFailed { model: String, message: String },
    /// The backend answered with an error: its status and body are passed through.
    #[error("backend answered {status}")]
    Backend { status: StatusCode, body: Bytes, content_type: Option<String> },
    /// The backend could not be reached or died during the request.
    #[error("{0}")]
    BackendUnavailable(String),
    #[error("No model loaded")]
    NoModelLoaded,
    /// The body is valid JSON but fails the schema (admin API).
    #[error("{0}")]
    Unprocessable(String),
    /// The model's state forbids the operation now (admin API).
    #[error("{0}")]
    Conflict(String),
    /// An upstream rate-limited the request (429 `rate_limited`).
    #[error("{0}")]
    RateLimited(String),
    /// A thing other than a model or a path (an alias, …) that does not exist (404 `not_found`).
    #[error("{0}")]
    NotFound(String),
    /// Unload of a model that is not loaded.
    #[error("{message}")]
    NotLoaded { message: String },
    /// The runtime did not admit the request (the model's state forbids it).
    #[error("{}", rejection_message(model, why))]
    Rejected { model: String, why: scheduler::Rejection },
    #[error("The requested endpoint does not exist")]
    UnknownPath(String),
    #[error("Method Not Allowed. Use {allowed} for this endpoint")]
    MethodNotAllowed { allowed: String },
    /// A remote provider failed: refused, unreachable, a 5xx, or a refused key (502).
    #[error("{0}")]
    UpstreamFailed(String),
    /// A remote provider gave no answer within `--remote-timeout` (504).
    #[error("{0}")]
    UpstreamTimeout(String),
    /// A remote upstream cannot take the request now (503 with `Retry-After`, seconds).
    #[error("{message}")]
    UpstreamBusy { message: String, retry_after: u64 },
    /// The disk is full (a download).
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("Request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError::BadRequest { message: message.into(), param: param.map(str::to_string), code: None }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::WrongModelType(_) => StatusCode::BAD_REQUEST,
            ApiError::Lookup(_) | ApiError::UnknownPath(_) | ApiError::NoModelLoaded | ApiError::NotLoaded { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::LoadFailed { .. } | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Rejected { why, .. } => match why {
                scheduler::Rejection::LoadFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
                scheduler::Rejection::Failed(_)
                | scheduler::Rejection::Backoff { .. }
                | scheduler::Rejection::QueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
                scheduler::Rejection::NoMemory { .. } => StatusCode::INSUFFICIENT_STORAGE,
                scheduler::Rejection::UnknownDevice { .. } => StatusCode::BAD_REQUEST,
                _ => StatusCode::CONFLICT,
            },
            ApiError::Backend { status, .. } => *status,
            ApiError::BackendUnavailable(_) | ApiError::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::UpstreamBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
        }
    }

    /// The OpenAI-style body (not used for pass-through backend errors).
    pub fn body(&self) -> ErrorResponse {
        let msg = self.to_string();
        match self {
            ApiError::BadRequest { param, code, .. } => {
                let mut e = ErrorResponse::new("invalid_request_error", msg).code(code.unwrap_or("invalid_request"));
                if let Some(p) = param {
                    e = e.param(p.clone());
                }
                e
            }
            ApiError::Lookup(LookupError::NotFound { name, .. }) => ErrorResponse::new("model_not_found", msg)
                .code("model_not_found")
                .param("model")
                .requested_model(name.clone()),
            ApiError::Lookup(LookupError::NotSupported { name, .. }) => ErrorResponse::new("model_not_supported", msg)
                .code("model_not_supported")
                .param("model")
                .requested_model(name.clone()),
            ApiError::WrongModelType(_) => {
                ErrorResponse::new("invalid_request_error", msg).code("unsupported_model_type").param("model")
            }
            ApiError::LoadFailed { model, .. } => ErrorResponse::new("model_load_error", msg)
                .code("model_load_error")
                .param("model")
                .requested_model(model.clone()),
            ApiError::Backend { .. } | ApiError::BackendUnavailable(_) => {
                ErrorResponse::new("backend_error", msg).code("backend_error")
            }
            ApiError::NoModelLoaded | ApiError::NotLoaded { .. } => {
                ErrorResponse::new("model_not_loaded", msg).code("model_not_loaded")
            }
            ApiError::Rejected { why: scheduler::Rejection::UnknownDevice { .. }, .. } => {
                ErrorResponse::new("invalid_request_error", msg).code("unknown_device").param("device")
            }
            ApiError::Rejected { model, why } => {
                ErrorResponse::new(why.code(), msg).code(why.code()).param("model").requested_model(model.clone())
            }
            ApiError::UnknownPath(path) => ErrorResponse::new("not_found", msg).code("not_found").path(path.clone()),
            ApiError::MethodNotAllowed { .. } => {
                ErrorResponse::new("invalid_request_error", msg).code("method_not_allowed")
            }
            ApiError::Unprocessable(_) => ErrorResponse::new("invalid_request_error", msg).code("validation_error"),
            ApiError::Conflict(_) => ErrorResponse::new("invalid_request_error", msg).code("conflict"),
            ApiError::NotFound(_) => ErrorResponse::new("not_found", msg).code("not_found"),
            ApiError::RateLimited(_) => ErrorResponse::new("rate_limited", msg).code("rate_limited"),
            ApiError::PayloadTooLarge { .. } => {
                ErrorResponse::new("invalid_request_error", msg).code("payload_too_large")
            }
            ApiError::Internal(_) => ErrorResponse::new("internal_error", msg).code("internal_error"),
            ApiError::UpstreamFailed(_) => ErrorResponse::new("upstream_error", msg).code("upstream_error"),
            ApiError::UpstreamTimeout(_) => ErrorResponse::new("upstream_timeout", msg).code("upstream_timeout"),
            ApiError::UpstreamBusy { .. } => ErrorResponse::new("upstream_busy", msg).code("upstream_busy"),
            ApiError::InsufficientStorage(_) => {
                ErrorResponse::new("insufficient_storage", msg).code("insufficient_storage")
            }
        }
    }
}

impl From<serde_json::Error> for ApiError {
    /// Serializing a body we built: a bug, not bad input.
    fn from(e: serde_json::Error) -> ApiError {
        ApiError::Internal(e.to_string())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        use EngineError as E;
        match e {
            E::Invalid { message, param, code } => ApiError::BadRequest { message, param, code },
            E::Unprocessable(m) => ApiError::Unprocessable(m),
            E::Lookup(l) => ApiError::Lookup(l),
            E::WrongModelType(m) => ApiError::WrongModelType(m),
            E::LoadFailed { model, message } => ApiError::LoadFailed { model, message },
            E::Rejected { model, why } => ApiError::Rejected { model, why },
            E::Conflict(m) => ApiError::Conflict(m),
            E::NotFound(m) => ApiError::NotFound(m),
            E::RateLimited(m) => ApiError::RateLimited(m),
            E::Unavailable(m) => ApiError::BackendUnavailable(m),
            E::Backend { status, body, content_type } => ApiError::Backend {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                body,
                content_type,
            },
            E::UpstreamFailed(m) => ApiError::UpstreamFailed(m),
            E::UpstreamTimeout(m) => ApiError::UpstreamTimeout(m),
            E::UpstreamBusy { message, retry_after } => ApiError::UpstreamBusy { message, retry_after },
            E::InsufficientStorage(m) => ApiError::InsufficientStorage(m),
            E::Registry(r) => registry_error(r),
            E::Host(host::HostError::Registry(r)) => registry_error(r),
            E::Host(e @ host::HostError::Io { .. }) if e.is_disk_full() => ApiError::InsufficientStorage(e.to_string()),
            E::Host(e) => ApiError::Internal(e.to_string()),
            E::Install(e) => install_error(e),
            E::InstallPlan(e) => {
                use backends::releases::InstallPlanError as P;
                let (param, code) = match &e {
                    P::UnknownRecipe(_) => ("recipe", "unknown_recipe"),
                    P::UnknownBackend { .. } => ("backend", "unknown_backend"),
                    P::NotInstallable(_) => ("backend", "backend_not_installable"),
                };
                ApiError::BadRequest { message: e.to_string(), param: Some(param.into()), code: Some(code) }
            }
            E::Scheduler(e) => ApiError::NotLoaded { message: e.to_string() },
            E::Internal(m) => ApiError::Internal(m),
        }
    }
}

fn registry_error(e: registry::RegistryError) -> ApiError {
    match e {
        registry::RegistryError::Lookup(l) => ApiError::Lookup(l),
        registry::RegistryError::Invalid(m) => ApiError::bad_request(m, Some("model")),
        e @ registry::RegistryError::Plan(_) => ApiError::bad_request(e.to_string(), Some("checkpoint")),
        e @ registry::RegistryError::Json { .. } => ApiError::Internal(e.to_string()),
    }
}

fn install_error(e: host::install::InstallError) -> ApiError {
    use host::install::InstallError as I;
    match e {
        I::NotInstalled(..) => ApiError::BadRequest {
            message: e.to_string(),
            param: Some("backend".into()),
            code: Some("backend_not_installed"),
        },
        I::Io { .. } | I::Task(_) => ApiError::Internal(e.to_string()),
        e => ApiError::BackendUnavailable(e.to_string()),
    }
}

impl ApiError {
    /// The message a client should read: a backend's own error message when it sent one.
    pub fn message(&self) -> String {
        if let ApiError::Backend { body, status, .. } = self {
            let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
            let msg = v.as_ref().and_then(|v| v["error"]["message"].as_str().or_else(|| v["error"].as_str()));
            return match msg {
                Some(m) => m.to_string(),
                None if body.iter().all(u8::is_ascii_whitespace) => no_details(*status),
                None => String::from_utf8_lossy(body).into_owned(),
            };
        }
        self.to_string()
    }

    /// Retry-After (seconds) for a rejection that says when to come back.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Rejected {
                why:
                    scheduler::Rejection::Backoff { retry_in_ms, .. } | scheduler::Rejection::QueueFull { retry_in_ms, .. },
                ..
            } => Some(retry_in_ms.div_ceil(1000).max(1)),
            ApiError::UpstreamBusy { retry_after, .. } => Some((*retry_after).max(1)),
            _ => None,
        }
    }

    fn log(&self, status: StatusCode) {
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
    }

    /// This error with `body` (OpenAI's shape or a dialect's), its status, and the headers
    /// that go with it.
    fn shaped(self, body: impl serde::Serialize) -> Response {
        let status = self.status();
        self.log(status);
        let mut resp = (status, axum::Json(body)).into_response();
        // Whole seconds, rounded up (RFC 9110).
        if let Some(secs) = self.retry_after() {
            resp.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the server closes this connection; saying
            // so keeps clients from reusing it for their next request.
            resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        resp
    }
}

/// What a backend's error answer with an empty body is reported as.
fn no_details(status: StatusCode) -> String {
    format!(
        "The backend answered {} {} with no details",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default()
    )
}

/// How a dialect writes an error's body.
pub trait ErrorShape {
    fn body(e: &ApiError) -> serde_json::Value;
}

/// An [`ApiError`] answered in dialect `S`'s shape, with the same status and Retry-After.
#[derive(Debug)]
pub struct Shaped<S>(pub ApiError, std::marker::PhantomData<S>);

impl<S> From<ApiError> for Shaped<S> {
    fn from(e: ApiError) -> Self {
        Shaped(e, std::marker::PhantomData)
    }
}

impl<S> From<EngineError> for Shaped<S> {
    fn from(e: EngineError) -> Self {
        Shaped(ApiError::from(e), std::marker::PhantomData)
    }
}

impl<S: ErrorShape> IntoResponse for Shaped<S> {
    fn into_response(self) -> Response {
        let body = S::body(&self.0);
        self.0.shaped(body)
    }
}

/// Ollama's error body: `{"error": "…"}`.
#[derive(Debug)]
pub struct Ollama;

impl ErrorShape for Ollama {
    fn body(e: &ApiError) -> serde_json::Value {
        serde_json::json!(api_types::OllamaError { error: e.message() })
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`, its type from
/// the status.
#[derive(Debug)]
pub struct Anthropic;

impl ErrorShape for Anthropic {
    fn body(e: &ApiError) -> serde_json::Value {
        let kind = match e.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        serde_json::json!(api_types::AnthropicError::new(kind, e.message()))
    }
}

pub type OllamaApiError = Shaped<Ollama>;
pub type AnthropicApiError = Shaped<Anthropic>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Backend { body, content_type, .. } = &self {
            // llama-server's errors are OpenAI's shape already and pass through; others (an
            // empty body, whisper-server's `{"error": "…"}`, plain text) are put in that shape.
            let openai_shaped =
                serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["error"]["message"].is_string());
            if openai_shaped {
                let ct = content_type.clone().unwrap_or_else(|| "application/json".into());
                return (status, [(http::header::CONTENT_TYPE, ct)], body.clone()).into_response();
            }
            let msg = self.message();
            return (status, axum::Json(ErrorResponse::new("backend_error", msg).code("backend_error")))
                .into_response();
        }
        let body = self.body();
        self.shaped(body)
    }
}
