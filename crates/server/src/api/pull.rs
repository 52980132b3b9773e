//! `pull` and `delete`: download models from the Hub into the huggingface_hub cache (with
//! `user.*` registration), and remove them.

use api_types::*;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::sse;
use crate::state::AppState;
use engine::pulls;

/// Downloads a model (registering a `user.*` model first when `checkpoint` and `recipe` are given).
#[utoipa::path(post, path = "/api/v1/pull", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Files go to the Hugging Face cache in huggingface_hub's layout; a \
                   partial download resumes. With `stream: true` the answer is SSE: `event: progress` (PullProgress), \
                   one `event: complete`, or `event: error` with `{\"error\": message}`. A client that disconnects \
                   cancels the download (the partial file stays for a later pull). With `stream: true` and \
                   `subscribe: false` the download is a server-owned job (Lemonade v11): the answer is its snapshot \
                   (DownloadJob) at once, and `GET /v1/downloads` follows it.",
    request_body = PullRequest,
    responses(
        (status = 200, description = "Downloaded (or SSE events)", body = StatusResponse),
        (status = 400, description = "Invalid name, checkpoint or variant", body = ErrorResponse),
        (status = 404, description = "Not available on this system", body = ErrorResponse),
        (status = 502, description = "The download failed", body = ErrorResponse),
        (status = 507, description = "The disk is full (the partial download is kept)", body = ErrorResponse),
    ))]
pub async fn pull(State(rt): State<AppState>, body: JsonBody<PullRequest>) -> Result<Response, ApiError> {
    let req = body.value;
    if engine::router::is_collection_pull(&req) {
        let name = engine::router::register(&rt.engine, &req).await?;
        return Ok(
            Json(StatusResponse { status: "success".into(), model_name: Some(name), message: None }).into_response()
        );
    }
    let m = pulls::resolve(&rt.engine, &req).await?;
    if req.do_not_upgrade == Some(true) && m.downloaded {
        return Ok(
            Json(StatusResponse { status: "success".into(), model_name: Some(m.name), message: None }).into_response()
        );
    }
    if req.stream == Some(true) && req.subscribe == Some(false) {
        return Ok(Json(engine::jobs::start(&rt.engine, m)).into_response());
    }
    if req.stream != Some(true) {
        pulls::pull_now(&rt.engine, &m).await?;
        return Ok(
            Json(StatusResponse { status: "success".into(), model_name: Some(m.name), message: None }).into_response()
        );
    }
    Ok(sse::events(rt.engine.lifecycle(), pulls::pull_in_background(&rt.engine, m)))
}

/// Removes a model's files (and a `user.*` registration), unloading it first.
#[utoipa::path(post, path = "/api/v1/delete", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Removes the model's whole `models--org--repo` folder from the \
                   Hugging Face cache (every variant of that repository), and a `user.*` model's registration.",
    request_body = DeleteRequest,
    responses(
        (status = 200, description = "Deleted", body = StatusResponse),
        (status = 400, description = "No name, or an extra.* model (files in the extra models dir are not deleted)", body = ErrorResponse),
        (status = 422, description = "Unknown model", body = ErrorResponse),
    ))]
pub async fn delete(
    State(rt): State<AppState>,
    body: JsonBody<DeleteRequest>,
) -> Result<Json<StatusResponse>, ApiError> {
    let name = body.value.model.or(body.value.model_name).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| ApiError::bad_request("Missing required field 'model'", Some("model")))?;
    if let Some(c) = rt.engine.catalogue().registry().collection(&name).cloned() {
        rt.engine.catalogue().unregister(&c.name).await?;
        let message = Some(format!("Deleted model: {}", c.name));
        return Ok(Json(StatusResponse { status: "success".into(), model_name: None, message }));
    }
    let m =
        rt.engine.catalogue().get(&name).map_err(|_| ApiError::Unprocessable(format!("Model not found: {name}")))?;
    pulls::delete(&rt.engine, &m).await?;
    Ok(Json(StatusResponse {
        status: "success".into(),
        model_name: None,
        message: Some(format!("Deleted model: {name}")),
    }))
}

/// Registers (or updates) a `user.*` model definition without downloading it.
#[utoipa::path(post, path = "/api/v1/models/register", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). The definition is checked as a pull's registration \
        is, saved in `user_models.json`, and the catalogue rescanned; nothing is downloaded (`POST /pull` does that). \
        Needs the admin key when one is set.",
    request_body = RegisterRequest,
    responses(
        (status = 200, description = "Registered", body = RegisterResponse),
        (status = 400, description = "A missing or invalid field (`param` names it)", body = ErrorResponse),
    ))]
