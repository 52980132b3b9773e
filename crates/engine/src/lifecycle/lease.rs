//! What a request holds while a backend serves it: the [`Lease`] (its drop releases the model),
//! where it forwards to ([`Target`]), and the guard that cancels an abandoned wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use backends::Recipe;
use scheduler::{Event, ReqId};

use super::views::Running;
use super::Lifecycle;
use crate::error::{BackendLoss, EngineError};
use crate::metrics::Metrics;

/// Why a single ask for a model gave no lease.
pub(super) enum Acquired {
    Refused(EngineError),
    /// Granted a backend whose process had already exited (None: already unregistered, its
    /// exit sent to the owner).
    Died(Option<Arc<Running>>),
}
pub(super) use Acquired::Died;

impl Acquired {
    pub(super) fn into_error(self) -> EngineError {
        match self {
            Acquired::Refused(e) => e,
            Died(_) => EngineError::BackendLost(BackendLoss::ExitedJustNow { model: None }),
        }
    }
}

/// Keeps a model in use while a request runs. Dropping it releases the model.
pub struct Lease {
    pub target: Target,
    pub(super) rt: Arc<Lifecycle>,
    /// When the request asked for the model, and how long it waited for it.
    pub asked: Instant,
    pub waited: Duration,
    /// Whether this lease's stream counts as streaming (see [`Lease::streaming`]).
    pub(super) streaming: bool,
    /// Where spillover sent the request, and why (the `x-lemonade-upstream` header).
    pub spilled: Option<String>,
    /// The headers the request carries on to its backend (trace context, session).
    pub forwarded: Forwarded,
}

/// The headers a request carries on to whatever serves it (W3C trace context, the session
/// header), as (lower-case name, value), in the order they are sent.
pub type Forwarded = Arc<Vec<(String, String)>>;

/// What a lease forwards to.
pub enum Target {
    /// A backend process of this machine, held through the scheduler.
    Local { model: Arc<Running>, req: ReqId },
    /// A remote provider's model: no slot, nothing to release.
    Remote(crate::remote::Route),
}

impl Lease {
    /// Marks the lease's answer as streaming (its first chunk went out): the model shows
    /// `is_streaming` until every such lease has ended.
    pub fn streaming(&mut self) {
        if let (false, Target::Local { model, .. }) = (self.streaming, &self.target) {
            model.streams.fetch_add(1, Ordering::Relaxed);
            self.streaming = true;
        }
    }

    /// A lease on a remote model (the scheduler never sees it).
    pub fn remote(rt: &Arc<Lifecycle>, route: crate::remote::Route) -> Lease {
        let asked = Instant::now();
        Lease {
            target: Target::Remote(route),
            rt: rt.clone(),
            asked,
            waited: Duration::ZERO,
            streaming: false,
            spilled: None,
            forwarded: Default::default(),
        }
    }

    /// The model's name, as the client gave it.
    pub fn name(&self) -> &str {
        match &self.target {
            Target::Local { model, .. } => &model.info.name,
            Target::Remote(r) => &r.name,
        }
    }

    /// The model id the upstream serves it under, where that is not lemonade's name for it: a
    /// remote provider's own id, or FLM's tag (`gemma3:1b`); None for llama.cpp and the rest,
    /// which answer to any name.
    pub fn upstream_model(&self) -> Option<&str> {
        match &self.target {
            Target::Local { model, .. } if model.info.recipe == Recipe::Flm => Some(&model.info.checkpoint),
            Target::Local { .. } => None,
            Target::Remote(r) => Some(&r.id),
        }
    }

    /// The local backend, when the model runs here.
    pub fn local(&self) -> Option<&Arc<Running>> {
        match &self.target {
            Target::Local { model, .. } => Some(model),
            Target::Remote(_) => None,
        }
    }

    /// Where a request for `path` goes: the backend's `http://127.0.0.1:<port>{path}`, or the
    /// provider's URL for it.
    pub fn url(&self, path: &str) -> String {
        match &self.target {
            Target::Local { model, .. } => format!("{}{path}", model.backend.base_url()),
            Target::Remote(r) => backends::cloud::upstream_url(&r.provider.base, path),
        }
    }

    /// The pooled client for this target.
    pub fn http(&self) -> &reqwest::Client {
        match &self.target {
            Target::Local { .. } => &self.rt.http,
            Target::Remote(r) => &r.http,
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.rt.metrics
    }

    /// How long a remote provider may take to answer.
    /// How long a streamed answer may be silent before it is cut: a remote provider's timeout,
    /// or `stream_timeout` (the low-transfer timeout) for a local backend.
    pub fn quiet_timeout(&self) -> Duration {
        match &self.target {
            Target::Remote(r) => r.timeout,
            Target::Local { .. } => self.rt.cfg.live.stream_timeout(),
        }
    }

    /// The failure of a streamed answer silent for [`Lease::quiet_timeout`]: a remote
    /// provider's timeout (its breaker told), or the local backend's stall.
    pub fn went_quiet(&self) -> crate::error::EngineError {
        match &self.target {
            Target::Remote(route) => self.remote_timed_out(route),
            Target::Local { .. } => self.stalled(),
        }
    }

    /// A local backend's streamed answer that sent nothing for [`Lease::quiet_timeout`].
    pub fn stalled(&self) -> crate::error::EngineError {
        crate::error::EngineError::BackendLost(crate::error::BackendLoss::Stalled {
            model: self.name().to_string(),
            secs: self.quiet_timeout().as_secs(),
        })
    }

    pub fn remote_timeout(&self) -> Duration {
        match &self.target {
            Target::Remote(r) => r.timeout,
            Target::Local { .. } => self.rt.cfg.live.remote_timeout(),
        }
    }

    /// Before the request with `body` to `path` is forwarded: when it continues a prompt the
    /// backend saved before it last stopped, that prompt is checked and restored first (see
    /// crate::prompt_cache). Never fails the request.
    pub async fn before_forward(&self, path: &str, body: &[u8]) {
        if let Target::Local { model, .. } = &self.target {
            if let Some(cache) = &model.cache {
                let b = crate::prompt_cache::Backend { http: &self.rt.http, process: model.backend.as_ref() };
                crate::prompt_cache::before_request(b, cache, path, body, &self.rt.metrics).await;
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (true, Target::Local { model, .. }) = (self.streaming, &self.target) {
            model.streams.fetch_sub(1, Ordering::Relaxed);
        }
        if let Target::Local { req, .. } = &self.target {
            let _ = self.rt.tx.send(Event::Release { req: *req }.into());
        }
    }
}

/// Cancels a request that is still waiting when its handler goes away.
pub(super) struct WaitGuard<'a> {
    pub(super) rt: &'a Lifecycle,
    pub(super) req: ReqId,
    pub(super) armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.rt.answers.lock().remove(&self.req);
            #[cfg(feature = "testing")]
            if crate::mutation::on(crate::mutation::Mutation::HungUpWaitKept) {
                return;
            }
            let _ = self.rt.tx.send(Event::Cancel { req: self.req }.into());
        }
    }
}
