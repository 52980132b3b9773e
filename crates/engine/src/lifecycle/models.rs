//! Each model's own record in the lifecycle, one map under one lock (as llama-swap's `Process`
//! owns its life): its backend, a start in progress, whether a `--preload` still waits for it,
//! the spillover places a load gave it, and its admin load override. A record with nothing in
//! it is dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::watch;

use super::views::Running;

#[derive(Default)]
pub(super) struct Record {
    /// Its backend, registered from spawn until it is stopped or exits, so a stop can always
    /// find it, including one still starting.
    pub(super) running: Option<Arc<Running>>,
    /// A start in progress whose process is not registered yet (resolving or installing the
    /// binary); set to true when a stop came meanwhile.
    pub(super) start: Option<watch::Sender<bool>>,
    /// A `--preload` waits for it: its place among the preloads.
    pub(super) preload: Option<usize>,
    /// The spillover places its last load gave it, over its saved ones (`[]`: none).
    pub(super) spillover: Option<Vec<String>>,
    /// The runtime-only admin load override it was loaded with.
    pub(super) load_override: Option<Value>,
}

impl Record {
    fn is_empty(&self) -> bool {
        self.running.is_none()
            && self.start.is_none()
            && self.preload.is_none()
            && self.spillover.is_none()
            && self.load_override.is_none()
    }
}

#[derive(Default)]
pub(super) struct Models(Mutex<BTreeMap<String, Record>>);

impl Models {
    /// Changes `name`'s record (made when it has none) as one step.
    pub(super) fn change<T>(&self, name: &str, f: impl FnOnce(&mut Record) -> T) -> T {
        let mut all = self.0.lock();
        let r = all.entry(name.to_string()).or_default();
        let out = f(r);
        if r.is_empty() {
            all.remove(name);
        }
        out
    }

    /// Reads `name`'s record (None: it has none).
    pub(super) fn read<T>(&self, name: &str, f: impl FnOnce(&Record) -> T) -> Option<T> {
        self.0.lock().get(name).map(f)
    }

    /// `name`'s registered backend.
    pub(super) fn running(&self, name: &str) -> Option<Arc<Running>> {
        self.read(name, |r| r.running.clone()).flatten()
    }

    /// Whether `r` is still `name`'s registered backend.
    pub(super) fn is_current(&self, name: &str, r: &Arc<Running>) -> bool {
        self.read(name, |x| x.running.as_ref().is_some_and(|x| Arc::ptr_eq(x, r))).unwrap_or(false)
    }

    /// Unregisters every backend (shutdown) and returns them.
    pub(super) fn take_all_running(&self) -> Vec<Arc<Running>> {
        let mut all = self.0.lock();
        let taken = all.values_mut().filter_map(|r| r.running.take()).collect();
        all.retain(|_, r| !r.is_empty());
        taken
    }

    /// The models a `--preload` still waits for, in their order.
    pub(super) fn preloads(&self) -> Vec<String> {
        let all = self.0.lock();
        let mut v: Vec<(usize, String)> = all.iter().filter_map(|(n, r)| Some((r.preload?, n.clone()))).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// `names` are the preloads from now on, in this order.
    pub(super) fn set_preloads(&self, names: &[String]) {
        let mut all = self.0.lock();
        for r in all.values_mut() {
            r.preload = None;
        }
        for (i, n) in names.iter().enumerate() {
            all.entry(n.clone()).or_default().preload = Some(i);
        }
        all.retain(|_, r| !r.is_empty());
    }
}
