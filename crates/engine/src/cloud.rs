//! The cloud providers' API answers (Lemonade v11's `install`/`uninstall` with `backend:
//! "cloud"`, `cloud/auth`, and lemonade's own `recipe: "cloud"` install): what each does to
//! [`crate::remote::Remotes`] and what it answers. Checks of the request's fields are here too,
//! each naming its field. An install request names either a provider or a backend's release:
//! [`install_request`] and [`uninstall_request`] tell which and do it.

use api_types::{AuthState, CloudAuth, CloudInstalled, CloudUninstalled, InstallRequest, InstallResponse};

use crate::error::{EngineError, Result};
use crate::remote::{InstallOptions, Provider, Remotes};
use crate::Engine;

/// Where a provider's key comes from: the environment, or this process's memory.
pub fn auth_state(p: &Provider) -> AuthState {
    let (env_var_set, runtime_key_set) = p.auth_state();
    AuthState { env_var_set, runtime_key_set }
}

fn options(req: &InstallRequest) -> InstallOptions {
    InstallOptions { allow_insecure_http: req.allow_insecure_http, reach: req.reach.clone(), keyed: false }
}

fn required(value: Option<&str>, field: &str) -> Result<String> {
    value
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .ok_or_else(|| EngineError::invalid(format!("Missing required field '{field}'"), Some(field)))
}

/// How an install request is answered.
#[derive(Debug)]
pub enum Installing {
    /// Lemonade v11's cloud install.
    Provider(CloudInstalled),
    /// A provider registered with recipe `cloud`, or a backend installed.
    Done(Box<InstallResponse>),
    /// A backend's install, running: its events (`stream: true`).
    Events(tokio::sync::mpsc::Receiver<crate::pulls::PullEvent>),
}

/// How an uninstall request is answered.
#[derive(Debug)]
pub enum Uninstalled {
    Provider(CloudUninstalled),
    Done(Box<InstallResponse>),
}

/// `recipe` and `backend`, both required outside v11's cloud shape.
fn recipe_and_backend(req: &InstallRequest) -> Result<(String, String)> {
    match (req.recipe.as_deref().filter(|s| !s.is_empty()), req.backend.as_deref().filter(|s| !s.is_empty())) {
        (Some(r), Some(b)) => Ok((r.to_string(), b.to_string())),
        _ => Err(EngineError::invalid("Both 'recipe' and 'backend' are required", Some("recipe"))),
    }
}

fn v11(req: &InstallRequest) -> bool {
    req.backend.as_deref() == Some(backends::cloud::RECIPE) && req.recipe.is_none()
}

/// An install request: a provider (v11's shape, or recipe `cloud`), else the pinned release
/// of `recipe:backend`, awaited or (`stream: true`) running with its events.
pub async fn install_request(rt: &Engine, req: &InstallRequest) -> Result<Installing> {
    if v11(req) {
        return Ok(Installing::Provider(install_v11(rt, req).await?));
    }
    let (recipe, backend) = recipe_and_backend(req)?;
    if recipe == backends::cloud::RECIPE {
        return Ok(Installing::Done(Box::new(install(rt, backend, req).await?)));
    }
    let p = crate::installs::plan_for(&rt.cfg, &recipe, &backend)?;
    if req.stream == Some(true) {
        return Ok(Installing::Events(crate::installs::install_in_background(&rt.cfg, &rt.locks, p)));
    }
    let version = Some(crate::installs::install_now(&rt.cfg, &rt.locks, &p).await?);
    let status = "success".into();
    Ok(Installing::Done(Box::new(InstallResponse { status, recipe, backend, version, message: None, upstream: None })))
}

/// An uninstall request: a provider (v11's shape, or recipe `cloud`), else a managed backend
/// (after unloading the models on it). Idempotent: nothing to remove is a 200 with a message.
pub async fn uninstall_request(rt: &Engine, req: &InstallRequest) -> Result<Uninstalled> {
    if v11(req) {
        return Ok(Uninstalled::Provider(uninstall_v11(rt, req)?));
    }
    let (recipe, backend) = recipe_and_backend(req)?;
    let message = match recipe == backends::cloud::RECIPE {
        true => {
            (!rt.remotes.uninstall(&backend)?).then(|| format!("No remote provider '{backend}'; nothing to remove"))
        }
        false => rt.uninstall_backend(&recipe, &backend).await?,
    };
    let status = "success".into();
    Ok(Uninstalled::Done(Box::new(InstallResponse { status, recipe, backend, version: None, message, upstream: None })))
}

