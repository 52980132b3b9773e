//! Lemonade v11's live configuration: `config.json` in the cache dir (sparse overrides of the
//! defaults), `GET /internal/config`, `GET /internal/config/defaults` and `POST /internal/set`.
//! The keys, their checks and defaults are `registry::config`'s; this module reads and writes
//! the file and applies a change where it takes effect. One store: `POST /params` writes here
//! too, and a `settings.json` from before is folded in once, at start.
//!
//! The log level is the one key the engine does not apply itself: logging belongs to the
//! process (the CLI sets it up, the server changes it), so [`set`] checks it, saves it and
//! hands it back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use registry::config::{self as keys, ConfigError};
use serde_json::{Map, Value};

use crate::config::Config;
use crate::{Engine, EngineError, Result};

fn refused(e: ConfigError) -> EngineError {
    EngineError::Invalid { message: e.message, param: Some(e.key), code: Some("invalid_config") }
}

/// What lemonade starts with: every key's value, and the keys set by `config.json` or a flag
/// (the options among them form the server-wide options layer; a default is read where it
/// is used, so answers list only options that were set, as v9's).
#[derive(Debug, Clone)]
pub struct StartValues {
    pub values: Map<String, Value>,
    pub overrides: Map<String, Value>,
}

/// The values lemonade starts with: the defaults, under `config.json` (a `settings.json` of an
/// earlier version folded in and moved aside), under `flags` (the flags and `LEMONADE_*`
/// variables given, never written back). A corrupt file, or a bad value in it or in the flags,
/// is an error naming it.
pub fn start_values(cache_dir: &Path, flags: &Map<String, Value>) -> Result<StartValues> {
    let mut file = host::files::load_config(cache_dir)?;
    let old = host::files::load_settings(cache_dir)?;
    if old != api_types::ParamsUpdate::default() {
        if let Ok(Value::Object(o)) = serde_json::to_value(&old) {
            for (k, v) in o {
                file.entry(k).or_insert(v);
            }
        }
        host::files::save_config(cache_dir, &file)?;
        host::files::retire_settings(cache_dir)?;
        tracing::info!("settings.json folded into config.json");
    }
    // A v11.7 file's nested sections read as the flat keys (what lemonade lacks is skipped).
    let flat = keys::flatten(&file, false).map_err(|e| {
        EngineError::invalid(
            format!("{} in {}: {}", e.key, cache_dir.join(keys::CONFIG_FILE).display(), e.message),
            Some(&e.key),
        )
    })?;
    let known: Map<String, Value> = flat.into_iter().filter(|(k, v)| keys::find(k).is_some() && !v.is_null()).collect();
    keys::check(&known).map_err(|e| {
        EngineError::invalid(
            format!("{} in {}: {}", e.key, cache_dir.join(keys::CONFIG_FILE).display(), e.message),
            Some(&e.key),
        )
    })?;
    keys::check(flags).map_err(refused)?;
    let mut overrides = known;
    keys::deep_merge(&mut overrides, flags);
    let mut values = keys::defaults();
    keys::deep_merge(&mut values, &overrides);
    Ok(StartValues { values, overrides })
}

/// `cfg` set from `start`: the live parts and the scheduler's settings.
pub fn configure(cfg: &mut Config, start: &StartValues) -> Result<()> {
    let values = &start.values;
    cfg.live.set_sandbox(sandbox_mode(values)?.unwrap_or_else(host::sandbox::default_mode));
    apply_server(cfg, values);
    let mut options = keys::options(&start.overrides).map_err(refused)?;
    options.llamacpp_backend = keys::options(values).map_err(refused)?.llamacpp_backend;
    cfg.live.set_options(options);
    let update = keys::scheduler(values).map_err(refused)?;
    cfg.scheduler = crate::settings::settings(&update)?.over(cfg.scheduler.clone());
    Ok(())
}

/// The sandbox mode `values` name (`auto`: the strongest this kernel holds), checked against
/// the kernel: `strict` where it cannot hold every rule is a 400 naming what it lacks.
fn sandbox_mode(values: &Map<String, Value>) -> Result<Option<backends::sandbox::Mode>> {
    let Some(v) = values.get("sandbox").and_then(Value::as_str) else { return Ok(None) };
    let mode = backends::sandbox::Mode::parse(v).unwrap_or_else(host::sandbox::default_mode);
    host::sandbox::status(mode).map_err(|e| EngineError::invalid(e.to_string(), Some("sandbox")))?;
    Ok(Some(mode))
}

