//! The engine's one error type. It wraps the lower crates' errors as they are (registry,
//! scheduler, backends, host) and adds the application's own failures; the server turns it
//! into HTTP in exactly one place (a `From<EngineError>` impl in server/src/error.rs).

use registry::LookupError;
use scheduler::{LoadOutcome, Rejection};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Input the engine cannot act on; `param` names the field, `code` says why for machines.
    #[error("{message}")]
    Invalid { message: String, param: Option<String>, code: Option<&'static str> },
    /// Valid JSON that fails the schema, or names nothing known (a 422).
    #[error("{0}")]
    Unprocessable(String),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The model exists but cannot serve this endpoint (chat to an embedding model).
    #[error("{0}")]
    WrongModelType(String),
    /// The model could not be loaded.
    #[error("Failed to load model '{model}': {message}")]
    LoadFailed { model: String, message: String },
    /// The lifecycle did not admit the request (the model's state forbids it).
    #[error("{}", rejection_message(model, why))]
    Rejected { model: String, why: Rejection },
    /// The model's state forbids the operation now.
    #[error("{0}")]
    Conflict(String),
    /// An upstream (the Hub) asked us to slow down (a 429).
    #[error("{0}")]
    RateLimited(String),
    /// A thing other than a model (an alias, …) that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A backend or a download could not be reached, or died.
    #[error("{0}")]
    Unavailable(String),
    /// The backend's own error answer, passed on as it came.
    #[error("The backend answered {status}: {}", String::from_utf8_lossy(body))]
    Backend { status: u16, body: bytes::Bytes, content_type: Option<String> },
    /// A remote provider failed: refused, unreachable, a 5xx, or a refused key.
    #[error("{0}")]
    UpstreamFailed(String),
    /// A remote provider gave no answer within `--remote-timeout`.
    #[error("{0}")]
    UpstreamTimeout(String),
    /// A remote upstream cannot take the request now (its own backpressure, its circuit
    /// breaker open, or its in-flight bound reached): a 503 with `Retry-After` (seconds).
    #[error("{message}")]
    UpstreamBusy { message: String, retry_after: u64 },
    /// The disk is full (a download).
    #[error("{0}")]
    InsufficientStorage(String),
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error(transparent)]
    Host(#[from] host::HostError),
    #[error(transparent)]
    Install(#[from] host::install::InstallError),
    #[error(transparent)]
    InstallPlan(#[from] backends::releases::InstallPlanError),
    #[error(transparent)]
    Scheduler(#[from] scheduler::SchedulerError),
    /// A bug or an impossible state, said plainly.
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// What a caller composing model calls (a tool, a classifier) is told: the backend's own
    /// message when it answered an error, else this error's.
    pub fn told(&self) -> String {
        let EngineError::Backend { body, .. } = self else { return self.to_string() };
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let message = v["error"]["message"].as_str().or(v["error"].as_str()).map(str::to_string);
        message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
    }

    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> EngineError {
        EngineError::Invalid { message: message.into(), param: param.map(str::to_string), code: None }
    }

    /// [`EngineError::invalid`] with a machine-readable code.
    pub fn invalid_code(message: impl Into<String>, param: &str, code: &'static str) -> EngineError {
        EngineError::Invalid { message: message.into(), param: Some(param.to_string()), code: Some(code) }
    }

    /// A registered model whose files are not (all) in the cache.
    pub fn not_downloaded(name: &str) -> EngineError {
        EngineError::invalid_code(
            format!("Model '{name}' is not downloaded. Pull it first: lemonade pull {name}"),
            "model",
            "model_not_downloaded",
        )
    }

    /// A load's outcome: Ok when loaded, a conflict when an unload cancelled it, else why not.
    pub fn from_load(model: &str, outcome: LoadOutcome) -> Result<()> {
        match outcome {
            LoadOutcome::Loaded => Ok(()),
            LoadOutcome::Cancelled => {
                Err(EngineError::Conflict(format!("Model '{model}' was unloaded while it was loading")))
            }
            LoadOutcome::Failed(message) => Err(EngineError::LoadFailed { model: model.to_string(), message }),
            LoadOutcome::Refused(why) => Err(EngineError::Rejected { model: model.to_string(), why }),
        }
    }
}

/// What a client reads for a rejection.
pub fn rejection_message(model: &str, why: &Rejection) -> String {
    use scheduler::Rejection::*;
    match why {
        NotLoaded => format!("Model '{model}' is not loaded (auto-load is off): load it first with POST /api/v1/load"),
        Loading => format!("Model '{model}' is loading; retry when it is loaded"),
        Unloading => format!("Model '{model}' is unloading"),
        Failed(e) => format!("Model '{model}' failed: {e}"),
        LoadFailed(e) => format!("Failed to load model '{model}': {e}"),
        Backoff { error, retry_in_ms } => format!(
            "Model '{model}' keeps failing and is backing off: it loads again in {:.1} s: {error}",
            *retry_in_ms as f64 / 1000.0
        ),
        SlotsPinned(pinned) => format!(
            "Cannot load model '{model}': every slot it could take is held by pinned models ({}). Unpin one \
             (POST /api/v1/pin with \"pinned\": false, or `lemonade unpin`) or unload it first.",
            pinned.join(", ")
        ),
        NoMemory { device: Some(d), needed, budget, pinned, .. } => format!(
            "Cannot load model '{model}': it needs an estimated {} on {d} but {d} has {} for models{}. Place it \
             on another device or several (the 'device' load option: auto, or ids such as gpu0,gpu1), lower \
             ctx_size, or use a smaller model.",
            bytes(*needed),
            bytes(*budget),
            if *pinned > 0 { format!(", of which pinned models hold {}", bytes(*pinned)) } else { String::new() },
        ),
        UnknownDevice { device, known } => format!(
            "Invalid value for 'device': there is no device '{device}' here; the devices are {} (see \
             /api/v1/system-info's compute_devices), or 'auto'",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ),
        NoMemory { pool, device: None, needed, budget, pinned } => format!(
            "Cannot load model '{model}': it needs an estimated {} of {} but the {} budget is {}{}. Raise \
             --{}-budget, lower ctx_size, or use a smaller model{}.",
            bytes(*needed),
            pool.as_str(),
            pool.as_str(),
            bytes(*budget),
            if *pinned > 0 { format!(", of which pinned models hold {}", bytes(*pinned)) } else { String::new() },
            pool.as_str().to_ascii_lowercase(),
            if *pool == scheduler::Pool::Vram { " (or the cpu backend)" } else { "" }
        ),
        InUse(state) => format!("Model '{model}' is {}: unload it before loading with overrides", state.as_str()),
        QueueFull { max_queue, retry_in_ms } => format!(
            "Too many requests are waiting for models ({max_queue}, the --max-queue bound); retry in {} s",
            retry_in_ms.div_ceil(1000)
        ),
    }
}

/// `1.23 GiB` / `456.0 MiB`.
pub fn bytes(n: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let mib = n as f64 / MIB;
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}
