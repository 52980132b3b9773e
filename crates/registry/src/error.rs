//! The registry's errors.

/// The errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{0}")]
    Invalid(String),
}

/// Why a name did not resolve to a usable model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LookupError {
    #[error("Model '{name}' was not found. {hint}")]
    NotFound { name: String, hint: String },
    #[error("Model '{name}' is not available on this system. {reason}")]
    NotSupported { name: String, reason: String },
}

/// How a checkpoint's variant is written, for the errors.
const USAGE: &str = "The checkpoint variant can be a quantization suffix (e.g. `org/repo:Q4_K_M`), an exact \
    file name (`org/repo:model-Q4_K_M.gguf`), a folder of shards (`org/repo:Q4_K_M` with files in `Q4_K_M/`), or `*` \
    for every GGUF file.";

/// Why a checkpoint's files cannot be chosen (the download planner's and the cache lookup's
/// errors alike: both go through [`select`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("Safetensors file not found in repository: {0}")]
    SafetensorsNotFound(String),
    #[error("No .gguf files found in repository {0}. {USAGE}")]
    NoGguf(String),
    #[error("File {file} not found in Hugging Face repository {repo}. {USAGE}")]
    FileNotFound { repo: String, file: String },
    #[error("Multiple .gguf files found for variant {variant}, but only one is allowed: {}. {USAGE}", .matches.join(", "))]
    Ambiguous { variant: String, matches: Vec<String> },
    #[error("No .gguf files found for variant {0}. {USAGE}")]
    NoVariant(String),
    #[error("Additional checkpoints must contain exact variants: {0}")]
    SecondaryWithoutVariant(String),
    #[error("No listing of repository {0}")]
    NoListing(String),
}
