//! The model lifecycle: one owner task drives the scheduler's state machine; callers talk to
//! it through a channel and await its answers; the effects it returns are executed here, and
//! processes are started through the [`Launcher`].
//!
//! Its parts, by what they own (quinn-proto's split of a connection's state):
//! * this file, the handle: `Lifecycle`'s fields and the **requests** (`acquire`, `load`,
//!   `admin_load`, `pin`, `unload`, `configure`, `plan`, `shutdown`), each an event sent to the
//!   owner and its answer awaited;
//! * [`owner`]: the owner task and the **effects** it carries out (start, stop, publish, the
//!   watchers of each backend: exit, health, memory);
//! * [`models`]: each model's own record (its backend, a start in progress, a preload, its
//!   spillover places, its load override), one map under one lock;
//! * [`lease`]: what a request holds while a backend serves it;
//! * [`views`]: what the owner last published, read without asking it (**views**: `view`,
//!   `loaded`, `place`, `saturated`, `health_entry`, the metrics' snapshot);
//! * [`options`]: what a load runs with, resolved (**pure** over the configuration and the
//!   catalogue: `effective_options`, `ctx_size`, the scheduler's `ModelRef`).
//!
//! A model's states (the scheduler's `State`) and what moves it, as the owner sees them:
//!
//! | from        | event                                  | to                          |
//! |-------------|----------------------------------------|-----------------------------|
//! | `unloaded`  | a request or a load                    | `loading` (queued if no room) |
//! | `loading`   | its backend is ready                   | `loaded`                    |
//! | `loading`   | the start fails                        | `failed` (or `unloaded`, evicting to retry) |
//! | `loading`   | an unload                              | `unloading` (the start is cancelled) |
//! | `loaded`    | idle timeout, eviction or an unload    | `unloading`                 |
//! | `loaded`    | the backend exits or is killed wedged  | `failed`                    |
//! | `unloading` | its backend stopped                    | `unloaded`                  |
//! | `failed`    | the next request (after the back-off)  | `loading`                   |
//!
//! Invariants (the state machine proves the scheduling ones, see crates/scheduler):
//! * only the owner task mutates model state; reads for `health` and the admin API use a
//!   snapshot it publishes after every event (advisory: a mutation is decided by the owner,
//!   with the state it holds, never from the snapshot);
//! * a request reaches a backend only through a [`Lease`], whose drop (completion, error,
//!   client disconnect) releases the model; a request abandoned while waiting is cancelled;
//! * a backend is in its model's record from spawn until it is stopped or exits, so a stop
//!   can always find it, including one still starting (that cancels the start: both look
//!   under the one lock of [`models`]);
//! * a backend that exits on its own is reported to the machine at once (a watcher waits on
//!   every child); the model becomes `failed` and the next request reloads it.

mod lease;
mod models;
mod options;
mod owner;
mod views;

use lease::{Acquired, Died, WaitGuard};
pub use lease::{Forwarded, Lease, Target};
pub use options::Scheduling;
use owner::owner;
pub use views::{kv_usage, ModelView, Running, SchedulerView, PLACE_SLACK_MS};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use api_types::{LoadOptions, ModelType, OptionsPatch};
use backends::Recipe;
use parking_lot::{Mutex, RwLock};
use registry::ModelInfo;
use scheduler::{Event, LoadOutcome, Machine, ModelRef, Rejection, ReqId, SchedulerError, Settings};
use tokio::sync::{mpsc, oneshot};

use crate::catalogue::Catalogue;
use crate::config::Config;
use crate::error::{BackendLoss, EngineError, Result, Serves};
use crate::launcher::Launcher;
use crate::metrics::Metrics;

pub(super) type Opts = LoadOptions;

/// What the owner answers a waiting handler.
pub(super) enum Answer {
    Granted,
    Rejected(Rejection),
    Load(LoadOutcome),
    Unload(Result<Vec<String>, SchedulerError>),
    Pin(Result<(), SchedulerError>),
    Configured,
}

/// A plan asked of the owner: the model, its options, where the answer goes.
pub(super) type PlanAsk = (ModelRef, Opts, oneshot::Sender<scheduler::Plan>);

/// What the owner is sent, in order: the machine's events, and a settle, answered once every
/// message before it is handled and its outcome published. (Nearly every message is an event,
/// so boxing it to shrink the rare settle would only add an allocation to each.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Msg {
    Event(Event<Opts>),
    Settle(oneshot::Sender<()>),
}

