//! Options: what a load runs with (saved, requested, the server's, the recipe's defaults,
//! the context and slots resolved) and what it asks of the scheduler. Pure over the
//! configuration and the catalogue.

use super::{Lifecycle, Opts};
use api_types::{CtxSize, LoadOptions, OptionsPatch};
use backends::Recipe;
use registry::ModelInfo;
use scheduler::ModelRef;
use serde_json::Value;

/// A load's scheduling settings for its model, over the saved ones (None: the saved value, else
/// the server's): its idle timeout (`Some(None)`: the server's), requests at once, priority.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scheduling {
    pub idle_timeout_s: Option<Option<u64>>,
    pub max_concurrent: Option<u32>,
    pub priority: Option<i32>,
}

impl Lifecycle {
    /// What the scheduler needs to know of `info` when it runs with `options`: its memory
    /// estimate, its concurrency and its idle timeout (`idle_timeout_s`, else the saved one).
    pub(super) fn model_ref(&self, info: &ModelInfo, options: &Opts, over: Scheduling) -> ModelRef {
        let options = &self.with_ctx_resolved(info, options);
        let mut m = ModelRef::new(&info.name, info.model_type, info.device() == "npu");
        let reg = self.catalogue.registry();
        let idle = over.idle_timeout_s.unwrap_or_else(|| reg.saved_idle_timeout(info));
        let (saved_max, saved_priority) = reg.saved_scheduling(info);
        // The draft's header facts, read under the same lock (no copy of its entry).
        let draft = options.draft_model.as_deref().and_then(|d| reg.get(d).ok()?.shape);
        drop(reg);
        m.idle_timeout_ms = idle.map(|s| s.saturating_mul(1000));
        let own_max = over.max_concurrent.or(saved_max);
        m.max_concurrent = own_max.or(self.cfg.max_concurrent);
        m.model_priority = over.priority.or(saved_priority).unwrap_or(0);
        m.placement = crate::devices::placement(options);
        if info.recipe == Recipe::LlamaCpp {
            let s = backends::llamacpp::cache_settings(options, info.model_type);
            m.max_concurrent = Some(own_max.or(self.cfg.max_concurrent).unwrap_or(s.slots));
            // No shape (the header could not be read): counted as nothing; the start says why.
            let input = registry::memory::EstimateInput {
                ctx_size: u32::try_from(s.kv_cells).unwrap_or(u32::MAX),
                slots: s.slots,
                cache_type_k: &s.cache_type_k,
                cache_type_v: &s.cache_type_v,
                prompt_cache: prompt_cache_bytes(options),
            };
            let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
            let placed = info.shape.map(|shape| registry::memory::estimate(&shape, &input).placed(offloaded));
            let placed = placed.unwrap_or_default();
            (m.memory, m.vram) = (placed.memory, placed.vram);
            // A draft model runs in the same process, with a context as large, where the model
            // runs: its estimate is added to the model's.
            if let Some(shape) = draft {
                let d = registry::memory::estimate(&shape, &input).placed_beside(offloaded);
                (m.memory, m.vram) = (m.memory + d.memory, m.vram + d.vram);
            }
        }
        m
    }

    /// Effective options: `request` over the model's saved options over the server's
    /// configuration (`registry::options`). Recipe defaults apply when read.
    pub fn effective_options(&self, info: &ModelInfo, request: &OptionsPatch) -> Opts {
        self.resolve(info, &self.catalogue.registry().saved(info), request)
    }

    /// [`Lifecycle::effective_options`] with `saved` as the model's saved options.
    pub fn resolve(&self, info: &ModelInfo, saved: &LoadOptions, request: &OptionsPatch) -> Opts {
        let config = self.cfg.live.options();
        // An image model's catalogue `image_defaults` sit under its saved options (as v9).
        let catalogue = match &info.image_defaults {
            Some(Value::Object(defaults)) => LoadOptions::from_map_lossy(defaults).0,
            _ => LoadOptions::default(),
        };
        registry::options::resolve(
            info.recipe,
            registry::options::Layers { config: &config, catalogue: &catalogue, saved, request },
        )
    }

    /// The server's idle timeout in seconds (0: never).
    pub fn idle_timeout_s(&self) -> u64 {
        self.scheduler_view().settings.idle_timeout_ms.flatten().map_or(0, |ms| ms / 1000)
    }

