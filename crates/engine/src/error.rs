//! The engine's one error type. Each variant says what happened, with typed fields, and no
//! HTTP words: the server maps every variant to a status, a type and a code in one table
//! (server/src/error.rs) and adds the advice a client of its dialects reads. It wraps the
//! lower crates' errors as they are (registry, scheduler, backends, host).

use registry::LookupError;
use scheduler::{LoadOutcome, Rejection};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request field the engine cannot act on; `param` names it, `code` says why for machines.
    #[error("{message}")]
    Invalid { message: String, param: Option<String>, code: Option<&'static str> },
    /// An admin load request whose fields fail its schema (an unknown field, a value out of
    /// range).
    #[error("{0}")]
    LoadSchema(String),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// A registered model whose files are not (all) in the cache.
    #[error("Model '{model}' is not downloaded")]
    NotDownloaded { model: String },
    /// The model exists but serves other requests than `wants` (an endpoint's name).
    #[error("{}", wrong_type(model, is, wants))]
    WrongModelType { model: String, is: Serves, wants: String },
    /// The model's backend could not be started or did not become healthy.
    #[error("Failed to load model '{model}': {message}")]
    LoadFailed { model: String, message: String },
    /// The lifecycle did not admit the request (the model's state forbids it).
    #[error("{}", rejection_message(model, why))]
    Rejected { model: String, why: Rejection },
    /// An unload cancelled this load.
    #[error("Model '{model}' was unloaded while it was loading")]
    LoadCancelled { model: String },
    /// A load asked of a model that is being unloaded.
    #[error("Model '{model}' is unloading; load it again once it is unloaded")]
    StillUnloading { model: String },
    /// An unload or pin of a model that is not loaded.
    #[error(transparent)]
    NotLoaded(#[from] scheduler::SchedulerError),
    /// A key given for a provider whose key variable is set in the process, which wins.
    #[error(
        "{variable} is set in the lemonade process; the env var takes precedence and the supplied API key was not stored."
    )]
    KeyFromEnvironment { variable: String },
    /// A request to a v11 cloud provider that has no key (neither given nor in the
    /// environment).
    #[error(
        "No API key for cloud provider '{provider}'. Set the {variable} env var or POST /api/v1/cloud/auth with {{\"provider\": \"{provider}\", \"api_key\": \"...\"}}."
    )]
    NoKey { provider: String, variable: String },
    /// A thing other than a model that does not exist.
    #[error("{}", missing(what, name))]
    Missing { what: Thing, name: String },
    /// A model's backend process exited, or failed, under the request.
    #[error("{0}")]
    BackendLost(BackendLoss),
    /// A backend (or a planner model) answered something the engine cannot use.
    #[error("{what}")]
    BadAnswer { what: String },
    /// The backend's own error answer, passed on as it came.
    #[error("The backend answered {status}: {}", String::from_utf8_lossy(body))]
    Backend { status: u16, body: bytes::Bytes, content_type: Option<String> },
    /// A remote provider failed or cannot take the request now.
    #[error("Upstream '{provider}' ({base}) {failure}")]
    Upstream { provider: String, base: String, failure: UpstreamFailure },
    /// The Hugging Face Hub failed a download or a search.
    #[error("{0}")]
    Hub(HubFailure),
    /// `offline` is set and `action` needs the network.
    #[error("lemonade is offline (the `offline` setting is true): {action} needs the network. Set offline to false (`lemonade config set offline=false` or POST /internal/set) to allow it")]
    Offline { action: &'static str },
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error(transparent)]
    Host(#[from] host::HostError),
    #[error(transparent)]
    Install(#[from] host::install::InstallError),
    #[error(transparent)]
    InstallPlan(#[from] backends::releases::InstallPlanError),
    /// A bug or an impossible state, said plainly.
    #[error("{0}")]
    Internal(String),
}

/// What a model named for the wrong endpoint is.
#[derive(Debug, Clone, PartialEq)]
pub enum Serves {
    /// A local model of this type; the endpoint takes the `accepted` types.
    Type { is: api_types::ModelType, accepted: Vec<api_types::ModelType> },
    /// An omni collection: chat completions only.
    OmniCollection,
    /// A router collection: the chat-shaped endpoints.
    RouterCollection,
    /// A model of a remote provider: the endpoints forwarded to remote providers.
    Remote { provider: String },
}

fn wrong_type(model: &str, is: &Serves, wants: &str) -> String {
    // "an LLM", "an audio model", "a TTS model": the article as the name is read.
    use api_types::ModelType as T;
    let a = |t: T| match t {
        T::Llm | T::Embedding | T::Audio | T::Image => "an",
        T::Reranking | T::Tts => "a",
    };
    match is {
        Serves::Type { is, accepted } => format!(
            "Model '{model}' is {} {} model; {wants} needs {} model.",
            a(*is),
            is.as_str(),
            accepted.iter().map(|&t| format!("{} {}", a(t), t.as_str())).collect::<Vec<_>>().join(" or "),
        ),
        Serves::OmniCollection => {
            format!("Model '{model}' is an omni collection: it answers chat completions only, not {wants}")
        }
        Serves::RouterCollection => format!(
            "Model '{model}' is a router collection: it answers chat, completions, responses, Ollama chat and generate and Anthropic messages, not {wants}"
        ),
        Serves::Remote { provider } => format!(
            "Model '{model}' is on remote provider '{provider}'; {wants} is not forwarded to remote providers (chat, completions, responses, embeddings, reranking and the llama.cpp endpoints are)."
        ),
    }
}

/// A kind of thing the engine looks up by name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Thing {
    DownloadJob,
    Provider,
    Alias,
    HubRepository,
}

fn missing(what: &Thing, name: &str) -> String {
    match what {
        Thing::DownloadJob => format!("No download job '{name}'"),
        Thing::Provider => format!("Cloud provider '{name}' is not installed"),
        Thing::Alias => format!("Alias '{name}' does not exist"),
        Thing::HubRepository => format!("Repository '{name}' was not found on Hugging Face"),
    }
}

/// How a backend was lost under a request.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendLoss {
    /// Granted a backend that had just exited (the model, when known).
    ExitedJustNow { model: Option<String> },
    /// It exited during the request; `wedged` when the health checks killed it.
    Exited { model: String, exit: String, wedged: bool, log_tail: String },
    /// The connection to it failed while it kept running.
    Failed { model: String, error: String },
    /// It sent nothing of a streamed answer for `secs` (the low-transfer timeout).
    Stalled { model: String, secs: u64 },
}

