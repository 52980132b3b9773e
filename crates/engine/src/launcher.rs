//! The one seam between the lifecycle and processes (as ollama's `newServerFn` and TGI's
//! `Backend`): a [`Launcher`] prepares and spawns a model's backend and probes it while it
//! runs; a [`Process`] is a running backend. [`RealLauncher`] does it over `host` (binary
//! resolution, auto-install, RPC worker checks, the prompt cache's save path, spawn, readiness,
//! health probes); `crate::fake` does it in memory for in-process tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use api_types::LoadOptions;
use backends::capabilities::Capabilities;
use backends::{LaunchInput, Recipe, SpawnSpec};
use futures_util::future::BoxFuture;
use host::{binary, Backend, ExitInfo};
use registry::ModelInfo;

use crate::config::Config;
use crate::locks::Locks;
use crate::prompt_cache::Attached;

/// Why a start failed, by what the lifecycle should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFailure {
    /// Nothing to gain from evicting other models and trying again: a missing file or binary,
    /// an invalid command line, an unreachable RPC worker.
    Fatal(String),
    /// The process started but did not become ready (it may have lacked memory): the
    /// scheduler's failure policy may evict and retry once.
    NotReady(String),
}

impl StartFailure {
    pub fn message(&self) -> &str {
        match self {
            StartFailure::Fatal(m) | StartFailure::NotReady(m) => m,
        }
    }
}

/// What a start needs once everything before the spawn is decided and found.
pub struct Prepared {
    pub spec: SpawnSpec,
    /// The prompt cache of this load, when it keeps one.
    pub cache: Option<Attached>,
}

/// How a running backend answered a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// No answer, or an error status.
    Unhealthy,
    /// One of its RPC workers is gone: (worker, why).
    WorkerGone(String, String),
}

/// A running backend process.
pub trait Process: Send + Sync + 'static {
    /// `http://127.0.0.1:<port>` (for a remote engine: where it is).
    fn base_url(&self) -> String;
    /// The port, once known (0 before).
    fn port(&self) -> u16;
    /// The URL that answers 200 while it is healthy.
    fn health_url(&self) -> String;
    /// The exit status, once the process has ended.
    fn exit_status(&self) -> Option<ExitInfo>;
    /// Resolves when the process has ended.
    fn wait_exit(&self) -> BoxFuture<'_, ExitInfo>;
    /// Resolves (bounded) once everything the process wrote has been read.
    fn output_drained(&self) -> BoxFuture<'_, ()>;
    /// Its last log lines, oldest first.
    fn log_tail(&self) -> String;
    /// Resolves once it serves, or says why it never will ([`StartFailure::NotReady`]).
    fn ready(&self) -> BoxFuture<'_, Result<(), StartFailure>>;
    /// Stops it (SIGTERM, SIGKILL after `grace`); resolves once it is gone.
    fn stop(&self, grace: Duration) -> BoxFuture<'_, ()>;
    /// Its operating-system process id, when it is a process of this machine.
    fn pid(&self) -> Option<u32> {
        None
    }
    /// The confinement it runs under, when it is a process lemonade started.
    fn sandbox(&self) -> Option<api_types::SandboxStatus> {
        None
    }
    /// Answers `req` without a socket, when the process lives in memory (the simulation's
    /// fake backends); None: it is sent over HTTP, as to every real process. An in-memory
    /// failure before the answer is `Err` of the future, in words.
    fn exchange(&self, _req: &reqwest::Request) -> Option<Exchange> {
        None
    }
}

/// Every process's slot API: at its address, or in memory where it answers there.
impl crate::prompt_cache::SlotApi for dyn Process {
    fn base_url(&self) -> String {
        Process::base_url(self)
    }
    fn answer(&self, req: &reqwest::Request) -> Option<Exchange> {
        self.exchange(req)
    }
}

/// An answer a process gives in memory ([`Process::exchange`]).
pub type Exchange = BoxFuture<'static, Result<reqwest::Response, Unanswered>>;

