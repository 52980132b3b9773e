//! The model-lifecycle state machine: `handle(event, now) -> effects`. No I/O, no clock.
//!
//! The server feeds it events (requests, loads, unloads, backend outcomes) from one owner
//! task and executes the effects it returns (start/stop a backend, answer a request).
//!
//! Rules (Lemonade's multi-model spec, and scheduler v2):
//! * per-type slots, LRU eviction within a type; NPU models exclude each other;
//! * a model with requests in flight is never stopped: eviction and unload drain it first;
//! * loads are serialized; which model gives way is decided when a queued load starts;
//! * the requests that caused a load are granted in the same step the load completes, so the
//!   model cannot be evicted between its load and those requests;
//! * a failed load evicts every unpinned model and retries once, unless the file is missing;
//! * `load` with other options reloads in place; with the same options it is a no-op, and a
//!   duplicate load while loading joins it; unloading a loading model cancels the load;
//! * a backend that exits on its own leaves the model `failed`; the next request reloads it,
//!   after a back-off that doubles with each crash;
//! * a pinned model is never evicted (slots, memory, failed-load evict-all) nor timed out; a
//!   load that needs a slot only pinned models hold is refused at once (`SlotsPinned`);
//! * with a memory budget (and a VRAM budget, for models on GPU backends), the models alive
//!   never take more than it: least recently used, unpinned models that take some of that
//!   pool give way (idle first), and a model that cannot fit even then is refused;
//! * at most `max_concurrent` requests run on a model at once; the others wait in its queue,
//!   and the waiting requests of all models are bounded by `max_queue` (then `QueueFull`);
//! * anti-thrash: a load caused by requests does not evict a model that is serving (requests
//!   in flight or queued, or its last one ended less than [`HOLD_GAP_MS`] ago) until that load
//!   has waited `swap_hold_ms`; meanwhile the loaded model keeps serving. A load that finds
//!   its victims idle swaps at once, and an explicit `load` never waits.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use api_types::ModelType;

use crate::devices::{split, Device, Placement, Shares};
use crate::Limits;

pub type ReqId = u64;

/// What the machine needs to know about a model, as the event that names it sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub name: String,
    pub model_type: ModelType,
    /// Runs on the NPU (recipes `flm`, `ryzenai-llm`): NPU models exclude each other.
    pub npu: bool,
    /// Estimated bytes of system memory its backend takes with the options this event loads
    /// it with (0: unknown, counted as nothing).
    pub memory: u64,
    /// Estimated bytes of GPU memory (VRAM) it takes (0 for CPU backends).
    pub vram: u64,
    /// Its own idle timeout (ms; 0 = never), applied when this event loads it; None: the
    /// machine's.
    pub idle_timeout_ms: Option<u64>,
    /// Requests it serves at once; further ones wait in its queue. None: no limit.
    pub max_concurrent: Option<u32>,
    /// An `Acquire` that sets the idle timeout (Ollama's `keep_alive`): `idle_timeout_ms`
    /// applies at once to the backend running (or starting), not only to a load it causes.
    pub sets_idle_timeout: bool,
    /// An `Acquire`'s priority: among the requests waiting for this model, higher goes first
    /// (equal ones in arrival order). 0 by default.
    pub priority: i32,
    /// The devices it asks to run on (the `device` load option).
    pub placement: Placement,
    /// The model's own priority (its saved `priority`): among the models waiting to load, a
    /// higher one loads first (equal ones in the order asked). 0 by default.
    pub model_priority: i32,
    /// An `Acquire` by a router collection's classifier (Lemonade v11's routing helper): the
    /// model serves in the helper pool, which takes no slot of its type, so a router and its
    /// candidate stay loaded side by side under `max_loaded_models`.
    pub helper: bool,
}

impl ModelRef {
    pub fn new(name: &str, model_type: ModelType, npu: bool) -> ModelRef {
        ModelRef {
            name: name.into(),
            model_type,
            npu,
            memory: 0,
            vram: 0,
            idle_timeout_ms: None,
            max_concurrent: None,
            sets_idle_timeout: false,
            priority: 0,
            placement: Placement::Auto,
            model_priority: 0,
            helper: false,
        }
    }

    /// Its estimated bytes in `pool`.
    pub fn size(&self, pool: Pool) -> u64 {
        match pool {
            Pool::Memory => self.memory,
            Pool::Vram => self.vram,
        }
    }
}

/// The two kinds of memory a backend takes, each with its own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// System memory (RAM).
    Memory,
    /// GPU memory: summed over the GPUs for the VRAM budget, or one GPU's own ledger.
    Vram,
}

impl Pool {
    pub const ALL: [Pool; 2] = [Pool::Memory, Pool::Vram];

    /// How error messages name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Memory => "memory",
            Pool::Vram => "VRAM",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Unloaded,
    Loading,
    Loaded,
    Unloading,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unloaded => "unloaded",
            State::Loading => "loading",
            State::Loaded => "loaded",
            State::Unloading => "unloading",
            State::Failed => "failed",
        }
    }
}

/// Why a start failed, and what kind of failure it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub message: String,
    pub kind: Failure,
}

/// What the failure policy does about a failed start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing would change by trying again: a missing file or binary, a refused command
    /// line, an unreachable RPC worker. No eviction, no retry.
    Fatal,
    /// The process started but never became ready (it may have lacked memory): the first
    /// such failure evicts everything and retries once.
    NotReady,
}

impl LoadError {
    pub fn fatal(message: impl Into<String>) -> LoadError {
        LoadError { message: message.into(), kind: Failure::Fatal }
    }

    pub fn not_ready(message: impl Into<String>) -> LoadError {
        LoadError { message: message.into(), kind: Failure::NotReady }
    }
}

/// Settings that can change while the machine runs (`None` leaves one as it is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub limits: Option<Limits>,
    /// ms; `Some(None)`: never.
    pub idle_timeout_ms: Option<Option<u64>>,
    /// `Some(None)`: unbounded.
    pub max_queue: Option<Option<usize>>,
    /// bytes; `Some(None)`: no budget.
    pub memory_budget: Option<Option<u64>>,
    /// bytes of VRAM; `Some(None)`: no budget.
    pub vram_budget: Option<Option<u64>>,
    pub swap_hold_ms: Option<u64>,
    /// The GPUs and NPUs models are placed on, each with its budget.
    pub devices: Option<Vec<Device>>,
}

