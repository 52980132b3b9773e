//! A [`Launcher`] in memory, for in-process tests of the lifecycle (as ollama's scenario tests
//! with their injected server constructor): no process, no port. Each start makes a
//! [`FakeProcess`] that the test steers: hold its start until released, fail it, crash it,
//! make its health probes fail. The end-to-end tests run the real programs; this is for the
//! orderings that are hard to produce with them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use api_types::LoadOptions;
use backends::SpawnSpec;
use futures_util::future::BoxFuture;
use host::ExitInfo;
use parking_lot::Mutex;
use registry::ModelInfo;
use tokio::sync::watch;

use crate::catalogue::Catalogue;
use crate::launcher::{Health, Launcher, Prepared, Process, StartFailure};

/// The fake launcher and its knobs (by model name).
pub struct FakeLauncher {
    state: Mutex<Knobs>,
    /// Bumped on every prepare, spawn and exit, so tests can wait for any of them.
    changed: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct Knobs {
    /// Models whose starts wait until released (the gate opens when set to true).
    held: HashMap<String, watch::Sender<bool>>,
    /// The next start of these models fails before the process exists.
    fail_prepare: HashMap<String, String>,
    /// The next starts of these models (how many) spawn a process that exits before it is ready.
    fail_ready: HashMap<String, (String, usize)>,
    /// Models whose processes answer no health probe.
    unhealthy: HashSet<String>,
    /// Every process spawned, in order.
    spawned: Vec<(String, Arc<FakeProcess>)>,
    /// Every start that reached `prepare`, in order.
    prepared: Vec<(String, LoadOptions)>,
    /// What the processes of these models are measured to hold: (RSS, VRAM) bytes.
    measured: HashMap<String, (Option<u64>, Option<u64>)>,
    /// Where the processes of these models answer HTTP (a test's server on loopback).
    served: HashMap<String, String>,
    /// Processes answer requests in memory ([`crate::launcher::Process::exchange`]).
    answerer: Option<Answerer>,
    /// LLM loads keep a prompt cache here, up to this many bytes.
    prompt_cache: Option<(host::prompt_cache::Store, u64)>,
}

impl FakeLauncher {
    pub fn new() -> Arc<FakeLauncher> {
        Arc::new(FakeLauncher { state: Mutex::default(), changed: Arc::new(watch::channel(0).0) })
    }

    /// Starts of `model` wait (in readiness, with the process registered) until [`release`].
    ///
    /// [`release`]: FakeLauncher::release
    pub fn hold(&self, model: &str) {
        self.state.lock().held.insert(model.to_string(), watch::channel(false).0);
    }

    /// The processes of `model` are measured to hold `rss` bytes of memory and `vram` of GPU
    /// memory from now on (None: not measurable).
    pub fn measure(&self, model: &str, rss: Option<u64>, vram: Option<u64>) {
        self.state.lock().measured.insert(model.to_string(), (rss, vram));
    }

    fn measured_of(&self, process: &dyn Process) -> (Option<u64>, Option<u64>) {
        let s = self.state.lock();
        let model = s.spawned.iter().find(|(_, p)| p.base_url() == process.base_url()).map(|(m, _)| m.clone());
        model.and_then(|m| s.measured.get(&m).copied()).unwrap_or_default()
    }

    /// The processes of `model` started from now on answer HTTP at `base_url` (a server the
    /// test runs on 127.0.0.1 standing for the backend), so requests to them really travel.
    pub fn serve(&self, model: &str, base_url: &str) {
        self.state.lock().served.insert(model.to_string(), base_url.trim_end_matches('/').to_string());
    }

    /// Processes spawned from now on answer in memory with `answerer`, no socket (the
    /// simulation's backend, crates/sim).
    pub fn in_memory(&self, answerer: Answerer) {
        self.state.lock().answerer = Some(answerer);
    }

    /// LLM loads from now on keep a prompt cache in `store` (up to `limit` bytes), as the real
    /// launcher's: keyed by the model's file (as the catalogue names it) and the load's
    /// command line (here its context size), the save directory in the process's arguments.
    pub fn prompt_cache(&self, store: host::prompt_cache::Store, limit: u64) {
        self.state.lock().prompt_cache = Some((store, limit));
    }