/// Why a process in memory gave no answer.
pub use host::net::Unanswered;

/// What a start needs besides the model and its options: the devices the scheduler placed it
/// on, and its draft model's file.
#[derive(Debug, Clone, Default)]
pub struct StartWith {
    pub devices: Vec<backends::devices::Placed>,
    pub draft: Option<PathBuf>,
}

/// Starts backends and probes them.
pub trait Launcher: Send + Sync + 'static {
    /// Everything a start does before a process exists: files, port, command line, RPC
    /// workers, the binary (which may install it: minutes). Dropping the future abandons it
    /// (an install it began runs on in its own task).
    fn prepare<'a>(
        &'a self,
        info: &'a ModelInfo,
        options: &'a LoadOptions,
        with: &'a StartWith,
    ) -> BoxFuture<'a, Result<Prepared, StartFailure>>;
    /// Starts the process and returns at once; [`Process::ready`] waits for it.
    fn spawn(&self, name: &str, spec: SpawnSpec) -> Result<Arc<dyn Process>, StartFailure>;
    /// One health probe of a running backend, answered within `within`.
    fn probe<'a>(
        &'a self,
        process: &'a dyn Process,
        options: &'a LoadOptions,
        within: Duration,
    ) -> BoxFuture<'a, Health>;
    /// What the installed binary of `recipe`'s `backend` supports (its flags and version),
    /// read once per file; None when it is not installed or does not say. Installs nothing.
    fn capabilities<'a>(&'a self, _recipe: Recipe, _backend: &'a str) -> BoxFuture<'a, Option<Arc<Capabilities>>> {
        Box::pin(async { None })
    }
    /// The system memory (RSS) of a running backend's process, when it is one of this
    /// machine's.
    fn memory_of(&self, _process: &dyn Process) -> Option<u64> {
        None
    }
    /// The GPU memory a running backend's process holds (NVML), when it holds some.
    fn vram_of(&self, _process: &dyn Process) -> Option<u64> {
        None
    }
}

/// How long a worker has to accept a connection at load time.
const WORKER_CONNECT: Duration = Duration::from_secs(3);

/// A model's name as a folder name: ASCII letters, digits, `.`, `-` and `_` kept, the rest `_`.
fn scratch_name(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if s.trim_matches('.').is_empty() {
        format!("_{s}")
    } else {
        s
    }
}

/// The launcher of real processes, over `host`.
pub struct RealLauncher {
    cfg: Arc<Config>,
    http: reqwest::Client,
    locks: Arc<Locks>,
    prompt_cache: host::prompt_cache::Store,
    capabilities: host::capabilities::CapabilityCache,
}

impl RealLauncher {
    pub fn new(
        cfg: Arc<Config>,
        http: reqwest::Client,
        locks: Arc<Locks>,
        prompt_cache: host::prompt_cache::Store,
    ) -> RealLauncher {
        RealLauncher { cfg, http, locks, prompt_cache, capabilities: Default::default() }
    }

    /// The capabilities of the binary at `program`, `recipe`'s executable.
    async fn capabilities_of(&self, recipe: Recipe, program: &std::path::Path) -> Option<Arc<Capabilities>> {
        // Only the ggml servers say what they take; the others' arguments are lemonade's own.
        if !matches!(recipe, Recipe::LlamaCpp | Recipe::WhisperCpp) {
            return None;
        }
        let installed = program.parent().map(|d| d.join("version.txt"));
        self.capabilities.get(program, recipe.dir_and_exe().1, installed.as_deref()).await
    }

