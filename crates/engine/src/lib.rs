//! lemonade's application layer: the one object between HTTP and everything below (as TGI's
//! `Infer`, ollama's `Scheduler`, rust-analyzer's `Analysis`). It owns the catalogue and the
//! model lifecycle and composes the pure crates (registry, scheduler, backends) with `host`.
//! No axum, no HTTP types, no HTTP errors: the server turns [`EngineError`] into HTTP once.
//!
//! * [`catalogue`]: the sole owner of the registry; registrations, saved options and rescans,
//!   one at a time.
//! * [`lifecycle`]: the owner task over the scheduler's state machine, leases, the views.
//! * [`launcher`]: the seam to processes ([`launcher::RealLauncher`] over host; [`fake`] in
//!   memory, for in-process tests).
//! * [`pulls`]: downloads with typed [`pulls::PullEvent`]s; [`loads`]: `/load` and `--preload`.
//! * [`lease`] and [`call`]: the one request entry and the one in-process model call.
//! * [`installs`], [`remote`], [`prompt_cache`], [`configure`], [`metrics`], [`config`].

pub mod admin;
pub mod aliases;
pub mod call;
pub mod catalogue;
pub mod cleanup;
pub mod cloud;
pub mod config;
pub mod configure;
pub mod decisions;
pub mod devices;
pub mod downloads;
pub mod draft;
pub mod error;
pub mod explain;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod installs;
pub mod jobs;
pub mod launcher;
pub mod lease;
pub mod lifecycle;
pub mod loads;
pub mod locks;
pub mod logs;
pub mod mcp;
pub mod metrics;
pub mod models;
#[cfg(feature = "testing")]
pub mod mutation;
pub mod ollama;
pub mod omni;
pub mod options;
pub mod progress;
pub mod prompt_cache;
pub mod pulls;
pub mod remote;
pub mod router;
pub mod spill;
pub mod system;
#[cfg(test)]
pub(crate) mod testing;
pub mod tools;
pub mod updates;

use std::sync::Arc;
use std::time::Duration;

use host::catalogue::CatalogueConfig;

pub use catalogue::Catalogue;
pub use config::Config;
pub use error::{EngineError, Result};
pub use launcher::{Launcher, RealLauncher};
pub use lifecycle::{Lease, Lifecycle, ModelView, Running, SchedulerView, Target};
pub use metrics::Metrics;
pub use remote::Remotes;

/// lemonade's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The application. Cheap to clone: every part is shared.
#[derive(Clone)]
pub struct Engine {
    cfg: Arc<Config>,
    catalogue: Arc<Catalogue>,
    lifecycle: Arc<Lifecycle>,
    /// Remote OpenAI-compatible providers (recipe `cloud`).
    remotes: Arc<Remotes>,
    /// The upstreams' metrics spillover last read.
    spill: Arc<remote::Scrapes>,
    /// The prompt cache's files (`<cache>/prompt-cache`).
    prompt_cache: host::prompt_cache::Store,
    /// lemonade's own Prometheus metrics.
    metrics: Arc<Metrics>,
    /// One download per repository, one install per backend at a time.
    locks: Arc<locks::Locks>,
    /// `config.json`'s writer (`POST /internal/set`, `POST /params`).
    config: Arc<config::ConfigStore>,
    /// The process's log, when the binary keeps one ([`logs`]).
    logs: Option<Arc<host::logging::LogHub>>,
    /// Server-owned download jobs (`GET /downloads`).
    downloads: Arc<downloads::Downloads>,
    /// What the last update check found.
    updates: Arc<updates::Updates>,
    /// The candidate each conversation a router collection saw was last routed to.
    conversations: Arc<parking_lot::Mutex<routing::conversations::Conversations>>,
}

