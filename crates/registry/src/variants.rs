//! The GGUF variants of a repository (Lemonade v11's `GET /v1/pull/variants`), from its file
//! listing: quantizations as single files, shards at the root, or folders of shards. Each
//! variant's name selects exactly its files through the one resolver (`checkpoint::select`),
//! so `org/repo:<name>` pulls what the listing shows.

use api_types::{PullVariant, PullVariants};

use crate::checkpoint::{is_gguf, is_mmproj, select};
use crate::plan::RepoFile;

/// Variants shown, at most.
pub const MAX_VARIANTS: usize = 5;
/// The quantizations the catalogue uses most, first.
const FAVOURITES: [&str; 4] = ["Q4_K_M", "UD-Q4_K_XL", "Q8_0", "Q4_0"];

fn is_quant(token: &str) -> bool {
    let t = token.to_ascii_uppercase();
    let digit_after = |p: &str| t.strip_prefix(p).is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    digit_after("Q") || digit_after("IQ") || ["F16", "F32", "BF16", "FP16"].contains(&t.as_str())
}

/// The quantization suffix of a file's stem: `Qwen3-8B-Q4_K_M` → `Q4_K_M`, `M-UD-Q4_K_XL` →
/// `UD-Q4_K_XL`, `SmolLM2.Q4_1` → `Q4_1`.
fn quant_suffix(stem: &str) -> Option<&str> {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(stem.char_indices().filter(|(_, c)| *c == '-' || *c == '.').map(|(i, _)| i + 1))
        .collect();
    let i = starts.iter().rev().copied().find(|&s| {
        let end = stem[s..].find(['-', '.']).map_or(stem.len(), |e| s + e);
        is_quant(&stem[s..end])
    })?;
    let ud = stem[..i]
        .strip_suffix('-')
        .and_then(|p| p.strip_suffix("UD"))
        .filter(|p| p.is_empty() || p.ends_with(['-', '.']));
    Some(if ud.is_some() { &stem[i - 3..] } else { &stem[i..] })
}

