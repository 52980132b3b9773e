//! Devices a model is placed on, and how a model split over several shares its memory. Pure.
//!
//! A GPU is a ledger of its own: the models placed on it hold their share of its budget, and
//! making room on it evicts only models that hold some of it. An NPU runs one model at a time.
//! System memory stays the machine's `memory` pool.

use std::collections::BTreeMap;

/// A device models are placed on, with its own memory budget (bytes; None: no budget).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// How loads and `/scheduler` name it: `gpu0`, `gpu1`, `npu0`.
    pub id: String,
    /// An NPU: one model on it at a time.
    pub npu: bool,
    pub budget: Option<u64>,
}

impl Device {
    pub fn gpu(id: &str, budget: Option<u64>) -> Device {
        Device { id: id.into(), npu: false, budget }
    }
    pub fn npu(id: &str) -> Device {
        Device { id: id.into(), npu: true, budget: None }
    }
}

/// Where a load asks to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Placement {
    /// The device where it fits with the fewest evictions, then the most free memory; split
    /// over all of them only when no single one can ever hold it.
    #[default]
    Auto,
    /// These devices: one, or several to split it over.
    On(Vec<String>),
}

/// Bytes a model holds on each device it is placed on.
pub type Shares = BTreeMap<String, u64>;

/// `total` bytes split over `devices` (id, free bytes) in proportion to their free memory
/// (equally when none is known or none is free). The shares sum to `total` exactly: the
/// rounding remainder goes to the device with the most free memory.
pub fn split(total: u64, devices: &[(String, Option<u64>)]) -> Shares {
    if devices.is_empty() {
        return Shares::new();
    }
    let known = devices.iter().all(|(_, f)| f.is_some());
    let sum: u128 = devices.iter().map(|(_, f)| u128::from(f.unwrap_or(0))).sum();
    let weight = |f: Option<u64>| if known && sum > 0 { u128::from(f.unwrap_or(0)) } else { 1 };
    let weights: u128 = devices.iter().map(|(_, f)| weight(*f)).sum();
    let mut shares: Shares =
        devices.iter().map(|(id, f)| (id.clone(), (u128::from(total) * weight(*f) / weights) as u64)).collect();
    let given: u64 = shares.values().sum();
    let largest = devices.iter().max_by_key(|(id, f)| (weight(*f), std::cmp::Reverse(id.clone()))).map(|(id, _)| id);
    if let Some(id) = largest {
        *shares.get_mut(id).expect("a device of the list") += total - given;
    }
    shares
}

/// The `--tensor-split` proportions of `shares` in the order of `ids` (integers, MiB, at least
/// 1 for a device that holds anything).
pub fn tensor_split(shares: &Shares, ids: &[String]) -> Vec<u64> {
    ids.iter().map(|id| shares.get(id).map_or(0, |b| (b >> 20).max(u64::from(*b > 0)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(list: &[(&str, Option<u64>)]) -> Vec<(String, Option<u64>)> {
        list.iter().map(|(i, f)| (i.to_string(), *f)).collect()
    }

    #[test]
    fn a_split_follows_free_memory_and_sums_to_the_model() {
        let s = split(1000, &ids(&[("gpu0", Some(300)), ("gpu1", Some(100))]));
        assert_eq!(s, BTreeMap::from([("gpu0".into(), 750), ("gpu1".into(), 250)]));
        let s = split(1001, &ids(&[("gpu0", Some(1)), ("gpu1", Some(1)), ("gpu2", Some(1))]));
        assert_eq!(s.values().sum::<u64>(), 1001);
        assert_eq!(s["gpu0"], 335, "the remainder goes to the first of the largest: {s:?}");
        let s = split(10, &ids(&[("gpu0", None), ("gpu1", Some(7))]));
        assert_eq!((s["gpu0"], s["gpu1"]), (5, 5), "a device without a budget: equal shares");
        let s = split(10, &ids(&[("gpu0", Some(0)), ("gpu1", Some(0))]));
        assert_eq!((s["gpu0"], s["gpu1"]), (5, 5), "nothing free: equal shares");
        assert!(split(10, &[]).is_empty());
    }

    #[test]
    fn tensor_split_is_in_mib_in_the_order_given() {
        let s = BTreeMap::from([("gpu0".into(), 3 << 20), ("gpu1".into(), 1 << 20), ("gpu2".into(), 5)]);
        assert_eq!(tensor_split(&s, &["gpu1".into(), "gpu0".into(), "gpu2".into(), "gpu3".into()]), [1, 3, 1, 0]);
    }

    proptest! {
        #[test]
        fn any_split_sums_to_the_model(total in 0u64..u64::MAX / 2, free in proptest::collection::vec(proptest::option::of(0u64..u64::MAX / 4), 1..5)) {
            let devices: Vec<(String, Option<u64>)> = free.iter().enumerate().map(|(i, f)| (format!("gpu{i}"), *f)).collect();
            let s = split(total, &devices);
            prop_assert_eq!(s.values().sum::<u64>(), total);
            prop_assert_eq!(s.len(), devices.len());
        }
    }
}
