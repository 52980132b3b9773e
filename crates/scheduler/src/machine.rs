//! The model-lifecycle state machine: `handle(event, now) -> effects`. No I/O, no clock.
//!
//! The server feeds it events (requests, loads, unloads, backend outcomes) from one owner
//! task and executes the effects it returns (start/stop a backend, answer a request).
//!
//! Rules (Lemonade's multi-model spec):
//! * per-type slots, LRU eviction within a type; NPU models exclude each other;
//! * a model with requests in flight is never stopped: eviction and unload drain it first;
//! * loads are serialized; which model gives way is decided when a queued load starts;
//! * the requests that caused a load are granted in the same step the load completes, so the
//!   model cannot be evicted between its load and those requests;
//! * a failed load evicts every model and retries once, unless the file is missing;
//! * `load` with other options reloads in place; with the same options it is a no-op, and a
//!   duplicate load while loading joins it; unloading a loading model cancels the load;
//! * a backend that exits on its own leaves the model `failed`; the next request reloads it,
//!   after a back-off that doubles with each crash.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use api_types::ModelType;

use crate::Limits;

pub type ReqId = u64;

/// What the machine needs to know about a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub name: String,
    pub model_type: ModelType,
    /// Runs on the NPU (recipes `flm`, `ryzenai-llm`): NPU models exclude each other.
    pub npu: bool,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub message: String,
    /// The model file is missing: no evict-all-and-retry.
    pub missing_file: bool,
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
    /// Explicit load (`/load`, admin load).
    Load { req: ReqId, model: ModelRef, options: O },
    /// Unload one model, or every model.
    Unload { req: ReqId, model: Option<String> },
    /// A backend start finished.
    Started { model: String, result: Result<(), LoadError> },
    /// A backend stop finished (the process is gone).
    Stopped { model: String },
    /// A backend exited on its own.
    Exited { model: String, error: String },
    /// Time passed (the executor sends it at [`Machine::next_deadline`]): idle models whose
    /// timeout is over are unloaded.
    Tick,
}

/// Why a request was not granted.
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
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect<O> {
    /// Start the backend of `model` with `options`; answer with `Started`.
    Start {
        model: String,
        options: O,
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
}

/// How an explicit load ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    Loaded,
    /// An unload cancelled it (the server answers 409, not 500).
    Cancelled,
    /// The backend did not start; the reason (exit status, log tail, …).
    Failed(String),
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
    /// Requests waiting for the model to load.
    pub waiting: Vec<ReqId>,
    pub last_use: u64,
    pub last_error: Option<String>,
    /// Options of a queued load (present while the model is in the load queue or must be
    /// loaded again after it finishes unloading).
    pub pending: Option<O>,
    load_waiters: Vec<ReqId>,
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
}

impl<O> Entry<O> {
    pub fn queue_depth(&self) -> usize {
        self.waiting.len()
    }
    /// Holds (or is about to hold) a slot.
    fn occupies(&self) -> bool {
        matches!(self.state, State::Loading | State::Loaded | State::Unloading)
    }
}

pub struct Machine<O> {
    limits: Limits,
    models: BTreeMap<String, Entry<O>>,
    /// Models waiting to load, in order.
    queue: VecDeque<String>,
    /// The load in progress (from dequeue until loaded, failed or cancelled), and the
    /// models it waits on to stop before it can start.
    current: Option<String>,
    evicting: BTreeSet<String>,
    /// Which model each granted request holds, and each waiting request waits for.
    granted: BTreeMap<ReqId, String>,
    waiting: BTreeMap<ReqId, String>,
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
}

impl<O: Clone + PartialEq> Machine<O> {
    pub fn new(limits: Limits) -> Machine<O> {
        Machine {
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
        }
    }

    /// Unloads a model that has had no request for `ms` (None: never, the default).
    pub fn with_idle_timeout_ms(mut self, ms: Option<u64>) -> Machine<O> {
        self.idle_timeout_ms = ms;
        self
    }

