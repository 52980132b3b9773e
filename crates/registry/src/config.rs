//! `config.json`, Lemonade v11's live configuration, the pure part: the keys there are and when
//! each takes effect, the factory defaults, the check of a value, and the deep merge of the
//! file's sparse overrides. The engine keeps the values in force and writes the file.
//!
//! Precedence, highest first: a `POST /internal/set` (written to the file), flags and
//! `LEMONADE_*` variables (this run only, never written), `config.json`, the defaults here.

use serde::Serialize;
use serde_json::{json, Map, Value};

use api_types::{LoadOptions, ParamsUpdate};

/// The file, in lemonade's cache dir.
pub const CONFIG_FILE: &str = "config.json";

/// When a change takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// At once (the log filter, the catalogue, the timeouts, the scheduler).
    Now,
    /// At the next load of a model (the options' configuration layer).
    NextLoad,
}

/// What part of lemonade a key configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// `log_level`, `extra_models_dir`, the timeouts.
    Server,
    /// The scheduler's settings (what `POST /params` sets).
    Scheduler,
    /// The server-wide layer of the load options.
    Options,
}

/// One key of `config.json`.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub group: Group,
    pub effect: Effect,
}

const fn key(name: &'static str, group: Group, effect: Effect) -> Key {
    Key { name, group, effect }
}

/// Every key, in the order `GET /internal/config` lists them.
pub const KEYS: &[Key] = &[
    key("log_level", Group::Server, Effect::Now),
    key("extra_models_dir", Group::Server, Effect::Now),
    key("load_timeout", Group::Server, Effect::Now),
    key("pull_timeout", Group::Server, Effect::Now),
    key("remote_timeout", Group::Server, Effect::Now),
    key("stream_timeout", Group::Server, Effect::Now),
    key("offline", Group::Server, Effect::Now),
    key("download_rate_limit", Group::Server, Effect::Now),
    key("model_names", Group::Server, Effect::Now),
    key("trust_incoming_trace_context", Group::Server, Effect::Now),
    key("sandbox", Group::Server, Effect::NextLoad),
    key("max_loaded_models", Group::Scheduler, Effect::Now),
    key("idle_timeout", Group::Scheduler, Effect::Now),
    key("max_queue", Group::Scheduler, Effect::Now),
    key("memory_budget", Group::Scheduler, Effect::Now),
    key("vram_budget", Group::Scheduler, Effect::Now),
    key("swap_hold_ms", Group::Scheduler, Effect::Now),
    key("ctx_size", Group::Options, Effect::NextLoad),
    key("device", Group::Options, Effect::NextLoad),
    key("llamacpp_backend", Group::Options, Effect::NextLoad),
    key("llamacpp_args", Group::Options, Effect::NextLoad),
    key("cache_ram", Group::Options, Effect::NextLoad),
    key("sdcpp_backend", Group::Options, Effect::NextLoad),
    key("whispercpp_backend", Group::Options, Effect::NextLoad),
    key("whispercpp_args", Group::Options, Effect::NextLoad),
    key("steps", Group::Options, Effect::NextLoad),
    key("cfg_scale", Group::Options, Effect::NextLoad),
    key("width", Group::Options, Effect::NextLoad),
    key("height", Group::Options, Effect::NextLoad),
];

