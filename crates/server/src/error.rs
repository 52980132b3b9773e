//! One error type for the HTTP layer: the engine's errors (by cause) plus the HTTP layer's own
//! (a body it cannot parse, an unknown path). [`table`] is the one place any of them becomes a
//! status, a type and a code; [`advice`] adds what a client of this server can do about it.

use api_types::ErrorResponse;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use engine::error::{HubFailure, UpstreamFailure};
use engine::EngineError;
use registry::LookupError;
use scheduler::Rejection;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// What the engine says happened; [`row`] maps each cause to HTTP.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A request the HTTP layer cannot parse; `param` names the offending field.
    #[error("{message}")]
    BadRequest { message: String, param: Option<String>, code: Option<&'static str> },
    /// The body is valid JSON but fails the schema (admin API).
    #[error("{0}")]
    Unprocessable(String),
    #[error("The requested endpoint does not exist")]
    UnknownPath(String),
    #[error("Method Not Allowed. Use {allowed} for this endpoint")]
    MethodNotAllowed { allowed: String },
    #[error("Request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    Internal(String),
}

/// One row of the table: the status, the error's `type` and `code`, and the request field it
/// names (`param`) and the model it is about (`requested_model`), where it has them.
struct Row {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    param: Option<String>,
    model: Option<String>,
}

fn row(status: StatusCode, kind: &'static str, code: &'static str) -> Row {
    Row { status, kind, code, param: None, model: None }
}

impl Row {
    fn param(mut self, p: impl Into<String>) -> Row {
        self.param = Some(p.into());
        self
    }
    fn model(mut self, m: &str) -> Row {
        self.model = Some(m.to_string());
        self.param("model")
    }
}

