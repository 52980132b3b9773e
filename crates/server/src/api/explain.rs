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
#[utoipa::path(get, path = "/api/v1/scheduler", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. The memory ledgers (system memory and VRAM: budget, in use, each \
        model's share), every model the scheduler holds with its state, requests in flight and waiting, and why it \
        stays (`resident`: pinned, serving, idle until its timeout, or kept until evicted), the load queue, the \
        loaded-model limits, and the latest 256 decisions with their reasons.",
    responses((status = 200, description = "The scheduler's state", body = SchedulerState)))]
pub async fn state(State(rt): State<AppState>) -> Json<SchedulerState> {
    Json(engine::explain::state(&rt.engine))
}

/// A dry run of a load.
#[utoipa::path(post, path = "/api/v1/scheduler/plan", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Takes `/load`'s body and says what that load would do now, \
        worked out on a copy of the scheduler: `loaded` (nothing to do), `load` (with the models it would evict), \
        `refused` (with the code and message `/load` would answer), or `waits` (for models to finish their requests \
        or for a load in progress). Nothing is loaded, evicted or saved.",
    request_body = LoadRequest,
    responses(
        (status = 200, description = "What the load would do", body = SchedulerPlan),
        (status = 400, description = "Invalid body or option", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
    ))]
pub async fn plan(State(rt): State<AppState>, body: JsonBody<LoadRequest>) -> Result<Json<SchedulerPlan>, ApiError> {
    Ok(Json(engine::explain::plan(&rt.engine, &body.value).await?))
}

/// The scheduler's decisions as they are taken.
#[utoipa::path(get, path = "/api/v1/scheduler/events", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Server-Sent Events: each decision (`load`, `evict`, `unload`, \
        `queue`, `reject`, `refuse`, `crash`, with its `reason`, `model` and `detail`) as one `data:` JSON event, from \
        now on (the latest ones are in `GET /scheduler`). A reader too slow for the stream gets a `: lagged N` comment \
        for the N decisions it missed.",
    responses((status = 200, description = "text/event-stream of SchedulerDecision")))]
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
