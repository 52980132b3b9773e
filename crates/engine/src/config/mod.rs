//! The engine's settings, resolved from CLI flags and `LEMONADE_*` variables by the CLI (the
//! HTTP layer's own, such as access rules and the body limit, are the server's).

pub mod file;
pub mod settings;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api_types::LoadOptions;
use parking_lot::RwLock;
use scheduler::{Limits, Settings};

/// `--max-queue`'s default.
pub const DEFAULT_MAX_QUEUE: usize = 256;
/// `--swap-hold-ms`'s default.
pub const DEFAULT_SWAP_HOLD_MS: u64 = 2_000;

#[derive(Debug, Clone)]
pub struct Config {
    /// Lemonade's cache dir: `user_models.json`, `recipe_options.json`, `bin/`.
    pub cache_dir: PathBuf,
    /// Hugging Face hub cache root.
    pub hf_cache: PathBuf,
    /// What `POST /internal/set` changes while lemonade runs (the extra models dir, the
    /// timeouts, the server-wide load options): shared by every clone of this `Config`.
    pub live: Arc<Live>,
    /// Slot limits, idle timeout, queue bound, memory budget and anti-thrash hold: what the
    /// scheduler starts with (every field set; `POST /api/v1/params` changes them later).
    pub scheduler: Settings,
    /// The GPUs and NPUs models are placed on; None: found at start (`host::devices`).
    pub devices: Option<Vec<api_types::ComputeDevice>>,
    /// Inference on a model that is not loaded loads it (else the request is rejected).
    pub auto_load: bool,
    pub disable_filtering: bool,
    /// Grace period between SIGTERM and SIGKILL when a backend is stopped.
    pub stop_grace: Duration,
    /// How often loaded backends are probed; 3 failed probes in a row kill a wedged one.
    pub watchdog_interval: Option<Duration>,
    /// Requests a model serves at once (None: its backend's parallel slots).
    pub max_concurrent: Option<u32>,
    /// Models loaded (and pulled if needed) at start.
    pub preload: Vec<String>,
    /// The crash back-off's first pause, and how long a backend must run before its crashes
    /// stop counting towards it.
    pub crash_backoff: (Duration, Duration),
    /// Bytes the prompt cache may take on disk (`--prompt-cache-size`); 0 turns it off.
    pub prompt_cache_size: u64,
    /// How often remote providers' model lists are refreshed (None: only on demand).
    pub remote_refresh: Option<Duration>,
    /// The Hugging Face endpoint to pull from (None: `HF_ENDPOINT`, else huggingface.co).
    pub hub_endpoint: Option<String>,
    /// Where the Hub's requests are answered in memory (the simulation's Hub; None: over HTTP).
    pub hub_in_memory: Option<host::download::InMemory>,
    /// The names the per-model serving gauges are exported under besides lemonade's.
    pub metrics_names: crate::metrics::MetricsNames,
    /// The request header that names a conversation (`--session-header`), forwarded with
    /// `traceparent` and `tracestate` to backends and remote upstreams (lowercase).
    pub session_header: String,
    /// Each remote provider's circuit breaker.
    pub breaker: backends::upstream::BreakerSettings,
}

/// `config.json`'s writer: one change at a time (read, check, write, apply; `crate::configure`).
#[derive(Debug, Default)]
pub struct ConfigStore {
    pub(crate) writer: tokio::sync::Mutex<()>,
}

/// The parts of the configuration that change while lemonade runs (`POST /internal/set`),
/// read where they are used and never copied, so a change takes effect at once.
#[derive(Debug)]
pub struct Live {
    load_timeout_ms: AtomicU64,
    pull_timeout_ms: AtomicU64,
    remote_timeout_ms: AtomicU64,
    stream_timeout_ms: AtomicU64,
    offline: AtomicBool,
    download_rate: AtomicU64,
    v9_names: AtomicBool,
    trust_trace_context: AtomicBool,
    extra_models_dir: RwLock<Option<PathBuf>>,
    /// The server-wide layer of the load options (`--ctx-size`, `--llamacpp`,
    /// `--llamacpp-args`, `config.json`'s option keys).
    options: RwLock<LoadOptions>,
    /// How the next backends are confined (`--sandbox`, `config.json`'s `sandbox`).
    sandbox: RwLock<backends::sandbox::Mode>,
}

