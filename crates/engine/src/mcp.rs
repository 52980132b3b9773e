//! Lemonade v11's MCP gateway's tools (the protocol is `dialects::mcp`'s, its route the
//! server's): each runs as the same request to lemonade would (variants, router and omni
//! collections, loading on demand), through [`crate::call`], [`crate::tools`] and
//! [`crate::omni::run`]. Files are read and written off the async threads. A failing tool
//! answers `isError: true`.

use std::path::{Path, PathBuf};

use api_types::{ModelType, SdParameters};
use base64::Engine as _;
use dialects::mcp::{self, ToolError};
use routing::omni::Medium;
use serde_json::{json, Map, Value};

use crate::call::{call, Payload};
use crate::lease::{Endpoint, Forwarded, LeaseRequest};
use crate::router::Resolved;
use crate::tools::{self, B64};
use crate::Engine;

/// Runs tool `name` with `args`; None when there is no such tool. `body_limit`: the largest
/// audio file a transcription reads (the server's body limit).
pub async fn tool(rt: &Engine, name: &str, args: &Map<String, Value>, body_limit: u64) -> Option<Value> {
    let r = match name {
        "lemonade_list_models" => Ok(list_models(rt, args)),
        "lemonade_chat" => chat(rt, args).await,
        "lemonade_transcribe_audio" => transcribe(rt, args, body_limit).await,
        "lemonade_generate_image" => generate_image(rt, args).await,
        "lemonade_omni" => omni(rt, args).await,
        _ => return None,
    };
    Some(r.unwrap_or_else(|e| mcp::tool_error(e.0)))
}

fn failed(f: routing::omni::Failure) -> ToolError {
    ToolError(f.0)
}