pub async fn register(
    State(rt): State<AppState>,
    body: JsonBody<RegisterRequest>,
) -> Result<Json<RegisterResponse>, ApiError> {
    let m = engine::pulls::register(&rt.engine, &body.value).await?;
    let id = engine::pulls::public_id(&rt.engine, &m);
    Ok(Json(RegisterResponse {
        status: "success".into(),
        model_name: id.clone(),
        canonical_model_name: m.name.clone(),
        model: RegisteredModel { id, recipe: m.recipe.to_string(), downloaded: m.downloaded },
    }))
}

/// The GGUF variants of a Hugging Face repository, to choose what to pull.
#[utoipa::path(get, path = "/api/v1/pull/variants", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Reads the repository's file listing on the Hub \
        (`HF_TOKEN` is sent when set): at most 5 variants, the most used quantizations first; each `name` after `:` \
        in a checkpoint pulls exactly its `files`.",
    params(VariantsQuery),
    responses(
        (status = 200, description = "The variants", body = PullVariants),
        (status = 400, description = "A missing or malformed `checkpoint`", body = ErrorResponse),
        (status = 404, description = "No such repository on the Hub (`not_found`)", body = ErrorResponse),
        (status = 500, description = "The Hub could not be read", body = ErrorResponse),
    ))]
pub async fn variants(
    State(rt): State<AppState>,
    Query(q): Query<VariantsQuery>,
) -> Result<Json<PullVariants>, ApiError> {
    Ok(Json(engine::pulls::variants(&rt.engine, q.checkpoint.as_deref()).await?))
}

/// Searches Hugging Face for model repositories.
#[utoipa::path(get, path = "/api/v1/registry/search", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Candidate repositories from the Hub's metadata, most \
        downloaded first; `/v1/pull/variants` checks a candidate's files.",
    params(SearchQuery),
    responses(
        (status = 200, description = "The results", body = SearchResults),
        (status = 400, description = "A query under 3 characters, or a bad `source`, `limit` or `format`", body = ErrorResponse),
        (status = 429, description = "The Hub rate-limited the search (`rate_limited`)", body = ErrorResponse),
        (status = 502, description = "The Hub failed (its status named)", body = ErrorResponse),
    ))]
pub async fn search(State(rt): State<AppState>, Query(q): Query<SearchQuery>) -> Result<Json<SearchResults>, ApiError> {
    Ok(Json(engine::pulls::search(&rt.engine, &q).await?))
}

/// Checks downloaded models for newer upstream commits.
#[utoipa::path(post, path = "/api/v1/models/check-updates", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Asks the Hub, once per repository, whether `main` \
        points past the commit each downloaded model was pulled at (recorded in the repository's \
        `.lemonade_registry.json`, else the cache's `refs/main`); a repository that cannot be asked counts as \
        updated. Downloads nothing.",
    responses((status = 200, description = "The models with an update", body = CheckUpdates)))]
pub async fn check_updates(State(rt): State<AppState>) -> Result<Json<CheckUpdates>, ApiError> {
    Ok(Json(engine::pulls::check_updates(&rt.engine).await?))
}

/// Server-owned download jobs.
#[utoipa::path(get, path = "/api/v1/downloads", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Jobs started by `POST /v1/pull` with `stream: true, \
        subscribe: false`: running, paused, cancelled and failed ones until removed, completed ones for a minute. \
        They survive a restart (an unfinished one is listed as paused).",
    responses((status = 200, description = "The jobs", body = [DownloadJob])))]
pub async fn downloads(State(rt): State<AppState>) -> Json<Vec<DownloadJob>> {
    Json(rt.engine.downloads().list())
}

/// Pauses, resumes, cancels or removes a download job.
#[utoipa::path(post, path = "/api/v1/downloads/control", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). `pause` and `cancel` stop the worker at once (its \
        partial files stay, so `resume` continues with Range) and answer the job; `resume` starts it again; `remove` \
        drops a stopped job (`{\"status\":\"ok\"}`, with `\"missing\": true` when there was none) and cancels a \
        running one. Needs the admin key when one is set.",
    request_body = DownloadControl,
    responses(
        (status = 200, description = "The job, or {\"status\":\"ok\"} for a removal", body = DownloadJob),
        (status = 400, description = "A missing id or an unknown action", body = ErrorResponse),
        (status = 404, description = "No such job (`not_found`)", body = ErrorResponse),
    ))]
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