impl Settings {
    /// These settings, with `base`'s where these leave one unset.
    pub fn over(self, base: Settings) -> Settings {
        Settings {
            limits: self.limits.or(base.limits),
            idle_timeout_ms: self.idle_timeout_ms.or(base.idle_timeout_ms),
            max_queue: self.max_queue.or(base.max_queue),
            memory_budget: self.memory_budget.or(base.memory_budget),
            vram_budget: self.vram_budget.or(base.vram_budget),
            swap_hold_ms: self.swap_hold_ms.or(base.swap_hold_ms),
            devices: self.devices.or(base.devices),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event<O> {
    /// An inference request wants `model`. `auto_load` carries the options to load it with
    /// when it is not loaded; None rejects the request instead.
    Acquire { req: ReqId, model: ModelRef, auto_load: Option<O> },
    /// A granted request finished (completion, error or client disconnect).
    Release { req: ReqId },
    /// A request still waiting for its model was abandoned by its client.
    Cancel { req: ReqId },
    /// Explicit load (`/load`, admin load); `pin` pins or unpins it as well.
    Load { req: ReqId, model: ModelRef, options: O, pin: Option<bool> },
    /// The admin API's load, whose conditions are checked here, against the state the machine
    /// holds (never a published snapshot): an unloading model refuses it; a loaded one is left
    /// as it is; `overrides` (runtime-only options) are refused while it is loaded or loading.
    AdminLoad { req: ReqId, model: ModelRef, options: O, overrides: bool },
    /// Unload one model, or every model.
    Unload { req: ReqId, model: Option<String> },
    /// Pin or unpin a model that is loaded or loading.
    Pin { req: ReqId, model: String, pinned: bool },
    /// Change the machine's settings (answered with `Configured`).
    Configure { req: ReqId, settings: Settings },
    /// A backend start finished.
    Started { model: String, result: Result<(), LoadError> },
    /// A backend stop finished (the process is gone).
    Stopped { model: String },
    /// A backend exited on its own.
    Exited { model: String, error: String },
    /// The system memory a loaded backend's process holds was measured (its RSS): past its
    /// estimate, the difference is counted as used (placement and eviction see it); back under
    /// it, the estimate is counted again.
    Measured { model: String, memory: u64 },
    /// The GPU memory a loaded backend's process holds was measured (NVML, summed over its
    /// devices): past its VRAM estimate, the difference is counted as used on the devices it was
    /// placed on, in proportion to their shares (placement and eviction see it); back under it,
    /// the estimate's shares are counted again.
    MeasuredVram { model: String, vram: u64 },
    /// Time passed (the executor sends it at [`Machine::next_deadline`]): idle models whose
    /// timeout is over are unloaded, and held swaps go ahead.
    Tick,
}

/// `shares` (summing to `estimate`) grown to sum to `counted`: each device takes the excess in
/// proportion to its share, the rounding remainder going to the largest share.
fn grown(shares: &Shares, estimate: u64, counted: u64) -> Shares {
    let extra = counted.saturating_sub(estimate);
    if extra == 0 || shares.is_empty() {
        return shares.clone();
    }
    let weights: u128 = shares.values().map(|v| u128::from(*v).max(1)).sum();
    let mut out: Shares = shares
        .iter()
        .map(|(id, v)| (id.clone(), v + (u128::from(extra) * u128::from(*v).max(1) / weights) as u64))
        .collect();
    let given: u64 = out.values().sum::<u64>() - shares.values().sum::<u64>();
    if let Some(largest) = shares.iter().max_by_key(|(_, v)| **v).map(|(id, _)| id.clone()) {
        *out.get_mut(&largest).expect("present") += extra - given;
    }
    out
}

/// Why a request (or a load) was not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    NotLoaded,
    Loading,
    Unloading,
    Failed(String),
    /// The load it waited for failed.
    LoadFailed(String),
    /// The model keeps crashing; it loads again in `retry_in_ms`.
    Backoff {
        error: String,
        retry_in_ms: u64,
    },
    /// The slot it needs is held by pinned models only (named here).
    SlotsPinned(Vec<String>),
    /// It can never fit the budget of `pool` (of one device's, when `device` names it): it
    /// needs `needed` bytes, the budget is `budget`, of which `pinned` bytes are held by pinned
    /// models.
    NoMemory {
        pool: Pool,
        device: Option<String>,
        needed: u64,
        budget: u64,
        pinned: u64,
    },
    /// The admin API's overrides need the model unloaded; it is in this state.
    InUse(State),
    /// `max_queue` requests are already waiting.
    QueueFull {
        max_queue: usize,
        retry_in_ms: u64,
    },
    /// It asks for a device the machine does not have (the devices there are).
    UnknownDevice {
        device: String,
        known: Vec<String>,
    },
}

impl Rejection {
    /// The admin API's machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::NotLoaded => "model_not_loaded",
            Rejection::Loading => "model_loading",
            Rejection::Unloading => "model_unloading",
            Rejection::Failed(_) | Rejection::Backoff { .. } => "model_failed",
            Rejection::LoadFailed(_) => "model_load_error",
            Rejection::SlotsPinned(_) => "slots_pinned",
            Rejection::NoMemory { .. } => "insufficient_memory",
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::InUse(_) => "model_in_use",
            Rejection::UnknownDevice { .. } => "unknown_device",
        }
    }
}

/// One scheduling decision, with its reason: what `/api/v1/scheduler` lists, the log says and
/// `lemonade_scheduler_decisions_total{decision, reason}` counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// `load`, `evict`, `unload`, `queue`, `reject`, `refuse` or `crash`.
    pub decision: &'static str,
    /// Why: `request`, `explicit`, `reload`, `make_room`, `idle_timeout`, `retry_after_evict_all`,
    /// `loading`, `busy`, `backend_exited`, or a rejection's code.
    pub reason: &'static str,
    pub model: String,
    /// The details a reader needs (the load a model makes room for, the figures of a refusal).
    pub detail: String,
}

/// What a load would do ([`Machine::plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `loaded` (it already is, with these options), `load`, `refused`, or `waits` (for the
    /// models it must stop to finish their requests, or for a load in progress).
    pub outcome: &'static str,
    /// The models it would stop, in order.
    pub evicts: Vec<String>,
    pub refusal: Option<Rejection>,
    /// Every decision the load would take.
    pub decisions: Vec<Decision>,
    /// The devices it would run on, with the bytes it would hold on each.
    pub devices: Shares,
}

/// How long a `QueueFull` client is told to wait before it retries.
pub const QUEUE_FULL_RETRY_MS: u64 = 1_000;

/// A model whose last request ended less than this ago still counts as serving for the
/// anti-thrash hold: a client's next request follows its last one within it.
pub const HOLD_GAP_MS: u64 = 250;

#[derive(Debug, Clone, PartialEq)]
pub enum Effect<O> {
    /// Start the backend of `model` with `options` on `devices` (the bytes it holds on each;
    /// empty: no device chosen); answer with `Started`.
    Start {
        model: String,
        options: O,
        devices: Shares,
    },
    /// Stop (or cancel the start of) the backend of `model`; answer with `Stopped`.
    Stop {
        model: String,
    },
    /// The request may use the model (the lease is counted in flight).
    Grant {
        req: ReqId,
        model: String,
    },
    Reject {
        req: ReqId,
        model: String,
        why: Rejection,
    },
    /// Answer to `Load`.
    LoadDone {
        req: ReqId,
        model: String,
        result: LoadOutcome,
    },
    /// Answer to `Unload`: the models that were unloaded, or `NotLoaded`.
    UnloadDone {
        req: ReqId,
        result: Result<Vec<String>, SchedulerError>,
    },
    /// Answer to `Pin`.
    PinDone {
        req: ReqId,
        result: Result<(), SchedulerError>,
    },
    /// Answer to `Configure`.
    Configured {
        req: ReqId,
    },
}

/// What the anti-thrash rule says of the load at the head of the queue.
enum Hold {
    Go,
    Until(u64),
    Drop,
}

/// How an explicit load ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    Loaded,
    /// An unload cancelled it (the server answers 409, not 500).
    Cancelled,
    /// The backend did not start; the reason (exit status, log tail, …).
    Failed(String),
    /// It was not started: no slot or memory can be freed for it.
    Refused(Rejection),
}

/// The errors of this crate's answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("Model not loaded: {0}")]
    NotLoaded(String),
}

/// The pause after the second crash in a row (the first reloads at once); doubles per crash,
/// capped.
pub const CRASH_BACKOFF_MS: u64 = 1_000;
pub const CRASH_BACKOFF_MAX_MS: u64 = 30_000;
/// The pause before a model that crashed `crashes` times in a row loads again: none after the
/// first crash, then `base` ms doubling per crash up to [`CRASH_BACKOFF_MAX_MS`].
pub fn crash_backoff_ms(base: u64, crashes: u32) -> u64 {
    match crashes {
        0 | 1 => 0,
        n => (base << (n - 2).min(16)).min(CRASH_BACKOFF_MAX_MS),
    }
}

/// A backend that ran this long before it crashed starts the count again: the back-off is for
/// crash loops, not for a crash once in a while.
pub const CRASH_RESET_MS: u64 = 60_000;

#[derive(Debug, Clone)]
pub struct Entry<O> {
    pub model: ModelRef,
    pub state: State,
    /// Options of the running (or starting) backend.
    pub options: Option<O>,
    pub in_flight: BTreeSet<ReqId>,
    /// Requests waiting for the model: to load, or for a free place (`max_concurrent`).
    pub waiting: Vec<ReqId>,
    pub last_use: u64,
    pub last_error: Option<String>,
    /// Options of a queued load (present while the model is in the load queue or must be
    /// loaded again after it finishes unloading).
    pub pending: Option<O>,
    /// Never evicted nor timed out (an explicit unload still unloads it, and unpins it).
    pub pinned: bool,
    /// Bytes of system memory the running (or starting) backend is counted for.
    pub memory: u64,
    /// Bytes of VRAM it is counted for.
    pub vram: u64,
    /// The devices the running (or starting) backend is placed on, and its bytes on each.
    pub shares: Shares,
    /// The placement chosen for the queued load, taken when it starts.
    placed: Shares,
    /// The shares the running backend was placed with (its estimate), which `shares` grows from
    /// when its measured VRAM passes the estimate.
    estimated: Shares,
    /// The idle timeout of the running backend (ms; 0 = never); None: the machine's.
    pub idle_timeout_ms: Option<u64>,
    /// Requests the running backend serves at once.
    pub max_concurrent: Option<u32>,
    /// Loads waiting for it, each with the options it asked for: a load answered when the model
    /// is loaded with its options, or when a later load asked for others (the last one wins).
    load_waiters: Vec<(ReqId, O)>,
    starting: bool,
    stopping: bool,
    /// A start succeeded while a stop was in flight. That stop may have looked for the process
    /// before the executor registered it, so another one follows when it reports.
    stop_again: bool,
    /// 0 for the first attempt of a load, 1 for the retry after evict-all.
    attempt: u8,
    /// Crashes in a row, each within `CRASH_RESET_MS` of its load.
    crashes: u32,
    retry_after: u64,
    /// When the current backend became ready.
    loaded_at: u64,
    /// The queued load found a victim serving: it holds the swap (anti-thrash).
    holding: bool,
    /// The running (or starting) backend is in the routing-helper pool: it holds no slot of
    /// its type. A request that is not a helper's moves it to the standard pool (when a slot
    /// is free, or an idle model's can be taken), a helper's back.
    pub helper: bool,
}

