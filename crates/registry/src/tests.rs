//! Pure tests: the registry is built from values and an in-memory view of the cache. The same
//! rules against real files are tested in `host` (catalogue/tests.rs).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::gguf::tests::build;
use crate::gguf::MetaValue;

/// An in-memory cache: snapshots per repo, the complete files, GGUF headers by path.
#[derive(Default)]
struct Mem {
    snapshots: BTreeMap<String, Vec<Snapshot>>,
    complete: BTreeSet<PathBuf>,
    headers: BTreeMap<PathBuf, Vec<u8>>,
    sizes: BTreeMap<PathBuf, u64>,
}

impl ModelFiles for Mem {
    fn snapshots(&self, repo: &str) -> Vec<Snapshot> {
        self.snapshots.get(repo).cloned().unwrap_or_default()
    }
    fn is_complete(&self, file: &Path) -> bool {
        self.complete.contains(file)
    }
    fn gguf_meta(&self, file: &Path) -> Option<gguf::GgufMeta> {
        gguf::read_from(std::io::Cursor::new(self.headers.get(file)?.clone())).ok()
    }
    fn size(&self, file: &Path) -> Option<u64> {
        self.sizes.get(file).copied()
    }
}

fn cfg() -> RegistryConfig {
    RegistryConfig {
        extra_models_dir: None,
        physical_memory_gb: Some(24.0),
        disable_filtering: false,
        xdna2_npu: false,
    }
}

#[test]
fn builds_from_values_with_filters_and_cache_facts() {
    let mut files = Mem::default();
    let snap = PathBuf::from("/hub/models--org--Smol/snapshots/abc");
    files.snapshots.insert(
        "org/Smol".into(),
        vec![Snapshot { dir: snap.clone(), files: vec!["Smol.Q4_1.gguf".into(), "Smol.Q8_0.gguf".into()] }],
    );
    files.complete.insert(snap.join("Smol.Q4_1.gguf"));
    let emb = build(&[
        ("general.architecture", MetaValue::Str("bert".into())),
        ("bert.pooling_type", MetaValue::Int(1)),
        ("bert.block_count", MetaValue::Int(6)),
    ]);
    files.headers.insert(snap.join("Smol.Q4_1.gguf"), emb);
    files.sizes.insert(snap.join("Smol.Q4_1.gguf"), 98_000_000);
    let user = UserFiles {
        user_models: BTreeMap::from([
            (
                "Smol".to_string(),
                CatalogueEntry { checkpoint: "org/Smol:Q4_1".into(), recipe: "llamacpp".into(), ..Default::default() },
            ),
            (
                "Odd".to_string(),
                CatalogueEntry { checkpoint: "org/Odd".into(), recipe: "oga-cpu".into(), ..Default::default() },
            ),
        ]),
        ..Default::default()
    };
    let reg = Registry::build(&cfg(), user, &files).unwrap();
    let m = reg.get("user.Smol").unwrap();
    assert_eq!(m.recipe, Recipe::LlamaCpp);
    assert!(m.downloaded);
    assert_eq!(m.main_path.as_deref(), Some(snap.join("Smol.Q4_1.gguf").as_path()));
    assert_eq!(m.model_type, ModelType::Embedding, "type read from the GGUF header");
    let shape = m.shape.expect("the memory shape read from the same header");
    assert_eq!((shape.layers, shape.encoder_only, shape.weight_bytes), (6, true, 98_000_000));
    assert!(
        matches!(reg.get("user.Odd"), Err(LookupError::NotSupported { reason, .. }) if reason.contains("'oga-cpu'"))
    );
    assert!(matches!(reg.get("Gemma3-1b-it-FLM"), Err(LookupError::NotSupported { .. })));
    assert_eq!(reg.get("kokoro-v1").unwrap().model_type, ModelType::Tts);
    assert_eq!(reg.get("SD-Turbo").unwrap().model_type, ModelType::Image);
    assert_eq!(reg.get("Whisper-Tiny").unwrap().model_type, ModelType::Audio);
}

