//! The owner task, the only place the scheduler's machine runs, and what carries out its
//! effects: starts, stops, the published views, the watchers of each backend (exit, health,
//! memory).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

use api_types::Stats;
use parking_lot::Mutex;
use scheduler::{Effect, Event, LoadError, Machine, Pool, ReqId};
use tokio::sync::mpsc;

use super::views::{ModelView, Running, SchedulerView};
use super::{Answer, Lifecycle, Msg, Opts, PlanAsk};
use crate::launcher::{Health, Launcher, StartFailure};

/// Failed health probes in a row after which a backend counts as wedged and is killed.
pub(super) const WATCHDOG_STRIKES: u32 = 3;

impl Lifecycle {
    pub(super) fn answer(&self, req: ReqId, a: Answer) -> bool {
        let tx = self.answers.lock().remove(&req);
        match tx {
            Some(tx) => tx.send(a).is_ok(),
            None => false,
        }
    }

    pub(super) fn publish(&self, m: &Machine<Opts>) {
        let view = m
            .entries()
            .map(|e| {
                let v = ModelView {
                    state: e.state,
                    helper: e.helper,
                    in_flight: e.in_flight.len(),
                    queue_depth: e.queue_depth(),
                    waiting_since: m.waiting_since(&e.model.name),
                    waiting_priorities: m.waiting_priorities(&e.model.name),
                    last_use: e.last_use,
                    last_error: e.last_error.clone(),
                    pinned: e.pinned,
                    idle_timeout: m.idle_timeout_of(e),
                    unload_at: m.unload_at(e),
                    memory: e.memory,
                    vram: e.vram,
                    estimate: e.memory.min(e.model.memory),
                    devices: e.shares.clone(),
                    max_concurrent: e.max_concurrent,
                };
                (e.model.name.clone(), v)
            })
            .collect();
        *self.view.write() = view;
        *self.scheduler_view.write() = SchedulerView {
            settings: m.settings(),
            memory_in_use: m.in_use(Pool::Memory),
            vram_in_use: m.in_use(Pool::Vram),
            load_queue: m.load_queue(),
            limits: m.limits().clone(),
        };
    }

    pub(super) fn execute(self: &Arc<Self>, e: Effect<Opts>) {
        match e {
            Effect::Start { model, options, devices } => {
                // Known as starting before any later effect runs, so a stop can cancel it.
                let (cancel, cancelled) = tokio::sync::watch::channel(false);
                self.models.change(&model, |r| r.start = Some(cancel));
                let rt = self.clone();
                let span = tracing::debug_span!(target: "lemonade::spans", "load", model = %model);
                tokio::spawn(tracing::Instrument::instrument(
                    async move {
                        let placed = crate::devices::placed(&rt.devices, &devices);
                        let result = rt.start(&model, options, placed, cancelled).await.map_err(load_error);
                        rt.models.change(&model, |r| r.start = None);
                        let _ = rt.tx.send(Event::Started { model, result }.into());
                    },
                    span,
                ));
            }
            Effect::Stop { model } => {
                let rt = self.clone();
                tokio::spawn(async move {
                    let r = rt.models.change(&model, |m| {
                        let r = m.running.take();
                        if r.is_none() {
                            // Not spawned yet: the start sees this and gives up.
                            if let Some(c) = &m.start {
                                c.send_replace(true);
                            }
                        }
                        r
                    });
                    if let Some(r) = r {
                        tracing::info!(model = %model, "stopping backend");
                        rt.save_and_stop(&r).await;
                    }
                    let _ = rt.tx.send(Event::Stopped { model }.into());
                });
            }
            Effect::Grant { req, .. } => {
                #[cfg(feature = "testing")]
                if crate::mutation::on(crate::mutation::Mutation::HungUpWaitKept) {
                    self.answer(req, Answer::Granted);
                    return;
                }
                if !self.answer(req, Answer::Granted) {
                    // Nobody waits any more: give the model back.
                    let _ = self.tx.send(Event::Release { req }.into());
                }
            }
            Effect::Reject { req, why, .. } => {
                self.answer(req, Answer::Rejected(why));
            }
            Effect::LoadDone { req, result, .. } => {
                self.answer(req, Answer::Load(result));
            }
            Effect::UnloadDone { req, result } => {
                self.answer(req, Answer::Unload(result));
            }
            Effect::PinDone { req, result } => {
                self.answer(req, Answer::Pin(result));
            }
            Effect::Configured { req } => {
                self.answer(req, Answer::Configured);
            }
        }
    }

