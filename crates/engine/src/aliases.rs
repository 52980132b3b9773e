//! Model aliases (Lemonade v11's `aliases.json`): names that mean another model. They resolve
//! in the registry (`Registry::get`), so an alias works wherever a model name does; this module
//! is the management view.

use api_types::{AliasEntry, AliasList, AliasRequest, AliasResponse};

use crate::{Engine, EngineError, Result};

/// `GET /internal/aliases`.
pub fn list(rt: &Engine) -> AliasList {
    let reg = rt.catalogue.registry();
    let aliases = reg
        .aliases()
        .map(|(alias, target)| {
            let m = reg.get(alias).ok();
            let v = reg.variant(alias);
            AliasEntry {
                alias: alias.to_string(),
                target: target.to_string(),
                downloaded: m.is_some_and(|m| m.downloaded),
                recipe: m.map(|m| m.recipe.to_string()),
                params: v.map(|v| v.params.clone()),
                strip: v.map(|v| v.strip.clone()),
            }
        })
        .collect();
    AliasList { aliases }
}

/// `POST /internal/aliases`: creates or repoints an alias (400 naming a missing or bad field,
/// or an alias that takes a model's name).
pub async fn set(rt: &Engine, req: &AliasRequest) -> Result<AliasResponse> {
    let alias = req.alias.as_deref().filter(|a| !a.is_empty());
    let alias = alias.ok_or_else(|| EngineError::invalid("Missing required field 'alias'", Some("alias")))?;
    let target = req.target.as_deref().or(req.model.as_deref()).filter(|t| !t.is_empty());
    let target = target.ok_or_else(|| EngineError::invalid("Missing required field 'target'", Some("target")))?;
    let params = variant(req)?;
    rt.catalogue.set_alias(alias, Some(target), params.as_ref()).await?;
    Ok(AliasResponse { status: "ok".into(), alias: alias.into(), target: Some(target.into()) })
}

/// `DELETE /internal/aliases/{alias}` (404 when there is no such alias).
pub async fn remove(rt: &Engine, alias: &str) -> Result<AliasResponse> {
    if !rt.catalogue.set_alias(alias, None, None).await? {
        return Err(EngineError::Missing { what: crate::error::Thing::Alias, name: alias.to_string() });
    }
    Ok(AliasResponse { status: "deleted".into(), alias: alias.into(), target: None })
}

/// Fields a variant may not force or remove: the ones that say what is asked of which model.
const FIXED: &[&str] = &["model", "messages", "prompt", "input", "stream", "route_trace"];

/// The parameter variant `req` defines, if any (400 naming a field it may not touch).
fn variant(req: &AliasRequest) -> Result<Option<api_types::AliasParams>> {
    if req.params.is_none() && req.strip.is_none() {
        return Ok(None);
    }
    let v = api_types::AliasParams {
        params: req.params.clone().unwrap_or_default(),
        strip: req.strip.clone().unwrap_or_default(),
    };
    let touched = v.params.keys().map(|k| ("params", k)).chain(v.strip.iter().map(|k| ("strip", k)));
    for (field, k) in touched {
        if FIXED.contains(&k.as_str()) || k.is_empty() {
            return Err(EngineError::invalid(
                format!("A variant may not set or remove '{k}' (it may not change: {})", FIXED.join(", ")),
                Some(&format!("{field}.{k}")),
            ));
        }
    }
    Ok(Some(v))
}
