//! The prompt cache's decisions: which llama-server loads may save their slots' KV state
//! before they stop and restore it after the same model loads again, the key that ties a
//! saved file to the exact model file and options it was made with, which saved prompt a
//! request continues, and which files to drop to stay under the size bound. Pure: `host`
//! reads and writes the files, the server asks llama-server to save and restore.

use api_types::ModelType;
use serde::{Deserialize, Serialize};

/// llama-server's flag naming the directory slot files are saved to and restored from.
pub const SAVE_PATH_ARG: &str = "--slot-save-path";

/// Flags whose value does not shape the KV cache (the address, the name it reports).
const VOLATILE: [&str; 4] = ["--port", "--host", "--alias", SAVE_PATH_ARG];

/// Options under which a restored slot would be wrong, or that the cache cannot capture.
const UNSAFE: [(&str, &str); 5] = [
    (SAVE_PATH_ARG, "the llama-server arguments set their own --slot-save-path"),
    ("-md", "a draft model's KV state is not saved with the slot"),
    ("--model-draft", "a draft model's KV state is not saved with the slot"),
    ("--lora", "LoRA adapters can be rescaled while loaded"),
    ("--lora-scaled", "LoRA adapters can be rescaled while loaded"),
];

/// Why a load with llama-server arguments `args` must not save or restore prompts, or None
/// when it may.
pub fn unsafe_reason(model_type: ModelType, has_mmproj: bool, args: &[String]) -> Option<&'static str> {
    if model_type != ModelType::Llm {
        return Some("only LLMs keep a prompt");
    }
    if has_mmproj {
        return Some("a multimodal model's slots hold image embeddings that llama-server cannot save");
    }
    args.iter()
        .find_map(|a| UNSAFE.iter().find(|(flag, _)| a == flag || a.starts_with(&format!("{flag}="))))
        .map(|(_, why)| *why)
}

/// The exact identity of what a slot file was made with: the model file (path, size,
/// modification time) and every llama-server argument but the volatile ones. Compared in
/// full before a restore, so a changed context size, cache type, model file or option never
/// restores a stale cache.
pub fn key_material(model_file: &str, size: u64, modified_ns: u128, args: &[String]) -> String {
    let mut kept = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if VOLATILE.contains(&a.as_str()) {
            skip = true;
            continue;
        }
        if VOLATILE.iter().any(|v| a.starts_with(&format!("{v}="))) {
            continue;
        }
        kept.push(a.as_str());
    }
    format!("model={model_file}\nsize={size}\nmtime_ns={modified_ns}\nargs={}", kept.join("\u{1f}"))
}

