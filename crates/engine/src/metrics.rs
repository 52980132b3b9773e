//! lemonade's own Prometheus metrics, served at `GET /metrics` in the OpenMetrics text format
//! (through `prometheus-client`, not hand-written text).
//!
//! Counters and histograms are recorded where the event happens (the server's HTTP layer, the
//! proxy, the runtime's starts and exits, the pulls). Gauges of the current state (models
//! loaded, queue depth) are set from a [`Snapshot`] at each scrape, so they cannot drift.
//! Every label value is bounded: endpoints are route templates, methods the standard ones, and
//! model names only those of the registry (a request for an unknown model records none).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use api_types::ModelType;
use dialects::Counts;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

/// vLLM's label for the model a sample is about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelNameLabel {
    model_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route_to: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpillLabels {
    model: String,
    place: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: &'static str,
}

/// A model's memory, and which figure: lemonade's `estimate` or the `measured` RSS.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemoryLabel {
    model: String,
    kind: &'static str,
}

type Histograms = Family<ModelLabel, Histogram, fn() -> Histogram>;

fn seconds_to_first_token() -> Histogram {
    Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0])
}

fn tokens_per_second() -> Histogram {
    Histogram::new([1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0])
}

fn load_seconds() -> Histogram {
    Histogram::new([0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0])
}

/// The names the per-model serving gauges are exported under, besides lemonade's own
/// (`--metrics-names`): vLLM's let a router or inference gateway built for vLLM read lemonade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetricsNames {
    #[default]
    Lemonade,
    /// Also `vllm:num_requests_waiting`, `vllm:num_requests_running` and
    /// `vllm:kv_cache_usage_perc`, labelled `model_name`.
    Vllm,
}

/// One model's serving state, as a router or inference gateway reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelGauges {
    pub name: String,
    /// Requests waiting for the model (to load, or for a free slot).
    pub waiting: u64,
    /// Requests it is serving.
    pub running: u64,
    /// Loaded and serving.
    pub ready: bool,
    /// The share of its KV cache in use (0 to 1); None when unknown (not loaded, or remote).
    pub kv_usage: Option<f64>,
    /// Its estimate of system memory, and its process's RSS as last measured (loaded only).
    pub memory: Option<(u64, Option<u64>)>,
    /// The GPU memory its process holds (NVML), as last measured.
    pub measured_vram: Option<u64>,
}

/// The state gauges show, taken at a scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The type of each loaded model.
    pub loaded: Vec<ModelType>,
    /// Every known model's serving state.
    pub models: Vec<ModelGauges>,
    /// Bytes counted against the memory and VRAM budgets, and the budgets (None: none).
    pub in_use: [u64; 2],
    pub budgets: [Option<u64>; 2],
    /// Bytes the prompt cache holds.
    pub prompt_cache_bytes: u64,
    /// The loaded-LLM limit (-1: none).
    pub max_loaded: i64,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    model_requests: Family<ModelLabel, Counter>,
    prompt_tokens: Family<ModelLabel, Counter>,
    generated_tokens: Family<ModelLabel, Counter>,
    ttft: Histograms,
    decode_rate: Histograms,
    load_time: Histograms,
    loaded: Family<TypeLabel, Gauge>,
    queue_depth: Family<ModelLabel, Gauge>,
    in_flight: Family<ModelLabel, Gauge>,
    ready: Family<ModelLabel, Gauge>,
    kv_usage: Family<ModelLabel, Ratio>,
    model_memory: Family<MemoryLabel, Gauge>,
    /// vLLM's names for the serving gauges, when asked for.
    vllm: Option<Vllm>,
    memory_in_use: Family<PoolLabel, Gauge>,
    memory_budget: Family<PoolLabel, Gauge>,
    crashes: Family<ModelLabel, Counter>,
    restarts: Family<ModelLabel, Counter>,
    pull_bytes: Family<ModelLabel, Counter>,
    routing_decisions: Family<RouteLabels, Counter>,
    /// Lemonade v11's totals: every routing decision, and those that changed a conversation's
    /// candidate.
    routing_total: Counter,
    routing_switches: Counter,
    /// Prompt tokens the backends read from their prefix cache: the last request's per model,
    /// per model in all, and in all (Lemonade v11's series).
    model_cache_tokens: Family<ModelLabel, Gauge>,
    model_cache_tokens_total: Family<ModelLabel, Tally>,
    cache_tokens: Counter,
    spillover: Family<SpillLabels, Counter>,
    scheduler_decisions: Family<DecisionLabels, Counter>,
    cache_saves: Family<ModelLabel, Counter>,
    cache_restores: Family<ModelLabel, Counter>,
    cache_restored_tokens: Family<ModelLabel, Counter>,
    cache_discarded: Family<ModelLabel, Counter>,
    cache_bytes: Gauge,
    /// Lemonade v11's: 1 while serving, the loaded models and their limit, and one series per
    /// loaded model (`model_info{model_name}`).
    server_up: Gauge,
    loaded_models: Gauge,
    max_loaded_models: Gauge,
    model_info: Family<ModelNameLabel, Gauge>,
    /// Models whose backend died and has not started again yet.
    crashed: Mutex<HashSet<String>>,
    /// One scrape at a time sets the gauges and encodes.
    scrape: Mutex<()>,
}