    /// The backend's executable; a missing one is installed first when this platform has a
    /// release for it (v9's auto-install on first load).
    async fn backend_binary(&self, recipe: Recipe, backend: &str) -> Result<PathBuf, StartFailure> {
        let (dir, exe) = recipe.dir_and_exe();
        let resolve = || binary::resolve_from_env(&self.cfg.cache_dir, dir, backend, exe);
        if let Some(r) = resolve() {
            return Ok(r.path);
        }
        // Its own task: a cancelled load stops waiting for the install, not the install.
        let (cfg, locks, b) = (self.cfg.clone(), self.locks.clone(), backend.to_string());
        let install =
            tokio::spawn(async move { crate::installs::auto_install(&cfg, &locks, recipe.as_str(), &b).await });
        let fatal = |m: String| StartFailure::Fatal(self.cfg.redact_here(&m));
        let installed = install.await.map_err(|e| fatal(format!("the install task failed: {e}")))?;
        if installed.map_err(|e| fatal(e.to_string()))? {
            if let Some(r) = resolve() {
                return Ok(r.path);
            }
        }
        Err(fatal(if backend == "system" {
            format!("The 'system' backend uses {exe} from PATH, and there is none on PATH")
        } else {
            format!(
                "{exe} for the '{backend}' backend is not installed and cannot be installed automatically here: set {}, or install it under {}{}",
                binary::override_var(dir, backend),
                binary::managed_dir(&self.cfg.cache_dir, dir, backend).display(),
                if matches!(dir, "llamacpp" | "whispercpp") { " (a CPU build is provisioned by `cargo xtask setup`)" } else { "" }
            )
        }))
    }

    async fn prepare_now(
        &self,
        info: &ModelInfo,
        options: &LoadOptions,
        with: &StartWith,
    ) -> Result<Prepared, StartFailure> {
        let fatal = |message: String| StartFailure::Fatal(self.cfg.redact_here(&message));
        let name = info.name.as_str();
        // FLM keeps its own models: its checkpoint is a tag, pulled by `flm pull` below.
        let flm = info.recipe == Recipe::Flm;
        let main = match flm {
            true => PathBuf::new(),
            false => info
                .main_path
                .clone()
                .filter(|p| p.exists())
                .ok_or_else(|| fatal(format!("Model file not found for checkpoint: {}", info.checkpoint)))?,
        };
        let port = match info.recipe.needs_port() {
            true => Some(host::supervisor::free_port().map_err(|e| fatal(format!("no free port: {e}")))?),
            false => None,
        };
        let hardware = host::hardware::hardware();
        let backend_name = backends::backend_of(info.recipe, options);
        let program = self.backend_binary(info.recipe, &backend_name).await?;
        let caps = self.capabilities_of(info.recipe, &program).await;
        let input = LaunchInput {
            name,
            main_path: &main,
            mmproj_path: info.mmproj_path.as_deref(),
            model_type: info.model_type,
            options,
            hardware: &hardware,
            port,
            devices: &with.devices,
            checkpoint: &info.checkpoint,
            draft_path: with.draft.as_deref(),
            caps: caps.as_deref(),
        };
        let mut launch = backends::launch(info.recipe, &input).map_err(|e| fatal(e.to_string()))?;
        let workers = backends::rpc::workers(options);
        check_workers(name, &workers).await.map_err(|e| fatal(e.to_string()))?;
        // A slot's KV state on RPC workers is not saved, nor a draft model's: the prompt cache
        // stays off.
        let cache = (info.recipe == Recipe::LlamaCpp && workers.is_empty() && with.draft.is_none())
            .then(|| {
                let (store, limit) = (&self.prompt_cache, self.cfg.prompt_cache_size);
                let mmproj = info.mmproj_path.is_some();
                let key = crate::prompt_cache::FileKey::of(&main)?;
                crate::prompt_cache::attach(store, limit, name, info.model_type, mmproj, &key, &mut launch.args)
            })
            .flatten();
        if flm {
            self.flm_ready(&program, &info.checkpoint).await?;
        }
        // Its scratch folder, emptied at each start: its TMPDIR and the only folder it writes
        // besides its saved slots.
        let scratch = self.cfg.cache_dir.join("scratch").join(scratch_name(name));
        let made = scratch.clone();
        let fresh = move || {
            let _ = std::fs::remove_dir_all(&made);
            std::fs::create_dir_all(&made)
        };
        let made = host::offload::offload_io(fresh).await;
        made.map_err(|e| fatal(format!("cannot make {}: {e}", scratch.display())))?;
        // Each model file where the command line names it and where its links lead (a Hub
        // cache's snapshot links into the repository's blobs; a file may link elsewhere).
        let named: Vec<&std::path::Path> =
            [Some(main.as_path()), info.mmproj_path.as_deref(), with.draft.as_deref()].into_iter().flatten().collect();
        let named = host::sandbox::model_files(&named);
        let models: Vec<&std::path::Path> = named.iter().map(|p| p.as_path()).collect();
        let writes: Vec<PathBuf> = cache.as_ref().map(|c| c.dir.clone()).into_iter().collect();
        let ports: Vec<u16> = workers.iter().filter_map(|w| w.rsplit_once(':')?.1.parse().ok()).collect();
        let mut runtime = host::sandbox::runtime_paths(&program);
        let operator = self.cfg.live.options();
        let given = [operator.llamacpp_args.as_deref(), operator.whispercpp_args.as_deref()];
        runtime.extend(backends::sandbox::operator_files(&given.into_iter().flatten().collect::<Vec<_>>()));
        let policy = backends::sandbox::policy(&program, &runtime, &models, (&scratch, &writes), port, &ports);
        let mut spec = SpawnSpec::new(name, program, launch, self.cfg.live.load_timeout());
        spec.sandbox = Some((self.cfg.live.sandbox(), policy));
        Ok(Prepared { spec, cache })
    }
}

