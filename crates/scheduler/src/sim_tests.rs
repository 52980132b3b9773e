//! Randomized tests of the state machine: a simulated executor runs its effects (backend
//! starts that succeed, fail or find no file; stops; crashes) interleaved with random client
//! events, over models of every type with per-type limits drawn per seed. After every step:
//!
//! 1. per type, live backends (starting or running) never exceed the slot limit;
//! 2. never two NPU backends alive;
//! 3. at most one backend starting at a time (loads serialized);
//! 4. a backend is never stopped while a request holds it;
//! 5. a request is granted only on a running backend;
//! 6. every request, load and unload is answered at most once, and an unload is answered
//!    only when none of the models it names has a live process;
//! 7. eviction takes idle models before busy ones, least recently used first, within the type
//!    that needs the slot;
//! 8. a first failed start (file present) evicts every other model and retries; the retry's
//!    failure and a missing file change no other model;
//! 9. a model that crashed again within the reset window is refused with a back-off exactly
//!    until its pause is over; a first crash reloads at once; the pause is the documented one
//!    (1 s, then doubling to at most 30 s), stated here apart from the machine's;
//! 10. a load with the options the model already runs with is answered at once and touches
//!     nothing;
//! 11. with an idle timeout, no model stays loaded and idle past it (each seed draws one, or
//!     none);
//! 12. once the clients stop and the executor drains, every request, load and unload has been
//!     answered, and a last request to every model is granted (no dead ends);
//! 13. the backends alive never take more memory than the budget, nor more VRAM than the VRAM
//!     budget (each seed draws model sizes, GPU models and both budgets, or none), and a
//!     `NoMemory` refusal is only given to a model that cannot fit beside the pinned ones in
//!     the pool it names;
//! 14. a pinned model is never evicted (slots, memory, evict-all) nor timed out; only an
//!     explicit unload or a reload of itself stops it; a `SlotsPinned` refusal names exactly
//!     pinned, live models;
//! 15. no more requests wait than `max_queue`, and `QueueFull` is answered only when it is
//!     reached;
//! 16. no more requests run on a model at once than its `max_concurrent`;
//! 17. anti-thrash: a model serving requests gives way to a load caused by requests only once
//!     a request waiting for the model being loaded is `swap_hold_ms` old (or an explicit load
//!     asked for that model); judged per model and per request, after a failed start too;
//! 18. a plan (`Machine::plan`, the dry run) changes nothing, and never evicts a pinned model;
//!     on a quiet machine (no start, stop or load under way) the load that follows it evicts
//!     exactly the models it named, is refused exactly as it said, and goes where it said;
//! 19. per device (each seed draws up to three GPUs with budgets and up to two NPUs, or none,
//!     and asks some loads for devices of their own): the backends alive never hold more of a
//!     GPU than its budget, a model split over GPUs holds shares that sum to its VRAM estimate
//!     on exactly the devices it asked for, and an NPU runs one backend at a time;
//! 21. priorities: a request is never granted while a request of higher priority waits for
//!     the same model;
//! 20. eviction only where the load is short: a model that gives way to a load shares its type
//!     (slot limit), its NPU, a budgeted pool, or a budgeted device with it (a chat model on
//!     GPU0 never evicts the embedder on GPU1).
//!
//! Evictions after a final failed start (the next queued load's) are judged by invariants 17
//! and 20 like any other; only a first failed start's evict-all is exempt from them.
//!
//! Every invariant counts the times it judged a case that could break it (a victim, a grant
//! with others waiting, a refusal, …); the run prints the counts and fails when one stayed at
//! zero, so no invariant holds only because its case never came up.
//!
//! `SCHEDULER_SIM_SEEDS` (default 1,000) and `SCHEDULER_SIM_STEPS` (default 300) scale the run;
//! a failure names its seed, and `SCHEDULER_SIM_FIRST_SEED` replays from there.

use std::collections::{BTreeMap, BTreeSet};

use api_types::ModelType;

use crate::devices::*;
use crate::machine::*;
use crate::Limits;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proc {
    Starting,
    Running,
}

/// What the simulation remembers of a model to check the crash back-off (invariant 9).
#[derive(Debug, Clone, Copy, Default)]
struct Crashes {
    count: u32,
    loaded_at: u64,
    retry_after: u64,
}

/// The part of an entry the invariants compare before and after an event.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: State,
    options: Option<u32>,
    pending: Option<u32>,
    busy: bool,
    last_use: u64,
    /// In the routing-helper pool.
    helper: bool,
}

/// The crash-count reset window the simulation runs the machine with (short, so that random
/// histories cross it).
const RESET_MS: u64 = 400;

/// What each seed draws besides the limits.
#[derive(Debug, Clone, Default)]
struct Draw {
    idle_timeout: Option<u64>,
    budget: Option<u64>,
    vram_budget: Option<u64>,
    max_queue: Option<usize>,
    hold: u64,
    devices: Vec<Device>,
}

impl Draw {
    fn budget(&self, pool: Pool) -> Option<u64> {
        match pool {
            Pool::Memory => self.budget,
            Pool::Vram => self.vram_budget,
        }
    }
}

struct Sim {
    seed: u64,
    draw: Draw,
    pinned: BTreeSet<String>,
    /// When each open request was asked.
    asked_at: BTreeMap<ReqId, u64>,
    m: Machine<u32>,
    models: Vec<ModelRef>,
    limits: Limits,
    now: u64,
    next_req: ReqId,
    procs: BTreeMap<String, Proc>,
    /// Models stopping because a routing helper took a standard slot back: its process was
    /// already running, so until they stop they and it overlap (the one excess the slot
    /// count allows).
    demotion_victims: BTreeSet<String>,
    /// Effects the executor has not completed yet.
    starts: Vec<String>,
    /// Stops in flight, and whether each missed its process: a stop issued while the backend
    /// is starting may look before the executor has registered the process, find nothing to
    /// kill, and report later, after the start, while the process lives on.
    stops: Vec<(String, bool)>,
    stops_issued: u64,
    /// Granted requests: model and the backend generation they hold.
    leases: BTreeMap<ReqId, (String, u64)>,
    generation: BTreeMap<String, u64>,
    /// Requests, loads and unloads not answered yet.
    open_acquires: BTreeSet<ReqId>,
    /// Explicit loads not answered yet, and the model each asks for.
    open_loads: BTreeMap<ReqId, String>,
    open_unloads: BTreeSet<ReqId>,
    open_pins: BTreeMap<ReqId, (String, bool)>,
    /// For each open unload, the backends (model, generation) alive when it was asked.
    unload_targets: BTreeMap<ReqId, Vec<(String, u64)>>,
    /// Requests granted at some point.
    granted: BTreeSet<ReqId>,
    /// Models whose first start attempt failed and whose retry has not ended yet.
    retrying: BTreeSet<String>,
    crashes: BTreeMap<String, Crashes>,
    /// The devices each backend was started on (as its `Start` said).
    placed: BTreeMap<String, Shares>,
    /// The model and priority of each open request.
    priorities: BTreeMap<ReqId, (String, i32)>,
    /// Requests refused because the devices they asked for can never hold them.
    too_big: BTreeSet<ReqId>,
    log: Vec<String>,
    /// How often each invariant (by number) judged a case that could break it.
    hits: std::cell::RefCell<[u64; INVARIANTS + 1]>,
}

/// The invariants, numbered 1 to 21.
const INVARIANTS: usize = 21;

/// The crash back-off as the README and docs/RELIABILITY.md state it, written apart from the
/// machine's `crash_backoff_ms`: a first crash reloads at once; then 1 s, doubling each time,
/// never more than 30 s.
fn documented_backoff_ms(crashes: u32) -> u64 {
    match crashes {
        0 | 1 => 0,
        n => (2..n).fold(1_000, |ms: u64, _| (ms * 2).min(30_000)),
    }
}

/// Per-type limits for one seed: each of 1, 2, 3 or unlimited.
fn draw_limits(rng: &mut Rng) -> Limits {
    Limits(ModelType::ALL.iter().map(|t| (*t, [1, 2, 3, -1][rng.below(4)])).collect())
}

impl Sim {
    fn new(seed: u64, limits: Limits, draw: Draw, rng: &mut Rng) -> Sim {
        // Sizes up to 1,000 (each budget is at least that); a third are GPU models, mostly in
        // VRAM with a little system memory. Some have their own idle timeout (0: never) and
        // concurrency limit.
        let mut m = |name: &str, model_type, npu| {
            let mut r = ModelRef::new(name, model_type, npu);
            r.memory = 100 + rng.below(900) as u64;
            if rng.chance(33) {
                r.vram = r.memory;
                r.memory = 10 + rng.below(40) as u64;
            }
            r.idle_timeout_ms = match rng.below(6) {
                0 => Some(0),
                1 => Some(150 + rng.below(800) as u64),
                _ => None,
            };
            r.max_concurrent = rng.chance(40).then(|| 1 + rng.below(3) as u32);
            r.model_priority = rng.below(3) as i32 - 1;
            // Some ask for devices of their own: one GPU, a split over several, an NPU.
            let kind: Vec<&Device> = draw.devices.iter().filter(|d| d.npu == npu).collect();
            if !kind.is_empty() && rng.chance(30) {
                let mut ids: Vec<String> = kind.iter().filter(|_| rng.chance(60)).map(|d| d.id.clone()).collect();
                if ids.is_empty() {
                    ids.push(kind[rng.below(kind.len())].id.clone());
                }
                r.placement = Placement::On(ids);
            }
            r
        };
        let settings = Settings {
            idle_timeout_ms: Some(draw.idle_timeout),
            max_queue: Some(draw.max_queue),
            memory_budget: Some(draw.budget),
            vram_budget: Some(draw.vram_budget),
            swap_hold_ms: Some(draw.hold),
            devices: Some(draw.devices.clone()),
            ..Settings::default()
        };
        Sim {
            seed,
            draw: draw.clone(),
            pinned: BTreeSet::new(),
            asked_at: BTreeMap::new(),
            m: Machine::new(limits.clone()).with_crash_backoff(CRASH_BACKOFF_MS, RESET_MS).with_settings(settings),
            models: vec![
                m("llm-a", ModelType::Llm, false),
                m("llm-b", ModelType::Llm, false),
                m("llm-c", ModelType::Llm, false),
                m("llm-d", ModelType::Llm, false),
                m("emb-a", ModelType::Embedding, false),
                m("emb-b", ModelType::Embedding, false),
                m("rerank-a", ModelType::Reranking, false),
                m("rerank-b", ModelType::Reranking, false),
                m("npu-llm", ModelType::Llm, true),
                m("npu-emb", ModelType::Embedding, true),
            ],
            limits,
            now: 1,
            next_req: 1,
            procs: BTreeMap::new(),
            demotion_victims: BTreeSet::new(),
            starts: Vec::new(),
            stops: Vec::new(),
            stops_issued: 0,
            leases: BTreeMap::new(),
            generation: BTreeMap::new(),
            open_acquires: BTreeSet::new(),
            open_loads: BTreeMap::new(),
            open_unloads: BTreeSet::new(),
            open_pins: BTreeMap::new(),
            unload_targets: BTreeMap::new(),
            granted: BTreeSet::new(),
            retrying: BTreeSet::new(),
            crashes: BTreeMap::new(),
            placed: BTreeMap::new(),
            too_big: BTreeSet::new(),
            priorities: BTreeMap::new(),
            log: Vec::new(),
            hits: Default::default(),
        }
    }

    /// Invariant `n` judged a case that could break it.
    fn hit(&self, n: usize) {
        self.hits.borrow_mut()[n] += 1;
    }

    fn fail(&self, msg: &str) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        panic!(
            "seed {} (limits {:?}, {:?}): {msg}\nreplay: SCHEDULER_SIM_FIRST_SEED={} SCHEDULER_SIM_SEEDS=1\nlast events:\n{}",
            self.seed,
            self.limits.0,
            self.draw,
            self.seed,
            tail.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
    }

    fn seen(&self) -> BTreeMap<String, Seen> {
        self.m
            .entries()
            .map(|e| {
                let seen = Seen {
                    state: e.state,
                    options: e.options,
                    pending: e.pending,
                    busy: !e.in_flight.is_empty() || !e.waiting.is_empty(),
                    last_use: e.last_use,
                    helper: e.helper,
                };
                (e.model.name.clone(), seen)
            })
            .collect()
    }

