//! How much memory a llama-server running a GGUF model will take: the estimate the scheduler
//! places models by. Pure: the metadata and file sizes come in as values.
//!
//! RSS of llama-server on CPU = the weights (memory-mapped, all touched) + the KV cache +
//! compute and output buffers + the process itself. Calibrated against the provisioned models
//! (docs/BENCHMARKS.md, "Memory estimate"):
//! * KV cache: per layer, `cells × (n_head_kv × (key_length + value_length)) × bytes per
//!   element` of the cache type. The cache is unified across llama-server's slots, so a
//!   full-attention layer has `ctx_size` cells; a sliding-window layer (Gemma 2/3) has
//!   `window × slots + ubatch`. Encoder-only models (BERT family) keep no KV cache.
//! * compute and output buffers grow with the vocabulary: about 100 bytes per token id, plus
//!   4 bytes per id per slot for the logits.
//! * the process: 32 MiB.
//! * the host-memory prompt cache (`--cache-ram`): llama-server keeps the KV state of past
//!   prompts in system memory up to that size (llama.cpp's own default is 8 GiB, with no
//!   term here before): lemonade sets it and counts it, by default the size of the KV cache
//!   ([`EstimateInput::prompt_cache`]). It stays in system memory on a GPU backend.
//!
//! With a GPU backend lemonade offloads every layer (`-ngl 99`), so the weights (mmproj
//! included), the KV cache and the compute buffers are placed in VRAM, with the GPU context
//! each process holds there ([`GPU_CONTEXT_BYTES`]), and the process and its host-side logits
//! buffer in system memory ([`Estimate::placed`]). Measured on an H100 with a CUDA build of
//! the same llama.cpp (docs/BENCHMARKS.md, "VRAM estimate"): each llama-server held 588 MiB
//! on the GPU beyond the buffers it reports, for both models. llama.cpp keeps the
//! token-embedding table on the host, which this counts in VRAM, erring on the side of VRAM.

use std::path::{Path, PathBuf};

use crate::gguf::{GgufMeta, MetaValue};

pub const MIB: u64 = 1 << 20;
/// llama-server itself: code, tokenizer tables, threads, HTTP.
pub const PROCESS_BYTES: u64 = 32 * MIB;
/// What a llama-server process holds on its GPU beyond the buffers it allocates: the CUDA
/// context, cuBLAS's handle and workspace and the kernels loaded. 588 MiB for each of two
/// models on an H100 (CUDA 13, driver 580); not measured for Vulkan or ROCm, where it is
/// counted the same.
pub const GPU_CONTEXT_BYTES: u64 = 588 * MIB;
/// llama-server's automatic `--parallel` (and so its slots).
pub const DEFAULT_SLOTS: u32 = 4;
const UBATCH: u64 = 512;
const COMPUTE_BYTES_PER_VOCAB_ID: u64 = 100;

/// What a start is estimated to take, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    pub weights: u64,
    pub kv_cache: u64,
    pub buffers: u64,
    /// The host-memory prompt cache llama-server may fill (`--cache-ram`).
    pub prompt_cache: u64,
    /// Of the buffers, what stays in system memory when every layer is offloaded: the
    /// process, the logits and the prompt cache.
    pub host: u64,
    pub total: u64,
}

/// Where a backend's bytes go: system memory and VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    pub memory: u64,
    pub vram: u64,
}

impl Estimate {
    /// All in system memory on a CPU backend; with every layer offloaded to a GPU, all but
    /// [`Estimate::host`] in VRAM, with the process's GPU context.
    pub fn placed(&self, offloaded: bool) -> Footprint {
        if offloaded {
            Footprint { memory: self.host, vram: self.total - self.host + GPU_CONTEXT_BYTES }
        } else {
            Footprint { memory: self.total, vram: 0 }
        }
    }

