//! `install` / `uninstall`: backend release archives into `<cache>/bin/<dir>/<backend>/`
//! (the transaction is `host::install`; see crate::installs).

use api_types::*;
use axum::extract::Path;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::sse;
use crate::state::AppState;
use engine::installs;

fn required(req: &InstallRequest) -> Result<(String, String), ApiError> {
    match (req.recipe.as_deref().filter(|s| !s.is_empty()), req.backend.as_deref().filter(|s| !s.is_empty())) {
        (Some(r), Some(b)) => Ok((r.to_string(), b.to_string())),
        _ => Err(ApiError::bad_request("Both 'recipe' and 'backend' are required", Some("recipe"))),
    }
}

/// Downloads and installs a backend's pinned release.
#[utoipa::path(post, path = "/api/v1/install", tag = "Lemonade", request_body = InstallRequest)]
pub async fn install_route(State(rt): State<AppState>, body: JsonBody<InstallRequest>) -> Result<Response, ApiError> {
    let req = body.value;
    if req.backend.as_deref() == Some(backends::cloud::RECIPE) && req.recipe.is_none() {
        return Ok(Json(engine::cloud::install_v11(&rt.engine, &req).await?).into_response());
    }
    let (recipe, backend) = required(&req)?;
    if recipe == backends::cloud::RECIPE {
        return Ok(Json(engine::cloud::install(&rt.engine, backend, &req).await?).into_response());
    }
    let p = installs::plan_for(rt.engine.cfg(), &recipe, &backend)?;
    if req.stream != Some(true) {
        let version = Some(installs::install_now(rt.engine.cfg(), rt.engine.locks(), &p).await?);
        return Ok(Json(InstallResponse {
            status: "success".into(),
            recipe,
            backend,
            version,
            message: None,
            upstream: None,
        })
        .into_response());
    }
    Ok(sse::events(rt.engine.lifecycle(), installs::install_in_background(rt.engine.cfg(), rt.engine.locks(), p)))
}

/// Removes a managed backend, unloading the models that use it first.
#[utoipa::path(post, path = "/api/v1/uninstall", tag = "Lemonade", request_body = InstallRequest)]
pub async fn uninstall_route(State(rt): State<AppState>, body: JsonBody<InstallRequest>) -> Result<Response, ApiError> {
    if body.value.backend.as_deref() == Some(backends::cloud::RECIPE) && body.value.recipe.is_none() {
        return Ok(Json(engine::cloud::uninstall_v11(&rt.engine, &body.value)?).into_response());
    }
    let (recipe, backend) = required(&body.value)?;
    let message = match recipe == backends::cloud::RECIPE {
        true => (!rt.engine.remotes().uninstall(&backend)?)
            .then(|| format!("No remote provider '{backend}'; nothing to remove")),
        false => rt.engine.uninstall_backend(&recipe, &backend).await?,
    };
    Ok(Json(InstallResponse { status: "success".into(), recipe, backend, version: None, message, upstream: None })
        .into_response())
}

/// Sets a cloud provider's API key, held in memory only.
#[utoipa::path(post, path = "/api/v1/cloud/auth", tag = "Lemonade", request_body = CloudAuthRequest)]
pub async fn cloud_auth(State(rt): State<AppState>, body: JsonBody<CloudAuthRequest>) -> Result<Response, ApiError> {
    let b = &body.value;
    if b.provider.is_empty() || b.api_key.is_empty() {
        let param = if b.provider.is_empty() { "provider" } else { "api_key" };
        return Err(ApiError::bad_request(format!("Missing required field '{param}'"), Some(param)));
    }
    let p = rt.engine.remotes().provider(&b.provider)?;
    if p.auth_state().0 {
        let env_var = backends::cloud::key_variable(&b.provider);
        let message = format!("{env_var} is set in the lemonade process; the env var takes precedence and the supplied API key was not stored.");
        let body = serde_json::json!({"error": {"type": "auth_conflict", "env_var": env_var, "message": message}});
        return Ok((http::StatusCode::CONFLICT, Json(body)).into_response());
    }
    Ok(Json(engine::cloud::auth(&rt.engine, &b.provider, &b.api_key, b.allow_insecure_http).await?).into_response())
}

/// Drops a cloud provider's key held in memory.
#[utoipa::path(
    delete,
    path = "/api/v1/cloud/auth/{provider}",
    tag = "Lemonade",
    params(("provider" = String, Path, description = "The provider"))
)]
pub async fn cloud_auth_clear(
    State(rt): State<AppState>,
    Path(provider): Path<String>,
) -> Result<Json<CloudAuth>, ApiError> {
    Ok(Json(engine::cloud::clear_auth(&rt.engine, &provider)?))
}

/// Remote providers (recipe `cloud`), their state and models.
#[utoipa::path(get, path = "/api/v1/cloud", tag = "Lemonade", params(api_types::CloudQuery))]
pub async fn cloud_list(
    State(rt): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<api_types::CloudQuery>,
) -> Json<api_types::UpstreamList> {
    if q.refresh.as_deref() == Some("true") {
        rt.engine.remotes().refresh().await;
    }
    Json(api_types::UpstreamList { upstreams: rt.engine.remotes().views() })
}