    fn send(&mut self, ev: Event<u32>) {
        self.log.push(format!("{} {:?}", self.now, ev));
        let before = self.seen();
        let effects = self.m.handle(ev.clone(), self.now);
        for e in &effects {
            self.log.push(format!("    -> {e:?}"));
        }
        let after = self.seen();
        // A pin takes effect within its event: the evictions of that event already spare it.
        for e in &effects {
            if let Effect::PinDone { req, result: Ok(()) } = e {
                if let Some((model, true)) = self.open_pins.get(req) {
                    self.pinned.insert(model.clone());
                }
            }
        }
        self.check_rules(&ev, &effects, &before, &after);
        for e in effects {
            self.apply(e);
        }
        self.check();
    }

    fn model(&self, name: &str) -> &ModelRef {
        self.models.iter().find(|m| m.name == name).expect("model")
    }

    fn apply(&mut self, e: Effect<u32>) {
        match e {
            Effect::Start { model, devices, .. } => {
                if self.procs.contains_key(&model) {
                    self.fail(&format!("start of {model} while its backend is alive"));
                }
                self.check_placement(&model, &devices);
                self.placed.insert(model.clone(), devices);
                self.procs.insert(model.clone(), Proc::Starting);
                *self.generation.entry(model.clone()).or_default() += 1;
                self.starts.push(model);
            }
            Effect::Stop { model } => {
                let gen = self.generation.get(&model).copied().unwrap_or(0);
                if self.leases.values().any(|(m, g)| *m == model && *g == gen) {
                    self.fail(&format!("stop of {model} while a request holds it"));
                }
                self.hit(4);
                self.stops_issued += 1;
                let missed = self.procs.get(&model) == Some(&Proc::Starting) && self.stops_issued.is_multiple_of(2);
                self.stops.push((model, missed));
            }
            Effect::Grant { req, model } => {
                if self.procs.get(&model) != Some(&Proc::Running) {
                    self.fail(&format!("grant of {req} on {model}, which is not running"));
                }
                if !self.open_acquires.remove(&req) {
                    self.fail(&format!("request {req} answered twice"));
                }
                self.hit(5);
                self.hit(6);
                self.asked_at.remove(&req);
                // Invariant 21.
                if let Some((_, p)) = self.priorities.remove(&req) {
                    let others =
                        self.priorities.iter().any(|(r, (m, _))| *m == model && self.open_acquires.contains(r));
                    if others {
                        self.hit(21);
                    }
                    let ahead = self
                        .priorities
                        .iter()
                        .find(|(r, (m, q))| *m == model && *q > p && self.open_acquires.contains(r));
                    if let Some((r, (_, q))) = ahead {
                        self.fail(&format!(
                            "request {req} (priority {p}) granted on {model} while {r} (priority {q}) waits"
                        ));
                    }
                }
                let gen = self.generation[&model];
                self.leases.insert(req, (model.clone(), gen));
                self.granted.insert(req);
                // Invariant 16.
                let running = self.leases.values().filter(|(m, g)| *m == model && *g == gen).count();
                if let Some(max) = self.model(&model).max_concurrent {
                    if running == max as usize {
                        self.hit(16);
                    }
                    if running > max as usize {
                        self.fail(&format!("{running} requests run on {model}, max_concurrent {max}"));
                    }
                }
            }
            Effect::Reject { req, why, .. } => {
                if !self.open_acquires.remove(&req) {
                    self.fail(&format!("request {req} answered twice"));
                }
                self.asked_at.remove(&req);
                self.hit(6);
                if let Rejection::QueueFull { .. } = why {
                    self.hit(15);
                    // Invariant 15: only when the bound is reached (this request not counted).
                    let waiting = self.open_acquires.len();
                    if self.draw.max_queue.is_none_or(|q| waiting < q) {
                        self.fail(&format!("QueueFull with {waiting} waiting, max_queue {:?}", self.draw.max_queue));
                    }
                }
                if let Rejection::NoMemory { device: Some(_), .. } = why {
                    self.too_big.insert(req);
                }
                self.check_refusal(&why);
            }
            Effect::LoadDone { req, result, .. } => {
                if self.open_loads.remove(&req).is_none() {
                    self.fail(&format!("load {req} answered twice"));
                }
                self.hit(6);
                if let LoadOutcome::Refused(why) = result {
                    self.check_refusal(&why);
                }
            }
            Effect::PinDone { req, result } => {
                let Some((model, pinned)) = self.open_pins.remove(&req) else {
                    self.fail(&format!("pin {req} answered twice"));
                };
                self.hit(6);
                if result.is_ok() {
                    if pinned {
                        self.pinned.insert(model);
                    } else {
                        self.pinned.remove(&model);
                    }
                }
            }
            Effect::Configured { .. } => {}
            Effect::UnloadDone { req, result } => {
                if !self.open_unloads.remove(&req) {
                    self.fail(&format!("unload {req} answered twice"));
                }
                let names = result.unwrap_or_default();
                self.hit(6);
                for (n, gen) in self.unload_targets.remove(&req).unwrap_or_default() {
                    if names.contains(&n) && self.procs.contains_key(&n) && self.generation[&n] == gen {
                        self.fail(&format!("unload {req} answered while {n}'s process is alive"));
                    }
                }
            }
        }
    }

    /// Invariants 13 and 14: a refusal for pinned slots or memory is true.
    fn check_refusal(&self, why: &Rejection) {
        match why {
            Rejection::SlotsPinned(names) => {
                self.hit(14);
                if names.is_empty() {
                    self.fail("SlotsPinned names no model");
                }
                for n in names {
                    if !self.pinned.contains(n) || !self.procs.contains_key(n) {
                        self.fail(&format!("SlotsPinned names {n}, which is not a pinned live model"));
                    }
                }
            }
            Rejection::NoMemory { device: Some(d), needed, budget, pinned, .. } => {
                self.hit(19);
                let dev = self.draw.devices.iter().find(|x| &x.id == d);
                if dev.and_then(|x| x.budget) != Some(*budget) || needed + pinned <= *budget {
                    self.fail(&format!("NoMemory on {d}: {needed}+{pinned} against {budget}"));
                }
            }
            Rejection::UnknownDevice { device, .. } => self.fail(&format!("unknown device {device}")),
            Rejection::NoMemory { pool, device: None, needed, budget, pinned } => {
                self.hit(13);
                // Pinned models that stay (not those on their way out).
                let stays =
                    |n: &String| self.m.entry(n).is_some_and(|e| matches!(e.state, State::Loading | State::Loaded));
                let held: u64 = self.pinned.iter().filter(|n| stays(n)).map(|n| self.model(n).size(*pool)).sum();
                // (Effects of the same event may have started more pinned models since.)
                if Some(*budget) != self.draw.budget(*pool) || needed + pinned <= *budget || *pinned > held {
                    self.fail(&format!("NoMemory {pool:?} {needed}+{pinned} (pinned alive: {held}) against {budget}"));
                }
            }
            _ => {}
        }
    }

    /// Whether the backend of `name` holds memory on `device`.
    fn holds(&self, name: &str, device: &str) -> bool {
        self.placed.get(name).and_then(|s| s.get(device)).is_some_and(|b| *b > 0)
    }

    /// Whether the backend of `name` was started on `device`.
    fn on(&self, name: &str, device: &str) -> bool {
        self.placed.get(name).is_some_and(|s| s.contains_key(device))
    }

    /// Invariant 19: a start goes where its model asked, its shares sum to its VRAM, and an
    /// NPU model goes on an NPU when there is one.
    fn check_placement(&self, name: &str, devices: &Shares) {
        let m = self.model(name);
        let npus = self.draw.devices.iter().any(|d| d.npu);
        match &m.placement {
            Placement::On(ids) => {
                if !devices.keys().eq(ids.iter().collect::<BTreeSet<_>>()) {
                    self.fail(&format!("{name} asked for {ids:?} and started on {devices:?}"));
                }
            }
            Placement::Auto if m.npu && npus && devices.len() != 1 => {
                self.fail(&format!("NPU model {name} started on {devices:?}"))
            }
            Placement::Auto => {}
        }
        if !devices.is_empty() {
            self.hit(19);
        }
        if !devices.is_empty() && !m.npu && devices.values().sum::<u64>() != m.vram {
            self.fail(&format!("{name}'s shares {devices:?} do not sum to its {} bytes", m.vram));
        }
    }

    /// The idle timeout that applies to `name` (None: never).
    fn timeout(&self, name: &str) -> Option<u64> {
        match self.model(name).idle_timeout_ms {
            Some(0) => None,
            Some(t) => Some(t),
            None => self.draw.idle_timeout,
        }
    }

    fn check(&self) {
        // Invariant 13.
        for pool in Pool::ALL {
            if let Some(b) = self.draw.budget(pool) {
                let used: u64 = self.procs.keys().map(|n| self.model(n).size(pool)).sum();
                if used > 0 {
                    self.hit(13);
                }
                if used > b {
                    self.fail(&format!("backends alive take {used} of {pool:?}, budget {b}"));
                }
            }
        }
        // Invariant 19.
        for d in &self.draw.devices {
            let on: Vec<&String> = self.procs.keys().filter(|n| self.on(n, &d.id)).collect();
            let held: u64 = on.iter().map(|n| self.placed[*n][&d.id]).sum();
            if d.budget.is_some_and(|b| held > b) {
                self.fail(&format!("backends alive hold {held} of {}, budget {:?}", d.id, d.budget));
            }
            if d.npu && on.len() > 1 {
                self.fail(&format!("{on:?} run on NPU {} at once", d.id));
            }
        }
        // Invariant 15.
        if let Some(q) = self.draw.max_queue {
            if self.open_acquires.len() > q {
                self.fail(&format!("{} requests wait, max_queue {q}", self.open_acquires.len()));
            }
        }
        let alive = |pred: &dyn Fn(&ModelRef) -> bool| self.procs.keys().filter(|n| pred(self.model(n))).count() as i64;
        // Routing helpers hold no slot of their type.
        let helper = |n: &String| self.m.entry(n).is_some_and(|e| e.helper);
        for t in ModelType::ALL {
            let limit = self.limits.get(t);
            let n = (self.procs.keys())
                .filter(|n| self.model(n).model_type == t && !helper(n) && !self.demotion_victims.contains(*n))
                .count() as i64;
            if limit >= 0 && n == limit {
                self.hit(1);
            }
            if limit >= 0 && n > limit {
                self.fail(&format!("{n} {t:?} backends alive, limit {limit}"));
            }
        }
        let npu_asked = |n: &String| self.model(n).npu && !self.procs.contains_key(n);
        let npu_wanted = self.priorities.values().any(|(n, _)| npu_asked(n)) || self.open_loads.values().any(npu_asked);
        if alive(&|m| m.npu) == 1 && npu_wanted {
            self.hit(2);
        }
        if alive(&|m| m.npu) > 1 && !self.draw.devices.iter().any(|d| d.npu) {
            self.fail("two NPU backends alive");
        }
        let starting = self.procs.values().filter(|p| **p == Proc::Starting).count();
        if starting == 1 && self.m.load_queue().len() > 1 {
            self.hit(3);
        }
        if self.procs.values().filter(|p| **p == Proc::Starting).count() > 1 {
            self.fail("two backends starting at once");
        }
        let stale = self.m.entries().find(|e| {
            e.state == State::Loaded
                && e.in_flight.is_empty()
                && e.waiting.is_empty()
                && e.pending.is_none()
                && !self.pinned.contains(&e.model.name)
                && self.timeout(&e.model.name).is_some_and(|t| self.now >= e.last_use + t)
        });
        if let Some(e) = stale {
            self.fail(&format!(
                "{} idle since {} is still loaded at {} (timeout {:?})",
                e.model.name,
                e.last_use,
                self.now,
                self.timeout(&e.model.name)
            ));
        }
        if let Some(d) = self.m.next_deadline() {
            if d <= self.now {
                self.fail(&format!("the next deadline {d} is already past at {}", self.now));
            }
        }
    }

