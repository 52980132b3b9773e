//! Keyed async locks that serialize the work on one thing: downloads into a repository
//! (`repo:org/name`), installs of a backend (`backend:recipe:backend`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// One async lock per key, created on first use.
#[derive(Debug, Default)]
pub struct Locks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Locks {
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0.lock().entry(key.to_string()).or_default().clone()
    }
}