    /// Lets held starts of `model` finish.
    pub fn release(&self, model: &str) {
        if let Some(g) = self.state.lock().held.remove(model) {
            g.send_replace(true);
        }
    }

    /// The next start of `model` fails before any process exists (a missing binary, say).
    pub fn fail_prepare(&self, model: &str, message: &str) {
        self.state.lock().fail_prepare.insert(model.to_string(), message.to_string());
    }

    /// The next `times` starts of `model` spawn a process that exits before it is ready.
    pub fn fail_ready(&self, model: &str, message: &str, times: usize) {
        self.state.lock().fail_ready.insert(model.to_string(), (message.to_string(), times));
    }

    /// Health probes of `model`'s processes fail (true) or pass (false).
    pub fn set_unhealthy(&self, model: &str, unhealthy: bool) {
        let mut s = self.state.lock();
        if unhealthy {
            s.unhealthy.insert(model.to_string());
        } else {
            s.unhealthy.remove(model);
        }
    }

    /// Every process spawned for `model`, oldest first.
    pub fn processes(&self, model: &str) -> Vec<Arc<FakeProcess>> {
        self.state.lock().spawned.iter().filter(|(m, _)| m == model).map(|(_, p)| p.clone()).collect()
    }

    /// Every process spawned, with its model, oldest first.
    pub fn processes_all(&self) -> Vec<(String, Arc<FakeProcess>)> {
        self.state.lock().spawned.clone()
    }

    /// The models of every process spawned, in order.
    pub fn spawn_order(&self) -> Vec<String> {
        self.state.lock().spawned.iter().map(|(m, _)| m.clone()).collect()
    }

    /// Models whose process is alive now.
    pub fn alive(&self) -> Vec<String> {
        let s = self.state.lock();
        s.spawned.iter().filter(|(_, p)| p.exit_status().is_none()).map(|(m, _)| m.clone()).collect()
    }

    /// How many starts reached `prepare` for `model`.
    pub fn starts(&self, model: &str) -> usize {
        self.state.lock().prepared.iter().filter(|(m, _)| m == model).count()
    }

    /// The options each start of `model` was prepared with, in order (a context size of `-1`
    /// already resolved).
    pub fn launched_with(&self, model: &str) -> Vec<LoadOptions> {
        self.state.lock().prepared.iter().filter(|(m, _)| m == model).map(|(_, o)| o.clone()).collect()
    }

    /// Waits (at most `within`) until `cond` holds of this launcher; false if it never did.
    pub async fn wait_until(&self, within: Duration, cond: impl Fn(&FakeLauncher) -> bool) -> bool {
        let mut rx = self.changed.subscribe();
        tokio::time::timeout(within, async {
            loop {
                if cond(self) {
                    return;
                }
                let _ = rx.changed().await;
            }
        })
        .await
        .is_ok()
    }