impl std::fmt::Display for BackendLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendLoss::ExitedJustNow { model: None } => write!(f, "The model's backend exited just now"),
            BackendLoss::ExitedJustNow { model: Some(m) } => write!(f, "The backend of model '{m}' exited just now"),
            BackendLoss::Exited { model, exit, wedged: true, log_tail } => write!(
                f,
                "The backend of model '{model}' stopped answering its health checks during the request and was killed ({exit}). Last log lines:\n{log_tail}"
            ),
            BackendLoss::Exited { model, exit, wedged: false, log_tail } => write!(
                f,
                "The backend of model '{model}' exited ({exit}) during the request. Last log lines:\n{log_tail}"
            ),
            BackendLoss::Failed { model, error } => write!(f, "Backend of model '{model}' failed: {error}"),
            BackendLoss::Stalled { model, secs } => write!(
                f,
                "The backend of model '{model}' sent nothing for {secs} s (the stream_timeout setting); the stream was cut"
            ),
        }
    }
}

/// How a remote provider failed, or why it cannot take a request now.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamFailure {
    /// Its last probe failed and it does not list the model.
    Down { why: String },
    /// The transport failed (refused, reset, TLS, …).
    Failed { why: String },
    /// It answered a 5xx, or refused our key (401/403).
    Answered { status: String, excerpt: String, key_refused: bool },
    /// No answer within the remote timeout.
    TimedOut { secs: f64 },
    /// Its circuit breaker is open (`wait_ms` 0: a probe request is testing it).
    BreakerOpen { wait_ms: u64 },
    /// It has `max` requests in flight, its bound.
    AtBound { max: u32 },
    /// It answered asking to be retried after `retry_after` s.
    Busy { status: String, retry_after: u64 },
}

impl UpstreamFailure {
    /// Seconds a client should wait before trying again, for the failures that say so.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            UpstreamFailure::BreakerOpen { wait_ms } => Some(wait_ms.div_ceil(1000).max(1)),
            UpstreamFailure::AtBound { .. } => Some(1),
            UpstreamFailure::Busy { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl std::fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamFailure::Down { why } => write!(f, "is down: {why}"),
            UpstreamFailure::Failed { why } => write!(f, "failed: {why}"),
            UpstreamFailure::Answered { status, excerpt, .. } => write!(f, "answered {status}: {excerpt}"),
            UpstreamFailure::TimedOut { secs } => write!(f, "did not answer within {secs} s"),
            UpstreamFailure::BreakerOpen { wait_ms: 0 } => {
                write!(f, "is failing: its circuit breaker is open (a probe request is testing it)")
            }
            UpstreamFailure::BreakerOpen { wait_ms } => {
                write!(f, "is failing: its circuit breaker is open (retry in {wait_ms} ms)")
            }
            UpstreamFailure::AtBound { max } => {
                write!(f, "has {max} requests in flight, its bound (max_in_flight)")
            }
            UpstreamFailure::Busy { status, retry_after } => {
                write!(f, "is busy: it answered {status} asking to retry after {retry_after} s")
            }
        }
    }
}

