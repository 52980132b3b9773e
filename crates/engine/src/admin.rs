//! The runtime admin API's application side (spec: runtime-admin-api): a model's admin view,
//! the load overrides (gguf_n_ctx, gguf_flash_attn, gguf_type_k/v) as options, and the admin
//! load, whose conditions the lifecycle's owner decides (`scheduler::Event::AdminLoad`).

use api_types::{AdminLoadRequest, AdminModel, LoadOptions};
use registry::ModelInfo;
use scheduler::{LoadOutcome, Rejection, State as RtState};
use serde_json::{json, Map, Value};

use crate::error::{EngineError, Result};
use crate::lifecycle::ModelView;
use crate::Engine;

use backends::llamacpp::CACHE_TYPES;
/// Fields of other backends: a 400 when sent to a llama.cpp model.
const FOREIGN_PREFIXES: &[&str] = &["exllama_", "vllm_", "llama_server_"];

fn constraints() -> Value {
    json!({
        "gguf_n_ctx": {"kind": "integer", "minimum": 1, "step": 1},
        "gguf_flash_attn": {"kind": "enum", "default": "auto", "allowed_values": ["on", "off", "auto"], "examples": ["auto", "on", "off"]},
        "gguf_type_k": {"kind": "string_or_null", "format": "ggml_type_name", "default": "f16", "allowed_values": CACHE_TYPES, "examples": ["f16", "q8_0", "q4_0"]},
        "gguf_type_v": {"kind": "string_or_null", "format": "ggml_type_name", "default": "f16", "allowed_values": CACHE_TYPES, "examples": ["f16", "q8_0", "q4_0"]}
    })
}

fn recommendations() -> Value {
    json!({"gguf_cache_type_pairs": {"kind": "pair_presets", "fields": ["gguf_type_k", "gguf_type_v"],
        "recommended_pairs": [
            {"label": "f16/f16", "gguf_type_k": "f16", "gguf_type_v": "f16"},
            {"label": "q8_0/q8_0", "gguf_type_k": "q8_0", "gguf_type_v": "q8_0"},
            {"label": "q4_0/q4_0", "gguf_type_k": "q4_0", "gguf_type_v": "q4_0"}],
        "notes": ["Service-curated presets for GGUF cache types.",
                  "Prefer symmetric K/V pairs; asymmetric pairs may reduce GPU offload in llama.cpp."]}})
}

/// The model's weights in MiB (every shard and the mmproj), as the catalogue measured them.
fn vram_estimate(info: &ModelInfo) -> Option<u64> {
    info.shape.map(|s| s.weight_bytes.div_ceil(1 << 20))
}

/// llama-server's default number of parallel slots.
const LLAMA_SERVER_SLOTS: u32 = 4;

/// `info` as the admin API shows it, with its published state `v`.
pub fn model(rt: &Engine, info: &ModelInfo, v: Option<&ModelView>) -> AdminModel {
    let state = v.map(|v| v.state).unwrap_or(RtState::Unloaded);
    let is_loaded = state == RtState::Loaded;
    let in_flight = v.map(|v| v.in_flight).unwrap_or(0);
    let cached = rt.prompt_cache.usage(&info.name);
    // On a GPU backend, what the scheduler counts it for; else the weights' size.
    let counted = v.map(|v| v.vram).filter(|b| *b > 0);
    let vram = counted.map(|b| b.div_ceil(1 << 20)).or_else(|| vram_estimate(info));
    let mut modalities = vec!["text"];
    if info.mmproj_path.is_some() {
        modalities.push("image");
    }
    AdminModel {
        name: info.name.clone(),
        resolved_backend: info.recipe.to_string(),
        configured_enabled: info.downloaded,
        runtime_state: state.as_str().into(),
        is_loaded,
        replicas: 1,
        replica_max: 1,
        loaded_replicas: is_loaded as u32,
        inflight_requests: in_flight,
        queue_depth: v.map(|v| v.queue_depth).unwrap_or(0),
        runtime_inflight: in_flight,
        configured_target_inflight: LLAMA_SERVER_SLOTS,
        effective_target_inflight: LLAMA_SERVER_SLOTS,
        last_error: v.and_then(|v| v.last_error.clone()),
        pinned: v.is_some_and(|v| v.pinned),
        unloads_in_ms: v.and_then(|v| v.unload_at).map(|at| at.saturating_sub(rt.lifecycle.now_ms())),
        memory_estimate: v.map(|v| v.memory).unwrap_or(0),
        prompt_cache_files: cached.0,
        prompt_cache_bytes: cached.1,
        vram_estimate_mib: vram,
        vram_estimate_replica_count: 1,
        vram_estimate_source: match (counted, vram) {
            (Some(_), _) => "gguf_estimate",
            (None, Some(_)) => "model_artifact_size",
            (None, None) => "unavailable",
        }
        .into(),
        load_constraints: constraints(),
        load_recommendations: recommendations(),
        load_override: rt.lifecycle.load_override(&info.name).unwrap_or_else(|| json!({})),
        capabilities: json!({"modalities": modalities, "multi_turn": info.model_type == api_types::ModelType::Llm, "thinking_modes": ["default"]}),
        definition: json!({
            "model_path": info.main_path.as_ref().map(|p| p.display().to_string()),
            "backend": info.recipe,
            "checkpoint": info.checkpoint,
            "type": info.model_type,
            "enabled": info.downloaded,
            "replicas": 1,
            "replica_max": 1,
            "target_inflight": LLAMA_SERVER_SLOTS,
            "gguf_n_ctx": rt.lifecycle.ctx_size(info, &rt.lifecycle.effective_options(info, &Default::default())),
            "gguf_flash_attn": "auto",
            "gguf_type_k": null,
            "gguf_type_v": null,
            "recipe_options": rt.catalogue.registry().saved_options(info),
        }),
    }
}

