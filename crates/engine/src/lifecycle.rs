//! The model lifecycle: one owner task drives the scheduler's state machine; callers talk to
//! it through a channel and await its answers; the effects it returns are executed here, and
//! processes are started through the [`Launcher`].
//!
//! Invariants (the state machine proves the scheduling ones, see crates/scheduler):
//! * only the owner task mutates model state; reads for `health` and the admin API use a
//!   snapshot it publishes after every event (advisory: a mutation is decided by the owner,
//!   with the state it holds, never from the snapshot);
//! * a request reaches a backend only through a [`Lease`], whose drop (completion, error,
//!   client disconnect) releases the model; a request abandoned while waiting is cancelled;
//! * a backend is registered in `running` from spawn until it is stopped or exits, so a stop
//!   can always find it, including one still starting (that cancels the start);
//! * a backend that exits on its own is reported to the machine at once (a watcher waits on
//!   every child); the model becomes `failed` and the next request reloads it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use api_types::{CtxSize, LoadOptions, LoadedModel, ModelType, OptionsPatch, Stats};
use backends::Recipe;
use parking_lot::{Mutex, RwLock};
use registry::ModelInfo;
use scheduler::{
    Effect, Event, LoadError, LoadOutcome, Machine, ModelRef, Pool, Rejection, ReqId, SchedulerError, Settings, State,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::catalogue::Catalogue;
use crate::config::Config;
use crate::error::{BackendLoss, EngineError, Result, Serves};
use crate::launcher::{Health, Launcher, Process, StartFailure};
use crate::metrics::Metrics;

/// Why a single ask for a model gave no lease.
enum Acquired {
    Refused(EngineError),
    /// Granted a backend whose process had already exited (None: already unregistered, its
    /// exit sent to the owner).
    Died(Option<Arc<Running>>),
}
use Acquired::Died;

impl Acquired {
    fn into_error(self) -> EngineError {
        match self {
            Acquired::Refused(e) => e,
            Died(_) => EngineError::BackendLost(BackendLoss::ExitedJustNow { model: None }),
        }
    }
}

/// Failed health probes in a row after which a backend counts as wedged and is killed.
const WATCHDOG_STRIKES: u32 = 3;

type Opts = LoadOptions;

/// What the owner answers a waiting handler.
enum Answer {
    Granted,
    Rejected(Rejection),
    Load(LoadOutcome),
    Unload(Result<Vec<String>, SchedulerError>),
    Pin(Result<(), SchedulerError>),
    Configured,
}

/// A running (or starting) backend and its bookkeeping.
pub struct Running {
    pub info: ModelInfo,
    pub backend: Arc<dyn Process>,
    pub options: Opts,
    pub stats: Mutex<Stats>,
    /// Order of loading, for `health`.
    seq: u64,
    /// Set when the watchdog killed it for not answering.
    pub wedged: std::sync::atomic::AtomicBool,
    /// Set when the watchdog stopped it because an RPC worker is gone: (worker, why).
    pub lost_worker: std::sync::OnceLock<(String, String)>,
    /// True once its exit has been told to the owner task (or it was stopped on purpose).
    reported: tokio::sync::watch::Sender<bool>,
    /// Its prompt cache, when this load keeps one (an LLM on llama-server).
    pub cache: Option<crate::prompt_cache::Attached>,
    /// How it was started: the program and its arguments, this machine's paths as
    /// placeholders (`Config::redact`).
    pub command: Vec<String>,
    /// The environment lemonade set for it.
    pub env: BTreeMap<String, String>,
    /// Streams whose first chunk went out and that have not ended.
    streams: std::sync::atomic::AtomicUsize,
    /// The system memory its process holds (RSS, bytes), as last measured (0: not yet).
    pub measured: std::sync::atomic::AtomicU64,
    /// The GPU memory its process holds (NVML, bytes), as last measured (0: none or unknown).
    /// Shown beside the estimate; the VRAM ledgers do not count it yet.
    pub measured_vram: std::sync::atomic::AtomicU64,
}

impl Running {
    /// The last statistics of a request it served.
    pub fn stats(&self) -> Stats {
        self.stats.lock().clone()
    }
}

/// One model as the owner last published it.
#[derive(Debug, Clone)]
pub struct ModelView {
    pub state: State,
    pub in_flight: usize,
    pub queue_depth: usize,
    pub last_use: u64,
    pub last_error: Option<String>,
    pub pinned: bool,
    /// The idle timeout in force (ms; None: never).
    pub idle_timeout: Option<u64>,
    /// When it will be unloaded for idleness (ms, the runtime's clock), if nothing uses it.
    pub unload_at: Option<u64>,
    /// Bytes counted against the memory budget (its estimate, or what it was measured to
    /// hold when that is more), and the VRAM budget.
    pub memory: u64,
    pub vram: u64,
    /// Its estimate of system memory (0 when it holds none).
    pub estimate: u64,
    /// The devices it runs on, with its bytes on each.
    pub devices: scheduler::Shares,
    /// Requests it serves at once (None: no limit).
    pub max_concurrent: Option<u32>,
    /// When each waiting request started waiting (ms, the runtime's clock), in serving order.
    pub waiting_since: Vec<u64>,
    /// Their priorities, in the same order.
    pub waiting_priorities: Vec<i32>,
}

/// The scheduler's settings and memory use as the owner last published them.
#[derive(Debug, Clone, Default)]
pub struct SchedulerView {
    pub settings: Settings,
    pub memory_in_use: u64,
    pub vram_in_use: u64,
    /// Models waiting to load, in order.
    pub load_queue: Vec<String>,
    /// Loaded models per type (-1: no limit).
    pub limits: scheduler::Limits,
}

/// A load's scheduling settings for its model, over the saved ones (None: the saved value, else
/// the server's): its idle timeout (`Some(None)`: the server's), requests at once, priority.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scheduling {
    pub idle_timeout_s: Option<Option<u64>>,
    pub max_concurrent: Option<u32>,
    pub priority: Option<i32>,
}

