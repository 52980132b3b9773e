//! The state every handler gets: the runtime (see crate::runtime), which owns the model state,
//! the configuration, the registry and the keyed locks.

use std::sync::Arc;

pub use crate::locks::Locks;
pub use crate::runtime::Runtime;

/// What axum hands every handler.
pub type AppState = Arc<Runtime>;