/// Every configured (downloaded) model and every model the lifecycle has seen, with its state.
pub fn models(rt: &Engine) -> Vec<AdminModel> {
    let view = rt.lifecycle.view();
    let reg = rt.catalogue.registry();
    reg.models()
        .filter(|m| {
            m.downloaded || view.get(&m.name).is_some_and(|v| v.state != RtState::Unloaded || v.last_error.is_some())
        })
        .map(|m| model(rt, m, view.get(&m.name)))
        .collect()
}

fn invalid(message: String) -> EngineError {
    EngineError::Invalid { message, param: None, code: Some("invalid_load_request") }
}

/// The admin body's overrides as recipe options: 422 for schema errors, 400 for values the
/// llama.cpp backend cannot take. The flags go through `backends::llamacpp::override_args`.
pub fn overrides(req: &AdminLoadRequest) -> Result<LoadOptions> {
    if req.gguf_n_ctx == Some(0) {
        return Err(EngineError::LoadSchema("Invalid value for 'gguf_n_ctx': must be at least 1".into()));
    }
    if let Some(k) = req.other.keys().find(|k| FOREIGN_PREFIXES.iter().any(|p| k.starts_with(p))) {
        return Err(invalid(format!("'{k}' is not a load override of llama.cpp models")));
    }
    if let Some(k) = req.other.keys().next() {
        return Err(EngineError::LoadSchema(format!("Unknown field '{k}'")));
    }
    if req.replicas.is_some_and(|r| r != 1) {
        return Err(invalid("replicas: only 1 replica per model is supported".into()));
    }
    let (fa, k, v) = (req.gguf_flash_attn.as_deref(), req.gguf_type_k.as_deref(), req.gguf_type_v.as_deref());
    let args = backends::llamacpp::override_args(fa, k, v).map_err(|e| invalid(e.to_string()))?;
    let ctx_size = req.gguf_n_ctx.map(u32::try_from).transpose().map_err(|_| {
        EngineError::LoadSchema(format!("Invalid value for 'gguf_n_ctx': must be at most {}", u32::MAX))
    })?;
    Ok(LoadOptions {
        ctx_size: ctx_size.map(api_types::CtxSize::Tokens),
        llamacpp_args: (!args.is_empty()).then(|| args.join(" ")),
        ..LoadOptions::default()
    })
}

/// The effective options with the admin overrides applied (flags appended to `llamacpp_args`).
fn with_overrides(mut effective: LoadOptions, opts: &LoadOptions) -> LoadOptions {
    effective.ctx_size = opts.ctx_size.or(effective.ctx_size);
    if let Some(extra) = &opts.llamacpp_args {
        let base = effective.llamacpp_args.as_deref().unwrap_or_default();
        effective.llamacpp_args = Some(format!("{base} {extra}").trim().to_string());
    }
    effective
}

/// The override as the admin API reports it (`load_override`): the fields that were set.
fn override_value(req: &AdminLoadRequest) -> Value {
    let set = AdminLoadRequest { other: Map::new(), ..req.clone() };
    let v = serde_json::to_value(set).unwrap_or_else(|_| json!({}));
    Value::Object(v.as_object().cloned().unwrap_or_default().into_iter().filter(|(_, v)| !v.is_null()).collect())
}

/// Loads `name` and waits until it is loaded (or failed); already loaded, it is left as it is.
/// The owner decides on the model's state as it holds it: overrides are refused while it is
/// loaded or loading (400), any load while it is unloading (409).
pub async fn load(rt: &Engine, name: &str, req: &AdminLoadRequest) -> Result<AdminModel> {
    let info = rt.catalogue.get(name)?;
    let opts = overrides(req)?;
    if !info.loads_without_pull() {
        return Err(invalid(format!("Model '{name}' is not downloaded")));
    }
    let effective = with_overrides(rt.lifecycle.effective_options(&info, &Default::default()), &opts);
    rt.lifecycle.check_args(&info, &effective).await?;
    let before = rt.lifecycle.load_override(name);
    rt.lifecycle.set_load_override(name, (!opts.is_empty()).then(|| override_value(req)));
    let outcome = rt.lifecycle.admin_load(&info, effective, !opts.is_empty()).await;
    if let LoadOutcome::Refused(Rejection::Unloading | Rejection::InUse(_)) = &outcome {
        rt.lifecycle.set_load_override(name, before);
    }
    match outcome {
        LoadOutcome::Refused(Rejection::Unloading) => Err(EngineError::StillUnloading { model: name.to_string() }),
        LoadOutcome::Refused(Rejection::InUse(s)) => {
            Err(invalid(format!("Model '{name}' is {}: unload it before loading with overrides", s.as_str())))
        }
        other => EngineError::from_load(name, other),
    }?;
    Ok(model(rt, &info, rt.lifecycle.view().get(name)))
}

/// Unloads `name` gracefully (not loaded is fine: the goal state is reached) and forgets its
/// overrides.
pub async fn unload(rt: &Engine, name: &str) -> Result<AdminModel> {
    let info = rt.catalogue.get(name)?;
    let _ = rt.lifecycle.unload(Some(name)).await;
    rt.lifecycle.set_load_override(name, None);
    Ok(model(rt, &info, rt.lifecycle.view().get(name)))
}