/// The one table: every error, the engine's by cause, to its status, type and code.
fn table(e: &ApiError) -> Row {
    use EngineError as E;
    use StatusCode as S;
    let invalid = |param: &Option<String>, code: &Option<&'static str>| {
        let r = row(S::BAD_REQUEST, "invalid_request_error", code.unwrap_or("invalid_request"));
        match param {
            Some(p) => r.param(p.clone()),
            None => r,
        }
    };
    let internal = || row(S::INTERNAL_SERVER_ERROR, "internal_error", "internal_error");
    let backend = || row(S::BAD_GATEWAY, "backend_error", "backend_error");
    let e = match e {
        ApiError::Engine(e) => e,
        ApiError::BadRequest { param, code, .. } => return invalid(param, code),
        ApiError::Unprocessable(_) => return row(S::UNPROCESSABLE_ENTITY, "invalid_request_error", "validation_error"),
        ApiError::UnknownPath(_) => return row(S::NOT_FOUND, "not_found", "not_found"),
        ApiError::MethodNotAllowed { .. } => {
            return row(S::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed")
        }
        ApiError::PayloadTooLarge { .. } => {
            return row(S::PAYLOAD_TOO_LARGE, "invalid_request_error", "payload_too_large")
        }
        ApiError::Internal(_) => return internal(),
    };
    let lookup = |l: &LookupError| match l {
        LookupError::NotFound { name, .. } => row(S::NOT_FOUND, "model_not_found", "model_not_found").model(name),
        LookupError::NotSupported { name, .. } => {
            row(S::NOT_FOUND, "model_not_supported", "model_not_supported").model(name)
        }
    };
    let registry = |r: &registry::RegistryError| match r {
        registry::RegistryError::Lookup(l) => lookup(l),
        registry::RegistryError::Invalid(_) => invalid(&Some("model".into()), &None),
        registry::RegistryError::Plan(_) => invalid(&Some("checkpoint".into()), &None),
        registry::RegistryError::Json { .. } => internal(),
    };
    match e {
        E::Invalid { param, code, .. } => invalid(param, code),
        E::LoadSchema(_) => row(S::UNPROCESSABLE_ENTITY, "invalid_request_error", "validation_error"),
        E::Lookup(l) => lookup(l),
        E::NotDownloaded { .. } => invalid(&Some("model".into()), &Some("model_not_downloaded")),
        E::WrongModelType { .. } => {
            row(S::BAD_REQUEST, "invalid_request_error", "unsupported_model_type").param("model")
        }
        E::LoadFailed { model, .. } => {
            row(S::INTERNAL_SERVER_ERROR, "model_load_error", "model_load_error").model(model)
        }
        E::Rejected { why: Rejection::UnknownDevice { .. }, .. } => {
            row(S::BAD_REQUEST, "invalid_request_error", "unknown_device").param("device")
        }
        E::Rejected { model, why } => {
            let status = match why {
                Rejection::LoadFailed(_) => S::INTERNAL_SERVER_ERROR,
                Rejection::Failed(_) | Rejection::Backoff { .. } | Rejection::QueueFull { .. } => {
                    S::SERVICE_UNAVAILABLE
                }
                Rejection::NoMemory { .. } => S::INSUFFICIENT_STORAGE,
                _ => S::CONFLICT,
            };
            row(status, why.code(), why.code()).model(model)
        }
        E::LoadCancelled { .. } | E::StillUnloading { .. } | E::KeyFromEnvironment { .. } => {
            row(S::CONFLICT, "invalid_request_error", "conflict")
        }
        E::NotLoaded(_) => row(S::NOT_FOUND, "model_not_loaded", "model_not_loaded"),
        // The server lacks what the provider needs; a client (or an operator) gives it a key.
        E::NoKey { .. } => row(S::SERVICE_UNAVAILABLE, "authentication_error", "missing_credentials"),
        // OpenAI's type for a missing resource (as v11 answers an unknown provider).
        E::Missing { .. } => row(S::NOT_FOUND, "invalid_request_error", "not_found"),
        E::BackendLost(_) | E::BadAnswer { .. } => backend(),
        E::Backend { status, .. } => Row { status: S::from_u16(*status).unwrap_or(S::BAD_GATEWAY), ..backend() },
        E::Upstream { failure, .. } => match failure {
            UpstreamFailure::TimedOut { .. } => row(S::GATEWAY_TIMEOUT, "upstream_timeout", "upstream_timeout"),
            f if f.retry_after().is_some() => row(S::SERVICE_UNAVAILABLE, "upstream_busy", "upstream_busy"),
            _ => row(S::BAD_GATEWAY, "upstream_error", "upstream_error"),
        },
        E::Offline { .. } => row(S::BAD_REQUEST, "offline", "offline").param("offline"),
        E::Hub(h) => match h {
            HubFailure::Download { .. } | HubFailure::PullTimedOut { .. } => backend(),
            HubFailure::DiskFull { .. } => row(S::INSUFFICIENT_STORAGE, "insufficient_storage", "insufficient_storage"),
            HubFailure::Listing { .. } => internal(),
            HubFailure::SearchRateLimited => row(S::TOO_MANY_REQUESTS, "rate_limited", "rate_limited"),
            HubFailure::SearchAnswered { .. } | HubFailure::Search { .. } => {
                row(S::BAD_GATEWAY, "upstream_error", "upstream_error")
            }
        },
        E::Registry(r) | E::Host(host::HostError::Registry(r)) => registry(r),
        E::Host(e @ host::HostError::Io { .. }) if e.is_disk_full() => {
            row(S::INSUFFICIENT_STORAGE, "insufficient_storage", "insufficient_storage")
        }
        E::Host(_) => internal(),
        E::Install(host::install::InstallError::NotInstalled(..)) => {
            invalid(&Some("backend".into()), &Some("backend_not_installed"))
        }
        E::Install(host::install::InstallError::Offline(_)) => {
            row(S::BAD_REQUEST, "offline", "offline").param("offline")
        }
        E::Install(host::install::InstallError::Io { .. } | host::install::InstallError::Task(_)) => internal(),
        E::Install(_) => backend(),
        E::InstallPlan(p) => {
            use backends::releases::InstallPlanError as P;
            let (param, code) = match p {
                P::UnknownRecipe(_) => ("recipe", "unknown_recipe"),
                P::UnknownBackend { .. } => ("backend", "unknown_backend"),
                P::NotInstallable(_) => ("backend", "backend_not_installable"),
            };
            invalid(&Some(param.into()), &Some(code))
        }
        E::Internal(_) => internal(),
    }
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError::BadRequest { message: message.into(), param: param.map(str::to_string), code: None }
    }

    pub fn status(&self) -> StatusCode {
        table(self).status
    }

    /// The OpenAI-style body (not used for pass-through backend errors).
    pub fn body(&self) -> ErrorResponse {
        let Row { kind, code, param, model, .. } = table(self);
        let mut e = ErrorResponse::new(kind, self.message()).code(code);
        if let Some(p) = param {
            e = e.param(p);
        }
        if let Some(m) = model {
            e = e.requested_model(m);
        }
        if let ApiError::UnknownPath(path) = self {
            e = e.path(path.clone());
        }
        e
    }
}

