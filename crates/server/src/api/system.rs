//! `GET system-info` and `GET system-stats` (what they hold is `engine::system`'s), each read
//! off the async threads.

use api_types::{SystemInfo, SystemStats};
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;

use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct SystemInfoQuery {
    /// Add details: versions, paths, the backend binaries in use, free memory.
    #[serde(default)]
    pub verbose: Option<String>,
}

/// Hardware and backend states.
#[utoipa::path(get, path = "/api/v1/system-info", tag = "System", params(SystemInfoQuery))]
pub async fn system_info(State(rt): State<AppState>, Query(q): Query<SystemInfoQuery>) -> Json<SystemInfo> {
    let verbose = q.verbose.as_deref().is_some_and(|s| matches!(s, "true" | "1" | "yes"));
    let info = tokio::task::spawn_blocking(move || engine::system::info(&rt.engine, verbose)).await;
    Json(info.unwrap_or_default())
}

/// CPU (since the previous call) and memory use.
#[utoipa::path(get, path = "/api/v1/system-stats", tag = "System")]
pub async fn system_stats() -> Json<SystemStats> {
    let stats = tokio::task::spawn_blocking(engine::system::stats).await;
    Json(stats.unwrap_or_else(|e| SystemStats { error: Some(e.to_string()), ..Default::default() }))
}
