//! Checkpoint strings (`org/repo[:VARIANT]`) and the one variant resolver that picks files.

use backends::Recipe;

pub use crate::error::PlanError;

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
pub fn validate(s: &str) -> Result<(), crate::error::RegistryError> {
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
            return Err(crate::error::RegistryError::Invalid(format!(
                "Invalid checkpoint '{}': expected `org/name[:VARIANT]` with a Hugging Face repository id (letters, digits, '-', '_', '.')",
                s.escape_debug()
            )))
        }
    }
    let v = &c.variant;
    if v.chars().any(char::is_control) || v.contains('\\') || v.split('/').any(|seg| seg == "..") || v.starts_with('/')
    {
        return Err(crate::error::RegistryError::Invalid(format!(
            "Invalid variant '{}' in checkpoint '{}'",
            v.escape_debug(),
            c.repo
        )));
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

pub fn is_mmproj(path: &str) -> bool {
    file_name(path).contains("mmproj")
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The one variant resolver (reference §6.2 and §6.4): the files of `variant` among `paths`
/// (relative, `/`-separated), the first being what the backend loads. Used on a Hub listing to
/// plan a pull ([`crate::plan`]) and on a cache snapshot to find the file to load
/// ([`resolve_main`]), so the two cannot disagree.
///
/// * GGUF files are those whose name ends with `.gguf` (any case); partial downloads never are;
/// * `*.safetensors`, `*.gguf` and `*.bin` variants name one file: its path, or else its name;
/// * `*` → every GGUF, mmproj files last;
/// * otherwise the one non-mmproj GGUF whose name ends with `<variant>.gguf` (any case; two are
///   ambiguous), then the shards `*<variant>-NNNNN-of-NNNNN.gguf` at the root (beyond v9),
///   then every GGUF in the folder `<variant>/` (shards).
pub fn select<'a>(repo: &str, variant: &str, paths: &[&'a str]) -> Result<Vec<&'a str>, PlanError> {
    let lower = variant.to_ascii_lowercase();
    let mut ggufs: Vec<&str> = paths.iter().copied().filter(|p| is_gguf(p)).collect();
    ggufs.sort_unstable();
    let exact = |err: PlanError| {
        let by_path = paths.iter().copied().find(|p| *p == variant);
        by_path.or_else(|| paths.iter().copied().find(|p| file_name(p) == variant)).map(|p| vec![p]).ok_or(err)
    };
    if lower.ends_with(".safetensors") {
        return exact(PlanError::SafetensorsNotFound(variant.into()));
    }
    if variant == "*" {
        if ggufs.is_empty() {
            return Err(PlanError::NoGguf(repo.into()));
        }
        ggufs.sort_by_key(|p| is_mmproj(p));
        return Ok(ggufs);
    }
    if lower.ends_with(".gguf") || lower.ends_with(".bin") {
        return exact(PlanError::FileNotFound { repo: repo.into(), file: variant.into() });
    }
    let models: Vec<&str> = ggufs.iter().copied().filter(|p| !is_mmproj(p)).collect();
    let suffix = format!("{lower}.gguf");
    let by_suffix: Vec<&str> = models.iter().copied().filter(|p| lower_name(p).ends_with(&suffix)).collect();
    match by_suffix.len() {
        1 => return Ok(by_suffix),
        n if n > 1 => {
            return Err(PlanError::Ambiguous {
                variant: variant.into(),
                matches: by_suffix.iter().map(|p| p.to_string()).collect(),
            })
        }
        _ => {}
    }
    // Shards at the root: every `*<variant>-NNNNN-of-NNNNN.gguf` of one stem.
    let shards: Vec<&str> = models
        .iter()
        .copied()
        .filter(|p| !p.contains('/') && shard_stem(p).is_some_and(|s| s.to_ascii_lowercase().ends_with(&lower)))
        .collect();
    let stems: std::collections::BTreeSet<&str> = shards.iter().filter_map(|p| shard_stem(p)).collect();
    match stems.len() {
        1 => return Ok(shards),
        n if n > 1 => {
            return Err(PlanError::Ambiguous {
                variant: variant.into(),
                matches: stems.iter().map(|s| s.to_string()).collect(),
            })
        }
        _ => {}
    }
    // Folder mode: every GGUF under `<variant>/`.
    let prefix = format!("{lower}/");
    let folder: Vec<&str> = ggufs.iter().copied().filter(|p| p.to_ascii_lowercase().starts_with(&prefix)).collect();
    if folder.is_empty() {
        return Err(PlanError::NoVariant(variant.into()));
    }
    Ok(folder)
}

/// The main GGUF of a llamacpp checkpoint in a cache snapshot: the first file of [`select`]
/// (an empty variant counts as `*`; of ambiguous matches, the first). As Lemonade v9, a variant
/// that matches nothing falls back to the first GGUF, except a variant that names a file.
pub fn resolve_main<'a>(files: &'a [String], variant: &str) -> Option<&'a str> {
    let paths: Vec<&str> = files.iter().map(String::as_str).collect();
    let variant = if variant.is_empty() { "*" } else { variant };
    match select("", variant, &paths) {
        Ok(v) => v.first().copied(),
        Err(PlanError::Ambiguous { matches, .. }) => {
            let first = matches.first()?;
            paths
                .iter()
                .copied()
                .filter(|p| is_gguf(p) && !is_mmproj(p))
                .find(|p| *p == first || shard_stem(p) == Some(first.as_str()))
                .or_else(|| paths.iter().copied().find(|p| p == first))
        }
        Err(PlanError::FileNotFound { .. } | PlanError::SafetensorsNotFound(_) | PlanError::NoGguf(_)) => None,
        Err(_) => {
            let mut models: Vec<&str> = paths.iter().copied().filter(|p| is_gguf(p) && !is_mmproj(p)).collect();
            models.sort_unstable();
            models.first().copied()
        }
    }
}