#[test]
fn extra_models_are_grouped_from_a_listing() {
    let dir = PathBuf::from("/models");
    let mut files = Mem::default();
    let found: Vec<ExtraFile> = ["a.gguf", "mmproj-x.gguf", "Big/b-00002-of-00002.gguf", "Big/b-00001-of-00002.gguf"]
        .iter()
        .map(|p| ExtraFile { path: dir.join(p), bytes: 1 << 29 })
        .collect();
    for f in &found {
        files.complete.insert(f.path.clone());
        files.sizes.insert(f.path.clone(), f.bytes);
    }
    files.headers.insert(
        dir.join("Big/b-00001-of-00002.gguf"),
        build(&[("general.architecture", MetaValue::Str("llama".into()))]),
    );
    let reg = Registry::build(
        &RegistryConfig { extra_models_dir: Some(dir.clone()), ..cfg() },
        UserFiles { extra_files: found, ..Default::default() },
        &files,
    )
    .unwrap();
    let big = reg.get("extra.Big").unwrap();
    assert_eq!(big.main_path.as_deref(), Some(dir.join("Big/b-00001-of-00002.gguf").as_path()));
    assert_eq!(big.checkpoint, "/models/Big", "one sharded model: the folder (as v11 shows it)");
    assert_eq!(big.size, Some(1.0));
    assert_eq!(big.shape.map(|s| s.weight_bytes), Some(1 << 30), "the weights of both shards");
    assert!(reg.get("extra.a").unwrap().downloaded, "a root file is named by its stem");
    assert_eq!(reg.get("extra.a").unwrap().checkpoint, "/models/a.gguf");
    // A projector is part of a model, never a model of its own.
    let e = reg.get("extra.mmproj-x.gguf").unwrap_err().to_string();
    assert!(e.starts_with("Model 'extra.mmproj-x.gguf' was not found."), "{e}");
    assert!(reg.models().all(|m| !m.name.contains("mmproj")));
}

#[test]
fn json_map_updates_keep_other_keys_and_reject_corrupt_files() {
    let first = updated_json_map(None, "f.json", "a", Some(1)).unwrap();
    let second = updated_json_map(Some(&first), "f.json", "b", Some(2)).unwrap();
    let removed = updated_json_map::<i32>(Some(&second), "f.json", "a", None).unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&removed).unwrap(), serde_json::json!({"b": 2}));
    let err = updated_json_map(Some(b"{not json"), "f.json", "a", Some(1)).unwrap_err().to_string();
    assert!(err.starts_with("f.json: "), "{err}");
}

