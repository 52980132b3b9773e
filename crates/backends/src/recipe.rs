//! The recipes (kinds of backend) lemonade knows, and the one list of those this build runs.
//!
//! Every recipe Lemonade knows is a variant here already. Making one runnable is an adapter
//! module beside this file (an [`crate::Adapter`]: model + options + hardware →
//! [`crate::Launch`]) with its test, and one line in [`Recipe::adapter`].

use std::fmt;

use api_types::{LoadOptions, OptionKey};

use serde::{Deserialize, Serialize};

/// A recipe: which backend program serves a model (reference §2.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Recipe {
    #[serde(rename = "llamacpp")]
    LlamaCpp,
    #[serde(rename = "whispercpp")]
    WhisperCpp,
    #[serde(rename = "kokoro")]
    Kokoro,
    #[serde(rename = "sd-cpp")]
    SdCpp,
    #[serde(rename = "flm")]
    Flm,
    #[serde(rename = "ryzenai-llm")]
    RyzenAiLlm,
}

/// Where a recipe runs, as Lemonade reports it in `health` (`device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Gpu,
    Npu,
    Cpu,
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Gpu => "gpu",
            Device::Npu => "npu",
            Device::Cpu => "cpu",
        }
    }
}

impl Recipe {
    /// Every recipe, in v9's table order.
    pub const ALL: [Recipe; 6] =
        [Recipe::LlamaCpp, Recipe::WhisperCpp, Recipe::Kokoro, Recipe::SdCpp, Recipe::Flm, Recipe::RyzenAiLlm];

    pub fn as_str(self) -> &'static str {
        match self {
            Recipe::LlamaCpp => "llamacpp",
            Recipe::WhisperCpp => "whispercpp",
            Recipe::Kokoro => "kokoro",
            Recipe::SdCpp => "sd-cpp",
            Recipe::Flm => "flm",
            Recipe::RyzenAiLlm => "ryzenai-llm",
        }
    }

    /// The recipe named `s`, if lemonade knows it.
    pub fn parse(s: &str) -> Option<Recipe> {
        Recipe::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The recipe's adapter: the one list of what this build can run.
    pub fn adapter(self) -> Option<&'static dyn crate::Adapter> {
        match self {
            Recipe::LlamaCpp => Some(&crate::llamacpp::LlamaCpp),
            Recipe::RyzenAiLlm => Some(&crate::ryzenai::RyzenAi),
            Recipe::WhisperCpp => Some(&crate::whispercpp::WhisperCpp),
            Recipe::SdCpp => Some(&crate::sdcpp::SdCpp),
            Recipe::Kokoro => Some(&crate::kokoro::Kokoro),
            Recipe::Flm => Some(&crate::flm::Flm),
        }
    }

    pub fn runnable(self) -> bool {
        self.adapter().is_some()
    }

    /// The runnable recipes, in table order.
    pub fn runnable_recipes() -> impl Iterator<Item = Recipe> {
        Recipe::ALL.into_iter().filter(|r| r.runnable())
    }

    /// The names of the runnable recipes, for messages.
    pub fn runnable_names() -> String {
        Recipe::runnable_recipes().map(Recipe::as_str).collect::<Vec<_>>().join(", ")
    }

    /// A llamacpp model is "gpu" even on the cpu backend, as in v9.
    pub fn device(self) -> Device {
        match self {
            Recipe::LlamaCpp => Device::Gpu,
            Recipe::RyzenAiLlm | Recipe::Flm => Device::Npu,
            Recipe::WhisperCpp | Recipe::SdCpp | Recipe::Kokoro => Device::Cpu,
        }
    }

    /// Recipes that run on the AMD NPU (Windows only, as in Lemonade v9).
    pub fn npu(self) -> bool {
        self.device() == Device::Npu
    }

    /// The directory under `<cache>/bin/` and the executable of the recipe (reference §7.1).
    pub fn dir_and_exe(self) -> (&'static str, &'static str) {
        match self {
            Recipe::LlamaCpp => ("llamacpp", "llama-server"),
            Recipe::WhisperCpp => ("whispercpp", "whisper-server"),
            Recipe::SdCpp => ("sd-cpp", "sd-server"),
            Recipe::Kokoro => ("kokoro", "koko"),
            Recipe::RyzenAiLlm => ("ryzenai-server", "ryzenai-server"),
            Recipe::Flm => ("flm", "flm"),
        }
    }

    /// The recipe's backends in preference order (v9's table, plus `llamacpp:system`).
    pub fn backends(self) -> &'static [&'static str] {
        match self {
            Recipe::LlamaCpp => &["metal", "vulkan", "rocm", "cpu", "system"],
            Recipe::WhisperCpp => &["npu", "cpu", "vulkan"],
            Recipe::Kokoro => &["cpu"],
            Recipe::SdCpp => &["rocm", "cpu"],
            Recipe::Flm | Recipe::RyzenAiLlm => &["npu"],
        }
    }

    /// The backend a model of this recipe uses when nothing chose one.
    pub fn default_backend(self) -> &'static str {
        match self {
            Recipe::LlamaCpp | Recipe::WhisperCpp | Recipe::Kokoro | Recipe::SdCpp => "cpu",
            Recipe::Flm | Recipe::RyzenAiLlm => "npu",
        }
    }

    /// The options the recipe accepts (reference §2.9).
    pub fn option_keys(self) -> &'static [OptionKey] {
        use OptionKey::*;
        match self {
            Recipe::LlamaCpp => {
                &[CtxSize, Parallel, Device, DraftModel, CacheRam, LlamacppBackend, LlamacppArgs, RpcServers, MergeArgs]
            }
            Recipe::Flm => &[CtxSize, Device, FlmArgs],
            Recipe::RyzenAiLlm => &[CtxSize],
            Recipe::WhisperCpp => &[Device, WhispercppBackend, WhispercppArgs, MergeArgs],
            Recipe::SdCpp => {
                &[Device, SdcppBackend, Steps, CfgScale, Width, Height, SamplingMethod, FlowShift, SdcppArgs]
            }
            Recipe::Kokoro => &[],
        }
    }

    /// The backend `options` choose for this recipe (`llamacpp_backend`, …), if they do.
    pub fn chosen_backend(self, options: &LoadOptions) -> Option<&str> {
        match self {
            Recipe::LlamaCpp => options.llamacpp_backend.as_deref(),
            Recipe::WhisperCpp => options.whispercpp_backend.as_deref(),
            Recipe::SdCpp => options.sdcpp_backend.as_deref(),
            _ => None,
        }
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Recipe {
    type Err = crate::BackendError;
    fn from_str(s: &str) -> Result<Recipe, crate::BackendError> {
        Recipe::parse(s).ok_or_else(|| crate::BackendError::UnknownRecipe(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for r in Recipe::ALL {
            assert_eq!(Recipe::parse(r.as_str()), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::Value::String(r.as_str().into()));
            let back: Recipe = serde_json::from_value(serde_json::Value::String(r.to_string())).unwrap();
            assert_eq!(back, r);
            assert!(r.backends().contains(&r.default_backend()), "{r}");
        }
        assert_eq!("oga-cpu".parse::<Recipe>().unwrap_err().to_string(), "Unknown recipe 'oga-cpu'");
        assert_eq!(Recipe::runnable_names(), "llamacpp, whispercpp, kokoro, sd-cpp, flm, ryzenai-llm");
        assert_eq!(Recipe::LlamaCpp.device().as_str(), "gpu");
        assert_eq!(Recipe::Flm.device().as_str(), "npu");
        assert_eq!(Recipe::Kokoro.device().as_str(), "cpu");
    }
}