pub fn is_gguf(path: &str) -> bool {
    lower_name(path).ends_with(".gguf")
}

fn lower_name(path: &str) -> String {
    lower(file_name(path))
}

/// `<stem>-00001-of-00003.gguf` → Some(stem).
pub(crate) fn shard_stem(path: &str) -> Option<&str> {
    let n = file_name(path);
    let base = n.get(..n.len().checked_sub(5)?)?; // without ".gguf"
    let (stem, tail) = base.rsplit_once("-of-")?;
    let (stem, idx) = stem.rsplit_once('-')?;
    (idx.len() == 5 && tail.len() == 5 && idx.bytes().chain(tail.bytes()).all(|b| b.is_ascii_digit())).then_some(stem)
}

/// A recipe's main file in a cache snapshot (reference §6.4): llamacpp's GGUF by
/// [`resolve_main`]; with no variant, whispercpp's first `.bin` and kokoro's `index.json`;
/// otherwise the file the variant names exactly.
pub fn resolve_for<'a>(recipe: Recipe, files: &'a [String], variant: &str) -> Option<&'a str> {
    let named = |suffix: &str| {
        let mut v: Vec<&str> = files.iter().map(String::as_str).filter(|f| file_name(f).ends_with(suffix)).collect();
        v.sort();
        v.first().copied()
    };
    match recipe {
        Recipe::LlamaCpp => resolve_main(files, variant),
        Recipe::WhisperCpp if variant.is_empty() => named(".bin"),
        Recipe::Kokoro if variant.is_empty() => named("index.json").filter(|f| file_name(f) == "index.json"),
        _ => resolve_exact(files, variant),
    }
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
    fn each_recipe_finds_its_main_file() {
        let f = files(&["voices.bin", "kokoro.onnx", "index.json", "README.md"]);
        assert_eq!(resolve_for(Recipe::Kokoro, &f, ""), Some("index.json"));
        assert_eq!(resolve_for(Recipe::Kokoro, &f, "kokoro.onnx"), Some("kokoro.onnx"));
        assert_eq!(resolve_for(Recipe::Kokoro, &files(&["model.onnx"]), ""), None);
        let w = files(&["ggml-tiny.bin", "ggml-base.bin", "README.md"]);
        assert_eq!(resolve_for(Recipe::WhisperCpp, &w, ""), Some("ggml-base.bin"));
        assert_eq!(resolve_for(Recipe::WhisperCpp, &w, "ggml-tiny.bin"), Some("ggml-tiny.bin"));
        assert_eq!(resolve_for(Recipe::SdCpp, &files(&["sd.safetensors"]), ""), None);
        assert_eq!(resolve_for(Recipe::SdCpp, &files(&["sd.safetensors"]), "sd.safetensors"), Some("sd.safetensors"));
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
        assert_eq!(resolve_main(&f, "Q4_K_M"), Some("model-q4_k_m.gguf"));
        assert_eq!(resolve_main(&f, "Q8_0"), Some("model-Q8_0.gguf"));
    }

    #[test]
    fn dotted_quant_suffix_matches() {
        let f = files(&["SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q8_0.gguf"]);
        assert_eq!(resolve_main(&f, "Q4_1"), Some("SmolLM2-135M-Instruct.Q4_1.gguf"));
    }

    #[test]
    fn star_and_empty_pick_first_sorted_non_mmproj() {
        let f = files(&["b.gguf", "a-mmproj.gguf", "c.gguf", "a.gguf"]);
        assert_eq!(resolve_main(&f, "*"), Some("a.gguf"));
        assert_eq!(resolve_main(&f, ""), Some("a.gguf"));
    }

    #[test]
    fn exact_file_variant_must_match_exactly() {
        let f = files(&["gemma-3-270m-it-UD-IQ2_M.gguf", "other.gguf"]);
        assert_eq!(resolve_main(&f, "gemma-3-270m-it-UD-IQ2_M.gguf"), Some("gemma-3-270m-it-UD-IQ2_M.gguf"));
        assert_eq!(resolve_main(&f, "missing.gguf"), None);
    }

    #[test]
    fn folder_variant_picks_first_shard() {
        let f = files(&[
            "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf",
            "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
            "Q8_0/model-Q8_0-00001-of-00002.gguf",
        ]);
        // No file name ends with "Q4_K_M.gguf", so folder mode applies.
        assert_eq!(resolve_main(&f, "Q4_K_M"), Some("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf"));
    }

    #[test]
    fn root_shards_resolve_to_their_first_shard() {
        let f = files(&["a-Q8_0.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]);
        assert_eq!(resolve_main(&f, "Q4_K_M"), Some("m-Q4_K_M-00001-of-00002.gguf"));
    }

    #[test]
    fn unmatched_variant_falls_back_to_first_candidate() {
        let f = files(&["x-Q8_0.gguf", "y-Q8_0.gguf"]);
        assert_eq!(resolve_main(&f, "Q2_K"), Some("x-Q8_0.gguf"));
    }

    #[test]
    fn partial_downloads_and_non_gguf_are_never_candidates() {
        let f = files(&["m-Q4_0.gguf.partial", "config.json"]);
        assert_eq!(resolve_main(&f, "Q4_0"), None);
        assert_eq!(resolve_main(&f, "*"), None);
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