/// The key named `name`.
pub fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Log levels `log_level` takes: lemonade's, and v11's names for the same (`fatal` is
/// `critical`; `none` logs errors only, as lemonade always reports those).
pub const LOG_LEVELS: &[&str] = &["critical", "error", "warning", "info", "debug", "trace", "fatal", "none"];

/// The factory defaults: what a fresh `config.json` means (`GET /internal/config/defaults`).
pub fn defaults() -> Map<String, Value> {
    let v = json!({
        "log_level": "info",
        "extra_models_dir": "",
        "load_timeout": 600,
        "pull_timeout": 3600,
        "remote_timeout": 300,
        // A streamed answer whose backend sends nothing for this long is cut (the
        // low-transfer timeout); `global_timeout` sets it too.
        "stream_timeout": 300,
        // No network call at all: no update check, no Hub, no release download.
        "offline": false,
        // Downloads' bytes per second, all of them together (0: unlimited); "50M" and
        // "800K" are accepted too.
        "download_rate_limit": 0,
        // How listings name models: "v11" (current Lemonade: a registered model by its bare
        // name) or "v9" (`user.X`, for clients pinned to v9).
        "model_names": "v11",
        // A request's W3C trace context is continued to its backend (v11's
        // `telemetry.trust_incoming_trace_context`; lemonade's default is to continue it).
        "trust_incoming_trace_context": true,
        // How backends are confined: `auto` is the strongest the kernel holds.
        "sandbox": "auto",
        "max_loaded_models": 1,
        "idle_timeout": 0,
        "max_queue": 256,
        "memory_budget": "auto",
        "vram_budget": "auto",
        "swap_hold_ms": 2000,
        "ctx_size": backends::llamacpp::DEFAULT_CTX_SIZE,
        "device": "auto",
        "llamacpp_backend": "cpu",
        "llamacpp_args": "",
        // llama-server's host prompt cache (MiB): null sizes it from each model (its KV cache).
        "cache_ram": null,
        "sdcpp_backend": "cpu",
        "whispercpp_backend": "cpu",
        "whispercpp_args": "",
        "steps": backends::sdcpp::DEFAULT_STEPS,
        "cfg_scale": backends::sdcpp::DEFAULT_CFG_SCALE,
        "width": backends::sdcpp::DEFAULT_SIZE,
        "height": backends::sdcpp::DEFAULT_SIZE,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A refused key or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

fn refuse(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_string(), message: message.into() }
}

/// The options group of `values` as load options (the server-wide layer).
pub fn options(values: &Map<String, Value>) -> Result<LoadOptions, ConfigError> {
    let mut m = Map::new();
    for k in KEYS.iter().filter(|k| k.group == Group::Options) {
        if let Some(v) = values.get(k.name) {
            m.insert(option_name(k.name).to_string(), v.clone());
        }
    }
    let o = LoadOptions::from_map(&m).map_err(|e| refuse(config_key(e.key), e.message))?;
    backends::options::check(&o).map_err(|e| refuse(config_key(e.key.as_str()), e.message))?;
    Ok(o)
}

/// The load option a config key of the options group sets: the same name, but v11's
/// `sdcpp_backend`, which is the `sd-cpp_backend` option.
pub fn option_name(config_key: &str) -> &str {
    if config_key == "sdcpp_backend" {
        "sd-cpp_backend"
    } else {
        config_key
    }
}

/// The config key of a load option (the inverse of [`option_name`]).
pub fn config_key(option: &str) -> &str {
    if option == "sd-cpp_backend" {
        "sdcpp_backend"
    } else {
        option
    }
}

/// The scheduler group of `values` as a `/params` update (its values are checked where the
/// scheduler's settings are built).
pub fn scheduler(values: &Map<String, Value>) -> Result<ParamsUpdate, ConfigError> {
    let mut u = ParamsUpdate::default();
    for k in KEYS.iter().filter(|k| k.group == Group::Scheduler) {
        let Some(v) = values.get(k.name) else { continue };
        let one = Value::Object(Map::from_iter([(k.name.to_string(), v.clone())]));
        let parsed: ParamsUpdate = serde_json::from_value(one).map_err(|e| refuse(k.name, e.to_string()))?;
        u = ParamsUpdate {
            max_loaded_models: parsed.max_loaded_models.or(u.max_loaded_models),
            idle_timeout: parsed.idle_timeout.or(u.idle_timeout),
            max_queue: parsed.max_queue.or(u.max_queue),
            memory_budget: parsed.memory_budget.or(u.memory_budget),
            vram_budget: parsed.vram_budget.or(u.vram_budget),
            swap_hold_ms: parsed.swap_hold_ms.or(u.swap_hold_ms),
        };
    }
    Ok(u)
}

/// Checks the server group's values that `values` holds.
pub fn check_server(values: &Map<String, Value>) -> Result<(), ConfigError> {
    if let Some(v) = values.get("sandbox") {
        if v.as_str().is_none_or(|s| s != "auto" && backends::sandbox::Mode::parse(s).is_none()) {
            return Err(refuse("sandbox", format!("sandbox must be auto, strict, best-effort or off, got {v}")));
        }
    }
    if let Some(v) = values.get("log_level") {
        match v.as_str() {
            Some(l) if LOG_LEVELS.contains(&l) => {}
            _ => {
                return Err(refuse("log_level", format!("log_level must be one of {}, got {v}", LOG_LEVELS.join(", "))))
            }
        }
    }
    if let Some(v) = values.get("extra_models_dir") {
        match v.as_str() {
            Some(d) if !d.chars().any(char::is_control) => {}
            _ => {
                return Err(refuse(
                    "extra_models_dir",
                    format!("extra_models_dir must be a folder path or \"\", got {v}"),
                ))
            }
        }
    }
    for k in ["offline", "trust_incoming_trace_context"] {
        if let Some(v) = values.get(k).filter(|v| !v.is_boolean()) {
            return Err(refuse(k, format!("{k} must be true or false, got {v}")));
        }
    }
    if let Some(v) = values.get("download_rate_limit") {
        if rate_limit(v).is_none() {
            return Err(refuse(
                "download_rate_limit",
                format!("download_rate_limit must be bytes per second (0: unlimited), a number or a size such as \"50M\", got {v}"),
            ));
        }
    }
    if let Some(v) = values.get("model_names") {
        if v.as_str().is_none_or(|s| s != "v11" && s != "v9") {
            return Err(refuse("model_names", format!("model_names must be \"v11\" or \"v9\", got {v}")));
        }
    }
    for k in ["load_timeout", "pull_timeout", "remote_timeout", "stream_timeout"] {
        if let Some(v) = values.get(k) {
            if v.as_u64().is_none_or(|s| s == 0) {
                return Err(refuse(k, format!("{k} must be a positive number of seconds, got {v}")));
            }
        }
    }
    Ok(())
}

/// `download_rate_limit`'s bytes per second (0: unlimited): a whole number, or a string of
/// one with a `K`, `M` or `G` suffix (powers of 1024; a trailing `B` or `/s` is allowed).
pub fn rate_limit(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let s = v.as_str()?.trim();
    let s = s.strip_suffix("/s").unwrap_or(s);
    let s = s.strip_suffix(['B', 'b']).unwrap_or(s);
    let (digits, scale) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(scale)
}

/// Checks an update: every key known, every value of its kind (`null` resets a key to its
/// default and is always valid). The first refusal names its key; nothing is half applied.
pub fn check(update: &Map<String, Value>) -> Result<(), ConfigError> {
    if let Some(k) = update.keys().find(|k| find(k).is_none()) {
        let known: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        return Err(refuse(k, format!("Unknown configuration key '{k}' (known: {})", known.join(", "))));
    }
    let set: Map<String, Value> =
        update.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    check_server(&set)?;
    scheduler(&set)?;
    options(&set)?;
    Ok(())
}

/// Lemonade v11.7's nested per-backend settings lemonade has, as its flat keys:
/// `(section, key, flat key)`. `llamacpp.backend` is `llamacpp_backend`, and so on.
pub const SECTIONS: &[(&str, &str, &str)] = &[
    ("llamacpp", "backend", "llamacpp_backend"),
    ("llamacpp", "args", "llamacpp_args"),
    ("sdcpp", "backend", "sdcpp_backend"),
    ("sdcpp", "steps", "steps"),
    ("sdcpp", "cfg_scale", "cfg_scale"),
    ("sdcpp", "width", "width"),
    ("sdcpp", "height", "height"),
    ("whispercpp", "backend", "whispercpp_backend"),
    ("whispercpp", "args", "whispercpp_args"),
    ("telemetry", "trust_incoming_trace_context", "trust_incoming_trace_context"),
];

/// v11.7's `global_timeout` (HTTP, inference and readiness) sets these.
pub const GLOBAL_TIMEOUT_KEYS: &[&str] = &["load_timeout", "remote_timeout", "stream_timeout"];

/// `update` in lemonade's flat keys: v11.7's nested sections (`{"llamacpp": {"backend": …}}`)
/// and dotted keys (`"llamacpp.backend"`, as `lemonade config set` takes them) become the flat
/// keys of [`SECTIONS`], a section's `null` resets its keys, a backend of `"auto"` (v11's
/// "choose for me") is the default, and `global_timeout` sets [`GLOBAL_TIMEOUT_KEYS`]. Other
/// keys pass through for [`check`]. `strict` (a `POST /internal/set`) refuses a section key
/// lemonade does not have, naming it; otherwise (a v11 `config.json` read at start) such keys
/// are skipped.
pub fn flatten(update: &Map<String, Value>, strict: bool) -> Result<Map<String, Value>, ConfigError> {
    let mut out = Map::new();
    for (k, v) in update {
        let section = SECTIONS.iter().any(|(s, _, _)| s == k);
        match (k.split_once('.'), v) {
            (Some((sec, sub)), _) => section_key(&mut out, sec, sub, v, strict)?,
            (None, Value::Object(o)) if section => {
                for (sub, sv) in o {
                    section_key(&mut out, k, sub, sv, strict)?;
                }
            }
            (None, Value::Null) if section => {
                for (_, _, flat) in SECTIONS.iter().filter(|(s, _, _)| s == k) {
                    out.insert(flat.to_string(), Value::Null);
                }
            }
            (None, _) if section => return Err(refuse(k, format!("'{k}' must be an object of settings, got {v}"))),
            (None, _) if k == "global_timeout" => {
                for t in GLOBAL_TIMEOUT_KEYS {
                    out.insert(t.to_string(), v.clone());
                }
            }
            (None, _) => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

fn section_key(out: &mut Map<String, Value>, sec: &str, sub: &str, v: &Value, strict: bool) -> Result<(), ConfigError> {
    let name = format!("{sec}.{sub}");
    match SECTIONS.iter().find(|(s, k, _)| *s == sec && *k == sub) {
        Some((_, k, flat)) => {
            let auto = *k == "backend" && v.as_str() == Some("auto");
            out.insert(flat.to_string(), if auto { Value::Null } else { v.clone() });
        }
        None if strict => {
            let have: Vec<String> = SECTIONS.iter().map(|(s, k, _)| format!("{s}.{k}")).collect();
            return Err(refuse(
                &name,
                format!("'{name}' is not a setting of lemonade (its backend settings: {})", have.join(", ")),
            ));
        }
        None => {}
    }
    Ok(())
}

/// `values` (flat) with v11.7's nested sections beside the flat keys, and `global_timeout`
/// (the load timeout), so a v11.7 client reads `llamacpp.backend` where it expects it.
pub fn with_sections(mut values: Map<String, Value>) -> Map<String, Value> {
    for (sec, sub, flat) in SECTIONS {
        let Some(v) = values.get(*flat).cloned() else { continue };
        if let Value::Object(o) = values.entry(sec.to_string()).or_insert_with(|| Value::Object(Map::new())) {
            o.insert(sub.to_string(), v);
        }
    }
    if let Some(t) = values.get(GLOBAL_TIMEOUT_KEYS[0]).cloned() {
        values.insert("global_timeout".into(), t);
    }
    values
}

/// `over` merged into `base`: objects key by key (recursively), anything else replaced.
pub fn deep_merge(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => deep_merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The file after `update`: values set, `null` removes a key (back to its default); keys the
/// file has that this build does not know are kept.
pub fn updated_file(file: &Map<String, Value>, update: &Map<String, Value>) -> Map<String, Value> {
    let mut out = file.clone();
    for (k, v) in update {
        // A v11.7 file's nested form of the key gives way to the flat one written now.
        for (sec, sub, _) in SECTIONS.iter().filter(|(_, _, flat)| flat == k) {
            if let Some(Value::Object(o)) = out.get_mut(*sec) {
                o.remove(*sub);
            }
        }
        if v.is_null() {
            out.remove(k);
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn every_key_has_a_default_and_the_defaults_pass_the_check() {
        let d = defaults();
        assert_eq!(d.len(), KEYS.len());
        for k in KEYS {
            assert!(d.contains_key(k.name), "{}", k.name);
        }
        check(&d).unwrap();
        assert_eq!(
            options(&d).unwrap().sdcpp_backend.as_deref(),
            Some("cpu"),
            "v11's sdcpp_backend is the sd-cpp_backend option"
        );
        assert_eq!(scheduler(&d).unwrap().max_queue, Some(256));
    }

    #[test]
    fn a_download_rate_limit_reads_as_bytes_per_second() {
        for (v, want) in [
            (json!(0), Some(0)),
            (json!(1500), Some(1500)),
            (json!("800K"), Some(800 << 10)),
            (json!("50M"), Some(50 << 20)),
            (json!("2 MB/s"), Some(2 << 20)),
            (json!("1G"), Some(1 << 30)),
            (json!("fast"), None),
            (json!(1.5), None),
            (json!("M"), None),
        ] {
            assert_eq!(rate_limit(&v), want, "{v}");
        }
    }

    #[test]
    fn a_bad_key_or_value_is_named() {
        for (update, key) in [
            (json!({"nope": 1}), "nope"),
            (json!({"log_level": "loud"}), "log_level"),
            (json!({"load_timeout": 0}), "load_timeout"),
            (json!({"ctx_size": 0}), "ctx_size"),
            (json!({"llamacpp_backend": "cuda"}), "llamacpp_backend"),
            (json!({"sdcpp_backend": "vulkan"}), "sdcpp_backend"),
            (json!({"llamacpp_args": "--port 1"}), "llamacpp_args"),
            (json!({"max_queue": "many"}), "max_queue"),
            (json!({"steps": 0}), "steps"),
            (json!({"offline": "yes"}), "offline"),
            (json!({"download_rate_limit": "fast"}), "download_rate_limit"),
            (json!({"download_rate_limit": -1}), "download_rate_limit"),
            (json!({"model_names": "v10"}), "model_names"),
            (json!({"stream_timeout": 0}), "stream_timeout"),
        ] {
            assert_eq!(check(&map(update.clone())).unwrap_err().key, key, "{update}");
        }
        check(&map(json!({"ctx_size": -1, "log_level": "fatal", "extra_models_dir": null}))).unwrap();
    }

    #[test]
    fn v11_nested_sections_dotted_keys_and_global_timeout_flatten() {
        let update = map(json!({
            "llamacpp": {"backend": "auto", "args": "--no-mmap"},
            "sdcpp.steps": 4,
            "whispercpp": null,
            "global_timeout": 900,
            "ctx_size": 2048,
        }));
        let flat = flatten(&update, true).unwrap();
        assert_eq!(
            Value::Object(flat.clone()),
            json!({"llamacpp_backend": null, "llamacpp_args": "--no-mmap", "steps": 4, "whispercpp_backend": null, "whispercpp_args": null,
                   "load_timeout": 900, "remote_timeout": 900, "stream_timeout": 900, "ctx_size": 2048})
        );
        check(&flat).unwrap();
        for (bad, key) in [
            (json!({"llamacpp": {"cpu_bin": "latest"}}), "llamacpp.cpu_bin"),
            (json!({"llamacpp.device": "0"}), "llamacpp.device"),
            (json!({"sdcpp": 3}), "sdcpp"),
        ] {
            assert_eq!(flatten(&map(bad.clone()), true).unwrap_err().key, key, "{bad}");
        }
        // A v11.7 config.json read at start: what lemonade lacks is skipped.
        let file = map(json!({"llamacpp": {"backend": "auto", "cpu_bin": "builtin", "prefer_system": true},
                              "port": 13305}));
        assert_eq!(Value::Object(flatten(&file, false).unwrap()), json!({"llamacpp_backend": null, "port": 13305}));
        let shown = with_sections(map(json!({"llamacpp_backend": "cpu", "steps": 20, "load_timeout": 600})));
        assert_eq!(
            (shown["llamacpp"].clone(), shown["sdcpp"].clone(), shown["global_timeout"].clone()),
            (json!({"backend": "cpu"}), json!({"steps": 20}), json!(600))
        );
    }

    #[test]
    fn the_file_merges_deeply_keeps_unknown_keys_and_null_removes() {
        let mut base = map(json!({"a": {"x": 1, "y": 2}, "b": 1}));
        deep_merge(&mut base, &map(json!({"a": {"y": 3}, "c": 4})));
        assert_eq!(Value::Object(base), json!({"a": {"x": 1, "y": 3}, "b": 1, "c": 4}));
        let file = map(json!({"ctx_size": 2048, "future_key": {"k": true}}));
        let after = updated_file(&file, &map(json!({"ctx_size": null, "log_level": "debug"})));
        assert_eq!(Value::Object(after), json!({"future_key": {"k": true}, "log_level": "debug"}));
        let v11 = map(json!({"llamacpp": {"backend": "vulkan", "cpu_bin": "builtin"}}));
        let after = updated_file(&v11, &map(json!({"llamacpp_backend": "cpu"})));
        assert_eq!(Value::Object(after), json!({"llamacpp": {"cpu_bin": "builtin"}, "llamacpp_backend": "cpu"}));
    }
}
