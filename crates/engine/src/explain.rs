//! The scheduler explains itself: `/scheduler` shows the ledgers, the models and why each
//! stays, with the latest decisions (`crate::decisions`); a plan is a dry run of a load on a
//! copy of the state machine (`scheduler::Machine::plan`).

use api_types::{
    LoadRequest, ModelType, SchedulerDevice, SchedulerModel, SchedulerPlan, SchedulerPool, SchedulerState,
};
use scheduler::{Pool, Rejection, State};
use serde_json::json;

use crate::decisions::wire;
use crate::error::Result;
use crate::Engine;

/// Why a model stays loaded (or what it is doing).
fn resident(state: State, pinned: bool, busy: bool, unload_in_s: Option<u64>) -> String {
    match (state, pinned, busy, unload_in_s) {
        (State::Loaded, true, _, _) => "pinned".into(),
        (State::Loaded, _, true, _) => "serving".into(),
        (State::Loaded, _, _, Some(s)) => format!("idle, unloaded in {s} s unless used"),
        (State::Loaded, _, _, None) => {
            "kept (no idle timeout); evicted first when room is needed, least recently used".into()
        }
        (s, ..) => s.as_str().into(),
    }
}

/// `GET /scheduler`.
pub fn state(rt: &Engine) -> SchedulerState {
    let now = rt.lifecycle.now_ms();
    let sv = rt.lifecycle.scheduler_view();
    let views = rt.lifecycle.view();
    let running: std::collections::BTreeMap<String, _> =
        rt.lifecycle.loaded().into_iter().map(|(r, _)| (r.info.name.clone(), r)).collect();
    let models: Vec<SchedulerModel> = views
        .iter()
        .map(|(name, v)| {
            let unload_in_s = v.unload_at.map(|at| at.saturating_sub(now).div_ceil(1000));
            let r = running.get(name);
            let measured = r.map(|r| r.measured.load(std::sync::atomic::Ordering::Relaxed)).filter(|b| *b > 0);
            let measured_vram =
                r.map(|r| r.measured_vram.load(std::sync::atomic::Ordering::Relaxed)).filter(|b| *b > 0);
            let cache = r.and_then(|r| r.options.cache_ram).map(|mib| mib * registry::memory::MIB);
            SchedulerModel {
                model_name: name.clone(),
                state: v.state.as_str().into(),
                pinned: v.pinned,
                in_flight: v.in_flight,
                waiting: v.queue_depth,
                max_concurrent: v.max_concurrent,
                memory_bytes: v.memory,
                vram_bytes: v.vram,
                estimate_memory_bytes: v.estimate,
                measured_memory_bytes: measured,
                measured_vram_bytes: measured_vram,
                prompt_cache_bytes: cache,
                sandbox: r.and_then(|r| r.backend.sandbox()),
                devices: v.devices.clone(),
                unload_in_s,
                resident: resident(v.state, v.pinned, v.in_flight + v.queue_depth > 0, unload_in_s),
            }
        })
        .collect();
    let pool = |p: Pool, budget: Option<u64>, in_use: u64| SchedulerPool {
        pool: if p == Pool::Memory { "memory" } else { "vram" }.into(),
        budget_bytes: budget,
        in_use_bytes: in_use,
        models: views
            .iter()
            .map(|(n, v)| (n.clone(), if p == Pool::Memory { v.memory } else { v.vram }))
            .filter(|(_, b)| *b > 0)
            .collect(),
    };
    let s = &sv.settings;
    let devices = rt.lifecycle.devices().iter().map(|d| {
        let models: std::collections::BTreeMap<String, u64> =
            views.iter().filter_map(|(n, v)| Some((n.clone(), *v.devices.get(&d.id)?))).collect();
        let budget = s.devices.iter().flatten().find(|x| x.id == d.id).and_then(|x| x.budget);
        SchedulerDevice {
            id: d.id.clone(),
            kind: d.kind.clone(),
            name: d.name.clone(),
            budget_bytes: budget,
            in_use_bytes: models.values().sum(),
            models,
        }
    });
    SchedulerState {
        devices: devices.collect(),
        pools: vec![
            pool(Pool::Memory, s.memory_budget.flatten(), sv.memory_in_use),
            pool(Pool::Vram, s.vram_budget.flatten(), sv.vram_in_use),
        ],
        models,
        load_queue: sv.load_queue.clone(),
        max_loaded_models: ModelType::ALL.iter().map(|t| (t.as_str().to_string(), sv.limits.get(*t))).collect(),
        decisions: rt.lifecycle.explain.recent(),
    }
}

/// `POST /scheduler/plan`: what `/load` with `req` would do now; nothing changes. A refusal is
/// worded by `words` (the caller's: the server adds what its clients can do).
pub async fn plan(rt: &Engine, req: &LoadRequest, words: fn(&str, &Rejection) -> String) -> Result<SchedulerPlan> {
    let info = rt.catalogue.get(&req.model_name)?;
    let opts = crate::options::of_request(req)?;
    let effective = rt.lifecycle.effective_options(&info, &opts);
    let (p, model) = rt.lifecycle.plan(&info, &effective).await;
    let refusal = p.refusal.as_ref().map(|r| json!({"code": r.code(), "message": words(&info.name, r)}));
    let on = match p.devices.keys().cloned().collect::<Vec<_>>().as_slice() {
        [] => String::new(),
        [one] => format!(" on {one}"),
        many => format!(" split over {}", many.join(" and ")),
    };
    let summary = match (p.outcome, p.evicts.as_slice()) {
        ("loaded", _) => format!("{} is loaded with these options: nothing to do", info.name),
        ("refused", _) => format!(
            "{} would be refused: {}",
            info.name,
            refusal.as_ref().map_or("", |r| r["message"].as_str().unwrap_or(""))
        ),
        ("load", []) => format!("{} would load{on} beside the models loaded", info.name),
        ("load", e) => format!("{} would load{on} after evicting {}", info.name, e.join(", ")),
        (_, []) => format!("{} would wait for the load in progress", info.name),
        (_, e) => format!("{} would load once {} finish their requests and are evicted", info.name, e.join(", ")),
    };
    Ok(SchedulerPlan {
        model_name: info.name.clone(),
        outcome: p.outcome.into(),
        evicts: p.evicts,
        refusal,
        memory_bytes: model.memory,
        vram_bytes: model.vram,
        devices: p.devices.clone(),
        summary,
        decisions: p.decisions.into_iter().map(|d| wire(d, rt.lifecycle.now_ms())).collect(),
    })
}