fn stem(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    let name = name.strip_suffix(".gguf").or_else(|| name.strip_suffix(".GGUF")).unwrap_or(name);
    // `x-00001-of-00003` → `x`
    match name.rsplit_once("-of-").and_then(|(a, _)| a.rsplit_once('-')) {
        Some((base, n)) if n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// Every variant of `repo` among `files`, favourites first, then by name; at most
/// [`MAX_VARIANTS`].
pub fn of(repo: &str, files: &[RepoFile]) -> PullVariants {
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let models: Vec<&str> = paths.iter().copied().filter(|p| is_gguf(p) && !is_mmproj(p)).collect();
    let mut variants: Vec<PullVariant> = Vec::new();
    for p in &models {
        if variants.iter().any(|v| v.files.iter().any(|f| f == p)) {
            continue;
        }
        let folder = p.rsplit_once('/').map(|(d, _)| d);
        let mut candidates: Vec<String> = folder.map(str::to_string).into_iter().collect();
        candidates.extend(quant_suffix(stem(p)).map(str::to_string));
        candidates.push(p.rsplit('/').next().unwrap_or(p).to_string());
        // The first name that selects this file together with its shards, and no other file.
        let found = candidates.into_iter().find_map(|c| {
            let sel = select(repo, &c, &paths).ok()?;
            (sel.contains(p) && sel.iter().all(|s| stem(s) == stem(p) || folder.is_some_and(|d| s.starts_with(d))))
                .then_some((c, sel))
        });
        let Some((name, sel)) = found else { continue };
        let mut group: Vec<String> = sel.iter().map(|s| s.to_string()).collect();
        group.sort();
        let size = files.iter().filter(|f| group.contains(&f.path)).filter_map(|f| f.size).sum();
        variants.push(PullVariant {
            name,
            primary_file: group[0].clone(),
            sharded: group.len() > 1,
            files: group,
            size_bytes: size,
        });
    }
    let rank =
        |v: &PullVariant| FAVOURITES.iter().position(|f| f.eq_ignore_ascii_case(&v.name)).unwrap_or(FAVOURITES.len());
    variants.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.name.cmp(&b.name)));
    variants.truncate(MAX_VARIANTS);
    let mmproj_files: Vec<String> = paths
        .iter()
        .filter(|p| is_gguf(p) && is_mmproj(p))
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
        .collect();
    let lower = repo.to_ascii_lowercase();
    let mut labels = Vec::new();
    if !mmproj_files.is_empty() {
        labels.push("vision".to_string());
    }
    for (needle, label) in [("embed", "embeddings"), ("rerank", "reranking")] {
        if lower.contains(needle) {
            labels.push(label.to_string());
        }
    }
    PullVariants {
        checkpoint: repo.to_string(),
        recipe: "llamacpp".into(),
        suggested_name: repo.rsplit('/').next().unwrap_or(repo).to_string(),
        suggested_labels: labels,
        mmproj_files,
        variants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> RepoFile {
        RepoFile { path: path.into(), size: Some(size), sha256: None, blob: None }
    }

    #[test]
    fn quantization_suffixes_are_found_in_stems() {
        assert_eq!(quant_suffix("Qwen3-8B-Q4_K_M"), Some("Q4_K_M"));
        assert_eq!(quant_suffix("Qwen3-8B-UD-Q4_K_XL"), Some("UD-Q4_K_XL"));
        assert_eq!(quant_suffix("SmolLM2-135M-Instruct.Q4_1"), Some("Q4_1"));
        assert_eq!(quant_suffix("model-f16"), Some("f16"));
        assert_eq!(quant_suffix("model"), None);
        assert_eq!(stem("Q8_0/Qwen3-8B-Q8_0-00001-of-00002.gguf"), "Qwen3-8B-Q8_0");
    }

    #[test]
    fn variants_group_files_rank_favourites_and_each_name_selects_its_files() {
        let files = vec![
            file("README.md", 10),
            file("Qwen3-8B-Q4_K_M.gguf", 100),
            file("Qwen3-8B-UD-Q4_K_XL.gguf", 110),
            file("Qwen3-8B-IQ2_XS.gguf", 50),
            file("Qwen3-8B-Q6_K-00001-of-00002.gguf", 60),
            file("Qwen3-8B-Q6_K-00002-of-00002.gguf", 60),
            file("Q8_0/Qwen3-8B-Q8_0-00001-of-00002.gguf", 80),
            file("Q8_0/Qwen3-8B-Q8_0-00002-of-00002.gguf", 80),
            file("BF16/Qwen3-8B-BF16.gguf", 300),
            file("mmproj-model-f16.gguf", 5),
        ];
        let v = of("unsloth/Qwen3-8B-GGUF", &files);
        let names: Vec<&str> = v.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["Q4_K_M", "UD-Q4_K_XL", "Q8_0", "BF16", "IQ2_XS"],
            "favourites first, then by name, at most 5"
        );
        let q8 = &v.variants[2];
        assert_eq!(
            (q8.sharded, q8.size_bytes, q8.primary_file.as_str()),
            (true, 160, "Q8_0/Qwen3-8B-Q8_0-00001-of-00002.gguf")
        );
        assert_eq!(
            (v.suggested_name.as_str(), v.mmproj_files.as_slice()),
            ("Qwen3-8B-GGUF", &["mmproj-model-f16.gguf".to_string()][..])
        );
        assert_eq!(v.suggested_labels, ["vision"]);
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        for var in &v.variants {
            let mut sel: Vec<String> =
                select(&v.checkpoint, &var.name, &paths).unwrap().iter().map(|s| s.to_string()).collect();
            sel.sort();
            assert_eq!(sel, var.files, "{} selects exactly its files", var.name);
        }
        let all = of("org/x-embed-GGUF", &files[..3]);
        assert!(all.suggested_labels.contains(&"embeddings".to_string()));
    }
}
