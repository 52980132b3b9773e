//! The model list and one model as clients read them (`GET /models`, `GET /models/{id}`): the
//! catalogue's models with their slots and update state, the remote providers' models and the
//! collections; and `GET /health`'s view of what is loaded.

use api_types::{Health, Model, ModelList};

use crate::error::{EngineError, Result};
use crate::Engine;

/// Every listed model: the catalogue's (all of them with `show_all`, else the downloaded
/// ones), then the remote providers', then the collections.
pub fn list(rt: &Engine, show_all: bool) -> ModelList {
    let reg = rt.catalogue.registry();
    let mut data: Vec<Model> = reg
        .listed(show_all, rt.cfg.live.v9_names())
        .into_iter()
        .map(|(id, m)| {
            let (parallel, slot_ctx_size) = rt.lifecycle.slots(&m.name).unzip();
            let update_available = rt.updates.available(&m.name);
            Model { id, update_available, parallel, slot_ctx_size, ..reg.to_api(m) }
        })
        .collect();
    data.extend(rt.remotes.models());
    data.extend(crate::router::listed(rt, show_all));
    ModelList { object: "list".into(), data }
}

/// The id the listings show for the model `name` means (a pull's answer names it so), else
/// `name` as given (a collection, a model no longer there).
pub fn listed_name(rt: &Engine, name: &str) -> String {
    let reg = rt.catalogue.registry();
    reg.get(name).map(|m| reg.listed_id(m, rt.cfg.live.v9_names())).unwrap_or_else(|_| name.to_string())
}

/// One model by id: a collection, a catalogue model (a registered model, listed or not), or a
/// remote provider's model when no local model has the id.
pub fn get(rt: &Engine, id: &str) -> Result<Model> {
    let reg = rt.catalogue.registry();
    if let Some(c) = reg.collection(id) {
        return Ok(crate::router::model(rt, c));
    }
    match (reg.get(id), rt.remotes.model(id)) {
        (Err(_), Some(remote)) => Ok(remote),
        (Ok(m), _) => {
            let entry = reg.entry(id, rt.cfg.live.v9_names()).map_err(EngineError::from)?;
            let (parallel, slot_ctx_size) = rt.lifecycle.slots(&m.name).unzip();
            Ok(Model { update_available: rt.updates.available(&m.name), parallel, slot_ctx_size, ..entry })
        }
        (Err(e), None) => Err(e.into()),
    }
}

/// `GET /health` as the engine knows it: what is loaded and loading, the limits, the prompt
/// cache, the upstreams, the sandbox. The log stream, the WebSocket port and telemetry are the
/// server's to fill in.
pub fn health(rt: &Engine) -> Health {
    let loaded = rt.lifecycle.loaded();
    // Each loaded model with the id the listings show, so a client matches them up.
    let shown = |mut e: api_types::LoadedModel| {
        e.id = listed_name(rt, &e.model_name);
        e
    };
    Health {
        status: "ok".into(),
        version: crate::VERSION.into(),
        model_loaded: rt.lifecycle.most_recent().map(|m| m.info.name.clone()),
        all_models_loaded: loaded.iter().map(|(r, v)| shown(rt.lifecycle.health_entry(r, v))).collect(),
        models_loading: rt.lifecycle.loading(),
        max_models: crate::config::settings::limits_by_type(
            &rt.lifecycle.scheduler_view().settings.limits.unwrap_or_default(),
        ),
        prompt_cache: rt.prompt_cache_usage(),
        upstreams: rt.remotes.views(),
        pinned_models: crate::configure::pinned_by_type(&loaded, false),
        pinned_helper_models: crate::configure::pinned_by_type(&loaded, true),
        update_check_done: rt.updates.done(),
        sandbox: rt.sandbox(),
        log_streaming: api_types::LogStreaming { sse: false, websocket: false },
        websocket_port: None,
        telemetry: api_types::TelemetryState { enabled: false },
    }
}