    /// The context size a load of `info` with `options` gets: the number given, or for `-1`
    /// the largest the model was trained for that fits the scheduler's budget of the pool it
    /// lands in (no budget: the trained context), or the default.
    pub fn ctx_size(&self, info: &ModelInfo, options: &Opts) -> u32 {
        match (options.ctx_size, info.shape) {
            (Some(CtxSize::Tokens(n)), _) => n,
            (Some(CtxSize::Auto), Some(shape)) => {
                let s = backends::llamacpp::cache_settings(options, info.model_type);
                let input = registry::memory::EstimateInput {
                    ctx_size: 0,
                    slots: s.slots,
                    cache_type_k: &s.cache_type_k,
                    cache_type_v: &s.cache_type_v,
                    prompt_cache: prompt_cache_bytes(options),
                };
                let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
                // The scheduler's budget (`auto` was resolved to bytes at start): no memory is
                // read here, on every acquire of such a model.
                let settings = self.scheduler_view().settings;
                let budget = if offloaded { settings.vram_budget.flatten() } else { settings.memory_budget.flatten() };
                let fallback = backends::llamacpp::DEFAULT_CTX_SIZE;
                let cells = registry::memory::auto_ctx_size(&shape, &input, budget, offloaded, fallback);
                // With `parallel` slots of their own, the cells that fit are shared among them.
                match options.parallel.filter(|n| *n > 1) {
                    Some(n) => (cells / n / registry::memory::AUTO_CTX_STEP * registry::memory::AUTO_CTX_STEP)
                        .max(registry::memory::AUTO_CTX_STEP),
                    None => cells,
                }
            }
            _ => backends::llamacpp::DEFAULT_CTX_SIZE,
        }
    }

    /// `options` with automatic slots (`parallel: 0`) and an automatic context size (`-1`)
    /// resolved, in that order.
    pub(super) fn with_ctx_resolved(&self, info: &ModelInfo, options: &Opts) -> Opts {
        let mut o = options.clone();
        if o.parallel == Some(0) {
            o.parallel = Some(self.auto_parallel(info, &o));
        }
        if o.ctx_size == Some(CtxSize::Auto) {
            o.ctx_size = Some(CtxSize::Tokens(self.ctx_size(info, &o)));
        }
        if info.recipe == Recipe::LlamaCpp && o.cache_ram.is_none() {
            o.cache_ram = Some(default_cache_ram(info, &o));
        }
        o
    }

    /// `parallel: 0`: the most slots (8, 4, 2, else 1), each with the context asked for (the
    /// default when that is automatic too), whose whole KV cache fits with the weights in the
    /// budget of the pool the model lands in; 4 with no budget, or for a model whose header
    /// could not be read.
    pub(super) fn auto_parallel(&self, info: &ModelInfo, options: &Opts) -> u32 {
        let Some(shape) = info.shape else { return 4 };
        let ctx = match options.ctx_size {
            Some(CtxSize::Tokens(n)) => n,
            _ => backends::llamacpp::DEFAULT_CTX_SIZE,
        };
        let s = backends::llamacpp::cache_settings(options, info.model_type);
        let offloaded = backends::llamacpp::offloads(&backends::backend_of(info.recipe, options));
        let settings = self.scheduler_view().settings;
        let budget = if offloaded { settings.vram_budget.flatten() } else { settings.memory_budget.flatten() };
        let Some(budget) = budget else { return 4 };
        let fits = |n: u32| {
            let input = registry::memory::EstimateInput {
                ctx_size: ctx.saturating_mul(n),
                slots: n,
                cache_type_k: &s.cache_type_k,
                cache_type_v: &s.cache_type_v,
                prompt_cache: prompt_cache_bytes(options),
            };
            let placed = registry::memory::estimate(&shape, &input).placed(offloaded);
            (if offloaded { placed.vram } else { placed.memory }) <= budget
        };
        [8, 4, 2].into_iter().find(|n| fits(*n)).unwrap_or(1)
    }
}

/// The bytes of host prompt cache `options` give llama-server (None: the estimate's default).
pub(super) fn prompt_cache_bytes(options: &Opts) -> Option<u64> {
    options.cache_ram.map(|mib| mib.saturating_mul(registry::memory::MIB))
}

/// The `cache_ram` (MiB) a model gets when none is set: the size of its KV cache at the options'
/// context and slots ([`registry::memory::prompt_cache_default`]); none for a model whose
/// header could not be read (its memory is not counted either).
pub(super) fn default_cache_ram(info: &ModelInfo, options: &Opts) -> u64 {
    let Some(shape) = info.shape else { return 0 };
    let s = backends::llamacpp::cache_settings(options, info.model_type);
    let input = registry::memory::EstimateInput {
        ctx_size: u32::try_from(s.kv_cells).unwrap_or(u32::MAX),
        slots: s.slots,
        cache_type_k: &s.cache_type_k,
        cache_type_v: &s.cache_type_v,
        prompt_cache: None,
    };
    registry::memory::estimate(&shape, &input).prompt_cache / registry::memory::MIB
}