/// A short, stable directory name for `material` (64-bit FNV-1a). Collisions cost nothing
/// but a miss: every entry carries its full material, compared before a restore.
pub fn key_dir(material: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in material.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What is recorded beside each saved slot file (`<file>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The model's name when it was saved.
    pub model: String,
    /// [`key_material`] of the load that saved it.
    pub material: String,
    /// The slot file's name in its key directory.
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
    /// The tokens in the saved KV state (read back from the file's header): a request whose
    /// tokens begin with them, or most of them, continues that conversation.
    pub token_ids: Vec<i32>,
    /// Last saved or restored (milliseconds since the epoch): the LRU order.
    pub used_ms: u64,
}

/// llama.cpp's sequence-state file magic (`GGSQ`) and the versions this reader knows: 4 (the
/// token list packed as `[-1, 1, n, tokens…, media…]`, b11434) and 2 (the plain list, b9093).
const SEQ_MAGIC: u32 = 0x6767_7371;
const SEQ_VERSION: u32 = 4;
const SEQ_VERSIONS: [u32; 2] = [2, SEQ_VERSION];

/// The header llama-server writes at the start of a slot file that holds `tokens` (magic,
/// version, count, then `[-1, 1, n, tokens…, 0]`), which [`saved_tokens`] reads back; the
/// state follows it. For tests and the simulation's backend, which write slot files as
/// llama-server does.
pub fn slot_header(tokens: &[i32]) -> Vec<u8> {
    let packed: Vec<i32> = [-1, 1, tokens.len() as i32].iter().chain(tokens).chain(&[0]).copied().collect();
    let words = [SEQ_MAGIC, SEQ_VERSION, packed.len() as u32];
    words.iter().map(|w| w.to_le_bytes()).chain(packed.iter().map(|t| t.to_le_bytes())).flatten().collect()
}

/// How many bytes of a slot file hold its token list, from its first 12 bytes (magic,
/// version, count); None when it is not a slot file this reader knows.
pub fn header_len(first: &[u8]) -> Option<usize> {
    let u32_at = |i: usize| first.get(i..i + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if u32_at(0)? != SEQ_MAGIC || !SEQ_VERSIONS.contains(&u32_at(4)?) {
        return None;
    }
    Some(12 + 4 * u32_at(8)? as usize)
}

/// Whether a slot of llama-server's `/slots` answer holds a prompt worth saving: idle, with at
/// least `min_tokens` prompt tokens. A llama.cpp whose `/slots` does not say its prompt's
/// length (b9093 has no `n_prompt_tokens`) is taken at its word that the slot served a task
/// (`id_task`); the saved file's header then says how many tokens it holds.
pub fn holds_prompt(slot: &serde_json::Value, min_tokens: u64) -> bool {
    if slot["is_processing"].as_bool() == Some(true) {
        return false;
    }
    match slot["n_prompt_tokens"].as_u64() {
        Some(n) => n >= min_tokens,
        None => slot["id_task"].as_i64().is_some_and(|t| t >= 0),
    }
}

/// The tokens a slot file holds, from its header: llama-server writes its slot's tokens
/// packed as `[-1, 1, n, tokens…, media…]` (or, in older versions, the plain list).
pub fn saved_tokens(head: &[u8]) -> Option<Vec<i32>> {
    let len = header_len(head)?;
    let words: Vec<i32> =
        head.get(12..len)?.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    match words.as_slice() {
        [-1, 1, n, rest @ ..] => rest.get(..usize::try_from(*n).ok()?).map(<[i32]>::to_vec),
        [-1, ..] => None,
        plain => Some(plain.to_vec()),
    }
}

/// The entry a request of `tokens` continues: the one sharing the longest common prefix with
/// it, if that prefix is at least `min_tokens` long and covers at least half of the entry
/// (less would restore more than it saves). Of equal prefixes, the smallest entry wins.
pub fn continued<'a>(entries: &'a [Entry], tokens: &[i32], min_tokens: usize) -> Option<&'a Entry> {
    let lcp = |e: &Entry| e.token_ids.iter().zip(tokens).take_while(|(a, b)| a == b).count();
    entries
        .iter()
        .map(|e| (lcp(e), e))
        .filter(|(n, e)| *n >= min_tokens && *n * 2 >= e.token_ids.len())
        .max_by_key(|(n, e)| (*n, std::cmp::Reverse(e.token_ids.len()), e.used_ms))
        .map(|(_, e)| e)
}

/// The entries to remove (their indices), least recently used first, so the rest fit in
/// `limit` bytes.
pub fn to_evict(entries: &[Entry], limit: u64) -> Vec<usize> {
    let mut by_age: Vec<usize> = (0..entries.len()).collect();
    by_age.sort_by_key(|&i| entries[i].used_ms);
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut out = Vec::new();
    for i in by_age {
        if total <= limit {
            break;
        }
        total -= entries[i].bytes;
        out.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_key_ignores_the_address_and_name_and_changes_with_everything_else() {
        let base = args("-m /m.gguf --ctx-size 4096 --host 127.0.0.1 --port 0 --alias a --slot-save-path /c/");
        let same = args("-m /m.gguf --ctx-size 4096 --host 127.0.0.1 --port 4321 --alias b --slot-save-path /d/");
        let k = key_material("/m.gguf", 10, 5, &base);
        assert_eq!(k, key_material("/m.gguf", 10, 5, &same));
        assert!(!k.contains("4321") && !k.contains("/c/"), "{k}");
        for other in [
            key_material("/m.gguf", 10, 5, &args("-m /m.gguf --ctx-size 2048 --host 127.0.0.1 --port 0")),
            key_material("/m.gguf", 10, 5, &args("-m /m.gguf --ctx-size 4096 -ctk q8_0 --port 0")),
            key_material("/m.gguf", 11, 5, &base),
            key_material("/m.gguf", 10, 6, &base),
            key_material("/n.gguf", 10, 5, &base),
        ] {
            assert_ne!(k, other);
        }
        assert_eq!(key_dir(&k).len(), 16);
        assert_eq!(key_dir(&k), key_dir(&key_material("/m.gguf", 10, 5, &same)));
        assert_ne!(key_dir(&k), key_dir(&key_material("/m.gguf", 10, 6, &base)));
    }

    #[test]
    fn only_plain_llm_loads_may_cache() {
        assert_eq!(unsafe_reason(ModelType::Llm, false, &args("--threads 2")), None);
        assert!(unsafe_reason(ModelType::Embedding, false, &[]).is_some());
        assert!(unsafe_reason(ModelType::Llm, true, &[]).is_some());
        for a in ["--slot-save-path /x", "-md d.gguf", "--model-draft=d.gguf", "--lora a.gguf"] {
            assert!(unsafe_reason(ModelType::Llm, false, &args(a)).is_some(), "{a}");
        }
    }

    fn entry(tokens: &[i32], used: u64) -> Entry {
        Entry {
            model: "m".into(),
            material: "k".into(),
            file: format!("{used}.bin"),
            bytes: 40,
            sha256: String::new(),
            token_ids: tokens.to_vec(),
            used_ms: used,
        }
    }

    #[test]
    fn a_request_continues_the_saved_prompt_it_shares_the_longest_prefix_with() {
        let first: Vec<i32> = (0..10).collect();
        let longer: Vec<i32> = (0..16).collect();
        let e = [entry(&first, 1), entry(&longer, 2), entry(&[7, 7, 7, 7], 3)];
        let next_turn: Vec<i32> = (0..20).collect();
        assert_eq!(continued(&e, &next_turn, 4).unwrap().used_ms, 2);
        assert_eq!(continued(&e, &first, 4).unwrap().used_ms, 1);
        // The answer re-tokenized a little differently: most of the entry still matches.
        let mut retokenized: Vec<i32> = (0..13).collect();
        retokenized.extend([99, 100, 101]);
        assert_eq!(continued(&e, &retokenized, 4).unwrap().used_ms, 2);
        assert!(continued(&e, &[5, 6, 7], 2).is_none());
        assert!(continued(&e, &[0, 1, 2, 50], 3).is_none(), "3 of 10 or 16 tokens is not worth a restore");
        assert!(continued(&e, &first, 11).is_none(), "shorter than the minimum");
    }

    #[test]
    fn a_slot_header_reads_back_as_its_tokens() {
        let head = slot_header(&[5, 6, 7]);
        assert_eq!(header_len(&head), Some(head.len()));
        assert_eq!(saved_tokens(&head), Some(vec![5, 6, 7]));
    }

    fn slot_file(packed: &[i32]) -> Vec<u8> {
        slot_file_v(SEQ_VERSION, packed)
    }

    fn slot_file_v(version: u32, packed: &[i32]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [SEQ_MAGIC, version, packed.len() as u32] {
            v.extend(w.to_le_bytes());
        }
        for t in packed {
            v.extend(t.to_le_bytes());
        }
        v.extend([0xAB; 32]); // the KV state
        v
    }

    #[test]
    fn a_slot_holds_a_prompt_by_its_length_or_where_not_given_by_its_task() {
        use serde_json::json;
        assert!(holds_prompt(&json!({"id": 0, "n_prompt_tokens": 40, "is_processing": false}), 32));
        assert!(!holds_prompt(&json!({"id": 0, "n_prompt_tokens": 10, "is_processing": false}), 32));
        assert!(!holds_prompt(&json!({"id": 0, "n_prompt_tokens": 400, "is_processing": true}), 32));
        // b9093's answer (llama-server there does not report the prompt's length).
        assert!(holds_prompt(&json!({"id": 3, "n_ctx": 8192, "is_processing": false, "id_task": 0}), 32));
        assert!(!holds_prompt(&json!({"id": 0, "n_ctx": 8192, "is_processing": false}), 32));
    }

    #[test]
    fn the_tokens_are_read_back_from_a_slot_files_header() {
        let f = slot_file(&[-1, 1, 3, 10, 11, 12, 0]);
        assert_eq!(header_len(&f[..12]), Some(12 + 4 * 7));
        assert_eq!(saved_tokens(&f[..header_len(&f).unwrap()]), Some(vec![10, 11, 12]));
        assert_eq!(saved_tokens(&slot_file(&[5, 6])), Some(vec![5, 6]), "the older plain list");
        // b9093 writes version 2, its tokens a plain list; an unknown version is not read.
        let old = slot_file_v(2, &[9686, 198, 2683]);
        assert_eq!(saved_tokens(&old[..header_len(&old).unwrap()]), Some(vec![9686, 198, 2683]));
        assert_eq!(header_len(&slot_file_v(7, &[1])), None);
        assert_eq!(saved_tokens(&slot_file(&[-1, 2, 3, 10, 11, 12, 0])), None, "an unknown packing");
        assert_eq!(saved_tokens(&slot_file(&[-1, 1, 9, 10])), None, "a count past the end");
        assert_eq!(header_len(b"GGUF\x04\0\0\0\0\0\0\0"), None);
        assert_eq!(header_len(&f[..8]), None);
    }

    #[test]
    fn eviction_drops_the_least_recently_used_until_the_rest_fit() {
        // 40 bytes each, used at 3, 1 and 2.
        let e = [entry(&[], 3), entry(&[], 1), entry(&[], 2)];
        assert_eq!(to_evict(&e, 120), Vec::<usize>::new());
        assert_eq!(to_evict(&e, 100), [1]);
        assert_eq!(to_evict(&e, 40), [1, 2]);
        assert_eq!(to_evict(&e, 0), [1, 2, 0]);
    }
}
