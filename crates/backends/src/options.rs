//! What each recipe's load options may be: the values a recipe's backend starts with when
//! nothing chose one ([`defaults`]), and the check every option passes where it enters
//! ([`check`]), the same for `/load`, `POST /models/{id}/options` and their dry runs.

use api_types::{CtxSize, LoadOptions, OptionKey};

use crate::sdcpp::{MAX_SIDE, MIN_SIDE};
use crate::{llamacpp, rpc, sdcpp, Recipe};

/// A rejected option: the message, the option it names, and a code when the API has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub message: String,
    pub key: OptionKey,
    pub code: Option<&'static str>,
}

fn invalid(key: OptionKey, message: String) -> Invalid {
    Invalid { message, key, code: None }
}

/// The options a model of `recipe` gets when no layer sets them (the lowest layer of the
/// precedence chain): every option the recipe takes has a value here.
pub fn defaults(recipe: Recipe) -> LoadOptions {
    let backend = Some(recipe.default_backend().to_string());
    let o = LoadOptions {
        ctx_size: Some(CtxSize::Tokens(llamacpp::DEFAULT_CTX_SIZE)),
        parallel: None,
        device: Some("auto".into()),
        draft_model: None,
        cache_ram: None,
        flm_args: Some(String::new()),
        llamacpp_backend: backend.clone(),
        llamacpp_args: Some(String::new()),
        rpc_servers: Some(Vec::new()),
        whispercpp_backend: backend.clone(),
        whispercpp_args: Some(String::new()),
        merge_args: Some(true),
        sdcpp_backend: backend,
        steps: Some(sdcpp::DEFAULT_STEPS),
        cfg_scale: Some(sdcpp::DEFAULT_CFG_SCALE),
        width: Some(sdcpp::DEFAULT_SIZE),
        height: Some(sdcpp::DEFAULT_SIZE),
        sampling_method: None,
        flow_shift: None,
        sdcpp_args: Some(String::new()),
        idle_timeout: None,
        max_concurrent: None,
        priority: None,
        spillover: None,
    };
    o.keep(recipe.option_keys())
}

fn backend_in(recipe: Recipe, key: OptionKey, b: &Option<String>) -> Result<(), Invalid> {
    match b {
        Some(b) if !recipe.backends().contains(&b.as_str()) => {
            Err(invalid(key, format!("{} must be one of {}, got '{b}'", key.as_str(), recipe.backends().join(", "))))
        }
        _ => Ok(()),
    }
}