impl<O> Entry<O> {
    /// Bytes of `pool` the running (or starting) backend is counted for.
    pub fn size(&self, pool: Pool) -> u64 {
        match pool {
            Pool::Memory => self.memory,
            Pool::Vram => self.vram,
        }
    }
    pub fn queue_depth(&self) -> usize {
        self.waiting.len()
    }
    /// Bytes it holds on `device`; None: not placed there.
    pub fn share(&self, device: &str) -> Option<u64> {
        self.shares.get(device).copied()
    }
    /// Holds (or is about to hold) a slot.
    fn occupies(&self) -> bool {
        matches!(self.state, State::Loading | State::Loaded | State::Unloading)
    }
    /// Requests in flight or waiting.
    fn busy(&self) -> bool {
        !self.in_flight.is_empty() || !self.waiting.is_empty()
    }
    fn has_room(&self) -> bool {
        self.max_concurrent.is_none_or(|n| self.in_flight.len() < n as usize)
    }
}

#[derive(Clone)]
pub struct Machine<O> {
    /// Decisions since the last [`Machine::take_decisions`].
    decisions: Vec<Decision>,
    limits: Limits,
    models: BTreeMap<String, Entry<O>>,
    /// Models waiting to load, in order.
    queue: VecDeque<String>,
    /// The load in progress (from dequeue until loaded, failed or cancelled), and the
    /// models it waits on to stop before it can start.
    current: Option<String>,
    evicting: BTreeSet<String>,
    /// Which model each granted request holds, and each waiting request waits for (since
    /// when).
    granted: BTreeMap<ReqId, String>,
    waiting: BTreeMap<ReqId, (String, u64, i32)>,
    /// Unload requests and the models each still waits for.
    unload_waiters: Vec<(ReqId, BTreeSet<String>, Vec<String>)>,
    out: Vec<Effect<O>>,
    now: u64,
    /// How long a backend must run before a crash no longer counts towards the back-off.
    crash_reset_ms: u64,
    /// The first back-off (after the second crash in a row).
    crash_backoff_ms: u64,
    /// A model with no request for this long is unloaded (None: never).
    idle_timeout_ms: Option<u64>,
    /// At most this many requests wait, all models together (None: no bound).
    max_queue: Option<usize>,
    /// Bytes of system memory the backends alive may take together (None: no budget).
    memory_budget: Option<u64>,
    /// Bytes of VRAM they may take together (None: no budget).
    vram_budget: Option<u64>,
    /// The GPUs and NPUs models are placed on.
    devices: Vec<Device>,
    /// How long a load caused by requests waits for a serving model before evicting it.
    swap_hold_ms: u64,
    /// When the held swap at the head of the queue is looked at again.
    hold_deadline: Option<u64>,
}

impl<O: Clone + PartialEq> Machine<O> {
    pub fn new(limits: Limits) -> Machine<O> {
        Machine {
            decisions: Vec::new(),
            limits,
            models: BTreeMap::new(),
            queue: VecDeque::new(),
            current: None,
            evicting: BTreeSet::new(),
            granted: BTreeMap::new(),
            waiting: BTreeMap::new(),
            unload_waiters: Vec::new(),
            out: Vec::new(),
            now: 0,
            crash_reset_ms: CRASH_RESET_MS,
            crash_backoff_ms: CRASH_BACKOFF_MS,
            idle_timeout_ms: None,
            max_queue: None,
            memory_budget: None,
            vram_budget: None,
            devices: Vec::new(),
            swap_hold_ms: 0,
            hold_deadline: None,
        }
    }

    /// Applies `s` (the builder form of [`Event::Configure`]).
    pub fn with_settings(mut self, s: Settings) -> Machine<O> {
        self.configure(s);
        self
    }

    /// Sets the crash back-off: its first pause (default [`CRASH_BACKOFF_MS`]) and how long a
    /// backend must run before its crash count starts again (default [`CRASH_RESET_MS`]).
    /// Tests shorten the minute.
    pub fn with_crash_backoff(mut self, first_ms: u64, reset_ms: u64) -> Machine<O> {
        self.crash_backoff_ms = first_ms;
        self.crash_reset_ms = reset_ms;
        self
    }

    /// The settings in force (every field `Some`).
    pub fn settings(&self) -> Settings {
        Settings {
            limits: Some(self.limits.clone()),
            idle_timeout_ms: Some(self.idle_timeout_ms),
            max_queue: Some(self.max_queue),
            memory_budget: Some(self.memory_budget),
            vram_budget: Some(self.vram_budget),
            swap_hold_ms: Some(self.swap_hold_ms),
            devices: Some(self.devices.clone()),
        }
    }

    fn configure(&mut self, s: Settings) {
        if let Some(l) = s.limits {
            self.limits = l;
        }
        if let Some(t) = s.idle_timeout_ms {
            self.idle_timeout_ms = t.filter(|t| *t > 0);
        }
        if let Some(q) = s.max_queue {
            self.max_queue = q;
        }
        if let Some(b) = s.memory_budget {
            self.memory_budget = b;
        }
        if let Some(b) = s.vram_budget {
            self.vram_budget = b;
        }
        if let Some(h) = s.swap_hold_ms {
            self.swap_hold_ms = h;
        }
        if let Some(d) = s.devices {
            self.devices = d;
        }
    }

    /// The idle timeout that applies to `e`: its own, else the machine's (ms; None: never).
    pub fn idle_timeout_of(&self, e: &Entry<O>) -> Option<u64> {
        match e.idle_timeout_ms {
            Some(0) => None,
            Some(t) => Some(t),
            None => self.idle_timeout_ms,
        }
    }

    /// When `e` will be unloaded for idleness if nothing uses it (None: it will not).
    pub fn unload_at(&self, e: &Entry<O>) -> Option<u64> {
        if !self.idle(e) {
            return None;
        }
        self.idle_timeout_of(e).map(|t| e.last_use.saturating_add(t))
    }

    /// When the machine next needs a `Tick` (ms, the clock of `handle`): an idle model times
    /// out, or a held swap is due.
    pub fn next_deadline(&self) -> Option<u64> {
        self.models.values().filter_map(|e| self.unload_at(e)).chain(self.hold_deadline).min()
    }

    /// Loaded and unpinned, with nothing in flight or waiting and no reload pending: may time
    /// out.
    fn idle(&self, e: &Entry<O>) -> bool {
        e.state == State::Loaded
            && !e.pinned
            && !e.busy()
            && e.load_waiters.is_empty()
            && e.pending.is_none()
            && self.current.as_deref() != Some(e.model.name.as_str())
    }

    /// Unloads every idle model whose timeout is over.
    fn expire_idle(&mut self) {
        let now = self.now;
        let expired: Vec<String> = self
            .models
            .values()
            .filter(|e| self.unload_at(e).is_some_and(|at| now >= at))
            .map(|e| e.model.name.clone())
            .collect();
        for name in expired {
            self.note("unload", "idle_timeout", &name, String::new());
            self.begin_unload(&name);
        }
    }