/// The engine's parts, for the layers above (the server, the CLI's `serve`, tests); inside the
/// crate the fields are read directly.
impl Engine {
    /// The configuration, with its live (changeable) part.
    pub fn cfg(&self) -> &Arc<Config> {
        &self.cfg
    }
    /// The model catalogue.
    pub fn catalogue(&self) -> &Arc<Catalogue> {
        &self.catalogue
    }
    /// The models' lifecycle: loads, leases, the views.
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }
    /// Remote OpenAI-compatible providers.
    pub fn remotes(&self) -> &Arc<Remotes> {
        &self.remotes
    }
    /// The upstreams' metrics spillover last read.
    pub fn spill(&self) -> &Arc<remote::Scrapes> {
        &self.spill
    }
    /// The prompt cache's files.
    pub fn prompt_cache(&self) -> &host::prompt_cache::Store {
        &self.prompt_cache
    }
    /// lemonade's own Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
    /// One download per repository, one install per backend at a time.
    pub fn locks(&self) -> &Arc<locks::Locks> {
        &self.locks
    }
    /// `config.json`'s writer.
    pub fn config(&self) -> &Arc<config::ConfigStore> {
        &self.config
    }
    /// Server-owned download jobs.
    pub fn downloads(&self) -> &Arc<downloads::Downloads> {
        &self.downloads
    }
    /// What the last update check found.
    pub fn updates(&self) -> &Arc<updates::Updates> {
        &self.updates
    }
}

/// Where the catalogue is read from, for `cfg`.
pub fn catalogue_config(cfg: &Config) -> CatalogueConfig {
    CatalogueConfig {
        cache_dir: cfg.cache_dir.clone(),
        hf_cache: cfg.hf_cache.clone(),
        extra_models_dir: cfg.live.extra_models_dir(),
        physical_memory_gb: host::hardware::physical_memory_gb(),
        disable_filtering: cfg.disable_filtering,
    }
}

/// The client lemonade talks to its own backends with.
pub fn backend_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        // llama-server (cpp-httplib) closes idle keep-alive connections after 5 s; reusing
        // one as it closes fails the request, so idle connections are dropped first.
        .pool_idle_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("reqwest client")
}

impl Engine {
    /// How backends are confined on this kernel (`--sandbox`), and what it cannot enforce.
    pub fn sandbox(&self) -> Option<api_types::SandboxStatus> {
        host::sandbox::status(self.cfg.live.sandbox()).ok()
    }

    /// The engine with real processes: the catalogue read from disk, leftovers of killed
    /// writes and installs removed. Needs a tokio runtime. `--preload` models are the
    /// caller's to start ([`loads::preload`]), once it is ready to serve.
    pub fn start(cfg: Config) -> Result<Engine> {
        // Hardware is detected once, here, so no load waits for it.
        let hw = host::hardware::detected();
        tracing::debug!(igpu = ?hw.hw.amd_igpu, nvidia = hw.hw.nvidia_gpus, "hardware detected");
        // The model files are scanned after this returns (the server listens meanwhile, and
        // requests wait for the scan), unless `--preload` names must be checked first.
        let catalogue = if cfg.preload.is_empty() {
            Catalogue::start(catalogue_config(&cfg))?
        } else {
            let catalogue = Catalogue::load(catalogue_config(&cfg))?;
            for name in &cfg.preload {
                catalogue.get(name).map_err(|e| EngineError::invalid(format!("--preload {name}: {e}"), None))?;
            }
            Arc::new(catalogue)
        };
        host::install::clean_staging(&cfg.cache_dir);
        let temps = host::files::clean_leftover_temps(&cfg.cache_dir);
        if temps > 0 {
            tracing::info!(count = temps, "removed temp files left by a killed write");
        }
        let cfg = Arc::new(cfg);
        let locks = Arc::new(locks::Locks::default());
        let prompt_cache = host::prompt_cache::Store::open(&cfg.cache_dir.join("prompt-cache"));
        // One pool of connections to the backends: the launcher's probes and the proxy's requests.
        let http = backend_client();
        let launcher = RealLauncher::new(cfg.clone(), http.clone(), locks.clone(), prompt_cache.clone());
        Ok(Engine::with_launcher(cfg, catalogue, Arc::new(launcher), locks, prompt_cache, http))
    }

    /// The engine over `catalogue`, starting backends with `launcher` (tests pass
    /// [`fake::FakeLauncher`]) and talking to them with `http`. Remote providers are read from
    /// the cache dir and refreshed.
    pub fn with_launcher(
        cfg: Arc<Config>,
        catalogue: Arc<Catalogue>,
        launcher: Arc<dyn Launcher>,
        locks: Arc<locks::Locks>,
        prompt_cache: host::prompt_cache::Store,
        http: reqwest::Client,
    ) -> Engine {
        let metrics = Arc::new(Metrics::new(cfg.metrics_names));
        let remotes = Arc::new(Remotes::new(cfg.cache_dir.clone(), cfg.live.clone(), cfg.breaker));
        match cfg.remote_refresh {
            Some(every) => remote::refresh_every(Arc::downgrade(&remotes), every),
            None => {
                let r = remotes.clone();
                tokio::spawn(async move { r.refresh().await });
            }
        }
        let lifecycle =
            Lifecycle::new(cfg.clone(), catalogue.clone(), launcher, http, metrics.clone(), prompt_cache.clone());
        let downloads = Arc::new(downloads::Downloads::open(&cfg.cache_dir));
        Engine {
            cfg,
            catalogue,
            lifecycle,
            remotes,
            spill: Default::default(),
            prompt_cache,
            metrics,
            locks,
            config: Default::default(),
            downloads,
            updates: Default::default(),
            conversations: Default::default(),
            logs: None,
        }
    }