impl From<api_types::form::BadField> for ApiError {
    fn from(e: api_types::form::BadField) -> ApiError {
        ApiError::BadRequest { message: e.message, param: Some(e.field), code: None }
    }
}

impl From<serde_json::Error> for ApiError {
    /// Serializing a body we built: a bug, not bad input.
    fn from(e: serde_json::Error) -> ApiError {
        ApiError::Internal(e.to_string())
    }
}

/// The advice a client of this server reads after what happened: the command or the route
/// that helps, where one does.
fn advice(e: &EngineError) -> Option<String> {
    use EngineError as E;
    Some(match e {
        E::NotDownloaded { model } => {
            format!("Model '{model}' is not downloaded. Pull it first: lemonade pull {model}")
        }
        E::WrongModelType { model, is: engine::error::Serves::OmniCollection, wants } => {
            format!("Model '{model}' is an omni collection: it answers /v1/chat/completions only, not {wants}")
        }
        E::Upstream { failure: UpstreamFailure::TimedOut { .. }, .. } => format!("{e} (--remote-timeout)"),
        E::Upstream { provider, base, failure: UpstreamFailure::Answered { status, excerpt, key_refused: true } } => {
            format!(
                "Upstream '{provider}' ({base}) answered {status} (its API key: `lemonade cloud auth {provider}` or {}): {excerpt}",
                backends::cloud::key_variable(provider)
            )
        }
        E::Rejected { model, why } => rejection_words(model, why),
        _ => return None,
    })
}

/// A refusal as a client of this server reads it: what happened (the engine's words) and,
/// where one helps, the route, command or flag that does something about it.
pub fn rejection_words(model: &str, why: &Rejection) -> String {
    let what = engine::error::rejection_message(model, why);
    match why {
        Rejection::NotLoaded => format!("{what}: load it first with POST /api/v1/load"),
        Rejection::SlotsPinned(_) => {
            format!(
                "{what} Unpin one (POST /api/v1/pin with \"pinned\": false, or `lemonade unpin`) or unload it first."
            )
        }
        Rejection::UnknownDevice { device, known } => format!(
            "Invalid value for 'device': there is no device '{device}' here; the devices are {} (see \
             /api/v1/system-info's compute_devices), or 'auto'",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ),
        Rejection::NoMemory { pool, device: None, .. } => format!(
            "{what} Raise --{}-budget, lower ctx_size, or use a smaller model{}.",
            pool.as_str().to_ascii_lowercase(),
            if *pool == scheduler::Pool::Vram { " (or the cpu backend)" } else { "" }
        ),
        Rejection::QueueFull { max_queue, retry_in_ms } => format!(
            "Too many requests are waiting for models ({max_queue}, the --max-queue bound); retry in {} s",
            retry_in_ms.div_ceil(1000)
        ),
        _ => what,
    }
}

impl ApiError {
    /// The message a client should read: a backend's own error message when it sent one.
    pub fn message(&self) -> String {
        match self {
            ApiError::Engine(EngineError::Backend { body, status, .. }) if body.iter().all(u8::is_ascii_whitespace) => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY);
                let reason = status.canonical_reason().unwrap_or_default();
                format!("The backend answered {} {reason} with no details", status.as_u16())
            }
            ApiError::Engine(e @ EngineError::Backend { .. }) => e.told(),
            ApiError::Engine(e) => advice(e).unwrap_or_else(|| e.to_string()),
            e => e.to_string(),
        }
    }

    /// Retry-After (seconds) for a rejection that says when to come back.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Engine(EngineError::Rejected {
                why: Rejection::Backoff { retry_in_ms, .. } | Rejection::QueueFull { retry_in_ms, .. },
                ..
            }) => Some(retry_in_ms.div_ceil(1000).max(1)),
            ApiError::Engine(EngineError::Upstream { failure, .. }) => failure.retry_after().map(|s| s.max(1)),
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
        let kind = dialects::anthropic::error_type(e.status().as_u16());
        serde_json::json!(api_types::AnthropicError::new(kind, e.message()))
    }
}

