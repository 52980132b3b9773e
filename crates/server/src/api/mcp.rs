//! Lemonade v11's MCP gateway: `POST /mcp` (Streamable HTTP, JSON-RPC 2.0, single messages
//! and batches) with `initialize`, `notifications/initialized`, `ping`, `tools/list` and
//! `tools/call`. The protocol is `dialects::mcp`'s; a tool runs as the same request to
//! lemonade's own handlers would (so collections, variants and loading on demand apply), and a
//! failing tool answers `isError: true`, never a JSON-RPC error.

use std::path::{Path, PathBuf};

use api_types::*;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use dialects::mcp::{self, Message, RpcError, ToolError};
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::extract::{Form, JsonBody, Part};
use crate::state::AppState;

/// The MCP gateway.
#[utoipa::path(post, path = "/mcp", tag = "Lemonade",
    description = "Lemonade v11's MCP gateway (Model Context Protocol, Streamable HTTP transport, tools only). A \
        JSON-RPC 2.0 message or a batch: `initialize`, `notifications/initialized`, `ping`, `tools/list`, `tools/call` \
        (`lemonade_list_models`, `lemonade_chat`, `lemonade_transcribe_audio`, `lemonade_generate_image`, \
        `lemonade_omni`). \
        Notifications alone are answered 202 with no body. A tool that fails answers `isError: true`. Unparsable JSON \
        (-32700) or a message that is not JSON-RPC (-32600) is a 400; `GET /mcp` is a 405 (no server-initiated \
        stream). The API key, Origin and Host rules apply as on every route.",
    request_body(content = Object, description = "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"tools/list\"}"),
    responses(
        (status = 200, description = "The answer (or an array of answers for a batch)", body = Object),
        (status = 202, description = "Only notifications: nothing to answer"),
        (status = 400, description = "Not JSON (-32700) or not JSON-RPC (-32600)", body = Object),
    ))]
pub async fn mcp(State(rt): State<AppState>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return rejected(&Value::Null, &RpcError::new(mcp::PARSE_ERROR, format!("Parse error: {e}"))),
    };
    let answers: Vec<Value> = match &v {
        Value::Array(batch) if batch.is_empty() => {
            return rejected(&Value::Null, &RpcError::new(mcp::INVALID_REQUEST, "an empty batch"));
        }
        Value::Array(batch) => {
            let mut out = Vec::new();
            for m in batch {
                out.extend(one(&rt, m).await);
            }
            out
        }
        single => match mcp::parse(single) {
            Err((id, e)) => return rejected(&id, &e),
            _ => one(&rt, single).await.into_iter().collect(),
        },
    };
    match (v.is_array(), answers.len()) {
        (_, 0) => StatusCode::ACCEPTED.into_response(),
        (false, _) => Json(answers.into_iter().next().unwrap_or(Value::Null)).into_response(),
        (true, _) => Json(Value::Array(answers)).into_response(),
    }
}

/// A message that is not JSON-RPC (or not JSON): 400 with the JSON-RPC error.
fn rejected(id: &Value, e: &RpcError) -> Response {
    (StatusCode::BAD_REQUEST, Json(mcp::error(id, e))).into_response()
}

