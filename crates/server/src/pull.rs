//! `pull` and `delete`: download models from the Hub into the huggingface_hub cache (with
//! `user.*` registration), and remove them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use api_types::*;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http::{header, HeaderValue};
use registry::hub::{Download, Hub, HubError};
use registry::{CatalogueEntry, Checkpoint, LookupError, ModelInfo, USER_PREFIX};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::AppState;

/// Progress events per file are sent at most this often (plus the first and the last).
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

fn hub() -> Hub {
    Hub::from_env()
}

/// Validates the request and registers a new `user.*` model; returns the model to download.
fn resolve(rt: &AppState, req: &PullRequest) -> Result<ModelInfo, ApiError> {
    let name = req.model.clone().or_else(|| req.model_name.clone()).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| ApiError::bad_request("Missing required field 'model'", Some("model")))?;
    let checkpoint = req
        .checkpoints
        .as_ref()
        .and_then(|c| c.get("main").cloned())
        .or_else(|| req.checkpoint.clone())
        .filter(|c| !c.is_empty());
    let recipe = req.recipe.clone().filter(|r| !r.is_empty());
    if req.checkpoints.as_ref().is_some_and(|c| !c.contains_key("main")) {
        return Err(ApiError::bad_request(
            "If present, the `checkpoints` property must be an object and must contain `main`",
            Some("checkpoints"),
        ));
    }
    let is_user = name.starts_with(USER_PREFIX);
    if (checkpoint.is_some() || recipe.is_some()) && !is_user {
        return Err(ApiError::bad_request(
            format!("When providing 'checkpoint' or 'recipe', the model name must include the `user.` prefix, for example `user.Phi-4-Mini-GGUF`. Received: {name}"),
            Some("model"),
        ));
    }
    let reg = rt.registry();
    let known = reg.get(&name);
    if let (Ok(m), None) = (&known, &checkpoint) {
        return Ok((*m).clone());
    }
    if let Err(e @ LookupError::NotSupported { .. }) = &known {
        return Err(e.clone().into());
    }
    if !is_user {
        return Err(ApiError::BadRequest {
            message: format!("Model '{name}' was not found. To register a new model, the name must include the `user.` namespace, for example `user.Phi-4-Mini-GGUF`, and the request must give `checkpoint` and `recipe`."),
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    let invalid = |message: String, param: &str| ApiError::BadRequest {
        message,
        param: Some(param.into()),
        code: Some("invalid_request"),
    };
    registry::validate_user_name(&name).map_err(|m| invalid(m, "model"))?;
    for c in checkpoint.iter().chain(req.checkpoints.iter().flat_map(|m| m.values())) {
        registry::checkpoint::validate(c).map_err(|m| invalid(m, "checkpoint"))?;
    }
    if let Some(mm) = &req.mmproj {
        if mm.chars().any(char::is_control)
            || mm.contains('\\')
            || mm.split('/').any(|s| s == "..")
            || mm.starts_with('/')
        {
            return Err(invalid(format!("Invalid mmproj file name '{}'", mm.escape_debug()), "mmproj"));
        }
    }
    let (Some(checkpoint), Some(recipe)) = (checkpoint, recipe) else {
        return Err(ApiError::bad_request(
            format!("Model {name} is not registered with lemonade. To register and install it, provide the `checkpoint` and `recipe` arguments, as well as the optional `reasoning` and `mmproj` arguments as appropriate."),
            Some("checkpoint"),
        ));
    };
    if recipe == "llamacpp" && checkpoint.to_ascii_lowercase().contains("gguf") && !checkpoint.contains(':') {
        return Err(ApiError::bad_request(
            format!("You are required to provide a 'variant' in the checkpoint field when registering a GGUF model, for example `{checkpoint}:Q4_K_M`."),
            Some("checkpoint"),
        ));
    }
    let flag = |f: Option<bool>| f.unwrap_or(false);
    let entry = CatalogueEntry {
        checkpoint: checkpoint.clone(),
        checkpoints: req.checkpoints.clone().unwrap_or_default(),
        mmproj: req.mmproj.clone(),
        recipe: recipe.clone(),
        suggested: Some(true),
        labels: registry::registration_labels(
            req.labels.as_deref().unwrap_or(&[]),
            flag(req.reasoning),
            flag(req.vision),
            flag(req.embedding),
            flag(req.reranking),
            &recipe,
        ),
        ..Default::default()
    };
    // Registered before the download, so a failed download can be resumed by name.
    registry::save_user_model(&rt.cfg.cache_dir, &name[USER_PREFIX.len()..], Some(&entry))
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    rt.reload_registry().map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(rt.registry().get(&name)?.clone())
}

fn hub_error(e: HubError) -> ApiError {
    match e {
        HubError::Status { status: 404, .. } => ApiError::BadRequest {
            message: e.to_string(),
            param: Some("checkpoint".into()),
            code: Some("checkpoint_not_found"),
        },
        HubError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            ApiError::InsufficientStorage(format!(
                "Download failed: {e}. Free some space and pull again: the partial download is kept and resumes"
            ))
        }
        e => ApiError::BackendUnavailable(format!("Download failed: {e}")),
    }
}

/// Downloads `m` unless it is downloaded (inference and `/load` on a registered model that is
/// not downloaded pull it first, as v9), waiting at most `cfg.pull_timeout`. Returns the
/// model as the refreshed catalogue sees it.
pub async fn ensure_downloaded(rt: &AppState, m: &ModelInfo) -> Result<ModelInfo, ApiError> {
    if m.downloaded {
        return Ok(m.clone());
    }
    tracing::info!(model = %m.name, checkpoint = %m.checkpoint, "model not downloaded: pulling it before loading");
    let t = Instant::now();
    tokio::time::timeout(rt.cfg.pull_timeout, download(rt, m, None)).await.map_err(|_| {
        ApiError::BackendUnavailable(format!(
            "Pulling '{}' took longer than {} s; the partial download is kept",
            m.name,
            rt.cfg.pull_timeout.as_secs()
        ))
    })??;
    rt.reload_registry().map_err(|e| ApiError::Internal(e.to_string()))?;
    tracing::info!(model = %m.name, secs = t.elapsed().as_secs_f64(), "pulled");
    let pulled = rt.registry().get(&m.name)?.clone();
    if !pulled.downloaded {
        return Err(ApiError::not_downloaded(&m.name));
    }
    Ok(pulled)
}

/// Lists, plans and downloads every file of `m`, reporting progress to `events` (None: no
/// progress). A closed channel cancels the download. One download per repository at a time:
/// a concurrent pull of the same model waits, then finds the verified files and fetches none.
async fn download(
    rt: &AppState,
    m: &ModelInfo,
    events: Option<&mpsc::Sender<(&'static str, String)>>,
) -> Result<(), ApiError> {
    let hub = hub();
    let main = Checkpoint::parse(&m.checkpoint);
    let lock = rt.lock(&format!("repo:{}", main.repo));
    let _guard = lock.lock().await;
    let mut repos: Vec<String> = m.checkpoints.values().map(|c| Checkpoint::parse(c).repo).collect();
    repos.sort();
    repos.dedup();
    let mut listings = BTreeMap::new();
    let mut commits = BTreeMap::new();
    for r in &repos {
        let (commit, files) = hub.list(r, "main").await.map_err(hub_error)?;
        commits.insert(r.clone(), commit);
        listings.insert(r.clone(), files);
    }
    let planned = registry::plan::plan(&m.checkpoints, &listings).map_err(|e| ApiError::BadRequest {
        message: e.to_string(),
        param: Some("checkpoint".into()),
        code: Some("invalid_checkpoint"),
    })?;
    let total = planned.len();
    for (i, p) in planned.iter().enumerate() {
        let file = listings[&p.repo].iter().find(|f| f.path == p.path).expect("planned from the listing");
        let job = Download { repo: &p.repo, commit: &commits[&p.repo], file, dest_repo: &main.repo, dest: &p.dest };
        let mut report = events.map(|tx| progress_events(tx.clone(), p.dest.clone(), i + 1, total));
        let mut progress = |done: u64, size: Option<u64>| report.as_mut().is_none_or(|r| r(done, size));
        progress(0, file.size);
        hub.download(&rt.cfg.hf_cache, &job, &mut progress).await.map_err(hub_error)?;
    }
    if let Some(tx) = events {
        let done = PullProgress {
            file: String::new(),
            file_index: total,
            total_files: total,
            bytes_downloaded: 0,
            bytes_total: 0,
            percent: 100,
        };
        let _ = tx.send(("complete", serde_json::to_string(&done).unwrap_or_default())).await;
    }
    Ok(())
}

/// Downloads a model (registering a `user.*` model first when `checkpoint` and `recipe` are given).
#[utoipa::path(post, path = "/api/v1/pull", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Files go to the Hugging Face cache in huggingface_hub's layout; a \
                   partial download resumes. With `stream: true` the answer is SSE: `event: progress` (PullProgress), \
                   one `event: complete`, or `event: error` with `{\"error\": message}`. A client that disconnects \
                   cancels the download (the partial file stays for a later pull).",
    request_body = PullRequest,
    responses(
        (status = 200, description = "Downloaded (or SSE events)", body = StatusResponse),
        (status = 400, description = "Invalid name, checkpoint or variant", body = ErrorResponse),
        (status = 404, description = "Not available on this system", body = ErrorResponse),
        (status = 502, description = "The download failed", body = ErrorResponse),
        (status = 507, description = "The disk is full (the partial download is kept)", body = ErrorResponse),
    ))]