impl From<Event<Opts>> for Msg {
    fn from(ev: Event<Opts>) -> Msg {
        Msg::Event(ev)
    }
}

pub struct Lifecycle {
    cfg: Arc<Config>,
    catalogue: Arc<Catalogue>,
    launcher: Arc<dyn Launcher>,
    /// The client for lemonade's own calls to its backends (the prompt cache's, the proxy's).
    pub http: reqwest::Client,
    tx: mpsc::UnboundedSender<Msg>,
    plans: mpsc::UnboundedSender<PlanAsk>,
    /// The scheduler's decisions: kept, counted, logged, streamed.
    pub explain: crate::decisions::Log,
    answers: Mutex<HashMap<ReqId, oneshot::Sender<Answer>>>,
    /// Each model's own record: its backend, a start in progress, a preload waiting for it,
    /// its spillover places and its load override.
    models: models::Models,
    view: RwLock<BTreeMap<String, ModelView>>,
    scheduler_view: RwLock<SchedulerView>,
    next_req: AtomicU64,
    seq: AtomicU64,
    epoch: Instant,
    /// Set once shutdown begins: long-lived responses (SSE) end so connections drain.
    closing: tokio::sync::watch::Sender<bool>,
    metrics: Arc<Metrics>,
    /// The prompt cache's files (`<cache>/prompt-cache`).
    prompt_cache: host::prompt_cache::Store,
    /// The GPUs and NPUs models are placed on.
    devices: Vec<api_types::ComputeDevice>,
}