    /// Models waiting to load, in order (the one loading first).
    pub fn load_queue(&self) -> Vec<String> {
        self.current.iter().chain(self.queue.iter().filter(|q| self.current.as_ref() != Some(q))).cloned().collect()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry<O>> {
        self.models.values()
    }

    pub fn entry(&self, name: &str) -> Option<&Entry<O>> {
        self.models.get(name)
    }

    /// The load in progress, if any.
    pub fn current_load(&self) -> Option<&str> {
        self.current.as_deref()
    }

    /// The devices `name` runs on (or is about to: the placement of the load in progress).
    pub fn placement_of(&self, name: &str) -> Option<&Shares> {
        let e = self.models.get(name)?;
        if matches!(e.state, State::Unloaded | State::Failed) && self.current.as_deref() == Some(name) {
            return Some(&e.placed);
        }
        e.occupies().then_some(&e.shares)
    }

    /// Bytes of `device` held by the models alive.
    pub fn device_in_use(&self, device: &str) -> u64 {
        self.models.values().filter(|e| e.occupies()).filter_map(|e| e.share(device)).sum()
    }

    /// The priority of each request waiting for `name`, in the order they are served.
    pub fn waiting_priorities(&self, name: &str) -> Vec<i32> {
        let Some(e) = self.models.get(name) else { return Vec::new() };
        e.waiting.iter().filter_map(|r| self.waiting.get(r).map(|(_, _, p)| *p)).collect()
    }

    /// When each request waiting for `name` started waiting (ms), in the order they are
    /// served.
    pub fn waiting_since(&self, name: &str) -> Vec<u64> {
        let Some(e) = self.models.get(name) else { return Vec::new() };
        e.waiting.iter().filter_map(|r| self.waiting.get(r).map(|(_, since, _)| *since)).collect()
    }

    /// Bytes of `pool` counted for the backends alive (starting, running or stopping).
    pub fn in_use(&self, pool: Pool) -> u64 {
        self.models.values().filter(|e| e.occupies()).map(|e| e.size(pool)).sum()
    }

    fn budget(&self, pool: Pool) -> Option<u64> {
        match pool {
            Pool::Memory => self.memory_budget,
            Pool::Vram => self.vram_budget,
        }
    }

    /// Handles one event at time `now` (ms, monotonic) and returns the effects to execute.
    pub fn handle(&mut self, event: Event<O>, now: u64) -> Vec<Effect<O>> {
        self.now = now;
        match event {
            Event::Acquire { req, model, auto_load } => self.acquire(req, model, auto_load),
            Event::Release { req } => self.release(req),
            Event::Cancel { req } => self.cancel(req),
            Event::Load { req, model, options, pin } => self.load(req, model, options, pin),
            Event::AdminLoad { req, model, options, overrides } => self.admin_load(req, model, options, overrides),
            Event::Unload { req, model } => self.unload(req, model),
            Event::Pin { req, model, pinned } => self.pin(req, &model, pinned),
            Event::Configure { req, settings } => {
                self.configure(settings);
                self.out.push(Effect::Configured { req });
            }
            Event::Started { model, result } => self.started(&model, result),
            Event::Stopped { model } => self.stopped(&model),
            Event::Exited { model, error } => self.exited(&model, error),
            Event::Measured { model, memory } => self.measured(&model, Pool::Memory, memory),
            Event::MeasuredVram { model, vram } => self.measured(&model, Pool::Vram, vram),
            Event::Tick => {}
        }
        self.expire_idle();
        self.try_start();
        self.pump();
        std::mem::take(&mut self.out)
    }

    fn entry_mut(&mut self, model: &ModelRef) -> &mut Entry<O> {
        self.models.entry(model.name.clone()).or_insert_with(|| Entry {
            model: model.clone(),
            state: State::Unloaded,
            options: None,
            in_flight: BTreeSet::new(),
            waiting: Vec::new(),
            last_use: 0,
            last_error: None,
            pending: None,
            pinned: false,
            memory: 0,
            vram: 0,
            shares: Shares::new(),
            placed: Shares::new(),
            estimated: Shares::new(),
            idle_timeout_ms: None,
            max_concurrent: None,
            load_waiters: Vec::new(),
            starting: false,
            stopping: false,
            stop_again: false,
            attempt: 0,
            crashes: 0,
            loaded_at: 0,
            retry_after: 0,
            holding: false,
            helper: false,
        })
    }

    fn get(&mut self, name: &str) -> &mut Entry<O> {
        self.models.get_mut(name).expect("known model")
    }

    fn queued(&self, name: &str) -> bool {
        self.queue.iter().any(|n| n == name) || self.current.as_deref() == Some(name)
    }

    fn grant(&mut self, req: ReqId, name: &str) {
        let now = self.now;
        let e = self.get(name);
        e.in_flight.insert(req);
        e.last_use = now;
        self.granted.insert(req, name.to_string());
        self.out.push(Effect::Grant { req, model: name.to_string() });
    }

    /// Grants waiting requests of a loaded model, oldest first, while it has room.
    fn grant_waiting(&mut self, name: &str) {
        loop {
            let e = self.get(name);
            if e.state != State::Loaded || e.waiting.is_empty() || !e.has_room() {
                return;
            }
            let r = e.waiting.remove(0);
            self.waiting.remove(&r);
            self.grant(r, name);
        }
    }

    fn reject(&mut self, req: ReqId, name: &str, why: Rejection) {
        self.note("reject", why.code(), name, format!("{why:?}"));
        self.out.push(Effect::Reject { req, model: name.to_string(), why });
    }

    /// A loaded backend's measured memory of `pool`: counted when it is more than its estimate
    /// (VRAM on the devices it was placed on, each share grown in proportion).
    fn measured(&mut self, name: &str, pool: Pool, bytes: u64) {
        let Some(e) = self.models.get_mut(name).filter(|e| e.state == State::Loaded) else { return };
        let estimate = match pool {
            Pool::Memory => e.model.memory,
            Pool::Vram => e.model.vram,
        };
        let counted = bytes.max(estimate);
        if counted == e.size(pool) {
            return;
        }
        let mut on = String::new();
        match pool {
            Pool::Memory => e.memory = counted,
            Pool::Vram => {
                e.vram = counted;
                e.shares = grown(&e.estimated, estimate, counted);
                if !e.shares.is_empty() {
                    on = format!(" on {}", e.shares.keys().cloned().collect::<Vec<_>>().join(", "));
                }
            }
        }
        let mib = |b: u64| b / (1 << 20);
        let (over, within) = match pool {
            Pool::Memory => ("over its estimate", "within its estimate"),
            Pool::Vram => ("VRAM over its estimate", "VRAM within its estimate"),
        };
        let (reason, detail) = match counted > estimate {
            true => (
                over,
                format!(
                    "counts {} MiB{on}: measured {} MiB, estimated {} MiB",
                    mib(counted),
                    mib(bytes),
                    mib(estimate)
                ),
            ),
            false => (within, format!("counts its estimate, {} MiB{on}, again", mib(estimate))),
        };
        self.note("measured", reason, name, detail);
    }

    fn note(&mut self, decision: &'static str, reason: &'static str, model: &str, detail: String) {
        self.decisions.push(Decision { decision, reason, model: model.to_string(), detail });
    }

    /// The decisions taken since the last call.
    pub fn take_decisions(&mut self) -> Vec<Decision> {
        std::mem::take(&mut self.decisions)
    }

    /// What an explicit load of `model` with `options` would do at `now`, worked out on a copy
    /// of the machine whose backends start and stop at once (nothing changes here).
    pub fn plan(&self, model: ModelRef, options: O, now: u64) -> Plan {
        let mut m = self.clone();
        m.decisions.clear();
        let (req, name, now) = (ReqId::MAX, model.name.clone(), now.max(self.now));
        let already =
            m.models.get(&name).is_some_and(|e| e.state == State::Loaded && e.options.as_ref() == Some(&options));
        let mut events: VecDeque<Event<O>> = VecDeque::from([Event::Load { req, model, options, pin: None }]);
        let mut outcome = None;
        for _ in 0..256 {
            let Some(ev) = events.pop_front() else { break };
            for e in m.handle(ev, now) {
                match e {
                    Effect::Stop { model } => events.push_back(Event::Stopped { model }),
                    Effect::Start { model, .. } => events.push_back(Event::Started { model, result: Ok(()) }),
                    Effect::LoadDone { req: r, result, .. } if r == req => outcome = Some(result),
                    _ => {}
                }
            }
        }
        let decisions = m.take_decisions();
        let evicts = decisions.iter().filter(|d| d.decision == "evict" || (d.decision == "unload" && d.model != name));
        let evicts: Vec<String> = evicts.map(|d| d.model.clone()).collect();
        let (outcome, refusal) = match outcome {
            Some(LoadOutcome::Loaded) if already => ("loaded", None),
            Some(LoadOutcome::Loaded) => ("load", None),
            Some(LoadOutcome::Refused(r)) => ("refused", Some(r)),
            Some(LoadOutcome::Failed(_) | LoadOutcome::Cancelled) | None => ("waits", None),
        };
        let devices = m.models.get(&name).map(|e| e.shares.clone()).unwrap_or_default();
        Plan { outcome, evicts, refusal, decisions, devices }
    }

    /// Queues a load of `name` with `options` unless one is queued or running.
    fn enqueue(&mut self, name: &str, options: O, front: bool) {
        let queued = self.queued(name);
        let e = self.get(name);
        e.pending = Some(options);
        if !queued {
            e.holding = false;
            if front {
                self.queue.push_front(name.to_string());
            } else {
                // Behind the models of its priority and above, ahead of those below.
                let p = self.models[name].model.model_priority;
                let at = self.queue.iter().position(|q| self.models.get(q).is_some_and(|e| e.model.model_priority < p));
                self.queue.insert(at.unwrap_or(self.queue.len()), name.to_string());
            }
        }
    }

    /// Whether one more request may wait.
    fn queue_full(&self) -> Option<Rejection> {
        let max = self.max_queue?;
        (self.waiting.len() >= max).then_some(Rejection::QueueFull { max_queue: max, retry_in_ms: QUEUE_FULL_RETRY_MS })
    }

    fn wait(&mut self, req: ReqId, name: &str, priority: i32) {
        // Higher priority first; equal ones in arrival order.
        self.get(name);
        let waiting = &self.models[name].waiting;
        let at =
            waiting.iter().position(|r| self.waiting.get(r).map_or(0, |w| w.2) < priority).unwrap_or(waiting.len());
        let e = self.get(name);
        let reason = if e.state == State::Loaded { "busy" } else { "loading" };
        e.waiting.insert(at, req);
        let detail = format!("request {req} waits, {} in line for it (priority {priority})", at + 1);
        self.note("queue", reason, name, detail);
        self.waiting.insert(req, (name.to_string(), self.now, priority));
    }

    fn acquire(&mut self, req: ReqId, model: ModelRef, auto_load: Option<O>) {
        if let Some(why) = self.unknown_device(&model) {
            return self.reject(req, &model.name, why);
        }
        let now = self.now;
        let (name, priority) = (model.name.clone(), model.priority);
        let queued = self.queued(&name);
        let full = self.queue_full();
        let e = self.entry_mut(&model);
        if model.sets_idle_timeout {
            // For the backend running (or starting) now; else for the start to come. A
            // backend stopping keeps it to itself: its reload is a new backend.
            if matches!(e.state, State::Loaded | State::Loading) {
                e.idle_timeout_ms = model.idle_timeout_ms;
            } else {
                e.model.idle_timeout_ms = model.idle_timeout_ms;
            }
        }
        let state = e.state;
        let (helper, was_helper) = (model.helper, e.helper);
        if state == State::Loaded && helper != was_helper {
            self.change_pool(&name, helper);
        }
        let e = self.get(&name);
        if state == State::Loaded && e.waiting.is_empty() && e.has_room() {
            return self.grant(req, &name);
        }
        match (state, auto_load) {
            (State::Failed, Some(_)) if e.retry_after > now => {
                let why = Rejection::Backoff {
                    error: e.last_error.clone().unwrap_or_default(),
                    retry_in_ms: e.retry_after - now,
                };
                self.reject(req, &name, why);
            }
            // It would wait, and the queue is full.
            (State::Loaded, _) | (_, Some(_)) if full.is_some() => {
                self.reject(req, &name, full.expect("checked by the guard"))
            }
            // At its concurrency limit (or behind others who are): wait for a place.
            (State::Loaded, _) => self.wait(req, &name, priority),
            (_, Some(options)) => {
                if !matches!(state, State::Loading | State::Unloading) && !queued {
                    // This request causes the load: its view of the model applies.
                    e.model = model;
                }
                let unloading_without_reload = state == State::Unloading && e.pending.is_none();
                if unloading_without_reload {
                    e.pending = Some(options.clone());
                }
                self.wait(req, &name, priority);
                match state {
                    // Loads again once the unload finishes (unless a reload is already set).
                    State::Unloading | State::Loading => {}
                    _ if queued => {}
                    _ => self.enqueue(&name, options, false),
                }
            }
            (State::Unloaded, None) if queued => self.reject(req, &name, Rejection::Loading),
            (State::Unloaded, None) => self.reject(req, &name, Rejection::NotLoaded),
            (State::Loading, None) => self.reject(req, &name, Rejection::Loading),
            (State::Unloading, None) => self.reject(req, &name, Rejection::Unloading),
            (State::Failed, None) => {
                let err = e.last_error.clone().unwrap_or_default();
                self.reject(req, &name, Rejection::Failed(err))
            }
        }
    }

    /// Moves the loaded `name` into the helper pool (always possible: it frees a slot), or out
    /// of it into its type's standard slots: at once when one is free, else by evicting idle
    /// unpinned standard models of its type, least recently used first; when they are busy it
    /// stays a helper for now.
    fn change_pool(&mut self, name: &str, helper: bool) {
        if helper {
            self.get(name).helper = true;
            self.note("pool", "routing_helper", name, "serves a router's classifier".into());
            return;
        }
        let t = self.models[name].model.model_type;
        let limit = self.limits.get(t);
        let standard = |e: &Entry<O>| e.model.model_type == t && !e.helper;
        // The load under way has its slot already (its victims are stopping for it).
        let starting = |n: &str| self.current.as_deref() == Some(n);
        let occupied = (self.models.iter())
            .filter(|(n, e)| n.as_str() != name && e.model.model_type == t)
            .filter(|(n, e)| (e.occupies() && !e.helper) || (starting(n) && !e.occupies() && !e.model.helper))
            .count() as i64;
        let mut victims = Vec::new();
        if limit >= 0 && occupied >= limit {
            let idle: Vec<String> =
                (self.lru(name, &standard, &BTreeSet::new()).into_iter()).filter(|n| !self.models[n].busy()).collect();
            let need = (occupied - limit + 1) as usize;
            if idle.len() < need {
                return;
            }
            victims = idle.into_iter().take(need).collect();
        }
        for v in &victims {
            self.note("evict", "make_room", v, format!("{name} leaves the routing-helper pool"));
            self.begin_unload(v);
        }
        self.get(name).helper = false;
        self.note("pool", "standard", name, "asked for directly".into());
    }

    fn release(&mut self, req: ReqId) {
        let Some(name) = self.granted.remove(&req) else { return };
        let now = self.now;
        let e = self.get(&name);
        e.in_flight.remove(&req);
        e.last_use = now;
        if e.state == State::Unloading && e.in_flight.is_empty() {
            self.stop(&name);
        } else {
            self.grant_waiting(&name);
        }
    }

    /// The client stopped waiting. If its grant crossed the cancel (granted, but the client was
    /// gone before it read the answer), the grant is given back like a release: otherwise the
    /// model would hold a request nobody will ever finish, and could never be unloaded.
    fn cancel(&mut self, req: ReqId) {
        if let Some((name, _, _)) = self.waiting.remove(&req) {
            self.get(&name).waiting.retain(|r| *r != req);
        } else {
            self.release(req);
        }
    }

    /// The refusal of a model that asks for a device the machine does not have: given before
    /// anything else happens (a loaded model is not stopped for a load that cannot start).
    fn unknown_device(&self, m: &ModelRef) -> Option<Rejection> {
        let Placement::On(ids) = &m.placement else { return None };
        let missing = ids.iter().find(|id| !self.devices.iter().any(|d| &d.id == *id))?;
        Some(Rejection::UnknownDevice {
            device: missing.clone(),
            known: self.devices.iter().map(|d| d.id.clone()).collect(),
        })
    }

    fn load(&mut self, req: ReqId, model: ModelRef, options: O, pin: Option<bool>) {
        if let Some(why) = self.unknown_device(&model) {
            self.note("refuse", why.code(), &model.name, format!("{why:?}"));
            let result = LoadOutcome::Refused(why);
            return self.out.push(Effect::LoadDone { req, model: model.name, result });
        }
        let name = model.name.clone();
        let now = self.now;
        let queued = self.queued(&name);
        let e = self.entry_mut(&model);
        if let Some(p) = pin {
            e.pinned = p;
        }
        // A backend running (or coming or going) stays in its pool, a reload in place too; a
        // direct request moves a helper back (`change_pool`).
        // A queued load keeps the pool its victims were (or will be) chosen for.
        let helper = (matches!(e.state, State::Loaded | State::Loading | State::Unloading) && e.helper)
            || (queued && e.model.helper);
        e.model = ModelRef { helper, ..model };
        match e.state {
            State::Loaded if e.options.as_ref() == Some(&options) && e.pending.is_none() => {
                // Same backend: only its own settings change.
                e.last_use = now;
                e.idle_timeout_ms = e.model.idle_timeout_ms;
                e.max_concurrent = e.model.max_concurrent;
                self.out.push(Effect::LoadDone { req, model: name.clone(), result: LoadOutcome::Loaded });
                // A higher `max_concurrent` lets waiting requests in at once.
                self.grant_waiting(&name);
            }
            State::Loaded => {
                // Reload in place: the same model gives up its slot and takes it back.
                e.load_waiters.push((req, options.clone()));
                e.pending = Some(options);
                self.note("unload", "reload", &name, "loaded again with other options".into());
                self.begin_unload(&name);
            }
            State::Loading if e.options.as_ref() == Some(&options) => e.load_waiters.push((req, options)),
            State::Loading | State::Unloading => {
                // Load again with these options once the current transition ends.
                e.load_waiters.push((req, options.clone()));
                e.pending = Some(options);
            }
            State::Unloaded | State::Failed => {
                e.load_waiters.push((req, options.clone()));
                e.retry_after = 0;
                if queued {
                    e.pending = Some(options);
                } else {
                    self.enqueue(&name, options, false);
                }
            }
        }
    }

    fn admin_load(&mut self, req: ReqId, model: ModelRef, options: O, overrides: bool) {
        let state = self.models.get(&model.name).map_or(State::Unloaded, |e| e.state);
        let done = match state {
            State::Unloading => LoadOutcome::Refused(Rejection::Unloading),
            State::Loaded | State::Loading if overrides => LoadOutcome::Refused(Rejection::InUse(state)),
            State::Loaded => LoadOutcome::Loaded,
            _ => return self.load(req, model, options, None),
        };
        self.out.push(Effect::LoadDone { req, model: model.name, result: done });
    }

    fn pin(&mut self, req: ReqId, name: &str, pinned: bool) {
        // Unpinning always succeeds; pinning needs the model loaded, loading or queued.
        let result = match self.models.get_mut(name) {
            Some(e) if !pinned || matches!(e.state, State::Loading | State::Loaded) || e.pending.is_some() => {
                e.pinned = pinned;
                Ok(())
            }
            None if !pinned => Ok(()),
            _ => Err(SchedulerError::NotLoaded(name.to_string())),
        };
        self.out.push(Effect::PinDone { req, result });
    }

    fn unload(&mut self, req: ReqId, model: Option<String>) {
        let names: Vec<String> = match &model {
            Some(n) => vec![n.clone()],
            None => {
                self.models.iter().filter(|(n, e)| e.occupies() || self.queued(n)).map(|(n, _)| n.clone()).collect()
            }
        };
        if let Some(n) = &model {
            let loaded = self.models.get(n).is_some_and(|e| e.occupies()) || self.queued(n);
            if !loaded {
                if let Some(e) = self.models.get_mut(n) {
                    e.pinned = false;
                }
                self.out.push(Effect::UnloadDone { req, result: Err(SchedulerError::NotLoaded(n.clone())) });
                return;
            }
        }
        if model.is_none() {
            for e in self.models.values_mut() {
                e.pinned = false;
            }
        }
        let mut pending = BTreeSet::new();
        for n in &names {
            // An explicit unload cancels a queued reload and the requests waiting for one, and
            // unpins the model.
            let e = self.get(n);
            e.pending = None;
            e.pinned = false;
            let waiters = std::mem::take(&mut e.waiting);
            let load_waiters = std::mem::take(&mut e.load_waiters);
            for r in waiters {
                self.waiting.remove(&r);
                self.reject(r, n, Rejection::Unloading);
            }
            for (r, _) in load_waiters {
                self.out.push(Effect::LoadDone { req: r, model: n.clone(), result: LoadOutcome::Cancelled });
            }
            if self.current.as_deref() != Some(n.as_str()) {
                self.queue.retain(|q| q != n);
            }
            match self.get(n).state {
                State::Loaded | State::Loading | State::Unloading => {
                    self.note("unload", "explicit", n, String::new());
                    self.begin_unload(n);
                    pending.insert(n.clone());
                }
                _ => {
                    // Queued but not started: dropping it from the queue was enough.
                    if self.current.as_deref() == Some(n.as_str()) {
                        self.current = None;
                        self.evicting.clear();
                    }
                }
            }
        }
        if pending.is_empty() {
            self.out.push(Effect::UnloadDone { req, result: Ok(names) });
        } else {
            self.unload_waiters.push((req, pending, names));
        }
    }

    /// Stops admitting requests to `name` and stops it once idle. Requests waiting for a
    /// place on it wait for its reload instead.
    fn begin_unload(&mut self, name: &str) {
        let e = self.get(name);
        let was_loading = e.state == State::Loading;
        if e.state == State::Unloading && e.stopping {
            return;
        }
        if e.state == State::Loaded && !e.waiting.is_empty() && e.pending.is_none() {
            e.pending = e.options.clone();
        }
        e.state = State::Unloading;
        if was_loading || e.in_flight.is_empty() {
            self.stop(name);
        }
    }

    fn stop(&mut self, name: &str) {
        let e = self.get(name);
        if e.stopping {
            return;
        }
        e.stopping = true;
        self.out.push(Effect::Stop { model: name.to_string() });
    }

    fn started(&mut self, name: &str, result: Result<(), LoadError>) {
        let Some(e) = self.models.get_mut(name) else { return };
        e.starting = false;
        if e.state == State::Unloading {
            // Cancelled while starting. The stop sent then may have looked for the process
            // before the executor registered it and found nothing to kill: a start that
            // succeeded gets one more stop, and the unload finishes when that one reports.
            match (result.is_ok(), e.stopping) {
                (true, true) => e.stop_again = true,
                (true, false) => self.stop(name),
                (false, true) => {}
                (false, false) => self.finish_unload(name),
            }
            return;
        }
        if e.state != State::Loading {
            return;
        }
        match result {
            Ok(()) => {
                e.state = State::Loaded;
                e.last_use = self.now;
                e.loaded_at = self.now;
                e.last_error = None;
                e.attempt = 0;
                // A reload with other options asked for while loading: the loads that asked for
                // those options wait for it; every other load is answered now.
                let reload = e.pending.clone().filter(|p| e.options.as_ref() != Some(p));
                if reload.is_none() {
                    e.pending = None;
                }
                let (answered, kept): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut e.load_waiters).into_iter().partition(|(_, o)| reload.as_ref() != Some(o));
                e.load_waiters = kept;
                self.done_loading(name);
                // Granted in the same step as the load completes: no eviction in between.
                self.grant_waiting(name);
                for (r, _) in answered {
                    self.out.push(Effect::LoadDone { req: r, model: name.to_string(), result: LoadOutcome::Loaded });
                }
                if reload.is_some() {
                    self.begin_unload(name);
                }
            }
            Err(err) if e.attempt == 0 && err.kind == Failure::NotReady => {
                // Evict every unpinned model, then retry once.
                e.attempt = 1;
                e.state = State::Unloaded;
                e.pending = e.options.take();
                // The retry goes where the first attempt went.
                e.placed = std::mem::take(&mut e.shares);
                e.last_error = Some(err.message);
                let others: Vec<String> = self
                    .models
                    .iter()
                    .filter(|(n, m)| n.as_str() != name && matches!(m.state, State::Loaded | State::Unloading))
                    .filter(|(_, m)| !m.pinned || m.state == State::Unloading)
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in &others {
                    if self.get(n).state != State::Unloading {
                        let detail = format!("{name} failed to start; retried with the others stopped");
                        self.note("evict", "retry_after_evict_all", n, detail);
                    }
                    self.begin_unload(n);
                }
                self.evicting = others.into_iter().collect();
                self.try_start();
            }
            Err(err) => {
                e.state = State::Failed;
                e.options = None;
                e.attempt = 0;
                e.pending = None;
                e.last_error = Some(err.message.clone());
                self.done_loading(name);
                self.refuse(name, Rejection::LoadFailed(err.message.clone()), LoadOutcome::Failed(err.message));
            }
        }
    }