/// How the Hugging Face Hub failed.
#[derive(Debug, Clone, PartialEq)]
pub enum HubFailure {
    /// A download failed; the partial download is kept.
    Download { error: String },
    /// The disk filled during a download.
    DiskFull { error: String },
    /// A pull before a load took longer than its bound.
    PullTimedOut { model: String, secs: u64 },
    /// A repository's file list could not be read.
    Listing { repo: String, error: String },
    /// The Hub rate-limited a search.
    SearchRateLimited,
    /// The Hub answered a search with an error status.
    SearchAnswered { status: u16 },
    /// A search could not reach the Hub.
    Search { error: String },
}

impl std::fmt::Display for HubFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubFailure::Download { error } => write!(f, "Download failed: {error}"),
            HubFailure::DiskFull { error } => write!(
                f,
                "Download failed: {error}. Free some space and pull again: the partial download is kept and resumes"
            ),
            HubFailure::PullTimedOut { model, secs } => {
                write!(f, "Pulling '{model}' took longer than {secs} s; the partial download is kept")
            }
            HubFailure::Listing { repo, error } => write!(f, "Cannot list '{repo}': {error}"),
            HubFailure::SearchRateLimited => write!(f, "Hugging Face rate-limited the search; try again later"),
            HubFailure::SearchAnswered { status } => write!(f, "Hugging Face answered the search with {status}"),
            HubFailure::Search { error } => write!(f, "Hugging Face search failed: {error}"),
        }
    }
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

    /// A load's outcome: Ok when loaded, else why not.
    pub fn from_load(model: &str, outcome: LoadOutcome) -> Result<()> {
        match outcome {
            LoadOutcome::Loaded => Ok(()),
            LoadOutcome::Cancelled => Err(EngineError::LoadCancelled { model: model.to_string() }),
            LoadOutcome::Failed(message) => Err(EngineError::LoadFailed { model: model.to_string(), message }),
            LoadOutcome::Refused(why) => Err(EngineError::Rejected { model: model.to_string(), why }),
        }
    }
}

/// What a refusal means, in words that name no route and no flag (the server's answers add
/// what a client can do: `server::error::rejection_words`).
pub fn rejection_message(model: &str, why: &Rejection) -> String {
    use scheduler::Rejection::*;
    let pinned_part = |pinned: u64| match pinned {
        0 => String::new(),
        p => format!(", of which pinned models hold {}", bytes(p)),
    };
    match why {
        NotLoaded => format!("Model '{model}' is not loaded (auto-load is off)"),
        Loading => format!("Model '{model}' is loading; retry when it is loaded"),
        Unloading => format!("Model '{model}' is unloading"),
        Failed(e) => format!("Model '{model}' failed: {e}"),
        LoadFailed(e) => format!("Failed to load model '{model}': {e}"),
        Backoff { error, retry_in_ms } => format!(
            "Model '{model}' keeps failing and is backing off: it loads again in {:.1} s: {error}",
            *retry_in_ms as f64 / 1000.0
        ),
        SlotsPinned(pinned) => format!(
            "Cannot load model '{model}': every slot it could take is held by pinned models ({}).",
            pinned.join(", ")
        ),
        NoMemory { device: Some(d), needed, budget, pinned, .. } => format!(
            "Cannot load model '{model}': it needs an estimated {} on {d} but {d} has {} for models{}. Place it \
             on another device or several (the 'device' load option: auto, or ids such as gpu0,gpu1), lower \
             ctx_size, or use a smaller model.",
            bytes(*needed),
            bytes(*budget),
            pinned_part(*pinned),
        ),
        UnknownDevice { device, known } => format!(
            "Invalid value for 'device': there is no device '{device}' here; the devices are {}, or 'auto'",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ),
        NoMemory { pool, device: None, needed, budget, pinned } => format!(
            "Cannot load model '{model}': it needs an estimated {} of {} but the {} budget is {}{}.",
            bytes(*needed),
            pool.as_str(),
            pool.as_str(),
            bytes(*budget),
            pinned_part(*pinned),
        ),
        InUse(state) => format!("Model '{model}' is {}: unload it before loading with overrides", state.as_str()),
        QueueFull { max_queue, retry_in_ms } => {
            format!("Too many requests are waiting for models ({max_queue}); retry in {} s", retry_in_ms.div_ceil(1000))
        }
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