pub async fn pull(State(rt): State<AppState>, body: JsonBody<PullRequest>) -> Result<Response, ApiError> {
    let req = body.value;
    let m = resolve(&rt, &req)?;
    if req.do_not_upgrade == Some(true) && m.downloaded {
        return Ok(
            Json(StatusResponse { status: "success".into(), model_name: Some(m.name), message: None }).into_response()
        );
    }
    if req.stream != Some(true) {
        download(&rt, &m, None).await?;
        rt.reload_registry().map_err(|e| ApiError::Internal(e.to_string()))?;
        return Ok(
            Json(StatusResponse { status: "success".into(), model_name: Some(m.name), message: None }).into_response()
        );
    }
    let (tx, rx) = mpsc::channel::<(&'static str, String)>(64);
    let response = sse_events(&rt, rx);
    tokio::spawn(async move {
        let result = download(&rt, &m, Some(&tx)).await;
        let _ = rt.reload_registry();
        if let Err(e) = result {
            let _ = tx.send(("error", serde_json::json!({"error": e.to_string()}).to_string())).await;
        }
    });
    Ok(response)
}

/// `progress` events for one file of `total` (number `index`) into `tx`, at most every
/// [`PROGRESS_EVERY`] (plus the last); returns false, cancelling the download, once the client
/// is gone.
pub(crate) fn progress_events(
    tx: mpsc::Sender<(&'static str, String)>,
    file: String,
    index: usize,
    total: usize,
) -> impl FnMut(u64, Option<u64>) -> bool + Send {
    let mut last = None::<Instant>;
    move |done, size| {
        if tx.is_closed() {
            return false;
        }
        let finished = size.is_some_and(|s| done >= s);
        if last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) && !finished {
            return true;
        }
        last = Some(Instant::now());
        let bytes_total = size.unwrap_or(0);
        let ev = PullProgress {
            file: file.clone(),
            file_index: index,
            total_files: total,
            bytes_downloaded: done,
            bytes_total,
            percent: (done * 100).checked_div(bytes_total).unwrap_or(0),
        };
        tx.try_send(("progress", serde_json::to_string(&ev).unwrap_or_default())).is_ok() || !tx.is_closed()
    }
}

/// An SSE response of `(event, data)` pairs, ending when every sender is gone.
pub(crate) fn sse_events(rt: &AppState, mut rx: mpsc::Receiver<(&'static str, String)>) -> Response {
    let body = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| {
            o.map(|(event, data)| Ok::<_, Infallible>(Bytes::from(format!("event: {event}\ndata: {data}\n\n"))))
        })
    });
    sse_response(rt, body)
}

