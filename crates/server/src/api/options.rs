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
#[utoipa::path(get, path = "/api/v1/models/{id}/options", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). `effective` and `defaults` are complete `/load` \
        bodies: every option the model's recipe takes, resolved through request > saved > server configuration > \
        recipe default. `resolved_ctx_size` is the context a load would use now (`ctx_size: -1` resolved).",
    params(("id" = String, Path, description = "Model id")),
    responses(
        (status = 200, description = "The options", body = ModelOptions),
        (status = 404, description = "Unknown model (`model_not_found`)", body = ErrorResponse),
    ))]
pub async fn get_options(rt: &AppState, id: &str) -> Result<Json<ModelOptions>, ApiError> {
    let info = rt.engine.catalogue().get(id)?;
    Ok(Json(engine::options::view(&rt.engine, &info)))
}

/// Saves options without loading the model: merged into its saved entry, `null` removes one.
#[utoipa::path(post, path = "/api/v1/models/{id}/options", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). The body is a flat object of the options `/load` \
        takes (`model_name` is ignored); keys not mentioned stay saved, `null` removes one. `dry_run: true` saves \
        nothing and answers with the options the save would give (`saved` still shows the file). A running model \
        keeps its options until it is next loaded. Needs the admin key when one is set.",
    params(("id" = String, Path, description = "Model id")),
    request_body(content = Object, description = "Options, e.g. {\"ctx_size\": 8192, \"llamacpp_args\": null}"),
    responses(
        (status = 200, description = "The options after the save", body = ModelOptions),
        (status = 400, description = "Unknown option, an option of another recipe, a value of the wrong type or out of range (`param` names it); nothing is saved", body = ErrorResponse),
        (status = 404, description = "Unknown model (`model_not_found`)", body = ErrorResponse),
    ))]
pub async fn save_options(rt: &AppState, id: &str, body: &Map<String, Value>) -> Result<Json<ModelOptions>, ApiError> {
    let info = rt.engine.catalogue().get(id)?;
    Ok(Json(engine::options::save(&rt.engine, &info, body).await?))
}

/// Erases the model's saved options.
#[utoipa::path(delete, path = "/api/v1/models/{id}/options", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Removes the model's `recipe_options.json` entry; \
        it then runs with the server's configuration and its recipe's defaults. Needs the admin key when one is set.",
    params(("id" = String, Path, description = "Model id")),
    responses(
        (status = 200, description = "The options after the reset (`saved` is {})", body = ModelOptions),
        (status = 404, description = "Unknown model (`model_not_found`)", body = ErrorResponse),
    ))]
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
#[utoipa::path(get, path = "/api/v1/models/{id}/files", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). Every shard of the main file and the projector, \
        with size and whether each exists; absolute paths only with `include_paths=true`.",
    params(("id" = String, Path, description = "Model id"), FilesQuery),
    responses(
        (status = 200, description = "The files", body = ModelFiles),
        (status = 404, description = "Unknown model (`model_not_found`)", body = ErrorResponse),
    ))]
pub async fn files(rt: &AppState, id: &str, q: &FilesQuery) -> Result<Json<ModelFiles>, ApiError> {
    Ok(Json(engine::pulls::files(&rt.engine, id, q.include_paths.as_deref() == Some("true"))?))
}
