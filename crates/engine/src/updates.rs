//! What the last update check found (`POST /models/check-updates`, or the one `serve` runs at
//! start with `--check-updates`): Lemonade v11's `update_check_done` in health and
//! `update_available` on each model of `/models`.

use std::collections::BTreeSet;

use parking_lot::RwLock;

/// `None` until a check completed; then the models with a newer commit on the Hub.
#[derive(Debug, Default)]
pub struct Updates(RwLock<Option<BTreeSet<String>>>);

impl Updates {
    pub fn record(&self, models: &[String]) {
        *self.0.write() = Some(models.iter().cloned().collect());
    }

    /// Whether a check has completed since the start.
    pub fn done(&self) -> bool {
        self.0.read().is_some()
    }

    /// Whether `model` has an update; `None` before any check.
    pub fn available(&self, model: &str) -> Option<bool> {
        self.0.read().as_ref().map(|s| s.contains(model))
    }
}
