//! The model list and one model as clients read them (`GET /models`, `GET /models/{id}`): the
//! catalogue's models with their slots and update state, the remote providers' models and the
//! collections.

use api_types::{Model, ModelList};

use crate::error::{EngineError, Result};
use crate::Engine;

/// Every listed model: the catalogue's (all of them with `show_all`, else the downloaded
/// ones), then the remote providers', then the collections.
pub fn list(rt: &Engine, show_all: bool) -> ModelList {
    let reg = rt.catalogue.registry();
    let mut data: Vec<Model> = reg
        .listed(show_all)
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
            let entry = reg.entry(id).map_err(EngineError::from)?;
            let (parallel, slot_ctx_size) = rt.lifecycle.slots(&m.name).unzip();
            Ok(Model { update_available: rt.updates.available(&m.name), parallel, slot_ctx_size, ..entry })
        }
        (Err(e), None) => Err(e.into()),
    }
}
