//! The registry's rules against real files: the catalogue read from disk, the HF cache layout,
//! the extra models dir, and lemonade's own JSON files written atomically.

use std::collections::BTreeMap;

use api_types::{LoadOptions, ModelType};
use backends::Recipe;
use registry::gguf::{build_header as build, MetaValue};
use registry::{CatalogueEntry, LookupError, Source, RECIPE_OPTIONS_FILE, USER_MODELS_FILE};

use super::*;
use crate::files::{save_recipe_options, save_user_model};

struct Env {
    _tmp: tempfile::TempDir,
    cfg: CatalogueConfig,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = CatalogueConfig {
        cache_dir: tmp.path().join("lemonade"),
        hf_cache: tmp.path().join("hub"),
        extra_models_dir: None,
        physical_memory_gb: Some(24.0),
        disable_filtering: false,
    };
    std::fs::create_dir_all(&cfg.cache_dir).unwrap();
    Env { _tmp: tmp, cfg }
}

fn llm_gguf() -> Vec<u8> {
    build(&[("general.architecture", MetaValue::Str("llama".into()))])
}

fn put(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn builtin_catalogue_keeps_runnable_models_and_filters_the_rest_with_reasons() {
    let e = env();
    let reg = load(&e.cfg).unwrap();
    assert!(reg.models().all(|m| m.recipe.runnable() && !m.recipe.npu()), "runnable, non-NPU recipes only here");
    let qwen = reg.get("Qwen3-0.6B-GGUF").unwrap();
    assert_eq!(qwen.checkpoint, "unsloth/Qwen3-0.6B-GGUF:Q4_0");
    assert_eq!(qwen.model_type, ModelType::Llm);
    assert!(!qwen.downloaded);
    assert_eq!(reg.get("nomic-embed-text-v1-GGUF").unwrap().model_type, ModelType::Embedding);
    assert_eq!(reg.get("jina-reranker-v1-tiny-en-GGUF").unwrap().model_type, ModelType::Reranking);
    // Legacy mmproj filename becomes a secondary checkpoint in the main repo.
    assert_eq!(
        reg.get("Gemma-3-4b-it-GGUF").unwrap().checkpoints.get("mmproj").map(String::as_str),
        Some("ggml-org/gemma-3-4b-it-GGUF:mmproj-model-f16.gguf")
    );
    match reg.get("Gemma3-1b-it-FLM") {
        Err(LookupError::NotSupported { reason, .. }) => assert!(reason.contains("'flm'"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(reg.get("Whisper-Tiny").unwrap().model_type, ModelType::Audio);
    assert_eq!(reg.get("SD-Turbo").unwrap().model_type, ModelType::Image);
    assert_eq!(reg.get("kokoro-v1").unwrap().model_type, ModelType::Tts);
    // 120B model is larger than 80% of 24 GB.
    match reg.get("gpt-oss-120b-GGUF") {
        Err(LookupError::NotSupported { reason, .. }) => {
            assert!(reason.contains("80% of system RAM"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ryzenai_models_are_npu_directories_hidden_off_windows() {
    let mut e = env();
    put(
        &e.cfg.cache_dir.join(USER_MODELS_FILE),
        br#"{"Npu": {"checkpoint": "amd/npu-model", "recipe": "ryzenai-llm"}}"#,
    );
    put(&e.cfg.hf_cache.join("models--amd--npu-model/snapshots/abc/onnx/genai_config.json"), b"{}");
    let reg = load(&e.cfg).unwrap();
    if !cfg!(windows) {
        match reg.get("user.Npu") {
            Err(LookupError::NotSupported { reason, .. }) => assert!(reason.contains("NPU on Windows"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
    e.cfg.disable_filtering = true;
    let reg = load(&e.cfg).unwrap();
    let m = reg.get("user.Npu").unwrap();
    assert_eq!(m.device(), "npu");
    assert!(m.downloaded);
    assert_eq!(
        m.main_path.as_deref(),
        Some(e.cfg.hf_cache.join("models--amd--npu-model/snapshots/abc/onnx").as_path())
    );
}

#[test]
fn filtering_can_be_disabled() {
    let mut e = env();
    e.cfg.disable_filtering = true;
    let reg = load(&e.cfg).unwrap();
    let w = reg.get("Whisper-Tiny").expect("listed once filtering is off");
    assert_eq!(w.recipe.as_str(), "whispercpp");
}

#[test]
fn unknown_model_message_suggests_first_three_names() {
    let e = env();
    let reg = load(&e.cfg).unwrap();
    let err = reg.get("nope").unwrap_err().to_string();
    assert!(err.starts_with("Model 'nope' was not found. Available models include: '"), "{err}");
    assert!(err.contains("more. Use 'lemonade list'"), "{err}");
}

#[test]
fn user_models_resolve_in_hf_cache_and_are_downloaded_when_complete() {
    let e = env();
    put(
        &e.cfg.cache_dir.join(USER_MODELS_FILE),
        br#"{"Smol": {"checkpoint": "org/Smol-GGUF:Q4_1", "recipe": "llamacpp", "labels": ["custom"]}}"#,
    );
    put(
        &e.cfg.cache_dir.join(RECIPE_OPTIONS_FILE),
        br#"{"user.Smol": {"ctx_size": 2048, "llamacpp_args": "", "steps": 3, "llamacpp_backend": 7}}"#,
    );
    let snap = e.cfg.hf_cache.join("models--org--Smol-GGUF/snapshots/abc");
    put(&snap.join("Smol.Q4_1.gguf"), &llm_gguf());
    put(&snap.join("Smol.Q8_0.gguf"), &llm_gguf());

    let reg = load(&e.cfg).unwrap();
    let m = reg.get("user.Smol").unwrap();
    assert_eq!(m.source, Source::User);
    assert!(m.suggested, "user models default to suggested");
    assert_eq!(m.main_path.as_deref(), Some(snap.join("Smol.Q4_1.gguf").as_path()));
    assert!(m.downloaded);
    let api = reg.to_api(m);
    // Only llamacpp keys, "" counts as unset, and a value of the wrong type reads as unset.
    assert_eq!(
        api.recipe_options,
        LoadOptions { ctx_size: Some(api_types::CtxSize::Tokens(2048)), ..LoadOptions::default() }
    );

    // A partial file next to it means not downloaded.
    put(&snap.join("Smol.Q4_1.gguf.partial"), b"");
    let reg = load(&e.cfg).unwrap();
    assert!(!reg.get("user.Smol").unwrap().downloaded);
}

#[test]
fn corrupt_user_models_file_is_an_error_not_an_empty_catalogue() {
    let e = env();
    put(&e.cfg.cache_dir.join(USER_MODELS_FILE), b"{not json");
    let err = load(&e.cfg).unwrap_err().to_string();
    assert!(err.contains(USER_MODELS_FILE), "{err}");
}

#[test]
fn extra_models_dir_naming_grouping_and_gguf_types() {
    let mut e = env();
    let dir = e.cfg.cache_dir.join("extra");
    put(&dir.join("foo-Q4_K_M.gguf"), &llm_gguf());
    put(&dir.join("mmproj-loose.gguf"), &llm_gguf());
    put(&dir.join("notes.txt"), b"x");
    put(&dir.join("Big/Big-00002-of-00002.gguf"), &llm_gguf());
    put(&dir.join("Big/Big-00001-of-00002.GGUF"), &llm_gguf());
    put(&dir.join("Vis/model.gguf"), &llm_gguf());
    put(&dir.join("Vis/mmproj-f16.gguf"), &llm_gguf());
    put(&dir.join("OnlyProj/mmproj.gguf"), &llm_gguf());
    let emb =
        build(&[("general.architecture", MetaValue::Str("bert".into())), ("bert.pooling_type", MetaValue::Int(1))]);
    let rr =
        build(&[("general.architecture", MetaValue::Str("bert".into())), ("bert.pooling_type", MetaValue::Int(4))]);
    put(&dir.join("minilm.gguf"), &emb);
    put(&dir.join("reranker.gguf"), &rr);
    e.cfg.extra_models_dir = Some(dir.clone());

    let reg = load(&e.cfg).unwrap();
    let names: Vec<&str> =
        reg.models().filter(|m| m.source == Source::ExtraModelsDir).map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["extra.Big", "extra.Vis", "extra.foo-Q4_K_M", "extra.minilm", "extra.reranker"]);
    let big = reg.get("extra.Big").unwrap();
    assert_eq!(big.main_path.as_deref(), Some(dir.join("Big/Big-00001-of-00002.GGUF").as_path()));
    assert!(big.downloaded);
    let vis = reg.get("extra.Vis").unwrap();
    assert!(vis.labels.contains(&"vision".to_string()));
    assert_eq!(vis.checkpoints.get("mmproj").map(String::as_str), Some("mmproj-f16.gguf"));
    assert_eq!(vis.mmproj_path.as_deref(), Some(dir.join("Vis/mmproj-f16.gguf").as_path()));
    assert_eq!(reg.get("extra.foo-Q4_K_M").unwrap().model_type, ModelType::Llm);
    let m = reg.get("extra.minilm").unwrap();
    assert_eq!(m.model_type, ModelType::Embedding);
    assert!(m.labels.contains(&"embeddings".to_string()));
    assert_eq!(reg.get("extra.reranker").unwrap().model_type, ModelType::Reranking);
}

/// An extra model's options and aliases saved under its v9 name (`extra.<file>.gguf`) are
/// written under its name now by the first scan, and stay so.
#[test]
fn an_extra_models_saved_options_and_aliases_follow_its_v11_name_on_disk() {
    let mut e = env();
    let dir = e.cfg.cache_dir.join("extra");
    put(&dir.join("foo-Q4_K_M.gguf"), &llm_gguf());
    e.cfg.extra_models_dir = Some(dir);
    let o = LoadOptions { ctx_size: Some(api_types::CtxSize::Tokens(2048)), ..LoadOptions::default() };
    save_recipe_options(&e.cfg.cache_dir, "extra.foo-Q4_K_M.gguf", Some(&o.to_map())).unwrap();
    crate::files::save_alias(&e.cfg.cache_dir, "f", Some("extra.foo-Q4_K_M.gguf")).unwrap();
    for _ in 0..2 {
        let reg = load(&e.cfg).unwrap();
        let m = reg.get("f").unwrap();
        assert_eq!(m.name, "extra.foo-Q4_K_M");
        assert_eq!(reg.saved_options(m).ctx_size, o.ctx_size);
        let options = std::fs::read_to_string(e.cfg.cache_dir.join(RECIPE_OPTIONS_FILE)).unwrap();
        assert!(options.contains("\"extra.foo-Q4_K_M\"") && !options.contains(".gguf"), "{options}");
        let aliases = std::fs::read_to_string(e.cfg.cache_dir.join(registry::ALIASES_FILE)).unwrap();
        assert!(aliases.contains("\"extra.foo-Q4_K_M\"") && !aliases.contains(".gguf"), "{aliases}");
    }
}

#[test]
fn saved_options_are_replaced_atomically_and_read_back() {
    let e = env();
    let mut o = LoadOptions { ctx_size: Some(api_types::CtxSize::Tokens(8192)), ..LoadOptions::default() };
    save_recipe_options(&e.cfg.cache_dir, "user.X", Some(&o.to_map())).unwrap();
    o.llamacpp_args = Some("--threads 1".into());
    save_recipe_options(&e.cfg.cache_dir, "Qwen3-0.6B-GGUF", Some(&o.to_map())).unwrap();
    let reg = load(&e.cfg).unwrap();
    let q = reg.get("Qwen3-0.6B-GGUF").unwrap();
    assert_eq!(reg.saved_options(q), o);
    save_recipe_options(&e.cfg.cache_dir, "Qwen3-0.6B-GGUF", None).unwrap();
    let text = std::fs::read_to_string(e.cfg.cache_dir.join(RECIPE_OPTIONS_FILE)).unwrap();
    assert!(text.contains("user.X") && !text.contains("Qwen3"), "{text}");
    let leftovers: Vec<_> = std::fs::read_dir(&e.cfg.cache_dir)
        .unwrap()
        .filter_map(|x| x.ok())
        .filter(|x| x.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temp files left behind");
}

#[test]
fn registrations_are_written_atomically_and_labelled_like_v9() {
    let e = env();
    let labels = registry::registration_labels(
        &["vision".into(), "hot".into()],
        true,
        false,
        true,
        false,
        Some(Recipe::LlamaCpp),
    );
    assert_eq!(labels, ["custom", "embeddings", "hot", "reasoning", "vision"]);
    let entry = CatalogueEntry {
        checkpoint: "org/m-GGUF:Q4_0".into(),
        recipe: "llamacpp".into(),
        labels,
        suggested: Some(true),
        ..Default::default()
    };
    save_user_model(&e.cfg.cache_dir, "M", Some(&entry)).unwrap();
    let reg = load(&e.cfg).unwrap();
    assert_eq!(reg.get("user.M").unwrap().model_type, ModelType::Embedding);
    save_user_model(&e.cfg.cache_dir, "M", None).unwrap();
    let err = load(&e.cfg).unwrap().get("user.M").unwrap_err().to_string();
    assert!(err.starts_with("Model 'user.M' was not found."), "{err}");
}

#[test]
fn concurrent_registrations_are_all_kept() {
    let e = env();
    let dir = e.cfg.cache_dir.clone();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let entry = CatalogueEntry {
                    checkpoint: format!("org/m{i}:Q4_0"),
                    recipe: "llamacpp".into(),
                    ..Default::default()
                };
                save_user_model(&dir, &format!("M{i}"), Some(&entry)).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let all: BTreeMap<String, CatalogueEntry> =
        serde_json::from_slice(&std::fs::read(dir.join(USER_MODELS_FILE)).unwrap()).unwrap();
    assert_eq!(all.len(), 8, "no registration lost");
}

/// A rescan reads the GGUF header only of a file that changed (size or mtime); the facts of
/// the others come from the header cache, and are the same as read.
#[test]
fn a_rescan_reads_only_the_headers_of_files_that_changed() {
    let mut e = env();
    let dir = e.cfg.cache_dir.parent().unwrap().join("extra");
    for i in 0..5 {
        put(&dir.join(format!("m{i}.gguf")), &llm_gguf());
    }
    e.cfg.extra_models_dir = Some(dir.clone());
    let headers = HeaderCache::default();
    let first = load_with(&e.cfg, Some(&headers)).unwrap();
    assert_eq!(headers.reads(), 5, "the first scan reads every header");
    let again = load_with(&e.cfg, Some(&headers)).unwrap();
    assert_eq!(headers.reads(), 5, "an unchanged file's header is not read again");
    let shape = |r: &Registry, n: &str| r.get(n).unwrap().shape;
    assert_eq!(shape(&again, "extra.m3"), shape(&first, "extra.m3"));
    // One file rewritten (another size): only its header is read again, and its new facts used.
    let moe = build(&[("general.architecture", MetaValue::Str("qwen3moe".into())), ("x", MetaValue::Int(1))]);
    put(&dir.join("m3.gguf"), &moe);
    load_with(&e.cfg, Some(&headers)).unwrap();
    assert_eq!(headers.reads(), 6);
}