/// The answer to one message (none for a notification).
async fn one(rt: &AppState, m: &Value) -> Option<Value> {
    let (id, method, params) = match mcp::parse(m) {
        Err((id, e)) => return Some(mcp::error(&id, &e)),
        Ok(Message::Notification { .. }) => return None,
        Ok(Message::Request { id, method, params }) => (id, method, params),
    };
    let result = match method.as_str() {
        "initialize" => Ok(mcp::initialize(&params, engine::VERSION)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": mcp::tools()})),
        "tools/call" => call(rt, &params).await,
        other => Err(RpcError::new(mcp::METHOD_NOT_FOUND, format!("Method not found: {other}"))),
    };
    Some(match result {
        Ok(r) => mcp::result(&id, r),
        Err(e) => mcp::error(&id, &e),
    })
}

/// `tools/call`: an unknown tool or malformed params is a JSON-RPC error; a tool that fails is
/// an `isError` result.
async fn call(rt: &AppState, params: &Value) -> Result<Value, RpcError> {
    let name = params["name"].as_str().ok_or_else(|| RpcError::new(mcp::INVALID_PARAMS, "'name' is required"))?;
    let args = match &params["arguments"] {
        Value::Null => Map::new(),
        Value::Object(o) => o.clone(),
        _ => return Err(RpcError::new(mcp::INVALID_PARAMS, "'arguments' must be an object")),
    };
    let r = match name {
        "lemonade_list_models" => Ok(list_models(rt, &args)),
        "lemonade_chat" => chat(rt, &args).await,
        "lemonade_transcribe_audio" => transcribe(rt, &args).await,
        "lemonade_generate_image" => generate_image(rt, &args).await,
        "lemonade_omni" => omni(rt, &args).await,
        other => return Err(RpcError::new(mcp::INVALID_PARAMS, format!("Unknown tool: {other}"))),
    };
    Ok(r.unwrap_or_else(|e| mcp::tool_error(e.0)))
}

fn list_models(rt: &AppState, args: &Map<String, Value>) -> Value {
    let flag = |k: &str| args.get(k).and_then(Value::as_bool).unwrap_or(true);
    let reg = rt.catalogue.registry();
    let loaded: Vec<String> = rt.lifecycle.loaded().iter().map(|(r, _)| r.info.name.clone()).collect();
    let listed = reg.listed(false);
    let chat = listed.iter().find(|(_, m)| m.model_type == ModelType::Llm).map(|(id, _)| id.clone());
    let available: Vec<String> = listed.into_iter().map(|(id, _)| id).collect();
    let suggested: Vec<String> =
        reg.models().filter(|m| !m.downloaded && m.suggested).map(|m| m.name.clone()).take(20).collect();
    let summary = format!(
        "{} loaded, {} downloaded; recommended chat model: {}",
        loaded.len(),
        available.len(),
        chat.as_deref().unwrap_or("none downloaded")
    );
    let data = json!({"loaded": loaded, "available": if flag("include_available") { available } else { vec![] },
                      "suggested_to_pull": if flag("include_suggested") { suggested } else { vec![] },
                      "recommended_chat_model": chat});
    mcp::tool_result(vec![mcp::text(summary), mcp::text(data.to_string())], false)
}

/// The answer of one of lemonade's own handlers: its JSON when it succeeded, else its error.
async fn answer_of(r: Result<Response, crate::error::ApiError>) -> Result<(Value, Bytes), ToolError> {
    let (bytes, _) = crate::api::own_answer(r).await.map_err(|e| ToolError(e.0))?;
    Ok((serde_json::from_slice(&bytes).unwrap_or(Value::Null), bytes))
}

async fn chat(rt: &AppState, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let body = mcp::chat_request(args)?;
    let value: ChatCompletionRequest = serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
    let raw = Bytes::from(body.to_string());
    let r = crate::api::openai::chat_completions(State(rt.clone()), JsonBody { value, raw }).await;
    Ok(mcp::chat_result(&answer_of(r).await?.0))
}

async fn transcribe(rt: &AppState, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let model = mcp::string_arg(args, "model", true)?.unwrap_or_default();
    let (name, data) = audio(rt, args)?;
    let format = mcp::string_arg(args, "response_format", false)?.unwrap_or("json");
    let field = |n: &str, v: &str| Part {
        name: n.into(),
        file_name: None,
        content_type: None,
        data: Bytes::from(v.to_string()),
    };
    let mut parts = vec![field("model", model), field("response_format", format)];
    if let Some(lang) = mcp::string_arg(args, "language", false)? {
        parts.push(field("language", lang));
    }
    parts.push(Part { name: "file".into(), file_name: Some(name), content_type: None, data });
    let r = crate::api::audio::transcriptions(State(rt.clone()), Form { parts }).await;
    let (v, bytes) = answer_of(r).await?;
    let full = String::from_utf8_lossy(&bytes).into_owned();
    let transcript = v["text"].as_str().map_or_else(|| full.clone(), str::to_string);
    Ok(mcp::tool_result(vec![mcp::text(transcript.trim()), mcp::text(full)], false))
}

/// The audio a transcription names: a file on this machine, or base64 bytes.
fn audio(rt: &AppState, args: &Map<String, Value>) -> Result<(String, Bytes), ToolError> {
    if let Some(p) = mcp::string_arg(args, "audio_path", false)? {
        let len = std::fs::metadata(p).map_err(|e| format!("audio_path '{p}': {e}"))?.len();
        if len > rt.http.body_limit as u64 {
            return Err(format!("audio_path '{p}' is larger than the {} byte limit", rt.http.body_limit).into());
        }
        let data = std::fs::read(p).map_err(|e| format!("audio_path '{p}': {e}"))?;
        let name = Path::new(p).file_name().map_or("audio".into(), |n| n.to_string_lossy().into_owned());
        return Ok((name, Bytes::from(data)));
    }
    let b64 = mcp::string_arg(args, "audio_base64", false)?.ok_or("'audio_path' or 'audio_base64' is required")?;
    let data = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("'audio_base64': {e}"))?;
    Ok(("audio".into(), Bytes::from(data)))
}

