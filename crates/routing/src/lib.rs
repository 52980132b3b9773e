//! `collection.router` (Lemonade v11's router policies), the pure part: a policy parsed and
//! checked once ([`Policy::parse`], an error names the field), the features of a request it
//! reads ([`Features::of_request`]), and the decision ([`decide`]): rules top to bottom, first
//! match wins, no match falls open to `default_model`, with a trace of each condition
//! evaluated. Sans-IO: a model-backed condition (`semantic_similarity`, `classifier`, `llm`)
//! needs a classifier's scores, which [`decide`] asks for ([`Outcome::Needs`]) and the caller
//! computes with the prompts and parsers of [`classifiers`], then decides again.
//!
//! Regexes use the `regex` crate: matching is linear in the input, so no pattern can
//! backtrack catastrophically (v11 rejects some patterns for that reason; here every pattern
//! is safe, and patterns the crate does not support, such as look-around and
//! back-references, are refused when the policy is parsed).

pub mod classifiers;
pub mod conversations;
mod decide;
mod features;
pub mod omni;
mod policy;

pub use decide::{decide, Outcome, Score};
pub use features::Features;
pub use policy::{components, Classifier, ClassifierKind, Cond, MetaCmp, OnError, Policy, PolicyError, Rule};

/// The recipe of a router collection.
pub const ROUTER_RECIPE: &str = "collection.router";
/// The recipe of an omni collection.
pub const OMNI_RECIPE: &str = "collection.omni";
/// The policy schema version this build reads.
pub const VERSION: &str = "1";
/// How deep `any`/`all`/`not` may nest.
pub const MAX_DEPTH: usize = 32;
/// The compiled size a `regex` may take (bytes).
pub const MAX_REGEX_SIZE: usize = 1 << 20;
/// Text conditions read at most this much of the input (bytes), as v11 caps it.
pub const MAX_INPUT: usize = 1 << 20;

#[cfg(test)]
mod tests;