/// `body` as an SSE response (no caching, no proxy buffering) that also ends when the server
/// shuts down, so an open stream does not hold the shutdown up.
pub(crate) fn sse_response(
    rt: &AppState,
    body: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    use futures_util::StreamExt;
    let mut r = Response::new(Body::from_stream(body.take_until(rt.closed())));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// Removes a model's files (and a `user.*` registration), unloading it first.
#[utoipa::path(post, path = "/api/v1/delete", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Removes the model's whole `models--org--repo` folder from the \
                   Hugging Face cache (every variant of that repository), and a `user.*` model's registration.",
    request_body = DeleteRequest,
    responses(
        (status = 200, description = "Deleted", body = StatusResponse),
        (status = 400, description = "No name, or an extra.* model (files in the extra models dir are not deleted)", body = ErrorResponse),
        (status = 422, description = "Unknown model", body = ErrorResponse),
    ))]
pub async fn delete(
    State(rt): State<AppState>,
    body: JsonBody<DeleteRequest>,
) -> Result<Json<StatusResponse>, ApiError> {
    let name = body.value.model.or(body.value.model_name).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| ApiError::bad_request("Missing required field 'model'", Some("model")))?;
    let m = rt.registry().get(&name).map_err(|_| ApiError::Unprocessable(format!("Model not found: {name}")))?.clone();
    if m.source == registry::Source::ExtraModelsDir {
        return Err(ApiError::bad_request(
            format!("Cannot delete extra models via the API; remove {} instead", m.checkpoint),
            Some("model"),
        ));
    }
    let _ = rt.unload(Some(&name)).await;
    let repo = Checkpoint::parse(&m.checkpoint).repo;
    let dir = rt.cfg.hf_cache.join(registry::checkpoint::repo_folder_name(&repo));
    match tokio::fs::remove_dir_all(&dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ApiError::Internal(format!("cannot remove {}: {e}", dir.display()))),
    }
    if let Some(key) = name.strip_prefix(USER_PREFIX) {
        registry::save_user_model(&rt.cfg.cache_dir, key, None).map_err(|e| ApiError::Internal(e.to_string()))?;
    }
    rt.reload_registry().map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(StatusResponse {
        status: "success".into(),
        model_name: None,
        message: Some(format!("Deleted model: {name}")),
    }))
}
