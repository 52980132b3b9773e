//! Backend adapters and the process supervisor.
//!
//! * [`llamacpp`]: the `llama-server` command line for a model (pure).
//! * [`ryzenai`]: the `ryzenai-server` command line (pure).
//! * [`binary`]: where a backend's executable comes from.
//! * [`releases`]: the backend table, version pins, release archives and install states (pure).
//! * [`supervisor`]: runs a backend process, reports readiness and exit, stops it.

pub mod binary;
pub mod llamacpp;
pub mod releases;
pub mod ryzenai;
pub mod supervisor;

pub use supervisor::{Backend, ExitInfo, SpawnSpec, StartError};