    /// When the next idle model times out (ms, the clock of `handle`), if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let t = self.idle_timeout_ms?;
        self.models.values().filter(|e| self.idle(e)).map(|e| e.last_use + t).min()
    }

    /// Loaded, with nothing in flight or waiting and no reload pending: may time out.
    fn idle(&self, e: &Entry<O>) -> bool {
        e.state == State::Loaded
            && e.in_flight.is_empty()
            && e.waiting.is_empty()
            && e.load_waiters.is_empty()
            && e.pending.is_none()
            && self.current.as_deref() != Some(e.model.name.as_str())
    }

    /// Unloads every idle model whose timeout is over.
    fn expire_idle(&mut self) {
        let Some(t) = self.idle_timeout_ms else { return };
        let now = self.now;
        let expired: Vec<String> = self
            .models
            .values()
            .filter(|e| self.idle(e) && now >= e.last_use + t)
            .map(|e| e.model.name.clone())
            .collect();
        for name in expired {
            self.begin_unload(&name);
        }
    }

    /// Sets the crash back-off: its first pause (default [`CRASH_BACKOFF_MS`]) and how long a
    /// backend must run before its crash count starts again (default [`CRASH_RESET_MS`]).
    /// Tests shorten the minute.
    pub fn with_crash_backoff(mut self, first_ms: u64, reset_ms: u64) -> Machine<O> {
        self.crash_backoff_ms = first_ms;
        self.crash_reset_ms = reset_ms;
        self
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

    /// Handles one event at time `now` (ms, monotonic) and returns the effects to execute.
    pub fn handle(&mut self, event: Event<O>, now: u64) -> Vec<Effect<O>> {
        self.now = now;
        match event {
            Event::Acquire { req, model, auto_load } => self.acquire(req, model, auto_load),
            Event::Release { req } => self.release(req),
            Event::Cancel { req } => self.cancel(req),
            Event::Load { req, model, options } => self.load(req, model, options),
            Event::Unload { req, model } => self.unload(req, model),
            Event::Started { model, result } => self.started(&model, result),
            Event::Stopped { model } => self.stopped(&model),
            Event::Exited { model, error } => self.exited(&model, error),
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
            load_waiters: Vec::new(),
            starting: false,
            stopping: false,
            stop_again: false,
            attempt: 0,
            crashes: 0,
            loaded_at: 0,
            retry_after: 0,
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

    fn reject(&mut self, req: ReqId, name: &str, why: Rejection) {
        self.out.push(Effect::Reject { req, model: name.to_string(), why });
    }

    /// Queues a load of `name` with `options` unless one is queued or running.
    fn enqueue(&mut self, name: &str, options: O, front: bool) {
        let e = self.get(name);
        e.pending = Some(options);
        if !self.queued(name) {
            if front {
                self.queue.push_front(name.to_string());
            } else {
                self.queue.push_back(name.to_string());
            }
        }
    }

    fn acquire(&mut self, req: ReqId, model: ModelRef, auto_load: Option<O>) {
        let now = self.now;
        let name = model.name.clone();
        let queued = self.queued(&name);
        let e = self.entry_mut(&model);
        let state = e.state;
        match (state, auto_load) {
            (State::Loaded, _) => self.grant(req, &name),
            (State::Failed, Some(_)) if e.retry_after > now => {
                let why = Rejection::Backoff {
                    error: e.last_error.clone().unwrap_or_default(),
                    retry_in_ms: e.retry_after - now,
                };
                self.reject(req, &name, why);
            }
            (_, Some(options)) => {
                e.waiting.push(req);
                let unloading_without_reload = state == State::Unloading && e.pending.is_none();
                if unloading_without_reload {
                    e.pending = Some(options.clone());
                }
                self.waiting.insert(req, name.clone());
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

    fn release(&mut self, req: ReqId) {
        let Some(name) = self.granted.remove(&req) else { return };
        let now = self.now;
        let e = self.get(&name);
        e.in_flight.remove(&req);
        e.last_use = now;
        if e.state == State::Unloading && e.in_flight.is_empty() {
            self.stop(&name);
        }
    }

    /// The client stopped waiting. If its grant crossed the cancel (granted, but the client was
    /// gone before it read the answer), the grant is given back like a release: otherwise the
    /// model would hold a request nobody will ever finish, and could never be unloaded.
    fn cancel(&mut self, req: ReqId) {
        if let Some(name) = self.waiting.remove(&req) {
            self.get(&name).waiting.retain(|r| *r != req);
        } else {
            self.release(req);
        }
    }

    fn load(&mut self, req: ReqId, model: ModelRef, options: O) {
        let name = model.name.clone();
        let now = self.now;
        let queued = self.queued(&name);
        let e = self.entry_mut(&model);
        match e.state {
            State::Loaded if e.options.as_ref() == Some(&options) && e.pending.is_none() => {
                e.last_use = now;
                self.out.push(Effect::LoadDone { req, model: name, result: LoadOutcome::Loaded });
            }
            State::Loaded => {
                // Reload in place: the same model gives up its slot and takes it back.
                e.load_waiters.push(req);
                e.pending = Some(options);
                self.begin_unload(&name);
            }
            State::Loading if e.options.as_ref() == Some(&options) => e.load_waiters.push(req),
            State::Loading | State::Unloading => {
                // Load again with these options once the current transition ends.
                e.load_waiters.push(req);
                e.pending = Some(options);
            }
            State::Unloaded | State::Failed => {
                e.load_waiters.push(req);
                e.retry_after = 0;
                if queued {
                    e.pending = Some(options);
                } else {
                    self.enqueue(&name, options, false);
                }
            }
        }
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
                self.out.push(Effect::UnloadDone { req, result: Err(SchedulerError::NotLoaded(n.clone())) });
                return;
            }
        }
        let mut pending = BTreeSet::new();
        for n in &names {
            // An explicit unload cancels a queued reload and the requests waiting for one.
            let e = self.get(n);
            e.pending = None;
            let waiters = std::mem::take(&mut e.waiting);
            let load_waiters = std::mem::take(&mut e.load_waiters);
            for r in waiters {
                self.waiting.remove(&r);
                self.reject(r, n, Rejection::Unloading);
            }
            for r in load_waiters {
                self.out.push(Effect::LoadDone { req: r, model: n.clone(), result: LoadOutcome::Cancelled });
            }
            if self.current.as_deref() != Some(n.as_str()) {
                self.queue.retain(|q| q != n);
            }
            match self.get(n).state {
                State::Loaded | State::Loading | State::Unloading => {
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

    /// Stops admitting requests to `name` and stops it once idle.
    fn begin_unload(&mut self, name: &str) {
        let e = self.get(name);
        let was_loading = e.state == State::Loading;
        if e.state == State::Unloading && e.stopping {
            return;
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
                let waiters = std::mem::take(&mut e.waiting);
                let load_waiters = std::mem::take(&mut e.load_waiters);
                self.done_loading(name);
                // Granted in the same step as the load completes: no eviction in between.
                for r in waiters {
                    self.waiting.remove(&r);
                    self.grant(r, name);
                }
                for r in load_waiters {
                    self.out.push(Effect::LoadDone { req: r, model: name.to_string(), result: LoadOutcome::Loaded });
                }
                // A reload with other options was asked for while loading.
                if let Some(p) = self.get(name).pending.clone() {
                    if self.get(name).options.as_ref() != Some(&p) {
                        self.begin_unload(name);
                    } else {
                        self.get(name).pending = None;
                    }
                }
            }
            Err(err) if e.attempt == 0 && !err.missing_file => {
                // Evict everything, then retry once.
                e.attempt = 1;
                e.state = State::Unloaded;
                e.pending = e.options.take();
                e.last_error = Some(err.message);
                let others: Vec<String> = self
                    .models
                    .iter()
                    .filter(|(n, m)| n.as_str() != name && matches!(m.state, State::Loaded | State::Unloading))
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in &others {
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
                let waiters = std::mem::take(&mut e.waiting);
                let load_waiters = std::mem::take(&mut e.load_waiters);
                self.done_loading(name);
                for r in waiters {
                    self.waiting.remove(&r);
                    self.reject(r, name, Rejection::LoadFailed(err.message.clone()));
                }
                for r in load_waiters {
                    self.out.push(Effect::LoadDone {
                        req: r,
                        model: name.to_string(),
                        result: LoadOutcome::Failed(err.message.clone()),
                    });
                }
            }
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
        let reload = e.pending.clone();
        let has_waiters = !e.waiting.is_empty() || !e.load_waiters.is_empty();
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
            self.enqueue(name, options, true);
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
        e.last_error = Some(error);
        // In-flight requests fail on their own (their connections broke) and release later;
        // they no longer hold this model, which may load again before they do.
        e.in_flight.clear();
    }

    /// Starts the next queued load when none is running.
    fn pump(&mut self) {
        while self.current.is_none() {
            let Some(name) = self.queue.pop_front() else { return };
            let e = self.get(&name);
            if e.pending.is_none() || e.occupies() {
                continue;
            }
            e.attempt = 0;
            self.current = Some(name.clone());
            let victims = self.victims(&name);
            for v in &victims {
                self.begin_unload(v);
            }
            self.evicting = victims;
            self.try_start();
        }
    }

    /// Models that must give way for `name`: another NPU model, and the LRU of its type when
    /// the type is at its limit (idle models first).
    fn victims(&self, name: &str) -> BTreeSet<String> {
        let m = &self.models[name].model;
        let mut v = BTreeSet::new();
        if m.npu {
            for (n, e) in &self.models {
                if n != name && e.model.npu && e.occupies() {
                    v.insert(n.clone());
                }
            }
        }
        let limit = self.limits.get(m.model_type);
        if limit >= 0 {
            let same: Vec<(&String, &Entry<O>)> = self
                .models
                .iter()
                .filter(|(n, e)| *n != name && e.model.model_type == m.model_type && e.occupies())
                .collect();
            // Models already unloading free their slots by themselves; the start waits for them.
            for (n, e) in &same {
                if e.state == State::Unloading {
                    v.insert((*n).clone());
                }
            }
            let mut occupied = same.iter().filter(|(n, _)| !v.contains(*n)).count() as i64;
            let mut candidates: Vec<&(&String, &Entry<O>)> =
                same.iter().filter(|(n, e)| e.state == State::Loaded && !v.contains(*n)).collect();
            // Least recently used first, idle before busy.
            candidates.sort_by_key(|(_, e)| (!e.in_flight.is_empty(), e.last_use));
            let mut it = candidates.into_iter();
            while occupied >= limit {
                let Some((n, _)) = it.next() else { break };
                v.insert((*n).clone());
                occupied -= 1;
            }
        }
        v
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
        self.out.push(Effect::Start { model: name, options });
    }
}
