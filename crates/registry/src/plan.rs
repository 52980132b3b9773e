//! Download planning (pure): from a model's checkpoints and the Hub's listing of each repo to
//! the exact set of files a pull fetches, with Lemonade v9's rules (reference §6.2) and its
//! error texts. Beyond v9: shards at the repo root (`x-Q4_K_M-00001-of-00003.gguf`) are
//! recognised as one variant, and listed sizes and LFS sha256s travel with each file so the
//! downloader can verify them.

use std::collections::BTreeMap;

use crate::checkpoint::Checkpoint;

/// One file of a repo listing (`/api/models/{repo}/tree/{rev}?recursive=true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The LFS sha256, for large files.
    pub sha256: Option<String>,
    /// Name of the file's blob in the cache (the LFS sha256, else the git oid).
    pub blob: Option<String>,
}

/// A file to fetch: from `repo` at `path`, saved under the main repo's snapshot at `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    pub repo: String,
    pub path: String,
    pub dest: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// Files fetched beside a variant when the repo has them at its root.
pub const COMPANION_FILES: &[&str] = &["config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model"];

pub use crate::error::PlanError;

/// The files of the main checkpoint's variant, by the one resolver ([`crate::checkpoint::select`]).
pub fn select_variant<'a>(repo: &str, variant: &str, files: &'a [RepoFile]) -> Result<Vec<&'a RepoFile>, PlanError> {
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let chosen = crate::checkpoint::select(repo, variant, &paths)?;
    Ok(chosen.into_iter().filter_map(|p| files.iter().find(|f| f.path == p)).collect())
}

/// Checkpoints that are never fetched: `npu_cache` (the NPU's compiled encoder; as v9).
const NOT_FETCHED: &[&str] = &["npu_cache"];

/// The repositories whose listings [`plan`] needs, sorted, each once.
pub fn repos(checkpoints: &BTreeMap<String, String>) -> Vec<String> {
    let mut repos: Vec<String> = checkpoints
        .iter()
        .filter(|(k, _)| !NOT_FETCHED.contains(&k.as_str()))
        .map(|(_, c)| Checkpoint::parse(c).repo)
        .collect();
    repos.sort();
    repos.dedup();
    repos
}