    /// Starts the backend of `name`; the process is registered as soon as it exists so a
    /// stop can cancel the start.
    pub(super) async fn start(
        self: &Arc<Self>,
        name: &str,
        options: Opts,
        devices: Vec<backends::devices::Placed>,
        mut cancel: tokio::sync::watch::Receiver<bool>,
    ) -> std::result::Result<(), StartFailure> {
        let info = self.catalogue.get(name).map_err(|e| StartFailure::Fatal(e.to_string()))?;
        let draft =
            crate::draft::check(&self.catalogue, &info, &options).map_err(|e| StartFailure::Fatal(e.to_string()))?;
        let with = crate::launcher::StartWith { devices, draft: draft.and_then(|d| d.main_path) };
        let cancelled = || StartFailure::NotReady("the load was cancelled by an unload".into());
        let shutting_down = || StartFailure::NotReady("lemonade is shutting down".into());
        if self.closing_for_starts() {
            return Err(shutting_down());
        }
        // Preparing may install the binary (minutes): an unload meanwhile cancels the load at
        // once, while the install itself runs on to the end.
        let launched_with = self.with_ctx_resolved(&info, &options);
        let prepared = tokio::select! {
            p = self.launcher.prepare(&info, &launched_with, &with) => p?,
            _ = cancel.wait_for(|c| *c) => return Err(cancelled()),
        };
        let started = Instant::now();
        let spec = &prepared.spec;
        // The program by its name (where lemonade keeps or finds it is its own business).
        let program = spec.program.file_name().map_or_else(|| "backend".into(), |n| n.to_string_lossy().to_string());
        let command = std::iter::once(program).chain(spec.args.iter().map(|a| self.cfg.redact_here(a))).collect();
        let env = spec.env.iter().cloned().collect();
        let backend = self.launcher.spawn(name, prepared.spec)?;
        let running = Arc::new(Running {
            info,
            backend: backend.clone(),
            // As started: automatic slots and context resolved.
            options: launched_with,
            stats: Mutex::new(Stats::default()),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            wedged: std::sync::atomic::AtomicBool::new(false),
            lost_worker: std::sync::OnceLock::new(),
            reported: tokio::sync::watch::channel(false).0,
            cache: prepared.cache,
            command,
            env,
            streams: Default::default(),
            measured: Default::default(),
            measured_vram: Default::default(),
        });
        // Registered unless a stop came first (it found no process): checked under the lock the
        // stop takes, so one of the two always sees the other.
        // Nor after shutdown began: `shutdown` stops what is registered once `closing` is set,
        // so a backend registered later would outlive it.
        let registered = self.models.change(name, |m| {
            let go = !*cancel.borrow() && !self.closing_for_starts();
            if go {
                m.running = Some(running.clone());
            }
            go
        });
        if !registered {
            tracing::info!(model = %name, "load cancelled while starting: stopping the new backend");
            backend.stop(self.cfg.stop_grace).await;
            return Err(if self.is_closing() { shutting_down() } else { cancelled() });
        }
        if let Err(e) = backend.ready().await {
            self.unregister(name, &running);
            return Err(StartFailure::NotReady(self.redact(e.message())));
        }
        tracing::info!(model = %name, ms = started.elapsed().as_millis() as u64, port = backend.port(), "model loaded");
        self.metrics.loaded(name, started.elapsed());
        self.watch(name.to_string(), running);
        Ok(())
    }

    /// Whether shutdown began, so a start must not leave a backend behind.
    fn closing_for_starts(&self) -> bool {
        #[cfg(feature = "testing")]
        if crate::mutation::on(crate::mutation::Mutation::StartAfterShutdown) {
            return false;
        }
        self.is_closing()
    }

    pub(super) fn unregister(&self, name: &str, r: &Arc<Running>) -> bool {
        self.models.change(name, |m| {
            let current = m.running.as_ref().is_some_and(|x| Arc::ptr_eq(x, r));
            if current {
                m.running = None;
            }
            current
        })
    }

    /// Reports a backend that exits on its own (a stop unregisters it first), and kills one
    /// that stops answering its health endpoint (a wedged process), which then reports the same.
    pub(super) fn watch(self: &Arc<Self>, name: String, r: Arc<Running>) {
        if let Some(interval) = self.cfg.watchdog_interval {
            let launcher = self.launcher.clone();
            tokio::spawn(watchdog(launcher, interval, self.cfg.stop_grace, name.clone(), r.clone()));
        }
        tokio::spawn(measure(Arc::downgrade(self), name.clone(), r.clone()));
        let rt = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = r.backend.wait_exit().await;
            let Some(rt) = rt.upgrade() else { return };
            // Still registered while its last output drains, so a request granted meanwhile
            // finds the exited process and waits for `reported` (see `acquire`).
            r.backend.output_drained().await;
            if rt.unregister(&name, &r) {
                let tail = r.backend.log_tail();
                tracing::error!(model = %name, status = %exit, "backend died");
                rt.metrics.crashed(&name);
                let program = r.info.recipe.dir_and_exe().1;
                let error = if let Some((w, why)) = r.lost_worker.get() {
                    format!("its RPC worker {w} is gone ({why}); {program} was stopped ({exit}). The next request loads it again")
                } else if r.wedged.load(Ordering::SeqCst) {
                    format!("{program} stopped answering its health checks and was killed ({exit}). Last log lines:\n{tail}")
                } else {
                    format!("{program} exited unexpectedly ({exit}). Last log lines:\n{tail}")
                };
                let _ = rt.tx.send(Event::Exited { model: name, error: rt.redact(&error) }.into());
            }
            r.reported.send_replace(true);
        });
    }
}