/// How long after it arrives a request is in the scheduler's queue, at most (for its place).
pub const PLACE_SLACK_MS: u64 = 100;

/// A plan asked of the owner: the model, its options, where the answer goes.
type PlanAsk = (ModelRef, Opts, oneshot::Sender<scheduler::Plan>);

/// What the owner is sent, in order: the machine's events, and a settle, answered once every
/// message before it is handled and its outcome published. (Nearly every message is an event,
/// so boxing it to shrink the rare settle would only add an allocation to each.)
#[allow(clippy::large_enum_variant)]
enum Msg {
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
    running: Mutex<HashMap<String, Arc<Running>>>,
    /// Starts in progress whose process is not registered yet (resolving or installing the
    /// binary): model → a stop came meanwhile. Locked after `running`, never before it.
    starts: Mutex<HashMap<String, tokio::sync::watch::Sender<bool>>>,
    view: RwLock<BTreeMap<String, ModelView>>,
    scheduler_view: RwLock<SchedulerView>,
    /// `--preload` models not loaded yet (pulling, queued or loading).
    preloading: Mutex<Vec<String>>,
    /// Spillover places a load gave a model, over its saved ones (`[]`: none).
    spillover: Mutex<HashMap<String, Vec<String>>>,
    /// Runtime-only admin load overrides of loaded models.
    overrides: Mutex<HashMap<String, Value>>,
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

/// Keeps a model in use while a request runs. Dropping it releases the model.
pub struct Lease {
    pub target: Target,
    rt: Arc<Lifecycle>,
    /// When the request asked for the model, and how long it waited for it.
    pub asked: Instant,
    pub waited: Duration,
    /// Whether this lease's stream counts as streaming (see [`Lease::streaming`]).
    streaming: bool,
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
                let base = model.backend.base_url();
                crate::prompt_cache::before_request(&self.rt.http, &base, cache, path, body, &self.rt.metrics).await;
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
struct WaitGuard<'a> {
    rt: &'a Lifecycle,
    req: ReqId,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.rt.answers.lock().remove(&self.req);
            let _ = self.rt.tx.send(Event::Cancel { req: self.req }.into());
        }
    }
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
            running: Mutex::new(HashMap::new()),
            starts: Mutex::new(HashMap::new()),
            view: RwLock::new(BTreeMap::new()),
            scheduler_view: RwLock::new(first_view),
            preloading: Mutex::new(Vec::new()),
            spillover: Default::default(),
            overrides: Mutex::new(HashMap::new()),
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

    pub fn load_override(&self, name: &str) -> Option<Value> {
        self.overrides.lock().get(name).cloned()
    }

    pub fn set_load_override(&self, name: &str, v: Option<Value>) {
        let mut o = self.overrides.lock();
        match v {
            Some(v) => o.insert(name.to_string(), v),
            None => o.remove(name),
        };
    }

    /// The last published state of every model the runtime has seen.
    pub fn view(&self) -> BTreeMap<String, ModelView> {
        self.view.read().clone()
    }

    /// `name`'s last published state (None: never seen).
    pub fn state_of(&self, name: &str) -> Option<State> {
        self.view.read().get(name).map(|v| v.state)
    }

    fn running_model(&self, name: &str) -> Option<Arc<Running>> {
        self.running.lock().get(name).cloned()
    }

    /// Where a request for `name` of `priority` asked for at `since` (ms) is: the model's
    /// state, and its place in line (1: next): the first waiting request of its priority that
    /// the queue registered within [`PLACE_SLACK_MS`] of its arrival, and every one ahead of it.
    pub fn place(&self, name: &str, since: u64, priority: i32) -> (Option<State>, usize) {
        let view = self.view.read();
        let Some(v) = view.get(name) else { return (None, 0) };
        let mine = v
            .waiting_since
            .iter()
            .zip(&v.waiting_priorities)
            .position(|(t, p)| *p == priority && *t >= since && *t <= since + PLACE_SLACK_MS);
        (Some(v.state), mine.map_or(0, |i| i + 1))
    }

    /// [`Lifecycle::place`] in words, for a request that started waiting at `since` (ms):
    /// `queued 2`, `loading 3 s`, `loading 3 s, queued 2`, `starting`, or that it waits for a
    /// restart.
    pub fn place_words(&self, name: &str, since: u64, priority: i32) -> String {
        let waited = self.now_ms().saturating_sub(since) / 1000;
        match self.place(name, since, priority) {
            (Some(State::Loaded), n) if n > 0 => format!("queued {n}"),
            (Some(State::Loaded), _) => "starting".to_string(),
            (Some(State::Unloading), _) => format!("waiting for {name} to restart, {waited} s"),
            // Behind others who wait for the same load: its place in line too.
            (_, n) if n > 1 => format!("loading {waited} s, queued {n}"),
            _ => format!("loading {waited} s"),
        }
    }

    /// `info`'s spillover places: those its last load gave, else its saved ones.
    pub fn spillover_of(&self, info: &ModelInfo) -> Vec<String> {
        if let Some(places) = self.spillover.lock().get(&info.name) {
            return places.clone();
        }
        self.catalogue.registry().saved(info).spillover.unwrap_or_default()
    }

    /// The spillover places a load gives `name` (None: back to its saved ones).
    pub fn set_spillover(&self, name: &str, places: Option<Vec<String>>) {
        match places {
            Some(p) => self.spillover.lock().insert(name.to_string(), p),
            None => self.spillover.lock().remove(name),
        };
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

    /// Why `name` cannot take a request at once (loaded, with its requests in flight at its
    /// limit or some already waiting); None when it can (or is not loaded: it loads).
    pub fn saturated(&self, name: &str) -> Option<String> {
        let view = self.view.read();
        let v = view.get(name).filter(|v| v.state == State::Loaded)?;
        let full = v.max_concurrent.is_some_and(|m| v.in_flight >= m as usize);
        (full || v.queue_depth > 0).then(|| {
            let limit = v.max_concurrent.map(|m| format!(" of {m}")).unwrap_or_default();
            format!("running {}{limit}, waiting {}", v.in_flight, v.queue_depth)
        })
    }

    /// The requests this node is serving and those waiting (for a load, or for a slot), over
    /// every model: the load a router in front of several nodes weighs.
    pub fn node_load(&self) -> (u64, u64) {
        self.view.read().values().fold((0, 0), |(r, w), v| (r + v.in_flight as u64, w + v.queue_depth as u64))
    }

    /// A loaded llama.cpp model's slots and context per slot.
    pub fn slots(&self, name: &str) -> Option<(u32, u32)> {
        let r = self.running.lock().get(name).cloned()?;
        (r.info.recipe == Recipe::LlamaCpp).then(|| {
            let s = backends::llamacpp::cache_settings(&r.options, r.info.model_type);
            (s.slots, s.ctx_size)
        })
    }

    /// Loaded models in load order, with their published state.
    pub fn loaded(&self) -> Vec<(Arc<Running>, ModelView)> {
        let view = self.view();
        let running = self.running.lock();
        let mut out: Vec<(Arc<Running>, ModelView)> = view
            .into_iter()
            .filter(|(_, v)| v.state == State::Loaded)
            .filter_map(|(n, v)| running.get(&n).map(|r| (r.clone(), v)))
            .collect();
        out.sort_by_key(|(r, _)| r.seq);
        out
    }

    /// The loaded model used most recently.
    pub fn most_recent(&self) -> Option<Arc<Running>> {
        self.loaded().into_iter().max_by_key(|(_, v)| v.last_use).map(|(r, _)| r)
    }

    pub fn set_preloading(&self, names: &[String]) {
        *self.preloading.lock() = names.to_vec();
    }

    pub fn done_preloading(&self, name: &str) {
        self.preloading.lock().retain(|n| n != name);
    }

    /// Models on their way in: loading now, or preloads not loaded yet.
    pub fn loading(&self) -> Vec<String> {
        let view = self.view();
        let mut out: Vec<String> =
            view.iter().filter(|(_, v)| v.state == State::Loading).map(|(n, _)| n.clone()).collect();
        for n in self.preloading.lock().iter() {
            if !out.contains(n) && view.get(n).is_none_or(|v| v.state != State::Loaded) {
                out.push(n.clone());
            }
        }
        out
    }

    /// The state the metrics' gauges show, as last published.
    pub fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let view = self.view();
        let sched = self.scheduler_view();
        let loaded = self.loaded();
        let measured = |n: &str, vram: bool| {
            let r = &loaded.iter().find(|(r, _)| r.info.name == n)?.0;
            Some(if vram { &r.measured_vram } else { &r.measured }.load(Ordering::Relaxed)).filter(|b| *b > 0)
        };
        crate::metrics::Snapshot {
            loaded: loaded.iter().map(|(r, _)| r.info.model_type).collect(),
            models: view
                .iter()
                .map(|(n, v)| crate::metrics::ModelGauges {
                    name: n.clone(),
                    waiting: v.queue_depth as u64,
                    running: v.in_flight as u64,
                    ready: v.state == State::Loaded,
                    kv_usage: None,
                    memory: (v.state == State::Loaded).then(|| (v.estimate, measured(n, false))),
                    measured_vram: measured(n, true),
                })
                .collect(),
            in_use: [sched.memory_in_use, sched.vram_in_use],
            budgets: [sched.settings.memory_budget.flatten(), sched.settings.vram_budget.flatten()],
            prompt_cache_bytes: self.prompt_cache.total().1,
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

    /// The scheduler's settings and memory use, as last published.
    pub fn scheduler_view(&self) -> SchedulerView {
        self.scheduler_view.read().clone()
    }

    /// What the scheduler needs to know of `info` when it runs with `options`: its memory
    /// estimate, its concurrency and its idle timeout (`idle_timeout_s`, else the saved one).
    fn model_ref(&self, info: &ModelInfo, options: &Opts, over: Scheduling) -> ModelRef {
        let options = &self.with_ctx_resolved(info, options);
        let mut m = ModelRef::new(&info.name, info.model_type, info.device() == "npu");
        let reg = self.catalogue.registry();
        let idle = over.idle_timeout_s.unwrap_or_else(|| reg.saved_idle_timeout(info));
        let (saved_max, saved_priority) = reg.saved_scheduling(info);
        // The draft's header facts, read under the same lock (no copy of its entry).
        let draft = options.draft_model.as_deref().and_then(|d| reg.get(d).ok()?.shape);
        drop(reg);
        m.idle_timeout_ms = idle.map(|s| s.saturating_mul(1000));
        let own_max = over.max_concurrent.or(saved_max);
        m.max_concurrent = own_max.or(self.cfg.max_concurrent);
        m.model_priority = over.priority.or(saved_priority).unwrap_or(0);
        m.placement = crate::devices::placement(options);
        if info.recipe == Recipe::LlamaCpp {
            let s = backends::llamacpp::cache_settings(options, info.model_type);
            m.max_concurrent = Some(own_max.or(self.cfg.max_concurrent).unwrap_or(s.slots));
            // No shape (the header could not be read): counted as nothing; the start says why.
            let input = registry::memory::EstimateInput {
                ctx_size: u32::try_from(s.kv_cells).unwrap_or(u32::MAX),
                slots: s.slots,
                cache_type_k: &s.cache_type_k,
                cache_type_v: &s.cache_type_v,
                prompt_cache: prompt_cache_bytes(options),
            };
            let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
            let placed = info.shape.map(|shape| registry::memory::estimate(&shape, &input).placed(offloaded));
            let placed = placed.unwrap_or_default();
            (m.memory, m.vram) = (placed.memory, placed.vram);
            // A draft model runs in the same process, with a context as large, where the model
            // runs: its estimate is added to the model's.
            if let Some(shape) = draft {
                let d = registry::memory::estimate(&shape, &input).placed_beside(offloaded);
                (m.memory, m.vram) = (m.memory + d.memory, m.vram + d.vram);
            }
        }
        m
    }

    pub fn health_entry(&self, r: &Running, v: &ModelView) -> LoadedModel {
        let now = self.now_ms();
        let cached = self.prompt_cache.usage(&r.info.name);
        let slots = (r.info.recipe == Recipe::LlamaCpp)
            .then(|| backends::llamacpp::cache_settings(&r.options, r.info.model_type));
        LoadedModel {
            model_name: r.info.name.clone(),
            checkpoint: r.info.checkpoint.clone(),
            model_type: r.info.model_type,
            device: r.info.device().to_string(),
            backend_url: format!("{}/v1", r.backend.base_url()),
            recipe: r.info.recipe.to_string(),
            recipe_options: r.options.clone(),
            last_use: v.last_use,
            pinned: v.pinned,
            idle_timeout: v.idle_timeout.map(|ms| ms / 1000),
            unloads_in_ms: v.unload_at.map(|at| at.saturating_sub(now)),
            memory_estimate: v.memory,
            vram_estimate: v.vram,
            in_flight: v.in_flight as u64,
            queued: v.queue_depth as u64,
            pid: r.backend.pid(),
            sandbox: r.backend.sandbox(),
            is_busy: v.in_flight > 0,
            is_streaming: r.streams.load(Ordering::Relaxed) > 0,
            command: r.command.clone(),
            env: r.env.clone(),
            prompt_cache_files: cached.0,
            prompt_cache_bytes: cached.1,
            parallel: slots.as_ref().map(|s| s.slots),
            slot_ctx_size: slots.as_ref().map(|s| s.ctx_size),
            kv_cells: slots.map(|s| s.kv_cells),
            placed_on: v.devices.clone(),
        }
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

    /// A lease on a downloaded model, loading it first when auto-load is on. `keep_alive`
    /// (ms; 0 = never) sets the model's idle timeout, running or not.
    pub async fn acquire(self: &Arc<Self>, info: &ModelInfo, keep_alive: Option<u64>, priority: i32) -> Result<Lease> {
        match self.acquire_once(info, keep_alive, priority).await {
            // The backend died just before this grant, before the owner heard of it. Once it has
            // (the exit is reported before `reported` is set, and events are handled in order),
            // asking again loads the model anew, as the next request would.
            Err(Died(r)) => {
                if let Some(r) = r {
                    let mut reported = r.reported.subscribe();
                    let _ = tokio::time::timeout(Duration::from_secs(2), reported.wait_for(|done| *done)).await;
                }
                match self.acquire_once(info, keep_alive, priority).await {
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
        priority: i32,
    ) -> std::result::Result<Lease, Acquired> {
        let name = info.name.as_str();
        let options = self.effective_options(info, &OptionsPatch::default());
        let mut model = self.model_ref(info, &options, Scheduling::default());
        model.priority = priority;
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
        let all: Vec<Arc<Running>> = self.running.lock().drain().map(|(_, r)| r).collect();
        futures_util::future::join_all(all.iter().map(|r| self.save_and_stop(r))).await;
    }

    /// Stops a backend on purpose (not a crash), saving its prompts first when it keeps a
    /// prompt cache.
    async fn save_and_stop(&self, r: &Running) {
        if let Some(c) = r.cache.as_ref().filter(|_| r.backend.exit_status().is_none()) {
            crate::prompt_cache::save(&self.http, &r.backend.base_url(), c, self.cfg.prompt_cache_size, &self.metrics)
                .await;
        }
        r.backend.stop(self.cfg.stop_grace).await;
    }

    /// Effective options: `request` over the model's saved options over the server's
    /// configuration (`registry::options`). Recipe defaults apply when read.
    pub fn effective_options(&self, info: &ModelInfo, request: &OptionsPatch) -> Opts {
        self.resolve(info, &self.catalogue.registry().saved(info), request)
    }

    /// [`Lifecycle::effective_options`] with `saved` as the model's saved options.
    pub fn resolve(&self, info: &ModelInfo, saved: &LoadOptions, request: &OptionsPatch) -> Opts {
        let config = self.cfg.live.options();
        // An image model's catalogue `image_defaults` sit under its saved options (as v9).
        let catalogue = match &info.image_defaults {
            Some(Value::Object(defaults)) => LoadOptions::from_map_lossy(defaults).0,
            _ => LoadOptions::default(),
        };
        registry::options::resolve(
            info.recipe,
            registry::options::Layers { config: &config, catalogue: &catalogue, saved, request },
        )
    }

    /// The server's idle timeout in seconds (0: never).
    pub fn idle_timeout_s(&self) -> u64 {
        self.scheduler_view().settings.idle_timeout_ms.flatten().map_or(0, |ms| ms / 1000)
    }

    /// The context size a load of `info` with `options` gets: the number given, or for `-1`
    /// the largest the model was trained for that fits the scheduler's budget of the pool it
    /// lands in (no budget: the trained context), or the default.
    pub fn ctx_size(&self, info: &ModelInfo, options: &Opts) -> u32 {
        match (options.ctx_size, info.shape) {
            (Some(CtxSize::Tokens(n)), _) => n,
            (Some(CtxSize::Auto), Some(shape)) => {
                let s = backends::llamacpp::cache_settings(options, info.model_type);
                let input = registry::memory::EstimateInput {
                    ctx_size: 0,
                    slots: s.slots,
                    cache_type_k: &s.cache_type_k,
                    cache_type_v: &s.cache_type_v,
                    prompt_cache: prompt_cache_bytes(options),
                };
                let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
                // The scheduler's budget (`auto` was resolved to bytes at start): no memory is
                // read here, on every acquire of such a model.
                let settings = self.scheduler_view().settings;
                let budget = if offloaded { settings.vram_budget.flatten() } else { settings.memory_budget.flatten() };
                let fallback = backends::llamacpp::DEFAULT_CTX_SIZE;
                let cells = registry::memory::auto_ctx_size(&shape, &input, budget, offloaded, fallback);
                // With `parallel` slots of their own, the cells that fit are shared among them.
                match options.parallel.filter(|n| *n > 1) {
                    Some(n) => (cells / n / registry::memory::AUTO_CTX_STEP * registry::memory::AUTO_CTX_STEP)
                        .max(registry::memory::AUTO_CTX_STEP),
                    None => cells,
                }
            }
            _ => backends::llamacpp::DEFAULT_CTX_SIZE,
        }
    }

    /// `options` with automatic slots (`parallel: 0`) and an automatic context size (`-1`)
    /// resolved, in that order.
    fn with_ctx_resolved(&self, info: &ModelInfo, options: &Opts) -> Opts {
        let mut o = options.clone();
        if o.parallel == Some(0) {
            o.parallel = Some(self.auto_parallel(info, &o));
        }
        if o.ctx_size == Some(CtxSize::Auto) {
            o.ctx_size = Some(CtxSize::Tokens(self.ctx_size(info, &o)));
        }
        if info.recipe == Recipe::LlamaCpp && o.cache_ram.is_none() {
            o.cache_ram = Some(default_cache_ram(info, &o));
        }
        o
    }

    /// `parallel: 0`: the most slots (8, 4, 2, else 1), each with the context asked for (the
    /// default when that is automatic too), whose whole KV cache fits with the weights in the
    /// budget of the pool the model lands in; 4 with no budget, or for a model whose header
    /// could not be read.
    fn auto_parallel(&self, info: &ModelInfo, options: &Opts) -> u32 {
        let Some(shape) = info.shape else { return 4 };
        let ctx = match options.ctx_size {
            Some(CtxSize::Tokens(n)) => n,
            _ => backends::llamacpp::DEFAULT_CTX_SIZE,
        };
        let s = backends::llamacpp::cache_settings(options, info.model_type);
        let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
        let settings = self.scheduler_view().settings;
        let budget = if offloaded { settings.vram_budget.flatten() } else { settings.memory_budget.flatten() };
        let Some(budget) = budget else { return 4 };
        let fits = |n: u32| {
            let input = registry::memory::EstimateInput {
                ctx_size: ctx.saturating_mul(n),
                slots: n,
                cache_type_k: &s.cache_type_k,
                cache_type_v: &s.cache_type_v,
                prompt_cache: prompt_cache_bytes(options),
            };
            let placed = registry::memory::estimate(&shape, &input).placed(offloaded);
            (if offloaded { placed.vram } else { placed.memory }) <= budget
        };
        [8, 4, 2].into_iter().find(|n| fits(*n)).unwrap_or(1)
    }

    fn answer(&self, req: ReqId, a: Answer) -> bool {
        let tx = self.answers.lock().remove(&req);
        match tx {
            Some(tx) => tx.send(a).is_ok(),
            None => false,
        }
    }

    fn publish(&self, m: &Machine<Opts>) {
        let view = m
            .entries()
            .map(|e| {
                let v = ModelView {
                    state: e.state,
                    in_flight: e.in_flight.len(),
                    queue_depth: e.queue_depth(),
                    waiting_since: m.waiting_since(&e.model.name),
                    waiting_priorities: m.waiting_priorities(&e.model.name),
                    last_use: e.last_use,
                    last_error: e.last_error.clone(),
                    pinned: e.pinned,
                    idle_timeout: m.idle_timeout_of(e),
                    unload_at: m.unload_at(e),
                    memory: e.memory,
                    vram: e.vram,
                    estimate: e.memory.min(e.model.memory),
                    devices: e.shares.clone(),
                    max_concurrent: e.max_concurrent,
                };
                (e.model.name.clone(), v)
            })
            .collect();
        *self.view.write() = view;
        *self.scheduler_view.write() = SchedulerView {
            settings: m.settings(),
            memory_in_use: m.in_use(Pool::Memory),
            vram_in_use: m.in_use(Pool::Vram),
            load_queue: m.load_queue(),
            limits: m.limits().clone(),
        };
    }

    fn execute(self: &Arc<Self>, e: Effect<Opts>) {
        match e {
            Effect::Start { model, options, devices } => {
                // Known as starting before any later effect runs, so a stop can cancel it.
                let (cancel, cancelled) = tokio::sync::watch::channel(false);
                self.starts.lock().insert(model.clone(), cancel);
                let rt = self.clone();
                let span = tracing::debug_span!(target: "lemonade::spans", "load", model = %model);
                tokio::spawn(tracing::Instrument::instrument(
                    async move {
                        let placed = crate::devices::placed(&rt.devices, &devices);
                        let result = rt.start(&model, options, placed, cancelled).await.map_err(load_error);
                        rt.starts.lock().remove(&model);
                        let _ = rt.tx.send(Event::Started { model, result }.into());
                    },
                    span,
                ));
            }
            Effect::Stop { model } => {
                let rt = self.clone();
                tokio::spawn(async move {
                    let r = {
                        let mut running = rt.running.lock();
                        let r = running.remove(&model);
                        if r.is_none() {
                            // Not spawned yet: the start sees this and gives up.
                            if let Some(c) = rt.starts.lock().get(&model) {
                                c.send_replace(true);
                            }
                        }
                        r
                    };
                    if let Some(r) = r {
                        tracing::info!(model = %model, "stopping backend");
                        rt.save_and_stop(&r).await;
                    }
                    let _ = rt.tx.send(Event::Stopped { model }.into());
                });
            }
            Effect::Grant { req, .. } => {
                if !self.answer(req, Answer::Granted) {
                    // Nobody waits any more: give the model back.
                    let _ = self.tx.send(Event::Release { req }.into());
                }
            }
            Effect::Reject { req, why, .. } => {
                self.answer(req, Answer::Rejected(why));
            }
            Effect::LoadDone { req, result, .. } => {
                self.answer(req, Answer::Load(result));
            }
            Effect::UnloadDone { req, result } => {
                self.answer(req, Answer::Unload(result));
            }
            Effect::PinDone { req, result } => {
                self.answer(req, Answer::Pin(result));
            }
            Effect::Configured { req } => {
                self.answer(req, Answer::Configured);
            }
        }
    }

    /// Starts the backend of `name`; the process is registered as soon as it exists so a
    /// stop can cancel the start.
    async fn start(
        self: &Arc<Self>,
        name: &str,
        options: Opts,
        devices: Vec<backends::devices::Placed>,
        mut cancel: tokio::sync::watch::Receiver<bool>,
    ) -> std::result::Result<(), StartFailure> {
        let info = self.catalogue.get(name).map_err(|e| StartFailure::Fatal(e.to_string()))?;
        let draft =
            crate::draft::check(&self.catalogue, &info, &options).map_err(|e| StartFailure::Fatal(e.to_string()))?;
        let with = crate::launcher::StartWith { devices, draft: draft.and_then(|d| d.main_path) };
        let cancelled = || StartFailure::NotReady("the load was cancelled by an unload".into());
        // Preparing may install the binary (minutes): an unload meanwhile cancels the load at
        // once, while the install itself runs on to the end.
        let launched_with = self.with_ctx_resolved(&info, &options);
        let prepared = tokio::select! {
            p = self.launcher.prepare(&info, &launched_with, &with) => p?,
            _ = cancel.wait_for(|c| *c) => return Err(cancelled()),
        };
        let started = Instant::now();
        let spec = &prepared.spec;
        // The program by its name (where lemonade keeps or finds it is its own business).
        let program = spec.program.file_name().map_or_else(|| "backend".into(), |n| n.to_string_lossy().to_string());
        let command = std::iter::once(program).chain(spec.args.iter().map(|a| self.cfg.redact_here(a))).collect();
        let env = spec.env.iter().cloned().collect();
        let backend = self.launcher.spawn(name, prepared.spec)?;
        let running = Arc::new(Running {
            info,
            backend: backend.clone(),
            // As started: automatic slots and context resolved.
            options: launched_with,
            stats: Mutex::new(Stats::default()),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            wedged: std::sync::atomic::AtomicBool::new(false),
            lost_worker: std::sync::OnceLock::new(),
            reported: tokio::sync::watch::channel(false).0,
            cache: prepared.cache,
            command,
            env,
            streams: Default::default(),
            measured: Default::default(),
            measured_vram: Default::default(),
        });
        // Registered unless a stop came first (it found no process): checked under the lock the
        // stop takes, so one of the two always sees the other.
        let registered = {
            let mut all = self.running.lock();
            let go = !*cancel.borrow();
            if go {
                all.insert(name.to_string(), running.clone());
            }
            go
        };
        if !registered {
            tracing::info!(model = %name, "load cancelled while starting: stopping the new backend");
            backend.stop(self.cfg.stop_grace).await;
            return Err(cancelled());
        }
        if let Err(e) = backend.ready().await {
            self.unregister(name, &running);
            return Err(StartFailure::NotReady(self.redact(e.message())));
        }
        tracing::info!(model = %name, ms = started.elapsed().as_millis() as u64, port = backend.port(), "model loaded");
        self.metrics.loaded(name, started.elapsed());
        self.watch(name.to_string(), running);
        Ok(())
    }

    fn unregister(&self, name: &str, r: &Arc<Running>) -> bool {
        let mut running = self.running.lock();
        if running.get(name).is_some_and(|x| Arc::ptr_eq(x, r)) {
            running.remove(name);
            return true;
        }
        false
    }

    /// Reports a backend that exits on its own (a stop unregisters it first), and kills one
    /// that stops answering its health endpoint (a wedged process), which then reports the same.
    fn watch(self: &Arc<Self>, name: String, r: Arc<Running>) {
        if let Some(interval) = self.cfg.watchdog_interval {
            let launcher = self.launcher.clone();
            tokio::spawn(watchdog(launcher, interval, self.cfg.stop_grace, name.clone(), r.clone()));
        }
        tokio::spawn(measure(Arc::downgrade(self), name.clone(), r.clone()));
        let rt = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = r.backend.wait_exit().await;
            let Some(rt) = rt.upgrade() else { return };
            // Still registered while its last output drains, so a request granted meanwhile
            // finds the exited process and waits for `reported` (see `acquire`).
            r.backend.output_drained().await;
            if rt.unregister(&name, &r) {
                let tail = r.backend.log_tail();
                tracing::error!(model = %name, status = %exit, "backend died");
                rt.metrics.crashed(&name);
                let program = r.info.recipe.dir_and_exe().1;
                let error = if let Some((w, why)) = r.lost_worker.get() {
                    format!("its RPC worker {w} is gone ({why}); {program} was stopped ({exit}). The next request loads it again")
                } else if r.wedged.load(Ordering::SeqCst) {
                    format!("{program} stopped answering its health checks and was killed ({exit}). Last log lines:\n{tail}")
                } else {
                    format!("{program} exited unexpectedly ({exit}). Last log lines:\n{tail}")
                };
                let _ = rt.tx.send(Event::Exited { model: name, error: rt.redact(&error) }.into());
            }
            r.reported.send_replace(true);
        });
    }
}

/// How often a running backend's memory is read.
const MEASURE_EVERY: Duration = Duration::from_secs(1);
/// A change of measured memory smaller than this is not told to the scheduler.
const MEASURE_STEP: u64 = 4 << 20;

/// Reads a running backend's memory every [`MEASURE_EVERY`] while it is registered, keeps it in
/// `r.measured` (its GPU memory in `r.measured_vram`), and tells the owner when either moved by
/// [`MEASURE_STEP`] or more (the machine counts it where it passes the estimate).
async fn measure(rt: std::sync::Weak<Lifecycle>, name: String, r: Arc<Running>) {
    let (mut told, mut told_vram) = (0u64, 0u64);
    loop {
        let Some(lc) = rt.upgrade() else { return };
        let current = lc.running.lock().get(&name).is_some_and(|x| Arc::ptr_eq(x, &r));
        if !current || r.backend.exit_status().is_some() {
            return;
        }
        if let Some(bytes) = lc.launcher.vram_of(r.backend.as_ref()) {
            r.measured_vram.store(bytes, Ordering::Relaxed);
            if bytes.abs_diff(told_vram) >= MEASURE_STEP {
                told_vram = bytes;
                let _ = lc.tx.send(Event::MeasuredVram { model: name.clone(), vram: bytes }.into());
            }
        }
        if let Some(bytes) = lc.launcher.memory_of(r.backend.as_ref()) {
            r.measured.store(bytes, Ordering::Relaxed);
            if bytes.abs_diff(told) >= MEASURE_STEP {
                told = bytes;
                let _ = lc.tx.send(Event::Measured { model: name.clone(), memory: bytes }.into());
            }
        }
        drop(lc);
        tokio::time::sleep(MEASURE_EVERY).await;
    }
}

/// The bytes of host prompt cache `options` give llama-server (None: the estimate's default).
fn prompt_cache_bytes(options: &Opts) -> Option<u64> {
    options.cache_ram.map(|mib| mib.saturating_mul(registry::memory::MIB))
}

/// The `cache_ram` (MiB) a model gets when none is set: the size of its KV cache at the options'
/// context and slots ([`registry::memory::prompt_cache_default`]); none for a model whose
/// header could not be read (its memory is not counted either).
fn default_cache_ram(info: &ModelInfo, options: &Opts) -> u64 {
    let Some(shape) = info.shape else { return 0 };
    let s = backends::llamacpp::cache_settings(options, info.model_type);
    let input = registry::memory::EstimateInput {
        ctx_size: u32::try_from(s.kv_cells).unwrap_or(u32::MAX),
        slots: s.slots,
        cache_type_k: &s.cache_type_k,
        cache_type_v: &s.cache_type_v,
        prompt_cache: None,
    };
    registry::memory::estimate(&shape, &input).prompt_cache / registry::memory::MIB
}

/// The owner task: the only place the state machine runs.
async fn owner(
    rt: Weak<Lifecycle>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    mut plans: mpsc::UnboundedReceiver<PlanAsk>,
    mut machine: Machine<Opts>,
) {
    let Some(epoch) = rt.upgrade().map(|r| r.epoch) else { return };
    loop {
        // The machine's next idle deadline is the only timer: a `Tick` when it is due (none for
        // a deadline beyond what the clock can hold).
        let deadline = machine
            .next_deadline()
            .and_then(|ms| tokio::time::Instant::from_std(epoch).checked_add(Duration::from_millis(ms)));
        let due = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let ev = tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Event(ev)) => Some(ev),
                Some(Msg::Settle(done)) => {
                    // Every message before it has been handled and published.
                    let _ = done.send(());
                    continue;
                }
                None => None,
            },
            Some((model, options, answer)) = plans.recv() => {
                // A dry run on a copy: nothing changes, nothing is published.
                let _ = answer.send(machine.plan(model, options, epoch.elapsed().as_millis() as u64));
                continue;
            }
            _ = due => Some(Event::Tick),
        };
        let Some(ev) = ev else { return };
        let Some(rt) = rt.upgrade() else { return };
        let now = rt.now_ms();
        let effects = machine.handle(ev, now);
        for d in machine.take_decisions() {
            rt.explain.record(d, now, &rt.metrics);
        }
        rt.publish(&machine);
        for e in effects {
            rt.execute(e);
        }
    }
}

