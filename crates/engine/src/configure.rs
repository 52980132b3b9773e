//! Changing the configuration while lemonade runs (Lemonade v11's `GET /internal/config`,
//! `POST /internal/set`, `POST /params`, a reload on SIGHUP): a change is checked, saved in
//! `config.json` (the one store: `POST /params` writes there too) and applied where it takes
//! effect (the live options, the catalogue's extra models dir, the scheduler).
//!
//! The log level is the one key the engine does not apply itself: logging belongs to the
//! process (the CLI sets it up, the server changes it), so [`set`] checks it, saves it and
//! hands it back.

use api_types::{ModelType, Params};
use registry::config as keys;
use serde_json::{Map, Value};

use crate::config::file::{apply_server, refused, sandbox_mode};
use crate::config::settings::limits_by_type;
use crate::lifecycle::Lifecycle;
use crate::{Engine, EngineError, Result};

/// The configuration in force: read from where each value lives (the log level from the log
/// hub), so it is what lemonade does now, not what a file says.
pub fn snapshot(rt: &Engine) -> Map<String, Value> {
    let live = &rt.cfg.live;
    let mut m = Map::new();
    let dir = live.extra_models_dir().map(|d| d.display().to_string()).unwrap_or_default();
    m.insert("extra_models_dir".into(), dir.into());
    m.insert("load_timeout".into(), live.load_timeout().as_secs().into());
    m.insert("pull_timeout".into(), live.pull_timeout().as_secs().into());
    m.insert("remote_timeout".into(), live.remote_timeout().as_secs().into());
    m.insert("stream_timeout".into(), live.stream_timeout().as_secs().into());
    m.insert("offline".into(), live.offline().into());
    m.insert("download_rate_limit".into(), live.download_rate().into());
    m.insert("trust_incoming_trace_context".into(), live.trust_trace_context().into());
    m.insert("model_names".into(), if live.v9_names() { "v9" } else { "v11" }.into());
    m.insert("sandbox".into(), live.sandbox().as_str().into());
    // The scheduler's keys are `/params`' fields, but for the slot limits (one number when every
    // type has the same) and the budgets (`none` rather than null).
    let p = current(&rt.lifecycle);
    let params = match serde_json::to_value(&p) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    };
    for k in keys::KEYS.iter().filter(|k| k.group == keys::Group::Scheduler) {
        let v = params.get(k.name).cloned().unwrap_or(Value::Null);
        m.insert(k.name.to_string(), if v.is_null() { Value::from("none") } else { v });
    }
    let limits: Vec<i64> =
        ["llm", "embedding", "reranking"].iter().map(|t| p.max_loaded_models.get(*t).copied().unwrap_or(1)).collect();
    let uniform = p.max_loaded_models.values().all(|v| *v == limits[0]);
    m.insert("max_loaded_models".into(), if uniform { limits[0].into() } else { limits.into() });
    let mut o = backends::options::defaults(backends::Recipe::LlamaCpp);
    for r in [backends::Recipe::SdCpp, backends::Recipe::WhisperCpp] {
        o.overlay(&backends::options::defaults(r));
    }
    o.overlay(&live.options());
    for (k, v) in o.to_map() {
        let k = keys::config_key(&k);
        if keys::find(k).is_some() {
            m.insert(k.to_string(), v);
        }
    }
    let mut m = keys::with_sections(m);
    m.insert("log_level".into(), crate::logs::level(rt).into());
    m
}