    /// [`Estimate::placed`] for a model that runs in another's process (a draft): its own
    /// buffers, not the process, its GPU context or its prompt cache, which that process
    /// already holds.
    pub fn placed_beside(&self, offloaded: bool) -> Footprint {
        let p = self.placed(offloaded);
        let context = if offloaded { GPU_CONTEXT_BYTES } else { 0 };
        Footprint { memory: p.memory.saturating_sub(PROCESS_BYTES + self.prompt_cache), vram: p.vram - context }
    }
}

/// What of a model's GGUF metadata (and file sizes) its memory depends on; the catalogue fills
/// it when it reads the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelShape {
    /// Bytes of the weights: every shard of the main file, and the mmproj.
    pub weight_bytes: u64,
    pub layers: u64,
    pub kv_heads: u64,
    pub key_len: u64,
    pub value_len: u64,
    /// Sliding-window layers: the window, and one global layer per `swa_pattern` layers (0:
    /// every layer is global).
    pub window: u64,
    pub swa_pattern: u64,
    /// BERT-family encoders keep no KV cache.
    pub encoder_only: bool,
    pub vocab: u64,
    /// The tokenizer (`tokenizer.ggml.model` and `.pre`, hashed) and its BOS and EOS ids (-1:
    /// not given): what a draft model must share with the model it drafts for.
    pub tokenizer: u64,
    pub bos: i64,
    pub eos: i64,
    /// The context the model was trained for (`<arch>.context_length`; 0: not given).
    pub trained_ctx: u64,
}

impl ModelShape {
    pub fn from_meta(meta: &GgufMeta, weight_bytes: u64) -> ModelShape {
        let arch = meta.architecture().unwrap_or_default();
        let key = |k: &str| int(meta, &format!("{arch}.{k}"));
        let embd = key("embedding_length").unwrap_or(0);
        let heads = key("attention.head_count").unwrap_or(1).max(1);
        ModelShape {
            weight_bytes,
            layers: key("block_count").unwrap_or(0),
            kv_heads: key("attention.head_count_kv").unwrap_or(heads),
            key_len: key("attention.key_length").unwrap_or(embd / heads),
            value_len: key("attention.value_length").unwrap_or(embd / heads),
            window: key("attention.sliding_window").unwrap_or(0),
            // Gemma 2 alternates local and global layers; Gemma 3 has one global layer in six.
            swa_pattern: match arch {
                "gemma2" => 2,
                "gemma3" => 6,
                _ => 0,
            },
            encoder_only: arch.contains("bert"),
            vocab: match meta.kv.get("tokenizer.ggml.tokens") {
                Some(MetaValue::Array(n)) => *n,
                _ => 0,
            },
            trained_ctx: key("context_length").unwrap_or(0),
            tokenizer: ["tokenizer.ggml.model", "tokenizer.ggml.pre"]
                .iter()
                .flat_map(|k| match meta.kv.get(*k) {
                    Some(MetaValue::Str(s)) => s.bytes().chain([0]).collect::<Vec<u8>>(),
                    _ => vec![0],
                })
                .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)),
            bos: int(meta, "tokenizer.ggml.bos_token_id").map_or(-1, |v| v as i64),
            eos: int(meta, "tokenizer.ggml.eos_token_id").map_or(-1, |v| v as i64),
        }
    }
}

/// Most tokens a draft's vocabulary may differ by (llama.cpp's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`).
pub const DRAFT_VOCAB_SLACK: u64 = 128;

/// Why `draft` cannot draft for `target` (llama.cpp's compatibility rule, as far as the
/// headers say: the same tokenizer, BOS and EOS, vocabularies within [`DRAFT_VOCAB_SLACK`]), or
/// None when it can.
pub fn draft_mismatch(target: &ModelShape, draft: &ModelShape) -> Option<String> {
    if target.tokenizer != draft.tokenizer {
        return Some("their tokenizers differ".into());
    }
    if (target.bos, target.eos) != (draft.bos, draft.eos) {
        return Some(format!(
            "their special tokens differ (BOS {} and EOS {} against BOS {} and EOS {})",
            target.bos, target.eos, draft.bos, draft.eos
        ));
    }
    if target.vocab.abs_diff(draft.vocab) > DRAFT_VOCAB_SLACK {
        return Some(format!("their vocabularies differ ({} tokens against {})", target.vocab, draft.vocab));
    }
    None
}

