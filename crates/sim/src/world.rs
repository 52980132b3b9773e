//! One seed's run: the engine, its fake backends, the simulated clients and the checks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use engine::call::{Method, Payload};
use engine::fake::{self, FakeLauncher, FakeProcess};
use engine::launcher::Process;
use engine::lease::{Endpoint, LeaseRequest};
use engine::{Config, Engine, EngineError};
use futures_util::StreamExt;
use parking_lot::Mutex;
use scheduler::State;
use serde_json::{json, Value};
use tokio::time::Instant;

pub use engine::mutation::Mutation;

use crate::backend::{SimAsk, Slots};
use crate::hub::{self, SimHub};
use crate::rng::Rng;
use crate::upstream::{self, Upstream};
use crate::{broken, Failure, Hits};

/// The models of the catalogue (extra models, `extra.<file>`).
const FILES: &[&str] = &["m0.gguf", "m1.gguf", "m2.gguf", "m3.gguf"];
const ALIASES: &[&str] = &["fast", "best"];
/// A model no catalogue has.
const UNKNOWN: &str = "extra.nope";
/// The `user.*` models registrations name (each a repository of the simulated Hub).
const USERS: u64 = 3;
/// The router collection clients may name: it routes a prompt of at least [`ROUTE_LONG`]
/// characters to its second component, any other to its first.
const ROUTER: &str = "user.Sim-Router";
const ROUTE_LONG: usize = 30;
/// A request that has not ended this long after it was asked is a hang.
const DEADLINE: Duration = Duration::from_secs(900);
/// How long quiescence may take (simulated) before what is still running is a hang.
const QUIESCE: Duration = Duration::from_secs(1800);

/// The model an extra models dir file is (current Lemonade's name: `extra.<stem>`).
fn model(file: &str) -> String {
    format!("extra.{}", file.strip_suffix(".gguf").unwrap_or(file))
}

/// The run's folder: in memory where the machine has a tmpfs (the simulated disk's kills are
/// the simulation's own, so a real disk's syncs would only cost time: 2.7 times the run's).
fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    match shm.is_dir().then(|| tempfile::tempdir_in(shm)) {
        Some(Ok(d)) => d,
        _ => tempfile::tempdir().expect("a temp dir"),
    }
}

/// Conversations clients have where the prompt cache is on.
const CONVERSATIONS: u64 = 3;

/// Conversation `c` so far: its first 40 words and `more` (each conversation's words are the
/// same in every request, so a later one continues an earlier one's prompt).
fn conversation(c: u64, more: u64) -> String {
    let mut words = Rng::new(0x636f_6e76 + c);
    (0..40 + more).map(|_| format!("w{}", words.range(0, 400))).collect::<Vec<_>>().join(" ")
}

/// The `user.*` model `i`.
fn user_model(i: u64) -> String {
    format!("user.Sim-{i}")
}

/// The remote model, as clients name it.
fn remote_model() -> String {
    format!("{}.{}", upstream::PROVIDER, upstream::MODEL)
}

/// What one seed did and found.
#[derive(Debug, Clone)]
pub struct Run {
    pub seed: u64,
    /// Every action, outcome and scheduler decision, with its simulated time (ms).
    pub trace: Vec<String>,
    /// The first invariant broken, in words (None: every check held).
    pub failure: Option<String>,
    pub hits: Hits,
    pub steps: u32,
}

/// The fault kinds and features one seed turns on (swarm testing).
#[derive(Debug, Clone)]
struct Swarm {
    streams: bool,
    crashes: bool,
    hangs: bool,
    slow_starts: bool,
    failed_starts: bool,
    hangups: bool,
    pins: bool,
    unloads: bool,
    settings: bool,
    aliases: bool,
    restarts: bool,
    priorities: bool,
    /// Writes killed part way (lemonade dies there and starts again) or finding no space.
    disk_faults: bool,
    /// The remote provider `up` (its model `up.r1` asked for; it goes down and comes back).
    remote: bool,
    /// Local models spill over to `up.r1` when saturated (one request at a time each), and
    /// clients send their next request the moment an answer arrives.
    spill: bool,
    /// A memory budget (GiB) the models' measured sizes press against.
    budget: Option<u64>,
    /// Pulls from the simulated Hub: download jobs started, paused, resumed, cancelled and
    /// removed, streamed pulls abandoned, requests for `user.*` models that pull before they
    /// load.
    hub: bool,
    /// The Hub is slow, answers 503, drops connections mid-file, ignores `Range`, goes down.
    hub_faults: bool,
    /// A prompt cache: backends save their slot when stopped, and a request that continues a
    /// saved prompt gets it restored; clients ask with a few long conversations.
    prompt_cache: bool,
    /// A router collection over two of the models, registered, changed and deleted.
    collections: bool,
}

impl Swarm {
    fn draw(rng: &mut Rng) -> Swarm {
        let on = |rng: &mut Rng| rng.chance(0.5);
        Swarm {
            streams: on(rng),
            crashes: on(rng),
            hangs: on(rng),
            slow_starts: on(rng),
            failed_starts: on(rng),
            hangups: on(rng),
            pins: on(rng),
            unloads: on(rng),
            settings: on(rng),
            aliases: on(rng),
            restarts: on(rng),
            priorities: on(rng),
            disk_faults: on(rng),
            remote: on(rng),
            spill: on(rng),
            budget: rng.chance(0.5).then(|| rng.range(4, 16)),
            hub: on(rng),
            hub_faults: on(rng),
            prompt_cache: on(rng),
            collections: on(rng),
        }
    }
}

/// How a client's request ended.
#[derive(Debug, Clone)]
enum Ended {
    /// `variant`: the field a parameter variant forced, as the backend saw it.
    Answer {
        model: String,
        tokens: Vec<u32>,
        complete: bool,
        variant: Option<String>,
    },
    Failed {
        kind: &'static str,
        text: String,
        tokens: Vec<u32>,
    },
    HungUp,
}

struct Client {
    asked: String,
    /// An embedding asked of a chat model: it must be refused for the model's type.
    embedding: bool,
    /// The field its alias forced when it named a parameter variant.
    variant: Option<String>,
    /// A pull before its load may fail: the Hub has faults, or the model's registration names
    /// a repository the Hub does not have.
    pull_may_fail: bool,
    /// The models an answer may come from (an alias's targets while it was asked).
    may_answer: BTreeSet<String>,
    stream: bool,
    ask: SimAsk,
    started: Duration,
    ended_at: Option<Duration>,
    ends: u32,
    outcome: Option<Ended>,
    judged: bool,
    /// When spillover sent it to the remote place (streams, whose lease the client holds).
    spilled_at: Option<Duration>,
    /// The order of its start, its spill and its end among all such events (several happen in
    /// one simulated millisecond: a client's next request starts as its answer ends).
    start_seq: u64,
    spill_seq: Option<u64>,
    end_seq: Option<u64>,
}

/// What the driver knows, shared with the client tasks.
#[derive(Default)]
struct Book {
    clients: Vec<Client>,
    /// Models the driver pinned (and has not unpinned, unloaded or seen crash): when, and the
    /// process that was running it then (the one a pin keeps).
    pinned: BTreeMap<String, (Duration, String)>,
    /// When each model's pin was last set or cleared by a pin or an unload (a load that asked
    /// to pin before then and finished after does not pin it).
    pin_changed: BTreeMap<String, Duration>,
    /// When each model's backend was disrupted with cause: a crash, an unload (of it or of
    /// all), a restart ("*" for every model).
    disrupted: Vec<(Duration, String)>,
    aliases: BTreeMap<String, String>,
    /// The aliases that are parameter variants: the `sim_variant` value each forces.
    variants: BTreeMap<String, String>,
    /// `user.*` registrations made (name → checkpoint); a name unregistered maps to None.
    registered: BTreeMap<String, Option<String>>,
    /// Loads asked, and when each was answered (a load with other options reloads a pinned
    /// model in place, on purpose, once its other loads are answered).
    loads_asked: Vec<(Duration, Option<Duration>, String)>,
    /// Counts the clients' starts, spills and ends, in the order they happen.
    seq: u64,
    /// When the upstream went down (true) or came back (false).
    up_changes: Vec<(Duration, bool)>,
    /// The settings last saved with `/params` (max loaded, idle timeout s, swap hold ms).
    params: Option<(i64, u64, u64)>,
    /// When each `user.*` name was registered, re-registered or forgotten.
    registration_changes: Vec<(Duration, String)>,
    /// The router collection's components (short prompts, long ones), while it is registered.
    router: Option<(String, String)>,
    /// Each download job's repositories, each it was started or resumed for (by job id).
    job_repos: BTreeMap<String, BTreeSet<String>>,
    trace: Vec<String>,
}