type Ratio = Gauge<f64, AtomicU64>;

/// The serving gauges under vLLM's names, in a registry of their own (no `lemonade_` prefix).
struct Vllm {
    registry: Registry,
    waiting: Family<ModelNameLabel, Gauge>,
    running: Family<ModelNameLabel, Gauge>,
    kv_usage: Family<ModelNameLabel, Ratio>,
}

impl Vllm {
    fn new() -> Vllm {
        let mut v = Vllm {
            registry: Registry::default(),
            waiting: Family::default(),
            running: Family::default(),
            kv_usage: Family::default(),
        };
        let r = &mut v.registry;
        r.register("vllm:num_requests_waiting", "Requests waiting (lemonade_queue_depth)", v.waiting.clone());
        r.register("vllm:num_requests_running", "Requests running (lemonade_requests_in_flight)", v.running.clone());
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage, 1 meaning 100 percent (lemonade_kv_cache_usage_ratio)",
            v.kv_usage.clone(),
        );
        v
    }

    fn set(&self, models: &[ModelGauges]) {
        self.waiting.clear();
        self.running.clear();
        self.kv_usage.clear();
        for m in models {
            let l = ModelNameLabel { model_name: m.name.clone() };
            self.waiting.get_or_create(&l).set(gauge(m.waiting));
            self.running.get_or_create(&l).set(gauge(m.running));
            self.kv_usage.get_or_create(&l).set(m.kv_usage.unwrap_or(0.0));
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(MetricsNames::Lemonade)
    }
}