    /// Invariants 7 to 10: what one event may do, judged from the entries before and after it.
    fn check_rules(
        &mut self,
        ev: &Event<u32>,
        fx: &[Effect<u32>],
        before: &BTreeMap<String, Seen>,
        after: &BTreeMap<String, Seen>,
    ) {
        let state = |m: &BTreeMap<String, Seen>, n: &str| m.get(n).map(|s| s.state).unwrap_or(State::Unloaded);
        // Models that stopped admitting requests in this event (Loaded → Unloading), less those
        // whose idle timeout ran out (invariant 11 judges them).
        let timed_out = |n: &str| {
            let b = &before[n];
            let t = self.timeout(n);
            t.is_some_and(|t| !b.busy && b.pending.is_none() && !self.pinned.contains(n) && self.now >= b.last_use + t)
        };
        let stopped: Vec<&String> = after
            .iter()
            .filter(|(n, s)| s.state == State::Unloading && state(before, n) == State::Loaded)
            .map(|(n, _)| n)
            .collect();
        if stopped.iter().any(|n| timed_out(n)) {
            self.hit(11);
        }
        let gave_way: Vec<String> = stopped.into_iter().filter(|n| !timed_out(n)).cloned().collect();
        let mut same_options = false;
        // Only a first failed start evicts everything (invariant 8); its victims are exempt
        // from invariants 17 and 20, every other event's are judged by them.
        let mut evict_all = false;
        match ev {
            Event::Started { model, result: Err(err) } if state(before, model) == State::Loading => {
                let others: Vec<&String> = before
                    .iter()
                    .filter(|(n, s)| *n != model && s.state == State::Loaded && !self.pinned.contains(*n))
                    .map(|(n, _)| n)
                    .collect();
                if err.kind == Failure::NotReady && self.retrying.insert(model.clone()) {
                    // Invariant 8: the first failure evicts every other model and retries.
                    evict_all = true;
                    self.hit(8);
                    let retried = fx.iter().any(|e| matches!(e, Effect::Start { model: m, .. } if m == model));
                    if state(after, model) != State::Unloaded && !retried {
                        self.fail(&format!("{model}'s first failed start did not queue a retry"));
                    }
                    if let Some(n) = others.iter().find(|n| state(after, n) != State::Unloading) {
                        self.fail(&format!("{model}'s failed start left {n} loaded (evict-all)"));
                    }
                } else {
                    self.retrying.remove(model);
                    if state(after, model) != State::Failed {
                        self.fail(&format!("{model}'s final failed start left it {:?}", state(after, model)));
                    }
                    // No evict-all: only the next queued load may take a slot, in one type.
                    let types: BTreeSet<ModelType> =
                        gave_way.iter().filter(|n| !self.model(n).npu).map(|n| self.model(n).model_type).collect();
                    // (With a memory budget, or a device's, the next load may take models of any
                    // type; invariant 20 judges each of those.)
                    let budgets = self.draw.budget.is_some()
                        || self.draw.vram_budget.is_some()
                        || self.draw.devices.iter().any(|d| d.budget.is_some());
                    if types.len() > 1 && !budgets {
                        self.fail(&format!("{model}'s final failed start evicted {gave_way:?}"));
                    }
                }
            }
            Event::Started { model, result: Ok(()) } => {
                self.retrying.remove(model);
                if state(before, model) == State::Loading && state(after, model) != State::Loading {
                    self.crashes.entry(model.clone()).or_default().loaded_at = self.now;
                }
            }
            Event::Unload { model, .. } => {
                match model {
                    Some(n) => {
                        self.retrying.remove(n);
                    }
                    None => self.retrying.clear(),
                }
                return; // an unload may take any model it names
            }
            Event::Exited { model, .. } if state(before, model) == State::Loaded => {
                let c = self.crashes.entry(model.clone()).or_default();
                if self.now.saturating_sub(c.loaded_at) >= RESET_MS {
                    c.count = 0;
                }
                c.count += 1;
                c.retry_after = self.now + documented_backoff_ms(c.count);
            }
            Event::Acquire { req, model, auto_load: Some(_) } if state(before, &model.name) == State::Failed => {
                // Invariant 9: a back-off exactly while the pause runs.
                let pause = self.crashes.get(&model.name).map(|c| c.retry_after).unwrap_or(0);
                if self.now < pause {
                    self.hit(9);
                }
                let backed_off = fx
                    .iter()
                    .any(|e| matches!(e, Effect::Reject { req: r, why: Rejection::Backoff { .. }, .. } if r == req));
                if backed_off != (self.now < pause) {
                    self.fail(&format!(
                        "{} at {} (pause until {pause}): back-off answered {backed_off}",
                        model.name, self.now
                    ));
                }
            }
            Event::Load { req, model, options, .. } => {
                let b = before.get(&model.name);
                if matches!(state(before, &model.name), State::Unloaded | State::Failed) {
                    // An explicit load ends any back-off.
                    self.crashes.entry(model.name.clone()).or_default().retry_after = 0;
                }
                if b.is_some_and(|b| b.state == State::Loaded && b.options == Some(*options) && b.pending.is_none()) {
                    // Invariant 10: same options, nothing to do. Other loads may go ahead in the
                    // same step (a held swap comes due), and may even take this model as their
                    // victim: invariants 7, 14 and 17 judge those like any eviction.
                    let done = Effect::LoadDone { req: *req, model: model.name.clone(), result: LoadOutcome::Loaded };
                    let touched = fx.iter().any(|e| match e {
                        Effect::Start { model: m, .. } => *m == model.name,
                        Effect::LoadDone { model: m, .. } => *m == model.name && *e != done,
                        _ => false,
                    });
                    let kept = matches!(state(after, &model.name), State::Loaded | State::Unloading);
                    if !fx.contains(&done) || touched || !kept {
                        self.fail(&format!("a same-options load of {} did {fx:?}", model.name));
                    }
                    same_options = true;
                    self.hit(10);
                }
            }
            _ => {}
        }
        // Invariant 7: every other model that gave way was an eviction victim.
        let target = match ev {
            Event::Load { model, .. } if !same_options => Some(model.name.as_str()),
            _ => None,
        };
        // A routing helper asked for directly takes a standard slot back from idle models.
        let demoted = match ev {
            Event::Acquire { model, .. } => {
                let was = |s: &BTreeMap<String, Seen>| s.get(&model.name).is_some_and(|s| s.helper);
                (was(before) && !was(after)).then_some(model)
            }
            _ => None,
        };
        if let Some(m) = demoted {
            // Its victims (an idle one whose timeout ran out in the same step included) stop
            // while it runs on.
            for (n, a) in after {
                let b = before.get(n);
                let same = self.model(n).model_type == m.model_type && !a.helper && *n != m.name;
                if same && a.state == State::Unloading && b.is_some_and(|b| b.state == State::Loaded) {
                    self.demotion_victims.insert(n.clone());
                }
            }
        }
        for v in gave_way.iter().filter(|v| Some(v.as_str()) != target) {
            // Invariant 14.
            if self.pinned.contains(v) {
                self.fail(&format!("pinned {v} gave way after {ev:?}"));
            }
            let same_type = |m: &ModelRef| self.model(v).model_type == m.model_type;
            if let Some(m) = demoted.filter(|m| m.name != *v && same_type(m) && before.get(v).is_some_and(|b| !b.busy))
            {
                let b = &before[v];
                if b.helper || self.pinned.contains(v) {
                    self.fail(&format!("{v} gave way to {} leaving the helper pool: {b:?}", m.name));
                }
                self.demotion_victims.insert(v.clone());
                self.hit(7);
                continue;
            }
            if self.pinned.iter().any(|p| self.procs.contains_key(p)) {
                self.hit(14);
            }
            // Invariant 17, per model and per request: a busy model gives way only to the load
            // of a model that an explicit load asks for, or that a request has waited the hold
            // for.
            let hold = self.draw.hold;
            if hold > 0 && before[v].busy && !evict_all {
                self.hit(17);
                let loading = self.m.current_load().unwrap_or_default().to_string();
                let explicit = self.open_loads.values().any(|m| *m == loading);
                let waited = self
                    .asked_at
                    .iter()
                    .any(|(r, t)| self.priorities.get(r).is_some_and(|(m, _)| *m == loading) && self.now >= t + hold);
                if !explicit && !waited {
                    self.fail(&format!(
                        "busy {v} gave way to {loading:?} before a request for it waited {hold} ms, with no load asked"
                    ));
                }
            }
            let vm = self.model(v).clone();
            // Invariant 20.
            if !evict_all && target.is_none() {
                self.check_short(v);
            }
            if vm.npu {
                self.hit(2);
                continue; // NPU models give way to any other NPU model, whatever their age
            }
            self.hit(7);
            let key = |s: &Seen| (s.busy, s.last_use);
            let vk = key(&after[v]);
            let helper = |n: &str| self.m.entry(n).is_some_and(|e| e.helper);
            let kept = after.iter().find(|(n, s)| {
                s.state == State::Loaded
                    && self.model(n).model_type == vm.model_type
                    // A routing helper and a standard model hold different places.
                    && helper(n) == helper(v)
                    && key(s) < vk
                    && !self.pinned.contains(*n)
                    // A victim that gave way for VRAM passes over models that take none.
                    && Pool::ALL.iter().all(|p| vm.size(*p) == 0 || self.model(n).size(*p) > 0)
                    // Nor one that holds nothing on a device the victim holds memory on (making
                    // room there takes only models that free some of it).
                    && self.placed.get(v.as_str()).is_none_or(|s| {
                        s.iter().filter(|(_, b)| **b > 0).all(|(d, _)| self.holds(n, d))
                    })
            });
            if let Some((n, s)) = kept {
                self.fail(&format!("{v} {vk:?} was evicted while {n} {:?} stayed", key(s)));
            }
        }
    }

    /// Invariant 20: `v` gave way to the load in progress, with which it shares something that
    /// was short.
    fn check_short(&self, v: &str) {
        self.hit(20);
        let Some(c) = self.m.current_load() else { self.fail(&format!("{v} gave way to no load")) };
        let (vm, cm) = (self.model(v), self.model(c));
        let at = self.m.placement_of(c).cloned().unwrap_or_default();
        let npus = self.draw.devices.iter().any(|d| d.npu);
        let device_short = at.keys().any(|d| {
            let dev = self.draw.devices.iter().find(|x| &x.id == d).expect("a drawn device");
            self.on(v, d) && (dev.npu || dev.budget.is_some())
        });
        let helper = |n: &str| self.m.entry(n).is_some_and(|e| e.helper);
        let slot = !helper(v) && !self.model(c).helper;
        let why = (slot && vm.model_type == cm.model_type && self.limits.get(vm.model_type) >= 0)
            || (vm.npu && cm.npu && !npus)
            || (self.draw.budget.is_some() && vm.memory > 0 && cm.memory > 0)
            || (self.draw.vram_budget.is_some() && vm.vram > 0 && cm.vram > 0)
            || device_short;
        if !why {
            self.fail(&format!(
                "{v} (on {:?}) gave way to {c} (on {at:?}), which it shares nothing short with",
                self.placed.get(v)
            ));
        }
    }

    /// Invariant 18: on a quiet machine, a plan and the load that follows it agree.
    fn plan_then_load(&mut self, model: ModelRef, options: u32) {
        let plan = self.m.plan(model.clone(), options, self.now);
        self.m.take_decisions();
        let req = self.next_req;
        self.next_req += 1;
        self.open_loads.insert(req, model.name.clone());
        self.hit(18);
        self.log.push(format!("{} plan {plan:?}", self.now));
        let fx = self.m.clone().handle(Event::Load { req, model: model.clone(), options, pin: None }, self.now);
        let mut real = self.m.clone();
        real.handle(Event::Load { req, model: model.clone(), options, pin: None }, self.now);
        let decisions = real.take_decisions();
        let evicts: Vec<String> = (decisions.iter())
            .filter(|d| d.decision == "evict" || (d.decision == "unload" && d.model != model.name))
            .map(|d| d.model.clone())
            .collect();
        if evicts != plan.evicts {
            self.fail(&format!("plan said {:?} would go; the load evicted {evicts:?}", plan.evicts));
        }
        let refused = fx.iter().find_map(|e| match e {
            Effect::LoadDone { req: r, result: LoadOutcome::Refused(why), .. } if *r == req => Some(why.clone()),
            _ => None,
        });
        if refused != plan.refusal {
            self.fail(&format!("plan said refusal {:?}; the load {refused:?}", plan.refusal));
        }
        // (A reload in place is placed once the old backend has stopped, later.)
        let placed_now = real.current_load() == Some(model.name.as_str());
        if plan.outcome == "load" && placed_now && real.placement_of(&model.name) != Some(&plan.devices) {
            self.fail(&format!("plan said {:?}; the load went on {:?}", plan.devices, real.placement_of(&model.name)));
        }
        self.send(Event::Load { req, model, options, pin: None });
    }