async fn generate_image(rt: &AppState, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let images = images_of(rt, args).await?;
    let b64 = |i: &Vec<u8>| base64::engine::general_purpose::STANDARD.encode(i);
    let Some(paths) = image_paths(rt, args, images.len())? else {
        let blocks = images.iter().map(|i| json!({"type": "image", "data": b64(i), "mimeType": "image/png"})).collect();
        return Ok(mcp::tool_result(blocks, false));
    };
    let mut blocks = Vec::new();
    for (img, p) in images.iter().zip(&paths) {
        std::fs::write(p, img).map_err(|e| format!("{}: {e}", p.display()))?;
        blocks.push(mcp::text(p.display().to_string()));
    }
    blocks.push(mcp::text(json!({"paths": paths}).to_string()));
    Ok(mcp::tool_result(blocks, false))
}

/// The PNGs `images/generations` makes for the tool's arguments.
async fn images_of(rt: &AppState, args: &Map<String, Value>) -> Result<Vec<Vec<u8>>, ToolError> {
    let mut req = json!({"model": mcp::string_arg(args, "model", true)?, "prompt": mcp::string_arg(args, "prompt", true)?,
                         "response_format": "b64_json"});
    for k in ["size", "n", "steps"] {
        if let Some(v) = args.get(k).filter(|v| !v.is_null()) {
            req[k] = v.clone();
        }
    }
    let value: ImageGenerationRequest = serde_json::from_value(req.clone()).map_err(|e| e.to_string())?;
    let r = crate::api::images::generations(State(rt.clone()), JsonBody { value, raw: Bytes::from(req.to_string()) });
    let (v, _) = answer_of(r.await).await?;
    let images: Vec<Vec<u8>> = v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| base64::engine::general_purpose::STANDARD.decode(d["b64_json"].as_str()?).ok())
        .collect();
    if images.is_empty() {
        return Err("the image model answered no image".into());
    }
    Ok(images)
}

/// The MCP image folder: `LEMONADE_MCP_IMAGE_DIR`, else `<cache>/mcp-images`.
fn image_root(rt: &AppState) -> PathBuf {
    std::env::var_os("LEMONADE_MCP_IMAGE_DIR").map(PathBuf::from).unwrap_or_else(|| rt.cfg.cache_dir.join("mcp-images"))
}

/// `rel` (relative, or absolute inside `root`) as a path inside `root`; `..` and the like refused.
fn inside(root: &Path, rel: &str) -> Result<PathBuf, ToolError> {
    let p = Path::new(rel);
    let rel = p.strip_prefix(root).unwrap_or(p);
    let ok = rel.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    ok.then(|| root.join(rel))
        .ok_or_else(|| format!("'{}' is outside the MCP image folder {}", p.display(), root.display()).into())
}

/// Where images go: `output_path` (one image) or `output_dir` (unique names), both inside the
/// MCP image folder (a link out of it is refused); None: inline.
fn image_paths(rt: &AppState, args: &Map<String, Value>, n: usize) -> Result<Option<Vec<PathBuf>>, ToolError> {
    let (path, dir) = (mcp::string_arg(args, "output_path", false)?, mcp::string_arg(args, "output_dir", false)?);
    let root = image_root(rt);
    match (path, dir) {
        (Some(p), _) if n == 1 => checked(rt, vec![inside(&root, p)?]).map(Some),
        (Some(_), _) => Err("output_path takes one image; use output_dir for several".into()),
        (None, Some(d)) => out_dir(rt, d, "image", &vec!["png"; n]).map(Some),
        (None, None) => Ok(None),
    }
}