/// The run-time settings the estimate depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct EstimateInput<'a> {
    pub ctx_size: u32,
    pub slots: u32,
    /// `--cache-type-k` / `--cache-type-v` (`f16` when not given).
    pub cache_type_k: &'a str,
    pub cache_type_v: &'a str,
    /// Bytes of the host-memory prompt cache (`--cache-ram`); None: the default, the size of
    /// the model's KV cache ([`prompt_cache_default`]).
    pub prompt_cache: Option<u64>,
}

/// The prompt cache a model gets when its `cache_ram` is not set: as large as its KV cache
/// (one more context's worth of past prompts), in whole MiB, as `--cache-ram` takes it.
pub fn prompt_cache_default(kv_cache: u64) -> u64 {
    kv_cache.div_ceil(MIB) * MIB
}

/// Bytes per element of a KV cache type (llama.cpp's block sizes).
pub fn cache_type_bytes(t: &str) -> f64 {
    match t.to_ascii_lowercase().as_str() {
        "f32" => 4.0,
        "q8_0" => 34.0 / 32.0,
        "q4_0" | "iq4_nl" => 18.0 / 32.0,
        "q4_1" => 20.0 / 32.0,
        "q5_0" => 22.0 / 32.0,
        "q5_1" => 24.0 / 32.0,
        _ => 2.0, // f16, bf16
    }
}

fn int(meta: &GgufMeta, key: &str) -> Option<u64> {
    match meta.kv.get(key) {
        Some(MetaValue::Int(v)) if *v >= 0 => Some(*v as u64),
        _ => None,
    }
}

/// The other shards of a split GGUF (`name-00001-of-00003.gguf` → `-00002-`, `-00003-`);
/// empty for a single file.
pub fn other_shards(main: &Path) -> Vec<PathBuf> {
    let Some(name) = main.file_name().and_then(|n| n.to_str()) else { return Vec::new() };
    let Some(stem) = name.strip_suffix(".gguf") else { return Vec::new() };
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    let [count, "of", "00001", prefix] = parts[..] else { return Vec::new() };
    let Ok(n) = count.parse::<u32>() else { return Vec::new() };
    (2..=n).map(|i| main.with_file_name(format!("{prefix}-{i:05}-of-{count}.gguf"))).collect()
}

/// The estimate for a model of `shape` run with `input`'s settings.
pub fn estimate(shape: &ModelShape, input: &EstimateInput) -> Estimate {
    let slots = u64::from(input.slots.max(1));
    let ctx = u64::from(input.ctx_size);
    let per_cell = |cells: u64| -> u64 {
        let k = (cells * shape.kv_heads * shape.key_len) as f64 * cache_type_bytes(input.cache_type_k);
        let v = (cells * shape.kv_heads * shape.value_len) as f64 * cache_type_bytes(input.cache_type_v);
        (k + v) as u64
    };
    let kv_cache = if shape.encoder_only {
        0
    } else {
        let (global, local) = match shape.swa_pattern {
            p if p == 0 || shape.window == 0 => (shape.layers, 0),
            p => (shape.layers / p, shape.layers - shape.layers / p),
        };
        let local_cells = (shape.window * slots + UBATCH).min(ctx);
        global * per_cell(ctx) + local * per_cell(local_cells)
    };
    let prompt_cache = input.prompt_cache.unwrap_or_else(|| prompt_cache_default(kv_cache));
    let host = PROCESS_BYTES + shape.vocab * 4 * slots + prompt_cache;
    let buffers = host + shape.vocab * COMPUTE_BYTES_PER_VOCAB_ID;
    let weights = shape.weight_bytes;
    Estimate { weights, kv_cache, prompt_cache, buffers, host, total: weights + kv_cache + buffers }
}

