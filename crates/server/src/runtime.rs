//! Which models are loaded, and the leases that keep them loaded while a request runs.
//!
//! Invariants:
//! * loads are serialized (`load_lock`); reads of the loaded list never wait for a load;
//! * a model is handed out only through a [`Lease`]; eviction removes the model from the list
//!   first (no new leases), then waits until its in-flight count is zero, then stops it;
//! * the request that caused a load gets its lease atomically with the insertion, so the model
//!   cannot be evicted between its load and that request;
//! * a backend that exits is removed from the list at once (a watcher waits on every child);
//!   the next request for that model loads it again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use api_types::{LoadedModel, ModelType, RecipeOptions, Stats};
use backends::llamacpp::{self, LlamaServerConfig};
use backends::{binary, Backend, SpawnSpec};
use registry::{ModelInfo, Registry};
use scheduler::{plan_load, Plan, Resident};
use serde_json::Value;
use tokio::sync::Notify;

use crate::config::Config;
use crate::error::ApiError;

/// Grace period between SIGTERM and SIGKILL when a backend is stopped.
const STOP_GRACE: Duration = Duration::from_secs(5);

pub struct Runtime {
    pub cfg: Config,
    registry: RwLock<Arc<Registry>>,
    pub http: reqwest::Client,
    /// Loaded models in load order.
    loaded: Mutex<Vec<Arc<Loaded>>>,
    load_lock: tokio::sync::Mutex<()>,
    epoch: Instant,
}

/// A loaded model: its backend process and its bookkeeping.
pub struct Loaded {
    pub info: ModelInfo,
    pub backend: Backend,
    /// Effective options it was loaded with.
    pub options: RecipeOptions,
    last_use: AtomicU64,
    in_flight: AtomicUsize,
    drained: Notify,
    /// Set once the model left the list (evicted, unloaded or dead): no new leases.
    closing: AtomicBool,
    pub stats: Mutex<Stats>,
}

impl Loaded {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// Keeps a model loaded while a request uses it. Dropping it (completion, error, client
/// disconnect) releases the model.
pub struct Lease {
    pub model: Arc<Loaded>,
    rt: Arc<Runtime>,
}

impl Lease {
    /// Base URL of the backend, `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        self.model.backend.base_url()
    }

    /// The pooled client used for every backend request.
    pub fn http(&self) -> &reqwest::Client {
        &self.rt.http
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.model.last_use.store(self.rt.now_ms(), Ordering::SeqCst);
        if self.model.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.model.drained.notify_waiters();
        }
    }
}

impl Runtime {
    pub fn new(cfg: Config, registry: Registry) -> Arc<Runtime> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            // llama-server (cpp-httplib) closes idle keep-alive connections after 5 s; reusing
            // one as it closes fails the request, so idle connections are dropped first.
            .pool_idle_timeout(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .expect("reqwest client");
        Arc::new(Runtime {
            cfg,
            registry: RwLock::new(Arc::new(registry)),
            http,
            loaded: Mutex::new(Vec::new()),
            load_lock: tokio::sync::Mutex::new(()),
            epoch: Instant::now(),
        })
    }

    /// Milliseconds of a monotonic clock (since the server started).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn loaded_list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Loaded>>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Snapshot of the loaded models, in load order.
    pub fn loaded(&self) -> Vec<Arc<Loaded>> {
        self.loaded_list().clone()
    }

    /// The loaded model used most recently.
    pub fn most_recent(&self) -> Option<Arc<Loaded>> {
        self.loaded_list().iter().max_by_key(|m| m.last_use.load(Ordering::SeqCst)).cloned()
    }

    pub fn health_entry(&self, m: &Loaded) -> LoadedModel {
        LoadedModel {
            model_name: m.info.name.clone(),
            checkpoint: m.info.checkpoint.clone(),
            model_type: m.info.model_type,
            device: m.info.device().to_string(),
            backend_url: format!("{}/v1", m.backend.base_url()),
            recipe: m.info.recipe.clone(),
            recipe_options: m.options.clone(),
            last_use: m.last_use.load(Ordering::SeqCst),
        }
    }

