//! `install` / `uninstall`: backend release archives into `<cache>/bin/<dir>/<backend>/`
//! (the transaction is `host::install`; see crate::installs).

use api_types::{InstallRequest, InstallResponse};
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
    let (recipe, backend) = required(&req)?;
    if recipe == backends::cloud::RECIPE {
        return Ok(Json(cloud_install(&rt, backend, req).await?).into_response());
    }
    let p = installs::plan_for(&rt.cfg, &recipe, &backend)?;
    if req.stream != Some(true) {
        let version = Some(installs::install_now(&rt.cfg, &rt.locks, &p).await?);
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
    Ok(sse::events(&rt.lifecycle, installs::install_in_background(&rt.cfg, &rt.locks, p)))
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
pub async fn uninstall_route(
    State(rt): State<AppState>,
    body: JsonBody<InstallRequest>,
) -> Result<Json<InstallResponse>, ApiError> {
    let (recipe, backend) = required(&body.value)?;
    let message = match recipe == backends::cloud::RECIPE {
        true => {
            (!rt.remotes.uninstall(&backend)?).then(|| format!("No remote provider '{backend}'; nothing to remove"))
        }
        false => rt.uninstall_backend(&recipe, &backend).await?,
    };
    Ok(Json(InstallResponse { status: "success".into(), recipe, backend, version: None, message, upstream: None }))
}

/// Registers a remote provider (or changes its key) and discovers its models.
async fn cloud_install(rt: &AppState, name: String, req: InstallRequest) -> Result<InstallResponse, ApiError> {
    let up = rt.remotes.install(&name, req.base_url.as_deref(), req.api_key).await?;
    let message = match &up.last_probe {
        Some(p) if p.ok => format!("{} model(s): {}", up.models.len(), up.models.join(", ")),
        Some(p) => format!("registered, but its models could not be listed: {}", p.error.as_deref().unwrap_or("")),
        None => "registered".into(),
    };
    let recipe = backends::cloud::RECIPE.to_string();
    Ok(InstallResponse {
        status: "success".into(),
        recipe,
        backend: name,
        version: None,
        message: Some(message),
        upstream: Some(up),
    })
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
        rt.remotes.refresh().await;
    }
    Json(api_types::UpstreamList { upstreams: rt.remotes.views() })
}