struct World {
    rng: Rng,
    swarm: Swarm,
    epoch: Instant,
    dir: tempfile::TempDir,
    engine: Engine,
    launcher: Arc<FakeLauncher>,
    /// Every launcher of the run (one per start of lemonade), for the orphan checks.
    launchers: Vec<Arc<FakeLauncher>>,
    decisions: tokio::sync::broadcast::Receiver<api_types::SchedulerDecision>,
    book: Arc<Mutex<Book>>,
    hits: Hits,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Processes already seen ended, by address.
    seen_exits: BTreeSet<String>,
    held: BTreeSet<String>,
    /// What each model's backend is measured to hold (bytes).
    sizes: BTreeMap<String, u64>,
    /// The remote provider.
    up: Arc<Upstream>,
    /// The Hugging Face Hub.
    hub: Arc<SimHub>,
    /// The Hub's resumes already counted as judged.
    resumes_seen: u64,
    /// The backends' slots (the prompt cache's saves and restores).
    slots: Arc<Slots>,
    /// Restores already counted as judged.
    restores_seen: u64,
}

/// Whether runs replay exactly: tokio's own randomness seeded (built with `--cfg
/// tokio_unstable`, as `cargo xtask sim` builds it).
pub const REPLAYABLE: bool = cfg!(tokio_unstable);

/// Runs seed `seed` with `mutation` put back (None: the code as it is).
pub fn run(seed: u64, mutation: Option<Mutation>) -> Run {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // tokio draws at random where two wakers are equally ready (which `select!` branch, which
    // of a watch channel's waiters first); seeded, that is the seed's too.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let rt = builder.build().expect("a current-thread runtime");
    engine::mutation::set(mutation);
    // File writes, rescans and downloads' writers run on this thread: a run must not depend on
    // how fast another thread ran.
    host::offload::run_inline(true);
    let out = rt.block_on(async move {
        // The wall clock is the simulated one, from a fixed day.
        host::offload::simulate_clock(Some(1_767_225_600_000));
        let mut w = World::new(seed).await;
        let failure = w.drive().await.err().map(|f| f.to_string());
        // What the scheduler decided up to the failure, for the trace.
        while let Ok(d) = w.decisions.try_recv() {
            w.note(format!("decision {}", serde_json::to_string(&d).unwrap_or_default()));
        }
        host::files::faults::forget(&w.dir.path().join("cache"));
        let steps = w.book.lock().trace.len() as u32;
        // The run's temp dir differs between runs: the trace names it `<dir>`.
        let dir = w.dir.path().display().to_string();
        let trace = std::mem::take(&mut w.book.lock().trace).into_iter().map(|l| l.replace(&dir, "<dir>")).collect();
        let failure = failure.map(|f| f.replace(&dir, "<dir>"));
        for t in &w.tasks {
            t.abort();
        }
        Run { seed, trace, failure, hits: w.hits.clone(), steps }
    });
    engine::mutation::set(None);
    host::offload::run_inline(false);
    host::offload::simulate_clock(None);
    out
}

/// The prompt cache's bound, when the swarm keeps one (bytes).
const PROMPT_CACHE: u64 = 1 << 30;

/// The breaker of the remote provider: failures in a row that open it, and for how long.
const BREAKER: backends::upstream::BreakerSettings = backends::upstream::BreakerSettings { failures: 3, open_ms: 5000 };
/// How long a remote provider may take (the retries' waits included).
const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

fn config(dir: &std::path::Path, swarm: &Swarm, hub: &Arc<SimHub>) -> Config {
    let budget = swarm.budget;
    let mut cfg = Config::new(dir.join("cache"), dir.join("hub"));
    cfg.hub_endpoint = Some(hub::ENDPOINT.into());
    cfg.hub_in_memory = Some(hub.answerer());
    cfg.breaker = BREAKER;
    cfg.live.set_remote_timeout(REMOTE_TIMEOUT);
    if swarm.spill && swarm.remote {
        cfg.max_concurrent = Some(1);
    }
    cfg.scheduler.memory_budget = Some(budget.map(|g| g << 30));
    cfg.remote_refresh = None;
    cfg.watchdog_interval = None;
    cfg.devices = Some(vec![]);
    cfg.prompt_cache_size = if swarm.prompt_cache { PROMPT_CACHE } else { 0 };
    cfg.crash_backoff = (Duration::from_millis(500), Duration::from_secs(30));
    cfg
}

/// lemonade started over `dir`, its backends measured at `sizes` (bytes, by model), its remote
/// provider answered by `up`, each local model spilling over to it (when the swarm says), and
/// its pulls answered by `hub`.
fn start_engine(
    dir: &std::path::Path,
    swarm: &Swarm,
    sizes: &BTreeMap<String, u64>,
    up: &Arc<Upstream>,
    hub: &Arc<SimHub>,
    slots: &Arc<Slots>,
) -> (Engine, Arc<FakeLauncher>) {
    let cfg = config(dir, swarm, hub);
    // The saved settings apply at start, as `serve` reads config.json.
    let launcher = FakeLauncher::new();
    launcher.in_memory(crate::backend::answerer(slots.clone()));
    for (m, bytes) in sizes {
        launcher.measure(m, Some(*bytes), None);
    }
    let catalogue = fake::catalogue_over_hub(&cfg.cache_dir, &cfg.hf_cache, FILES);
    let engine = fake::engine(cfg, catalogue, launcher.clone());
    engine.remotes().answer_in_memory(up.answerer());
    if swarm.prompt_cache {
        launcher.prompt_cache(engine.prompt_cache().clone(), PROMPT_CACHE);
    }
    if swarm.spill && swarm.remote {
        for f in FILES {
            engine.lifecycle().set_spillover(&model(f), Some(vec![remote_model()]));
        }
    }
    (engine, launcher)
}