/// `POST /internal/set`: every key checked before any applies (a 400 names the first bad
/// one and nothing changes), the file updated atomically (a `null` removes a key: back to its
/// default), then each change applied where it takes effect: the catalogue rescans a new
/// extra models dir, the timeouts and the scheduler's settings change at once, the options
/// at the next load. Returns the values set (a `null` as the default it restores).
pub async fn set(rt: &Engine, update: &Map<String, Value>) -> Result<Map<String, Value>> {
    let _one = rt.config.writer.lock().await;
    let update = &keys::flatten(update, true).map_err(refused)?;
    keys::check(update).map_err(refused)?;
    let defaults = keys::defaults();
    let resolved: Map<String, Value> =
        update.iter().map(|(k, v)| (k.clone(), if v.is_null() { defaults[k].clone() } else { v.clone() })).collect();
    let sched = crate::config::settings::settings(&keys::scheduler(&resolved).map_err(refused)?)?;
    let sandbox = sandbox_mode(&resolved)?;
    let set: Map<String, Value> =
        update.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut options = rt.cfg.live.options();
    options.overlay(&keys::options(&set).map_err(refused)?);
    // A reset option leaves the layer (its default applies where it is read); so does an
    // empty string (`llamacpp_args: ""`, as v11's clients restore "no arguments").
    let reset: Vec<api_types::OptionKey> = api_types::OptionKey::ALL
        .iter()
        .filter(|k| update.get(keys::config_key(k.as_str())).is_some_and(|v| v.is_null() || v.as_str() == Some("")))
        .copied()
        .collect();
    let mut options = options.clear(&reset);
    if options.llamacpp_backend.is_none() {
        options.llamacpp_backend = Some("cpu".into());
    }
    let (dir, changes) = (rt.cfg.cache_dir.clone(), update.clone());
    let save = move || host::files::save_config(&dir, &keys::updated_file(&host::files::load_config(&dir)?, &changes));
    host::offload::offload(save)
        .await
        .map_err(|e| EngineError::Internal(format!("the configuration was not saved: {e}")))??;
    if let Some(dir) = apply_server(&rt.cfg, &resolved) {
        rt.catalogue.set_extra_models_dir(dir).await?;
    }
    rt.cfg.live.set_options(options);
    if let Some(mode) = sandbox {
        rt.cfg.live.set_sandbox(mode);
    }
    rt.lifecycle.configure(sched).await;
    if resolved.contains_key("log_level") {
        crate::logs::set_level(rt, crate::config::file::log_level(&resolved))?;
    }
    tracing::info!(keys = ?resolved.keys().collect::<Vec<_>>(), "configuration changed");
    Ok(resolved)
}

/// `systemctl reload` (SIGHUP): `config.json` read again, and each key whose value there differs
/// from the one in force applied as `POST /internal/set` applies it (checked first: a bad
/// file changes nothing). A key given by a flag at start takes the file's value. `log_level`
/// is not reloaded (`POST /log-level` or `/internal/set` change it). Returns the keys applied.
pub async fn reload(rt: &Engine) -> Result<Map<String, Value>> {
    let file = host::files::load_config(&rt.cfg.cache_dir)?;
    let file = keys::flatten(&file, false).map_err(refused)?;
    let now = keys::flatten(&snapshot(rt), false).map_err(refused)?;
    let changed: Map<String, Value> =
        file.into_iter().filter(|(k, v)| k != "log_level" && now.get(k) != Some(v)).collect();
    if changed.is_empty() {
        return Ok(changed);
    }
    set(rt, &changed).await
}

/// `POST /params`: applies `update` to the running scheduler and saves it in `config.json`
/// (the one store of settings); returns the settings now in force. A bad value changes nothing.
pub async fn update_params(rt: &Engine, update: &api_types::ParamsUpdate) -> Result<api_types::Params> {
    crate::config::settings::settings(update)?;
    let keys = match serde_json::to_value(update) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    set(rt, &keys).await?;
    Ok(current(&rt.lifecycle))
}

/// Pinned models among `loaded`, per model type (every type listed, 0 when none).
/// Pinned models by type, in the standard pool (`helpers` false) or the routing-helper pool.
pub fn pinned_by_type(
    loaded: &[(std::sync::Arc<crate::lifecycle::Running>, crate::lifecycle::ModelView)],
    helpers: bool,
) -> std::collections::BTreeMap<String, i64> {
    ModelType::ALL
        .iter()
        .map(|t| {
            let n = loaded.iter().filter(|(r, v)| v.pinned && v.helper == helpers && r.info.model_type == *t).count();
            (t.as_str().to_string(), n as i64)
        })
        .collect()
}

/// The settings in force, as the scheduler last published them.
pub fn current(rt: &Lifecycle) -> Params {
    let v = rt.scheduler_view();
    let s = v.settings;
    Params {
        max_loaded_models: limits_by_type(&s.limits.unwrap_or_default()),
        idle_timeout: s.idle_timeout_ms.flatten().map(|ms| ms / 1000).unwrap_or(0),
        max_queue: s.max_queue.flatten().map(|q| q as u64).unwrap_or(0),
        memory_budget: s.memory_budget.flatten(),
        memory_in_use: v.memory_in_use,
        vram_budget: s.vram_budget.flatten(),
        vram_in_use: v.vram_in_use,
        swap_hold_ms: s.swap_hold_ms.unwrap_or(0),
    }
}
