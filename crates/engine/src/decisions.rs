//! The scheduler's decisions (load, evict, unload, queue, reject, refuse, crash), each with its
//! reason: kept (the latest [`KEPT`]), counted in `/metrics`
//! (`lemonade_scheduler_decisions_total{decision, reason}`), logged and streamed to
//! subscribers (`/scheduler/events`).

use std::collections::VecDeque;

use api_types::SchedulerDecision;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::metrics::Metrics;

/// How many decisions `/scheduler` keeps.
pub const KEPT: usize = 256;

/// The decisions: the latest ones, and a stream for subscribers.
pub struct Log {
    recent: Mutex<VecDeque<SchedulerDecision>>,
    tx: broadcast::Sender<SchedulerDecision>,
}

impl Default for Log {
    fn default() -> Log {
        Log::new()
    }
}

impl Log {
    pub fn new() -> Log {
        Log { recent: Mutex::new(VecDeque::with_capacity(KEPT)), tx: broadcast::channel(KEPT).0 }
    }

    /// Keeps, counts, logs and streams one decision taken at `at_ms`.
    pub fn record(&self, d: scheduler::Decision, at_ms: u64, metrics: &Metrics) {
        metrics.scheduler_decision(d.decision, d.reason);
        match d.decision {
            "queue" | "reject" => {
                tracing::debug!(decision = d.decision, reason = d.reason, model = %d.model, detail = %d.detail, "scheduler")
            }
            _ => {
                tracing::info!(decision = d.decision, reason = d.reason, model = %d.model, detail = %d.detail, "scheduler")
            }
        }
        let d = wire(d, at_ms);
        let mut recent = self.recent.lock();
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(d.clone());
        drop(recent);
        let _ = self.tx.send(d);
    }

    /// The latest decisions, oldest first.
    pub fn recent(&self) -> Vec<SchedulerDecision> {
        self.recent.lock().iter().cloned().collect()
    }

    /// Every decision from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SchedulerDecision> {
        self.tx.subscribe()
    }
}

pub fn wire(d: scheduler::Decision, at_ms: u64) -> SchedulerDecision {
    SchedulerDecision { at_ms, decision: d.decision.into(), reason: d.reason.into(), model: d.model, detail: d.detail }
}