    /// Answers every request and load waiting for `name` with `why` / `outcome`.
    fn refuse(&mut self, name: &str, why: Rejection, outcome: LoadOutcome) {
        self.note("refuse", why.code(), name, format!("{why:?}"));
        let e = self.get(name);
        let waiters = std::mem::take(&mut e.waiting);
        let load_waiters = std::mem::take(&mut e.load_waiters);
        for r in waiters {
            self.waiting.remove(&r);
            self.reject(r, name, why.clone());
        }
        for (r, _) in load_waiters {
            self.out.push(Effect::LoadDone { req: r, model: name.to_string(), result: outcome.clone() });
        }
    }

    fn done_loading(&mut self, name: &str) {
        if self.current.as_deref() == Some(name) {
            self.current = None;
            self.evicting.clear();
        }
    }

    fn stopped(&mut self, name: &str) {
        let Some(e) = self.models.get_mut(name) else { return };
        e.stopping = false;
        if std::mem::take(&mut e.stop_again) {
            self.stop(name);
            return;
        }
        if e.state == State::Unloading && !e.starting {
            self.finish_unload(name);
        }
    }

    fn finish_unload(&mut self, name: &str) {
        let e = self.get(name);
        e.state = State::Unloaded;
        e.options = None;
        e.memory = 0;
        e.vram = 0;
        e.shares.clear();
        e.estimated.clear();
        let reload = e.pending.clone();
        let has_waiters = !e.waiting.is_empty() || !e.load_waiters.is_empty();
        // A reload in place asked with `load` goes first; requests that came while the model
        // was giving way queue behind the loads already waiting (else models that alternate
        // would starve a third).
        let in_place = !e.load_waiters.is_empty();
        self.done_loading(name);
        self.evicting.remove(name);
        let mut finished = Vec::new();
        for (req, pending, names) in &mut self.unload_waiters {
            pending.remove(name);
            if pending.is_empty() {
                finished.push((*req, std::mem::take(names)));
            }
        }
        self.unload_waiters.retain(|(_, p, _)| !p.is_empty());
        for (req, names) in finished {
            self.out.push(Effect::UnloadDone { req, result: Ok(names) });
        }
        if let Some(options) = reload {
            self.enqueue(name, options, in_place);
        } else if has_waiters {
            // Cannot happen: waiters always come with a pending load. Answer them anyway.
            let e = self.get(name);
            let waiters = std::mem::take(&mut e.waiting);
            for r in waiters {
                self.waiting.remove(&r);
                self.reject(r, name, Rejection::Unloading);
            }
        }
    }