    fn step(&mut self, rng: &mut Rng) {
        self.now += rng.below(50) as u64;
        let model = self.models[rng.below(self.models.len())].clone();
        // 18. a plan (the scheduler's dry run) changes nothing, and a model it says would be
        //     evicted is never pinned.
        if rng.chance(10) {
            let (before, queue) = (self.seen(), self.m.entries().map(|e| e.queue_depth()).sum::<usize>());
            let plan = self.m.plan(model.clone(), rng.below(2) as u32, self.now);
            if self.seen() != before || self.m.entries().map(|e| e.queue_depth()).sum::<usize>() != queue {
                self.fail(&format!("plan({}) changed the machine", model.name));
            }
            if let Some(p) = plan.evicts.iter().find(|n| self.m.entry(n).is_some_and(|e| e.pinned) && **n != model.name)
            {
                self.fail(&format!("plan({}) would evict pinned {p}: {plan:?}", model.name));
            }
            let quiet = self.starts.is_empty() && self.stops.is_empty() && self.m.load_queue().is_empty();
            if quiet && rng.chance(50) {
                return self.plan_then_load(model, rng.below(2) as u32);
            }
        }
        match rng.below(13) {
            0..=2 => {
                let req = self.next_req;
                self.next_req += 1;
                self.open_acquires.insert(req);
                self.asked_at.insert(req, self.now);
                let auto = rng.chance(85).then(|| (rng.below(2)) as u32);
                let mut model = model;
                model.priority = rng.below(3) as i32 - 1;
                // Some requests are a router's classifier's (the routing-helper pool).
                model.helper = rng.chance(20);
                self.priorities.insert(req, (model.name.clone(), model.priority));
                self.send(Event::Acquire { req, model, auto_load: auto });
            }
            3 | 4 => {
                if let Some(req) = self.leases.keys().nth(rng.below(self.leases.len().max(1))).copied() {
                    self.leases.remove(&req);
                    // Usually the lease is dropped (Release); sometimes the client went away
                    // just as it was granted, and its Cancel arrives after the grant.
                    if rng.chance(20) {
                        self.send(Event::Cancel { req });
                    } else {
                        self.send(Event::Release { req });
                    }
                }
            }
            5 => {
                if let Some(req) = self.open_acquires.iter().nth(rng.below(self.open_acquires.len().max(1))).copied() {
                    if rng.chance(30) {
                        // The client went away before its model loaded.
                        self.open_acquires.remove(&req);
                        self.asked_at.remove(&req);
                        self.send(Event::Cancel { req });
                    }
                }
            }
            6 => {
                let req = self.next_req;
                self.next_req += 1;
                self.open_loads.insert(req, model.name.clone());
                let pin = match rng.below(10) {
                    0 | 1 => Some(true),
                    2 => Some(false),
                    _ => None,
                };
                if let Some(p) = pin {
                    if p {
                        self.pinned.insert(model.name.clone());
                    } else {
                        self.pinned.remove(&model.name);
                    }
                }
                self.send(Event::Load { req, model, options: rng.below(2) as u32, pin });
            }
            7 => {
                let req = self.next_req;
                self.next_req += 1;
                self.open_unloads.insert(req);
                let target = if rng.chance(20) { None } else { Some(model.name.clone()) };
                let live = self
                    .procs
                    .keys()
                    .filter(|n| target.as_ref().is_none_or(|t| t == *n))
                    .map(|n| (n.clone(), self.generation[n]))
                    .collect();
                self.unload_targets.insert(req, live);
                match &target {
                    Some(t) => {
                        self.pinned.remove(t);
                    }
                    None => self.pinned.clear(),
                }
                self.send(Event::Unload { req, model: target });
            }
            8 | 9 => {
                let ok = rng.chance(75);
                self.complete_start(rng, ok)
            }
            10 if rng.chance(50) => self.complete_stop(rng),
            10 => {
                // The executor's timer: time passes to the next idle deadline, or a little.
                let next = self.m.next_deadline().unwrap_or(self.now + 100);
                self.now = self.now.max(next);
                self.send(Event::Tick);
            }
            12 => {
                let req = self.next_req;
                self.next_req += 1;
                let pinned = rng.chance(60);
                self.open_pins.insert(req, (model.name.clone(), pinned));
                if !pinned {
                    self.pinned.remove(&model.name); // takes effect within the event
                }
                self.send(Event::Pin { req, model: model.name.clone(), pinned });
            }
            _ => {
                // A running backend crashes.
                if rng.chance(30) {
                    let running: Vec<String> =
                        self.procs.iter().filter(|(_, p)| **p == Proc::Running).map(|(n, _)| n.clone()).collect();
                    if let Some(n) = running.get(rng.below(running.len().max(1))).cloned() {
                        self.procs.remove(&n);
                        self.demotion_victims.remove(&n);
                        self.send(Event::Exited { model: n, error: "killed by signal 9".into() });
                    }
                }
            }
        }
    }

    fn complete_start(&mut self, rng: &mut Rng, ok: bool) {
        if self.starts.is_empty() {
            return;
        }
        let model = self.starts.remove(rng.below(self.starts.len()));
        let result = if ok {
            // A stop may have taken the process down while it was starting.
            if self.procs.get(&model) == Some(&Proc::Starting) {
                self.procs.insert(model.clone(), Proc::Running);
                Ok(())
            } else {
                Err(LoadError::not_ready("cancelled"))
            }
        } else {
            self.procs.remove(&model);
            self.demotion_victims.remove(&model);
            Err(LoadError {
                message: "llama-server exited (exit code 1)".into(),
                kind: if rng.chance(20) { Failure::Fatal } else { Failure::NotReady },
            })
        };
        self.send(Event::Started { model, result });
    }

    fn complete_stop(&mut self, rng: &mut Rng) {
        if self.stops.is_empty() {
            return;
        }
        let (model, missed) = self.stops.remove(rng.below(self.stops.len()));
        if !missed {
            self.procs.remove(&model);
            self.demotion_victims.remove(&model);
        }
        self.send(Event::Stopped { model });
    }

    /// Lets the executor and the clients finish everything in flight.
    fn drain(&mut self, rng: &mut Rng) {
        for _ in 0..10_000 {
            if !self.stops.is_empty() {
                self.complete_stop(rng);
            } else if !self.starts.is_empty() {
                self.complete_start(rng, true);
            } else if let Some(req) = self.leases.keys().next().copied() {
                self.leases.remove(&req);
                self.send(Event::Release { req });
            } else if !self.open_acquires.is_empty() {
                // Requests wait on a held swap: time passes to its deadline.
                let Some(d) = self.m.next_deadline() else { self.fail("requests wait and nothing is due") };
                self.now = self.now.max(d);
                self.send(Event::Tick);
            } else {
                return;
            }
        }
        self.fail("did not quiesce");
    }
}

/// Names the seed of any panic during its run (the machine's own, an index, an `expect`), not
/// only the checks' failures, which `Sim::fail` names with the history.
struct SeedOnPanic(u64);

impl Drop for SeedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "scheduler simulation panicked in seed {0}\nreplay: SCHEDULER_SIM_FIRST_SEED={0} SCHEDULER_SIM_SEEDS=1",
                self.0
            );
        }
    }
}

/// Runs one seed; returns how often each invariant judged a case that could break it.
fn run(seed: u64, steps: usize) -> [u64; INVARIANTS + 1] {
    let _named = SeedOnPanic(seed);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let limits = draw_limits(&mut rng);
    let draw = Draw {
        idle_timeout: rng.chance(50).then(|| 200 + rng.below(1300) as u64),
        budget: rng.chance(50).then(|| 1_000 + rng.below(2_000) as u64),
        vram_budget: rng.chance(50).then(|| 1_000 + rng.below(2_000) as u64),
        max_queue: rng.chance(50).then(|| 1 + rng.below(8)),
        hold: if rng.chance(50) { 100 + rng.below(900) as u64 } else { 0 },
        devices: draw_devices(&mut rng),
    };
    let mut sim = Sim::new(seed, limits, draw, &mut rng);
    for _ in 0..steps {
        sim.step(&mut rng);
    }
    sim.drain(&mut rng);
    if !sim.open_acquires.is_empty() {
        sim.fail(&format!("requests never answered: {:?}", sim.open_acquires));
    }
    if !sim.open_loads.is_empty() || !sim.open_unloads.is_empty() {
        sim.fail(&format!("loads {:?} / unloads {:?} never answered", sim.open_loads, sim.open_unloads));
    }
    // No dead ends: after any history, once nothing is pinned, a last request to every model
    // is granted.
    for m in sim.models.clone() {
        let req = sim.next_req;
        sim.next_req += 1;
        sim.open_pins.insert(req, (m.name.clone(), false));
        sim.pinned.remove(&m.name);
        sim.send(Event::Pin { req, model: m.name.clone(), pinned: false });
    }
    sim.now += 10 * CRASH_BACKOFF_MAX_MS;
    for m in sim.models.clone() {
        let req = sim.next_req;
        sim.next_req += 1;
        sim.open_acquires.insert(req);
        sim.asked_at.insert(req, sim.now);
        sim.send(Event::Acquire { req, model: m.clone(), auto_load: Some(7) });
        sim.drain(&mut rng);
        if !sim.granted.contains(&req) && !sim.too_big.contains(&req) {
            sim.fail(&format!("the last request to {} was not granted", m.name));
        }
        let entry = sim.m.entry(&m.name).expect("entry");
        if entry.state != State::Loaded && !sim.too_big.contains(&req) {
            sim.fail(&format!("{} ended in {:?} after serving", m.name, entry.state));
        }
    }
    sim.hit(12);
    let hits = *sim.hits.borrow();
    hits
}

/// Half the seeds have devices: one to three GPUs (budgets of 400 to 1,600, so that some
/// models fit only split or nowhere; one in ten with none) and, half of those, one or two
/// NPUs.
fn draw_devices(rng: &mut Rng) -> Vec<Device> {
    if rng.chance(50) {
        return Vec::new();
    }
    let mut d: Vec<Device> = (0..1 + rng.below(3))
        .map(|i| Device::gpu(&format!("gpu{i}"), (!rng.chance(10)).then(|| 400 + rng.below(1200) as u64)))
        .collect();
    if rng.chance(50) {
        d.extend((0..1 + rng.below(2)).map(|i| Device::npu(&format!("npu{i}"))));
    }
    d
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_histories_keep_every_invariant() {
    let first = env_or("SCHEDULER_SIM_FIRST_SEED", 0);
    let seeds = env_or("SCHEDULER_SIM_SEEDS", 1_000);
    let steps = env_or("SCHEDULER_SIM_STEPS", 300) as usize;
    let mut hits = [0u64; INVARIANTS + 1];
    for seed in first..first + seeds {
        for (total, n) in hits.iter_mut().zip(run(seed, steps)) {
            *total += n;
        }
    }
    let counts: Vec<String> = (1..=INVARIANTS).map(|i| format!("{i}: {}", hits[i])).collect();
    println!("{seeds} seeds × {steps} steps; cases each invariant judged: {}", counts.join(", "));
    // A replay of a few seeds need not meet every case; a run of hundreds must.
    if seeds >= 500 {
        let silent: Vec<usize> = (1..=INVARIANTS).filter(|i| hits[*i] == 0).collect();
        assert!(silent.is_empty(), "invariants that never judged a case in {seeds} seeds: {silent:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Rules, one by one
// ---------------------------------------------------------------------------------------------

fn llm(name: &str) -> ModelRef {
    ModelRef::new(name, ModelType::Llm, false)
}

/// Drives a machine and records effects; the executor is the test.
struct Drive {
    m: Machine<u32>,
    now: u64,
    next: ReqId,
}

impl Drive {
    fn new(limit: i64) -> Drive {
        Drive { m: Machine::new(Limits::uniform(limit)), now: 0, next: 1 }
    }
    fn ev(&mut self, e: Event<u32>) -> Vec<Effect<u32>> {
        self.now += 10;
        self.m.handle(e, self.now)
    }
    fn req(&mut self) -> ReqId {
        self.next += 1;
        self.next
    }
    /// Acquire with auto-load; completes the start(s) and stops it causes. Returns the request.
    fn use_model(&mut self, m: &ModelRef) -> ReqId {
        let req = self.req();
        let mut pending = self.ev(Event::Acquire { req, model: m.clone(), auto_load: Some(0) });
        while let Some(e) = pending.pop() {
            match e {
                Effect::Stop { model } => pending.extend(self.ev(Event::Stopped { model })),
                Effect::Start { model, .. } => pending.extend(self.ev(Event::Started { model, result: Ok(()) })),
                _ => {}
            }
        }
        req
    }
    /// A request that starts `name`, then an unload while it starts (which stops it). Returns
    /// the request, the unload and the unload's effects.
    fn unload_while_loading(&mut self, name: &str) -> (ReqId, ReqId, Vec<Effect<u32>>) {
        let req = self.req();
        self.ev(Event::Acquire { req, model: llm(name), auto_load: Some(0) });
        let un = self.req();
        let fx = self.ev(Event::Unload { req: un, model: Some(name.into()) });
        assert!(fx.contains(&Effect::Stop { model: name.into() }), "{fx:?}");
        (req, un, fx)
    }
    fn state(&self, name: &str) -> State {
        self.m.entry(name).map(|e| e.state).unwrap_or(State::Unloaded)
    }
}

#[test]
fn lru_eviction_order_with_three_models_and_two_slots() {
    let mut d = Drive::new(2);
    let (a, b, c) = (llm("a"), llm("b"), llm("c"));
    for m in [&a, &b] {
        let r = d.use_model(m);
        d.ev(Event::Release { req: r });
    }
    // Using A again makes B the least recently used.
    let r = d.use_model(&a);
    d.ev(Event::Release { req: r });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: c.clone(), auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Stop { model: "b".into() }]);
    let fx = d.ev(Event::Stopped { model: "b".into() });
    assert_eq!(fx, vec![Effect::Start { model: "c".into(), options: 0, devices: Shares::new() }]);
    assert_eq!((d.state("a"), d.state("b")), (State::Loaded, State::Unloaded));
}

#[test]
fn busy_model_is_drained_before_eviction_and_others_types_are_untouched() {
    let mut d = Drive::new(1);
    let emb = ModelRef::new("e", ModelType::Embedding, false);
    let held = d.use_model(&llm("a"));
    let e = d.use_model(&emb);
    d.ev(Event::Release { req: e });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: llm("b"), auto_load: Some(0) });
    assert!(fx.is_empty(), "A is busy: nothing is stopped yet: {fx:?}");
    assert_eq!(d.state("a"), State::Unloading, "A admits no new requests");
    let late = d.req();
    let fx = d.ev(Event::Acquire { req: late, model: llm("a"), auto_load: None });
    assert!(matches!(&fx[..], [Effect::Reject { why: Rejection::Unloading, .. }]), "{fx:?}");
    let fx = d.ev(Event::Release { req: held });
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }]);
    assert_eq!(d.state("e"), State::Loaded, "the embedding slot is independent");
}