/// Unique names `<prefix>_<token>_<i>.<ext>` in folder `dir` of the MCP image folder.
fn out_dir(rt: &AppState, dir: &str, prefix: &str, exts: &[&str]) -> Result<Vec<PathBuf>, ToolError> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let token = format!("{:x}", since.as_nanos());
    let d = inside(&image_root(rt), dir)?;
    checked(rt, exts.iter().enumerate().map(|(i, e)| d.join(format!("{prefix}_{token}_{i}.{e}"))).collect())
}

/// `paths` with their folders made, each refused if a link takes it out of the MCP image folder.
fn checked(rt: &AppState, paths: Vec<PathBuf>) -> Result<Vec<PathBuf>, ToolError> {
    let root = image_root(rt);
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let real_root = root.canonicalize().map_err(|e| e.to_string())?;
    for p in &paths {
        let dir = p.parent().unwrap_or(&root);
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !dir.canonicalize().map_err(|e| e.to_string())?.starts_with(&real_root) {
            return Err(format!("'{}' leaves the MCP image folder through a link", p.display()).into());
        }
    }
    Ok(paths)
}

/// `lemonade_omni`: one turn with an omni collection; its text, then each medium it made
/// (inline blocks, or files under `output_dir` with their paths).
async fn omni(rt: &AppState, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let model = match mcp::string_arg(args, "model", false)? {
        Some(m) => m.to_string(),
        None => engine::router::listed(rt, false)
            .into_iter()
            .find(|m| m.tool_format.is_some())
            .map(|m| m.id)
            .ok_or("no omni model (collection.omni) is here: pull one, or pass model (see lemonade_list_models)")?,
    };
    if rt.catalogue.registry().collection(&model).and_then(|c| c.omni()).is_none() {
        return Err(
            format!("'{model}' is not an omni model (collection.omni): use lemonade_chat for a plain LLM").into()
        );
    }
    let mut with_model = args.clone();
    with_model.insert("model".into(), Value::from(model));
    let body = mcp::chat_request(&with_model)?;
    let value: ChatCompletionRequest = serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
    let r =
        crate::api::openai::chat_completions(State(rt.clone()), JsonBody { value, raw: Bytes::from(body.to_string()) });
    let answer = answer_of(r.await).await?.0;
    let message = &answer["choices"][0]["message"];
    let (text, media) = routing::omni::split_media(message["content"].as_str().unwrap_or_default());
    let mut blocks = vec![mcp::text(text)];
    blocks.extend(media_blocks(rt, args, &media)?);
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        blocks.push(mcp::text(format!("tool_calls: {}", Value::Array(calls.clone()))));
    }
    Ok(mcp::tool_result(blocks, false))
}

/// The media as MCP `image`/`audio` blocks, or written under `output_dir` (a text block per
/// file with its path, then the `paths` as JSON).
fn media_blocks(
    rt: &AppState,
    args: &Map<String, Value>,
    media: &[routing::omni::Medium],
) -> Result<Vec<Value>, ToolError> {
    let kind = |m: &routing::omni::Medium| if m.mime.starts_with("image/") { "image" } else { "audio" };
    let Some(dir) = mcp::string_arg(args, "output_dir", false)? else {
        return Ok(media.iter().map(|m| json!({"type": kind(m), "data": m.base64, "mimeType": m.mime})).collect());
    };
    let exts: Vec<&str> = media.iter().map(|m| m.mime.rsplit('/').next().unwrap_or("bin")).collect();
    let paths = out_dir(rt, dir, "omni", &exts)?;
    let mut blocks = Vec::new();
    for (m, p) in media.iter().zip(&paths) {
        let data = base64::engine::general_purpose::STANDARD.decode(&m.base64).map_err(|e| e.to_string())?;
        std::fs::write(p, data).map_err(|e| format!("{}: {e}", p.display()))?;
        blocks.push(mcp::text(p.display().to_string()));
    }
    blocks.push(mcp::text(json!({"paths": paths}).to_string()));
    Ok(blocks)
}