    fn bump(&self) {
        bump(&self.changed);
    }
}

impl Launcher for FakeLauncher {
    fn prepare<'a>(
        &'a self,
        info: &'a ModelInfo,
        options: &'a LoadOptions,
        _with: &'a crate::launcher::StartWith,
    ) -> BoxFuture<'a, Result<Prepared, StartFailure>> {
        Box::pin(async move {
            let failed = {
                let mut s = self.state.lock();
                s.prepared.push((info.name.clone(), options.clone()));
                s.fail_prepare.remove(&info.name)
            };
            self.bump();
            if let Some(m) = failed {
                return Err(StartFailure::Fatal(m));
            }
            let model = info.main_path.as_ref().map_or_else(|| info.name.clone(), |p| p.display().to_string());
            let mut args = vec!["-m".to_string(), model.clone()];
            if let Some(c) = &options.ctx_size {
                args.extend(["--ctx-size".to_string(), format!("{c:?}")]);
            }
            let cache = self.state.lock().prompt_cache.clone().and_then(|(store, limit)| {
                let key = crate::prompt_cache::FileKey { path: model, len: 1 << 20, mtime_ns: 0 };
                let mmproj = info.mmproj_path.is_some();
                crate::prompt_cache::attach(&store, limit, &info.name, info.model_type, mmproj, &key, &mut args)
            });
            let spec = SpawnSpec {
                label: info.name.clone(),
                program: "fake-backend".into(),
                args,
                env: vec![],
                health_path: "/health".into(),
                ready_timeout: Duration::from_secs(60),
                port: None,
                sandbox: None,
            };
            Ok(Prepared { spec, cache })
        })
    }

    fn spawn(&self, name: &str, spec: SpawnSpec) -> Result<Arc<dyn Process>, StartFailure> {
        let p = {
            let mut s = self.state.lock();
            let gate = s.held.get(name).map(|g| g.subscribe());
            let p = Arc::new(FakeProcess {
                served: s.served.get(name).cloned(),
                name: name.to_string(),
                exit: watch::channel(None).0,
                gate,
                fail_ready: take_one(&mut s.fail_ready, name),
                changed: self.changed.clone(),
                answerer: s.answerer.clone(),
                args: spec.args,
                working: Default::default(),
                ended_at: Default::default(),
            });
            s.spawned.push((name.to_string(), p.clone()));
            p
        };
        self.bump();
        Ok(p)
    }

    fn probe<'a>(
        &'a self,
        process: &'a dyn Process,
        _options: &'a LoadOptions,
        _within: Duration,
    ) -> BoxFuture<'a, Health> {
        Box::pin(async move {
            let s = self.state.lock();
            let model = s.spawned.iter().find(|(_, p)| p.base_url() == process.base_url()).map(|(m, _)| m.clone());
            match model {
                Some(m) if s.unhealthy.contains(&m) => Health::Unhealthy,
                _ => Health::Ok,
            }
        })
    }

    fn memory_of(&self, process: &dyn Process) -> Option<u64> {
        self.measured_of(process).0
    }

    fn vram_of(&self, process: &dyn Process) -> Option<u64> {
        self.measured_of(process).1
    }
}

/// One fake backend process.
pub struct FakeProcess {
    /// The loopback server it answers at, when the test gave one.
    served: Option<String>,
    name: String,
    exit: watch::Sender<Option<ExitInfo>>,
    gate: Option<watch::Receiver<bool>>,
    fail_ready: Option<String>,
    changed: Arc<watch::Sender<u64>>,
    /// Answers requests in memory (the simulation's backend).
    answerer: Option<Answerer>,
    /// When it ended (the runtime's clock).
    ended_at: Arc<Mutex<Option<tokio::time::Instant>>>,
    /// Requests it is generating for now (in memory).
    working: Arc<std::sync::atomic::AtomicUsize>,
    /// Its command line's arguments.
    args: Vec<String>,
}

/// How a process answers in memory: given the process and the request, the answer.
pub type Answerer = Arc<dyn Fn(&FakeProcess, &reqwest::Request) -> crate::launcher::Exchange + Send + Sync>;