    /// This engine with the process's log hub (the level, `logs/stream`, telemetry).
    pub fn with_logs(mut self, hub: Arc<host::logging::LogHub>) -> Engine {
        self.logs = Some(hub);
        self
    }

    /// The process's log hub, when the binary keeps one.
    pub fn logs(&self) -> Option<&Arc<host::logging::LogHub>> {
        self.logs.as_ref()
    }

    /// `text` without this machine's paths (see [`Config::redact`]).
    pub fn redact(&self, text: &str) -> String {
        self.cfg.redact_here(text)
    }

    /// `GET /stats`: the last completed request of the most recently used model, with the
    /// routing totals (Lemonade v11).
    pub fn stats(&self) -> api_types::Stats {
        let mut s = self.lifecycle.most_recent().map(|m| m.stats()).unwrap_or_default();
        let (_, decisions, switches) = self.metrics.totals();
        s.routing_decisions_total = decisions;
        s.routing_switches_total = switches;
        s
    }

    /// The conversations a router collection routed, for its switch count.
    pub fn conversations(&self) -> &Arc<parking_lot::Mutex<routing::conversations::Conversations>> {
        &self.conversations
    }

    /// lemonade's Prometheus exposition, its gauges from the state as last published and the
    /// KV-cache use of the loaded llama-servers (their `/slots`, read at this scrape).
    pub async fn metrics_text(&self) -> String {
        let mut snapshot = self.lifecycle.metrics_snapshot();
        lifecycle::kv_usage(&self.lifecycle, &mut snapshot.models).await;
        self.metrics.encode(&snapshot)
    }

    /// What the prompt cache holds, and its bound.
    pub fn prompt_cache_usage(&self) -> api_types::PromptCacheUsage {
        let (files, bytes) = self.prompt_cache.total();
        api_types::PromptCacheUsage { files, bytes, limit: self.cfg.prompt_cache_size }
    }

    /// Empties the prompt cache: (files, bytes) removed.
    pub async fn clear_prompt_cache(&self) -> (u64, u64) {
        let store = self.prompt_cache.clone();
        let (files, bytes) = host::offload::offload(move || store.clear()).await.unwrap_or_default();
        tracing::info!(files, bytes, "prompt cache emptied");
        (files, bytes)
    }

    /// Removes the managed backend `recipe:backend` after unloading the models that run on
    /// it. `Ok(Some(message))` when there was nothing to remove (uninstall is idempotent, as in
    /// Lemonade).
    pub async fn uninstall_backend(&self, recipe: &str, backend: &str) -> Result<Option<String>> {
        let r = backends::releases::known(recipe, backend)?;
        if backend == "system" {
            return Err(EngineError::invalid(
                format!("{recipe}:system is the llama-server on PATH; lemonade does not remove it"),
                Some("backend"),
            ));
        }
        let lock = installs::backend_lock(&self.locks, recipe, backend);
        let _guard = lock.lock().await;
        for (m, _) in self.lifecycle.loaded() {
            if m.info.recipe == r && backends::backend_of(r, &m.options) == backend {
                tracing::info!(model = %m.info.name, "unloading: its backend is being uninstalled");
                let _ = self.lifecycle.unload(Some(&m.info.name)).await;
            }
        }
        match host::install::uninstall(&self.cfg.cache_dir, r, backend).await {
            Ok(()) => Ok(None),
            Err(host::install::InstallError::NotInstalled(..)) => {
                Ok(Some(format!("{recipe}:{backend} is not installed; nothing to remove")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stops every backend at once (server shutdown; see [`Lifecycle::shutdown`]), and every
    /// download: a running download job is saved paused, its partial files kept for a resume.
    pub async fn shutdown(&self) {
        self.lifecycle.shutdown().await;
        self.downloads.stopped().await;
    }
}
