//! Checkpoint strings (`org/repo[:VARIANT]`) and the variant rules that pick GGUF files.

/// A parsed checkpoint: the Hugging Face repo id and the variant after the first `:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub repo: String,
    pub variant: String,
}

impl Checkpoint {
    /// Splits at the first `:` (as Lemonade v9). No colon means an empty variant.
    pub fn parse(s: &str) -> Checkpoint {
        match s.split_once(':') {
            Some((repo, variant)) => Checkpoint { repo: repo.to_string(), variant: variant.to_string() },
            None => Checkpoint { repo: s.to_string(), variant: String::new() },
        }
    }

    /// The huggingface_hub cache folder name: `models--org--repo`.
    pub fn cache_folder(&self) -> String {
        repo_folder_name(&self.repo)
    }
}

/// Why a checkpoint cannot be used: it must be `org/name[:variant]` with Hugging Face's repo-id
/// characters (letters, digits, `-`, `_`, `.`; at most 96 per part; no `..`, `--`, or leading or
/// trailing `-` or `.`), and a variant without control characters, `\\`, `..` or a leading `/`.
/// Checked before anything is registered or any path is built from it.
pub fn validate(s: &str) -> Result<(), String> {
    let c = Checkpoint::parse(s);
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
            && !p.contains("..")
            && !p.contains("--")
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
    };
    match c.repo.split_once('/') {
        Some((org, name)) if part_ok(org) && part_ok(name) => {}
        _ => {
            return Err(format!(
                "Invalid checkpoint '{}': expected `org/name[:VARIANT]` with a Hugging Face repository id (letters, digits, '-', '_', '.')",
                s.escape_debug()
            ))
        }
    }
    let v = &c.variant;
    if v.chars().any(char::is_control) || v.contains('\\') || v.split('/').any(|seg| seg == "..") || v.starts_with('/')
    {
        return Err(format!("Invalid variant '{}' in checkpoint '{}'", v.escape_debug(), c.repo));
    }
    Ok(())
}

/// `org/repo` → `models--org--repo`.
pub fn repo_folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

fn lower(s: &str) -> String {
    s.to_ascii_lowercase()
}

fn is_mmproj(path: &str) -> bool {
    file_name(path).contains("mmproj")
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Picks the main GGUF of a llamacpp checkpoint among `files` (paths relative to a snapshot,
/// `/`-separated), following Lemonade v9's resolution rules (reference §6.4):
///
/// * candidates are files whose name contains `.gguf` and not `mmproj`, sorted;
/// * `*` or empty variant → the first candidate;
/// * a variant containing `.gguf` → the candidate whose path equals it;
/// * otherwise the first candidate whose name ends with `<variant>.gguf` (case-insensitive),
///   then the first root-level shard `*<variant>-NNNNN-of-NNNNN.gguf` (beyond v9), then the
///   first whose path contains `<variant>/` (a folder of shards: the first shard);
/// * otherwise the first candidate.
///
/// Unlike v9, partial downloads (`*.partial`, `*.incomplete`) are never candidates.
pub fn resolve_gguf<'a>(files: &'a [String], variant: &str) -> Option<&'a str> {
    let mut cands: Vec<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|f| {
            let name = lower(file_name(f));
            name.contains(".gguf") && !is_mmproj(f) && !name.ends_with(".partial") && !name.ends_with(".incomplete")
        })
        .collect();
    cands.sort_unstable();
    if cands.is_empty() {
        return None;
    }
    if variant.is_empty() || variant == "*" {
        return Some(cands[0]);
    }
    if variant.to_ascii_lowercase().contains(".gguf") {
        return cands.iter().copied().find(|f| *f == variant || file_name(f) == variant);
    }
    let suffix = format!("{}.gguf", lower(variant));
    if let Some(f) = cands.iter().copied().find(|f| lower(file_name(f)).ends_with(&suffix)) {
        return Some(f);
    }
    // Shards at the repo root: the first shard of `*<variant>-NNNNN-of-NNNNN.gguf`.
    let lv = lower(variant);
    if let Some(f) = cands
        .iter()
        .copied()
        .find(|f| !f.contains('/') && crate::plan::shard_stem(f).is_some_and(|s| lower(s).ends_with(&lv)))
    {
        return Some(f);
    }
    let folder = format!("{}/", lower(variant));
    if let Some(f) = cands.iter().copied().find(|f| lower(f).contains(&folder)) {
        return Some(f);
    }
    Some(cands[0])
}