impl World {
    async fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let swarm = Swarm::draw(&mut rng);
        let dir = scratch();
        std::fs::create_dir_all(dir.path().join("cache")).expect("the cache dir");
        if engine::mutation::on(Mutation::ConfigWrittenInPlace) {
            host::files::faults::write_in_place(&dir.path().join("cache"));
        }
        let sizes: BTreeMap<String, u64> = FILES.iter().map(|f| (model(f), rng.range(1, 9) << 29)).collect();
        let up = Upstream::new(seed);
        let hub = SimHub::new(seed, &dir.path().join("hub"), swarm.hub_faults);
        let slots = Arc::new(Slots::default());
        let (engine, launcher) = start_engine(dir.path(), &swarm, &sizes, &up, &hub, &slots);
        if swarm.remote {
            engine
                .remotes()
                .install(upstream::PROVIDER, Some(upstream::BASE), None)
                .await
                .expect("the upstream installs");
        }
        let decisions = engine.lifecycle().explain.subscribe();
        let book = Arc::new(Mutex::new(Book::default()));
        book.lock().trace.push(format!("seed {seed} swarm {swarm:?}"));
        World {
            rng,
            swarm,
            epoch: Instant::now(),
            dir,
            engine,
            launchers: vec![launcher.clone()],
            launcher,
            decisions,
            book,
            hits: Hits::default(),
            tasks: vec![],
            seen_exits: BTreeSet::new(),
            held: BTreeSet::new(),
            sizes,
            up,
            hub,
            resumes_seen: 0,
            slots,
            restores_seen: 0,
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn note(&self, text: String) {
        let t = self.now().as_millis();
        self.book.lock().trace.push(format!("{t:>9} {}", text.replace('\n', "\\n")));
    }

    async fn drive(&mut self) -> Result<(), Failure> {
        if self.swarm.hub {
            for _ in 0..USERS {
                self.register().await;
            }
        }
        let steps = self.rng.range(40, 120);
        for _ in 0..steps {
            self.act().await?;
            let dt = self.rng.range(0, 400);
            tokio::time::sleep(Duration::from_millis(dt)).await;
            self.settle_and_check().await?;
        }
        self.quiesce().await
    }

    /// One random action.
    async fn act(&mut self) -> Result<(), Failure> {
        let s = self.swarm.clone();
        let roll = self.rng.range(0, 124);
        let file = *self.rng.pick(FILES);
        let m = model(file);
        match roll {
            0..=51 => self.client(),
            52..=54 => {
                // A backend's memory grows or shrinks as it runs (its KV cache filling).
                let bytes = self.rng.range(1, 9) << 29;
                self.note(format!("{m} measured at {} MiB", bytes >> 20));
                self.sizes.insert(m.clone(), bytes);
                self.launcher.measure(&m, Some(bytes), None);
            }
            55..=61 if s.crashes => {
                if let Some(p) = self.launcher.processes(&m).into_iter().find(|p| p.is_alive()) {
                    self.note(format!("crash {m}"));
                    self.book.lock().disrupted.push((self.now(), m.clone()));
                    p.crash();
                }
            }
            62..=66 if s.slow_starts && !self.held.contains(&m) => {
                self.note(format!("hold starts of {m}"));
                self.launcher.hold(&m);
                self.held.insert(m);
            }
            67..=71 if !self.held.is_empty() => {
                let m = self.held.iter().next().cloned().unwrap_or_default();
                self.note(format!("release starts of {m}"));
                self.launcher.release(&m);
                self.held.remove(&m);
            }
            72..=74 if s.failed_starts => {
                self.note(format!("fail the next start of {m}"));
                self.launcher.fail_ready(&m, "sim: the backend exited while loading", 1);
            }
            75..=80 => {
                let pin = s.pins && self.rng.chance(0.5);
                self.load(m, pin)
            }
            81..=83 if s.pins => {
                let pin = self.rng.chance(0.6);
                let r = self.engine.lifecycle().pin(&m, pin).await;
                self.note(format!("pin {m} {pin} -> {}", r.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())));
                // A pin keeps the running process; one on a model being unloaded (accepted when
                // a load is to follow) is for that next load, not for the process stopping.
                let state = self.engine.lifecycle().view().get(&m).map(|v| v.state);
                let running = self.launcher.processes(&m).into_iter().find(|p| p.is_alive()).map(|p| p.base_url());
                let running = running.filter(|_| matches!(state, Some(State::Loaded | State::Loading)));
                if r.is_ok() {
                    let mut b = self.book.lock();
                    b.pin_changed.insert(m.clone(), self.epoch.elapsed());
                    b.pinned.remove(&m);
                    if let (true, Some(p)) = (pin, running) {
                        b.pinned.insert(m, (self.epoch.elapsed(), p));
                    } else {
                        b.pinned.remove(&m);
                    }
                }
            }
            84..=88 if s.unloads => {
                let all = self.rng.chance(0.3);
                let which = if all { None } else { Some(m.as_str()) };
                {
                    let mut b = self.book.lock();
                    b.disrupted.push((self.epoch.elapsed(), which.unwrap_or("*").to_string()));
                    let now = self.epoch.elapsed();
                    for f in FILES {
                        let each = model(f);
                        if which.is_none_or(|m| m == each) {
                            b.pinned.remove(&each);
                            b.pin_changed.insert(each, now);
                        }
                    }
                }
                let r = self.engine.lifecycle().unload(which).await;
                self.note(format!("unload {} -> {r:?}", which.unwrap_or("all")));
            }
            89..=92 if s.settings => self.settings().await,
            93..=94 if s.aliases => self.alias(m).await,
            95..=96 if s.aliases || s.hub => self.register().await,
            97..=99 if s.restarts => self.restart().await?,
            100..=104 if s.disk_faults => self.disk_fault(m).await?,
            110..=113 if s.hub => self.pull(),
            114..=117 if s.hub => self.control_job(),
            120..=123 if s.collections => self.collection().await,
            118..=119 if s.hub && s.hub_faults => {
                let down = self.rng.chance(0.4);
                self.note(format!("the Hub {}", if down { "goes down" } else { "is up" }));
                self.hub.set_down(down);
            }
            105..=109 if s.remote => {
                let down = self.book.lock().up_changes.last().is_none_or(|(_, d)| !d);
                self.note(format!("upstream {}", if down { "goes down" } else { "comes back" }));
                self.up.set_down(down);
                self.book.lock().up_changes.push((self.epoch.elapsed(), down));
            }
            _ => self.client(),
        }
        Ok(())
    }

    /// A client asks for a chat completion, streamed or whole, and may hang up.
    fn client(&mut self) {
        let s = &self.swarm;
        let roll = self.rng.range(0, 100);
        let aliases = self.book.lock().aliases.clone();
        let asked = if roll < 4 {
            UNKNOWN.to_string()
        } else if roll < 16 && s.remote {
            remote_model()
        } else if roll < 24 && !aliases.is_empty() {
            let names: Vec<&String> = aliases.keys().collect();
            (*self.rng.pick(&names)).clone()
        } else if roll < 34 && s.hub {
            user_model(self.rng.range(0, USERS))
        } else if roll < 44 && s.collections {
            ROUTER.to_string()
        } else {
            model(self.rng.pick::<&str>(FILES))
        };
        let tokens = self.rng.range(1, 16) as u32;
        let ask = SimAsk {
            tokens,
            prefill_ms: self.rng.range(0, 300),
            token_ms: self.rng.range(0, 60),
            crash_at: (s.crashes && self.rng.chance(0.05)).then(|| self.rng.range(0, tokens as u64) as u32),
            hang_at: (s.hangs && self.rng.chance(0.05)).then(|| self.rng.range(0, tokens as u64) as u32),
        };
        let stream = s.streams && self.rng.chance(0.5);
        let priority = if s.priorities { self.rng.range(0, 21) as i32 - 10 } else { 0 };
        // Every text endpoint of every dialect reaches the model the same way; an embedding
        // asked of a chat model is refused for its type.
        let endpoint = *self.rng.pick(&[
            Endpoint::ChatCompletions,
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::OllamaChat,
            Endpoint::OllamaGenerate,
            Endpoint::Embeddings,
        ]);
        let keep_alive = self.rng.chance(0.15).then(|| self.rng.range(0, 3) * 2000);
        // A hung backend's client always gives up at last.
        let hangup = (s.hangups && self.rng.chance(0.3)) || ask.hang_at.is_some();
        let hangup_after = hangup.then(|| Duration::from_millis(self.rng.range(0, 20_000)));
        // A client that sends its next request the moment its answer arrives.
        let rounds = if s.spill && self.rng.chance(0.3) { 2 } else { 1 };
        let spills = s.spill && s.remote;
        let hub_faults = s.hub_faults;
        let prompt = if s.prompt_cache {
            conversation(self.rng.range(0, CONVERSATIONS), self.rng.range(0, 24))
        } else {
            "hi".to_string()
        };
        let ask =
            Asking { asked, prompt, hub_faults, spills, stream, endpoint, ask, priority, keep_alive, hangup_after };
        let (engine, book, epoch) = (self.engine.clone(), self.book.clone(), self.epoch);
        let first = ask.register(&book, epoch);
        let task = tokio::spawn(async move {
            let mut id = first;
            for round in 0..rounds {
                if round > 0 {
                    // The server that answered is gone after a restart: no next request reaches it.
                    if engine.lifecycle().is_closing() {
                        break;
                    }
                    id = ask.register(&book, epoch);
                }
                let ended = ask.run(&engine, &book, epoch, id).await;
                if !matches!(ended, Ended::Answer { .. }) {
                    break;
                }
            }
        });
        self.tasks.push(task);
    }

    /// An admin load of `m`, pinned or not, in its own task (it waits for the start).
    fn load(&mut self, m: String, pin: bool) {
        // Another context size reloads a loaded model in place.
        let ctx = self.rng.chance(0.3).then(|| *self.rng.pick(&[2048u32, 4096]));
        self.note(format!("load {m} pin={pin} ctx_size={ctx:?}"));
        let load_id = {
            let mut b = self.book.lock();
            b.loads_asked.push((self.epoch.elapsed(), None, m.clone()));
            b.loads_asked.len() - 1
        };
        let (engine, book, epoch) = (self.engine.clone(), self.book.clone(), self.epoch);
        let asked = epoch.elapsed();
        let launcher = self.launcher.clone();
        let task = tokio::spawn(async move {
            let info = match engine.catalogue().get(&m) {
                Ok(i) => i,
                Err(e) => {
                    let mut b = book.lock();
                    b.loads_asked[load_id].1 = Some(epoch.elapsed());
                    return b.trace.push(format!("load {m}: {e}"));
                }
            };
            let patch = ctx.map(|n| api_types::OptionsPatch {
                set: api_types::LoadOptions { ctx_size: Some(api_types::CtxSize::Tokens(n)), ..Default::default() },
                ..Default::default()
            });
            let options = engine.lifecycle().effective_options(&info, &patch.unwrap_or_default());
            let out = engine.lifecycle().load(&info, options, pin.then_some(true), Default::default()).await;
            let mut b = book.lock();
            b.loads_asked[load_id].1 = Some(epoch.elapsed());
            let line = format!("{:>9} load {m} -> {out:?}", epoch.elapsed().as_millis());
            b.trace.push(line);
            let changed_since = b.pin_changed.get(&m).is_some_and(|t| *t >= asked);
            let running = launcher.processes(&m).into_iter().find(|p| p.is_alive()).map(|p| p.base_url());
            if let (true, scheduler::LoadOutcome::Loaded, false, Some(p)) = (pin, &out, changed_since, running) {
                b.pinned.insert(m, (epoch.elapsed(), p));
            }
        });
        self.tasks.push(task);
    }