impl Live {
    /// The defaults: loads 600 s, automatic pulls 3600 s, remote providers 300 s, no extra
    /// models dir, the llama.cpp `cpu` backend.
    pub fn new() -> Live {
        Live {
            load_timeout_ms: AtomicU64::new(600_000),
            pull_timeout_ms: AtomicU64::new(3_600_000),
            remote_timeout_ms: AtomicU64::new(300_000),
            stream_timeout_ms: AtomicU64::new(300_000),
            offline: AtomicBool::new(false),
            download_rate: AtomicU64::new(0),
            v9_names: AtomicBool::new(false),
            trust_trace_context: AtomicBool::new(true),
            extra_models_dir: RwLock::new(None),
            options: RwLock::new(LoadOptions { llamacpp_backend: Some("cpu".into()), ..LoadOptions::default() }),
            sandbox: RwLock::new(host::sandbox::default_mode()),
        }
    }

    /// How the backends started from now on are confined.
    pub fn sandbox(&self) -> backends::sandbox::Mode {
        *self.sandbox.read()
    }
    pub fn set_sandbox(&self, mode: backends::sandbox::Mode) {
        *self.sandbox.write() = mode;
    }

    /// How long a backend may take to load a model.
    pub fn load_timeout(&self) -> Duration {
        Duration::from_millis(self.load_timeout_ms.load(Ordering::Relaxed))
    }
    /// How long an automatic pull (inference or `/load` on a model not downloaded) may take.
    pub fn pull_timeout(&self) -> Duration {
        Duration::from_millis(self.pull_timeout_ms.load(Ordering::Relaxed))
    }
    /// How long a remote provider may take to start answering (headers, then between chunks).
    pub fn remote_timeout(&self) -> Duration {
        Duration::from_millis(self.remote_timeout_ms.load(Ordering::Relaxed))
    }
    /// How long a streamed answer's backend may send nothing before the stream is cut (the
    /// low-transfer timeout, `stream_timeout`; `global_timeout` sets it).
    pub fn stream_timeout(&self) -> Duration {
        Duration::from_millis(self.stream_timeout_ms.load(Ordering::Relaxed))
    }
    pub fn set_stream_timeout(&self, d: Duration) {
        self.stream_timeout_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
    /// `offline`: no network call at all (no update check, no Hub, no release download).
    pub fn offline(&self) -> bool {
        self.offline.load(Ordering::Relaxed)
    }
    pub fn set_offline(&self, on: bool) {
        self.offline.store(on, Ordering::Relaxed);
    }
    /// `download_rate_limit`: the bytes per second all downloads share (0: unlimited).
    pub fn download_rate(&self) -> u64 {
        self.download_rate.load(Ordering::Relaxed)
    }
    pub fn set_download_rate(&self, bytes_per_s: u64) {
        self.download_rate.store(bytes_per_s, Ordering::Relaxed);
    }
    /// `model_names: "v9"`: listings name a registered model `user.X`, as Lemonade v9 did
    /// (current Lemonade lists the bare `X`).
    pub fn v9_names(&self) -> bool {
        self.v9_names.load(Ordering::Relaxed)
    }
    pub fn set_v9_names(&self, on: bool) {
        self.v9_names.store(on, Ordering::Relaxed);
    }
    /// `telemetry.trust_incoming_trace_context`: a request's W3C trace context (`traceparent`,
    /// `tracestate`) is continued (forwarded to its backend); off, it is dropped at the door.
    pub fn trust_trace_context(&self) -> bool {
        self.trust_trace_context.load(Ordering::Relaxed)
    }
    pub fn set_trust_trace_context(&self, on: bool) {
        self.trust_trace_context.store(on, Ordering::Relaxed);
    }
    pub fn set_load_timeout(&self, d: Duration) {
        self.load_timeout_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn set_pull_timeout(&self, d: Duration) {
        self.pull_timeout_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn set_remote_timeout(&self, d: Duration) {
        self.remote_timeout_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn extra_models_dir(&self) -> Option<PathBuf> {
        self.extra_models_dir.read().clone()
    }
    pub fn set_extra_models_dir(&self, d: Option<PathBuf>) {
        *self.extra_models_dir.write() = d;
    }
    /// The server-wide load options.
    pub fn options(&self) -> LoadOptions {
        self.options.read().clone()
    }
    pub fn set_options(&self, o: LoadOptions) {
        *self.options.write() = o;
    }
    /// The llama.cpp backend models run on unless a model or a load says otherwise.
    pub fn llamacpp_backend(&self) -> String {
        self.options.read().llamacpp_backend.clone().unwrap_or_else(|| "cpu".into())
    }
}

impl Default for Live {
    fn default() -> Live {
        Live::new()
    }
}

impl Config {
    /// `text` (an error an API client will read) without this machine's paths: the caches, the
    /// extra models dir and the home directory become placeholders. The server log keeps them.
    pub fn redact(&self, text: &str, home: Option<&str>) -> String {
        let mut paths: Vec<(String, &str)> = vec![
            (self.hf_cache.display().to_string(), "<hf-cache>"),
            (self.cache_dir.display().to_string(), "<lemonade-cache>"),
        ];
        if let Some(d) = &self.live.extra_models_dir() {
            paths.push((d.display().to_string(), "<extra-models-dir>"));
        }
        if let Some(h) = home {
            paths.push((h.trim_end_matches('/').to_string(), "~"));
        }
        // Longest first, so a cache inside the home directory keeps its own name.
        paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        paths.iter().filter(|(p, _)| p.len() > 1).fold(text.to_string(), |t, (p, label)| t.replace(p.as_str(), label))
    }

    /// [`Config::redact`] with this process's `$HOME`: the text an API client may read.
    pub fn redact_here(&self, text: &str) -> String {
        self.redact(text, std::env::var("HOME").ok().as_deref())
    }

    /// Defaults for tests and embedding; the CLI fills every field from flags/env.
    pub fn new(cache_dir: PathBuf, hf_cache: PathBuf) -> Config {
        Config {
            cache_dir,
            hf_cache,
            live: Arc::new(Live::new()),
            scheduler: Settings {
                limits: Some(Limits::uniform(1)),
                idle_timeout_ms: Some(None),
                max_queue: Some(Some(DEFAULT_MAX_QUEUE)),
                memory_budget: Some(None),
                vram_budget: Some(None),
                swap_hold_ms: Some(DEFAULT_SWAP_HOLD_MS),
                devices: None,
            },
            auto_load: true,
            disable_filtering: false,
            stop_grace: Duration::from_secs(5),
            watchdog_interval: Some(Duration::from_secs(5)),
            max_concurrent: None,
            preload: Vec::new(),
            crash_backoff: (
                Duration::from_millis(scheduler::machine::CRASH_BACKOFF_MS),
                Duration::from_millis(scheduler::machine::CRASH_RESET_MS),
            ),
            prompt_cache_size: 4 << 30,
            devices: None,
            remote_refresh: Some(Duration::from_secs(60)),
            hub_endpoint: None,
            hub_in_memory: None,
            metrics_names: Default::default(),
            session_header: "x-session-id".into(),
            breaker: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_for_clients_carry_no_local_paths() {
        let cfg = Config::new("/home/u/.cache/lemonade".into(), "/home/u/.cache/huggingface/hub".into());
        cfg.live.set_extra_models_dir(Some("/data/models".into()));
        let text = "llama_model_load: failed to load /home/u/.cache/huggingface/hub/models--a--b/x.gguf; \
                    see /home/u/.cache/lemonade/logs and /data/models/y.gguf, or /home/u/notes";
        assert_eq!(
            cfg.redact(text, Some("/home/u")),
            "llama_model_load: failed to load <hf-cache>/models--a--b/x.gguf; \
                    see <lemonade-cache>/logs and <extra-models-dir>/y.gguf, or ~/notes"
        );
        assert_eq!(cfg.redact("no paths here", Some("/")), "no paths here", "a root home is left alone");
    }
}