    fn exited(&mut self, name: &str, error: String) {
        let now = self.now;
        let (reset, base) = (self.crash_reset_ms, self.crash_backoff_ms);
        let Some(e) = self.models.get_mut(name) else { return };
        if e.state != State::Loaded {
            return; // a stop or a failed start explains it
        }
        if now.saturating_sub(e.loaded_at) >= reset {
            e.crashes = 0;
        }
        e.crashes += 1;
        e.retry_after = now + crash_backoff_ms(base, e.crashes);
        e.state = State::Failed;
        e.options = None;
        e.memory = 0;
        e.vram = 0;
        e.shares.clear();
        e.estimated.clear();
        e.last_error = Some(error.clone());
        // In-flight requests fail on their own (their connections broke) and release later;
        // they no longer hold this model, which may load again before they do.
        e.in_flight.clear();
        self.note("crash", "backend_exited", name, error.clone());
        // Requests waiting for a place never reached it: they fail now, like those in flight.
        self.refuse(name, Rejection::Failed(error), LoadOutcome::Cancelled);
    }

    /// Starts the next queued load when none is running.
    fn pump(&mut self) {
        self.hold_deadline = None;
        while self.current.is_none() {
            let Some(name) = self.queue.front().cloned() else { return };
            let e = self.get(&name);
            if e.pending.is_none() || e.occupies() {
                self.queue.pop_front();
                continue;
            }
            let (victims, placed) = match self.victims(&name) {
                Ok(v) => v,
                Err(why) => {
                    self.queue.pop_front();
                    let e = self.get(&name);
                    e.pending = None;
                    let outcome = LoadOutcome::Refused(why.clone());
                    self.refuse(&name, why, outcome);
                    continue;
                }
            };
            match self.hold(&name, &victims) {
                Hold::Go => {}
                Hold::Until(t) => {
                    self.hold_deadline = Some(t);
                    return;
                }
                Hold::Drop => {
                    // Everyone who asked for it left, and it would stop a model at work.
                    self.queue.pop_front();
                    self.get(&name).pending = None;
                    continue;
                }
            }
            self.queue.pop_front();
            let e = self.get(&name);
            e.attempt = 0;
            e.placed = placed;
            self.current = Some(name.clone());
            for v in &victims {
                if self.get(v).state != State::Unloading {
                    self.note("evict", "make_room", v, format!("to load {name}"));
                }
                self.begin_unload(v);
            }
            self.evicting = victims;
            self.try_start();
        }
    }

