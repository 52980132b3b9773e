//! The scheduler settings of `GET/POST /api/v1/params` (kept in `config.json`, see
//! `crate::configure`): validation of an update into the scheduler's [`Settings`], and the view of
//! the settings in force.

use api_types::{MemoryBudget, ModelType, ParamsUpdate, SlotLimits};
use scheduler::{Limits, Pool, Settings};

use crate::error::{EngineError, Result};

/// `8G`, `512MiB`, `1073741824`: bytes (binary multiples).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return None,
    };
    (n >= 0.0).then_some((n * mult as f64) as u64)
}

/// A budget of `pool`: bytes, `auto` (the free memory, or VRAM, now, less a margin) or
/// `none`. `auto` VRAM on a machine with no GPU is no budget. Err: a bad value, named.
pub fn budget(b: &MemoryBudget, pool: Pool) -> Result<Option<u64>> {
    let field = match pool {
        Pool::Memory => "memory_budget",
        Pool::Vram => "vram_budget",
    };
    match b {
        MemoryBudget::Bytes(0) => Ok(None),
        MemoryBudget::Bytes(n) => Ok(Some(*n)),
        MemoryBudget::Word(w) => match w.trim().to_ascii_lowercase().as_str() {
            "auto" => match pool {
                Pool::Memory => host::hardware::auto_memory_budget().map(Some).ok_or_else(|| {
                    EngineError::invalid(
                        "memory_budget 'auto' needs /proc/meminfo, which cannot be read here",
                        Some(field),
                    )
                }),
                Pool::Vram => Ok(host::hardware::auto_vram_budget()),
            },
            "none" | "off" | "0" => Ok(None),
            other => parse_bytes(other).map(|n| (n > 0).then_some(n)).ok_or_else(|| {
                EngineError::invalid(
                    format!("{field} must be a number of bytes (e.g. 8G, 512M), 'auto' or 'none', got '{w}'"),
                    Some(field),
                )
            }),
        },
    }
}

/// Slot limits from one value (every type) or up to three (llm, embedding, reranking).
pub fn slot_limits(values: &[i64]) -> Result<Limits> {
    let bad = |m: String| Err(EngineError::invalid(m, Some("max_loaded_models")));
    if values.is_empty() || values.len() > 3 {
        return bad(format!("max_loaded_models takes 1 to 3 values, got {}", values.len()));
    }
    if let Some(v) = values.iter().find(|v| **v != -1 && **v < 1) {
        return bad(format!("max_loaded_models must be -1 (unlimited) or at least 1, got {v}"));
    }
    if let [n] = values {
        return Ok(Limits::uniform(*n));
    }
    let mut l = Limits::uniform(1);
    for (t, v) in [ModelType::Llm, ModelType::Embedding, ModelType::Reranking].into_iter().zip(values) {
        l.0.insert(t, *v);
    }
    Ok(l)
}

/// The scheduler settings `u` asks for (a 400 naming the field for a bad value).
pub fn settings(u: &ParamsUpdate) -> Result<Settings> {
    let limits = match &u.max_loaded_models {
        None => None,
        Some(SlotLimits::One(n)) => Some(slot_limits(&[*n])?),
        Some(SlotLimits::Per(v)) => Some(slot_limits(v)?),
    };
    Ok(Settings {
        limits,
        idle_timeout_ms: u.idle_timeout.map(|s| (s > 0).then(|| s.saturating_mul(1000))),
        max_queue: u.max_queue.map(|q| (q > 0).then_some(q as usize)),
        memory_budget: u.memory_budget.as_ref().map(|b| budget(b, Pool::Memory)).transpose()?,
        vram_budget: u.vram_budget.as_ref().map(|b| budget(b, Pool::Vram)).transpose()?,
        swap_hold_ms: u.swap_hold_ms,
        devices: None,
    })
}

/// `flags` with `saved`'s values where the flags leave one unset.
pub fn over(flags: ParamsUpdate, saved: ParamsUpdate) -> ParamsUpdate {
    ParamsUpdate {
        max_loaded_models: flags.max_loaded_models.or(saved.max_loaded_models),
        idle_timeout: flags.idle_timeout.or(saved.idle_timeout),
        max_queue: flags.max_queue.or(saved.max_queue),
        memory_budget: flags.memory_budget.or(saved.memory_budget),
        vram_budget: flags.vram_budget.or(saved.vram_budget),
        swap_hold_ms: flags.swap_hold_ms.or(saved.swap_hold_ms),
    }
}

/// Slot limit per model type as the API shows them (-1: unlimited).
pub fn limits_by_type(limits: &Limits) -> std::collections::BTreeMap<String, i64> {
    ModelType::ALL.iter().map(|t| (t.as_str().to_string(), limits.get(*t))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_budgets_parse_and_bad_ones_are_named() {
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Some(3 << 29));
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(budget(&MemoryBudget::Word("none".into()), Pool::Memory).unwrap(), None);
        assert_eq!(budget(&MemoryBudget::Bytes(1000), Pool::Memory).unwrap(), Some(1000));
        let e = budget(&MemoryBudget::Word("lots".into()), Pool::Memory).unwrap_err().to_string();
        assert!(e.contains("'lots'"), "{e}");
        assert_eq!(budget(&MemoryBudget::Word("6G".into()), Pool::Vram).unwrap(), Some(6 << 30));
        let e = budget(&MemoryBudget::Word("big".into()), Pool::Vram).unwrap_err();
        assert!(matches!(&e, EngineError::Invalid { param: Some(p), .. } if p == "vram_budget"), "{e}");
        let e = e.to_string();
        assert!(e.starts_with("vram_budget must be") && e.contains("'big'"), "{e}");
        assert!(slot_limits(&[0]).unwrap_err().to_string().contains("got 0"));
        let u = ParamsUpdate { max_queue: Some(0), idle_timeout: Some(30), ..Default::default() };
        let s = settings(&u).unwrap();
        assert_eq!((s.max_queue, s.idle_timeout_ms), (Some(None), Some(Some(30_000))));
    }
}