/// How often a running backend's memory is read.
pub(super) const MEASURE_EVERY: Duration = Duration::from_secs(1);
/// A change of measured memory smaller than this is not told to the scheduler.
pub(super) const MEASURE_STEP: u64 = 4 << 20;

/// Reads a running backend's memory every [`MEASURE_EVERY`] while it is registered, keeps it in
/// `r.measured` (its GPU memory in `r.measured_vram`), and tells the owner when either moved by
/// [`MEASURE_STEP`] or more (the machine counts it where it passes the estimate).
pub(super) async fn measure(rt: std::sync::Weak<Lifecycle>, name: String, r: Arc<Running>) {
    let (mut told, mut told_vram) = (0u64, 0u64);
    loop {
        let Some(lc) = rt.upgrade() else { return };
        let current = lc.models.is_current(&name, &r);
        if !current || r.backend.exit_status().is_some() {
            return;
        }
        if let Some(bytes) = lc.launcher.vram_of(r.backend.as_ref()) {
            r.measured_vram.store(bytes, Ordering::Relaxed);
            if bytes.abs_diff(told_vram) >= MEASURE_STEP {
                told_vram = bytes;
                let _ = lc.tx.send(Event::MeasuredVram { model: name.clone(), vram: bytes }.into());
            }
        }
        if let Some(bytes) = lc.launcher.memory_of(r.backend.as_ref()) {
            r.measured.store(bytes, Ordering::Relaxed);
            if bytes.abs_diff(told) >= MEASURE_STEP {
                told = bytes;
                let _ = lc.tx.send(Event::Measured { model: name.clone(), memory: bytes }.into());
            }
        }
        drop(lc);
        tokio::time::sleep(MEASURE_EVERY).await;
    }
}

/// The owner task: the only place the state machine runs.
pub(super) async fn owner(
    rt: Weak<Lifecycle>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    mut plans: mpsc::UnboundedReceiver<PlanAsk>,
    mut machine: Machine<Opts>,
) {
    let Some(epoch) = rt.upgrade().map(|r| r.epoch) else { return };
    loop {
        // The machine's next idle deadline is the only timer: a `Tick` when it is due (none for
        // a deadline beyond what the clock can hold).
        let deadline = machine.next_deadline().and_then(|ms| epoch.checked_add(Duration::from_millis(ms)));
        let due = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let ev = tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Event(ev)) => Some(ev),
                Some(Msg::Settle(done)) => {
                    // Every message before it has been handled and published.
                    let _ = done.send(());
                    continue;
                }
                None => None,
            },
            Some((model, options, answer)) = plans.recv() => {
                // A dry run on a copy: nothing changes, nothing is published.
                let _ = answer.send(machine.plan(model, options, epoch.elapsed().as_millis() as u64));
                continue;
            }
            _ = due => Some(Event::Tick),
        };
        let Some(ev) = ev else { return };
        let Some(rt) = rt.upgrade() else { return };
        let now = rt.now_ms();
        let effects = machine.handle(ev, now);
        for d in machine.take_decisions() {
            rt.explain.record(d, now, &rt.metrics);
        }
        rt.publish(&machine);
        for e in effects {
            rt.execute(e);
        }
    }
}

/// Probes a running backend every `interval` (through the launcher: its health endpoint, and
/// its RPC workers); after [`WATCHDOG_STRIKES`] failed probes in a row (no answer within the
/// interval, or an error status) the process is killed, and at once when a worker is gone.
pub(super) async fn watchdog(
    launcher: Arc<dyn Launcher>,
    interval: Duration,
    grace: Duration,
    name: String,
    r: Arc<Running>,
) {
    let mut strikes = 0;
    loop {
        tokio::select! {
            _ = r.backend.wait_exit() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match launcher.probe(r.backend.as_ref(), &r.options, interval).await {
            Health::Ok => strikes = 0,
            Health::Unhealthy => strikes += 1,
            Health::WorkerGone(worker, why) => {
                tracing::error!(model = %name, worker = %worker, error = %why, "an RPC worker of the model is gone; stopping its llama-server");
                let _ = r.lost_worker.set((worker, why));
                r.backend.stop(grace.min(Duration::from_millis(100))).await;
                return;
            }
        }
        if strikes >= WATCHDOG_STRIKES {
            tracing::error!(model = %name, strikes, "backend stopped answering its health checks; killing it");
            r.wedged.store(true, Ordering::SeqCst);
            r.backend.stop(grace.min(Duration::from_millis(100))).await;
            return;
        }
    }
}

/// A start failure as the scheduler's failure policy reads it: only a process that started and
/// did not become ready may be retried after evicting others.
pub(super) fn load_error(f: StartFailure) -> LoadError {
    match f {
        StartFailure::Fatal(m) => LoadError::fatal(m),
        StartFailure::NotReady(m) => LoadError::not_ready(m),
    }
}