/// Automatic context sizes are multiples of this.
pub const AUTO_CTX_STEP: u32 = 256;
/// Automatic sizing never goes below this (or the trained context, when smaller): a model
/// that does not fit with it is refused by the scheduler's budget, not shrunk further.
pub const AUTO_CTX_FLOOR: u32 = 2048;

/// The context size `-1` (automatic) means for a model of `shape`: the context it was trained
/// for (`fallback` when the header does not say), lowered in steps of [`AUTO_CTX_STEP`] until
/// its estimate fits `budget` bytes on its own, in the pool it lands in (`offloaded`: VRAM).
/// No budget: the trained context.
pub fn auto_ctx_size(
    shape: &ModelShape,
    input: &EstimateInput,
    budget: Option<u64>,
    offloaded: bool,
    fallback: u32,
) -> u32 {
    let ceiling = match shape.trained_ctx {
        0 => fallback,
        n => u32::try_from(n).unwrap_or(u32::MAX),
    };
    let Some(budget) = budget else { return ceiling };
    let fits = |ctx: u32| {
        let e = estimate(shape, &EstimateInput { ctx_size: ctx, ..input.clone() }).placed(offloaded);
        (if offloaded { e.vram } else { e.memory }) <= budget
    };
    let floor = AUTO_CTX_FLOOR.min(ceiling);
    if fits(ceiling) {
        return ceiling;
    }
    // The estimate grows with the context: the largest step that fits, by bisection.
    let (mut lo, mut hi) = (floor / AUTO_CTX_STEP, ceiling / AUTO_CTX_STEP);
    if !fits(lo * AUTO_CTX_STEP) {
        return floor;
    }
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid * AUTO_CTX_STEP) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (lo * AUTO_CTX_STEP).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetaValue::*;

    fn meta(arch: &str, kv: &[(&str, MetaValue)]) -> GgufMeta {
        let mut m = GgufMeta::default();
        m.kv.insert("general.architecture".into(), Str(arch.into()));
        for (k, v) in kv {
            m.kv.insert(k.replace("ARCH", arch), v.clone());
        }
        m
    }

    fn input(ctx: u32) -> EstimateInput<'static> {
        EstimateInput { ctx_size: ctx, slots: 4, cache_type_k: "f16", cache_type_v: "f16", prompt_cache: Some(0) }
    }

    fn of(m: &GgufMeta, input: &EstimateInput) -> Estimate {
        estimate(&ModelShape::from_meta(m, 0), input)
    }

    /// SmolLM2-135M's shape (100 MiB of weights stand in for its file), trained for 8192.
    fn smol() -> ModelShape {
        let m = meta(
            "llama",
            &[
                ("ARCH.block_count", Int(30)),
                ("ARCH.attention.head_count", Int(9)),
                ("ARCH.attention.head_count_kv", Int(3)),
                ("ARCH.embedding_length", Int(576)),
                ("ARCH.context_length", Int(8192)),
                ("tokenizer.ggml.tokens", Array(49152)),
            ],
        );
        ModelShape::from_meta(&m, 100 * MIB)
    }

    #[test]
    fn the_prompt_cache_is_counted_in_system_memory_by_default_as_large_as_the_kv_cache() {
        let shape = smol();
        let none = estimate(&shape, &input(4096));
        let default = estimate(&shape, &EstimateInput { prompt_cache: None, ..input(4096) });
        // SmolLM2-135M's KV cache at 4096 cells: 30 layers × 3 heads × 128 × 2 bytes × 4096.
        assert_eq!(none.kv_cache, 90 * MIB);
        assert_eq!(default.prompt_cache, 90 * MIB);
        assert_eq!(default.total - none.total, 90 * MIB);
        // Offloaded, it stays in system memory; a draft counts none (its target's process has it).
        assert_eq!(default.placed(true).memory - none.placed(true).memory, 90 * MIB);
        assert_eq!(default.placed(true).vram, none.placed(true).vram);
        assert_eq!(default.placed_beside(false), none.placed_beside(false));
        let set = estimate(&shape, &EstimateInput { prompt_cache: Some(3 * MIB), ..input(4096) });
        assert_eq!(set.total - none.total, 3 * MIB);
    }

    #[test]
    fn auto_context_is_the_trained_one_lowered_in_steps_until_it_fits() {
        let shape = smol();
        assert_eq!(shape.trained_ctx, 8192);
        let i = input(0);
        assert_eq!(auto_ctx_size(&shape, &i, None, false, 4096), 8192, "no budget: the trained context");
        let need = |ctx| estimate(&shape, &EstimateInput { ctx_size: ctx, ..i.clone() }).total;
        assert_eq!(auto_ctx_size(&shape, &i, Some(need(8192)), false, 4096), 8192, "it fits exactly");
        let budget = need(5000);
        let got = auto_ctx_size(&shape, &i, Some(budget), false, 4096);
        assert_eq!(got % AUTO_CTX_STEP, 0);
        assert!(need(got) <= budget && need(got + AUTO_CTX_STEP) > budget, "the largest step that fits: {got}");
        assert_eq!(auto_ctx_size(&shape, &i, Some(1), false, 4096), AUTO_CTX_FLOOR, "never below the floor");
        let unknown = ModelShape { trained_ctx: 0, ..shape };
        assert_eq!(auto_ctx_size(&unknown, &i, None, false, 4096), 4096, "no trained context: the fallback");
        // Offloaded, the VRAM budget is what counts, the GPU context included.
        let vram = |ctx| estimate(&shape, &EstimateInput { ctx_size: ctx, ..i.clone() }).placed(true).vram;
        assert_eq!(auto_ctx_size(&shape, &i, Some(vram(8192)), true, 4096), 8192);
        assert!(auto_ctx_size(&shape, &i, Some(vram(8192) - GPU_CONTEXT_BYTES), true, 4096) < 8192);
    }

    #[test]
    fn kv_cache_of_a_full_attention_model_grows_with_ctx_and_shrinks_with_a_quantized_cache() {
        // SmolLM2-135M: 30 layers, 9 heads of 64, 3 KV heads.
        let m = meta(
            "llama",
            &[
                ("ARCH.block_count", Int(30)),
                ("ARCH.embedding_length", Int(576)),
                ("ARCH.attention.head_count", Int(9)),
                ("ARCH.attention.head_count_kv", Int(3)),
            ],
        );
        // 30 layers × 4096 cells × 3 heads × (64 + 64) × 2 bytes = 90 MiB (llama-server logs it).
        assert_eq!(of(&m, &input(4096)).kv_cache, 90 * MIB);
        assert_eq!(of(&m, &input(16384)).kv_cache, 360 * MIB);
        let q8 = EstimateInput { cache_type_k: "q8_0", cache_type_v: "q8_0", ..input(4096) };
        assert_eq!(of(&m, &q8).kv_cache, 90 * MIB * 17 / 32);
    }

    #[test]
    fn gemma3_sliding_window_layers_keep_a_window_per_slot() {
        // Gemma 3 270M: 18 layers, 1 KV head of 256, window 512: llama-server logs 12 MiB for
        // the 3 global layers (4096 cells) and 37.5 MiB for the 15 local ones (2560 cells).
        let m = meta(
            "gemma3",
            &[
                ("ARCH.block_count", Int(18)),
                ("ARCH.embedding_length", Int(640)),
                ("ARCH.attention.head_count", Int(4)),
                ("ARCH.attention.head_count_kv", Int(1)),
                ("ARCH.attention.key_length", Int(256)),
                ("ARCH.attention.value_length", Int(256)),
                ("ARCH.attention.sliding_window", Int(512)),
            ],
        );
        assert_eq!(of(&m, &input(4096)).kv_cache, 12 * MIB + 75 * MIB / 2);
    }

    #[test]
    fn encoder_models_keep_no_kv_cache_and_buffers_follow_the_vocabulary() {
        let m = meta("bert", &[("ARCH.block_count", Int(6)), ("tokenizer.ggml.tokens", Array(30522))]);
        let e = estimate(&ModelShape::from_meta(&m, 1000), &input(4096));
        assert_eq!(e.kv_cache, 0);
        assert_eq!(e.buffers, PROCESS_BYTES + 30522 * 100 + 30522 * 16);
        assert_eq!(e.total, 1000 + e.buffers);
    }

    #[test]
    fn offloaded_models_place_all_but_the_process_and_logits_in_vram() {
        let m = meta("llama", &[("ARCH.block_count", Int(30)), ("tokenizer.ggml.tokens", Array(1000))]);
        let e = estimate(&ModelShape::from_meta(&m, 100 * MIB), &input(4096));
        assert_eq!(e.placed(false), Footprint { memory: e.total, vram: 0 });
        let host = PROCESS_BYTES + 1000 * 4 * 4;
        assert_eq!(e.placed(true), Footprint { memory: host, vram: e.total - host + GPU_CONTEXT_BYTES });
        assert!(e.placed(true).vram > 100 * MIB + GPU_CONTEXT_BYTES, "the weights are in VRAM");
        // A draft in that process: its buffers only.
        assert_eq!(e.placed_beside(true), Footprint { memory: host - PROCESS_BYTES, vram: e.total - host });
        assert_eq!(e.placed_beside(false), Footprint { memory: e.total - PROCESS_BYTES, vram: 0 });
    }

    /// The H100 measurement (docs/BENCHMARKS.md, "VRAM estimate"): what NVML reported each
    /// llama-server to hold, against the estimate, for SmolLM2-135M Q4_1 and Gemma 3 270M
    /// Q4_K_M with ctx 4096 and 4 slots, built with flash attention (llama.cpp's default) and
    /// without. The shapes are those models' headers.
    #[test]
    fn the_vram_estimate_is_within_a_fifth_of_what_nvml_measured_on_an_h100() {
        let smol = ModelShape {
            weight_bytes: 98_362_432,
            layers: 30,
            kv_heads: 3,
            key_len: 64,
            value_len: 64,
            vocab: 49152,
            ..ModelShape::default()
        };
        let gemma = ModelShape {
            weight_bytes: 253_113_024,
            layers: 18,
            kv_heads: 1,
            key_len: 256,
            value_len: 256,
            window: 512,
            swa_pattern: 6,
            vocab: 262_144,
            ..ModelShape::default()
        };
        let measured = [(smol, 826_277_888u64), (gemma, 939_524_096), (smol, 897_581_056), (gemma, 973_078_528)];
        for (shape, measured) in measured {
            let vram = estimate(&shape, &input(4096)).placed(true).vram;
            let ratio = vram as f64 / measured as f64;
            assert!((0.8..=1.2).contains(&ratio), "{vram} against {measured}: {ratio:.3}");
        }
    }

    #[test]
    fn the_other_shards_of_a_split_gguf_are_named_and_a_single_file_has_none() {
        let main = Path::new("/hub/snap/Qwen3-8B-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(
            other_shards(main),
            vec![
                PathBuf::from("/hub/snap/Qwen3-8B-Q4_K_M-00002-of-00003.gguf"),
                PathBuf::from("/hub/snap/Qwen3-8B-Q4_K_M-00003-of-00003.gguf")
            ]
        );
        assert!(other_shards(Path::new("/x/SmolLM2.Q4_1.gguf")).is_empty());
        assert!(other_shards(Path::new("/x/a-00002-of-00003.gguf")).is_empty(), "only the first shard is a main file");
    }
}