/// Secondary checkpoints (mmproj, …) name an exact file: the first file whose name or
/// relative path equals the variant.
pub fn resolve_exact<'a>(files: &'a [String], variant: &str) -> Option<&'a str> {
    if variant.is_empty() {
        return None;
    }
    files.iter().map(String::as_str).find(|f| *f == variant || file_name(f) == variant)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parse_splits_at_first_colon() {
        assert_eq!(
            Checkpoint::parse("unsloth/Qwen3-0.6B-GGUF:Q4_0"),
            Checkpoint { repo: "unsloth/Qwen3-0.6B-GGUF".into(), variant: "Q4_0".into() }
        );
        assert_eq!(Checkpoint::parse("a/b").variant, "");
        assert_eq!(Checkpoint::parse("a/b:c:d").variant, "c:d");
        assert_eq!(Checkpoint::parse("a/b:Q4_0").cache_folder(), "models--a--b");
    }

    #[test]
    fn quant_suffix_picks_matching_file_case_insensitively() {
        let f = files(&["model-Q8_0.gguf", "model-q4_k_m.gguf", "README.md", "mmproj-Q4_K_M.gguf"]);
        assert_eq!(resolve_gguf(&f, "Q4_K_M"), Some("model-q4_k_m.gguf"));
        assert_eq!(resolve_gguf(&f, "Q8_0"), Some("model-Q8_0.gguf"));
    }

    #[test]
    fn dotted_quant_suffix_matches() {
        let f = files(&["SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q8_0.gguf"]);
        assert_eq!(resolve_gguf(&f, "Q4_1"), Some("SmolLM2-135M-Instruct.Q4_1.gguf"));
    }

    #[test]
    fn star_and_empty_pick_first_sorted_non_mmproj() {
        let f = files(&["b.gguf", "a-mmproj.gguf", "c.gguf", "a.gguf"]);
        assert_eq!(resolve_gguf(&f, "*"), Some("a.gguf"));
        assert_eq!(resolve_gguf(&f, ""), Some("a.gguf"));
    }

    #[test]
    fn exact_file_variant_must_match_exactly() {
        let f = files(&["gemma-3-270m-it-UD-IQ2_M.gguf", "other.gguf"]);
        assert_eq!(resolve_gguf(&f, "gemma-3-270m-it-UD-IQ2_M.gguf"), Some("gemma-3-270m-it-UD-IQ2_M.gguf"));
        assert_eq!(resolve_gguf(&f, "missing.gguf"), None);
    }

    #[test]
    fn folder_variant_picks_first_shard() {
        let f = files(&[
            "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf",
            "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
            "Q8_0/model-Q8_0-00001-of-00002.gguf",
        ]);
        // No file name ends with "Q4_K_M.gguf", so folder mode applies.
        assert_eq!(resolve_gguf(&f, "Q4_K_M"), Some("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf"));
    }

    #[test]
    fn root_shards_resolve_to_their_first_shard() {
        let f = files(&["a-Q8_0.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]);
        assert_eq!(resolve_gguf(&f, "Q4_K_M"), Some("m-Q4_K_M-00001-of-00002.gguf"));
    }

    #[test]
    fn unmatched_variant_falls_back_to_first_candidate() {
        let f = files(&["x-Q8_0.gguf", "y-Q8_0.gguf"]);
        assert_eq!(resolve_gguf(&f, "Q2_K"), Some("x-Q8_0.gguf"));
    }

    #[test]
    fn partial_downloads_and_non_gguf_are_never_candidates() {
        let f = files(&["m-Q4_0.gguf.partial", "config.json"]);
        assert_eq!(resolve_gguf(&f, "Q4_0"), None);
        assert_eq!(resolve_gguf(&f, "*"), None);
    }

    #[test]
    fn exact_secondary_checkpoint() {
        let f = files(&["mmproj-model-f16.gguf", "sub/vae.safetensors"]);
        assert_eq!(resolve_exact(&f, "mmproj-model-f16.gguf"), Some("mmproj-model-f16.gguf"));
        assert_eq!(resolve_exact(&f, "sub/vae.safetensors"), Some("sub/vae.safetensors"));
        assert_eq!(resolve_exact(&f, "vae.safetensors"), Some("sub/vae.safetensors"));
        assert_eq!(resolve_exact(&f, "nope"), None);
        assert_eq!(resolve_exact(&f, ""), None);
    }
}