/// The timeouts and the extra models dir of `values` (the keys it has) into `cfg`'s live part.
fn apply_server(cfg: &Config, values: &Map<String, Value>) -> Option<Option<PathBuf>> {
    let secs = |k: &str| values.get(k).and_then(Value::as_u64).map(Duration::from_secs);
    if let Some(d) = secs("load_timeout") {
        cfg.live.set_load_timeout(d);
    }
    if let Some(d) = secs("pull_timeout") {
        cfg.live.set_pull_timeout(d);
    }
    if let Some(d) = secs("remote_timeout") {
        cfg.live.set_remote_timeout(d);
    }
    let dir = values.get("extra_models_dir").and_then(Value::as_str)?;
    let dir = (!dir.is_empty()).then(|| PathBuf::from(dir));
    cfg.live.set_extra_models_dir(dir.clone());
    Some(dir)
}

/// The configuration in force, every key but `log_level` (the server's): read from where each
/// value lives, so it is what lemonade does now, not what a file says.
pub fn snapshot(rt: &Engine) -> Map<String, Value> {
    let live = &rt.cfg.live;
    let mut m = Map::new();
    let dir = live.extra_models_dir().map(|d| d.display().to_string()).unwrap_or_default();
    m.insert("extra_models_dir".into(), dir.into());
    m.insert("load_timeout".into(), live.load_timeout().as_secs().into());
    m.insert("pull_timeout".into(), live.pull_timeout().as_secs().into());
    m.insert("remote_timeout".into(), live.remote_timeout().as_secs().into());
    m.insert("sandbox".into(), live.sandbox().as_str().into());
    // The scheduler's keys are `/params`' fields, but for the slot limits (one number when every
    // type has the same) and the budgets (`none` rather than null).
    let p = crate::settings::current(&rt.lifecycle);
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
    keys::with_sections(m)
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
    let sched = crate::settings::settings(&keys::scheduler(&resolved).map_err(refused)?)?;
    let sandbox = sandbox_mode(&resolved)?;
    let set: Map<String, Value> =
        update.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut options = rt.cfg.live.options();
    options.overlay(&keys::options(&set).map_err(refused)?);
    // A reset option leaves the layer (its default applies where it is read).
    let reset: Vec<api_types::OptionKey> = api_types::OptionKey::ALL
        .iter()
        .filter(|k| update.get(keys::config_key(k.as_str())).is_some_and(Value::is_null))
        .copied()
        .collect();
    let mut options = options.clear(&reset);
    if options.llamacpp_backend.is_none() {
        options.llamacpp_backend = Some("cpu".into());
    }
    let (dir, changes) = (rt.cfg.cache_dir.clone(), update.clone());
    let save = move || host::files::save_config(&dir, &keys::updated_file(&host::files::load_config(&dir)?, &changes));
    tokio::task::spawn_blocking(save)
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
    tracing::info!(keys = ?resolved.keys().collect::<Vec<_>>(), "configuration changed");
    Ok(resolved)
}

/// `systemctl reload` (SIGHUP): `config.json` read again, and each key whose value there differs
/// from the one in force applied as `POST /internal/set` applies it (checked first: a bad
/// file changes nothing). A key given by a flag at start takes the file's value. `log_level`
/// is the server's to reload. Returns the keys applied.
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

/// `GET /internal/config/defaults`: the factory defaults.
pub fn defaults() -> Map<String, Value> {
    keys::defaults()
}

/// The log level `values` set, as lemonade names it (v11's `fatal` and `none` are `critical`).
pub fn log_level(values: &Map<String, Value>) -> &'static str {
    match values.get("log_level").and_then(Value::as_str) {
        Some("trace") => "trace",
        Some("debug") => "debug",
        Some("warning") => "warning",
        Some("error") => "error",
        Some("critical" | "fatal" | "none") => "critical",
        _ => "info",
    }
}

/// `POST /params`: applies `update` to the running scheduler and saves it in `config.json`
/// (the one store of settings); returns the settings now in force. A bad value changes nothing.
pub async fn update_params(rt: &Engine, update: &api_types::ParamsUpdate) -> Result<api_types::Params> {
    crate::settings::settings(update)?;
    let keys = match serde_json::to_value(update) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    set(rt, &keys).await?;
    Ok(crate::settings::current(&rt.lifecycle))
}