#[test]
fn failed_load_evicts_everything_and_retries_once_unless_the_file_is_missing() {
    let mut d = Drive::new(-1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let req = d.req();
    d.ev(Event::Acquire { req, model: llm("b"), auto_load: Some(0) });
    let err = |fatal: bool| LoadError {
        message: "out of memory".into(),
        kind: if fatal { Failure::Fatal } else { Failure::NotReady },
    };
    let fx = d.ev(Event::Started { model: "b".into(), result: Err(err(false)) });
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }], "evict all");
    let fx = d.ev(Event::Stopped { model: "a".into() });
    assert_eq!(fx, vec![Effect::Start { model: "b".into(), options: 0, devices: Shares::new() }], "retry once");
    let fx = d.ev(Event::Started { model: "b".into(), result: Err(err(false)) });
    assert!(
        matches!(&fx[..], [Effect::Reject { why: Rejection::LoadFailed(m), .. }] if m == "out of memory"),
        "{fx:?}"
    );
    assert_eq!(d.state("b"), State::Failed);

    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let req = d.req();
    d.ev(Event::Acquire { req, model: llm("c"), auto_load: Some(0) });
    let fx = d.ev(Event::Started { model: "c".into(), result: Err(err(true)) });
    assert!(matches!(&fx[..], [Effect::Reject { .. }]), "missing file: no eviction, no retry: {fx:?}");
    assert_eq!(d.state("a"), State::Loaded);
}

#[test]
fn load_with_same_options_is_a_noop_and_other_options_reload_in_place() {
    let mut d = Drive::new(1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let req = d.req();
    let fx = d.ev(Event::Load { req, model: llm("a"), options: 0, pin: None });
    assert_eq!(fx, vec![Effect::LoadDone { req, model: "a".into(), result: LoadOutcome::Loaded }]);
    let req = d.req();
    let fx = d.ev(Event::Load { req, model: llm("a"), options: 5, pin: None });
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }]);
    let fx = d.ev(Event::Stopped { model: "a".into() });
    assert_eq!(fx, vec![Effect::Start { model: "a".into(), options: 5, devices: Shares::new() }]);
    let dup = d.req();
    assert!(
        d.ev(Event::Load { req: dup, model: llm("a"), options: 5, pin: None }).is_empty(),
        "joins the load in progress"
    );
    let fx = d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert_eq!(fx.len(), 2, "both loads answered: {fx:?}");
}

/// A load asked with other options while the model loads is answered once the model runs with
/// its options, not when the first load completes (then the client would be told "loaded"
/// while the model still ran with the others, and see it reloaded under its next request).
/// Found by the engine's simulation (crates/sim: a regression seed there).
#[test]
fn a_load_with_other_options_during_a_load_is_answered_after_its_reload() {
    let mut d = Drive::new(1);
    let (first, second) = (d.req(), d.req());
    let fx = d.ev(Event::Load { req: first, model: llm("a"), options: 0, pin: None });
    assert_eq!(fx, vec![Effect::Start { model: "a".into(), options: 0, devices: Shares::new() }]);
    assert!(d.ev(Event::Load { req: second, model: llm("a"), options: 5, pin: Some(true) }).is_empty());
    let fx = d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert_eq!(
        fx,
        vec![
            Effect::LoadDone { req: first, model: "a".into(), result: LoadOutcome::Loaded },
            Effect::Stop { model: "a".into() }
        ],
        "only the first load is answered; the reload begins"
    );
    let fx = d.ev(Event::Stopped { model: "a".into() });
    assert_eq!(fx, vec![Effect::Start { model: "a".into(), options: 5, devices: Shares::new() }]);
    let fx = d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert_eq!(fx, vec![Effect::LoadDone { req: second, model: "a".into(), result: LoadOutcome::Loaded }]);
}

/// The admin load's conditions are the machine's: decided on the state it holds, whatever a
/// snapshot said when the request was sent.
#[test]
fn an_admin_load_is_decided_on_the_machines_state() {
    let mut d = Drive::new(1);
    let done = |req, result| vec![Effect::LoadDone { req, model: "a".to_string(), result }];
    // Unloaded: it loads, overrides or not.
    let req = d.req();
    assert_eq!(
        d.ev(Event::AdminLoad { req, model: llm("a"), options: 7, overrides: true }),
        vec![Effect::Start { model: "a".into(), options: 7, devices: Shares::new() }]
    );
    // Loading: overrides are refused naming the state; a plain admin load joins it.
    let (r2, r3) = (d.req(), d.req());
    let fx = d.ev(Event::AdminLoad { req: r2, model: llm("a"), options: 0, overrides: true });
    assert_eq!(fx, done(r2, LoadOutcome::Refused(Rejection::InUse(State::Loading))));
    assert!(d.ev(Event::AdminLoad { req: r3, model: llm("a"), options: 7, overrides: false }).is_empty());
    let fx = d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert_eq!(fx.len(), 2, "both loads answered: {fx:?}");
    // Loaded: a plain admin load changes nothing, even with other options (no reload).
    let req = d.req();
    assert_eq!(
        d.ev(Event::AdminLoad { req, model: llm("a"), options: 9, overrides: false }),
        done(req, LoadOutcome::Loaded)
    );
    let req = d.req();
    let fx = d.ev(Event::AdminLoad { req, model: llm("a"), options: 9, overrides: true });
    assert_eq!(fx, done(req, LoadOutcome::Refused(Rejection::InUse(State::Loaded))));
    // Unloading (a request holds it): refused, whatever the body.
    let held = d.use_model(&llm("a"));
    let un = d.req();
    d.ev(Event::Unload { req: un, model: Some("a".into()) });
    assert_eq!(d.state("a"), State::Unloading);
    let req = d.req();
    let fx = d.ev(Event::AdminLoad { req, model: llm("a"), options: 0, overrides: false });
    assert_eq!(fx, done(req, LoadOutcome::Refused(Rejection::Unloading)));
    d.ev(Event::Release { req: held });
}

#[test]
fn unload_of_a_loading_model_cancels_the_load() {
    let mut d = Drive::new(1);
    let (req, un, fx) = d.unload_while_loading("a");
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Reject { req: r, .. } if *r == req)),
        "the waiting request is answered"
    );
    d.ev(Event::Started { model: "a".into(), result: Err(LoadError::not_ready("killed")) });
    let fx = d.ev(Event::Stopped { model: "a".into() });
    assert_eq!(fx, vec![Effect::UnloadDone { req: un, result: Ok(vec!["a".into()]) }]);
    assert_eq!(d.state("a"), State::Unloaded);
    let nl = d.req();
    let fx = d.ev(Event::Unload { req: nl, model: Some("a".into()) });
    assert!(matches!(&fx[..], [Effect::UnloadDone { result: Err(_), .. }]), "not loaded: {fx:?}");
}

#[test]
fn a_start_that_succeeds_after_its_unload_is_stopped_again() {
    // The stop sent during the start may have found no process yet (the executor registers it
    // only once spawned). Whichever of Stopped and Started reports first, a successful start
    // is followed by one more stop, and the unload is answered only after that one.
    for stopped_first in [true, false] {
        let mut d = Drive::new(1);
        let (_, un, _) = d.unload_while_loading("a");
        let (first, second) = if stopped_first {
            (Event::Stopped { model: "a".into() }, Event::Started { model: "a".into(), result: Ok(()) })
        } else {
            (Event::Started { model: "a".into(), result: Ok(()) }, Event::Stopped { model: "a".into() })
        };
        assert!(d.ev(first).is_empty());
        let fx = d.ev(second);
        assert_eq!(fx, vec![Effect::Stop { model: "a".into() }], "stopped_first={stopped_first}");
        assert_eq!(d.state("a"), State::Unloading);
        let fx = d.ev(Event::Stopped { model: "a".into() });
        assert_eq!(fx, vec![Effect::UnloadDone { req: un, result: Ok(vec!["a".into()]) }]);
        assert_eq!(d.state("a"), State::Unloaded);
    }
}

#[test]
fn crash_fails_the_model_and_repeated_crashes_back_off() {
    let mut d = Drive::new(1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Exited { model: "a".into(), error: "killed by signal 9".into() });
    assert_eq!(d.state("a"), State::Failed);
    assert_eq!(d.m.entry("a").unwrap().last_error.as_deref(), Some("killed by signal 9"));
    d.ev(Event::Release { req: r });
    let r = d.use_model(&llm("a"));
    assert_eq!(d.state("a"), State::Loaded, "the first crash reloads at once");
    d.ev(Event::Release { req: r });
    d.ev(Event::Exited { model: "a".into(), error: "again".into() });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: llm("a"), auto_load: Some(0) });
    assert!(matches!(&fx[..], [Effect::Reject { why: Rejection::Backoff { .. }, .. }]), "{fx:?}");
    d.now += CRASH_BACKOFF_MAX_MS;
    let r = d.use_model(&llm("a"));
    assert_eq!(d.state("a"), State::Loaded, "loads again after the back-off");
    d.ev(Event::Release { req: r });
    // A backend that ran for a while before it crashed is not a crash loop: no back-off.
    d.now += CRASH_RESET_MS;
    d.ev(Event::Exited { model: "a".into(), error: "once in a while".into() });
    let r = d.use_model(&llm("a"));
    assert_eq!(d.state("a"), State::Loaded, "reloads at once: the count started again");
    d.ev(Event::Release { req: r });
}

#[test]
fn npu_models_exclude_each_other_whatever_their_type() {
    let mut d = Drive::new(-1);
    let n1 = ModelRef::new("n1", ModelType::Llm, true);
    let n2 = ModelRef::new("n2", ModelType::Embedding, true);
    let r = d.use_model(&n1);
    d.ev(Event::Release { req: r });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: n2, auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Stop { model: "n1".into() }]);
}

#[test]
fn an_idle_model_gives_way_before_a_busy_one_even_if_the_busy_one_is_older() {
    let mut d = Drive::new(2);
    let held = d.use_model(&llm("a")); // older, and busy
    let r = d.use_model(&llm("b")); // more recent, idle
    d.ev(Event::Release { req: r });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: llm("c"), auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Stop { model: "b".into() }]);
    assert_eq!(d.state("a"), State::Loaded, "the busy model is untouched");
    assert!(d.m.entry("a").unwrap().in_flight.contains(&held));
}

