//! Per-model options (Lemonade v11's `GET`/`POST`/`DELETE /models/{id}/options`) and the
//! options of a `/load`: parsed and checked where they enter, one precedence chain
//! (`registry::options`) for what a load uses and what the API shows.

use api_types::{LoadOptions, LoadRequest, ModelOptions, OptionsPatch};
use registry::ModelInfo;
use serde_json::{Map, Value};

use crate::{Engine, EngineError, Result};

/// Keys of a `POST /models/{id}/options` body that are not options.
const NOT_OPTIONS: [&str; 2] = ["model_name", "dry_run"];

pub(crate) fn refused(e: backends::options::Invalid) -> EngineError {
    EngineError::Invalid { message: e.message, param: Some(e.key.as_str().to_string()), code: e.code }
}

/// The options of a `/load` body, each value checked (a 400 naming the option). Options of
/// other recipes are ignored at load, as v9 does.
pub fn of_request(req: &LoadRequest) -> Result<OptionsPatch> {
    let p = req.patch();
    backends::options::check(&p.set).map_err(refused)?;
    Ok(p)
}

/// `GET /models/{id}/options`: the model's options by layer.
pub fn view(rt: &Engine, info: &ModelInfo) -> ModelOptions {
    let reg = rt.catalogue.registry();
    view_with(rt, info, &reg.saved(info), reg.saved_entry(&info.name))
}

/// The view with `saved` as the model's saved options (`entry` as written).
fn view_with(rt: &Engine, info: &ModelInfo, saved: &LoadOptions, entry: Map<String, Value>) -> ModelOptions {
    let none = OptionsPatch::default();
    let effective = rt.lifecycle.resolve(info, saved, &none);
    let defaults = rt.lifecycle.resolve(info, &LoadOptions::default(), &none);
    let idle = |s: &LoadOptions| s.idle_timeout.unwrap_or_else(|| rt.lifecycle.idle_timeout_s());
    let takes_ctx = info.recipe.option_keys().contains(&api_types::OptionKey::CtxSize);
    ModelOptions {
        model_name: info.name.clone(),
        recipe: info.recipe.to_string(),
        saved: entry,
        effective: registry::options::load_body(&info.name, info.recipe, &effective, idle(saved)),
        defaults: registry::options::load_body(&info.name, info.recipe, &defaults, idle(&LoadOptions::default())),
        resolved_ctx_size: takes_ctx.then(|| rt.lifecycle.ctx_size(info, &effective)),
    }
}

/// Saving an empty `llamacpp_args`, `whispercpp_args` or `flm_args` clears the key, as Lemonade
/// v11 does (no saved value, so the server's layer applies again).
fn clear_empty_args(p: &mut OptionsPatch) {
    use api_types::OptionKey as K;
    for (key, v) in [
        (K::LlamacppArgs, &mut p.set.llamacpp_args),
        (K::WhispercppArgs, &mut p.set.whispercpp_args),
        (K::FlmArgs, &mut p.set.flm_args),
    ] {
        if v.as_deref().is_some_and(|a| a.trim().is_empty()) {
            *v = None;
            p.cleared.push(key);
        }
    }
}

/// `POST /models/{id}/options`: merges `body` into the model's saved entry (a value sets, a
/// `null` removes) without loading anything; with `dry_run`, saves nothing and shows the
/// options the save would give. A 400 names an unknown option, one of another recipe, a
/// value of the wrong type or out of range; nothing of a refused body is saved.
pub async fn save(rt: &Engine, info: &ModelInfo, body: &Map<String, Value>) -> Result<ModelOptions> {
    let dry_run = match body.get("dry_run") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(EngineError::invalid("dry_run must be a boolean", Some("dry_run"))),
    };
    let mut p =
        OptionsPatch::from_map(body, &NOT_OPTIONS).map_err(|e| EngineError::invalid(e.to_string(), Some(e.key)))?;
    clear_empty_args(&mut p);
    if let Some(k) = p.unknown.first() {
        return Err(EngineError::invalid(format!("Unknown option '{k}'"), Some(k)));
    }
    backends::options::check_keys(info.recipe, &[p.set.keys(), p.cleared.clone()].concat()).map_err(refused)?;
    backends::options::check(&p.set).map_err(refused)?;
    crate::devices::check(rt.lifecycle.devices(), &p.set)?;
    crate::draft::check(&rt.catalogue, info, &p.set)?;
    let merge = move |mut entry: Map<String, Value>| {
        entry.extend(p.set.to_map());
        for k in &p.cleared {
            entry.remove(k.as_str());
        }
        entry
    };
    if dry_run {
        let on_disk = rt.catalogue.registry().saved_entry(&info.name);
        let after = merge(on_disk.clone());
        return Ok(view_with(rt, info, &LoadOptions::from_map_lossy(&after).0, on_disk));
    }
    rt.catalogue.update_options(&info.name, move |e| Some(merge(e)).filter(|e| !e.is_empty())).await?;
    Ok(view(rt, &rt.catalogue.get(&info.name)?))
}

/// `DELETE /models/{id}/options`: erases the model's saved entry.
pub async fn reset(rt: &Engine, info: &ModelInfo) -> Result<ModelOptions> {
    rt.catalogue.update_options(&info.name, |_| None).await?;
    Ok(view(rt, &rt.catalogue.get(&info.name)?))
}

/// `/load` with `save_options`: the request's values replace the saved entry, except that a
/// key the request set to `null` keeps its saved value (v11).
pub async fn save_from_load(rt: &Engine, name: &str, p: &OptionsPatch) -> Result<()> {
    let p = p.clone();
    rt.catalogue
        .update_options(name, move |old| {
            let mut entry = p.set.to_map();
            for k in &p.cleared {
                if let Some(v) = old.get(k.as_str()) {
                    entry.insert(k.as_str().to_string(), v.clone());
                }
            }
            Some(entry)
        })
        .await
}