impl Lifecycle {
    /// The lifecycle and its owner task (which ends when the last `Arc` of it is dropped).
    pub fn new(
        cfg: Arc<Config>,
        catalogue: Arc<Catalogue>,
        launcher: Arc<dyn Launcher>,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
        prompt_cache: host::prompt_cache::Store,
    ) -> Arc<Lifecycle> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (plans, plan_rx) = mpsc::unbounded_channel();
        let devices = cfg.devices.clone().unwrap_or_else(host::devices::compute_devices);
        let mut settings = cfg.scheduler.clone();
        settings.devices = Some(settings.devices.unwrap_or_else(|| crate::devices::ledgers(&devices)));
        let machine = Machine::new(scheduler::Limits::uniform(1))
            .with_crash_backoff(cfg.crash_backoff.0.as_millis() as u64, cfg.crash_backoff.1.as_millis() as u64)
            .with_settings(settings);
        let first_view =
            SchedulerView { settings: machine.settings(), limits: machine.limits().clone(), ..Default::default() };
        let rt = Arc::new(Lifecycle {
            cfg,
            catalogue,
            launcher,
            http,
            tx,
            plans,
            explain: crate::decisions::Log::new(),
            answers: Mutex::new(HashMap::new()),
            models: Default::default(),
            view: RwLock::new(BTreeMap::new()),
            scheduler_view: RwLock::new(first_view),
            next_req: AtomicU64::new(1),
            seq: AtomicU64::new(0),
            epoch: Instant::now(),
            closing: tokio::sync::watch::channel(false).0,
            metrics,
            prompt_cache,
            devices,
        });
        tokio::spawn(owner(Arc::downgrade(&rt), rx, plan_rx, machine));
        rt
    }

    /// `text` without this machine's paths (see [`Config::redact`]).
    pub fn redact(&self, text: &str) -> String {
        self.cfg.redact_here(text)
    }

    /// The GPUs and NPUs models are placed on (found at start).
    pub fn devices(&self) -> &[api_types::ComputeDevice] {
        &self.devices
    }

    /// Milliseconds of a monotonic clock (since the server started).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Returns once the owner has handled every event sent before the call (a lease dropped
    /// before it is released) and published the outcome: what [`Lifecycle::view`] and
    /// [`Lifecycle::saturated`] read is then no older than the call.
    pub async fn settled(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Msg::Settle(done)).is_ok() {
            let _ = rx.await;
        }
    }

    /// What a load of `info` with `options` would do now (a dry run on a copy of the machine).
    pub async fn plan(&self, info: &ModelInfo, options: &Opts) -> (scheduler::Plan, ModelRef) {
        let model = self.model_ref(info, options, Scheduling::default());
        let (answer, rx) = oneshot::channel();
        let _ = self.plans.send((model.clone(), options.clone(), answer));
        let none = || scheduler::Plan {
            outcome: "waits",
            evicts: vec![],
            refusal: None,
            decisions: vec![],
            devices: Default::default(),
        };
        (rx.await.unwrap_or_else(|_| none()), model)
    }

    fn request(&self) -> (ReqId, oneshot::Receiver<Answer>) {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.answers.lock().insert(req, tx);
        (req, rx)
    }

    async fn ask(&self, req: ReqId, rx: oneshot::Receiver<Answer>, ev: Event<Opts>) -> Answer {
        let mut guard = WaitGuard { rt: self, req, armed: true };
        let _ = self.tx.send(ev.into());
        let answer = rx.await;
        guard.armed = false;
        answer.unwrap_or(Answer::Rejected(Rejection::Unloading))
    }

    /// The model `name`, if it is of a type `endpoint` serves (a 400 naming both otherwise).
    pub fn model_for(&self, name: &str, want: &[ModelType], endpoint: &str) -> Result<ModelInfo> {
        let info = self.catalogue.get(name)?;
        if !want.contains(&info.model_type) {
            return Err(EngineError::WrongModelType {
                model: name.to_string(),
                is: Serves::Type { is: info.model_type, accepted: want.to_vec() },
                wants: endpoint.to_string(),
            });
        }
        Ok(info)
    }

    /// A lease on a downloaded model, loading it first when auto-load is on (with `load` over
    /// its options). `keep_alive` (ms; 0 = never) sets the model's idle timeout, running or not;
    /// `helper`: a router's classifier asks (the routing-helper pool, no slot of its type).
    pub async fn acquire(
        self: &Arc<Self>,
        info: &ModelInfo,
        keep_alive: Option<u64>,
        (priority, helper): (i32, bool),
        load: &OptionsPatch,
    ) -> Result<Lease> {
        match self.acquire_once(info, keep_alive, (priority, helper), load).await {
            // The backend died just before this grant, before the owner heard of it. Once it has
            // (the exit is reported before `reported` is set, and events are handled in order),
            // asking again loads the model anew, as the next request would.
            Err(Died(r)) => {
                if let Some(r) = r {
                    let mut reported = r.reported.subscribe();
                    let _ = tokio::time::timeout(Duration::from_secs(2), reported.wait_for(|done| *done)).await;
                }
                match self.acquire_once(info, keep_alive, (priority, helper), load).await {
                    Err(Died(_)) => {
                        Err(EngineError::BackendLost(BackendLoss::ExitedJustNow { model: Some(info.name.clone()) }))
                    }
                    other => other.map_err(Acquired::into_error),
                }
            }
            other => other.map_err(Acquired::into_error),
        }
    }

    async fn acquire_once(
        self: &Arc<Self>,
        info: &ModelInfo,
        keep_alive: Option<u64>,
        (priority, helper): (i32, bool),
        load: &OptionsPatch,
    ) -> std::result::Result<Lease, Acquired> {
        let name = info.name.as_str();
        let options = self.effective_options(info, load);
        let mut model = self.model_ref(info, &options, Scheduling::default());
        model.priority = priority;
        model.helper = helper;
        if let Some(ms) = keep_alive {
            (model.idle_timeout_ms, model.sets_idle_timeout) = (Some(ms), true);
        }
        let auto_load = self.cfg.auto_load.then_some(options);
        let (req, rx) = self.request();
        let asked = Instant::now();
        match self.ask(req, rx, Event::Acquire { req, model, auto_load }).await {
            Answer::Granted => match self.running_model(name) {
                Some(model) if model.backend.exit_status().is_none() => {
                    self.metrics.granted(name);
                    let waited = asked.elapsed();
                    Ok(Lease {
                        target: Target::Local { model, req },
                        rt: self.clone(),
                        asked,
                        waited,
                        streaming: false,
                        spilled: None,
                        forwarded: Default::default(),
                    })
                }
                dead => {
                    let _ = self.tx.send(Event::Release { req }.into());
                    Err(Died(dead))
                }
            },
            Answer::Rejected(why) => Err(Acquired::Refused(EngineError::Rejected { model: name.to_string(), why })),
            _ => Err(Acquired::Refused(EngineError::Rejected { model: name.to_string(), why: Rejection::Unloading })),
        }
    }

    /// Checks a load's extra backend arguments against the installed binary that would run them
    /// (its `--help`, read once per file), before anything is spawned: a flag it lacks is a 400
    /// naming the flag and the binary's version. Nothing to check when the binary is not
    /// installed yet (the start checks it once installed) or does not list its flags.
    pub async fn check_args(&self, info: &ModelInfo, options: &Opts) -> Result<()> {
        let (param, code) = match info.recipe {
            Recipe::LlamaCpp => ("llamacpp_args", "invalid_llamacpp_args"),
            Recipe::WhisperCpp => ("whispercpp_args", "invalid_whispercpp_args"),
            _ => return Ok(()),
        };
        let backend = backends::backend_of(info.recipe, options);
        let Some(caps) = self.launcher.capabilities(info.recipe, &backend).await else { return Ok(()) };
        backends::check_args(info.recipe, options, &caps)
            .map_err(|e| EngineError::invalid_code(e.to_string(), param, code))
    }

    /// Loads `info` with `options` (reloading it when loaded with other options); `pin` pins
    /// or unpins it, `idle_timeout_s` sets its own idle timeout.
    pub async fn load(&self, info: &ModelInfo, options: Opts, pin: Option<bool>, over: Scheduling) -> LoadOutcome {
        let model = self.model_ref(info, &options, over);
        let (req, rx) = self.request();
        match self.ask(req, rx, Event::Load { req, model, options, pin }).await {
            Answer::Load(r) => r,
            _ => LoadOutcome::Cancelled,
        }
    }

    /// The admin API's load of `info` with `options` (`overrides`: they include runtime-only
    /// overrides), its conditions decided by the owner (see `scheduler::Event::AdminLoad`).
    pub async fn admin_load(&self, info: &ModelInfo, options: Opts, overrides: bool) -> LoadOutcome {
        let model = self.model_ref(info, &options, Scheduling::default());
        let (req, rx) = self.request();
        match self.ask(req, rx, Event::AdminLoad { req, model, options, overrides }).await {
            Answer::Load(r) => r,
            _ => LoadOutcome::Cancelled,
        }
    }

    /// Pins or unpins a loaded model.
    pub async fn pin(&self, name: &str, pinned: bool) -> Result<()> {
        let (req, rx) = self.request();
        match self.ask(req, rx, Event::Pin { req, model: self.canonical(name), pinned }).await {
            Answer::Pin(r) => Ok(r?),
            _ => Err(SchedulerError::NotLoaded(name.to_string()).into()),
        }
    }

    /// The name the scheduler knows the model `name` means by (a bare name or an alias
    /// resolved); `name` itself when it names no model here.
    fn canonical(&self, name: &str) -> String {
        self.catalogue.registry().get(name).map(|m| m.name.clone()).unwrap_or_else(|_| name.to_string())
    }

    /// Changes the scheduler's settings while it runs.
    pub async fn configure(&self, settings: Settings) {
        let (req, rx) = self.request();
        self.ask(req, rx, Event::Configure { req, settings }).await;
    }

    /// Unloads one model, or all (None). Err when the named model is not loaded.
    pub async fn unload(&self, name: Option<&str>) -> Result<Vec<String>> {
        let (req, rx) = self.request();
        match self.ask(req, rx, Event::Unload { req, model: name.map(|n| self.canonical(n)) }).await {
            Answer::Unload(r) => Ok(r?),
            _ => Ok(Vec::new()),
        }
    }

    /// Whether shutdown has begun.
    pub fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// Resolves once shutdown has begun.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Stops every backend at once (server shutdown): in-flight streams end with an error,
    /// and SSE responses (log stream, pull and install progress) end.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        let all = self.models.take_all_running();
        futures_util::future::join_all(all.iter().map(|r| self.save_and_stop(r))).await;
    }

    /// Stops a backend on purpose (not a crash), saving its prompts first when it keeps a
    /// prompt cache.
    async fn save_and_stop(&self, r: &Running) {
        if let Some(c) = r.cache.as_ref().filter(|_| r.backend.exit_status().is_none()) {
            let b = crate::prompt_cache::Backend { http: &self.http, process: r.backend.as_ref() };
            crate::prompt_cache::save(b, c, self.cfg.prompt_cache_size, &self.metrics).await;
        }
        r.backend.stop(self.cfg.stop_grace).await;
    }
}