    /// Anti-thrash: whether the load of `name` waits before evicting `victims`, and until when
    /// it is looked at again. Only a load caused by requests waits, only for victims that are
    /// serving, and never past `swap_hold_ms` after its oldest waiting request came. A load
    /// that nobody waits for any more does not stop a serving model: it is dropped.
    fn hold(&mut self, name: &str, victims: &BTreeSet<String>) -> Hold {
        let (now, w) = (self.now, self.swap_hold_ms);
        let e = &self.models[name];
        let oldest = e.waiting.iter().filter_map(|r| self.waiting.get(r).map(|(_, t, _)| *t)).min();
        if w == 0 || !e.load_waiters.is_empty() {
            return Hold::Go;
        }
        let loaded: Vec<&Entry<O>> =
            victims.iter().map(|v| &self.models[v]).filter(|v| v.state == State::Loaded).collect();
        let any_busy = loaded.iter().any(|v| v.busy());
        let Some(oldest) = oldest else {
            return if any_busy { Hold::Drop } else { Hold::Go };
        };
        let deadline = oldest.saturating_add(w);
        if now >= deadline || (!any_busy && !e.holding) {
            return Hold::Go;
        }
        let serving = |v: &&Entry<O>| v.busy() || now < v.last_use + HOLD_GAP_MS;
        if !loaded.iter().any(serving) {
            return Hold::Go;
        }
        // Looked at again when the wait is over, or sooner if every victim is idle and its gap
        // runs out first.
        let gap = loaded.iter().map(|v| v.last_use + HOLD_GAP_MS).max();
        let until = if any_busy { deadline } else { gap.map_or(deadline, |g| g.min(deadline)) };
        self.get(name).holding = true;
        Hold::Until(until)
    }

    /// Models that must give way for `name`, and the devices it goes on: another NPU model on
    /// its NPU, the LRU of its type when the type is at its limit (idle models first), LRU
    /// models of any type while the memory budget would be exceeded, and on each device it is
    /// placed on, LRU models that hold some of that device while its budget would be. Pinned
    /// models never give way: a load that needs them to is refused.
    fn victims(&self, name: &str) -> Result<(BTreeSet<String>, Shares), Rejection> {
        let m = &self.models[name].model;
        let mut v = BTreeSet::new();
        let others = || self.models.iter().filter(|(n, e)| n.as_str() != name && e.occupies());
        if m.npu && !self.devices.iter().any(|d| d.npu) {
            // No NPU device known: NPU models exclude each other, wherever they run.
            self.exclude(others().filter(|(_, e)| e.model.npu), &mut v)?;
        }
        let limit = self.limits.get(m.model_type);
        // A routing helper takes no slot; a standard load counts the standard ones only.
        let standard = |e: &Entry<O>| e.model.model_type == m.model_type && !e.helper;
        if limit >= 0 && !m.helper {
            let same: Vec<(&String, &Entry<O>)> = others().filter(|(_, e)| standard(e)).collect();
            // Models already unloading free their slots by themselves; the start waits for them.
            for (n, e) in &same {
                if e.state == State::Unloading {
                    v.insert((*n).clone());
                }
            }
            let mut occupied = same.iter().filter(|(n, _)| !v.contains(*n)).count() as i64;
            let mut it = self.lru(name, &standard, &v).into_iter();
            while occupied >= limit {
                let Some(n) = it.next() else {
                    let pinned = same.iter().filter(|(n, e)| e.pinned && !v.contains(*n)).map(|(n, _)| (*n).clone());
                    return Err(Rejection::SlotsPinned(pinned.collect()));
                };
                v.insert(n);
                occupied -= 1;
            }
        }
        for pool in Pool::ALL {
            if let Some(budget) = self.budget(pool) {
                self.fit(name, (pool, None), m.size(pool), &|e: &Entry<O>| e.size(pool), budget, &mut v)?;
            }
        }
        // The placement with the fewest evictions, then the most memory left free.
        // Ranked by (evictions, most free), with what it evicts and where it goes.
        type Rank = (usize, std::cmp::Reverse<u64>);
        let mut best: Option<(Rank, BTreeSet<String>, Shares)> = None;
        let mut refusal = None;
        for shares in self.candidates(name)? {
            let mut vc = v.clone();
            match self.place(name, &shares, &mut vc) {
                Ok(free) => {
                    let rank = (vc.len(), std::cmp::Reverse(free));
                    if best.as_ref().is_none_or(|(b, ..)| rank < *b) {
                        best = Some((rank, vc, shares));
                    }
                }
                // The refusal of the device that comes closest (the largest budget).
                Err(r) => {
                    let budget = |r: &Rejection| if let Rejection::NoMemory { budget, .. } = r { *budget } else { 0 };
                    if refusal.as_ref().is_none_or(|old| budget(&r) > budget(old)) {
                        refusal = Some(r);
                    }
                }
            }
        }
        match best {
            Some((_, v, shares)) => Ok((v, shares)),
            None => Err(refusal.expect("a candidate was tried")),
        }
    }