    fn try_lease(self: &Arc<Self>, name: &str) -> Option<Lease> {
        let list = self.loaded_list();
        let m = list.iter().find(|m| m.info.name == name && !m.closing.load(Ordering::SeqCst))?;
        if m.backend.exit_status().is_some() {
            return None;
        }
        m.in_flight.fetch_add(1, Ordering::SeqCst);
        m.last_use.store(self.now_ms(), Ordering::SeqCst);
        Some(Lease { model: m.clone(), rt: self.clone() })
    }

    /// A lease on `name`, loading it first if needed. `want` is the model type the endpoint
    /// serves; a model of another type is rejected before anything is loaded.
    pub async fn acquire(self: &Arc<Self>, name: &str, want: &[ModelType], endpoint: &str) -> Result<Lease, ApiError> {
        let info = self.registry().get(name)?.clone();
        if !want.contains(&info.model_type) {
            return Err(ApiError::WrongModelType(format!(
                "Model '{name}' is a{} {} model; {endpoint} needs {} model.",
                if info.model_type == ModelType::Embedding { "n" } else { "" },
                info.model_type.as_str(),
                want.iter().map(|t| format!("an {}", t.as_str())).collect::<Vec<_>>().join(" or "),
            )));
        }
        if let Some(lease) = self.try_lease(name) {
            return Ok(lease);
        }
        let _guard = self.load_lock.lock().await;
        if let Some(lease) = self.try_lease(name) {
            return Ok(lease);
        }
        self.load_locked(info).await
    }

    /// Loads `info` (the caller holds `load_lock`) and returns a lease taken atomically with
    /// the insertion into the loaded list.
    async fn load_locked(self: &Arc<Self>, info: ModelInfo) -> Result<Lease, ApiError> {
        let name = info.name.clone();
        let fail = |message: String| ApiError::LoadFailed { model: name.clone(), message };
        if !info.downloaded {
            return Err(ApiError::BadRequest {
                message: format!("Model '{name}' is not downloaded. Pull it first: lemonade pull {name}"),
                param: Some("model".into()),
                code: Some("model_not_downloaded"),
            });
        }
        let main = info.main_path.clone().ok_or_else(|| fail("no model file found".into()))?;

        let options = self.effective_options(&info);
        let backend_name = options.get("llamacpp_backend").and_then(Value::as_str).unwrap_or("cpu").to_string();
        let ctx_size =
            options.get("ctx_size").and_then(Value::as_u64).map(|v| v as u32).unwrap_or(llamacpp::DEFAULT_CTX_SIZE);
        let user_args = options.get("llamacpp_args").and_then(Value::as_str).unwrap_or_default().to_string();
        let args = llamacpp::command_line(&LlamaServerConfig {
            model_path: main,
            mmproj_path: info.mmproj_path.clone(),
            model_type: info.model_type,
            ctx_size,
            backend: backend_name.clone(),
            user_args,
            amd_igpu: false,
        })
        .map_err(|e| ApiError::BadRequest {
            message: e.to_string(),
            param: Some("llamacpp_args".into()),
            code: Some("invalid_llamacpp_args"),
        })?;
        let program = self.llama_server_binary(&backend_name).map_err(fail)?;

        // Make room: the victim leaves the list first (no new leases), then drains, then stops.
        let victim = {
            let list = self.loaded_list();
            let residents: Vec<Resident> = list
                .iter()
                .map(|m| Resident {
                    name: &m.info.name,
                    model_type: m.info.model_type,
                    last_use: m.last_use.load(Ordering::SeqCst),
                    in_flight: m.in_flight(),
                })
                .collect();
            match plan_load(&residents, info.model_type, &self.cfg.max_loaded_models) {
                Plan::Load => None,
                Plan::Evict(v) => list.iter().find(|m| m.info.name == v).cloned(),
            }
        };
        if let Some(v) = victim {
            tracing::info!(model = %v.info.name, for_model = %name, "evicting least recently used model");
            self.retire(&v).await;
        }

        let spec = SpawnSpec {
            label: name.clone(),
            program,
            args,
            env: vec![],
            health_path: "/health".into(),
            ready_timeout: self.cfg.ready_timeout,
        };
        let started = Instant::now();
        let backend = Backend::start(spec, &self.http).await.map_err(|e| fail(e.to_string()))?;
        tracing::info!(model = %name, ms = started.elapsed().as_millis() as u64, port = backend.port(), "model loaded");

        let now = self.now_ms();
        let loaded = Arc::new(Loaded {
            info,
            backend: backend.clone(),
            options,
            last_use: AtomicU64::new(now),
            in_flight: AtomicUsize::new(1),
            drained: Notify::new(),
            closing: AtomicBool::new(false),
            stats: Mutex::new(Stats::default()),
        });
        self.loaded_list().push(loaded.clone());
        self.watch(loaded.clone());
        Ok(Lease { model: loaded, rt: self.clone() })
    }