    async fn settings(&mut self) {
        let max = self.rng.range(1, 4) as i64;
        let idle = *self.rng.pick(&[0u64, 5, 30]);
        let hold = *self.rng.pick(&[0u64, 500, 5000]);
        let update = api_types::ParamsUpdate {
            max_loaded_models: Some(api_types::SlotLimits::One(max)),
            idle_timeout: Some(idle),
            swap_hold_ms: Some(hold),
            ..Default::default()
        };
        let r = engine::configure::update_params(&self.engine, &update).await;
        self.note(format!(
            "params max={max} idle={idle}s hold={hold}ms -> {}",
            r.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
        ));
        if r.is_ok() {
            self.book.lock().params = Some((max, idle, hold));
        }
    }

    /// A settings change or an alias written to a disk that fails: no space (the change is
    /// refused, nothing changes), or lemonade killed part way through the write (it starts
    /// again over what the disk holds).
    async fn disk_fault(&mut self, m: String) -> Result<(), Failure> {
        use host::files::faults::{self, Fault};
        let cache = self.dir.path().join("cache");
        let kill = self.rng.chance(0.6);
        let fault = if kill { Fault::KillAfter(self.rng.range(0, 160) as usize) } else { Fault::NoSpace };
        self.note(format!("disk: the next write meets {fault:?}"));
        faults::arm(&cache, fault);
        match self.rng.range(0, 10) {
            0..=4 => self.settings().await,
            5..=7 => self.alias(m).await,
            _ => self.register().await,
        }
        faults::arm_none(&cache);
        if faults::killed(&cache) {
            // What a kill leaves: the backends go with lemonade (their parent-death signal).
            faults::revive(&cache);
            return self.restart().await;
        }
        self.check_restart_keeps()
    }

    /// A `user.*` model registered (or re-registered with another checkpoint: a repository of
    /// the Hub, now and then one it does not have), or forgotten.
    async fn register(&mut self) {
        let name = user_model(self.rng.range(0, USERS));
        let forget = self.rng.chance(0.15);
        let repo =
            if self.rng.chance(0.1) { hub::MISSING.to_string() } else { hub::repo(self.rng.range(0, hub::REPOS)) };
        let checkpoint = format!("{repo}:Q4_K_M");
        self.book.lock().registration_changes.push((self.now(), name.clone()));
        let r = if forget {
            self.engine.catalogue().unregister(&name).await.map(|_| None)
        } else {
            let entry = registry::CatalogueEntry {
                checkpoint: checkpoint.clone(),
                recipe: "llamacpp".into(),
                ..Default::default()
            };
            self.engine.catalogue().register(&name, &entry).await.map(|_| Some(checkpoint))
        };
        let said = r.as_ref().map_or_else(|e| e.to_string(), |c| format!("{c:?}"));
        self.note(format!("register {name} forget={forget} -> {said}"));
        let mut b = self.book.lock();
        if let Ok(kept) = r {
            b.registered.insert(name.clone(), kept);
        }
        b.registration_changes.push((self.epoch.elapsed(), name));
    }

    /// A pull of a `user.*` model: a server-owned download job, a streamed pull whose client
    /// reads a few events and goes, or a pull awaited whole.
    fn pull(&mut self) {
        let name = user_model(self.rng.range(0, USERS));
        let how = self.rng.range(0, 10);
        let read = self.rng.range(0, 6) as usize;
        let req = api_types::PullRequest {
            model: Some(name.clone()),
            stream: Some(how < 8),
            subscribe: (how < 5).then_some(false),
            ..Default::default()
        };
        let repo = self.registered_repo(&name);
        let (engine, book, epoch) = (self.engine.clone(), self.book.clone(), self.epoch);
        let task = tokio::spawn(async move {
            let said = match engine::jobs::pull(&engine, &req).await {
                Ok(engine::jobs::Pull::Job(j)) => {
                    if let Some(repo) = repo {
                        book.lock().job_repos.entry(j.id.clone()).or_default().insert(repo);
                    }
                    format!("job {} {}", j.id, j.status)
                }
                Ok(engine::jobs::Pull::Events(mut rx)) => {
                    let mut last = String::from("no event");
                    for _ in 0..read {
                        match rx.recv().await {
                            Some(ev) => last = format!("{ev:?}"),
                            None => break,
                        }
                    }
                    format!("streamed, went after {read} events (last {last})")
                }
                Ok(engine::jobs::Pull::Done(m)) => format!("done {m}"),
                Err(e) => format!("error: {e}"),
            };
            let line = format!("{:>9} pull {name} ({how}) -> {said}", epoch.elapsed().as_millis());
            book.lock().trace.push(line);
        });
        self.tasks.push(task);
    }

    /// A download job paused, resumed, cancelled or removed.
    fn control_job(&mut self) {
        let jobs = self.engine.downloads().list();
        if jobs.is_empty() {
            return;
        }
        let job = self.rng.pick(&jobs).clone();
        let action = *self.rng.pick(&["pause", "pause", "resume", "resume", "cancel", "remove"]);
        if action == "resume" {
            if let Some(repo) = self.registered_repo(&job.model_name) {
                self.book.lock().job_repos.entry(job.id.clone()).or_default().insert(repo);
            }
        }
        let r = engine::jobs::control(&self.engine, &job.id, action);
        let said = match &r {
            Ok(Some(j)) => format!("{} running={}", j.status, j.running),
            Ok(None) => "removed".into(),
            Err(e) => e.to_string(),
        };
        self.note(format!(
            "{action} {} ({} at {} bytes) -> {said}",
            job.id, job.status, job.cumulative_bytes_downloaded
        ));
    }

    /// The router collection registered over two models (or re-registered over others), or
    /// deleted.
    async fn collection(&mut self) {
        let forget = self.rng.chance(0.15);
        let short = model(self.rng.pick::<&str>(FILES));
        let long = model(self.rng.pick::<&str>(FILES));
        self.book.lock().registration_changes.push((self.now(), ROUTER.to_string()));
        let r = if forget {
            engine::pulls::delete_named(&self.engine, ROUTER).await.map(|_| None)
        } else {
            let mut components = vec![short.clone()];
            if long != short {
                components.push(long.clone());
            }
            let rules = json!([{"id": "long", "match": {"min_chars": ROUTE_LONG}, "route_to": long}]);
            let req = api_types::PullRequest {
                model: Some(ROUTER.into()),
                recipe: Some("collection.router".into()),
                version: Some(json!("1")),
                components: Some(json!(components)),
                routing: Some(json!({"candidates": components, "default_model": short, "rules": rules})),
                ..Default::default()
            };
            engine::router::register(&self.engine, &req).await.map(|_| Some((short, long)))
        };
        let said = r.as_ref().map_or_else(|e| e.to_string(), |c| format!("{c:?}"));
        self.note(format!("collection {ROUTER} forget={forget} -> {said}"));
        let mut b = self.book.lock();
        if let Ok(now) = r {
            b.router = now;
        }
        b.registration_changes.push((self.epoch.elapsed(), ROUTER.to_string()));
    }

    /// The Hub repository `name` is registered with now.
    fn registered_repo(&self, name: &str) -> Option<String> {
        let b = self.book.lock();
        let checkpoint = b.registered.get(name)?.as_ref()?;
        Some(checkpoint.split(':').next().unwrap_or(checkpoint).to_string())
    }