#[test]
fn a_cancel_that_crosses_its_grant_gives_the_model_back() {
    // Found by the soak: a client hung up just as its request was granted; the cancel arrived
    // after the grant, the request stayed in flight forever, and the next swap waited on it.
    let mut d = Drive::new(1);
    let req = d.req();
    d.ev(Event::Acquire { req, model: llm("a"), auto_load: Some(0) });
    d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert!(d.m.entry("a").unwrap().in_flight.contains(&req), "granted");
    d.ev(Event::Cancel { req });
    assert!(d.m.entry("a").unwrap().in_flight.is_empty(), "the crossed cancel released it");
    let b = d.req();
    let fx = d.ev(Event::Acquire { req: b, model: llm("b"), auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }], "a swap can proceed at once");
    // A second cancel or a release of the same request changes nothing.
    d.ev(Event::Cancel { req });
    d.ev(Event::Release { req });
}

#[test]
fn an_idle_model_is_unloaded_after_its_timeout_and_a_busy_one_never() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1)).with_settings(idle_timeout(1_000));
    let a = d.use_model(&llm("a"));
    d.ev(Event::Release { req: a });
    let released = d.now;
    let held = d.use_model(&llm("b"));
    assert_eq!(d.m.next_deadline(), Some(released + 1_000), "only the idle model has a deadline");
    d.now = released + 980; // `ev` adds 10 ms: handled at 990
    assert!(d.ev(Event::Tick).is_empty(), "not before its time");
    d.now = released + 5_000;
    let fx = d.ev(Event::Tick);
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }], "A timed out; B is busy");
    d.ev(Event::Stopped { model: "a".into() });
    assert_eq!((d.state("a"), d.state("b")), (State::Unloaded, State::Loaded));
    d.ev(Event::Release { req: held });
    let b_idle = d.now;
    assert_eq!(d.m.next_deadline(), Some(b_idle + 1_000), "B's timer starts when its last request ends");
}

fn idle_timeout(ms: u64) -> Settings {
    Settings { idle_timeout_ms: Some(Some(ms)), ..Settings::default() }
}

fn sized(name: &str, model_type: ModelType, memory: u64) -> ModelRef {
    ModelRef { memory, ..ModelRef::new(name, model_type, false) }
}

#[test]
fn a_pinned_model_is_never_evicted_and_a_load_that_needs_its_slot_is_refused_at_once() {
    let mut d = Drive::new(1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let pin = d.req();
    assert_eq!(
        d.ev(Event::Pin { req: pin, model: "a".into(), pinned: true }),
        vec![Effect::PinDone { req: pin, result: Ok(()) }]
    );
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: llm("b"), auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Reject { req, model: "b".into(), why: Rejection::SlotsPinned(vec!["a".into()]) }]);
    let load = d.req();
    let fx = d.ev(Event::Load { req: load, model: llm("b"), options: 0, pin: None });
    let refused = LoadOutcome::Refused(Rejection::SlotsPinned(vec!["a".into()]));
    assert_eq!(fx, vec![Effect::LoadDone { req: load, model: "b".into(), result: refused }]);
    assert_eq!(d.state("a"), State::Loaded);
    // Unpinned, it gives way as before.
    let unpin = d.req();
    d.ev(Event::Pin { req: unpin, model: "a".into(), pinned: false });
    let req = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req, model: llm("b"), auto_load: Some(0) }),
        vec![Effect::Stop { model: "a".into() }]
    );
    // Pinning a model that is not loaded is refused.
    let p = d.req();
    let fx = d.ev(Event::Pin { req: p, model: "zzz".into(), pinned: true });
    assert_eq!(fx, vec![Effect::PinDone { req: p, result: Err(SchedulerError::NotLoaded("zzz".into())) }]);
}

#[test]
fn a_pinned_model_never_times_out_and_a_per_model_timeout_overrides_the_machine_one() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1)).with_settings(idle_timeout(1_000));
    let quick = ModelRef { idle_timeout_ms: Some(100), ..llm("quick") };
    let never = ModelRef { idle_timeout_ms: Some(0), ..llm("never") };
    for m in [&llm("a"), &quick, &never] {
        let r = d.use_model(m);
        d.ev(Event::Release { req: r });
    }
    let pin = d.req();
    d.ev(Event::Load { req: pin, model: llm("a"), options: 0, pin: Some(true) });
    let quick_at = d.m.unload_at(d.m.entry("quick").unwrap()).expect("quick has a deadline");
    assert_eq!(d.m.unload_at(d.m.entry("a").unwrap()), None, "pinned: no deadline");
    assert_eq!(d.m.unload_at(d.m.entry("never").unwrap()), None, "idle_timeout 0: never");
    assert_eq!(d.m.next_deadline(), Some(quick_at));
    d.now += 10_000;
    let fx = d.ev(Event::Tick);
    assert_eq!(fx, vec![Effect::Stop { model: "quick".into() }]);
    assert_eq!((d.state("a"), d.state("never")), (State::Loaded, State::Loaded));
}

#[test]
fn the_memory_budget_evicts_least_recently_used_models_of_any_type_and_refuses_what_cannot_fit() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1))
        .with_settings(Settings { memory_budget: Some(Some(1_000)), ..Settings::default() });
    let (a, e, b) =
        (sized("a", ModelType::Llm, 400), sized("e", ModelType::Embedding, 400), sized("b", ModelType::Llm, 500));
    for m in [&a, &e] {
        let r = d.use_model(m);
        d.ev(Event::Release { req: r });
    }
    assert_eq!(d.m.in_use(Pool::Memory), 800);
    // B (500) fits only once the least recently used model (A, an LLM) is gone.
    let req = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req, model: b.clone(), auto_load: Some(0) }),
        vec![Effect::Stop { model: "a".into() }]
    );
    assert_eq!(
        d.ev(Event::Stopped { model: "a".into() }),
        vec![Effect::Start { model: "b".into(), options: 0, devices: Shares::new() }]
    );
    d.ev(Event::Started { model: "b".into(), result: Ok(()) });
    d.ev(Event::Release { req });
    assert_eq!(d.m.in_use(Pool::Memory), 900);
    // With E pinned, a 700 model can never fit (700 + 400 > 1000): refused, nothing stopped.
    let pin = d.req();
    d.ev(Event::Pin { req: pin, model: "e".into(), pinned: true });
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: sized("big", ModelType::Llm, 700), auto_load: Some(0) });
    let why = Rejection::NoMemory { pool: Pool::Memory, device: None, needed: 700, budget: 1_000, pinned: 400 };
    assert_eq!(fx, vec![Effect::Reject { req, model: "big".into(), why }]);
    assert_eq!((d.state("b"), d.state("e")), (State::Loaded, State::Loaded));
}

#[test]
fn a_backend_measured_past_its_estimate_counts_what_it_holds_and_a_load_evicts_for_it() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1))
        .with_settings(Settings { memory_budget: Some(Some(1_000)), ..Settings::default() });
    let (a, b) = (sized("a", ModelType::Llm, 300), sized("b", ModelType::Llm, 300));
    for m in [&a, &b] {
        let r = d.use_model(m);
        d.ev(Event::Release { req: r });
    }
    // Under its estimate: the estimate still counts; over it: what it holds.
    d.ev(Event::Measured { model: "a".into(), memory: 200 });
    assert_eq!(d.m.in_use(Pool::Memory), 600);
    d.ev(Event::Measured { model: "a".into(), memory: 650 });
    assert_eq!(d.m.in_use(Pool::Memory), 950);
    let said = d.m.take_decisions();
    assert!(said.iter().any(|x| x.decision == "measured" && x.reason == "over its estimate"), "{said:?}");
    // A 300 model now fits only once the least recently used (A, as measured) is gone.
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: sized("c", ModelType::Llm, 300), auto_load: Some(0) });
    assert_eq!(fx, vec![Effect::Stop { model: "a".into() }]);
    d.ev(Event::Stopped { model: "a".into() });
    d.ev(Event::Started { model: "c".into(), result: Ok(()) });
    d.ev(Event::Release { req });
    assert_eq!(d.m.in_use(Pool::Memory), 600);
    // Measurements of a model that is not loaded change nothing.
    d.ev(Event::Measured { model: "a".into(), memory: 5_000 });
    assert_eq!(d.m.in_use(Pool::Memory), 600);
}

#[test]
fn gpu_models_fit_the_vram_budget_by_evicting_gpu_models_only_and_one_too_big_for_it_is_refused() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1)).with_settings(Settings {
        memory_budget: Some(Some(1_000)),
        vram_budget: Some(Some(1_000)),
        ..Settings::default()
    });
    let gpu = |name: &str, vram| ModelRef { vram, ..sized(name, ModelType::Llm, 50) };
    // The CPU model is the least recently used, but it takes no VRAM: the GPU model goes.
    for m in [&sized("cpu", ModelType::Llm, 800), &gpu("g1", 600)] {
        let r = d.use_model(m);
        d.ev(Event::Release { req: r });
    }
    assert_eq!((d.m.in_use(Pool::Memory), d.m.in_use(Pool::Vram)), (850, 600));
    let req = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req, model: gpu("g2", 700), auto_load: Some(0) }),
        vec![Effect::Stop { model: "g1".into() }]
    );
    assert_eq!(
        d.ev(Event::Stopped { model: "g1".into() }),
        vec![Effect::Start { model: "g2".into(), options: 0, devices: Shares::new() }]
    );
    d.ev(Event::Started { model: "g2".into(), result: Ok(()) });
    d.ev(Event::Release { req });
    assert_eq!((d.m.in_use(Pool::Memory), d.m.in_use(Pool::Vram)), (850, 700));
    // More VRAM than the budget: refused naming VRAM, nothing stopped; the same size on the
    // CPU is a memory matter and evicts as usual.
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: gpu("huge", 1_200), auto_load: Some(0) });
    let why = Rejection::NoMemory { pool: Pool::Vram, device: None, needed: 1_200, budget: 1_000, pinned: 0 };
    assert_eq!(fx, vec![Effect::Reject { req, model: "huge".into(), why }]);
    assert_eq!((d.state("cpu"), d.state("g2")), (State::Loaded, State::Loaded));
    let req = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req, model: sized("cpu2", ModelType::Llm, 900), auto_load: Some(0) }),
        vec![Effect::Stop { model: "cpu".into() }]
    );
}

#[test]
fn a_request_that_sets_the_idle_timeout_changes_it_for_the_running_backend() {
    let mut d = Drive::new(-1);
    d.m = Machine::new(Limits::uniform(-1)).with_settings(idle_timeout(60_000));
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let at = |d: &Drive| d.m.unload_at(d.m.entry("a").unwrap());
    assert_eq!(at(&d), Some(d.now + 60_000), "the machine's timeout");
    // A plain request leaves it; a keep-alive of 1 ms unloads the model once it is idle.
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    assert_eq!(at(&d), Some(d.now + 60_000));
    let keep = ModelRef { idle_timeout_ms: Some(1), sets_idle_timeout: true, ..llm("a") };
    let r = d.use_model(&keep);
    assert_eq!(at(&d), None, "busy: no deadline");
    d.ev(Event::Release { req: r });
    assert_eq!(at(&d), Some(d.now + 1));
    d.now += 1;
    assert_eq!(d.ev(Event::Tick), vec![Effect::Stop { model: "a".into() }]);
    // A plain request while it stops reloads it with the machine's timeout, not the 1 ms.
    let r = d.req();
    d.ev(Event::Acquire { req: r, model: llm("a"), auto_load: Some(0) });
    d.ev(Event::Stopped { model: "a".into() });
    d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    d.ev(Event::Release { req: r });
    assert_eq!(at(&d), Some(d.now + 60_000), "the keep-alive was that backend's");
    let u = d.req();
    d.ev(Event::Unload { req: u, model: Some("a".into()) });
    // Keep-alive forever (0 = never) on a model that loads for this request.
    d.ev(Event::Stopped { model: "a".into() });
    let forever = ModelRef { idle_timeout_ms: Some(0), sets_idle_timeout: true, ..llm("a") };
    let r = d.use_model(&forever);
    d.ev(Event::Release { req: r });
    assert_eq!(at(&d), None);
}

#[test]
fn the_largest_timeouts_holds_and_sizes_do_not_overflow() {
    // Settings come from users (`POST /api/v1/params`, `keep_alive`): u64::MAX ms must mean
    // "a very long time", not an overflow (a panic in debug builds took the owner task down).
    let mut d = Drive::new(1);
    d.m = Machine::new(Limits::uniform(1)).with_settings(Settings {
        idle_timeout_ms: Some(Some(u64::MAX)),
        swap_hold_ms: Some(u64::MAX),
        memory_budget: Some(Some(u64::MAX)),
        ..Settings::default()
    });
    let big = |n: &str| ModelRef { memory: u64::MAX - 1, ..llm(n) };
    let a = d.use_model(&big("a"));
    assert_eq!(d.m.unload_at(d.m.entry("a").unwrap()), None, "busy");
    // A request for b waits for the hold, which never runs out; a's deadline saturates.
    let b = d.req();
    d.ev(Event::Acquire { req: b, model: big("b"), auto_load: Some(0) });
    d.now += 1_000;
    assert_eq!(d.ev(Event::Tick), vec![]);
    d.ev(Event::Release { req: a });
    d.now += 1_000_000;
    d.ev(Event::Tick);
    let next = d.m.next_deadline();
    assert!(next.is_none_or(|t| t >= d.now), "{next:?} {}", d.now);
    let long = ModelRef { idle_timeout_ms: Some(u64::MAX), sets_idle_timeout: true, ..llm("c") };
    let c = d.req();
    d.ev(Event::Acquire { req: c, model: long, auto_load: Some(0) });
}