impl Metrics {
    pub fn new(names: MetricsNames) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("lemonade"),
            requests: Family::default(),
            model_requests: Family::default(),
            prompt_tokens: Family::default(),
            generated_tokens: Family::default(),
            ttft: Family::new_with_constructor(seconds_to_first_token),
            decode_rate: Family::new_with_constructor(tokens_per_second),
            load_time: Family::new_with_constructor(load_seconds),
            loaded: Family::default(),
            queue_depth: Family::default(),
            in_flight: Family::default(),
            ready: Family::default(),
            kv_usage: Family::default(),
            model_memory: Family::default(),
            vllm: (names == MetricsNames::Vllm).then(Vllm::new),
            memory_in_use: Family::default(),
            memory_budget: Family::default(),
            crashes: Family::default(),
            restarts: Family::default(),
            pull_bytes: Family::default(),
            routing_decisions: Family::default(),
            routing_total: Counter::default(),
            routing_switches: Counter::default(),
            model_cache_tokens: Family::default(),
            model_cache_tokens_total: Family::default(),
            cache_tokens: Counter::default(),
            spillover: Family::default(),
            scheduler_decisions: Family::default(),
            cache_saves: Family::default(),
            cache_restores: Family::default(),
            cache_restored_tokens: Family::default(),
            cache_discarded: Family::default(),
            cache_bytes: Gauge::default(),
            server_up: Gauge::default(),
            loaded_models: Gauge::default(),
            max_loaded_models: Gauge::default(),
            model_info: Family::default(),
            crashed: Mutex::new(HashSet::new()),
            scrape: Mutex::new(()),
        };
        let r = &mut m.registry;
        r.register(
            "http_requests",
            "HTTP requests answered, by route template (endpoint), method and status",
            m.requests.clone(),
        );
        r.register("model_requests", "Requests granted a model (served or streaming)", m.model_requests.clone());
        r.register(
            "routing_decisions_by_route",
            "Decisions of collection.router models: the candidate and the rule (\"default\" when none matched)",
            m.routing_decisions.clone(),
        );
        r.register("routing_decisions", "Cumulative collection.router routing decisions", m.routing_total.clone());
        r.register(
            "routing_switches",
            "Cumulative routing decisions that changed a conversation's routed model",
            m.routing_switches.clone(),
        );
        r.register(
            "model_cache_tokens",
            "Latest prompt tokens served from the backend prefix cache for a model",
            m.model_cache_tokens.clone(),
        );
        // v11's name for a per-model running total; typed unknown, the one type whose samples
        // may carry a name ending in _total beside the gauge above in OpenMetrics.
        r.register(
            "model_cache_tokens_total",
            "Cumulative prompt tokens served from the backend prefix cache for a model",
            m.model_cache_tokens_total.clone(),
        );
        r.register(
            "cache_tokens",
            "Cumulative prompt tokens served from backend prefix caches",
            m.cache_tokens.clone(),
        );
        r.register(
            "spillover_decisions",
            "Requests for a saturated model with spillover places: where they went (a remote model, or local \
             when every place was saturated) and why",
            m.spillover.clone(),
        );
        r.register(
            "scheduler_decisions",
            "The scheduler's decisions (load, evict, unload, queue, reject, refuse, crash) by reason",
            m.scheduler_decisions.clone(),
        );
        r.register("prompt_tokens", "Prompt tokens, cached ones included", m.prompt_tokens.clone());
        r.register("generated_tokens", "Generated tokens", m.generated_tokens.clone());
        r.register_with_unit(
            "time_to_first_token",
            "From asking for the model to the first streamed byte (a whole answer: the wait for the model \
             plus the backend's prompt time)",
            Unit::Seconds,
            m.ttft.clone(),
        );
        r.register("decode_rate_tokens_per_second", "Decode rate the backend reports", m.decode_rate.clone());
        r.register_with_unit("model_load", "Backend start until it answers health", Unit::Seconds, m.load_time.clone());
        r.register("models_loaded", "Loaded models by type", m.loaded.clone());
        r.register("server_up", "1 while lemonade serves (Lemonade v11's)", m.server_up.clone());
        r.register("loaded_models", "Loaded models, every type (Lemonade v11's)", m.loaded_models.clone());
        r.register("max_loaded_models", "The loaded-LLM limit (-1: none; Lemonade v11's)", m.max_loaded_models.clone());
        r.register("model_info", "1 for each loaded model (Lemonade v11's)", m.model_info.clone());
        r.register("queue_depth", "Requests waiting for a model", m.queue_depth.clone());
        r.register("requests_in_flight", "Requests a model is serving", m.in_flight.clone());
        r.register("model_ready", "1 while a model is loaded and serving, else 0", m.ready.clone());
        r.register(
            "kv_cache_usage_ratio",
            "The share of a loaded model's KV cache its running requests hold (0 to 1; from llama-server's \
             /slots, else the share of its slots busy)",
            m.kv_usage.clone(),
        );
        r.register_with_unit(
            "model_memory",
            "A loaded model's system memory: lemonade's estimate (kind=estimate, prompt cache included) and \
             its process's RSS (kind=measured); its GPU memory as NVML measures it (kind=measured_vram)",
            Unit::Bytes,
            m.model_memory.clone(),
        );
        r.register_with_unit(
            "memory_in_use",
            "Estimated bytes of the loaded models, by pool (memory, vram)",
            Unit::Bytes,
            m.memory_in_use.clone(),
        );
        r.register_with_unit(
            "memory_budget",
            "The budget of each pool (absent: none)",
            Unit::Bytes,
            m.memory_budget.clone(),
        );
        r.register(
            "backend_crashes",
            "Backends that exited on their own or were killed by the watchdog",
            m.crashes.clone(),
        );
        r.register("backend_restarts", "Backends started again after a crash", m.restarts.clone());
        r.register_with_unit("pull", "Bytes received by model downloads", Unit::Bytes, m.pull_bytes.clone());
        for (name, help, family) in [
            ("prompt_cache_saves", "Slots whose KV state was saved before their backend stopped", &m.cache_saves),
            (
                "prompt_cache_restores",
                "Saved prompts restored into a backend for a request that continues them",
                &m.cache_restores,
            ),
            (
                "prompt_cache_restored_tokens",
                "Tokens of the restored prompts: prefill the backend did not have to do again",
                &m.cache_restored_tokens,
            ),
            (
                "prompt_cache_discarded",
                "Saved prompts discarded: corrupt, truncated or refused by the backend",
                &m.cache_discarded,
            ),
        ] {
            r.register(name, help, family.clone());
        }
        r.register_with_unit(
            "prompt_cache",
            "Bytes the prompt cache holds on disk",
            Unit::Bytes,
            m.cache_bytes.clone(),
        );
        m
    }

    /// A slot of `model` was saved.
    pub fn cache_saved(&self, model: &str) {
        self.cache_saves.get_or_create(&label(model)).inc();
    }

    /// A saved prompt of `tokens` tokens was restored into `model`'s backend.
    pub fn cache_restored(&self, model: &str, tokens: u64) {
        self.cache_restores.get_or_create(&label(model)).inc();
        self.cache_restored_tokens.get_or_create(&label(model)).inc_by(tokens);
    }

    /// A saved prompt of `model` was discarded.
    pub fn cache_discarded(&self, model: &str) {
        self.cache_discarded.get_or_create(&label(model)).inc();
    }

    /// One answered HTTP request; `endpoint` is the route template (None: no route matched),
    /// `method` a standard method's name (anything else counts as `other`).
    pub fn request(&self, endpoint: Option<&str>, method: &str, status: u16) {
        const METHODS: [&str; 7] = ["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS", "PATCH"];
        let method = METHODS.into_iter().find(|m| *m == method).unwrap_or("other");
        let labels = RequestLabels { endpoint: endpoint.unwrap_or("unmatched").to_string(), method, status };
        self.requests.get_or_create(&labels).inc();
    }

    /// A request was granted `model`.
    pub fn granted(&self, model: &str) {
        self.model_requests.get_or_create(&label(model)).inc();
    }

    /// A stream's first byte, `since` the request asked for the model.
    pub fn first_token(&self, model: &str, since: Duration) {
        self.ttft.get_or_create(&label(model)).observe(since.as_secs_f64());
    }

    /// A finished request's usage; `waited` is set for a whole answer (its time to first token
    /// is the wait plus the backend's prompt time).
    pub fn usage(&self, model: &str, c: &Counts, waited: Option<Duration>) {
        let l = label(model);
        if let Some(n) = c.prompt_tokens {
            self.prompt_tokens.get_or_create(&l).inc_by(n);
        }
        if let Some(n) = c.completion_tokens {
            self.generated_tokens.get_or_create(&l).inc_by(n);
        }
        if let Some(n) = c.cached_tokens {
            self.model_cache_tokens.get_or_create(&l).set(gauge(n));
            self.model_cache_tokens_total.get_or_create(&l).add(n);
            self.cache_tokens.inc_by(n);
        }
        if let (Some(w), Some(ms)) = (waited, c.prompt_ms) {
            self.ttft.get_or_create(&l).observe(w.as_secs_f64() + ms / 1000.0);
        }
        if let Some(tps) = c.tokens_per_second().filter(|t| t.is_finite() && *t > 0.0) {
            self.decode_rate.get_or_create(&l).observe(tps);
        }
    }

    /// A backend started and answered health after `took`.
    pub fn loaded(&self, model: &str, took: Duration) {
        self.load_time.get_or_create(&label(model)).observe(took.as_secs_f64());
        if self.crashed.lock().remove(model) {
            self.restarts.get_or_create(&label(model)).inc();
        }
    }

    /// A backend exited on its own (or the watchdog killed it).
    pub fn crashed(&self, model: &str) {
        self.crashes.get_or_create(&label(model)).inc();
        self.crashed.lock().insert(model.to_string());
    }

    /// The scheduler took a decision.
    pub fn scheduler_decision(&self, decision: &str, reason: &str) {
        self.scheduler_decisions
            .get_or_create(&DecisionLabels { decision: decision.into(), reason: reason.into() })
            .inc();
    }

    /// A `collection.router` sent a request to `route_to` by `rule` (`""`: the default).
    pub fn routing_decision(&self, route_to: &str, rule: &str) {
        let rule = if rule.is_empty() { "default" } else { rule };
        self.routing_decisions.get_or_create(&RouteLabels { route_to: route_to.into(), rule: rule.into() }).inc();
        self.routing_total.inc();
    }

    /// A routing decision changed the candidate of the conversation it continues.
    pub fn routing_switch(&self) {
        self.routing_switches.inc();
    }

    /// Lemonade v11's totals for `/stats`: prompt tokens read from prefix caches, routing
    /// decisions, and switches among them.
    pub fn totals(&self) -> (u64, u64, u64) {
        (self.cache_tokens.get(), self.routing_total.get(), self.routing_switches.get())
    }

    /// Spillover sent a request for `model` to `place` (`local`: it stayed) for `reason`.
    pub fn spillover(&self, model: &str, place: &str, reason: &'static str) {
        self.spillover.get_or_create(&SpillLabels { model: model.into(), place: place.into(), reason }).inc();
    }

    /// A counter of the bytes a download of `model` receives.
    pub fn pull_counter(&self, model: &str) -> Counter {
        self.pull_bytes.get_or_create(&label(model)).clone()
    }

    /// The exposition, with the gauges set from `s`.
    pub fn encode(&self, s: &Snapshot) -> String {
        let _one = self.scrape.lock();
        self.server_up.set(1);
        self.loaded_models.set(s.loaded.len() as i64);
        self.max_loaded_models.set(s.max_loaded);
        self.model_info.clear();
        for m in s.models.iter().filter(|m| m.ready) {
            self.model_info.get_or_create(&ModelNameLabel { model_name: m.name.clone() }).set(1);
        }
        // Every type, so one with no loaded model shows 0 rather than nothing.
        for t in ModelType::ALL {
            let n = s.loaded.iter().filter(|l| **l == t).count();
            self.loaded.get_or_create(&TypeLabel { r#type: t.as_str() }).set(n as i64);
        }
        self.queue_depth.clear();
        self.in_flight.clear();
        self.ready.clear();
        self.kv_usage.clear();
        self.model_memory.clear();
        for m in &s.models {
            let l = label(&m.name);
            if let Some((estimate, measured)) = m.memory {
                let kind = |kind| MemoryLabel { model: m.name.clone(), kind };
                self.model_memory.get_or_create(&kind("estimate")).set(gauge(estimate));
                if let Some(b) = measured {
                    self.model_memory.get_or_create(&kind("measured")).set(gauge(b));
                }
            }
            if let Some(b) = m.measured_vram {
                let l = MemoryLabel { model: m.name.clone(), kind: "measured_vram" };
                self.model_memory.get_or_create(&l).set(gauge(b));
            }
            self.queue_depth.get_or_create(&l).set(gauge(m.waiting));
            self.in_flight.get_or_create(&l).set(gauge(m.running));
            self.ready.get_or_create(&l).set(i64::from(m.ready));
            if let Some(kv) = m.kv_usage {
                self.kv_usage.get_or_create(&l).set(kv);
            }
        }
        self.memory_budget.clear();
        for (i, pool) in ["memory", "vram"].into_iter().enumerate() {
            let p = PoolLabel { pool };
            self.memory_in_use.get_or_create(&p).set(gauge(s.in_use[i]));
            if let Some(b) = s.budgets[i] {
                self.memory_budget.get_or_create(&p).set(gauge(b));
            }
        }
        self.cache_bytes.set(gauge(s.prompt_cache_bytes));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        if let Some(v) = &self.vllm {
            v.set(&s.models);
            let _ = prometheus_client::encoding::text::encode_registry(&mut out, &v.registry);
        }
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}

fn label(model: &str) -> ModelLabel {
    ModelLabel { model: model.to_string() }
}

fn gauge(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_counts_what_was_recorded_and_shows_the_snapshot() {
        let m = Metrics::new(MetricsNames::Lemonade);
        m.request(Some("/v1/chat/completions"), "POST", 200);
        m.request(Some("/v1/chat/completions"), "POST", 200);
        m.request(None, "BREW", 404);
        let c = Counts {
            prompt_tokens: Some(30),
            completion_tokens: Some(12),
            prompt_ms: Some(20.0),
            predicted_ms: Some(150.0), // 80 tokens/s
            cached_tokens: Some(8),
        };
        m.usage("a", &c, Some(Duration::from_millis(5)));
        m.usage("a", &Counts { predicted_ms: Some(0.0), ..c }, None);
        m.crashed("a");
        m.loaded("a", Duration::from_millis(700));
        m.loaded("a", Duration::from_millis(300));
        m.pull_counter("a").inc_by(1000);
        let s = Snapshot {
            loaded: vec![ModelType::Llm, ModelType::Llm, ModelType::Embedding],
            models: vec![ModelGauges {
                name: "a".into(),
                waiting: 3,
                running: 1,
                ready: true,
                kv_usage: Some(0.25),
                memory: Some((300 << 20, Some(200 << 20))),
                measured_vram: Some(100 << 20),
            }],
            in_use: [1 << 30, 0],
            budgets: [Some(2 << 30), None],
            prompt_cache_bytes: 5000,
            max_loaded: 2,
        };
        m.cache_saved("a");
        m.cache_restored("a", 700);
        m.routing_decision("a", "");
        m.routing_switch();
        let text = m.encode(&s);
        assert_eq!(m.totals(), (16, 1, 1));
        for line in [
            // Lemonade v11's series, under its names.
            r#"lemonade_model_cache_tokens{model="a"} 8"#,
            "# TYPE lemonade_model_cache_tokens_total unknown",
            r#"lemonade_model_cache_tokens_total{model="a"} 16"#,
            "lemonade_cache_tokens_total 16",
            "lemonade_routing_decisions_total 1",
            "lemonade_routing_switches_total 1",
            r#"lemonade_routing_decisions_by_route_total{route_to="a",rule="default"} 1"#,
            r#"lemonade_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="200"} 2"#,
            r#"lemonade_http_requests_total{endpoint="unmatched",method="other",status="404"} 1"#,
            r#"lemonade_prompt_tokens_total{model="a"} 60"#,
            r#"lemonade_prompt_cache_saves_total{model="a"} 1"#,
            r#"lemonade_prompt_cache_restores_total{model="a"} 1"#,
            r#"lemonade_prompt_cache_restored_tokens_total{model="a"} 700"#,
            r#"lemonade_prompt_cache_bytes 5000"#,
            r#"lemonade_generated_tokens_total{model="a"} 24"#,
            r#"lemonade_time_to_first_token_seconds_count{model="a"} 1"#,
            r#"lemonade_time_to_first_token_seconds_sum{model="a"} 0.025"#,
            r#"lemonade_decode_rate_tokens_per_second_count{model="a"} 1"#,
            r#"lemonade_model_load_seconds_count{model="a"} 2"#,
            r#"lemonade_backend_crashes_total{model="a"} 1"#,
            r#"lemonade_backend_restarts_total{model="a"} 1"#,
            r#"lemonade_pull_bytes_total{model="a"} 1000"#,
            r#"lemonade_models_loaded{type="llm"} 2"#,
            r#"lemonade_models_loaded{type="tts"} 0"#,
            r#"lemonade_queue_depth{model="a"} 3"#,
            r#"lemonade_requests_in_flight{model="a"} 1"#,
            r#"lemonade_model_ready{model="a"} 1"#,
            r#"lemonade_model_memory_bytes{model="a",kind="estimate"} 314572800"#,
            r#"lemonade_model_memory_bytes{model="a",kind="measured"} 209715200"#,
            r#"lemonade_model_memory_bytes{model="a",kind="measured_vram"} 104857600"#,
            r#"lemonade_kv_cache_usage_ratio{model="a"} 0.25"#,
            r#"lemonade_memory_in_use_bytes{pool="memory"} 1073741824"#,
            r#"lemonade_memory_budget_bytes{pool="memory"} 2147483648"#,
            r#"lemonade_server_up 1"#,
            r#"lemonade_loaded_models 3"#,
            r#"lemonade_max_loaded_models 2"#,
            r#"lemonade_model_info{model_name="a"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains(r#"memory_budget_bytes{pool="vram"}"#), "no VRAM budget, no sample");
        assert!(text.ends_with("# EOF\n"));
        // Gauges follow the state: a model gone from the snapshot is gone from the exposition.
        let text = m.encode(&Snapshot::default());
        assert!(!text.contains(r#"lemonade_queue_depth{model="a"}"#), "{text}");
        assert!(text.contains(r#"lemonade_models_loaded{type="llm"} 0"#));
        assert!(!text.contains("vllm:"), "vLLM's names only when asked for");
    }

    #[test]
    fn vllm_names_show_the_same_gauges_labelled_model_name() {
        let m = Metrics::new(MetricsNames::Vllm);
        let models = vec![
            ModelGauges {
                name: "a".into(),
                waiting: 2,
                running: 3,
                ready: true,
                kv_usage: Some(0.5),
                memory: None,
                measured_vram: None,
            },
            ModelGauges { name: "b".into(), ..Default::default() },
        ];
        let text = m.encode(&Snapshot { models, ..Default::default() });
        for line in [
            r#"vllm:num_requests_waiting{model_name="a"} 2"#,
            r#"vllm:num_requests_running{model_name="a"} 3"#,
            r#"vllm:kv_cache_usage_perc{model_name="a"} 0.5"#,
            r#"vllm:kv_cache_usage_perc{model_name="b"} 0.0"#,
            r#"lemonade_queue_depth{model="a"} 2"#,
            r#"lemonade_model_ready{model="b"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.ends_with("# EOF\n"));
    }
}

/// A running total shown as Lemonade v11 names it (`…_total` with no suffix added): typed
/// `unknown` in the exposition, so the OpenMetrics and the classic parsers read it alike.
#[derive(Debug, Default, Clone)]
pub struct Tally(Arc<AtomicU64>);

impl Tally {
    fn add(&self, n: u64) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

impl prometheus_client::encoding::EncodeMetric for Tally {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
        encoder.encode_gauge(&self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Unknown
    }
}

impl prometheus_client::metrics::TypedMetric for Tally {}
