//! Per-model options (Lemonade v11): `GET`, `POST` and `DELETE /models/{id}/options`. They
//! share the catch-all `/models/{*id}` route with `GET /models/{id}` (ids may contain `/`), so
//! the route's POST and DELETE land here and answer 405 on any other model path.

use api_types::*;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// The model id of a `{id}/options` path.
fn options_of(path: &str, allowed: &str) -> Result<String, ApiError> {
    match path.strip_suffix("/options") {
        Some(id) if !id.is_empty() => Ok(id.to_string()),
        _ => Err(ApiError::MethodNotAllowed { allowed: allowed.into() }),
    }
}

/// A model's options by layer: `saved` (its `recipe_options.json` entry), `effective` (the
/// `/load` body a load uses now) and `defaults` (what `effective` is once `saved` is erased).
#[utoipa::path(
    get,
    path = "/api/v1/models/{id}/options",
    tag = "Lemonade",
    params(("id" = String, Path, description = "Model id"))
)]
pub async fn get_options(rt: &AppState, id: &str) -> Result<Json<ModelOptions>, ApiError> {
    let info = rt.engine.catalogue().get(id)?;
    Ok(Json(engine::options::view(&rt.engine, &info)))
}

/// Saves options without loading the model: merged into its saved entry, `null` removes one.
#[utoipa::path(
    post,
    path = "/api/v1/models/{id}/options",
    tag = "Lemonade",
    params(("id" = String, Path, description = "Model id")),
    request_body(content = Object, description = "Options, e.g. {\"ctx_size\": 8192, \"llamacpp_args\": null}")
)]
pub async fn save_options(rt: &AppState, id: &str, body: &Map<String, Value>) -> Result<Json<ModelOptions>, ApiError> {
    let info = rt.engine.catalogue().get(id)?;
    Ok(Json(engine::options::save(&rt.engine, &info, body).await?))
}

/// Erases the model's saved options.
#[utoipa::path(
    delete,
    path = "/api/v1/models/{id}/options",
    tag = "Lemonade",
    params(("id" = String, Path, description = "Model id"))
)]
pub async fn reset_options(rt: &AppState, id: &str) -> Result<Json<ModelOptions>, ApiError> {
    let info = rt.engine.catalogue().get(id)?;
    Ok(Json(engine::options::reset(&rt.engine, &info).await?))
}

/// POST on `/models/{*id}`: only `{id}/options` takes one.
pub async fn post_model_path(
    State(rt): State<AppState>,
    Path(path): Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<Json<ModelOptions>, ApiError> {
    let id = options_of(&path, "GET")?;
    save_options(&rt, &id, &body.value).await
}

/// DELETE on `/models/{*id}`: only `{id}/options` takes one.
pub async fn delete_model_path(
    State(rt): State<AppState>,
    Path(path): Path<String>,
) -> Result<Json<ModelOptions>, ApiError> {
    let id = options_of(&path, "GET")?;
    reset_options(&rt, &id).await
}

/// A model's resolved files.
#[utoipa::path(
    get,
    path = "/api/v1/models/{id}/files",
    tag = "Lemonade",
    params(("id" = String, Path, description = "Model id"), FilesQuery)
)]
pub async fn files(rt: &AppState, id: &str, q: &FilesQuery) -> Result<Json<ModelFiles>, ApiError> {
    Ok(Json(engine::pulls::files(&rt.engine, id, q.include_paths.as_deref() == Some("true"))?))
}
