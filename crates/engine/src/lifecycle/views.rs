//! Views: what the owner last published (models, the scheduler, the running backends), read
//! without asking it. Advisory: a decision is the owner's, made on the state it holds.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use api_types::{LoadedModel, Stats};
use backends::Recipe;
use parking_lot::Mutex;
use registry::ModelInfo;
use scheduler::{Settings, State};
use serde_json::Value;

use super::{Lifecycle, Opts};
use crate::launcher::Process;

/// A running (or starting) backend and its bookkeeping.
pub struct Running {
    pub info: ModelInfo,
    pub backend: Arc<dyn Process>,
    pub options: Opts,
    pub stats: Mutex<Stats>,
    /// Order of loading, for `health`.
    pub(super) seq: u64,
    /// Set when the watchdog killed it for not answering.
    pub wedged: std::sync::atomic::AtomicBool,
    /// Set when the watchdog stopped it because an RPC worker is gone: (worker, why).
    pub lost_worker: std::sync::OnceLock<(String, String)>,
    /// True once its exit has been told to the owner task (or it was stopped on purpose).
    pub(super) reported: tokio::sync::watch::Sender<bool>,
    /// Its prompt cache, when this load keeps one (an LLM on llama-server).
    pub cache: Option<crate::prompt_cache::Attached>,
    /// How it was started: the program and its arguments, this machine's paths as
    /// placeholders (`Config::redact`).
    pub command: Vec<String>,
    /// The environment lemonade set for it.
    pub env: BTreeMap<String, String>,
    /// Streams whose first chunk went out and that have not ended.
    pub(super) streams: std::sync::atomic::AtomicUsize,
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
    /// In the routing-helper pool (a router's classifier uses it; it takes no slot).
    pub helper: bool,
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

/// How long after it arrives a request is in the scheduler's queue, at most (for its place).
pub const PLACE_SLACK_MS: u64 = 100;

impl Lifecycle {
    pub fn load_override(&self, name: &str) -> Option<Value> {
        self.models.read(name, |r| r.load_override.clone()).flatten()
    }

    pub fn set_load_override(&self, name: &str, v: Option<Value>) {
        self.models.change(name, |r| r.load_override = v);
    }

    /// The last published state of every model the runtime has seen.
    pub fn view(&self) -> BTreeMap<String, ModelView> {
        self.view.read().clone()
    }

    /// `name`'s last published state (None: never seen).
    pub fn state_of(&self, name: &str) -> Option<State> {
        self.view.read().get(name).map(|v| v.state)
    }

    pub(super) fn running_model(&self, name: &str) -> Option<Arc<Running>> {
        self.models.running(name)
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
        if let Some(places) = self.models.read(&info.name, |r| r.spillover.clone()).flatten() {
            return places;
        }
        self.catalogue.registry().saved(info).spillover.unwrap_or_default()
    }

    /// The spillover places a load gives `name` (None: back to its saved ones).
    pub fn set_spillover(&self, name: &str, places: Option<Vec<String>>) {
        self.models.change(name, |r| r.spillover = places);
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
        let r = self.models.running(name)?;
        (r.info.recipe == Recipe::LlamaCpp).then(|| {
            let s = backends::llamacpp::cache_settings(&r.options, r.info.model_type);
            (s.slots, s.ctx_size)
        })
    }

    /// Loaded models in load order, with their published state.
    pub fn loaded(&self) -> Vec<(Arc<Running>, ModelView)> {
        let view = self.view();
        let mut out: Vec<(Arc<Running>, ModelView)> = view
            .into_iter()
            .filter(|(_, v)| v.state == State::Loaded)
            .filter_map(|(n, v)| Some((self.models.running(&n)?, v)))
            .collect();
        out.sort_by_key(|(r, _)| r.seq);
        out
    }

    /// The loaded model used most recently.
    pub fn most_recent(&self) -> Option<Arc<Running>> {
        self.loaded().into_iter().max_by_key(|(_, v)| v.last_use).map(|(r, _)| r)
    }

    pub fn set_preloading(&self, names: &[String]) {
        self.models.set_preloads(names);
    }

    pub fn done_preloading(&self, name: &str) {
        self.models.change(name, |r| r.preload = None);
    }

    /// Models on their way in: loading now, or preloads not loaded yet.
    pub fn loading(&self) -> Vec<String> {
        let view = self.view();
        let mut out: Vec<String> =
            view.iter().filter(|(_, v)| v.state == State::Loading).map(|(n, _)| n.clone()).collect();
        for n in self.models.preloads().iter() {
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
            max_loaded: sched.settings.limits.unwrap_or_default().get(api_types::ModelType::Llm),
        }
    }

    /// The scheduler's settings and memory use, as last published.
    pub fn scheduler_view(&self) -> SchedulerView {
        self.scheduler_view.read().clone()
    }

    pub fn health_entry(&self, r: &Running, v: &ModelView) -> LoadedModel {
        let now = self.now_ms();
        let cached = self.prompt_cache.usage(&r.info.name);
        let slots = (r.info.recipe == Recipe::LlamaCpp)
            .then(|| backends::llamacpp::cache_settings(&r.options, r.info.model_type));
        LoadedModel {
            model_name: r.info.name.clone(),
            id: String::new(),
            checkpoint: r.info.checkpoint.clone(),
            model_type: r.info.model_type,
            device: r.info.device().to_string(),
            backend_url: format!("{}/v1", r.backend.base_url()),
            recipe: r.info.recipe.to_string(),
            recipe_options: r.options.clone(),
            last_use: v.last_use,
            pinned: v.pinned,
            slot_pool: format!(
                "{}/{}",
                if v.helper { "routing_helper" } else { "standard" },
                r.info.model_type.as_str()
            ),
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