/// Crashes a fake process ([`FakeProcess::crasher`]).
#[derive(Clone)]
pub struct Crasher {
    exit: watch::Sender<Option<ExitInfo>>,
    ended_at: Arc<Mutex<Option<tokio::time::Instant>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Crasher {
    /// The process exits with code 1, unless it already ended.
    pub fn crash(&self) {
        self.end(ExitInfo { code: Some(1), signal: None });
    }

    /// The process ends with `e` (when it ended, and the launcher's watchers told), unless it
    /// already ended.
    fn end(&self, e: ExitInfo) {
        if self.exit.borrow().is_none() {
            *self.ended_at.lock() = Some(tokio::time::Instant::now());
            self.exit.send_replace(Some(e));
            bump(&self.changed);
        }
    }
}

/// One request being generated ([`FakeProcess::busy`]).
pub struct Busy(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One of the failures counted for `name`, if any are left.
fn take_one(counts: &mut HashMap<String, (String, usize)>, name: &str) -> Option<String> {
    let (message, left) = counts.get_mut(name)?;
    let m = message.clone();
    *left -= 1;
    if *left == 0 {
        counts.remove(name);
    }
    Some(m)
}

fn bump(changed: &watch::Sender<u64>) {
    changed.send_modify(|n| *n += 1);
}

impl FakeProcess {
    /// The process exits on its own (a crash): exit code 1.
    pub fn crash(&self) {
        self.exit_with(ExitInfo { code: Some(1), signal: None });
    }

    fn exit_with(&self, e: ExitInfo) {
        self.crasher().end(e);
    }

    /// Its command line's arguments (a prompt cache's `--slot-save-path` among them).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Whether it was stopped by lemonade (SIGTERM) rather than crashing.
    pub fn was_stopped(&self) -> bool {
        matches!(*self.exit.borrow(), Some(ExitInfo { signal: Some(15), .. }))
    }

    pub fn is_alive(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// When it ended, if it has.
    pub fn ended_at(&self) -> Option<tokio::time::Instant> {
        *self.ended_at.lock()
    }

    /// How many requests it is generating for now (in memory): a client that hung up is no
    /// longer one of them.
    pub fn working(&self) -> usize {
        self.working.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts one request as being generated while the guard lives.
    pub fn busy(&self) -> Busy {
        self.working.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(self.working.clone())
    }

    /// The model it runs.
    pub fn model(&self) -> &str {
        &self.name
    }

    /// Its exit, watched (None while it runs).
    pub fn exits(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.subscribe()
    }

    /// A handle that crashes it (exit code 1) from anywhere, as a backend dying mid-answer.
    pub fn crasher(&self) -> Crasher {
        Crasher { exit: self.exit.clone(), ended_at: self.ended_at.clone(), changed: self.changed.clone() }
    }
}

impl Process for FakeProcess {
    fn base_url(&self) -> String {
        // Unique per process, so the launcher's probe can tell them apart (a served model's
        // processes share their server).
        match &self.served {
            Some(url) => url.clone(),
            None => format!("http://fake.invalid/{}/{:p}", self.name, self),
        }
    }
    fn port(&self) -> u16 {
        0
    }
    fn health_url(&self) -> String {
        format!("{}/health", self.base_url())
    }
    fn exit_status(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }
    fn wait_exit(&self) -> BoxFuture<'_, ExitInfo> {
        let mut rx = self.exit.subscribe();
        Box::pin(async move {
            let e = rx.wait_for(|e| e.is_some()).await.map(|e| *e).ok().flatten();
            e.unwrap_or(ExitInfo { code: None, signal: None })
        })
    }
    fn output_drained(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn log_tail(&self) -> String {
        format!("fake backend {} log", self.name)
    }
    fn ready(&self) -> BoxFuture<'_, Result<(), StartFailure>> {
        Box::pin(async move {
            if let Some(mut gate) = self.gate.clone() {
                let mut exit = self.exit.subscribe();
                tokio::select! {
                    _ = gate.wait_for(|open| *open) => {}
                    _ = exit.wait_for(|e| e.is_some()) => {}
                }
            }
            if let Some(m) = &self.fail_ready {
                self.exit_with(ExitInfo { code: Some(1), signal: None });
                return Err(StartFailure::NotReady(m.clone()));
            }
            match self.exit_status() {
                Some(e) => Err(StartFailure::NotReady(format!("fake backend exited ({e}) before it was ready"))),
                None => Ok(()),
            }
        })
    }
    fn exchange(&self, req: &reqwest::Request) -> Option<crate::launcher::Exchange> {
        self.answerer.as_ref().map(|a| a(self, req))
    }
    fn stop(&self, _grace: Duration) -> BoxFuture<'_, ()> {
        self.exit_with(ExitInfo { code: None, signal: Some(15) });
        Box::pin(async {})
    }
}

/// The engine over `catalogue` with `launcher`'s backends, as in-process tests and the
/// simulation make it: its prompt cache under `cfg`'s cache dir, a fresh connection pool.
pub fn engine(cfg: crate::Config, catalogue: Catalogue, launcher: Arc<dyn crate::Launcher>) -> crate::Engine {
    let store = host::prompt_cache::Store::open(&cfg.cache_dir.join("prompt-cache"));
    crate::Engine::with_launcher(
        Arc::new(cfg),
        Arc::new(catalogue),
        launcher,
        Default::default(),
        store,
        crate::backend_client(),
    )
}

/// A catalogue of downloaded extra models, `extra.<name>` for each of `names` (no file
/// behind them: the fake launcher needs none); its own files (saved options, user models,
/// aliases) are read from and written to `cache_dir`.
pub fn catalogue_at(cache_dir: &std::path::Path, names: &[&str]) -> Catalogue {
    catalogue_with(cache_dir, names, &[])
}

/// [`catalogue_at`] with the Hugging Face repositories `repos` downloaded too (each with the
/// files named), so the built-in models of those repositories count as downloaded.
pub fn catalogue_with(cache_dir: &std::path::Path, names: &[&str], repos: &[(&str, &[&str])]) -> Catalogue {
    let repos: HashMap<String, Vec<String>> =
        repos.iter().map(|(r, f)| (r.to_string(), f.iter().map(|f| f.to_string()).collect())).collect();
    scanned(cache_dir, "/nonexistent/hub".as_ref(), names, Arc::new(AllThere(repos)))
}

/// [`catalogue_at`] over a real Hugging Face cache at `hf_cache` (the simulation's pulls
/// write it): a model of the Hub counts as downloaded when its files are there and complete.
pub fn catalogue_over_hub(cache_dir: &std::path::Path, hf_cache: &std::path::Path, names: &[&str]) -> Catalogue {
    scanned(cache_dir, hf_cache, names, Arc::new(HubCache(hf_cache.to_path_buf())))
}

/// The fake extra models of `names` (always there) beside the Hub's models as `files` sees them.
fn scanned(
    cache_dir: &std::path::Path,
    hf_cache: &std::path::Path,
    names: &[&str],
    files: Arc<dyn registry::ModelFiles + Send + Sync>,
) -> Catalogue {
    let dir = std::path::PathBuf::from(FAKE_MODELS);
    let found: Vec<registry::ExtraFile> =
        names.iter().map(|n| registry::ExtraFile { path: dir.join(n), bytes: 1 << 20 }).collect();
    let cfg = host::catalogue::CatalogueConfig {
        cache_dir: cache_dir.to_path_buf(),
        hf_cache: hf_cache.to_path_buf(),
        extra_models_dir: Some(dir.clone()),
        physical_memory_gb: None,
        disable_filtering: true,
    };
    let scan = move |cfg: &host::catalogue::CatalogueConfig| {
        let user = registry::UserFiles { extra_files: found.clone(), ..host::catalogue::own_files(cfg)? };
        let rc = registry::RegistryConfig {
            extra_models_dir: Some(dir.clone()),
            disable_filtering: true,
            ..Default::default()
        };
        Ok(registry::Registry::build(&rc, user, files.as_ref())?)
    };
    Catalogue::with_scanner(cfg, Box::new(scan)).expect("the fake catalogue builds")
}

/// Where the fake extra models are (no file is behind them).
const FAKE_MODELS: &str = "/fake-models";

/// A real Hugging Face cache (its files' GGUF headers not read); the fake extra models complete.
struct HubCache(std::path::PathBuf);

impl registry::ModelFiles for HubCache {
    fn snapshots(&self, repo: &str) -> Vec<registry::Snapshot> {
        host::hf_cache::snapshots(&self.0, repo)
    }
    fn is_complete(&self, file: &std::path::Path) -> bool {
        file.starts_with(FAKE_MODELS) || host::hf_cache::is_complete(file)
    }
    fn gguf_meta(&self, _file: &std::path::Path) -> Option<registry::gguf::GgufMeta> {
        None
    }
}

/// A cache in which every file is complete (and has no GGUF header to read).
/// The repositories named are downloaded with their files.
struct AllThere(HashMap<String, Vec<String>>);

impl registry::ModelFiles for AllThere {
    fn snapshots(&self, repo: &str) -> Vec<registry::Snapshot> {
        let dir = std::path::Path::new("/fake-hub").join(repo.replace('/', "--"));
        self.0.get(repo).map(|files| vec![registry::Snapshot { dir, files: files.clone() }]).unwrap_or_default()
    }
    fn is_complete(&self, _file: &std::path::Path) -> bool {
        true
    }
    fn gguf_meta(&self, _file: &std::path::Path) -> Option<registry::gguf::GgufMeta> {
        None
    }
}