impl RealLauncher {
    /// What Lemonade v11 does before `flm serve`: `flm validate` (the NPU and its driver can run
    /// FLM), then `flm pull` of the checkpoint (a model FLM has is kept as it is).
    async fn flm_ready(&self, flm: &std::path::Path, checkpoint: &str) -> Result<(), StartFailure> {
        use backends::flm;
        let fatal = |m: String| StartFailure::Fatal(self.cfg.redact_here(&m));
        if let Some(why) = failure_of(flm, &flm::validate_args(), Duration::from_secs(60)).await {
            return Err(fatal(format!(
                "FLM NPU validation failed ({why})\nVisit {} for driver installation instructions.",
                flm::DRIVER_INSTALL_URL
            )));
        }
        match failure_of(flm, &flm::pull_args(checkpoint), self.cfg.live.pull_timeout()).await {
            Some(why) => Err(fatal(format!("FLM pull failed ({why})"))),
            None => Ok(()),
        }
    }
}

/// Runs `program args` to its end within `within`: None when it exits 0, else the command, how
/// it ended and what it printed.
async fn failure_of(program: &std::path::Path, args: &[String], within: Duration) -> Option<String> {
    let name = program.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let shown = format!("{name} {}", args.join(" "));
    // FLM's validate and pull reach the NPU driver and the network: not confined.
    match host::supervisor::run_once(program, args, within, false).await {
        Ok((Some(0), _)) => None,
        Ok((code, out)) => {
            Some(format!("{shown} exited {}: {}", code.map_or("on a signal".into(), |c| c.to_string()), out.trim()))
        }
        Err(e) => Some(format!("{shown}: {e}")),
    }
}

