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
#[utoipa::path(post, path = "/api/v1/install", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. With recipe `cloud`, registers a remote OpenAI-compatible \
        provider instead: `backend` is its name, `base_url` its API base, `api_key` its key (held in memory only; \
        else `LEMONADE_<NAME>_API_KEY`); its models are discovered and served as `<name>.<id>`. Otherwise: downloads the pinned release archive of `recipe:backend` for \
        this platform from `LEMONADE_RELEASES_URL` (default https://github.com), verifies it (the pinned sha256 \
        when `<cache>/backend_versions.json` carries one; the executable must run `--version`), and swaps it \
        into `<cache>/bin/<dir>/<backend>/` atomically: an interrupted install leaves the old backend. With \
        `stream: true` the answer is SSE like `pull` (one file); an installed pinned version answers one \
        `complete` event with 0 bytes.",
    request_body = InstallRequest,
    responses(
        (status = 200, description = "Installed (or SSE events)", body = InstallResponse),
        (status = 400, description = "Missing or unknown recipe/backend, or not installable here", body = api_types::ErrorResponse),
        (status = 502, description = "Download or verification failed; the old backend is unchanged", body = api_types::ErrorResponse),
    ))]
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
#[utoipa::path(post, path = "/api/v1/uninstall", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Idempotent, as in Lemonade: a backend that is not installed \
        answers 200 with a `message` saying there was nothing to remove.",
    request_body = InstallRequest,
    responses(
        (status = 200, description = "Uninstalled, or nothing to remove", body = InstallResponse),
        (status = 400, description = "Missing or unknown recipe/backend, or the `system` backend", body = api_types::ErrorResponse),
    ))]
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
#[utoipa::path(post, path = "/api/v1/cloud/auth", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). The key lives in this process only; the provider's \
        models are discovered again. When `LEMONADE_<PROVIDER>_API_KEY` is set it wins: 409 `auth_conflict`, and the \
        key given is not stored. Needs the admin key when one is set.",
    request_body = CloudAuthRequest,
    responses(
        (status = 200, description = "Stored", body = CloudAuth),
        (status = 400, description = "A missing or empty `provider` or `api_key`", body = ErrorResponse),
        (status = 404, description = "No such provider (`not_found`)", body = ErrorResponse),
        (status = 409, description = "The environment's key wins (`auth_conflict`, naming the variable)", body = Object),
    ))]
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
#[utoipa::path(delete, path = "/api/v1/cloud/auth/{provider}", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1 (Lemonade v11). The environment's key, if any, stays in effect; \
        without one the provider's models are dropped until a key is given. Needs the admin key when one is set.",
    params(("provider" = String, Path, description = "The provider")),
    responses(
        (status = 200, description = "Cleared", body = CloudAuth),
        (status = 404, description = "No such provider (`not_found`)", body = ErrorResponse),
    ))]
pub async fn cloud_auth_clear(
    State(rt): State<AppState>,
    Path(provider): Path<String>,
) -> Result<Json<CloudAuth>, ApiError> {
    Ok(Json(engine::cloud::clear_auth(&rt.engine, &provider)?))
}

/// Remote providers (recipe `cloud`), their state and models.
#[utoipa::path(get, path = "/api/v1/cloud", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Each provider registered with `install` (recipe `cloud`): its \
        base URL, `up`/`down`/`unknown`, its last probe, where its key comes from (never the key) and its models. \
        `refresh=true` probes every provider first (discovery also runs every `--remote-refresh` seconds).",
    params(api_types::CloudQuery),
    responses((status = 200, description = "Providers", body = api_types::UpstreamList)))]
pub async fn cloud_list(
    State(rt): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<api_types::CloudQuery>,
) -> Json<api_types::UpstreamList> {
    if q.refresh.as_deref() == Some("true") {
        rt.engine.remotes().refresh().await;
    }
    Json(api_types::UpstreamList { upstreams: rt.engine.remotes().views() })
}