    /// Notices a backend that exits on its own and drops it from the list.
    fn watch(self: &Arc<Self>, m: Arc<Loaded>) {
        let rt = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = m.backend.wait_exit().await;
            if m.closing.swap(true, Ordering::SeqCst) {
                return; // an unload or eviction stopped it
            }
            tracing::error!(model = %m.info.name, status = %exit, tail = %m.backend.log_tail(), "backend died");
            if let Some(rt) = rt.upgrade() {
                rt.loaded_list().retain(|x| !Arc::ptr_eq(x, &m));
            }
        });
    }

    /// Removes `m` from the list, waits for its in-flight requests, stops its backend.
    async fn retire(&self, m: &Arc<Loaded>) {
        m.closing.store(true, Ordering::SeqCst);
        self.loaded_list().retain(|x| !Arc::ptr_eq(x, m));
        loop {
            let drained = m.drained.notified();
            if m.in_flight() == 0 {
                break;
            }
            drained.await;
        }
        m.backend.stop(STOP_GRACE).await;
    }

    /// Stops every backend (server shutdown).
    pub async fn unload_all(&self) {
        let _guard = self.load_lock.lock().await;
        let all: Vec<Arc<Loaded>> = std::mem::take(&mut *self.loaded_list());
        let stops = all.iter().map(|m| {
            m.closing.store(true, Ordering::SeqCst);
            m.backend.stop(STOP_GRACE)
        });
        futures_util::future::join_all(stops).await;
    }

    /// Effective options: saved per-model options over CLI/env settings; built-in defaults
    /// are applied when read. Only keys set at some level are listed.
    fn effective_options(&self, info: &ModelInfo) -> RecipeOptions {
        let mut o = RecipeOptions::new();
        o.insert("llamacpp_backend".into(), Value::String(self.cfg.llamacpp_backend.clone()));
        if let Some(c) = self.cfg.ctx_size {
            o.insert("ctx_size".into(), c.into());
        }
        if let Some(a) = &self.cfg.llamacpp_args {
            o.insert("llamacpp_args".into(), Value::String(a.clone()));
        }
        for (k, v) in self.registry().saved_options(info) {
            o.insert(k, v);
        }
        registry::filter_recipe_options(&info.recipe, &o)
    }

    fn llama_server_binary(&self, backend: &str) -> Result<PathBuf, String> {
        binary::resolve(
            &self.cfg.cache_dir,
            "llamacpp",
            backend,
            "llama-server",
            |k| std::env::var(k).ok(),
            std::env::var("PATH").ok(),
        )
        .map(|r| r.path)
        .ok_or_else(|| {
            format!(
                "llama-server for the '{backend}' backend was not found: set {}, install it under {}, or put llama-server on PATH \
                 (a CPU build is provisioned by `cargo xtask setup`)",
                binary::override_var("llamacpp", backend),
                binary::managed_dir(&self.cfg.cache_dir, "llamacpp", backend).display()
            )
        })
    }
}
