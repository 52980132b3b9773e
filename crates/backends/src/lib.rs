//! Backend adapters (pure: no processes, no files, no network).
//!
//! * [`Recipe`]: the recipes lemonade knows and the one list of those it runs.
//! * [`launch`]: per recipe, (model, resolved options, hardware facts) → [`Launch`]: the
//!   arguments, environment, readiness rule and served API paths of its backend process.
//! * [`llamacpp`], [`ryzenai`], [`whispercpp`], [`sdcpp`], [`kokoro`]: the adapters.
//! * [`releases`]: the backend table, version pins, release archives and install states.
//!
//! The process supervisor and binary resolution that act on these values live in `host`.

pub mod capabilities;
pub mod cloud;
pub mod devices;
pub mod flm;
pub mod kokoro;
pub mod llamacpp;
pub mod options;
pub mod prompt_cache;
pub mod recipe;
pub mod releases;
pub mod rpc;
pub mod ryzenai;
pub mod sandbox;
pub mod sdcpp;
pub mod upstream;
pub mod whispercpp;

use std::path::{Path, PathBuf};
use std::time::Duration;

use api_types::{LoadOptions, ModelType};

pub use recipe::{Device, Recipe};
pub use releases::Hardware;

/// The errors of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("Unknown recipe '{0}'")]
    UnknownRecipe(String),
    #[error("The '{0}' recipe has no backend adapter in this lemonade build (supported: {runnable})", runnable = Recipe::runnable_names())]
    NotRunnable(Recipe),
    #[error(transparent)]
    Args(#[from] llamacpp::ArgsError),
    #[error(transparent)]
    WhisperArgs(#[from] whispercpp::WhisperArgsError),
    #[error(transparent)]
    FlmArgs(#[from] flm::FlmArgsError),
    #[error("{0}")]
    InvalidOverride(String),
    #[error("the {0} adapter needs a port chosen before the start")]
    NeedsPort(Recipe),
    #[error("backend versions: {0}")]
    Pins(String),
}

/// How the supervisor learns that a started backend listens, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// The process binds port 0 itself and prints `listening on http://HOST:PORT`.
    ListeningLine,
    /// The process was told this port.
    FixedPort(u16),
}

/// What a recipe's adapter decides about one backend process.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub readiness: Readiness,
    /// Readiness endpoint, probed until it answers 200.
    pub health_path: &'static str,
    /// The API paths (under `/v1`, and llama.cpp's own at the root) the backend serves.
    pub served_paths: &'static [&'static str],
}

impl Launch {
    /// The launch of a backend that is told its port (it cannot bind port 0 and report it):
    /// `args(port)`, ready once `health_path` answers on that port.
    pub fn on_port(
        recipe: Recipe,
        input: &LaunchInput,
        health_path: &'static str,
        served_paths: &'static [&'static str],
        args: impl FnOnce(u16) -> Vec<String>,
    ) -> Result<Launch, BackendError> {
        let port = input.port.ok_or(BackendError::NeedsPort(recipe))?;
        Ok(Launch { args: args(port), env: vec![], readiness: Readiness::FixedPort(port), health_path, served_paths })
    }
}

/// What an adapter needs to know about the model and the machine.
#[derive(Debug, Clone)]
pub struct LaunchInput<'a> {
    /// The name clients use; backends that report a model name report this one.
    pub name: &'a str,
    pub main_path: &'a Path,
    pub mmproj_path: Option<&'a Path>,
    pub model_type: ModelType,
    /// Effective options (request > saved > CLI > defaults), already filtered to the recipe.
    pub options: &'a LoadOptions,
    pub hardware: &'a Hardware,
    /// A port chosen by the caller, for recipes whose backend cannot bind port 0 and report it.
    pub port: Option<u16>,
    /// The devices the scheduler placed the model on (empty: none chosen).
    pub devices: &'a [devices::Placed],
    /// The model's checkpoint (FLM serves a model by it; it is no file).
    pub checkpoint: &'a str,
    /// llama.cpp: the draft model's file, for speculative decoding.
    pub draft_path: Option<&'a Path>,
    /// What the binary that will run it supports (None: not known; built for the newest).
    pub caps: Option<&'a capabilities::Capabilities>,
}

/// A recipe's adapter: what to run for one model. Pure: it decides, `host` acts.
pub trait Adapter: Sync {
    /// Whether the caller must choose a port before [`Adapter::launch`] (the backend cannot
    /// bind port 0 and report the port it got).
    fn needs_port(&self) -> bool {
        false
    }

    /// The launch of the backend for one model.
    fn launch(&self, input: &LaunchInput) -> Result<Launch, BackendError>;
}

impl Recipe {
    /// Whether the caller must choose a port before [`launch`].
    pub fn needs_port(self) -> bool {
        self.adapter().is_some_and(|a| a.needs_port())
    }
}

/// The backend a model runs on: the recipe's backend option, else its default.
pub fn backend_of(recipe: Recipe, options: &LoadOptions) -> String {
    recipe.chosen_backend(options).unwrap_or(recipe.default_backend()).to_string()
}