    /// An alias pointed at `m`; some are parameter variants, forcing a field on every request
    /// through them.
    async fn alias(&mut self, m: String) {
        let alias = *self.rng.pick(ALIASES);
        let forced = self.rng.chance(0.4).then(|| format!("{alias}-{}", self.rng.range(0, 100)));
        let params = forced.as_ref().map(|v| {
            let mut p = serde_json::Map::new();
            p.insert("sim_variant".into(), v.clone().into());
            p
        });
        let req = api_types::AliasRequest {
            alias: Some(alias.to_string()),
            target: Some(m.clone()),
            params,
            ..Default::default()
        };
        let r = engine::aliases::set(&self.engine, &req).await;
        let said = r.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into());
        self.note(format!("alias {alias} -> {m} forcing {forced:?}: {said}"));
        if r.is_ok() {
            let mut b = self.book.lock();
            b.aliases.insert(alias.to_string(), m);
            match forced {
                Some(v) => b.variants.insert(alias.to_string(), v),
                None => b.variants.remove(alias),
            };
        }
    }

    /// lemonade stops (its backends with it) and starts again over the same files.
    async fn restart(&mut self) -> Result<(), Failure> {
        self.note("restart".into());
        {
            let mut b = self.book.lock();
            let now = self.epoch.elapsed();
            b.disrupted.push((now, "*".into()));
            b.pinned.clear();
            for f in FILES {
                b.pin_changed.insert(model(f), now);
            }
        }
        let running: Vec<String> =
            self.engine.downloads().list().into_iter().filter(|j| j.running).map(|j| j.id).collect();
        self.engine.shutdown().await;
        // The jobs as the shutdown left them: each that ran is paused, and saved so.
        let jobs: Vec<api_types::DownloadJob> =
            self.engine.downloads().list().into_iter().filter(|j| j.status != "completed").collect();
        for id in running {
            self.hits.hit("restart_keeps");
            let status = jobs.iter().find(|j| j.id == id).map(|j| j.status.clone());
            if status.as_deref() != Some("paused") {
                return Err(broken!("restart_keeps", "job {id} ran at shutdown and was left {status:?}, not paused"));
            }
        }
        self.check_all_stopped("after a restart's shutdown")?;
        self.check_files()?;
        let (engine, launcher) =
            start_engine(self.dir.path(), &self.swarm, &self.sizes, &self.up, &self.hub, &self.slots);
        // The saved settings are read back as `serve` reads them.
        let file =
            host::files::load_config(&self.dir.path().join("cache")).map_err(|e| broken!("files_parse", "{e}"))?;
        if !file.is_empty() {
            engine::configure::set(&engine, &file)
                .await
                .map_err(|e| broken!("restart_keeps", "config.json refused at start: {e}"))?;
        }
        self.engine = engine;
        self.launcher = launcher.clone();
        self.launchers.push(launcher);
        self.decisions = self.engine.lifecycle().explain.subscribe();
        self.held.clear();
        for before in jobs {
            self.hits.hit("restart_keeps");
            let after = self.engine.downloads().get(&before.id);
            let kept = after.as_ref().is_some_and(|a| {
                !a.running
                    && a.model_name == before.model_name
                    && a.status == before.status
                    && a.cumulative_bytes_downloaded == before.cumulative_bytes_downloaded
            });
            if !kept {
                return Err(broken!(
                    "restart_keeps",
                    "job {} was {} at {} bytes at shutdown; after the restart: {:?}",
                    before.id,
                    before.status,
                    before.cumulative_bytes_downloaded,
                    after.map(|a| (a.status, a.running, a.cumulative_bytes_downloaded))
                ));
            }
        }
        self.check_restart_keeps()
    }

    /// Lets time pass for the owner to publish, then the checks of every step.
    async fn settle_and_check(&mut self) -> Result<(), Failure> {
        self.engine.lifecycle().settled().await;
        while let Ok(d) = self.decisions.try_recv() {
            let text = serde_json::to_string(&d).unwrap_or_default();
            self.note(format!("decision {text}"));
        }
        self.check_exits()?;
        self.check_pinned();
        self.check_one_process()?;
        self.check_ledger()?;
        self.check_registry_current()?;
        self.check_downloads().await?;
        self.check_restores()?;
        self.check_clients(false)
    }

    /// Every prompt-cache restore gave a backend its own state.
    fn check_restores(&mut self) -> Result<(), Failure> {
        if let Some(w) = self.slots.take_wrong().into_iter().next() {
            return Err(broken!("cache_own_state", "{w}"));
        }
        let restores = self.slots.restores.load(std::sync::atomic::Ordering::Relaxed);
        for _ in self.restores_seen..restores {
            self.hits.hit("cache_own_state");
        }
        self.restores_seen = restores;
        Ok(())
    }

    /// Every registration and alias whose change returned is in the registry as published.
    fn check_registry_current(&mut self) -> Result<(), Failure> {
        let (registered, aliases) = {
            let b = self.book.lock();
            (b.registered.clone(), b.aliases.clone())
        };
        let reg = self.engine.catalogue().registry();
        for (name, checkpoint) in &registered {
            self.hits.hit("registry_current");
            let found = reg.get(name).ok().map(|m| m.checkpoint.clone());
            if found != *checkpoint {
                return Err(broken!(
                    "registry_current",
                    "{name} was registered as {checkpoint:?}; the registry says {found:?}"
                ));
            }
        }
        let router = self.book.lock().router.clone();
        self.hits.hit("registry_current");
        let found = reg.collection(ROUTER).map(|c| c.components.clone());
        let expected = router.map(|(short, long)| if short == long { vec![short] } else { vec![short, long] });
        if found != expected {
            return Err(broken!(
                "registry_current",
                "{ROUTER} was registered over {expected:?}; the registry says {found:?}"
            ));
        }
        for (alias, target) in &aliases {
            self.hits.hit("registry_current");
            let found = reg.aliases().find(|(a, _)| a == alias).map(|(_, t)| t.to_string());
            if found.as_ref() != Some(target) {
                return Err(broken!(
                    "registry_current",
                    "alias {alias} was set to {target}; the registry says {found:?}"
                ));
            }
        }
        Ok(())
    }

    /// The Hub's files on disk (each a prefix of the Hub's bytes, the complete ones whole), every
    /// resume the Hub was asked for, and each stopped job's count against the disk.
    async fn check_downloads(&mut self) -> Result<(), Failure> {
        if let Some(w) = self.hub.take_wrong_resumes().into_iter().next() {
            return Err(broken!("resume_exact", "{w}"));
        }
        let (_, resumes) = self.hub.asked();
        for _ in self.resumes_seen..resumes {
            self.hits.hit("resume_exact");
        }
        self.resumes_seen = resumes;
        // What each repository has on disk, in bytes, its files checked.
        let mut held: BTreeMap<String, u64> = BTreeMap::new();
        for i in 0..hub::REPOS {
            let repo = hub::repo(i);
            let mut bytes = 0;
            for f in self.hub.files(&repo).unwrap_or_default() {
                let blob = self.hub.blob_path(&repo, &f);
                let partial = std::path::PathBuf::from(format!("{}.incomplete", blob.display()));
                let (path, whole) = if blob.exists() { (blob, true) } else { (partial, false) };
                let Ok(on_disk) = std::fs::read(&path) else { continue };
                self.hits.hit("job_on_disk");
                let right = if whole { on_disk == f.bytes } else { f.bytes.starts_with(&on_disk) };
                if !right {
                    return Err(broken!(
                        "job_on_disk",
                        "{} ({} bytes, {}) is not the Hub's {repo}/{} ({} bytes)",
                        path.display(),
                        on_disk.len(),
                        if whole { "complete" } else { "partial" },
                        f.path,
                        f.bytes.len()
                    ));
                }
                bytes += on_disk.len() as u64;
            }
            held.insert(repo, bytes);
        }
        let job_repos = self.book.lock().job_repos.clone();
        for job in self.engine.downloads().list() {
            let Some(repos) = job_repos.get(&job.id).filter(|_| !job.running) else { continue };
            self.hits.hit("job_on_disk");
            let on_disk: u64 = repos.iter().filter_map(|r| held.get(r)).sum();
            if job.cumulative_bytes_downloaded > on_disk {
                return Err(broken!(
                    "job_on_disk",
                    "job {} ({}) counts {} bytes; its repositories {repos:?} hold {on_disk}",
                    job.id,
                    job.status,
                    job.cumulative_bytes_downloaded
                ));
            }
        }
        Ok(())
    }

    /// New process exits: a crash is a disruption with cause; lemonade stopping a pinned
    /// model it was not told to unload breaks `pinned_kept`.
    fn check_exits(&mut self) -> Result<(), Failure> {
        for (m, p) in self.all_processes() {
            let key = p.base_url();
            let Some(ended) = p.ended_at() else { continue };
            if !self.seen_exits.insert(key.clone()) {
                continue;
            }
            let now = ended.duration_since(self.epoch);
            let mut b = self.book.lock();
            if !p.was_stopped() {
                b.disrupted.push((now, m.clone()));
                b.pinned.remove(&m);
                b.pin_changed.insert(m.clone(), now);
                continue;
            }
            if let Some((since, kept)) = b.pinned.get(&m).cloned() {
                if kept != key {
                    continue;
                }
                self.hits.hit("pinned_kept");
                let excused = b.disrupted.iter().any(|(t, who)| *t >= since && (who == &m || who == "*"))
                    || b.loads_asked.iter().any(|(asked, answered, who)| {
                        who == &m && (*asked >= since || answered.is_none_or(|a| a >= now))
                    });
                if excused {
                    // What the pin keeps now is the next process: the driver stops judging it.
                    b.pinned.remove(&m);
                    continue;
                }
                let all: Vec<String> = self
                    .all_processes()
                    .iter()
                    .filter(|(x, _)| *x == m)
                    .map(|(_, p)| {
                        format!(
                            "alive={} ended={:?}",
                            p.is_alive(),
                            p.ended_at().map(|t| t.duration_since(self.epoch).as_millis())
                        )
                    })
                    .collect();
                return Err(broken!(
                    "pinned_kept",
                    "lemonade stopped {m} at {} ms, pinned since {} ms, unasked; its processes: {all:?}",
                    now.as_millis(),
                    since.as_millis()
                ));
            }
        }
        Ok(())
    }

    /// Each pinned model's kept process still runs (judged every step).
    fn check_pinned(&mut self) {
        let kept: Vec<String> = self.book.lock().pinned.values().map(|(_, p)| p.clone()).collect();
        for (_, p) in self.launcher.processes_all() {
            if kept.contains(&p.base_url()) && p.is_alive() {
                self.hits.hit("pinned_kept");
            }
        }
    }

    fn all_processes(&self) -> Vec<(String, Arc<FakeProcess>)> {
        self.launchers.iter().flat_map(|l| l.processes_all()).collect()
    }

    fn check_one_process(&mut self) -> Result<(), Failure> {
        let alive = self.launcher.alive();
        let distinct: BTreeSet<&String> = alive.iter().collect();
        if alive.len() > 1 {
            self.hits.hit("one_process");
        }
        if distinct.len() != alive.len() {
            return Err(broken!("one_process", "two processes of one model alive: {alive:?}"));
        }
        Ok(())
    }

    fn check_ledger(&mut self) -> Result<(), Failure> {
        let lc = self.engine.lifecycle();
        let sv = lc.scheduler_view();
        let views = lc.view();
        let held: u64 = views
            .values()
            .filter(|v| matches!(v.state, State::Loading | State::Loaded | State::Unloading))
            .map(|v| v.memory)
            .sum();
        if views.values().any(|v| v.memory > 0) {
            self.hits.hit("ledger");
        }
        if sv.memory_in_use != held {
            return Err(broken!(
                "ledger",
                "{} bytes in use, the models hold {held}: {:?}",
                sv.memory_in_use,
                views.iter().map(|(m, v)| (m, v.state, v.memory)).collect::<Vec<_>>()
            ));
        }
        Ok(())
    }

    /// Judges each ended client once; at quiescence (`all`) every client must have ended.
    fn check_clients(&mut self, all: bool) -> Result<(), Failure> {
        let now = self.now();
        let mut b = self.book.lock();
        let disrupted = b.disrupted.clone();
        let registrations = b.registration_changes.clone();
        let up_changes = b.up_changes.clone();
        // What each request was outstanding for: its local model, from when to when.
        let spans: Vec<(Option<String>, u64, Option<u64>)> =
            b.clients.iter().map(|c| (local_target(c), c.start_seq, c.end_seq)).collect();
        // Requests that may reach the remote provider (named, or spilling to it): when, from when to when.
        let spans_remote: Vec<(Duration, Option<Duration>)> =
            b.clients
                .iter()
                .map(|c| {
                    if c.may_answer.contains(&remote_model()) {
                        (c.started, c.ended_at)
                    } else {
                        (Duration::MAX, None)
                    }
                })
                .collect();
        for (id, c) in b.clients.iter_mut().enumerate() {
            if let (Some(at), false) = (c.spilled_at, c.judged) {
                // Spillover decides on the settled state: some other request for the model must
                // have been outstanding (one at a time each, so one saturates it).
                self.hits.hit("spill_needs_load");
                // Outstanding: started before the decision, not ended before this one started.
                let (mine, started, decided) = (local_target(c), c.start_seq, c.spill_seq.unwrap_or(u64::MAX));
                let others = spans
                    .iter()
                    .enumerate()
                    .filter(|(i, (m, from, to))| {
                        *i != id && *m == mine && *from < decided && to.is_none_or(|t| t > started)
                    })
                    .count();
                if others == 0 {
                    return Err(broken!(
                        "spill_needs_load",
                        "c{id} ({}) was spilled at {} ms with no other request for its model outstanding",
                        c.asked,
                        at.as_millis()
                    ));
                }
            }
            if c.ends > 1 {
                return Err(broken!("ends_once", "c{id} ended {} times", c.ends));
            }
            let Some(outcome) = c.outcome.clone() else {
                if all || now > c.started + DEADLINE {
                    return Err(broken!("ends_once", "c{id} ({}) never ended", c.asked));
                }
                continue;
            };
            if c.judged {
                continue;
            }
            c.judged = true;
            self.hits.hit("ends_once");
            judge(id, c, &outcome, &disrupted, &registrations, &mut self.hits)?;
            if let Ended::Failed { kind: "breaker_open", text, .. } = &outcome {
                self.hits.hit("breaker_agrees");
                let end = c.ended_at.unwrap_or_default();
                if text.contains("probe") {
                    // Half-open: one request probes the upstream, the others are refused
                    // meanwhile. The probe must be a request outstanding then.
                    let probes = spans_remote
                        .iter()
                        .enumerate()
                        .filter(|(i, (from, to))| *i != id && *from <= end && to.is_none_or(|t| t >= end))
                        .count();
                    if probes == 0 {
                        return Err(broken!(
                            "breaker_agrees",
                            "c{id} was refused at {} ms for a probe in flight, and no other request could be it: {text}",
                            end.as_millis()
                        ));
                    }
                    continue;
                }
                let window = Duration::from_millis(BREAKER.open_ms) + REMOTE_TIMEOUT + Duration::from_secs(1);
                if !down_within(&up_changes, end.saturating_sub(window), end) {
                    return Err(broken!(
                        "breaker_agrees",
                        "c{id} was refused by an open breaker at {} ms, the upstream up since before {} ms: {text}",
                        end.as_millis(),
                        end.saturating_sub(window).as_millis()
                    ));
                }
            }
        }
        Ok(())
    }

    /// No new work; everything waited for; then the end-state checks, a shutdown and a start.
    async fn quiesce(&mut self) -> Result<(), Failure> {
        self.note("quiesce".into());
        for m in std::mem::take(&mut self.held) {
            self.launcher.release(&m);
        }
        let until = self.now() + QUIESCE;
        while self.tasks.iter().any(|t| !t.is_finished()) || self.engine.downloads().list().iter().any(|j| j.running) {
            if self.now() > until {
                self.check_clients(true)?;
                return Err(broken!("ends_once", "an admin load or a client was still running at quiescence"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            self.settle_and_check().await?;
        }
        self.settle_and_check().await?;
        self.check_clients(true)?;
        let views = self.engine.lifecycle().view();
        for (m, v) in &views {
            if v.in_flight != 0 || v.queue_depth != 0 {
                return Err(broken!(
                    "no_leak",
                    "{m} has {} in flight, {} waiting, no client left",
                    v.in_flight,
                    v.queue_depth
                ));
            }
        }
        self.hits.hit("no_leak");
        for (m, p) in self.launcher.processes_all() {
            if p.working() != 0 {
                return Err(broken!(
                    "no_leak",
                    "{m}'s backend still generates for {} requests nobody waits for",
                    p.working()
                ));
            }
        }
        let alive = self.launcher.alive();
        for m in &alive {
            self.hits.hit("no_orphan");
            if views.get(m).map(|v| v.state) != Some(State::Loaded) {
                return Err(broken!(
                    "no_orphan",
                    "{m}'s process lives, its state is {:?}",
                    views.get(m).map(|v| v.state)
                ));
            }
        }
        for (m, v) in &views {
            if v.state == State::Loaded && !alive.contains(m) {
                return Err(broken!("no_orphan", "{m} is shown loaded with no live process"));
            }
        }
        if self.swarm.prompt_cache {
            let u = self.engine.prompt_cache_usage();
            let restored = self.slots.restores.load(std::sync::atomic::Ordering::Relaxed);
            self.note(format!("prompt cache: {} files, {} bytes; {restored} restores", u.files, u.bytes));
        }
        // A last restart over what the run left (its checks), then lemonade stops.
        self.restart().await?;
        self.engine.shutdown().await;
        Ok(())
    }

    fn check_all_stopped(&mut self, when: &str) -> Result<(), Failure> {
        for (m, p) in self.all_processes() {
            self.hits.hit("no_orphan");
            if p.is_alive() {
                return Err(broken!("no_orphan", "{m}'s process lives {when}"));
            }
        }
        Ok(())
    }

    /// Every JSON file lemonade keeps in its cache dir parses.
    /// (`config.json`, `user_models.json`, `aliases.json`, `downloads.json`, …, and the prompt
    /// cache's entries, one folder down.)
    fn check_files(&mut self) -> Result<(), Failure> {
        let cache = self.dir.path().join("cache");
        let entries = std::fs::read_dir(&cache).map_err(|e| broken!("files_parse", "{e}"))?;
        let keys = std::fs::read_dir(cache.join("prompt-cache")).into_iter().flatten().flatten();
        let index = keys.flat_map(|k| std::fs::read_dir(k.path()).into_iter().flatten().flatten());
        for e in entries.flatten().chain(index) {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "json") {
                self.hits.hit("files_parse");
                let text = std::fs::read(&path).map_err(|e| broken!("files_parse", "{}: {e}", path.display()))?;
                serde_json::from_slice::<Value>(&text)
                    .map_err(|e| broken!("files_parse", "{} does not parse: {e}", path.display()))?;
            }
        }
        Ok(())
    }

    fn check_restart_keeps(&mut self) -> Result<(), Failure> {
        let (aliases, params) = {
            let b = self.book.lock();
            (b.aliases.clone(), b.params)
        };
        let listed = engine::aliases::list(&self.engine);
        let listed = serde_json::to_value(&listed).unwrap_or_default();
        for (alias, target) in &aliases {
            self.hits.hit("restart_keeps");
            let found = listed.to_string();
            if !found.contains(&format!("\"{alias}\"")) || !found.contains(target) {
                return Err(broken!(
                    "restart_keeps",
                    "alias {alias} -> {target} is not listed after a restart: {found}"
                ));
            }
        }
        let registered = self.book.lock().registered.clone();
        for (name, checkpoint) in &registered {
            self.hits.hit("restart_keeps");
            let found = self.engine.catalogue().get(name).ok().map(|m| m.checkpoint);
            if found != *checkpoint {
                return Err(broken!(
                    "restart_keeps",
                    "{name} was registered as {checkpoint:?}; the catalogue now says {found:?}"
                ));
            }
        }
        if let Some((max, idle, hold)) = params {
            self.hits.hit("restart_keeps");
            let p = engine::configure::current(self.engine.lifecycle());
            let ok =
                p.max_loaded_models.values().all(|n| *n == max) && p.idle_timeout == idle && p.swap_hold_ms == hold;
            if !ok {
                return Err(broken!(
                    "restart_keeps",
                    "saved params max={max} idle={idle} hold={hold}, in force after a restart: {p:?}"
                ));
            }
        }
        Ok(())
    }
}

/// One client's request, as drawn.
struct Asking {
    asked: String,
    /// What the user says (a long conversation where the prompt cache is on).
    prompt: String,
    /// The Hub has faults (a pull may fail).
    hub_faults: bool,
    /// Local models spill over to the remote one.
    spills: bool,
    stream: bool,
    endpoint: Endpoint,
    ask: SimAsk,
    priority: i32,
    keep_alive: Option<u64>,
    hangup_after: Option<Duration>,
}

impl Asking {
    /// The request's record in the book, and its trace line: its id.
    fn register(&self, book: &Mutex<Book>, epoch: Instant) -> usize {
        let mut b = book.lock();
        let now = epoch.elapsed();
        // Who may answer: the model named, or its alias's target as the aliases are now.
        let asked = &self.asked;
        let mut may_answer: BTreeSet<String> = b.aliases.get(asked).cloned().into_iter().collect();
        let registered = b.registered.get(asked).is_some_and(|c| c.is_some());
        if asked.starts_with("extra.") && asked != UNKNOWN || *asked == remote_model() || registered {
            may_answer.insert(asked.clone());
        }
        // The router collection answers with the component its rule picks for this prompt
        // (an embedding is not routed: it is refused for the collection's type).
        if let (true, Some((short, long))) = (asked == ROUTER, &b.router) {
            let embedding = self.endpoint == Endpoint::Embeddings;
            let routed = if self.prompt.chars().count() >= ROUTE_LONG { long } else { short };
            may_answer.insert(if embedding { asked.clone() } else { routed.clone() });
        }
        if self.spills && may_answer.iter().any(|m| m.starts_with("extra.")) {
            // A local model may be answered by its spillover place.
            may_answer.insert(remote_model());
        }
        b.seq += 1;
        let start_seq = b.seq;
        let variant = b.variants.get(asked).cloned();
        let missing =
            b.registered.get(asked).is_some_and(|c| c.as_deref().is_some_and(|c| c.starts_with(hub::MISSING)));
        b.clients.push(Client {
            asked: self.asked.clone(),
            variant,
            pull_may_fail: self.hub_faults || missing,
            may_answer,
            stream: self.stream,
            embedding: self.endpoint == Endpoint::Embeddings,
            ask: self.ask.clone(),
            started: now,
            start_seq,
            spill_seq: None,
            end_seq: None,
            ended_at: None,
            ends: 0,
            outcome: None,
            judged: false,
            spilled_at: None,
        });
        let id = b.clients.len() - 1;
        let line = format!(
            "{:>9} c{id} asks {} at {} stream={} priority={} keep_alive={:?} {:?} hangup={:?}",
            now.as_millis(),
            self.asked,
            self.endpoint.name(),
            self.stream,
            self.priority,
            self.keep_alive,
            self.ask,
            self.hangup_after.map(|d| d.as_millis())
        );
        b.trace.push(line);
        id
    }

    /// Asks, hangs up when the client does, and records how it ended.
    async fn run(&self, engine: &Engine, book: &Arc<Mutex<Book>>, epoch: Instant, id: usize) -> Ended {
        let body = json!({"model": self.asked, "messages": [{"role": "user", "content": self.prompt}], "stream": self.stream, "sim": self.ask});
        let req =
            LeaseRequest::new(self.asked.clone(), self.endpoint).priority(self.priority).keep_alive(self.keep_alive);
        let asking = ask_model(engine, req, body, self.stream, book, epoch, id);
        let ended = match self.hangup_after {
            Some(after) => tokio::time::timeout(after, asking).await.unwrap_or(Ended::HungUp),
            None => asking.await,
        };
        let at = epoch.elapsed();
        let mut b = book.lock();
        let line = format!("{:>9} c{id} ended {}", at.as_millis(), describe(&ended).replace('\n', "\\n"));
        b.trace.push(line);
        b.seq += 1;
        let seq = b.seq;
        let c = &mut b.clients[id];
        c.ends += 1;
        (c.ended_at, c.end_seq, c.outcome) = (Some(at), Some(seq), Some(ended.clone()));
        ended
    }
}

/// A request as a client makes it: the one request entry, then the stream read chunk by chunk,
/// or the one in-process call for a whole answer.
async fn ask_model(
    engine: &Engine,
    mut req: LeaseRequest,
    body: Value,
    stream: bool,
    book: &Mutex<Book>,
    epoch: Instant,
    id: usize,
) -> Ended {
    let path = req.endpoint.path();
    // What the server does first: a variant's fields forced (a collection would be routed).
    let body = match engine::router::resolve_value(engine, &req.model, req.endpoint, body).await {
        engine::router::Resolved::Model { model, body, .. } => {
            req.model = model;
            body
        }
        engine::router::Resolved::Omni { body, .. } => body,
    };
    let failed = |e: EngineError, tokens: Vec<u32>| Ended::Failed { kind: kind(&e), text: e.to_string(), tokens };
    if !stream {
        return match engine::call::call(engine, req, Payload::Json(body)).await {
            Ok(answer) => match answer.json() {
                Ok(v) => {
                    let model = v["model"].as_str().unwrap_or_default().to_string();
                    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_default();
                    let tokens: Vec<u32> =
                        text.split_whitespace().filter_map(|t| t.strip_prefix('t')?.parse().ok()).collect();
                    let complete = v["tokens"].as_u64() == Some(tokens.len() as u64);
                    let variant = v["variant"].as_str().map(str::to_string);
                    Ended::Answer { model, tokens, complete, variant }
                }
                Err(e) => failed(e, vec![]),
            },
            Err(e) => failed(e, vec![]),
        };
    }
    let mut lease = match engine.lease(req).await {
        Ok(l) => l,
        Err(e) => return failed(e, vec![]),
    };
    // (A local lease carries the decision's words too, when spillover was considered.)
    if lease.spilled.is_some() && lease.local().is_none() {
        let mut b = book.lock();
        b.seq += 1;
        let seq = b.seq;
        let c = &mut b.clients[id];
        (c.spilled_at, c.spill_seq) = (Some(epoch.elapsed()), Some(seq));
    }
    let bytes = bytes::Bytes::from(body.to_string());
    let resp = match lease.send(Method::POST, path, Some(bytes), true).await {
        Ok(r) => r,
        Err(e) => return failed(e, vec![]),
    };
    if !resp.status().is_success() {
        return failed(lease.error_of(resp).await, vec![]);
    }
    lease.streaming();
    let (mut tokens, mut model, mut buf, mut done) = (vec![], String::new(), String::new(), false);
    let mut variant = None;
    let mut chunks = resp.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return failed(lease.transport_failed(&e).await, tokens),
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap_or_default();
            if let Some(n) = v["n"].as_u64() {
                tokens.push(n as u32);
            }
            if let Some(m) = v["model"].as_str() {
                model = m.to_string();
            }
            if let Some(f) = v["variant"].as_str() {
                variant = Some(f.to_string());
            }
        }
    }
    // A remote upstream names its own id; the client asked for `<provider>.<id>`.
    if lease.local().is_none() && model == upstream::MODEL {
        model = lease.name().to_string();
    }
    Ended::Answer { model, tokens, complete: done, variant }
}

