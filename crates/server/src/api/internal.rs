//! Lemonade v11's internal endpoints (`/internal/*`, at the root of the port, not under the
//! API prefixes): model aliases. They need the admin key when one is set.

use api_types::*;
use axum::extract::{Path, State};
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// Every alias and its target.
#[utoipa::path(get, path = "/internal/aliases", tag = "Lemonade",
    description = "Lemonade v11. Each alias (`aliases.json` in lemonade's cache dir) with its target and, when the \
        target is a model here, whether it is downloaded and its recipe. Needs the admin key when one is set.",
    responses((status = 200, description = "The aliases", body = AliasList)))]
pub async fn aliases(State(rt): State<AppState>) -> Json<AliasList> {
    Json(engine::aliases::list(&rt))
}

/// Creates an alias, or points it at another model.
#[utoipa::path(post, path = "/internal/aliases", tag = "Lemonade",
    description = "Lemonade v11. An alias works wherever a model name does (every dialect, `/load`, `/pin`, the \
        options API) and is listed in `/v1/models` under its own id while its target is. A model's own name always \
        wins over an alias, so an alias may not take one; the target need not exist yet. Needs the admin key when \
        one is set.",
    request_body = AliasRequest,
    responses(
        (status = 200, description = "Set", body = AliasResponse),
        (status = 400, description = "A missing or invalid `alias` or `target`, a reserved prefix, or the name of a model (`alias_conflict`)", body = ErrorResponse),
    ))]
pub async fn set_alias(
    State(rt): State<AppState>,
    body: JsonBody<AliasRequest>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::set(&rt, &body.value)?))
}

/// Removes an alias.
#[utoipa::path(delete, path = "/internal/aliases/{alias}", tag = "Lemonade",
    description = "Lemonade v11. Needs the admin key when one is set.",
    params(("alias" = String, Path, description = "The alias")),
    responses(
        (status = 200, description = "Removed", body = AliasResponse),
        (status = 404, description = "No such alias (`not_found`)", body = ErrorResponse),
    ))]
pub async fn delete_alias(
    State(rt): State<AppState>,
    Path(alias): Path<String>,
) -> Result<Json<AliasResponse>, ApiError> {
    Ok(Json(engine::aliases::remove(&rt, &alias)?))
}