/// The context size the options give. `-1` (automatic) is resolved by the engine, which knows
/// the memory there is, before a launch; unresolved, it reads as the default.
pub fn ctx_size(options: &LoadOptions) -> u32 {
    match options.ctx_size {
        Some(api_types::CtxSize::Tokens(n)) => n,
        _ => llamacpp::DEFAULT_CTX_SIZE,
    }
}

/// The launch of `recipe`'s backend for one model; a ggml backend is shown only the GPUs its
/// model was placed on.
pub fn launch(recipe: Recipe, input: &LaunchInput) -> Result<Launch, BackendError> {
    let mut l = recipe.adapter().ok_or(BackendError::NotRunnable(recipe))?.launch(input)?;
    if matches!(recipe, Recipe::LlamaCpp | Recipe::WhisperCpp | Recipe::SdCpp) {
        l.env.extend(devices::env(&backend_of(recipe, input.options), input.devices));
    }
    Ok(l)
}

/// Checks a load's extra arguments (`llamacpp_args`, `whispercpp_args`) against what the
/// binary that will run them supports, before anything is spawned: the error names the flag
/// and the binary's version.
pub fn check_args(
    recipe: Recipe,
    options: &LoadOptions,
    caps: &capabilities::Capabilities,
) -> Result<(), BackendError> {
    match recipe {
        Recipe::LlamaCpp => {
            llamacpp::user_for(options.llamacpp_args.as_deref().unwrap_or_default(), Some(caps))?;
        }
        Recipe::WhisperCpp => {
            whispercpp::user_for(options.whispercpp_args.as_deref().unwrap_or_default(), Some(caps))?;
        }
        _ => {}
    }
    Ok(())
}

/// Everything the supervisor needs to start one backend process.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// Used in logs and errors (the model name).
    pub label: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Readiness endpoint, e.g. `/health`.
    pub health_path: String,
    /// How long loading may take before the start is abandoned.
    pub ready_timeout: Duration,
    /// The port the process was told to use; None: it binds port 0 and logs the real one.
    pub port: Option<u16>,
    /// How the kernel confines it (None: not at all, as `--sandbox off`).
    pub sandbox: Option<(sandbox::Mode, sandbox::Policy)>,
}

impl SpawnSpec {
    /// The spec of `launch` run with `program`.
    pub fn new(label: &str, program: PathBuf, launch: Launch, ready_timeout: Duration) -> SpawnSpec {
        SpawnSpec {
            label: label.to_string(),
            program,
            args: launch.args,
            env: launch.env,
            health_path: launch.health_path.to_string(),
            ready_timeout,
            port: match launch.readiness {
                Readiness::FixedPort(p) => Some(p),
                Readiness::ListeningLine => None,
            },
            sandbox: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(opts: &'a LoadOptions, hw: &'a Hardware, port: Option<u16>) -> LaunchInput<'a> {
        LaunchInput {
            name: "user.M",
            main_path: Path::new("/hub/m.gguf"),
            mmproj_path: None,
            model_type: ModelType::Llm,
            options: opts,
            hardware: hw,
            port,
            devices: &[],
            checkpoint: "org/m-GGUF:Q4_0",
            draft_path: None,
            caps: None,
        }
    }

    #[test]
    fn each_runnable_recipe_has_an_adapter_and_the_others_say_so() {
        let opts = LoadOptions {
            ctx_size: Some(api_types::CtxSize::Tokens(2048)),
            llamacpp_backend: Some("vulkan".into()),
            ..LoadOptions::default()
        };
        let hw = Hardware::default();
        let l = launch(Recipe::LlamaCpp, &input(&opts, &hw, None)).unwrap();
        assert_eq!(l.readiness, Readiness::ListeningLine);
        assert!(l.args.windows(2).any(|w| w == ["--ctx-size", "2048"]), "{:?}", l.args);
        assert!(l.args.windows(2).any(|w| w == ["-ngl", "99"]), "vulkan offloads: {:?}", l.args);
        assert!(l.args.windows(2).any(|w| w == ["--alias", "user.M"]), "{:?}", l.args);
        assert!(l.served_paths.contains(&"/v1/chat/completions"));

        assert_eq!(
            launch(Recipe::RyzenAiLlm, &input(&opts, &hw, None)),
            Err(BackendError::NeedsPort(Recipe::RyzenAiLlm))
        );
        let r = launch(Recipe::RyzenAiLlm, &input(&opts, &hw, Some(9000))).unwrap();
        assert_eq!(r.readiness, Readiness::FixedPort(9000));
        assert_eq!(SpawnSpec::new("x", "/bin/x".into(), r, Duration::from_secs(1)).port, Some(9000));

        for recipe in Recipe::ALL {
            let got = launch(recipe, &input(&opts, &hw, Some(1)));
            assert_eq!(got.is_ok(), recipe.runnable(), "{recipe}: {got:?}");
        }
    }

    #[test]
    fn backend_option_or_default() {
        let mut o = LoadOptions::default();
        assert_eq!(backend_of(Recipe::LlamaCpp, &o), "cpu");
        assert_eq!(backend_of(Recipe::RyzenAiLlm, &o), "npu");
        o.llamacpp_backend = Some("rocm".into());
        assert_eq!(backend_of(Recipe::LlamaCpp, &o), "rocm");
    }
}