#[test]
fn labels_to_type_first_match_wins() {
    let l = |v: &[&str]| type_from_labels(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(l(&[]), ModelType::Llm);
    assert_eq!(l(&["reasoning", "vision"]), ModelType::Llm);
    assert_eq!(l(&["embedding"]), ModelType::Embedding);
    assert_eq!(l(&["custom", "reranking", "embeddings"]), ModelType::Reranking);
    assert_eq!(l(&["audio", "transcription"]), ModelType::Audio);
    assert_eq!(l(&["image"]), ModelType::Image);
    assert_eq!(l(&["tts", "speech"]), ModelType::Tts);
}

#[test]
fn registrations_are_labelled_like_v9() {
    let labels =
        registration_labels(&["vision".into(), "hot".into()], true, false, true, false, Some(Recipe::LlamaCpp));
    assert_eq!(labels, ["custom", "embeddings", "hot", "reasoning", "vision"]);
    assert!(registration_labels(&[], false, false, false, false, Some(Recipe::SdCpp)).contains(&"image".to_string()));
}

#[test]
fn registrations_reject_names_and_checkpoints_that_could_escape_or_corrupt() {
    use crate::checkpoint::validate;
    for ok in
        ["org/repo", "org/repo:Q4_K_M", "unsloth/Qwen3-0.6B-GGUF:Q4_0", "a.b/c_d:folder/file-Q4.gguf", "org/repo:*"]
    {
        assert!(validate(ok).is_ok(), "{ok}");
    }
    for bad in [
        "repo",
        "/etc/passwd",
        "../../etc:Q4_0",
        "org/../../repo:Q4",
        "org/repo:../../x",
        "org/repo\0:Q4",
        "org/repo:a\0b",
        "https://evil.test/x:Q4",
        "org/re po",
        "-org/repo",
        "org/repo.",
        "org--x/repo",
        "org/repo:/abs",
        "org/repo:a\\b",
    ] {
        let e = validate(bad).unwrap_err().to_string();
        let named = match bad.split_once(':') {
            Some((repo, variant)) if validate(repo).is_ok() => {
                format!("Invalid variant '{}' in checkpoint '{repo}'", variant.escape_debug())
            }
            _ => format!("Invalid checkpoint '{}': expected `org/name[:VARIANT]`", bad.escape_debug()),
        };
        assert!(e.starts_with(&named), "{bad:?}: {e}");
    }
    for ok in ["user.Phi-4-Mini-GGUF", "user.ünïcödé-名前-🍋", "user.a b"] {
        assert!(crate::validate_user_name(ok).is_ok(), "{ok}");
    }
    let long = format!("user.{}", "a".repeat(201));
    for bad in ["user.", "user.\0nul", "user.a/b", "user.x\r\nX-Injected: 1", "user...", "user. x", long.as_str()] {
        let e = crate::validate_user_name(bad).unwrap_err().to_string();
        let named = format!("Invalid model name '{}': after `user.` use 1 to 200", bad.escape_debug());
        assert!(e.starts_with(&named), "{bad:?}: {e}");
    }
}

/// Lemonade v11's naming spec (its five reference cases) and aliases: a bare name means the
/// registered model, else the imported one, else the built-in; each prefix means its source;
/// an alias means its target.
#[test]
fn names_resolve_as_v11_and_aliases_name_their_target() {
    let dir = PathBuf::from("/models");
    let mut files = Mem::default();
    let found: Vec<ExtraFile> = ["Qwen3-0.6B-GGUF/q.gguf", "SD-Turbo/s.gguf"]
        .iter()
        .map(|p| ExtraFile { path: dir.join(p), bytes: 1 << 20 })
        .collect();
    for f in &found {
        files.complete.insert(f.path.clone());
    }
    let entry =
        || CatalogueEntry { checkpoint: "org/Smol:Q4_1".into(), recipe: "llamacpp".into(), ..Default::default() };
    let user = UserFiles {
        user_models: BTreeMap::from([("Qwen3-0.6B-GGUF".to_string(), entry()), ("MyModel".to_string(), entry())]),
        extra_files: found,
        aliases: BTreeMap::from([
            ("fast".to_string(), "MyModel".to_string()),
            ("old".to_string(), "builtin.Qwen3-0.6B-GGUF".to_string()),
            ("gone".to_string(), "user.Nope".to_string()),
            ("hop".to_string(), "fast".to_string()),
            ("loop-a".to_string(), "loop-b".to_string()),
            ("loop-b".to_string(), "loop-a".to_string()),
        ]),
        ..Default::default()
    };
    let reg = Registry::build(&RegistryConfig { extra_models_dir: Some(dir), ..cfg() }, user, &files).unwrap();
    let name = |n: &str| reg.get(n).map(|m| m.name.clone()).map_err(|e| e.to_string());
    // Built-in + registered + imported: the bare name is the registered one.
    assert_eq!(name("Qwen3-0.6B-GGUF").unwrap(), "user.Qwen3-0.6B-GGUF");
    assert_eq!(name("user.Qwen3-0.6B-GGUF").unwrap(), "user.Qwen3-0.6B-GGUF");
    assert_eq!(name("extra.Qwen3-0.6B-GGUF").unwrap(), "extra.Qwen3-0.6B-GGUF");
    assert_eq!(name("builtin.Qwen3-0.6B-GGUF").unwrap(), "Qwen3-0.6B-GGUF");
    // Built-in + imported: the imported one.
    assert_eq!(name("SD-Turbo").unwrap(), "extra.SD-Turbo");
    assert_eq!(name("builtin.SD-Turbo").unwrap(), "SD-Turbo");
    // Built-in only.
    assert_eq!(name("SmolLM3-3B-GGUF").unwrap(), "SmolLM3-3B-GGUF");
    assert_eq!(name("builtin.SmolLM3-3B-GGUF").unwrap(), "SmolLM3-3B-GGUF");
    assert!(name("user.SmolLM3-3B-GGUF").is_err());
    // Registered only.
    assert_eq!(name("MyModel").unwrap(), "user.MyModel");
    assert!(name("builtin.MyModel").unwrap_err().starts_with("Model 'builtin.MyModel' was not found."));
    assert!(name("extra.MyModel").is_err());
    // Aliases.
    assert_eq!(name("fast").unwrap(), "user.MyModel");
    assert_eq!(name("old").unwrap(), "Qwen3-0.6B-GGUF");
    let e = name("gone").unwrap_err();
    assert!(e.contains("alias of 'user.Nope'"), "{e}");
    assert!(reg.is_model_name("MyModel") && !reg.is_model_name("fast"));
    // An alias of an alias is followed (v11); a loop ends, naming where it stopped.
    assert_eq!(name("hop").unwrap(), "user.MyModel");
    assert!(name("loop-a").is_err());
    assert_eq!(reg.aliases().count(), 6);
    // Listed ids (v11's): a registered model by its bare name, a shadowed built-in as
    // `builtin.X`, an imported model shadowed by a registered one as `extra.X`; v9's are the
    // names themselves.
    let id = |n: &str, v9: bool| reg.listed_id(reg.get(n).unwrap(), v9);
    assert_eq!(id("user.Qwen3-0.6B-GGUF", false), "Qwen3-0.6B-GGUF");
    assert_eq!(id("builtin.Qwen3-0.6B-GGUF", false), "builtin.Qwen3-0.6B-GGUF");
    assert_eq!(id("extra.Qwen3-0.6B-GGUF", false), "extra.Qwen3-0.6B-GGUF");
    assert_eq!(id("extra.SD-Turbo", false), "SD-Turbo");
    assert_eq!(id("builtin.SD-Turbo", false), "builtin.SD-Turbo");
    assert_eq!(id("SmolLM3-3B-GGUF", false), "SmolLM3-3B-GGUF");
    assert_eq!(id("user.Qwen3-0.6B-GGUF", true), "user.Qwen3-0.6B-GGUF");
    assert_eq!(id("extra.SD-Turbo", true), "extra.SD-Turbo");
    // Alias names.
    assert!(validate_alias("default-llm").is_ok());
    for bad in ["", " x", "user.x", "extra.x", "builtin.x", "a/b", "a\\b", "..", "x\u{7}"] {
        assert!(validate_alias(bad).is_err(), "{bad:?}");
    }
}

/// Lemonade v11's rules for a folder of quantizations: one model per quantization (shards of
/// one together), named by the first file's stem; the folder's name means the first one and
/// beats a built-in; identical names in two folders stay two models; v9's names of saved
/// options and aliases follow the model.
#[test]
fn extra_folders_split_by_quantization_and_saved_names_follow() {
    let dir = PathBuf::from("/x");
    let mut files = Mem::default();
    let found: Vec<ExtraFile> = [
        "Qwen-GGUF/Qwen-Q8_0.gguf",
        "Qwen-GGUF/Qwen-Q4_K_M.gguf",
        "Qwen-GGUF/mmproj-z.gguf",
        "Qwen-GGUF/mmproj-a.gguf",
        "Mix-GGUF/Mix-Q4_K_M-00001-of-00002.gguf",
        "Mix-GGUF/Mix-Q4_K_M-00002-of-00002.gguf",
        "Mix-GGUF/Mix-Q8_0-00001-of-00002.gguf",
        "Mix-GGUF/Mix-Q8_0-00002-of-00002.gguf",
        "Imat/M-Q4_K_M.gguf",
        "Imat/M-Q4_K_M-imatrix.gguf",
        "Other/M-Q4_K_M.gguf",
        "Other/M-Q8_0.gguf",
        "Qwen3-0.6B-GGUF/L-Q4_K_M.gguf",
        "Qwen3-0.6B-GGUF/L-Q8_0.gguf",
        "Root-UD-Q4_K_XL.gguf",
    ]
    .iter()
    .map(|p| ExtraFile { path: dir.join(p), bytes: 1 << 20 })
    .collect();
    for f in &found {
        files.complete.insert(f.path.clone());
    }
    let opts = |ctx: u64| serde_json::Map::from_iter([("ctx_size".to_string(), serde_json::json!(ctx))]);
    let user = UserFiles {
        extra_files: found,
        recipe_options: BTreeMap::from([
            ("extra.Root-UD-Q4_K_XL.gguf".to_string(), opts(1024)),
            ("extra.Qwen-GGUF".to_string(), opts(2048)),
        ]),
        aliases: BTreeMap::from([("r".to_string(), "extra.Root-UD-Q4_K_XL.gguf".to_string())]),
        ..Default::default()
    };
    let reg = Registry::build(&RegistryConfig { extra_models_dir: Some(dir), ..cfg() }, user, &files).unwrap();
    let extra: Vec<&str> =
        reg.models().filter(|m| m.source == Source::ExtraModelsDir).map(|m| m.name.as_str()).collect();
    assert_eq!(
        extra,
        [
            "extra.L-Q4_K_M",
            "extra.L-Q8_0",
            "extra.M-Q4_K_M",
            "extra.M-Q4_K_M-imatrix",
            "extra.M-Q8_0",
            "extra.Mix-Q4_K_M",
            "extra.Mix-Q8_0",
            "extra.Other-M-Q4_K_M",
            "extra.Qwen-Q4_K_M",
            "extra.Qwen-Q8_0",
            "extra.Root-UD-Q4_K_XL",
        ]
    );
    let name = |n: &str| reg.get(n).map(|m| m.name.clone()).unwrap();
    assert_eq!(name("Qwen-GGUF"), "extra.Qwen-Q4_K_M");
    assert_eq!(name("extra.Qwen-GGUF"), "extra.Qwen-Q4_K_M");
    assert_eq!(name("Mix-GGUF"), "extra.Mix-Q4_K_M");
    assert_eq!(reg.get("Mix-Q8_0").unwrap().checkpoint, "/x/Mix-GGUF/Mix-Q8_0-00001-of-00002.gguf");
    assert_eq!(reg.get("Qwen-Q8_0").unwrap().checkpoints["mmproj"], "mmproj-a.gguf", "the first projector");
    // A folder named as a built-in means its first quantization; the built-in is `builtin.X`.
    assert_eq!(name("Qwen3-0.6B-GGUF"), "extra.L-Q4_K_M");
    let ids: Vec<String> = reg.listed(true, false).into_iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&"builtin.Qwen3-0.6B-GGUF".to_string()) && !ids.contains(&"Qwen3-0.6B-GGUF".to_string()));
    assert!(!ids.contains(&"Qwen-GGUF".to_string()), "a folder's name is no listed model");
    // v9's names: the options and the alias moved.
    assert_eq!(reg.saved_entry("extra.Root-UD-Q4_K_XL"), opts(1024));
    assert_eq!(reg.saved_entry("extra.Qwen-Q4_K_M"), opts(2048));
    assert!(reg.saved_entry("extra.Root-UD-Q4_K_XL.gguf").is_empty());
    assert_eq!(name("r"), "extra.Root-UD-Q4_K_XL");
    assert_eq!(name("extra.Root-UD-Q4_K_XL.gguf"), "extra.Root-UD-Q4_K_XL", "v9's name still means it");
    assert!(!ids.iter().any(|i| i.ends_with(".gguf")), "and is not listed");
    assert_eq!(
        reg.migrated(),
        [
            ("extra.Root-UD-Q4_K_XL.gguf".to_string(), "extra.Root-UD-Q4_K_XL".to_string()),
            ("extra.Qwen-GGUF".to_string(), "extra.Qwen-Q4_K_M".to_string()),
        ]
    );
}