/// Fills in the KV-cache use of each loaded model in `models`: a local llama-server's from its
/// `/slots` (read now, 500 ms at most each, all at once), any other local backend's (or a
/// llama-server whose `/slots` did not answer) as the share of its slots busy. A remote
/// upstream's stays None: its own `/metrics` says it.
pub async fn kv_usage(lc: &Lifecycle, models: &mut [crate::metrics::ModelGauges]) {
    let probes = lc.loaded().into_iter().filter(|(r, _)| r.backend.pid().is_some()).map(|(r, v)| async move {
        let slots = lc.slots(&r.info.name);
        let read = async {
            let url = format!("{}/slots", r.backend.base_url());
            let answer = lc.http.get(url).timeout(Duration::from_millis(500)).send().await.ok()?;
            let slots: serde_json::Value = answer.error_for_status().ok()?.json().await.ok()?;
            backends::llamacpp::kv_usage(&slots)
        };
        let from_slots = if slots.is_some() { read.await } else { None };
        let busy = || {
            let n = slots.map(|(n, _)| n).or(v.max_concurrent).unwrap_or(1).max(1);
            (v.in_flight as f64 / f64::from(n)).min(1.0)
        };
        (r.info.name.clone(), from_slots.unwrap_or_else(busy))
    });
    for (name, kv) in futures_util::future::join_all(probes).await {
        if let Some(m) = models.iter_mut().find(|m| m.name == name) {
            m.kv_usage = Some(kv);
        }
    }
}

