//! Loading a model on request: `POST /load` (of a model, or of a collection's components) and
//! `--preload`. A registered model that is not downloaded is pulled first.

use api_types::{LoadRequest, LoadResponse};
use registry::ModelInfo;

use crate::error::{EngineError, Result};
use crate::pulls::ensure_downloaded;
use crate::Engine;

/// `POST /load` of a model or a collection: a router collection is virtual (v11: each request
/// loads the candidate it routes to), an omni collection loads each of its local components
/// (v11); a model loads as [`load`] says.
pub async fn load_named(rt: &Engine, req: &LoadRequest) -> Result<LoadResponse> {
    let collection = rt.catalogue.registry().collection(&req.model_name).cloned();
    let Some(c) = collection else {
        // A remote provider's model takes no slot: loading it is checking it can be reached
        // (a v11 cloud provider without a key answers its missing-key error).
        if rt.catalogue.get(&req.model_name).is_err() {
            if let Some(route) = rt.remotes.route(&req.model_name).await? {
                rt.remotes.mark_loaded(&route.name);
                let (model_name, checkpoint) = (route.name.clone(), route.id.clone());
                return Ok(LoadResponse { status: "success".into(), model_name, checkpoint, recipe: "cloud".into() });
            }
        }
        let info = load(rt, req).await?;
        let (model_name, checkpoint, recipe) = (info.name.clone(), info.checkpoint.clone(), info.recipe.to_string());
        return Ok(LoadResponse { status: "success".into(), model_name, checkpoint, recipe });
    };
    if c.omni().is_some() {
        let local: Vec<String> = {
            let reg = rt.catalogue.registry();
            c.components.iter().filter(|m| reg.get(m).is_ok()).cloned().collect()
        };
        for m in local {
            load(rt, &LoadRequest { model_name: m, ..Default::default() }).await?;
        }
    }
    Ok(LoadResponse { status: "success".into(), model_name: c.name, checkpoint: String::new(), recipe: c.recipe })
}

/// `POST /load`: the model `req` names, pulled first when it is registered but not
/// downloaded, its options validated (a 400 naming the field), saved as its defaults when
/// asked, layered over the saved ones and the flags, then loaded (reloaded in place when it
/// runs with other options). Returns the model.
pub async fn load(rt: &Engine, req: &LoadRequest) -> Result<ModelInfo> {
    let info = rt.catalogue.get(&req.model_name)?;
    let opts = crate::options::of_request(req)?;
    let info = ensure_downloaded(rt, &info).await?;
    // Checked before anything is saved: a refused load leaves the saved options as they were.
    let effective = rt.lifecycle.effective_options(&info, &opts);
    crate::draft::check(&rt.catalogue, &info, &effective)?;
    rt.lifecycle.check_args(&info, &effective).await?;
    if req.save_options == Some(true) {
        crate::options::save_from_load(rt, &info.name, &opts).await?;
    }
    if let Some(places) = &opts.set.spillover {
        rt.lifecycle.set_spillover(&info.name, Some(places.clone()));
    } else if opts.cleared.contains(&api_types::OptionKey::Spillover) {
        rt.lifecycle.set_spillover(&info.name, None);
    }
    let over = crate::lifecycle::Scheduling {
        idle_timeout_s: req.idle_timeout,
        max_concurrent: opts.set.max_concurrent,
        priority: opts.set.priority,
    };
    EngineError::from_load(&info.name, rt.lifecycle.load(&info, effective, req.pinned, over).await)?;
    Ok(info)
}

/// `POST /unload`: one model (a remote one a client loaded only forgets its load), or every
/// model.
pub async fn unload(rt: &Engine, name: Option<&str>) -> Result<Vec<String>> {
    match name {
        Some(n) if rt.remotes.unload(n) => Ok(vec![n.to_string()]),
        Some(n) => rt.lifecycle.unload(Some(n)).await,
        None => {
            rt.remotes.unload_all();
            rt.lifecycle.unload(None).await
        }
    }
}

/// `--preload`: loads each model in the background, pulling it first when needed, one after
/// another in the order given. Failures are logged; the server serves meanwhile.
pub fn preload(rt: &Engine) {
    let names = rt.cfg.preload.clone();
    if names.is_empty() {
        return;
    }
    rt.lifecycle.set_preloading(&names);
    let rt = rt.clone();
    tokio::spawn(async move {
        for name in names {
            let result = async {
                let info = rt.catalogue.get(&name)?;
                let info = ensure_downloaded(&rt, &info).await?;
                let options = rt.lifecycle.effective_options(&info, &Default::default());
                EngineError::from_load(&name, rt.lifecycle.load(&info, options, None, Default::default()).await)
            }
            .await;
            rt.lifecycle.done_preloading(&name);
            match result {
                Ok(()) => tracing::info!(model = %name, "preloaded"),
                Err(e) => tracing::error!(model = %name, error = %e, "preload failed"),
            }
        }
    });
}
