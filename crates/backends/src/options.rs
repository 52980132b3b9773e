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
        llamacpp_backend: backend.clone(),
        llamacpp_args: Some(String::new()),
        rpc_servers: Some(Vec::new()),
        whispercpp_backend: backend.clone(),
        sdcpp_backend: backend,
        steps: Some(sdcpp::DEFAULT_STEPS),
        cfg_scale: Some(sdcpp::DEFAULT_CFG_SCALE),
        width: Some(sdcpp::DEFAULT_SIZE),
        height: Some(sdcpp::DEFAULT_SIZE),
        idle_timeout: None,
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
    for w in o.rpc_servers.iter().flatten() {
        rpc::check_worker(w).map_err(|m| invalid(OptionKey::RpcServers, m))?;
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

/// Checks that `recipe` takes every option in `keys` (`POST /models/{id}/options` refuses an
/// option of another recipe).
pub fn check_keys(recipe: Recipe, keys: &[OptionKey]) -> Result<(), Invalid> {
    let takes = recipe.option_keys();
    match keys.iter().find(|k| !takes.contains(k) && **k != OptionKey::IdleTimeout) {
        Some(k) => Err(invalid(
            *k,
            format!(
                "'{}' is not an option of the {recipe} recipe (it takes: {})",
                k.as_str(),
                takes
                    .iter()
                    .map(|k| k.as_str())
                    .chain([OptionKey::IdleTimeout.as_str()])
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
            assert_eq!(defaults(r).keys(), r.option_keys(), "{r}");
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
