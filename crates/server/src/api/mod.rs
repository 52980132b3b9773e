//! The HTTP handlers, one module per API area, each with its `#[utoipa::path]` documentation.
//! Handlers are thin: parse, call down (runtime, pulls, installs, proxy, host), answer.

pub mod admin;
pub mod anthropic;
pub mod audio;
pub mod explain;
pub mod images;
pub mod install;
pub mod internal;
pub mod lifecycle;
pub mod logs;
pub mod mcp;
pub mod metrics;
pub mod native;
pub mod ollama;
pub mod omni;
pub mod openai;
pub mod options;
pub mod pull;
pub mod router;
pub mod system;