    /// Adds the models of `npu` to `v` (NPU exclusivity), unless a pinned one stays.
    fn exclude<'a>(
        &self,
        npu: impl Iterator<Item = (&'a String, &'a Entry<O>)>,
        v: &mut BTreeSet<String>,
    ) -> Result<(), Rejection>
    where
        O: 'a,
    {
        let npu: Vec<(&String, &Entry<O>)> = npu.collect();
        let pinned: Vec<String> =
            npu.iter().filter(|(_, e)| e.pinned && e.state != State::Unloading).map(|(n, _)| (*n).clone()).collect();
        if !pinned.is_empty() {
            return Err(Rejection::SlotsPinned(pinned));
        }
        v.extend(npu.into_iter().map(|(n, _)| n.clone()));
        Ok(())
    }

    /// The placements `name` may take: one per device for `auto` (all of them split when none
    /// can ever hold it alone), the devices asked for otherwise. One empty placement when it
    /// takes no device memory and asks for none, or when the machine knows no device of its
    /// kind.
    fn candidates(&self, name: &str) -> Result<Vec<Shares>, Rejection> {
        let m = &self.models[name].model;
        if let Some(why) = self.unknown_device(m) {
            return Err(why);
        }
        let kind: Vec<&Device> = self.devices.iter().filter(|d| d.npu == m.npu).collect();
        let free = |d: &Device| d.budget.map(|b| b.saturating_sub(self.held(name, &d.id)));
        match &m.placement {
            Placement::On(ids) => {
                let on = ids.iter().filter_map(|id| self.devices.iter().find(|d| &d.id == id));
                Ok(vec![split(m.vram, &on.map(|d| (d.id.clone(), free(d))).collect::<Vec<_>>())])
            }
            Placement::Auto if kind.is_empty() || (m.vram == 0 && !m.npu) => Ok(vec![Shares::new()]),
            Placement::Auto => {
                let mut c: Vec<Shares> = kind.iter().map(|d| Shares::from([(d.id.clone(), m.vram)])).collect();
                let alone = kind.iter().any(|d| d.budget.is_none_or(|b| b >= m.vram));
                if !alone && kind.len() > 1 {
                    c.push(split(m.vram, &kind.iter().map(|d| (d.id.clone(), free(d))).collect::<Vec<_>>()));
                }
                Ok(c)
            }
        }
    }

    /// Bytes of `device` held by the models alive other than `name`.
    fn held(&self, name: &str, device: &str) -> u64 {
        let others = self.models.iter().filter(|(n, e)| n.as_str() != name && e.occupies());
        others.filter_map(|(_, e)| e.share(device)).sum()
    }

    /// Makes room for `name` on each device of `shares` (adding the models that give way to
    /// `v`); the bytes its devices keep free after it (u64::MAX where there is no budget).
    fn place(&self, name: &str, shares: &Shares, v: &mut BTreeSet<String>) -> Result<u64, Rejection> {
        let mut free = 0u64;
        for (id, share) in shares {
            let d = self.devices.iter().find(|d| &d.id == id).expect("candidates name known devices");
            if d.npu {
                let on = self.models.iter().filter(|(n, e)| n.as_str() != name && e.occupies());
                self.exclude(on.filter(|(_, e)| e.share(id).is_some()), v)?;
            }
            let Some(budget) = d.budget else {
                free = u64::MAX;
                continue;
            };
            let size = |e: &Entry<O>| e.share(id).unwrap_or(0);
            free = free.saturating_add(self.fit(name, (Pool::Vram, Some(id)), *share, &size, budget, v)?);
        }
        Ok(free)
    }

    /// Loaded models other than `name` and those in `v` that `filter` takes, least recently
    /// used first, idle before busy; pinned models are never candidates.
    fn lru(&self, name: &str, filter: &dyn Fn(&Entry<O>) -> bool, v: &BTreeSet<String>) -> Vec<String> {
        let mut c: Vec<(&String, &Entry<O>)> = (self.models.iter())
            .filter(|(n, e)| {
                n.as_str() != name && e.state == State::Loaded && !e.pinned && !v.contains(*n) && filter(e)
            })
            .collect();
        c.sort_by_key(|(_, e)| (e.busy(), e.last_use));
        c.into_iter().map(|(n, _)| n.clone()).collect()
    }

    /// Adds to `v` the LRU models that must give way for `name`, which needs `needed` bytes of
    /// a ledger (`size` of each entry) whose budget is `budget`, and returns the bytes left free
    /// after it; or refuses it when it cannot fit beside the pinned models.
    fn fit(
        &self,
        name: &str,
        (pool, device): (Pool, Option<&String>),
        needed: u64,
        size: &dyn Fn(&Entry<O>) -> u64,
        budget: u64,
        v: &mut BTreeSet<String>,
    ) -> Result<u64, Rejection> {
        let others = || self.models.iter().filter(|(n, e)| n.as_str() != name && e.occupies());
        let staying =
            |v: &BTreeSet<String>| -> u64 { others().filter(|(n, _)| !v.contains(*n)).map(|(_, e)| size(e)).sum() };
        if needed == 0 {
            return Ok(budget.saturating_sub(staying(v)));
        }
        let pinned: u64 = others()
            .filter(|(n, e)| e.pinned && e.state != State::Unloading && !v.contains(*n))
            .map(|(_, e)| size(e))
            .sum();
        if needed.saturating_add(pinned) > budget {
            return Err(Rejection::NoMemory { pool, device: device.cloned(), needed, budget, pinned });
        }
        let mut used = staying(v);
        for n in self.lru(name, &|e| size(e) > 0, v) {
            if used.saturating_add(needed) <= budget {
                break;
            }
            used -= size(&self.models[&n]);
            v.insert(n);
        }
        // Models already unloading (not in `v`) still count until they stop; the start waits
        // for them too.
        if used.saturating_add(needed) > budget {
            for (n, e) in others() {
                if e.state == State::Unloading && size(e) > 0 {
                    v.insert(n.clone());
                }
            }
        }
        Ok(budget.saturating_sub(staying(v).saturating_add(needed)))
    }

    /// Starts the current load once every model it waits on has stopped.
    fn try_start(&mut self) {
        let Some(name) = self.current.clone() else { return };
        self.evicting.retain(|n| self.models.get(n).is_some_and(|e| e.occupies()));
        if !self.evicting.is_empty() {
            return;
        }
        let e = self.get(&name);
        if e.starting || e.state != State::Unloaded && e.state != State::Failed {
            return;
        }
        let Some(options) = e.pending.take() else {
            self.current = None;
            return;
        };
        let now = self.now;
        let e = self.get(&name);
        e.state = State::Loading;
        e.starting = true;
        e.options = Some(options.clone());
        e.last_use = now;
        e.memory = e.model.memory;
        e.vram = e.model.vram;
        e.shares = std::mem::take(&mut e.placed);
        e.estimated = e.shares.clone();
        let devices = e.shares.clone();
        e.idle_timeout_ms = e.model.idle_timeout_ms;
        e.max_concurrent = e.model.max_concurrent;
        e.helper = e.model.helper;
        let reason = if !e.waiting.is_empty() {
            "request"
        } else if e.load_waiters.is_empty() {
            "reload"
        } else {
            "explicit"
        };
        let on = devices.keys().cloned().collect::<Vec<_>>().join(", ");
        self.note("load", reason, &name, if on.is_empty() { String::new() } else { format!("on {on}") });
        self.out.push(Effect::Start { model: name, options, devices });
    }
}
