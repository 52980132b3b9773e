//! Lemonade v11's `config.json` in the cache dir (sparse overrides of the defaults) as the
//! configuration reads it: the values at start (flags over the file over the defaults), what
//! they set in [`Config`], the defaults, the log level. Changing it while lemonade runs is
//! [`crate::configure`]'s. The keys, their checks and defaults are `registry::config`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use registry::config::{self as keys, ConfigError};
use serde_json::{Map, Value};

use crate::config::Config;
use crate::error::{EngineError, Result};

pub(crate) fn refused(e: ConfigError) -> EngineError {
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
    cfg.scheduler = crate::config::settings::settings(&update)?.over(cfg.scheduler.clone());
    Ok(())
}

/// The sandbox mode `values` name (`auto`: the strongest this kernel holds), checked against
/// the kernel: `strict` where it cannot hold every rule is a 400 naming what it lacks.
pub(crate) fn sandbox_mode(values: &Map<String, Value>) -> Result<Option<backends::sandbox::Mode>> {
    let Some(v) = values.get("sandbox").and_then(Value::as_str) else { return Ok(None) };
    let mode = backends::sandbox::Mode::parse(v).unwrap_or_else(host::sandbox::default_mode);
    host::sandbox::status(mode).map_err(|e| EngineError::invalid(e.to_string(), Some("sandbox")))?;
    Ok(Some(mode))
}

/// The timeouts, `offline`, `download_rate_limit`, `model_names` and the extra models dir of `values` (the keys it has) into `cfg`'s live part.
pub(crate) fn apply_server(cfg: &Config, values: &Map<String, Value>) -> Option<Option<PathBuf>> {
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
    if let Some(d) = secs("stream_timeout") {
        cfg.live.set_stream_timeout(d);
    }
    if let Some(on) = values.get("offline").and_then(Value::as_bool) {
        cfg.live.set_offline(on);
    }
    if let Some(rate) = values.get("download_rate_limit").and_then(keys::rate_limit) {
        cfg.live.set_download_rate(rate);
        host::download::set_rate_limit(rate);
    }
    if let Some(on) = values.get("trust_incoming_trace_context").and_then(Value::as_bool) {
        cfg.live.set_trust_trace_context(on);
    }
    if let Some(names) = values.get("model_names").and_then(Value::as_str) {
        cfg.live.set_v9_names(names == "v9");
    }
    let dir = values.get("extra_models_dir").and_then(Value::as_str)?;
    let dir = (!dir.is_empty()).then(|| PathBuf::from(dir));
    cfg.live.set_extra_models_dir(dir.clone());
    Some(dir)
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