/// Plans the pull of a model: the main checkpoint's files (its variant plus companion files,
/// or the whole repo without a variant) and each secondary checkpoint's exact file.
/// `listings` maps repo id → listing; `npu_cache` is never fetched (as v9).
pub fn plan(
    checkpoints: &BTreeMap<String, String>,
    listings: &BTreeMap<String, Vec<RepoFile>>,
) -> Result<Vec<PlannedFile>, PlanError> {
    let main = Checkpoint::parse(checkpoints.get("main").map(String::as_str).unwrap_or_default());
    let listing = |repo: &str| listings.get(repo).ok_or_else(|| PlanError::NoListing(repo.to_string()));
    let files = listing(&main.repo)?;
    let item = |repo: &str, f: &RepoFile| PlannedFile {
        repo: repo.to_string(),
        path: f.path.clone(),
        dest: f.path.clone(),
        size: f.size,
        sha256: f.sha256.clone(),
    };
    let mut out: Vec<PlannedFile> = if main.variant.is_empty() {
        files.iter().map(|f| item(&main.repo, f)).collect()
    } else {
        let mut v: Vec<PlannedFile> =
            select_variant(&main.repo, &main.variant, files)?.into_iter().map(|f| item(&main.repo, f)).collect();
        for c in COMPANION_FILES {
            if let Some(f) = files.iter().find(|f| f.path == *c) {
                v.push(item(&main.repo, f));
            }
        }
        v
    };
    for (key, ckpt) in checkpoints {
        if key == "main" || NOT_FETCHED.contains(&key.as_str()) {
            continue;
        }
        let c = Checkpoint::parse(ckpt);
        if c.variant.is_empty() {
            return Err(PlanError::SecondaryWithoutVariant(ckpt.clone()));
        }
        let f = listing(&c.repo)?
            .iter()
            .find(|f| f.path == c.variant)
            .ok_or_else(|| PlanError::FileNotFound { repo: c.repo.clone(), file: c.variant.clone() })?;
        // Fetched from its own repo, saved under the main repo's snapshot.
        out.push(item(&c.repo, f));
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|f| seen.insert(f.dest.clone()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::shard_stem;

    fn listing(paths: &[&str]) -> Vec<RepoFile> {
        paths.iter().map(|p| RepoFile { path: p.to_string(), size: Some(1), sha256: None, blob: None }).collect()
    }

    fn sel(variant: &str, paths: &[&str]) -> Result<Vec<String>, PlanError> {
        let l = listing(paths);
        select_variant("org/repo", variant, &l).map(|v| v.into_iter().map(|f| f.path.clone()).collect())
    }

    #[test]
    fn quant_suffix_picks_one_file_and_ignores_mmproj() {
        let files = ["m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-Q4_K_M.gguf", "README.md"];
        assert_eq!(sel("Q4_K_M", &files).unwrap(), ["m-Q4_K_M.gguf"]);
        assert_eq!(sel("q8_0", &files).unwrap(), ["m-Q8_0.gguf"], "case-insensitive");
    }

    #[test]
    fn ambiguous_quant_is_an_error_naming_the_matches() {
        let e = sel("Q4_0", &["a-Q4_0.gguf", "b-Q4_0.gguf"]).unwrap_err();
        assert!(
            matches!(&e, PlanError::Ambiguous { matches, .. } if matches == &["a-Q4_0.gguf", "b-Q4_0.gguf"]),
            "{e}"
        );
        assert!(e.to_string().starts_with("Multiple .gguf files found for variant Q4_0, but only one is allowed"));
    }

    #[test]
    fn exact_file_star_and_safetensors() {
        assert_eq!(sel("sub/x.gguf", &["sub/x.gguf", "x.gguf"]).unwrap(), ["sub/x.gguf"]);
        assert!(
            matches!(sel("X.gguf", &["x.gguf"]), Err(PlanError::FileNotFound { .. })),
            "exact match is case-sensitive"
        );
        assert_eq!(sel("*", &["b.gguf", "a.GGUF", "c.txt"]).unwrap(), ["a.GGUF", "b.gguf"]);
        assert!(matches!(sel("*", &["c.txt"]), Err(PlanError::NoGguf(_))));
        assert_eq!(sel("model.safetensors", &["model.safetensors"]).unwrap(), ["model.safetensors"]);
        assert!(matches!(sel("x.safetensors", &[]), Err(PlanError::SafetensorsNotFound(_))));
        assert_eq!(sel("ggml-tiny.bin", &["ggml-tiny.bin"]).unwrap(), ["ggml-tiny.bin"]);
    }

    #[test]
    fn shards_at_the_root_and_in_a_folder() {
        let root = ["m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf", "m-Q8_0-00001-of-00001.gguf"];
        assert_eq!(sel("Q4_K_M", &root).unwrap(), ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"]);
        let folder = ["Q4_K_M/m-00002-of-00002.gguf", "Q4_K_M/m-00001-of-00002.gguf", "Q8_0/m.gguf"];
        assert_eq!(sel("Q4_K_M", &folder).unwrap(), ["Q4_K_M/m-00001-of-00002.gguf", "Q4_K_M/m-00002-of-00002.gguf"]);
        assert!(matches!(sel("IQ2_M", &folder), Err(PlanError::NoVariant(v)) if v == "IQ2_M"));
        assert!(matches!(
            sel("Q4", &["a-Q4-00001-of-00001.gguf", "b-Q4-00001-of-00001.gguf"]),
            Err(PlanError::Ambiguous { .. })
        ));
    }

    #[test]
    fn plan_adds_companions_secondary_files_and_whole_repos() {
        let mut listings = BTreeMap::new();
        listings.insert(
            "org/llm".to_string(),
            listing(&["m-Q4_0.gguf", "m-Q8_0.gguf", "config.json", "tokenizer.json", "README.md"]),
        );
        listings.insert("org/proj".to_string(), listing(&["mmproj-f16.gguf"]));
        let ck = BTreeMap::from([
            ("main".to_string(), "org/llm:Q4_0".to_string()),
            ("mmproj".to_string(), "org/proj:mmproj-f16.gguf".to_string()),
            ("npu_cache".to_string(), "org/npu:cache.rai".to_string()),
        ]);
        assert!(!repos(&ck).contains(&"org/npu".to_string()), "npu_cache is not listed: {:?}", repos(&ck));
        let p = plan(&ck, &listings).unwrap();
        let got: Vec<(&str, &str)> = p.iter().map(|f| (f.repo.as_str(), f.dest.as_str())).collect();
        assert_eq!(
            got,
            [
                ("org/llm", "m-Q4_0.gguf"),
                ("org/llm", "config.json"),
                ("org/llm", "tokenizer.json"),
                ("org/proj", "mmproj-f16.gguf")
            ]
        );

        let whole = plan(&BTreeMap::from([("main".to_string(), "org/llm".to_string())]), &listings).unwrap();
        assert_eq!(whole.len(), 5, "no variant: the whole repo");

        let bad = BTreeMap::from([
            ("main".to_string(), "org/llm:Q4_0".to_string()),
            ("vae".to_string(), "org/proj".to_string()),
        ]);
        assert!(matches!(plan(&bad, &listings), Err(PlanError::SecondaryWithoutVariant(_))));
        let missing = BTreeMap::from([("main".to_string(), "org/absent:Q4_0".to_string())]);
        assert!(matches!(plan(&missing, &listings), Err(PlanError::NoListing(_))));
    }

    #[test]
    fn the_cache_and_the_planner_resolve_alike() {
        // The one resolver: what a pull fetches is what a load then finds in the cache.
        let cases: &[(&str, &[&str])] = &[
            ("Q4_K_M", &["m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-Q4_K_M.gguf"]),
            ("Q4_K_M", &["m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]),
            ("Q4_K_M", &["Q4_K_M/m-00002-of-00002.gguf", "Q4_K_M/m-00001-of-00002.gguf"]),
            ("*", &["mmproj.gguf", "b.gguf", "a.gguf"]),
            ("sub/x.gguf", &["sub/x.gguf", "x.gguf"]),
            ("Q4_0", &["notes.gguf.txt", "m-Q4_0.gguf"]),
        ];
        for (variant, paths) in cases {
            let l = listing(paths);
            let planned = select_variant("org/repo", variant, &l).unwrap();
            let files: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
            assert_eq!(
                crate::checkpoint::resolve_main(&files, variant),
                Some(planned[0].path.as_str()),
                "{variant} in {paths:?}"
            );
        }
    }

    #[test]
    fn shard_stems() {
        assert_eq!(shard_stem("m-Q4_K_M-00001-of-00003.gguf"), Some("m-Q4_K_M"));
        assert_eq!(shard_stem("dir/m-00010-of-00010.gguf"), Some("m"));
        assert_eq!(shard_stem("m-Q4_K_M.gguf"), None);
        assert_eq!(shard_stem("m-1-of-2.gguf"), None);
        assert_eq!(shard_stem(".gguf"), None);
    }
}
