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

use crate::gguf::{GgufMeta, MetaValue};

pub const MIB: u64 = 1 << 20;
/// llama-server itself: code, tokenizer tables, threads, HTTP.
pub const PROCESS_BYTES: u64 = 32 * MIB;
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
    pub total: u64,
}

/// What the estimate needs beyond the metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct EstimateInput<'a> {
    /// Bytes of the main GGUF file (its tensor data is nearly all of it) and of the mmproj.
    pub file_bytes: u64,
    pub mmproj_bytes: u64,
    pub ctx_size: u32,
    pub slots: u32,
    /// `--cache-type-k` / `--cache-type-v` (`f16` when not given).
    pub cache_type_k: &'a str,
    pub cache_type_v: &'a str,
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

/// The estimate for `meta` with `input`'s settings.
pub fn estimate(meta: &GgufMeta, input: &EstimateInput) -> Estimate {
    let arch = meta.architecture().unwrap_or_default();
    let key = |k: &str| int(meta, &format!("{arch}.{k}"));
    let layers = key("block_count").unwrap_or(0);
    let embd = key("embedding_length").unwrap_or(0);
    let heads = key("attention.head_count").unwrap_or(1).max(1);
    let kv_heads = key("attention.head_count_kv").unwrap_or(heads);
    let k_len = key("attention.key_length").unwrap_or(embd / heads);
    let v_len = key("attention.value_length").unwrap_or(embd / heads);
    let slots = u64::from(input.slots.max(1));
    let ctx = u64::from(input.ctx_size);
    let encoder_only = arch.contains("bert");
    let per_cell = |cells: u64| -> u64 {
        let k = (cells * kv_heads * k_len) as f64 * cache_type_bytes(input.cache_type_k);
        let v = (cells * kv_heads * v_len) as f64 * cache_type_bytes(input.cache_type_v);
        (k + v) as u64
    };
    let kv_cache = if encoder_only {
        0
    } else {
        // Gemma 2 alternates local and global layers; Gemma 3 has one global layer in six.
        let window = key("attention.sliding_window").unwrap_or(0);
        let pattern = match arch {
            "gemma2" => 2,
            "gemma3" => 6,
            _ => 0,
        };
        let (global, local) = match pattern {
            p if p == 0 || window == 0 => (layers, 0),
            p => (layers / p, layers - layers / p),
        };
        let local_cells = (window * slots + UBATCH).min(ctx);
        global * per_cell(ctx) + local * per_cell(local_cells)
    };
    let vocab = match meta.kv.get("tokenizer.ggml.tokens") {
        Some(MetaValue::Array(n)) => *n,
        _ => 0,
    };
    let buffers = PROCESS_BYTES + vocab * COMPUTE_BYTES_PER_VOCAB_ID + vocab * 4 * slots;
    let weights = input.file_bytes + input.mmproj_bytes;
    Estimate { weights, kv_cache, buffers, total: weights + kv_cache + buffers }
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
        EstimateInput {
            file_bytes: 0,
            mmproj_bytes: 0,
            ctx_size: ctx,
            slots: 4,
            cache_type_k: "f16",
            cache_type_v: "f16",
        }
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
        assert_eq!(estimate(&m, &input(4096)).kv_cache, 90 * MIB);
        assert_eq!(estimate(&m, &input(16384)).kv_cache, 360 * MIB);
        let q8 = EstimateInput { cache_type_k: "q8_0", cache_type_v: "q8_0", ..input(4096) };
        assert_eq!(estimate(&m, &q8).kv_cache, 90 * MIB * 17 / 32);
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
        assert_eq!(estimate(&m, &input(4096)).kv_cache, 12 * MIB + 75 * MIB / 2);
    }

    #[test]
    fn encoder_models_keep_no_kv_cache_and_buffers_follow_the_vocabulary() {
        let m = meta("bert", &[("ARCH.block_count", Int(6)), ("tokenizer.ggml.tokens", Array(30522))]);
        let e = estimate(&m, &EstimateInput { file_bytes: 1000, ..input(4096) });
        assert_eq!(e.kv_cache, 0);
        assert_eq!(e.buffers, PROCESS_BYTES + 30522 * 100 + 30522 * 16);
        assert_eq!(e.total, 1000 + e.buffers);
    }
}
