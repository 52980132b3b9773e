//! The cloud providers' API answers (Lemonade v11's `install`/`uninstall` with `backend:
//! "cloud"`, `cloud/auth`, and lemonade's own `recipe: "cloud"` install): what each does to
//! [`crate::remote::Remotes`] and what it answers. Checks of the request's fields are here too,
//! each naming its field.

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
    InstallOptions { allow_insecure_http: req.allow_insecure_http, reach: req.reach.clone() }
}

fn required(value: Option<&str>, field: &str) -> Result<String> {
    value
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .ok_or_else(|| EngineError::invalid(format!("Missing required field '{field}'"), Some(field)))
}

/// Lemonade v11's cloud install: `{backend: "cloud", provider, base_url, api_key?,
/// allow_insecure_http?}`.
pub async fn install_v11(rt: &Engine, req: &InstallRequest) -> Result<CloudInstalled> {
    let name = required(req.provider.as_deref(), "provider")?;
    let url = required(req.base_url.as_deref(), "base_url")?;
    let up = rt.remotes.install_with(&name, Some(&url), req.api_key.clone(), options(req)).await?;
    let state = auth_state(&*rt.remotes.provider(&name)?);
    let warning = (req.api_key.is_some() && state.env_var_set).then(|| {
        format!(
            "{} is set in the lemonade process; it takes precedence over the api_key given",
            backends::cloud::key_variable(&name)
        )
    });
    Ok(CloudInstalled {
        status: "success".into(),
        backend: backends::cloud::RECIPE.to_string(),
        provider: name,
        base_url: up.base_url,
        models_discovered: up.models.len(),
        auth_state: state,
        warning,
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
    })
}
