//! The scheduler explains itself: `GET /scheduler` (its ledgers, models and why each stays,
//! the load queue, the latest decisions), `POST /scheduler/plan` (a dry run of a `/load`) and
//! `GET /scheduler/events` (each decision as it is taken, as SSE). The state and the decisions
//! are `engine::explain`'s.

use std::convert::Infallible;

use api_types::*;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use bytes::Bytes;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// The scheduler's state.
#[utoipa::path(get, path = "/api/v1/scheduler", tag = "Lemonade")]
pub async fn state(State(rt): State<AppState>) -> Json<SchedulerState> {
    Json(engine::explain::state(&rt.engine))
}

/// A dry run of a load.
#[utoipa::path(post, path = "/api/v1/scheduler/plan", tag = "Lemonade", request_body = LoadRequest)]
pub async fn plan(State(rt): State<AppState>, body: JsonBody<LoadRequest>) -> Result<Json<SchedulerPlan>, ApiError> {
    Ok(Json(engine::explain::plan(&rt.engine, &body.value, crate::error::rejection_words).await?))
}

/// The scheduler's decisions as they are taken.
#[utoipa::path(get, path = "/api/v1/scheduler/events", tag = "Lemonade")]
pub async fn events(State(rt): State<AppState>) -> Response {
    let rx = rt.engine.lifecycle().explain.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = match rx.recv().await {
            Ok(d) => format!("data: {}\n\n", serde_json::to_string(&d).unwrap_or_default()),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => format!(": lagged {n}\n\n"),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(Bytes::from(chunk)), rx))
    });
    let first =
        futures_util::stream::once(async { Ok::<_, Infallible>(Bytes::from_static(b": scheduler events\n\n")) });
    crate::sse::response(rt.engine.lifecycle(), futures_util::StreamExt::chain(first, stream))
}
