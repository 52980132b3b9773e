//! Pure planning of which models stay loaded: the model-lifecycle state machine
//! ([`machine`]). No I/O, no clock of its own.

use std::collections::BTreeMap;

use api_types::ModelType;

pub mod devices;
pub mod machine;
pub use devices::{Device, Placement, Shares};
pub use machine::{
    Decision, Effect, Entry, Event, Failure, LoadError, LoadOutcome, Machine, ModelRef, Plan, Pool, Rejection, ReqId,
    SchedulerError, Settings, State,
};

/// Slot limits per model type; a missing type or a negative limit means unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits(pub BTreeMap<ModelType, i64>);

impl Limits {
    /// Every type gets the same limit (`--max-loaded-models N`; -1 = unlimited).
    pub fn uniform(n: i64) -> Limits {
        Limits(ModelType::ALL.iter().map(|t| (*t, n)).collect())
    }

    pub fn get(&self, t: ModelType) -> i64 {
        self.0.get(&t).copied().unwrap_or(-1)
    }
}

#[cfg(test)]
mod sim_tests;