#[test]
fn the_queue_is_bounded_and_a_full_queue_answers_at_once() {
    let mut d = Drive::new(1);
    d.m = Machine::new(Limits::uniform(1)).with_settings(Settings { max_queue: Some(Some(2)), ..Settings::default() });
    let (r1, r2, r3) = (d.req(), d.req(), d.req());
    d.ev(Event::Acquire { req: r1, model: llm("a"), auto_load: Some(0) });
    d.ev(Event::Acquire { req: r2, model: llm("a"), auto_load: Some(0) });
    let fx = d.ev(Event::Acquire { req: r3, model: llm("a"), auto_load: Some(0) });
    let why = Rejection::QueueFull { max_queue: 2, retry_in_ms: QUEUE_FULL_RETRY_MS };
    assert_eq!(fx, vec![Effect::Reject { req: r3, model: "a".into(), why }]);
    let fx = d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    assert_eq!(fx.len(), 2, "both waiting requests are granted: {fx:?}");
    let r4 = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req: r4, model: llm("a"), auto_load: Some(0) }),
        vec![Effect::Grant { req: r4, model: "a".into() }],
        "room again"
    );
}

#[test]
fn max_concurrent_holds_further_requests_until_one_ends_oldest_first() {
    let mut d = Drive::new(1);
    let a = ModelRef { max_concurrent: Some(1), ..llm("a") };
    let first = d.use_model(&a);
    let (second, third) = (d.req(), d.req());
    assert!(d.ev(Event::Acquire { req: second, model: a.clone(), auto_load: Some(0) }).is_empty());
    assert!(d.ev(Event::Acquire { req: third, model: a.clone(), auto_load: None }).is_empty());
    assert_eq!(d.m.entry("a").unwrap().queue_depth(), 2);
    assert_eq!(d.ev(Event::Release { req: first }), vec![Effect::Grant { req: second, model: "a".into() }]);
    assert_eq!(d.ev(Event::Release { req: second }), vec![Effect::Grant { req: third, model: "a".into() }]);
}

#[test]
fn anti_thrash_keeps_serving_the_loaded_model_until_the_other_has_waited_the_hold() {
    let mut d = Drive::new(1);
    d.m = Machine::new(Limits::uniform(1)).with_settings(Settings { swap_hold_ms: Some(1_000), ..Settings::default() });
    let a1 = d.use_model(&llm("a"));
    // B arrives while A serves: no stop yet.
    let b = d.req();
    assert!(d.ev(Event::Acquire { req: b, model: llm("b"), auto_load: Some(0) }).is_empty());
    let asked = d.now;
    assert_eq!(d.m.next_deadline(), Some(asked + 1_000));
    // A's client goes on: its next request is granted at once.
    d.ev(Event::Release { req: a1 });
    let a2 = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req: a2, model: llm("a"), auto_load: Some(0) }),
        vec![Effect::Grant { req: a2, model: "a".into() }]
    );
    d.ev(Event::Release { req: a2 });
    // When B has waited the hold, A gives way, and its new requests wait for B's turn.
    d.now = asked + 1_000;
    assert_eq!(d.ev(Event::Tick), vec![Effect::Stop { model: "a".into() }]);
    let a3 = d.req();
    assert!(d.ev(Event::Acquire { req: a3, model: llm("a"), auto_load: Some(0) }).is_empty());
    assert_eq!(
        d.ev(Event::Stopped { model: "a".into() }),
        vec![Effect::Start { model: "b".into(), options: 0, devices: Shares::new() }]
    );

    // A model that is idle when another is asked for swaps at once (one client switching
    // models pays nothing).
    let mut d = Drive::new(1);
    d.m = Machine::new(Limits::uniform(1)).with_settings(Settings { swap_hold_ms: Some(1_000), ..Settings::default() });
    let a = d.use_model(&llm("a"));
    d.ev(Event::Release { req: a });
    let b = d.req();
    assert_eq!(
        d.ev(Event::Acquire { req: b, model: llm("b"), auto_load: Some(0) }),
        vec![Effect::Stop { model: "a".into() }]
    );
}