/// The error's kind: what the server's one table turns into a status.
fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Lookup(_) => "lookup",
        EngineError::WrongModelType { .. } => "wrong_model_type",
        EngineError::Rejected { .. } => "rejected",
        EngineError::LoadFailed { .. } => "load_failed",
        EngineError::LoadCancelled { .. } => "load_cancelled",
        EngineError::StillUnloading { .. } => "still_unloading",
        EngineError::NotLoaded(_) => "not_loaded",
        EngineError::BackendLost(_) => "backend_lost",
        EngineError::Internal(_) => "internal",
        EngineError::Backend { .. } => "backend_error_answer",
        EngineError::BadAnswer { .. } => "bad_answer",
        EngineError::Upstream { failure: engine::error::UpstreamFailure::BreakerOpen { .. }, .. } => "breaker_open",
        EngineError::Upstream { .. } => "upstream",
        EngineError::Hub(_) => "hub",
        EngineError::NotDownloaded { .. } => "not_downloaded",
        EngineError::Invalid { code: Some("checkpoint_not_found"), .. } => "checkpoint_not_found",
        _ => "other",
    }
}

fn describe(e: &Ended) -> String {
    match e {
        Ended::Answer { model, tokens, complete, variant } => {
            format!("answer {model} {} tokens complete={complete} variant={variant:?}", tokens.len())
        }
        Ended::Failed { kind, text, tokens } => format!("failed {kind} after {} tokens: {text}", tokens.len()),
        Ended::HungUp => "hung up".into(),
    }
}