fn list_models(rt: &Engine, args: &Map<String, Value>) -> Value {
    let flag = |k: &str| args.get(k).and_then(Value::as_bool).unwrap_or(true);
    let reg = rt.catalogue.registry();
    let loaded: Vec<String> =
        rt.lifecycle.loaded().iter().map(|(r, _)| crate::models::listed_name(rt, &r.info.name)).collect();
    let listed = reg.listed(false, rt.cfg.live.v9_names());
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

/// A chat completion for `body`, as chat/completions answers it: the model, a router
/// collection's candidate, or an omni collection's loop (its message, the media embedded).
async fn completion(rt: &Engine, body: Value) -> Result<Value, ToolError> {
    let model = body["model"].as_str().unwrap_or_default().to_string();
    match crate::router::resolve_value(rt, &model, Endpoint::ChatCompletions, body).await {
        Resolved::Model { model, body, .. } => {
            let req = LeaseRequest::new(model, Endpoint::ChatCompletions);
            let answer = call(rt, req, Payload::Json(body)).await.map_err(|e| ToolError(e.told()))?;
            answer.json().map_err(|e| ToolError(e.to_string()))
        }
        Resolved::Omni { collection, omni, body } => {
            let ran = crate::omni::run(rt, &collection, &omni, body, Forwarded::default(), None).await;
            let (l, end) = ran.map_err(|e| ToolError(e.told()))?;
            Ok(json!({"choices": [{"message": l.message(&end, true).0}]}))
        }
    }
}

async fn chat(rt: &Engine, args: &Map<String, Value>) -> Result<Value, ToolError> {
    Ok(mcp::chat_result(&completion(rt, mcp::chat_request(args)?).await?))
}

async fn transcribe(rt: &Engine, args: &Map<String, Value>, body_limit: u64) -> Result<Value, ToolError> {
    let model = mcp::string_arg(args, "model", true)?.unwrap_or_default();
    let (file_name, data) = audio(args, body_limit).await?;
    let language = mcp::string_arg(args, "language", false)?;
    let format = mcp::string_arg(args, "response_format", false)?;
    let h = tools::Hearing { file_name, data, language, format };
    let answer = tools::transcribe(rt, model, h, &Forwarded::default()).await.map_err(failed)?;
    let full = String::from_utf8_lossy(&answer.body).into_owned();
    let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    let transcript = v["text"].as_str().map_or_else(|| full.clone(), str::to_string);
    Ok(mcp::tool_result(vec![mcp::text(transcript.trim()), mcp::text(full)], false))
}

/// The audio a transcription names: a file on this machine (read off the async threads), or
/// base64 bytes.
async fn audio(args: &Map<String, Value>, body_limit: u64) -> Result<(String, Vec<u8>), ToolError> {
    if let Some(p) = mcp::string_arg(args, "audio_path", false)? {
        let path = PathBuf::from(p);
        let read = move || -> std::io::Result<Option<Vec<u8>>> {
            if std::fs::metadata(&path)?.len() > body_limit {
                return Ok(None);
            }
            std::fs::read(&path).map(Some)
        };
        let data = host::offload::offload(read)
            .await
            .map_err(|e| ToolError(e.to_string()))?
            .map_err(|e| format!("audio_path '{p}': {e}"))?
            .ok_or_else(|| format!("audio_path '{p}' is larger than the {body_limit} byte limit"))?;
        let name = Path::new(p).file_name().map_or("audio".into(), |n| n.to_string_lossy().into_owned());
        return Ok((name, data));
    }
    let b64 = mcp::string_arg(args, "audio_base64", false)?.ok_or("'audio_path' or 'audio_base64' is required")?;
    Ok(("audio".into(), B64.decode(b64).map_err(|e| format!("'audio_base64': {e}"))?))
}

async fn generate_image(rt: &Engine, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let model = mcp::string_arg(args, "model", true)?.unwrap_or_default();
    let prompt = mcp::string_arg(args, "prompt", true)?.unwrap_or_default();
    let number = |k: &str| args.get(k).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
    // Where they go is checked before anything is drawn.
    let paths = image_paths(rt, args, number("n").unwrap_or(1) as usize).await?;
    let sd = SdParameters { steps: number("steps"), ..Default::default() };
    let d = tools::Drawing { prompt, n: number("n"), size: mcp::string_arg(args, "size", false)?, sd };
    let images = tools::draw(rt, model, &d, &Forwarded::default()).await.map_err(failed)?;
    let Some(paths) = paths else {
        let blocks = images.iter().map(|i| json!({"type": "image", "data": i, "mimeType": "image/png"})).collect();
        return Ok(mcp::tool_result(blocks, false));
    };
    let media: Vec<Medium> = images.into_iter().map(|base64| Medium { mime: "image/png".into(), base64 }).collect();
    Ok(mcp::tool_result(written(&media, paths).await?, false))
}

/// The MCP image folder: `LEMONADE_MCP_IMAGE_DIR`, else `<cache>/mcp-images`.
fn image_root(rt: &Engine) -> PathBuf {
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

/// Where `n` images go: `output_path` (one image) or `output_dir` (unique names), both inside
/// the MCP image folder (a link out of it is refused); None: inline.
async fn image_paths(rt: &Engine, args: &Map<String, Value>, n: usize) -> Result<Option<Vec<PathBuf>>, ToolError> {
    let (path, dir) = (mcp::string_arg(args, "output_path", false)?, mcp::string_arg(args, "output_dir", false)?);
    let root = image_root(rt);
    match (path, dir) {
        (Some(p), _) if n == 1 => checked(root.clone(), vec![inside(&root, p)?]).await.map(Some),
        (Some(_), _) => Err("output_path takes one image; use output_dir for several".into()),
        (None, Some(d)) => out_dir(rt, d, "image", &vec!["png"; n]).await.map(Some),
        (None, None) => Ok(None),
    }
}

/// Unique names `<prefix>_<token>_<i>.<ext>` in folder `dir` of the MCP image folder.
async fn out_dir(rt: &Engine, dir: &str, prefix: &str, exts: &[&str]) -> Result<Vec<PathBuf>, ToolError> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let token = format!("{:x}", since.as_nanos());
    let root = image_root(rt);
    let d = inside(&root, dir)?;
    checked(root, exts.iter().enumerate().map(|(i, e)| d.join(format!("{prefix}_{token}_{i}.{e}"))).collect()).await
}

/// `paths` with their folders made, each refused if a link takes it out of `root` (off the
/// async threads).
async fn checked(root: PathBuf, paths: Vec<PathBuf>) -> Result<Vec<PathBuf>, ToolError> {
    let work = move || -> Result<Vec<PathBuf>, ToolError> {
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
    };
    host::offload::offload(work).await.map_err(|e| ToolError(e.to_string()))?
}

/// `media` written to `paths`: a text block per file with its path, then the `paths` as JSON.
async fn written(media: &[Medium], paths: Vec<PathBuf>) -> Result<Vec<Value>, ToolError> {
    let mut blocks = Vec::new();
    for (m, p) in media.iter().zip(&paths) {
        let data = B64.decode(&m.base64).map_err(|e| e.to_string())?;
        let to = p.clone();
        host::offload::offload(move || std::fs::write(to, data))
            .await
            .map_err(|e| ToolError(e.to_string()))?
            .map_err(|e| format!("{}: {e}", p.display()))?;
        blocks.push(mcp::text(p.display().to_string()));
    }
    blocks.push(mcp::text(json!({"paths": paths}).to_string()));
    Ok(blocks)
}

/// `lemonade_omni`: one turn with an omni collection; its text, then each medium it made
/// (inline blocks, or files under `output_dir` with their paths).
async fn omni(rt: &Engine, args: &Map<String, Value>) -> Result<Value, ToolError> {
    let model = match mcp::string_arg(args, "model", false)? {
        Some(m) => m.to_string(),
        None => crate::router::listed(rt, false)
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
    let answer = completion(rt, mcp::chat_request(&with_model)?).await?;
    let message = &answer["choices"][0]["message"];
    let (text, media) = routing::omni::split_media(message["content"].as_str().unwrap_or_default());
    let mut blocks = vec![mcp::text(text)];
    blocks.extend(media_blocks(rt, args, &media).await?);
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        blocks.push(mcp::text(format!("tool_calls: {}", Value::Array(calls.clone()))));
    }
    Ok(mcp::tool_result(blocks, false))
}

/// The media as MCP `image`/`audio` blocks, or written under `output_dir`.
async fn media_blocks(rt: &Engine, args: &Map<String, Value>, media: &[Medium]) -> Result<Vec<Value>, ToolError> {
    let kind = |m: &Medium| if m.mime.starts_with("image/") { "image" } else { "audio" };
    let Some(dir) = mcp::string_arg(args, "output_dir", false)? else {
        return Ok(media.iter().map(|m| json!({"type": kind(m), "data": m.base64, "mimeType": m.mime})).collect());
    };
    let exts: Vec<&str> = media.iter().map(|m| m.mime.rsplit('/').next().unwrap_or("bin")).collect();
    let paths = out_dir(rt, dir, "omni", &exts).await?;
    written(media, paths).await
}