#[test]
fn settings_change_while_running() {
    let mut d = Drive::new(1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let req = d.req();
    let s = Settings { limits: Some(Limits::uniform(2)), idle_timeout_ms: Some(Some(500)), ..Settings::default() };
    assert_eq!(d.ev(Event::Configure { req, settings: s }), vec![Effect::Configured { req }]);
    assert_eq!(d.m.settings().limits, Some(Limits::uniform(2)));
    let b = d.use_model(&llm("b"));
    assert_eq!((d.state("a"), d.state("b")), (State::Loaded, State::Loaded), "two slots now");
    d.ev(Event::Release { req: b });
    assert!(d.m.next_deadline().is_some(), "the new idle timeout applies");
}

/// Clients that each send requests to their own model one after another, with one slot: every
/// request is granted within the stated bound, and the hold cuts the swaps.
fn alternating(seed: u64, clients: usize, hold: u64) -> (u64, u64) {
    // Requests last 20..120 ms; a client's next one follows 0..20 ms later; starts take 300 ms and
    // stops 30 ms. A request waits at most for one hold plus, per other model, a drain, a stop
    // and a start.
    const RUN: u64 = 120;
    const START: u64 = 300;
    const STOP: u64 = 30;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut m: Machine<u32> =
        Machine::new(Limits::uniform(1)).with_settings(Settings { swap_hold_ms: Some(hold), ..Settings::default() });
    let bound = hold + clients as u64 * (RUN + STOP + START + HOLD_GAP_MS);
    let models: Vec<ModelRef> = (0..clients).map(|i| llm(&format!("m{i}"))).collect();
    // Timed events: (at, seq, event); clients: next send time.
    let mut timers: BTreeMap<(u64, u64), Event<u32>> = BTreeMap::new();
    let mut seq = 0;
    let mut asked: BTreeMap<ReqId, (usize, u64)> = BTreeMap::new();
    let (mut served, mut swaps, mut next_req, mut now) = (0u64, 0u64, 1u64, 0u64);
    let mut push = |timers: &mut BTreeMap<(u64, u64), Event<u32>>, at: u64, e: Event<u32>| {
        seq += 1;
        timers.insert((at, seq), e);
    };
    for (c, model) in models.iter().enumerate() {
        let req = next_req;
        next_req += 1;
        asked.insert(req, (c, 0));
        push(&mut timers, rng.below(20) as u64, Event::Acquire { req, model: model.clone(), auto_load: Some(0) });
    }
    while now < 60_000 {
        let due = timers.keys().next().copied();
        let ev = match (due, m.next_deadline()) {
            (Some(k), Some(d)) if d < k.0 => {
                now = d;
                Event::Tick
            }
            (Some(k), _) => {
                now = k.0;
                timers.remove(&k).expect("timer")
            }
            (None, Some(d)) => {
                now = d;
                Event::Tick
            }
            (None, None) => panic!("seed {seed}: nothing left to happen at {now}"),
        };
        // SCHEDULER_ALT_TRACE=1 prints the history (to read a failure).
        let trace = std::env::var("SCHEDULER_ALT_TRACE").is_ok();
        if trace {
            eprintln!("{now} {ev:?}");
        }
        for fx in m.handle(ev, now) {
            if trace {
                eprintln!("    -> {fx:?}");
            }
            match fx {
                Effect::Start { model, .. } => {
                    swaps += 1;
                    push(&mut timers, now + START, Event::Started { model, result: Ok(()) });
                }
                Effect::Stop { model } => push(&mut timers, now + STOP, Event::Stopped { model }),
                Effect::Grant { req, .. } => {
                    let (c, at) = asked.remove(&req).expect("asked");
                    assert!(
                        now - at <= bound,
                        "seed {seed}, hold {hold}: request of client {c} waited {} ms > {bound}",
                        now - at
                    );
                    served += 1;
                    push(&mut timers, now + 20 + rng.below(100) as u64, Event::Release { req });
                    // The client's next request.
                    let next = next_req;
                    next_req += 1;
                    let at = now + 20 + rng.below(100) as u64 + rng.below(20) as u64;
                    asked.insert(next, (c, at));
                    push(&mut timers, at, Event::Acquire { req: next, model: models[c].clone(), auto_load: Some(0) });
                }
                other => panic!("seed {seed}: unexpected {other:?}"),
            }
        }
    }
    (served, swaps)
}

#[test]
fn alternating_clients_are_served_within_the_bound_and_the_hold_cuts_swaps() {
    for seed in 0..50 {
        for clients in [2, 3] {
            let (served_off, swaps_off) = alternating(seed, clients, 0);
            let (served_on, swaps_on) = alternating(seed, clients, 2_000);
            assert!(swaps_on * 2 < swaps_off, "seed {seed}: {swaps_on} swaps with the hold, {swaps_off} without");
            assert!(served_on > served_off, "seed {seed}: served {served_on} with the hold, {served_off} without");
        }
    }
}

#[test]
fn a_plan_says_what_a_load_would_evict_and_changes_nothing() {
    let mut d = Drive::new(1);
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    let p = d.m.plan(llm("b"), 0, d.now);
    assert_eq!((p.outcome, p.evicts.clone(), p.refusal.clone()), ("load", vec!["a".to_string()], None), "{p:?}");
    let why: Vec<(&str, &str, &str)> = p.decisions.iter().map(|x| (x.decision, x.reason, x.model.as_str())).collect();
    assert_eq!(why, [("evict", "make_room", "a"), ("load", "explicit", "b")]);
    assert_eq!((d.state("a"), d.state("b")), (State::Loaded, State::Unloaded), "nothing changed");
    assert!(d.m.take_decisions().iter().all(|x| x.model == "a"), "the plan's decisions are not the machine's");
    assert_eq!(d.m.plan(llm("a"), 0, d.now).outcome, "loaded");
    let req = d.req();
    d.ev(Event::Pin { req, model: "a".into(), pinned: true });
    let p = d.m.plan(llm("b"), 0, d.now);
    assert_eq!((p.outcome, p.refusal), ("refused", Some(Rejection::SlotsPinned(vec!["a".into()]))));
    // A busy model must finish first: the load waits for it.
    let req = d.req();
    d.ev(Event::Pin { req, model: "a".into(), pinned: false });
    d.use_model(&llm("a"));
    let p = d.m.plan(llm("b"), 0, d.now);
    assert_eq!((p.outcome, p.evicts), ("waits", vec!["a".to_string()]));
}

#[test]
fn decisions_name_their_reasons() {
    let mut d = Drive::new(1);
    d.m.take_decisions();
    let r = d.use_model(&llm("a"));
    d.ev(Event::Release { req: r });
    d.use_model(&llm("b"));
    let why: Vec<(&str, &str, String)> =
        d.m.take_decisions().into_iter().map(|x| (x.decision, x.reason, x.model)).collect();
    assert_eq!(
        why,
        [
            ("queue", "loading", "a".into()),
            ("load", "request", "a".into()),
            ("queue", "loading", "b".into()),
            ("evict", "make_room", "a".into()),
            ("load", "request", "b".into())
        ]
    );
    let req = d.req();
    d.ev(Event::Unload { req, model: Some("b".into()) });
    let why: Vec<(&str, &str)> = d.m.take_decisions().iter().map(|x| (x.decision, x.reason)).collect();
    assert_eq!(why, [("unload", "explicit")]);
}

#[test]
fn a_higher_priority_request_waits_ahead_of_earlier_ones() {
    let mut d = Drive::new(1);
    let mut m = llm("a");
    m.max_concurrent = Some(1);
    let running = d.use_model(&m);
    let (low, high, same) = (d.req(), d.req(), d.req());
    for (req, p) in [(low, 0), (high, 5), (same, 5)] {
        let mut r = m.clone();
        r.priority = p;
        assert!(d.ev(Event::Acquire { req, model: r, auto_load: Some(0) }).is_empty(), "waits");
    }
    assert_eq!(d.m.waiting_priorities("a"), [5, 5, 0], "higher first, equal ones in arrival order");
    let order: Vec<ReqId> = [running, high, same]
        .into_iter()
        .map(|done| {
            let fx = d.ev(Event::Release { req: done });
            match fx.as_slice() {
                [Effect::Grant { req, .. }] => *req,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(order, [high, same, low]);
}

/// A machine with two GPUs of 1,000 bytes each (and one NPU), no other budget.
fn two_gpus() -> Drive {
    let mut d = Drive::new(-1);
    let devices = vec![Device::gpu("gpu0", Some(1_000)), Device::gpu("gpu1", Some(1_000)), Device::npu("npu0")];
    d.m = Machine::new(Limits::uniform(-1)).with_settings(Settings { devices: Some(devices), ..Settings::default() });
    d
}

impl Drive {
    /// One request to `m`, answered (its model loads as it must), then released.
    fn serve(&mut self, m: &ModelRef) {
        let req = self.use_model(m);
        self.ev(Event::Release { req });
    }
}

fn on_gpu(name: &str, model_type: ModelType, vram: u64, placement: Placement) -> ModelRef {
    ModelRef { vram, placement, ..ModelRef::new(name, model_type, false) }
}

fn placed(d: &Drive, name: &str) -> Vec<(String, u64)> {
    d.m.placement_of(name).map(|s| s.iter().map(|(k, v)| (k.clone(), *v)).collect()).unwrap_or_default()
}

#[test]
fn auto_goes_where_it_evicts_least_then_where_most_is_free_and_eviction_stays_on_the_short_device() {
    let mut d = two_gpus();
    let auto = Placement::Auto;
    // Empty machine: both fit; the first with the most free memory.
    d.serve(&on_gpu("chat", ModelType::Llm, 600, auto.clone()));
    assert_eq!(placed(&d, "chat"), [("gpu0".into(), 600)]);
    // gpu1 has more room left: the embedder goes there.
    d.serve(&on_gpu("embed", ModelType::Embedding, 300, auto.clone()));
    assert_eq!(placed(&d, "embed"), [("gpu1".into(), 300)]);
    // 600 fits on gpu1 beside the embedder with no eviction; gpu0 would need one.
    d.serve(&on_gpu("coder", ModelType::Llm, 600, auto.clone()));
    assert_eq!(placed(&d, "coder"), [("gpu1".into(), 600)]);
    // A chat model asked onto gpu0 evicts the chat model there, never the embedder on gpu1.
    let on0 = Placement::On(vec!["gpu0".into()]);
    let plan = d.m.plan(on_gpu("big", ModelType::Llm, 900, on0.clone()), 0, d.now);
    assert_eq!((plan.outcome, plan.evicts.clone()), ("load", vec!["chat".to_string()]), "{plan:?}");
    assert_eq!(plan.devices, Shares::from([("gpu0".into(), 900)]));
    d.serve(&on_gpu("big", ModelType::Llm, 900, on0));
    assert_eq!((d.state("chat"), d.state("embed"), d.state("coder")), (State::Unloaded, State::Loaded, State::Loaded));
    assert_eq!(d.m.device_in_use("gpu0"), 900);
    assert_eq!(d.m.device_in_use("gpu1"), 900);
}

#[test]
fn a_split_holds_its_share_on_each_device_and_one_too_big_anywhere_is_refused_naming_the_device() {
    let mut d = two_gpus();
    d.serve(&on_gpu("small", ModelType::Embedding, 400, Placement::On(vec!["gpu1".into()])));
    // 1,200 fits on no GPU alone: auto splits it by free memory (1,000 and 600).
    d.serve(&on_gpu("large", ModelType::Llm, 1_200, Placement::Auto));
    assert_eq!(placed(&d, "large"), [("gpu0".into(), 750), ("gpu1".into(), 450)]);
    assert_eq!(d.state("small"), State::Loaded, "nothing evicted");
    // Asked onto both, it splits over those; the shares always sum to the model.
    let both = Placement::On(vec!["gpu0".into(), "gpu1".into()]);
    let plan = d.m.plan(on_gpu("x", ModelType::Reranking, 301, both), 0, d.now);
    assert_eq!(plan.devices.values().sum::<u64>(), 301, "{plan:?}");
    // One GPU cannot hold 1,100 with nothing else on it: refused, naming the device.
    let req = d.req();
    let huge = on_gpu("huge", ModelType::Llm, 1_100, Placement::On(vec!["gpu1".into()]));
    let fx = d.ev(Event::Acquire { req, model: huge, auto_load: Some(0) });
    let why =
        Rejection::NoMemory { pool: Pool::Vram, device: Some("gpu1".into()), needed: 1_100, budget: 1_000, pinned: 0 };
    assert_eq!(fx, vec![Effect::Reject { req, model: "huge".into(), why }]);
    // An unknown device is refused with the devices there are.
    let req = d.req();
    let fx = d.ev(Event::Acquire {
        req,
        model: on_gpu("y", ModelType::Llm, 5, Placement::On(vec!["gpu7".into()])),
        auto_load: Some(0),
    });
    let known = vec!["gpu0".to_string(), "gpu1".into(), "npu0".into()];
    let why = Rejection::UnknownDevice { device: "gpu7".into(), known };
    assert_eq!(fx, vec![Effect::Reject { req, model: "y".into(), why }]);
}

#[test]
fn npu_models_take_turns_on_their_npu_and_a_start_is_told_its_devices() {
    let mut d = two_gpus();
    let req = d.req();
    let fx = d.ev(Event::Acquire { req, model: ModelRef::new("flm-a", ModelType::Llm, true), auto_load: Some(0) });
    assert_eq!(
        fx,
        vec![Effect::Start { model: "flm-a".into(), options: 0, devices: Shares::from([("npu0".into(), 0)]) }]
    );
    d.ev(Event::Started { model: "flm-a".into(), result: Ok(()) });
    d.ev(Event::Release { req });
    d.serve(&ModelRef::new("flm-b", ModelType::Embedding, true));
    assert_eq!((d.state("flm-a"), d.state("flm-b")), (State::Unloaded, State::Loaded), "one model per NPU");
    d.serve(&on_gpu("chat", ModelType::Llm, 10, Placement::Auto));
    assert_eq!(d.state("flm-b"), State::Loaded, "a GPU model leaves the NPU alone");
}

#[test]
fn a_load_onto_an_unknown_device_is_refused_before_the_loaded_model_is_touched() {
    let mut d = two_gpus();
    let m = on_gpu("chat", ModelType::Llm, 100, Placement::Auto);
    d.serve(&m);
    let req = d.req();
    let elsewhere = ModelRef { placement: Placement::On(vec!["gpu9".into()]), ..m };
    let fx = d.ev(Event::Load { req, model: elsewhere, options: 1, pin: None });
    assert!(
        matches!(&fx[..], [Effect::LoadDone { result: LoadOutcome::Refused(Rejection::UnknownDevice { .. }), .. }]),
        "{fx:?}"
    );
    assert_eq!(d.state("chat"), State::Loaded);
}

#[test]
fn among_models_waiting_to_load_the_higher_model_priority_loads_first() {
    let mut d = Drive::new(1);
    let ask = |d: &mut Drive, name: &str, p: i32| {
        let req = d.req();
        let model = ModelRef { model_priority: p, ..llm(name) };
        d.ev(Event::Acquire { req, model, auto_load: Some(0) });
        req
    };
    let a = ask(&mut d, "a", 0);
    let _b = ask(&mut d, "b", 0);
    let _c = ask(&mut d, "c", 5);
    assert_eq!(d.m.load_queue(), ["a", "c", "b"], "c goes ahead of b");
    d.ev(Event::Started { model: "a".into(), result: Ok(()) });
    d.ev(Event::Release { req: a });
    assert_eq!(
        d.ev(Event::Stopped { model: "a".into() }),
        vec![Effect::Start { model: "c".into(), options: 0, devices: Shares::new() }]
    );
}

#[test]
fn a_backend_measured_past_its_vram_estimate_counts_what_it_holds_on_its_devices_and_placement_sees_it() {
    let mut d = two_gpus();
    d.serve(&on_gpu("chat", ModelType::Llm, 600, Placement::Auto));
    assert_eq!(placed(&d, "chat"), [("gpu0".into(), 600)]);
    // NVML says it holds 900: gpu0 counts 900, the machine's VRAM in use too.
    d.ev(Event::MeasuredVram { model: "chat".into(), vram: 900 });
    assert_eq!(d.m.device_in_use("gpu0"), 900);
    assert_eq!(d.m.in_use(Pool::Vram), 900);
    let said = d.m.take_decisions();
    assert!(
        said.iter()
            .any(|x| x.decision == "measured" && x.reason == "VRAM over its estimate" && x.detail.contains("gpu0")),
        "{said:?}"
    );
    // 200 more on gpu0 would not fit beside what chat really holds: a 300 asked onto gpu0 evicts it.
    let on0 = Placement::On(vec!["gpu0".into()]);
    let plan = d.m.plan(on_gpu("small", ModelType::Embedding, 200, on0), 0, d.now);
    assert_eq!((plan.outcome, plan.evicts.clone()), ("load", vec!["chat".to_string()]), "{plan:?}");
    // Auto goes to gpu1, where nothing has to give way.
    d.serve(&on_gpu("embed", ModelType::Embedding, 200, Placement::Auto));
    assert_eq!(placed(&d, "embed"), [("gpu1".into(), 200)]);
    // Back under its estimate: the estimate's share is counted again.
    d.ev(Event::MeasuredVram { model: "chat".into(), vram: 100 });
    assert_eq!(d.m.device_in_use("gpu0"), 600);
    // A reload starts from its estimate, not from the last measurement.
    d.ev(Event::MeasuredVram { model: "chat".into(), vram: 950 });
    let un = d.req();
    d.ev(Event::Unload { req: un, model: Some("chat".into()) });
    d.ev(Event::Stopped { model: "chat".into() });
    assert_eq!(d.m.device_in_use("gpu0"), 0);
    d.serve(&on_gpu("chat", ModelType::Llm, 600, Placement::Auto));
    assert_eq!(d.m.in_use(Pool::Vram), 800);
}

#[test]
fn a_split_model_measured_past_its_vram_estimate_grows_each_share_in_proportion() {
    let mut d = two_gpus();
    let both = Placement::On(vec!["gpu0".into(), "gpu1".into()]);
    d.serve(&on_gpu("big", ModelType::Llm, 1_000, both));
    assert_eq!(placed(&d, "big"), [("gpu0".into(), 500), ("gpu1".into(), 500)]);
    d.ev(Event::MeasuredVram { model: "big".into(), vram: 1_301 });
    assert_eq!(placed(&d, "big"), [("gpu0".into(), 650), ("gpu1".into(), 651)]);
    assert_eq!(d.m.in_use(Pool::Vram), 1_301);
}

/// Lemonade v11's routing-helper pool: a model a router's classifier uses holds no slot of its
/// type, so at one LLM slot the router and its candidate stay loaded side by side; asked for
/// directly it takes a standard slot back, evicting the idle standard model; a third model then
/// evicts it as any standard model.
#[test]
fn a_routing_helper_takes_no_slot_and_a_direct_request_moves_it_back() {
    let mut d = Drive::new(1);
    let router = llm("router");
    let helper = ModelRef { helper: true, ..router.clone() };
    let r = d.use_model(&router);
    d.ev(Event::Release { req: r });
    assert!(!d.m.entry("router").unwrap().helper, "a direct request: standard");
    let r = d.use_model(&helper);
    d.ev(Event::Release { req: r });
    assert!(d.m.entry("router").unwrap().helper, "promoted in place");
    let c = d.use_model(&llm("cand"));
    d.ev(Event::Release { req: c });
    assert_eq!((d.state("router"), d.state("cand")), (State::Loaded, State::Loaded), "side by side at one slot");
    // Asked for directly: the idle candidate gives its slot.
    let r = d.use_model(&router);
    assert_eq!((d.state("router"), d.state("cand")), (State::Loaded, State::Unloaded));
    assert!(!d.m.entry("router").unwrap().helper);
    d.ev(Event::Release { req: r });
    let t = d.use_model(&llm("third"));
    d.ev(Event::Release { req: t });
    assert_eq!((d.state("router"), d.state("third")), (State::Unloaded, State::Loaded));
    // Two helpers and a candidate at one slot: all three stay.
    for m in ["h1", "h2"] {
        let r = d.use_model(&ModelRef { helper: true, ..llm(m) });
        d.ev(Event::Release { req: r });
    }
    assert_eq!((d.state("h1"), d.state("h2"), d.state("third")), (State::Loaded, State::Loaded, State::Loaded));
}