/// Lemonade v11's management routes' error body (`/pull`'s registrations, `/pull/variants`,
/// `/registry/search`, `/routing/validate`): `{"error": "…"}`, which v11's own clients read
/// as a string, with lemonade's `type`, `code` and `param` beside it for machines.
#[derive(Debug)]
pub struct Lemonade11;

impl ErrorShape for Lemonade11 {
    fn body(e: &ApiError) -> serde_json::Value {
        let o = e.body().error;
        serde_json::json!(api_types::LemonadeError { error: o.message, kind: o.kind, code: o.code, param: o.param })
    }
}

pub type OllamaApiError = Shaped<Ollama>;
/// An error of a v11 management route ([`Lemonade11`]).
pub type V11ApiError = Shaped<Lemonade11>;
pub type AnthropicApiError = Shaped<Anthropic>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Engine(EngineError::Backend { body, content_type, .. }) = &self {
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

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler::{Pool, State};

    fn every_rejection() -> Vec<Rejection> {
        vec![
            Rejection::NotLoaded,
            Rejection::Loading,
            Rejection::Unloading,
            Rejection::Failed("exit 1".into()),
            Rejection::LoadFailed("exit 1".into()),
            Rejection::Backoff { error: "exit 1".into(), retry_in_ms: 1500 },
            Rejection::SlotsPinned(vec!["a".into(), "b".into()]),
            Rejection::NoMemory { pool: Pool::Vram, device: None, needed: 3 << 30, budget: 1 << 30, pinned: 0 },
            Rejection::NoMemory {
                pool: Pool::Memory,
                device: Some("gpu0".into()),
                needed: 3 << 30,
                budget: 1 << 30,
                pinned: 1 << 20,
            },
            Rejection::InUse(State::Loaded),
            Rejection::QueueFull { max_queue: 4, retry_in_ms: 1200 },
            Rejection::UnknownDevice { device: "gpu9".into(), known: vec!["cpu".into(), "gpu0".into()] },
        ]
    }

    /// The engine says what happened, with no route and no flag; the server's words add them,
    /// and are the sentences clients have always read.
    #[test]
    fn a_refusal_is_the_engines_words_plus_what_a_client_can_do() {
        for why in every_rejection() {
            let what = engine::error::rejection_message("m", &why);
            assert!(!what.contains("/api/") && !what.contains(" --") && !what.contains('`'), "{what}");
        }
        let said = |why: Rejection| rejection_words("m", &why);
        assert_eq!(
            said(Rejection::NotLoaded),
            "Model 'm' is not loaded (auto-load is off): load it first with POST /api/v1/load"
        );
        assert_eq!(
            said(Rejection::SlotsPinned(vec!["a".into(), "b".into()])),
            "Cannot load model 'm': every slot it could take is held by pinned models (a, b). Unpin one (POST \
             /api/v1/pin with \"pinned\": false, or `lemonade unpin`) or unload it first."
        );
        assert_eq!(
            said(Rejection::NoMemory { pool: Pool::Vram, device: None, needed: 3 << 30, budget: 1 << 30, pinned: 0 }),
            "Cannot load model 'm': it needs an estimated 3.00 GiB of VRAM but the VRAM budget is 1.00 GiB. Raise \
             --vram-budget, lower ctx_size, or use a smaller model (or the cpu backend)."
        );
        assert_eq!(
            said(Rejection::QueueFull { max_queue: 4, retry_in_ms: 1200 }),
            "Too many requests are waiting for models (4, the --max-queue bound); retry in 2 s"
        );
        assert_eq!(
            said(Rejection::UnknownDevice { device: "gpu9".into(), known: vec!["cpu".into(), "gpu0".into()] }),
            "Invalid value for 'device': there is no device 'gpu9' here; the devices are cpu, gpu0 (see \
             /api/v1/system-info's compute_devices), or 'auto'"
        );
        assert_eq!(said(Rejection::Unloading), "Model 'm' is unloading", "the rest are the engine's words");
        // An error answer reads the same words.
        let e = ApiError::from(EngineError::Rejected { model: "m".into(), why: Rejection::NotLoaded });
        assert_eq!(e.message(), said(Rejection::NotLoaded));
    }
}
