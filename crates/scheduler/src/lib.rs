//! Pure planning of which models stay loaded. No I/O, no clock of its own.
//!
//! This first version answers one question: to load a model of type T, which loaded model (if
//! any) must go? Slots are per model type; the victim is the least recently used model of
//! that type that has no request in flight.

use std::collections::BTreeMap;

use api_types::ModelType;

pub mod machine;
pub use machine::{Effect, Entry, Event, LoadError, Machine, ModelRef, Rejection, ReqId, State};

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

/// What the planner needs to know about a loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident<'a> {
    pub name: &'a str,
    pub model_type: ModelType,
    /// Monotonic time of last use; smaller is older.
    pub last_use: u64,
    pub in_flight: usize,
}

/// The decision for a load of a model of type `t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<'a> {
    /// A slot is free.
    Load,
    /// Evict this model first (LRU of the type; idle ones preferred).
    Evict(&'a str),
}

/// Plans the load of a `t` model given what is loaded. A type at its limit gives up its
/// least recently used idle model; if every model of the type is busy, the least recently
/// used busy one is named and the caller waits for it to drain.
pub fn plan_load<'a>(loaded: &[Resident<'a>], t: ModelType, limits: &Limits) -> Plan<'a> {
    let limit = limits.get(t);
    let same: Vec<&Resident<'a>> = loaded.iter().filter(|r| r.model_type == t).collect();
    if limit < 0 || (same.len() as i64) < limit {
        return Plan::Load;
    }
    let victim = same
        .iter()
        .filter(|r| r.in_flight == 0)
        .min_by_key(|r| r.last_use)
        .or_else(|| same.iter().min_by_key(|r| r.last_use))
        .expect("limit >= 1 and the type is at its limit, so it has a model");
    Plan::Evict(victim.name)
}

#[cfg(test)]
mod sim_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, t: ModelType, last_use: u64, in_flight: usize) -> Resident<'_> {
        Resident { name, model_type: t, last_use, in_flight }
    }

    #[test]
    fn free_slot_loads() {
        let l = [r("a", ModelType::Llm, 1, 0)];
        assert_eq!(plan_load(&l, ModelType::Llm, &Limits::uniform(2)), Plan::Load);
        assert_eq!(plan_load(&l, ModelType::Embedding, &Limits::uniform(1)), Plan::Load);
        assert_eq!(plan_load(&l, ModelType::Llm, &Limits::uniform(-1)), Plan::Load);
    }

    #[test]
    fn full_type_evicts_its_lru() {
        let l = [r("a", ModelType::Llm, 5, 0), r("b", ModelType::Llm, 3, 0), r("e", ModelType::Embedding, 1, 0)];
        assert_eq!(plan_load(&l, ModelType::Llm, &Limits::uniform(2)), Plan::Evict("b"));
    }

    #[test]
    fn idle_models_go_before_busy_ones() {
        let l = [r("a", ModelType::Llm, 5, 0), r("b", ModelType::Llm, 3, 2)];
        assert_eq!(plan_load(&l, ModelType::Llm, &Limits::uniform(2)), Plan::Evict("a"));
        let busy = [r("a", ModelType::Llm, 5, 1), r("b", ModelType::Llm, 3, 2)];
        assert_eq!(plan_load(&busy, ModelType::Llm, &Limits::uniform(2)), Plan::Evict("b"));
    }
}