fn side(key: OptionKey, v: Option<u32>) -> Result<(), Invalid> {
    match v {
        Some(v) if !((MIN_SIDE..=MAX_SIDE).contains(&v) && v % 64 == 0) => Err(invalid(
            key,
            format!(
                "Invalid value for '{}': expected a multiple of 64 from {MIN_SIDE} to {MAX_SIDE}, got {v}",
                key.as_str()
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks every option that is set, whatever the recipe (a value must be valid wherever it
/// applies); the error names the option.
pub fn check(o: &LoadOptions) -> Result<(), Invalid> {
    backend_in(Recipe::LlamaCpp, OptionKey::LlamacppBackend, &o.llamacpp_backend)?;
    backend_in(Recipe::WhisperCpp, OptionKey::WhispercppBackend, &o.whispercpp_backend)?;
    backend_in(Recipe::SdCpp, OptionKey::SdcppBackend, &o.sdcpp_backend)?;
    if let Some(a) = &o.llamacpp_args {
        llamacpp::tokenize(a).and_then(|t| llamacpp::validate_user_args(&t)).map_err(|e| Invalid {
            message: e.to_string(),
            key: OptionKey::LlamacppArgs,
            code: Some("invalid_llamacpp_args"),
        })?;
    }
    if let Some(a) = &o.whispercpp_args {
        crate::whispercpp::user_args(a).map_err(|e| Invalid {
            message: e.to_string(),
            key: OptionKey::WhispercppArgs,
            code: Some("invalid_whispercpp_args"),
        })?;
    }
    if let Some(a) = &o.sdcpp_args {
        sdcpp::user_args(a).map_err(|message| Invalid {
            message: message.to_string(),
            key: OptionKey::SdcppArgs,
            code: Some("invalid_sdcpp_args"),
        })?;
    }
    if let Some(m) = o.sampling_method.as_deref().filter(|m| !sdcpp::SAMPLERS.contains(m)) {
        return Err(invalid(
            OptionKey::SamplingMethod,
            format!("Invalid value for 'sampling_method': expected one of {}, got '{m}'", sdcpp::SAMPLERS.join(", ")),
        ));
    }
    if let Some(f) = o.flow_shift.filter(|f| !f.is_finite() || !(0.0..=100.0).contains(f)) {
        return Err(invalid(
            OptionKey::FlowShift,
            format!("Invalid value for 'flow_shift': expected 0 to 100, got {f}"),
        ));
    }
    if let Some(n) = o.parallel.filter(|n| *n > MAX_PARALLEL) {
        return Err(invalid(
            OptionKey::Parallel,
            format!("Invalid value for 'parallel': expected 1 to {MAX_PARALLEL}, or 0 for as many as memory allows, got {n}"),
        ));
    }
    let args = o.llamacpp_args.as_deref().and_then(|a| llamacpp::tokenize(a).ok()).unwrap_or_default();
    if o.parallel.is_some()
        && llamacpp::first_reserved(&args, &["-np", "--parallel", "--kv-unified-per-slot"]).is_some()
    {
        return Err(invalid(
            OptionKey::Parallel,
            "Set 'parallel' or llama-server's --parallel in llamacpp_args, not both".to_string(),
        ));
    }
    if let Some(d) = &o.device {
        device_ids(d)?;
    }
    if let Some(n) = o.max_concurrent.filter(|n| !MAX_CONCURRENT.contains(n)) {
        return Err(invalid(
            OptionKey::MaxConcurrent,
            format!("Invalid value for 'max_concurrent': expected 1 to 1024, got {n}"),
        ));
    }
    if let Some(p) = o.priority.filter(|p| !PRIORITIES.contains(p)) {
        return Err(invalid(
            OptionKey::Priority,
            format!("Invalid value for 'priority': expected -10 to 10 (higher loads first), got {p}"),
        ));
    }
    if let Some(places) = &o.spillover {
        let bad = places.iter().find(|p| crate::cloud::split(p).is_none() || p.len() > 256);
        if places.len() > 8 || bad.is_some() {
            return Err(invalid(
                OptionKey::Spillover,
                format!(
                    "Invalid value for 'spillover': expected up to 8 remote models as <provider>.<id>{}",
                    bad.map(|b| format!(", got '{}'", b.chars().take(64).collect::<String>())).unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(n) = o.cache_ram.filter(|n| *n > MAX_CACHE_RAM_MIB) {
        return Err(invalid(
            OptionKey::CacheRam,
            format!("Invalid value for 'cache_ram': expected 0 (off) to {MAX_CACHE_RAM_MIB} MiB, got {n}"),
        ));
    }
    if o.draft_model.as_deref().is_some_and(|d| d.trim().is_empty() || d.len() > 512) {
        return Err(invalid(
            OptionKey::DraftModel,
            "Invalid value for 'draft_model': expected the name of a model in the catalogue".into(),
        ));
    }
    if let Some(a) = &o.flm_args {
        let ctx = o.ctx_size.and_then(|c| if let CtxSize::Tokens(n) = c { Some(n) } else { None }).unwrap_or(0);
        crate::flm::resolve_args(a, ctx).map_err(|e| Invalid {
            message: e.0,
            key: OptionKey::FlmArgs,
            code: Some("invalid_flm_args"),
        })?;
    }
    for w in o.rpc_servers.iter().flatten() {
        rpc::check_worker(w).map_err(|m| invalid(OptionKey::RpcServers, m.to_string()))?;
    }
    if let Some(s) = o.steps.filter(|s| !(1..=150).contains(s)) {
        return Err(invalid(OptionKey::Steps, format!("Invalid value for 'steps': expected 1 to 150, got {s}")));
    }
    if let Some(c) = o.cfg_scale.filter(|c| !(0.0..=30.0).contains(c)) {
        return Err(invalid(OptionKey::CfgScale, format!("Invalid value for 'cfg_scale': expected 0 to 30, got {c}")));
    }
    side(OptionKey::Width, o.width)?;
    side(OptionKey::Height, o.height)
}

/// The devices the `device` option names: empty for `auto`, else one or more ids (lower-case
/// letters and digits, comma-separated, no repeats). Whether they exist is the engine's to say.
pub fn device_ids(v: &str) -> Result<Vec<String>, Invalid> {
    let v = v.trim();
    if v == "auto" {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
    let good =
        |s: &String| !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if let Some(bad) = ids.iter().find(|s| !good(s)) {
        return Err(invalid(OptionKey::Device, format!("Invalid value for 'device': expected 'auto', a device id such as 'gpu0', or ids separated by commas, got '{bad}' in '{v}'")));
    }
    if let Some((_, d)) = ids.iter().enumerate().find(|(i, d)| ids[..*i].contains(d)) {
        return Err(invalid(OptionKey::Device, format!("Invalid value for 'device': '{d}' is named twice in '{v}'")));
    }
    Ok(ids)
}

/// The priorities a model or a request may have (higher goes first); 0 by default.
pub const PRIORITIES: std::ops::RangeInclusive<i32> = -10..=10;

/// The largest `cache_ram` (MiB): 1 TiB.
pub const MAX_CACHE_RAM_MIB: u64 = 1 << 20;

/// What a model's `max_concurrent` may be.
pub const MAX_CONCURRENT: std::ops::RangeInclusive<u32> = 1..=1024;

/// The most slots `parallel` may ask for.
pub const MAX_PARALLEL: u32 = 64;

/// Checks that `recipe` takes every option in `keys` (`POST /models/{id}/options` refuses an
/// option of another recipe).
pub fn check_keys(recipe: Recipe, keys: &[OptionKey]) -> Result<(), Invalid> {
    let takes = recipe.option_keys();
    match keys.iter().find(|k| !takes.contains(k) && !OptionKey::SCHEDULING.contains(k)) {
        Some(k) => Err(invalid(
            *k,
            format!(
                "'{}' is not an option of the {recipe} recipe (it takes: {})",
                k.as_str(),
                takes
                    .iter()
                    .map(|k| k.as_str())
                    .chain(OptionKey::SCHEDULING.iter().map(|k| k.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_option_has_a_default_and_no_other() {
        for r in Recipe::ALL {
            // `parallel` has none: unset is llama-server's own slots, sharing one context; nor
            // `draft_model`: unset is no draft; nor `cache_ram`: unset is sized from the model;
            // nor sd.cpp's `sampling_method` and `flow_shift`: unset is sd-server's own choice
            // for the model.
            let none = [
                OptionKey::Parallel,
                OptionKey::DraftModel,
                OptionKey::CacheRam,
                OptionKey::SamplingMethod,
                OptionKey::FlowShift,
            ];
            let keys: Vec<OptionKey> = r.option_keys().iter().copied().filter(|k| !none.contains(k)).collect();
            assert_eq!(defaults(r).keys(), keys, "{r}");
            assert!(check(&defaults(r)).is_ok(), "{r}: the defaults pass the check");
        }
    }

    #[test]
    fn check_names_the_option_it_refuses() {
        let bad = [
            (LoadOptions { llamacpp_backend: Some("cuda".into()), ..Default::default() }, OptionKey::LlamacppBackend),
            (LoadOptions { llamacpp_args: Some("--port 9".into()), ..Default::default() }, OptionKey::LlamacppArgs),
            (LoadOptions { rpc_servers: Some(vec!["nope".into()]), ..Default::default() }, OptionKey::RpcServers),
            (LoadOptions { steps: Some(0), ..Default::default() }, OptionKey::Steps),
            (LoadOptions { parallel: Some(65), ..Default::default() }, OptionKey::Parallel),
            (
                LoadOptions { parallel: Some(2), llamacpp_args: Some("-np 4".into()), ..Default::default() },
                OptionKey::Parallel,
            ),
            (LoadOptions { cfg_scale: Some(31.0), ..Default::default() }, OptionKey::CfgScale),
            (LoadOptions { width: Some(100), ..Default::default() }, OptionKey::Width),
            (LoadOptions { sdcpp_backend: Some("vulkan".into()), ..Default::default() }, OptionKey::SdcppBackend),
        ];
        for (o, key) in bad {
            assert_eq!(check(&o).unwrap_err().key, key, "{o:?}");
        }
        assert_eq!(check_keys(Recipe::WhisperCpp, &[OptionKey::CtxSize]).unwrap_err().key, OptionKey::CtxSize);
        assert!(check_keys(Recipe::LlamaCpp, &[OptionKey::CtxSize, OptionKey::IdleTimeout]).is_ok());
    }
}

/// `higher` merged with `lower` (Lemonade v11's `merge_args`): every flag of `higher` with its
/// values, then each flag of `lower` that `higher` does not set, unless it is a switch whose
/// negation (`--no-x` for `--x` and back) `higher` sets. Order is kept (`higher`'s first). An
/// empty side gives the other.
pub fn merge_args(higher: &str, lower: &str) -> Result<String, llamacpp::ArgsError> {
    let (h, l) = (llamacpp::tokenize(higher)?, llamacpp::tokenize(lower)?);
    if h.is_empty() || l.is_empty() {
        return Ok(if h.is_empty() { lower } else { higher }.to_string());
    }
    let (hg, lg) = (flag_groups(&h), flag_groups(&l));
    let has = |f: &str| hg.iter().any(|(g, _)| *g == f);
    let mut out: Vec<&str> = h.iter().map(String::as_str).collect();
    for (flag, tokens) in &lg {
        let switch = tokens.len() == 1 && !tokens[0].contains('=');
        if has(flag) || (switch && negation(flag).is_some_and(|n| has(&n))) {
            continue;
        }
        out.extend(tokens.iter().map(String::as_str));
    }
    Ok(out.iter().map(|t| quote(t)).collect::<Vec<_>>().join(" "))
}

/// Tokens grouped by the flag they belong to (a value follows its flag; `--a=b` is `--a`).
fn flag_groups(tokens: &[String]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for t in tokens {
        match groups.last_mut() {
            Some((_, g)) if !t.starts_with('-') => g.push(t.clone()),
            _ => groups.push((llamacpp::flag_of(t).to_string(), vec![t.clone()])),
        }
    }
    groups
}

fn negation(flag: &str) -> Option<String> {
    match flag.strip_prefix("--no-") {
        Some(rest) => Some(format!("--{rest}")),
        None => flag.strip_prefix("--").map(|rest| format!("--no-{rest}")),
    }
}

/// A token as [`llamacpp::tokenize`] reads it back.
fn quote(t: &str) -> String {
    if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'') {
        if t.contains('"') {
            format!("'{t}'")
        } else {
            format!("\"{t}\"")
        }
    } else {
        t.to_string()
    }
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    #[test]
    fn merged_args_keep_the_higher_layers_flags_and_add_the_lowers_others() {
        for (higher, lower, want) in [
            ("-t 4", "-t 2 --no-mmap", "-t 4 --no-mmap"),
            ("", "--no-mmap", "--no-mmap"),
            ("-t 4", "", "-t 4"),
            ("--no-mmap", "--mmap -np 2", "--no-mmap -np 2"),
            ("--mmap", "--no-mmap", "--mmap"),
            ("--keep=4", "--keep 8 --lora a.gguf --lora b.gguf", "--keep=4 --lora a.gguf --lora b.gguf"),
            ("--chat-template-kwargs '{\"a\": 1}'", "-t 2", "--chat-template-kwargs '{\"a\": 1}' -t 2"),
        ] {
            let got = merge_args(higher, lower).unwrap();
            assert_eq!(got, want, "{higher} over {lower}");
            let back = llamacpp::tokenize(&got).unwrap();
            assert_eq!(back.len(), llamacpp::tokenize(want).unwrap().len());
        }
        assert!(merge_args("'open", "-t 1").is_err());
    }
}
