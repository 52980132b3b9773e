//! `pull` and `delete`: download models from the Hub into the huggingface_hub cache (with
//! `user.*` registration), and remove them.

use api_types::*;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::{ApiError, V11ApiError};
use crate::extract::{DialectJson, JsonBody};
use crate::sse;
use crate::state::AppState;
use engine::jobs::Pull;
use engine::pulls;

/// Downloads a model (registering a `user.*` model first when `checkpoint` and `recipe` are given).
#[utoipa::path(post, path = "/api/v1/pull", tag = "Lemonade", request_body = PullRequest)]
pub async fn pull(
    State(rt): State<AppState>,
    body: DialectJson<PullRequest, V11ApiError>,
) -> Result<Response, V11ApiError> {
    let req = body.value;
    let done = |name| Json(StatusResponse { status: "success".into(), model_name: Some(name), message: None });
    Ok(match engine::jobs::pull(&rt.engine, &req).await? {
        Pull::Done(name) => done(name).into_response(),
        Pull::Job(job) => Json(job).into_response(),
        Pull::Events(events) => sse::events(rt.engine.lifecycle(), events),
    })
}

/// Removes a model's files (and a `user.*` registration), unloading it first.
#[utoipa::path(post, path = "/api/v1/delete", tag = "Lemonade", request_body = DeleteRequest)]
pub async fn delete(
    State(rt): State<AppState>,
    body: JsonBody<DeleteRequest>,
) -> Result<Json<StatusResponse>, ApiError> {
    let name = body.value.model.or(body.value.model_name).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| ApiError::bad_request("Missing required field 'model'", Some("model")))?;
    let deleted = match pulls::delete_named(&rt.engine, &name).await {
        Err(engine::EngineError::Lookup(_)) => return Err(ApiError::Unprocessable(format!("Model not found: {name}"))),
        r => r?,
    };
    let message = Some(format!("Deleted model: {deleted}"));
    Ok(Json(StatusResponse { status: "success".into(), model_name: None, message }))
}

/// Registers (or updates) a `user.*` model definition without downloading it.
#[utoipa::path(post, path = "/api/v1/models/register", tag = "Lemonade", request_body = RegisterRequest)]
pub async fn register(
    State(rt): State<AppState>,
    body: JsonBody<RegisterRequest>,
) -> Result<Json<RegisterResponse>, ApiError> {
    let m = engine::pulls::register(&rt.engine, &body.value).await?;
    let id = engine::models::listed_name(&rt.engine, &m.name);
    Ok(Json(RegisterResponse {
        status: "success".into(),
        model_name: id.clone(),
        canonical_model_name: m.name.clone(),
        model: RegisteredModel { id, recipe: m.recipe.to_string(), downloaded: m.downloaded },
    }))
}

/// The GGUF variants of a Hugging Face repository, to choose what to pull.
#[utoipa::path(get, path = "/api/v1/pull/variants", tag = "Lemonade", params(VariantsQuery))]
pub async fn variants(
    State(rt): State<AppState>,
    Query(q): Query<VariantsQuery>,
) -> Result<Json<PullVariants>, V11ApiError> {
    Ok(Json(engine::pulls::variants(&rt.engine, &q).await?))
}

/// Searches Hugging Face for model repositories.
#[utoipa::path(get, path = "/api/v1/registry/search", tag = "Lemonade", params(SearchQuery))]
pub async fn search(
    State(rt): State<AppState>,
    Query(q): Query<SearchQuery>,
) -> Result<Json<SearchResults>, V11ApiError> {
    Ok(Json(engine::pulls::search(&rt.engine, &q).await?))
}

/// Checks downloaded models for newer upstream commits.
#[utoipa::path(post, path = "/api/v1/models/check-updates", tag = "Lemonade")]
pub async fn check_updates(State(rt): State<AppState>) -> Result<Json<CheckUpdates>, ApiError> {
    Ok(Json(engine::pulls::check_updates(&rt.engine).await?))
}

/// Server-owned download jobs.
#[utoipa::path(get, path = "/api/v1/downloads", tag = "Lemonade")]
pub async fn downloads(State(rt): State<AppState>) -> Json<Vec<DownloadJob>> {
    Json(engine::jobs::list(&rt.engine))
}

/// Pauses, resumes, cancels or removes a download job.
#[utoipa::path(post, path = "/api/v1/downloads/control", tag = "Lemonade", request_body = DownloadControl)]
pub async fn control(State(rt): State<AppState>, body: JsonBody<DownloadControl>) -> Result<Response, ApiError> {
    let c = &body.value;
    if c.id.is_empty() {
        return Err(ApiError::bad_request("Missing required field 'id'", Some("id")));
    }
    let missing = rt.engine.downloads().get(&c.id).is_none();
    Ok(match engine::jobs::control(&rt.engine, &c.id, &c.action)? {
        Some(job) => Json(job).into_response(),
        None if missing => Json(serde_json::json!({"status": "ok", "missing": true})).into_response(),
        None => Json(serde_json::json!({"status": "ok"})).into_response(),
    })
}