/// Lemonade v11's cloud install: `{backend: "cloud", provider, base_url, api_key?,
/// allow_insecure_http?}`.
pub async fn install_v11(rt: &Engine, req: &InstallRequest) -> Result<CloudInstalled> {
    let name = required(req.provider.as_deref(), "provider")?;
    let url = required(req.base_url.as_deref(), "base_url")?;
    let o = InstallOptions { keyed: true, ..options(req) };
    let up = rt.remotes.install_with(&name, Some(&url), req.api_key.clone(), o).await?;
    let p = rt.remotes.provider(&name)?;
    let state = auth_state(&p);
    let mut warnings = p.warnings();
    if req.api_key.is_some() && state.env_var_set {
        warnings.insert(
            0,
            format!(
                "{} is set in the lemonade process; it takes precedence over the api_key given",
                backends::cloud::key_variable(&name)
            ),
        );
    }
    Ok(CloudInstalled {
        status: "success".into(),
        backend: backends::cloud::RECIPE.to_string(),
        provider: name,
        base_url: up.base_url,
        models_discovered: up.models.len(),
        auth_state: state,
        warning: warnings.first().cloned(),
        warnings,
        allow_insecure_http: p.insecure_ok(),
    })
}

/// Lemonade v11's cloud uninstall: the provider and the models it served are dropped.
pub fn uninstall_v11(rt: &Engine, req: &InstallRequest) -> Result<CloudUninstalled> {
    let name = required(req.provider.as_deref(), "provider")?;
    let models_evicted = Remotes::model_count(&*rt.remotes.provider(&name)?);
    rt.remotes.uninstall(&name)?;
    Ok(CloudUninstalled {
        status: "success".into(),
        backend: backends::cloud::RECIPE.into(),
        provider: name,
        models_evicted,
    })
}

/// lemonade's `recipe: "cloud"` install: registers the provider `name` (or changes its key)
/// and discovers its models; the message says what discovery found.
pub async fn install(rt: &Engine, name: String, req: &InstallRequest) -> Result<InstallResponse> {
    let up = rt.remotes.install_with(&name, req.base_url.as_deref(), req.api_key.clone(), options(req)).await?;
    let message = match &up.last_probe {
        Some(p) if p.ok => format!("{} model(s): {}", up.models.len(), up.models.join(", ")),
        Some(p) => format!("registered, but its models could not be listed: {}", p.error.as_deref().unwrap_or("")),
        None => "registered".into(),
    };
    Ok(InstallResponse {
        status: "success".into(),
        recipe: backends::cloud::RECIPE.to_string(),
        backend: name,
        version: None,
        message: Some(message),
        upstream: Some(up),
    })
}

/// `cloud/auth`: holds `key` for `provider` in memory and rediscovers its models.
pub async fn auth(rt: &Engine, provider: &str, key: &str, allow_insecure_http: Option<bool>) -> Result<CloudAuth> {
    let p = rt.remotes.auth(provider, key, allow_insecure_http).await?;
    Ok(CloudAuth {
        provider: provider.to_string(),
        auth_state: auth_state(&p),
        models_discovered: Some(Remotes::model_count(&p)),
        cleared_runtime_key: None,
        allow_insecure_http: Some(p.insecure_ok()),
        warnings: p.warnings(),
    })
}

/// `DELETE cloud/auth/{provider}`: drops the key held in memory.
pub fn clear_auth(rt: &Engine, provider: &str) -> Result<CloudAuth> {
    let (p, cleared) = rt.remotes.clear_auth(provider)?;
    Ok(CloudAuth {
        provider: provider.to_string(),
        auth_state: auth_state(&p),
        models_discovered: None,
        cleared_runtime_key: Some(cleared),
        allow_insecure_http: None,
        warnings: Vec::new(),
    })
}

/// Lemonade v11's `cloud.providers` of `system-info`.
pub fn info(rt: &Engine) -> api_types::CloudInfo {
    let providers = rt
        .remotes
        .providers()
        .iter()
        .map(|p| {
            let state = auth_state(p);
            api_types::CloudProviderInfo {
                name: p.name.clone(),
                base_url: p.view().base_url,
                env_var: backends::cloud::key_variable(&p.name),
                env_var_set: state.env_var_set,
                runtime_key_set: state.runtime_key_set,
                models_discovered: Remotes::model_count(p),
                allow_insecure_http: p.insecure_ok(),
                warnings: p.warnings(),
            }
        })
        .collect();
    api_types::CloudInfo { providers }
}
