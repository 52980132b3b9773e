//! The runtime admin API (`/v1/admin/...`, spec: runtime-admin-api): configured models
//! with their live runtime state, synchronous load with backend-specific overrides, graceful
//! unload, and GPU memory through NVML.
//!
//! Runtime states: `unloaded` (known, no backend; inference rejected unless auto-load),
//! `loading` (a backend is starting), `loaded` (serving), `unloading` (no new requests; in-flight
//! ones finish, then the backend stops), `failed` (the last load failed or the backend died;
//! `last_error` says why; loading again is allowed).

use api_types::{AdminLoadRequest, AdminModel, AdminModels, GpuMemory, GpuModel};
use axum::extract::{Path, State};
use axum::Json;
use bytes::Bytes;
use registry::ModelInfo;
use scheduler::State as RtState;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::state::AppState;
use engine::ModelView;

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

fn admin_model(rt: &AppState, info: &ModelInfo, v: Option<&ModelView>) -> AdminModel {
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
            "gguf_n_ctx": rt.lifecycle.effective_options(info, &Map::new()).get("ctx_size").cloned().unwrap_or(json!(backends::llamacpp::DEFAULT_CTX_SIZE)),
            "gguf_flash_attn": "auto",
            "gguf_type_k": null,
            "gguf_type_v": null,
            "recipe_options": rt.catalogue.registry().saved_options(info),
        }),
    }
}

fn lookup(rt: &AppState, name: &str) -> Result<ModelInfo, ApiError> {
    Ok(rt.catalogue.get(name)?)
}

/// Every configured (downloaded) model and every model the runtime has seen, with its state.
#[utoipa::path(get, path = "/v1/admin/models", tag = "Admin",
    description = "Configured models with their live runtime state: `unloaded`, `loading`, `loaded`, `unloading` \
                   (no new requests; in-flight ones finish) or `failed` (see `last_error`). `load_constraints` lists \
                   the load overrides this model accepts.",
    responses((status = 200, description = "Models", body = AdminModels)))]
pub async fn models(State(rt): State<AppState>) -> Json<AdminModels> {
    let view = rt.lifecycle.view();
    let reg = rt.catalogue.registry();
    let models = reg
        .models()
        .filter(|m| {
            m.downloaded || view.get(&m.name).is_some_and(|v| v.state != RtState::Unloaded || v.last_error.is_some())
        })
        .map(|m| admin_model(&rt, m, view.get(&m.name)))
        .collect();
    Json(AdminModels { models, upstreams: rt.remotes.views() })
}

/// Turns the admin body into recipe options: 422 for schema errors, 400 for values the
/// llama.cpp backend cannot take.
fn overrides(body: &Bytes) -> Result<(AdminLoadRequest, Map<String, Value>), ApiError> {
    let req: AdminLoadRequest = if body.iter().all(u8::is_ascii_whitespace) {
        AdminLoadRequest::default()
    } else {
        crate::extract::parse(body).map_err(|e| ApiError::Unprocessable(e.to_string()))?
    };
    if req.gguf_n_ctx == Some(0) {
        return Err(ApiError::Unprocessable("Invalid value for 'gguf_n_ctx': must be at least 1".into()));
    }
    let invalid = |m: String| ApiError::BadRequest { message: m, param: None, code: Some("invalid_load_request") };
    if let Some(k) = req.other.keys().find(|k| FOREIGN_PREFIXES.iter().any(|p| k.starts_with(p))) {
        return Err(invalid(format!("'{k}' is not a load override of llama.cpp models")));
    }
    if let Some(k) = req.other.keys().next() {
        return Err(ApiError::Unprocessable(format!("Unknown field '{k}'")));
    }
    if req.replicas.is_some_and(|r| r != 1) {
        return Err(invalid("replicas: only 1 replica per model is supported".into()));
    }
    let args = backends::llamacpp::override_args(
        req.gguf_flash_attn.as_deref(),
        req.gguf_type_k.as_deref(),
        req.gguf_type_v.as_deref(),
    )
    .map_err(|e| invalid(e.to_string()))?;
    let mut opts = Map::new();
    if let Some(n) = req.gguf_n_ctx {
        opts.insert("ctx_size".into(), n.into());
    }
    if !args.is_empty() {
        opts.insert("llamacpp_args".into(), args.join(" ").into());
    }
    Ok((req, opts))
}

/// Loads a model and waits until it is loaded (or failed).
#[utoipa::path(post, path = "/v1/admin/models/{model_name}/load", tag = "Admin",
    description = "Synchronous: answers once the model is loaded. 200 when it is already loaded or loading (without \
                   overrides). Overrides (gguf_n_ctx, gguf_flash_attn, gguf_type_k, gguf_type_v) are runtime-only and \
                   only accepted while the model is unloaded or failed.",
    params(("model_name" = String, Path, description = "Model name")),
    request_body(content = AdminLoadRequest, description = "Optional overrides"),
    responses(
        (status = 200, description = "Loaded", body = AdminModel),
        (status = 400, description = "`invalid_load_request`: values invalid for this backend, or overrides for a loaded model", body = api_types::ErrorResponse),
        (status = 404, description = "Unknown model", body = api_types::ErrorResponse),
        (status = 409, description = "The model is unloading", body = api_types::ErrorResponse),
        (status = 422, description = "The body failed schema validation", body = api_types::ErrorResponse),
        (status = 500, description = "The load failed; the model is `failed` with `last_error`", body = api_types::ErrorResponse),
    ))]