/// The local model a request was for (its alias's target when it named one).
fn local_target(c: &Client) -> Option<String> {
    c.may_answer.iter().find(|m| m.starts_with("extra.")).cloned()
}

/// Whether the upstream was down at some moment of `from..=to`.
fn down_within(changes: &[(Duration, bool)], from: Duration, to: Duration) -> bool {
    let at_start = changes.iter().rev().find(|(t, _)| *t <= from).is_some_and(|(_, down)| *down);
    at_start || changes.iter().any(|(t, down)| *down && *t >= from && *t <= to)
}

/// The checks of one ended request.
fn judge(
    id: usize,
    c: &Client,
    outcome: &Ended,
    disrupted: &[(Duration, String)],
    registrations: &[(Duration, String)],
    hits: &mut Hits,
) -> Result<(), Failure> {
    let in_order = |tokens: &[u32]| tokens.iter().enumerate().all(|(i, n)| *n == i as u32);
    let end = c.ended_at.unwrap_or_default();
    let caused = |model: Option<&str>| {
        c.ask.crash_at.is_some()
            || c.ask.hang_at.is_some()
            || disrupted.iter().any(|(t, who)| {
                *t >= c.started
                    && *t <= end
                    && (who == "*" || model.is_none_or(|m| m == who) || c.may_answer.contains(who))
            })
    };
    // Its `user.*` model registered anew, or forgotten, while it was asked.
    let reregistered = registrations.iter().any(|(t, name)| *name == c.asked && *t >= c.started && *t <= end);
    // (A remote model's types are its upstream's to know: lemonade forwards it embeddings.)
    if c.embedding && !c.may_answer.is_empty() && c.asked != remote_model() {
        hits.hit("right_model");
        return match outcome {
            Ended::Failed { kind: "wrong_model_type", .. } | Ended::HungUp => Ok(()),
            other => Err(broken!("right_model", "c{id} asked a chat model for embeddings and got {}", describe(other))),
        };
    }
    match outcome {
        Ended::Answer { model, tokens, complete, variant } => {
            hits.hit("right_model");
            if !c.may_answer.contains(model) {
                return Err(broken!("right_model", "c{id} asked {} and was answered by {model:?}", c.asked));
            }
            // A parameter variant's forced field reaches the local backend; no other request
            // carries it. (The remote upstream does not echo it.)
            if model.starts_with("extra.") && *variant != c.variant {
                return Err(broken!(
                    "right_model",
                    "c{id} asked {}, forcing {:?}; its backend saw {variant:?}",
                    c.asked,
                    c.variant
                ));
            }
            hits.hit("stream_order");
            if !in_order(tokens) {
                return Err(broken!("stream_order", "c{id}'s tokens came as {tokens:?}"));
            }
            if !complete || tokens.len() != c.ask.tokens as usize {
                // A whole answer is all of it or an error; a stream that ended without `[DONE]`
                // and no error is a lost tail, unless its backend went away.
                if !c.stream || !caused(Some(model)) {
                    return Err(broken!(
                        "stream_order",
                        "c{id} got {} of {} tokens and no error",
                        tokens.len(),
                        c.ask.tokens
                    ));
                }
            }
        }
        Ended::Failed { kind, text, tokens } => {
            if !tokens.is_empty() {
                hits.hit("stream_order");
                if !in_order(tokens) {
                    return Err(broken!("stream_order", "c{id}'s tokens came as {tokens:?} before {text}"));
                }
            }
            match *kind {
                "lookup" => {
                    hits.hit("right_model");
                    if c.asked != UNKNOWN && !c.may_answer.is_empty() && !reregistered {
                        return Err(broken!("right_model", "c{id} asked {} and was told: {text}", c.asked));
                    }
                }
                "backend_lost" => {
                    hits.hit("lost_has_cause");
                    if !caused(None) {
                        return Err(broken!(
                            "lost_has_cause",
                            "c{id} ({}) lost its backend with no crash, hang, unload or restart: {text}",
                            c.asked
                        ));
                    }
                }
                "rejected" | "load_failed" | "load_cancelled" | "still_unloading" | "not_loaded" | "upstream" => {}
                "breaker_open" => {}
                // A pull before the load: it fails only for a cause.
                "hub" | "checkpoint_not_found" | "not_downloaded" if c.asked.starts_with("user.") => {
                    hits.hit("right_model");
                    if !(c.pull_may_fail || reregistered || caused(None)) {
                        return Err(broken!(
                            "right_model",
                            "c{id} asked {}, whose pull failed with no Hub fault, restart or registration change: {text}",
                            c.asked
                        ));
                    }
                }
                _ => return Err(broken!("ends_once", "c{id} ended with an undocumented error ({kind}): {text}")),
            }
        }
        Ended::HungUp => {}
    }
    Ok(())
}
