//! The state every handler gets: the runtime (see crate::runtime), and the keyed locks that
//! serialize work on one thing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::runtime::Runtime;

/// What axum hands every handler.
pub type AppState = Arc<Runtime>;

/// One async lock per key: downloads into a repository (`repo:org/name`), installs of a
/// backend (`backend:recipe:backend`).
#[derive(Debug, Default)]
pub struct Locks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Locks {
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default().clone()
    }
}