pub async fn load(
    State(rt): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<AdminModel>, ApiError> {
    let info = lookup(&rt, &name)?;
    let (req, opts) = overrides(&body)?;
    let state = rt.lifecycle.view().get(&name).map(|v| v.state).unwrap_or(RtState::Unloaded);
    if may_load(&name, state, !opts.is_empty(), info.downloaded)? {
        let effective = with_overrides(rt.lifecycle.effective_options(&info, &Map::new()), &opts);
        rt.lifecycle.set_load_override(&name, (!opts.is_empty()).then(|| override_value(req)));
        engine::EngineError::from_load(&name, rt.lifecycle.load(&info, effective, None, None).await)?;
    }
    Ok(Json(admin_model(&rt, &info, rt.lifecycle.view().get(&name))))
}

/// Whether a load must run (false: already loaded), or why it may not.
fn may_load(name: &str, state: RtState, has_overrides: bool, downloaded: bool) -> Result<bool, ApiError> {
    let invalid = |message: String| ApiError::BadRequest { message, param: None, code: Some("invalid_load_request") };
    match state {
        RtState::Unloading => {
            Err(ApiError::Conflict(format!("Model '{name}' is unloading; load it again once it is unloaded")))
        }
        RtState::Loaded | RtState::Loading if has_overrides => {
            Err(invalid(format!("Model '{name}' is {}: unload it before loading with overrides", state.as_str())))
        }
        RtState::Loaded => Ok(false),
        _ if !downloaded => Err(invalid(format!("Model '{name}' is not downloaded"))),
        _ => Ok(true),
    }
}

/// The effective options with the admin overrides applied (flags appended to `llamacpp_args`).
fn with_overrides(mut effective: Map<String, Value>, opts: &Map<String, Value>) -> Map<String, Value> {
    if let Some(n) = opts.get("ctx_size") {
        effective.insert("ctx_size".into(), n.clone());
    }
    if let Some(Value::String(extra)) = opts.get("llamacpp_args") {
        let base = effective.get("llamacpp_args").and_then(Value::as_str).unwrap_or_default();
        effective.insert("llamacpp_args".into(), format!("{base} {extra}").trim().to_string().into());
    }
    effective
}

/// The override as the admin API reports it (`load_override`): the fields that were set.
fn override_value(req: AdminLoadRequest) -> Value {
    serde_json::to_value(AdminLoadRequest { other: Map::new(), ..req })
        .map(|v| {
            Value::Object(
                v.as_object().cloned().unwrap_or_default().into_iter().filter(|(_, v)| !v.is_null()).collect(),
            )
        })
        .unwrap_or_else(|_| json!({}))
}

/// Unloads a model gracefully: no new requests, in-flight ones finish, then the backend stops.
#[utoipa::path(post, path = "/v1/admin/models/{model_name}/unload", tag = "Admin",
    description = "200 when the model is already unloaded or unloading.",
    params(("model_name" = String, Path, description = "Model name")),
    responses(
        (status = 200, description = "Unloaded", body = AdminModel),
        (status = 404, description = "Unknown model", body = api_types::ErrorResponse),
    ))]
pub async fn unload(State(rt): State<AppState>, Path(name): Path<String>) -> Result<Json<AdminModel>, ApiError> {
    let info = lookup(&rt, &name)?;
    // Not loaded is fine here (unlike /unload): the goal state is reached.
    let _ = rt.lifecycle.unload(Some(&name)).await;
    rt.lifecycle.set_load_override(&name, None);
    Ok(Json(admin_model(&rt, &info, rt.lifecycle.view().get(&name))))
}

/// GPU memory (NVML) and per-model VRAM estimates.
#[utoipa::path(get, path = "/v1/admin/gpu-memory", tag = "Admin",
    description = "On a machine without NVIDIA GPUs (or without the driver), `gpus` is empty and `error` says why.",
    responses((status = 200, description = "GPU memory", body = GpuMemory)))]
pub async fn gpu_memory(State(rt): State<AppState>) -> Json<GpuMemory> {
    let (gpus, error) = tokio::task::spawn_blocking(host::hardware::gpu_memory)
        .await
        .unwrap_or_else(|e| (Vec::new(), Some(e.to_string())));
    let Json(AdminModels { models, .. }) = models(State(rt)).await;
    let models = models
        .into_iter()
        .map(|m| GpuModel {
            name: m.name,
            runtime_state: m.runtime_state,
            is_loaded: m.is_loaded,
            configured_target_inflight: m.configured_target_inflight,
            effective_target_inflight: m.effective_target_inflight,
            vram_estimate_mib: m.vram_estimate_mib,
            vram_estimate_replica_count: m.vram_estimate_replica_count,
            vram_estimate_source: m.vram_estimate_source,
        })
        .collect();
    Json(GpuMemory { gpus, models, error })
}