/// Probes a running backend every `interval` (through the launcher: its health endpoint, and
/// its RPC workers); after [`WATCHDOG_STRIKES`] failed probes in a row (no answer within the
/// interval, or an error status) the process is killed, and at once when a worker is gone.
async fn watchdog(launcher: Arc<dyn Launcher>, interval: Duration, grace: Duration, name: String, r: Arc<Running>) {
    let mut strikes = 0;
    loop {
        tokio::select! {
            _ = r.backend.wait_exit() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match launcher.probe(r.backend.as_ref(), &r.options, interval).await {
            Health::Ok => strikes = 0,
            Health::Unhealthy => strikes += 1,
            Health::WorkerGone(worker, why) => {
                tracing::error!(model = %name, worker = %worker, error = %why, "an RPC worker of the model is gone; stopping its llama-server");
                let _ = r.lost_worker.set((worker, why));
                r.backend.stop(grace.min(Duration::from_millis(100))).await;
                return;
            }
        }
        if strikes >= WATCHDOG_STRIKES {
            tracing::error!(model = %name, strikes, "backend stopped answering its health checks; killing it");
            r.wedged.store(true, Ordering::SeqCst);
            r.backend.stop(grace.min(Duration::from_millis(100))).await;
            return;
        }
    }
}

/// A start failure as the scheduler's failure policy reads it: only a process that started and
/// did not become ready may be retried after evicting others.
fn load_error(f: StartFailure) -> LoadError {
    match f {
        StartFailure::Fatal(m) => LoadError::fatal(m),
        StartFailure::NotReady(m) => LoadError::not_ready(m),
    }
}
