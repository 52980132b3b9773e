//! Pulling models: resolve a pull request (registering a `user.*` model), download a model's
//! files from the Hub into the huggingface_hub cache with progress, and make sure a model is
//! downloaded before it loads.

use std::collections::BTreeMap;
use std::time::Instant;

use api_types::*;
use host::hub::{Download, Hub, HubError};
use registry::{CatalogueEntry, Checkpoint, LookupError, ModelInfo, USER_PREFIX};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::runtime::Lease;
use crate::state::AppState;

fn hub() -> Hub {
    Hub::from_env()
}

/// Validates the request and registers a new `user.*` model; returns the model to download.
pub fn resolve(rt: &AppState, req: &PullRequest) -> Result<ModelInfo, ApiError> {
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
    registry::validate_user_name(&name).map_err(|e| invalid(e.to_string(), "model"))?;
    for c in checkpoint.iter().chain(req.checkpoints.iter().flat_map(|m| m.values())) {
        registry::checkpoint::validate(c).map_err(|e| invalid(e.to_string(), "checkpoint"))?;
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
            backends::Recipe::parse(&recipe),
        ),
        ..Default::default()
    };
    // Registered before the download, so a failed download can be resumed by name.
    host::files::save_user_model(&rt.cfg.cache_dir, &name[USER_PREFIX.len()..], Some(&entry))?;
    rt.reload_registry()?;
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
    rt.reload_registry()?;
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
/// Returns how many files the model has.
pub async fn download(
    rt: &AppState,
    m: &ModelInfo,
    events: Option<&mpsc::Sender<(&'static str, String)>>,
) -> Result<usize, ApiError> {
    let received = rt.metrics.pull_counter(&m.name);
    let hub = hub().on_received(move |n| {
        received.inc_by(n);
    });
    let main = Checkpoint::parse(&m.checkpoint);
    let lock = rt.locks.get(&format!("repo:{}", main.repo));
    let _guard = lock.lock().await;
    let repos = registry::plan::repos(&m.checkpoints);
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
        let mut report = events.map(|tx| crate::sse::progress_events(tx.clone(), p.dest.clone(), i + 1, total));
        let mut progress = |done: u64, size: Option<u64>| report.as_mut().is_none_or(|r| r(done, size));
        progress(0, file.size);
        hub.download(&rt.cfg.hf_cache, &job, &mut progress).await.map_err(hub_error)?;
    }
    Ok(total)
}

/// [`download`] then the registry reloaded, so the model counts as downloaded.
pub async fn pull_now(rt: &AppState, m: &ModelInfo) -> Result<(), ApiError> {
    download(rt, m, None).await?;
    Ok(rt.reload_registry()?)
}

/// [`download`] in its own task, its progress (then `complete`, or an `error` event with
/// `{"error": message}`) on the returned channel; dropping the receiver cancels it.
/// `complete` is sent once the registry was reloaded, so a client that lists the models on
/// `complete` sees the model downloaded.
pub fn pull_in_background(rt: &AppState, m: ModelInfo) -> mpsc::Receiver<(&'static str, String)> {
    let (tx, rx) = mpsc::channel(64);
    let rt = rt.clone();
    tokio::spawn(async move {
        let result = download(&rt, &m, Some(&tx)).await;
        let reloaded = rt.reload_registry();
        match (result, reloaded) {
            (Ok(total), Ok(())) => crate::sse::finish(&tx, "", total, total, Ok(0)).await,
            (Err(e), _) => crate::sse::finish(&tx, "", 0, 0, Err(e.to_string())).await,
            (Ok(_), Err(e)) => crate::sse::finish(&tx, "", 0, 0, Err(ApiError::from(e).to_string())).await,
        }
    });
    rx
}

/// A lease on `name` for `endpoint` (which serves the model types `want`): the model is pulled
/// first when it is registered but not downloaded and auto-load is on, then loaded if needed.
pub async fn lease(rt: &AppState, name: &str, want: &[ModelType], endpoint: &str) -> Result<Lease, ApiError> {
    lease_keeping(rt, name, want, endpoint, None).await
}

/// [`lease`], setting the model's idle timeout (ms; 0 = never) when `keep_alive` is given.
pub async fn lease_keeping(
    rt: &AppState,
    name: &str,
    want: &[ModelType],
    endpoint: &str,
    keep_alive: Option<u64>,
) -> Result<Lease, ApiError> {
    // `<provider>.<id>` of a registered remote provider, unless a local model has that name.
    // Text endpoints are forwarded whatever the listed type (the upstream knows what its model
    // serves); audio and image requests are shaped for lemonade's own backends, not forwarded.
    if rt.registry().get(name).is_err() {
        if let Some(route) = rt.remotes.route(name).await? {
            let text = [ModelType::Llm, ModelType::Embedding, ModelType::Reranking];
            if !want.iter().any(|t| text.contains(t)) {
                return Err(ApiError::WrongModelType(format!(
                    "Model '{name}' is on remote provider '{}'; {endpoint} is not forwarded to remote providers (chat, completions, responses, embeddings, reranking and the llama.cpp endpoints are).",
                    route.provider.name
                )));
            }
            return Ok(Lease::remote(rt, route));
        }
    }
    let info = rt.model_for(name, want, endpoint)?;
    let info = match (info.downloaded, rt.cfg.auto_load) {
        (true, _) => info,
        (false, true) => ensure_downloaded(rt, &info).await?,
        (false, false) => return Err(ApiError::not_downloaded(name)),
    };
    rt.acquire(&info, keep_alive).await
}

/// `--preload`: loads each model in the background, pulling it first when needed, one after
/// another in the order given. Failures are logged; the server serves meanwhile.
pub fn preload(rt: &AppState) {
    let names = rt.cfg.preload.clone();
    if names.is_empty() {
        return;
    }
    rt.set_preloading(&names);
    let rt = rt.clone();
    tokio::spawn(async move {
        for name in names {
            let result = async {
                let info = rt.registry().get(&name)?.clone();
                let info = ensure_downloaded(&rt, &info).await?;
                let options = rt.effective_options(&info, &api_types::RecipeOptions::new());
                ApiError::from_load(&name, rt.load(&info, options, None, None).await)
            }
            .await;
            rt.done_preloading(&name);
            match result {
                Ok(()) => tracing::info!(model = %name, "preloaded"),
                Err(e) => tracing::error!(model = %name, error = %e, "preload failed"),
            }
        }
    });
}

/// Unloads `m`, removes its repository from the Hugging Face cache and a `user.*` model's
/// registration. Models of the extra models dir are not deleted (400).
pub async fn delete(rt: &AppState, m: &ModelInfo) -> Result<(), ApiError> {
    if m.source == registry::Source::ExtraModelsDir {
        return Err(ApiError::bad_request(
            format!("Cannot delete extra models via the API; remove {} instead", m.checkpoint),
            Some("model"),
        ));
    }
    let _ = rt.unload(Some(&m.name)).await;
    host::hf_cache::remove_repo(&rt.cfg.hf_cache, &registry::Checkpoint::parse(&m.checkpoint).repo).await?;
    if let Some(key) = m.name.strip_prefix(registry::USER_PREFIX) {
        host::files::save_user_model(&rt.cfg.cache_dir, key, None)?;
    }
    rt.reload_registry()?;
    Ok(())
}
