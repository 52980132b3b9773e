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
            AliasEntry {
                alias: alias.to_string(),
                target: target.to_string(),
                downloaded: m.is_some_and(|m| m.downloaded),
                recipe: m.map(|m| m.recipe.to_string()),
            }
        })
        .collect();
    AliasList { aliases }
}

/// `POST /internal/aliases`: creates or repoints an alias (400 naming a missing or bad field,
/// or an alias that takes a model's name).
pub fn set(rt: &Engine, req: &AliasRequest) -> Result<AliasResponse> {
    let alias = req.alias.as_deref().filter(|a| !a.is_empty());
    let alias = alias.ok_or_else(|| EngineError::invalid("Missing required field 'alias'", Some("alias")))?;
    let target = req.target.as_deref().or(req.model.as_deref()).filter(|t| !t.is_empty());
    let target = target.ok_or_else(|| EngineError::invalid("Missing required field 'target'", Some("target")))?;
    rt.catalogue.set_alias(alias, Some(target))?;
    Ok(AliasResponse { status: "ok".into(), alias: alias.into(), target: Some(target.into()) })
}

/// `DELETE /internal/aliases/{alias}` (404 when there is no such alias).
pub fn remove(rt: &Engine, alias: &str) -> Result<AliasResponse> {
    if !rt.catalogue.set_alias(alias, None)? {
        return Err(EngineError::NotFound(format!("Alias '{alias}' does not exist")));
    }
    Ok(AliasResponse { status: "deleted".into(), alias: alias.into(), target: None })
}
