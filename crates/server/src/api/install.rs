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
use engine::cloud::{Installing, Uninstalled};

/// Downloads and installs a backend's pinned release.
#[utoipa::path(post, path = "/api/v1/install", tag = "Lemonade", request_body = InstallRequest)]
pub async fn install_route(State(rt): State<AppState>, body: JsonBody<InstallRequest>) -> Result<Response, ApiError> {
    Ok(match engine::cloud::install_request(&rt.engine, &body.value).await? {
        Installing::Provider(p) => Json(p).into_response(),
        Installing::Done(done) => Json(done).into_response(),
        Installing::Events(events) => sse::events(rt.engine.lifecycle(), events),
    })
}

/// Removes a managed backend, unloading the models that use it first.
#[utoipa::path(post, path = "/api/v1/uninstall", tag = "Lemonade", request_body = InstallRequest)]
pub async fn uninstall_route(State(rt): State<AppState>, body: JsonBody<InstallRequest>) -> Result<Response, ApiError> {
    Ok(match engine::cloud::uninstall_request(&rt.engine, &body.value).await? {
        Uninstalled::Provider(p) => Json(p).into_response(),
        Uninstalled::Done(done) => Json(done).into_response(),
    })
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