impl Launcher for RealLauncher {
    fn prepare<'a>(
        &'a self,
        info: &'a ModelInfo,
        options: &'a LoadOptions,
        with: &'a StartWith,
    ) -> BoxFuture<'a, Result<Prepared, StartFailure>> {
        Box::pin(self.prepare_now(info, options, with))
    }

    fn spawn(&self, _name: &str, spec: SpawnSpec) -> Result<Arc<dyn Process>, StartFailure> {
        let backend = Backend::spawn(spec).map_err(|e| StartFailure::Fatal(self.cfg.redact_here(&e.to_string())))?;
        Ok(Arc::new(RealProcess { backend, http: self.http.clone() }))
    }

    fn probe<'a>(
        &'a self,
        process: &'a dyn Process,
        options: &'a LoadOptions,
        within: Duration,
    ) -> BoxFuture<'a, Health> {
        Box::pin(async move {
            if let Some((w, why)) = lost_worker(options, within.min(Duration::from_secs(1))).await {
                return Health::WorkerGone(w, why);
            }
            match self.http.get(process.health_url()).timeout(within).send().await {
                Ok(resp) if resp.status().is_success() => Health::Ok,
                _ => Health::Unhealthy,
            }
        })
    }

    fn capabilities<'a>(&'a self, recipe: Recipe, backend: &'a str) -> BoxFuture<'a, Option<Arc<Capabilities>>> {
        Box::pin(async move {
            let (dir, exe) = recipe.dir_and_exe();
            let found = binary::resolve_from_env(&self.cfg.cache_dir, dir, backend, exe)?;
            self.capabilities_of(recipe, &found.path).await
        })
    }

    fn memory_of(&self, process: &dyn Process) -> Option<u64> {
        host::hardware::process_rss(process.pid()?)
    }

    fn vram_of(&self, process: &dyn Process) -> Option<u64> {
        host::hardware::process_vram(process.pid()?)
    }
}

/// A real backend process (host's supervisor) with the client that probes it.
pub struct RealProcess {
    backend: Backend,
    http: reqwest::Client,
}

impl Process for RealProcess {
    fn base_url(&self) -> String {
        self.backend.base_url()
    }
    fn pid(&self) -> Option<u32> {
        Some(self.backend.pid())
    }
    fn sandbox(&self) -> Option<api_types::SandboxStatus> {
        self.backend.sandbox().cloned()
    }
    fn port(&self) -> u16 {
        self.backend.port()
    }
    fn health_url(&self) -> String {
        self.backend.health_url()
    }
    fn exit_status(&self) -> Option<ExitInfo> {
        self.backend.exit_status()
    }
    fn wait_exit(&self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(self.backend.wait_exit())
    }
    fn output_drained(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.backend.output_drained())
    }
    fn log_tail(&self) -> String {
        self.backend.log_tail()
    }
    fn ready(&self) -> BoxFuture<'_, Result<(), StartFailure>> {
        Box::pin(async move { self.backend.ready(&self.http).await.map_err(|e| StartFailure::NotReady(e.to_string())) })
    }
    fn stop(&self, grace: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.backend.stop(grace))
    }
}

/// Why a load's RPC worker cannot serve it.
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    #[error("RPC worker {worker} is unreachable ({error}); start rpc-server there or remove it from rpc_servers")]
    Gone { worker: String, error: String },
    #[error("RPC worker {worker} did not accept a connection within {secs} s")]
    Silent { worker: String, secs: u64 },
}

/// Fails a load whose RPC workers cannot be reached, naming the first such; warns of workers
/// outside loopback and private networks (rpc-server has no authentication).
async fn check_workers(model: &str, workers: &[String]) -> Result<(), Unreachable> {
    for w in workers {
        if !backends::rpc::is_private(w) {
            tracing::warn!(model, worker = %w, "RPC worker is not on loopback or a private network: rpc-server has no authentication; anyone who reaches it can use its machine");
        }
        match host::net::probe(w, WORKER_CONNECT).await {
            host::net::Worker::Up => {}
            host::net::Worker::Gone(e) => return Err(Unreachable::Gone { worker: w.clone(), error: e.to_string() }),
            host::net::Worker::Silent => {
                return Err(Unreachable::Silent { worker: w.clone(), secs: WORKER_CONNECT.as_secs() });
            }
        }
    }
    Ok(())
}

/// The first of the model's RPC workers that is gone (nothing listens, or its host is
/// unreachable), and why. A worker that is merely slow to accept is not gone: rpc-server
/// serves one client at a time, and llama-server is that client.
async fn lost_worker(options: &LoadOptions, within: Duration) -> Option<(String, String)> {
    for w in backends::rpc::workers(options) {
        if let host::net::Worker::Gone(e) = host::net::probe(&w, within).await {
            return Some((w, e));
        }
    }
    None
}
