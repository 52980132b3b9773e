//! Pulling models: resolve a pull request (registering a `user.*` model), download a model's
//! files from the Hub into the huggingface_hub cache with typed progress ([`PullEvent`]), and
//! make sure a model is downloaded before it loads. The server renders the events (SSE for
//! the Lemonade API, NDJSON for Ollama's).

use std::collections::BTreeMap;
use std::time::Instant;

use api_types::*;
use host::hub::{Download, Hub, HubError};
use registry::{CatalogueEntry, Checkpoint, LookupError, ModelInfo, USER_PREFIX};
use tokio::sync::mpsc;

use crate::error::{EngineError, HubFailure, Result};
use crate::Engine;

pub use crate::progress::{progress_reporter, PullEvent, PROGRESS_EVERY};

/// The Hub client; with `offline` set, an error naming the setting and `action` (nothing
/// here reaches the network then).
fn hub(rt: &Engine, action: &'static str) -> Result<Hub> {
    if rt.cfg.live.offline() {
        return Err(EngineError::Offline { action });
    }
    let hub = match &rt.cfg.hub_endpoint {
        Some(e) => Hub::new(e, std::env::var("HF_TOKEN").ok()),
        None => Hub::from_env(),
    };
    Ok(hub.in_memory(rt.cfg.hub_in_memory.clone()))
}

/// A refused `source` or checkpoint URL, naming the field at fault.
fn source_refused(e: registry::source::SourceError) -> EngineError {
    let param = match e {
        registry::source::SourceError::Conflict { .. } => "checkpoint",
        _ => "source",
    };
    EngineError::invalid(e.to_string(), Some(param))
}

/// Validates the request and registers a new `user.*` model; returns the model to download.
pub async fn resolve(rt: &Engine, req: &PullRequest) -> Result<ModelInfo> {
    let name = req.model.clone().or_else(|| req.model_name.clone()).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| EngineError::invalid("Missing required field 'model'", Some("model")))?;
    let checkpoint = req
        .checkpoints
        .as_ref()
        .and_then(|c| c.get("main").cloned())
        .or_else(|| req.checkpoint.clone())
        .filter(|c| !c.is_empty());
    // A checkpoint URL names its registry; `source` must agree (refused before anything else).
    let source = req.source.as_deref().or(req.registry_source.as_deref());
    let checkpoint = match checkpoint {
        Some(c) => Some(registry::source::resolve(&c, source).map_err(source_refused)?.0),
        None if source.is_some() => {
            registry::source::resolve("", source).map_err(source_refused)?;
            None
        }
        None => None,
    };
    let recipe = req.recipe.clone().filter(|r| !r.is_empty());
    if req.checkpoints.as_ref().is_some_and(|c| !c.contains_key("main")) {
        return Err(EngineError::invalid(
            "If present, the `checkpoints` property must be an object and must contain `main`",
            Some("checkpoints"),
        ));
    }
    let is_user = name.starts_with(USER_PREFIX);
    // `user.builtin.X` would take the reserved name too (as v11 refuses it).
    let bare = name.strip_prefix(USER_PREFIX).unwrap_or(&name);
    let reserved = [registry::EXTRA_PREFIX, registry::BUILTIN_PREFIX].into_iter().find(|p| bare.starts_with(p));
    if let (Some(p), true) = (reserved, checkpoint.is_some() || recipe.is_some()) {
        return Err(EngineError::invalid(
            format!(
                "The prefix '{p}' is reserved (it names models lemonade finds itself); register the model as `user.{}`",
                &bare[p.len()..]
            ),
            Some("model"),
        ));
    }
    if (checkpoint.is_some() || recipe.is_some()) && !is_user {
        return Err(EngineError::invalid(
            format!("When providing 'checkpoint' or 'recipe', the model name must include the `user.` prefix, for example `user.Phi-4-Mini-GGUF`. Received: {name}"),
            Some("model"),
        ));
    }
    let reg = rt.catalogue.registry();
    let known = reg.get(&name);
    if let (Ok(m), None) = (&known, &checkpoint) {
        return Ok((*m).clone());
    }
    if let Err(e @ LookupError::NotSupported { .. }) = &known {
        return Err(e.clone().into());
    }
    if !is_user {
        return Err(EngineError::invalid_code(
            format!("Model '{name}' was not found. To register a new model, the name must include the `user.` namespace, for example `user.Phi-4-Mini-GGUF`, and the request must give `checkpoint` and `recipe`."),
            "model",
            "model_not_found",
        ));
    }
    let invalid = |message: String, param: &str| EngineError::invalid_code(message, param, "invalid_request");
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
        return Err(EngineError::invalid(
            format!("Model {name} is not registered with lemonade. To register and install it, provide the `checkpoint` and `recipe` arguments, as well as the optional `reasoning` and `mmproj` arguments as appropriate."),
            Some("checkpoint"),
        ));
    };
    if recipe == "llamacpp" && checkpoint.to_ascii_lowercase().contains("gguf") && !checkpoint.contains(':') {
        return Err(EngineError::invalid(
            format!("You are required to provide a 'variant' in the checkpoint field when registering a GGUF model, for example `{checkpoint}:Q4_K_M`."),
            Some("checkpoint"),
        ));
    }
    // v11: an image model's defaults are saved as its options, the request's options over them.
    let defaults = match req.image_defaults.as_ref().filter(|_| recipe == "sd-cpp") {
        Some(serde_json::Value::Object(d)) => {
            use OptionKey::*;
            let keys = [Steps, CfgScale, Width, Height, SamplingMethod, FlowShift].map(|k| k.as_str());
            let known: serde_json::Map<String, serde_json::Value> =
                d.iter().filter(|(k, _)| keys.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
            Some(LoadOptions::from_map(&known).map_err(|e| invalid(e.to_string(), "image_defaults"))?)
        }
        Some(_) => return Err(invalid("'image_defaults' must be an object".into(), "image_defaults")),
        None => None,
    };
    let options = match (&req.recipe_options, defaults) {
        (None, None) => None,
        (given, defaults) => {
            let mut o = defaults.unwrap_or_default();
            if let Some(m) = given {
                o.overlay(&LoadOptions::from_map(m).map_err(|e| invalid(e.to_string(), e.key))?);
            }
            backends::options::check(&o).map_err(crate::options::refused)?;
            backends::Recipe::parse(&recipe).map(|r| registry::recipe_options(r, o))
        }
    };
    let flag = |f: Option<bool>| f.unwrap_or(false);
    let entry = CatalogueEntry {
        checkpoint: checkpoint.clone(),
        checkpoints: req.checkpoints.clone().unwrap_or_default(),
        mmproj: req.mmproj.clone(),
        image_defaults: req.image_defaults.clone().filter(|_| recipe == "sd-cpp"),
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
    let info = rt.catalogue.register(&name, &entry).await?;
    match options {
        // v9: the pull's options replace the model's saved entry.
        Some(o) => {
            rt.catalogue.update_options(&name, move |_| Some(o.to_map())).await?;
            rt.catalogue.get(&name)
        }
        None => Ok(info),
    }
}

fn hub_error(e: HubError) -> EngineError {
    match e {
        HubError::Status { status: 404, .. } => {
            EngineError::invalid_code(e.to_string(), "checkpoint", "checkpoint_not_found")
        }
        HubError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            EngineError::Hub(HubFailure::DiskFull { error: e.to_string() })
        }
        e => EngineError::Hub(HubFailure::Download { error: e.to_string() }),
    }
}

/// Downloads `m` unless it is downloaded (inference and `/load` on a registered model that is
/// not downloaded pull it first, as v9), waiting at most `cfg.pull_timeout`. Returns the
/// model as the refreshed catalogue sees it.
pub async fn ensure_downloaded(rt: &Engine, m: &ModelInfo) -> Result<ModelInfo> {
    if m.loads_without_pull() {
        return Ok(m.clone());
    }
    tracing::info!(model = %m.name, checkpoint = %m.checkpoint, "model not downloaded: pulling it before loading");
    let t = Instant::now();
    tokio::time::timeout(rt.cfg.live.pull_timeout(), download(rt, m, None)).await.map_err(|_| {
        EngineError::Hub(HubFailure::PullTimedOut { model: m.name.clone(), secs: rt.cfg.live.pull_timeout().as_secs() })
    })??;
    rt.catalogue.reload().await?;
    tracing::info!(model = %m.name, secs = t.elapsed().as_secs_f64(), "pulled");
    let pulled = rt.catalogue.get(&m.name)?;
    if !pulled.downloaded {
        return Err(EngineError::NotDownloaded { model: m.name.clone() });
    }
    Ok(pulled)
}

/// Lists, plans and downloads every file of `m`, reporting progress and finished files to
/// `events` (None: no progress). A closed channel cancels the download. One download per repository at a time:
/// a concurrent pull of the same model waits, then finds the verified files and fetches none.
/// Returns how many files the model has.
/// A shutdown stops it (its partial files stay, for the next start to resume).
pub async fn download(rt: &Engine, m: &ModelInfo, events: Option<&mpsc::Sender<PullEvent>>) -> Result<usize> {
    let span = tracing::debug_span!(target: "lemonade::spans", "pull", model = %m.name, checkpoint = %m.checkpoint);
    let work = tracing::Instrument::instrument(download_files(rt, m, events), span);
    tokio::select! {
        r = work => r,
        () = rt.lifecycle.closed() => Err(EngineError::Hub(HubFailure::Download {
            error: format!("lemonade is shutting down; {}'s partial download is kept and resumes at the next pull", m.name),
        })),
    }
}

async fn download_files(rt: &Engine, m: &ModelInfo, events: Option<&mpsc::Sender<PullEvent>>) -> Result<usize> {
    let received = rt.metrics.pull_counter(&m.name);
    let hub = hub(rt, "downloading a model from Hugging Face")?.on_received(move |n| {
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
    let planned = registry::plan::plan(&m.checkpoints, &listings)
        .map_err(|e| EngineError::invalid_code(e.to_string(), "checkpoint", "invalid_checkpoint"))?;
    let total = planned.len();
    for (i, p) in planned.iter().enumerate() {
        let file = listings[&p.repo].iter().find(|f| f.path == p.path).expect("planned from the listing");
        let job = Download { repo: &p.repo, commit: &commits[&p.repo], file, dest_repo: &main.repo, dest: &p.dest };
        let mut report = events.map(|tx| progress_reporter(tx.clone(), p.dest.clone(), i + 1, total));
        let mut received = 0;
        let mut progress = |done: u64, size: Option<u64>| {
            received = done;
            report.as_mut().is_none_or(|r| r(done, size))
        };
        progress(0, file.size);
        hub.download(&rt.cfg.hf_cache, &job, &mut progress).await.map_err(hub_error)?;
        if let Some(tx) = events {
            let done =
                PullEvent::FileDone { file: p.dest.clone(), index: i + 1, total, bytes: file.size.unwrap_or(received) };
            let _ = tx.send(done).await;
        }
    }
    // Where the files came from (v11's provenance), for `check-updates`.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for r in &repos {
        let model = (*r == main.repo).then_some(m.name.as_str());
        if let Err(e) = host::hf_cache::record_provenance(&rt.cfg.hf_cache, r, "main", &commits[r], model, now) {
            tracing::warn!(repo = %r, error = %e, "provenance not recorded");
        }
    }
    Ok(total)
}

/// The definition of Lemonade v11's registry-backed collection `repo`: its repository's
/// `*.json` files downloaded into the Hugging Face cache (when that fails, or offline, the
/// copy cached before), and the manifest read from there. It must name components and carry
/// their definitions (`models`).
pub async fn collection_manifest(rt: &Engine, repo: &str) -> Result<serde_json::Value> {
    let fetched = async {
        let hub = hub(rt, "downloading a collection from Hugging Face")?;
        let lock = rt.locks.get(&format!("repo:{repo}"));
        let _guard = lock.lock().await;
        let (commit, files) = hub.list(repo, "main").await.map_err(hub_error)?;
        let small = |f: &&registry::plan::RepoFile| f.size.is_none_or(|s| s <= host::catalogue::MAX_MANIFEST);
        for f in files.iter().filter(|f| f.path.ends_with(".json") && !f.path.contains('/')).filter(small) {
            let job = Download { repo, commit: &commit, file: f, dest_repo: repo, dest: &f.path };
            hub.download(&rt.cfg.hf_cache, &job, &mut |_, _| true).await.map_err(hub_error)?;
        }
        Ok::<_, EngineError>(())
    }
    .await;
    let (cache, r) = (rt.cfg.hf_cache.clone(), repo.to_string());
    let cached = host::offload::offload(move || host::catalogue::collection_manifest(&cache, &r))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?;
    let complete =
        |m: &serde_json::Value| m["components"].as_array().is_some_and(|c| !c.is_empty()) && m["models"].is_array();
    match (fetched, cached) {
        (Err(e), Some(m)) if complete(&m) => {
            tracing::warn!(repo, error = %e, "collection manifest not refreshed; the cached copy is used");
            Ok(m)
        }
        (Err(e), _) => Err(e),
        (Ok(()), Some(m)) if complete(&m) => Ok(m),
        (Ok(()), _) => Err(EngineError::invalid(
            format!(
                "Collection manifest for '{repo}' must contain a non-empty 'components' array and a 'models' array"
            ),
            Some("checkpoint"),
        )),
    }
}

/// [`download`] then the registry reloaded, so the model counts as downloaded.
pub async fn pull_now(rt: &Engine, m: &ModelInfo) -> Result<()> {
    download(rt, m, None).await?;
    rt.catalogue.reload().await
}

/// [`download`] in its own task, its events on the returned channel (ending with `Complete`
/// or `Error`); dropping the receiver cancels it. `Complete` is sent once the catalogue was
/// reloaded, so a client that lists the models on `Complete` sees the model downloaded.
pub fn pull_in_background(rt: &Engine, m: ModelInfo) -> mpsc::Receiver<PullEvent> {
    let (tx, rx) = mpsc::channel(64);
    let rt = rt.clone();
    tokio::spawn(async move {
        let result = download(&rt, &m, Some(&tx)).await;
        let reloaded = rt.catalogue.reload().await;
        let last = match (result, reloaded) {
            (Ok(total), Ok(())) => PullEvent::Complete { file: String::new(), index: total, total, bytes: 0 },
            (Err(e), _) | (Ok(_), Err(e)) => PullEvent::Error(e.to_string()),
        };
        let _ = tx.send(last).await;
    });
    rx
}

/// Deletes what `name` names: a collection's registration, or a model's files (and its
/// registration) as [`delete`] does. Returns the name deleted.
pub async fn delete_named(rt: &Engine, name: &str) -> Result<String> {
    if let Some(c) = rt.catalogue.registry().collection(name).cloned() {
        rt.catalogue.unregister(&c.name).await?;
        return Ok(c.name);
    }
    delete(rt, &rt.catalogue.get(name)?).await?;
    Ok(name.to_string())
}

/// Unloads `m`, removes its repository from the Hugging Face cache and a `user.*` model's
/// registration. Models of the extra models dir are not deleted (400).
pub async fn delete(rt: &Engine, m: &ModelInfo) -> Result<()> {
    if m.source == registry::Source::ExtraModelsDir {
        return Err(EngineError::invalid(
            format!("Cannot delete extra models via the API; remove {} instead", m.checkpoint),
            Some("model"),
        ));
    }
    let _ = rt.lifecycle.unload(Some(&m.name)).await;
    host::hf_cache::remove_repo(&rt.cfg.hf_cache, &registry::Checkpoint::parse(&m.checkpoint).repo).await?;
    rt.catalogue.unregister(&m.name).await
}

/// `POST /models/register` (Lemonade v11): registers or updates the `user.*` model `req`
/// defines, downloading nothing; checked as a pull's registration is (a 400 names the field).
pub async fn register(rt: &Engine, req: &RegisterRequest) -> Result<ModelInfo> {
    if req.model_name.is_empty() {
        return Err(EngineError::invalid("Missing required field 'model_name'", Some("model_name")));
    }
    if !req.model_name.starts_with(USER_PREFIX) {
        return Err(EngineError::invalid(
            format!("'{}' must be named under `user.`, for example `user.Phi-4-Mini-GGUF`", req.model_name),
            Some("model_name"),
        ));
    }
    if req.recipe.is_empty() {
        return Err(EngineError::invalid("Missing required field 'recipe'", Some("recipe")));
    }
    if let Some(s) = req.source.as_deref().filter(|s| *s != "huggingface") {
        return Err(EngineError::invalid(
            format!("Unsupported source '{s}': lemonade pulls from huggingface"),
            Some("source"),
        ));
    }
    let pull = PullRequest {
        model: Some(req.model_name.clone()),
        checkpoint: req.checkpoint.clone(),
        checkpoints: req.checkpoints.clone(),
        recipe: Some(req.recipe.clone()),
        labels: req.labels.clone(),
        ..Default::default()
    };
    resolve(rt, &pull).await
}

/// `GET /pull/variants` (Lemonade v11): the GGUF variants of the Hugging Face repository
/// `checkpoint` (`org/repo`), from its file listing. 400 for a missing or malformed
/// checkpoint, 404 when the Hub has no such repository.
pub async fn variants(rt: &Engine, q: &VariantsQuery) -> Result<PullVariants> {
    let repo = q.checkpoint.as_deref().map(str::trim).filter(|c| !c.is_empty());
    let repo =
        repo.ok_or_else(|| EngineError::invalid("Missing required query parameter 'checkpoint'", Some("checkpoint")))?;
    let (repo, _) = registry::source::resolve(repo, q.source.as_deref()).map_err(source_refused)?;
    let repo = repo.split(':').next().unwrap_or(&repo).to_string();
    let repo = repo.as_str();
    registry::checkpoint::validate(repo).ok().filter(|_| repo.contains('/')).ok_or_else(|| {
        EngineError::invalid(
            format!("Malformed 'checkpoint' '{repo}': expected a repository id of the form 'owner/name'"),
            Some("checkpoint"),
        )
    })?;
    match hub(rt, "listing a Hugging Face repository's variants")?.list(repo, "main").await {
        Ok((_, files)) => Ok(registry::variants::of(repo, &files)),
        Err(HubError::Status { status: 404, .. }) => {
            Err(EngineError::Missing { what: crate::error::Thing::HubRepository, name: repo.to_string() })
        }
        Err(e) => Err(EngineError::Hub(HubFailure::Listing { repo: repo.to_string(), error: e.to_string() })),
    }
}

/// `GET /registry/search` (Lemonade v11): Hugging Face repositories matching a query. 400 for a
/// query under 3 characters or a bad `source`, `limit` or `format`; 429 when the Hub
/// rate-limits; a 502 naming the Hub's status otherwise.
pub async fn search(rt: &Engine, q: &SearchQuery) -> Result<SearchResults> {
    let query = q.query.as_deref().or(q.q.as_deref()).map(str::trim).unwrap_or_default();
    if query.chars().count() < 3 {
        return Err(EngineError::invalid("query must be at least 3 characters", Some("query")));
    }
    let limit = match q.limit.as_deref().map(str::parse::<u32>) {
        None => 12,
        Some(Ok(n)) if (1..=50).contains(&n) => n,
        _ => return Err(EngineError::invalid("limit must be a whole number from 1 to 50", Some("limit"))),
    };
    let gguf = match q.format.as_deref() {
        None => false,
        Some("gguf") => true,
        Some(f) => {
            return Err(EngineError::invalid(format!("Unknown format '{f}': the only format is gguf"), Some("format")))
        }
    };
    // The source last, before the Hub is asked (v11's order: query, limit, format, source).
    let source = match q.source.as_deref().map(|s| (registry::source::Registry::parse(s), s)) {
        None | Some((Some(registry::source::Registry::HuggingFace), _)) => "huggingface",
        Some((Some(other), _)) => return Err(source_refused(registry::source::SourceError::NotPulled(other))),
        Some((None, s)) => return Err(source_refused(registry::source::SourceError::Unsupported(s.to_string()))),
    };
    let (total, found) = hub(rt, "searching Hugging Face")?.search(query, limit, gguf).await.map_err(|e| match e {
        HubError::Status { status: 429, .. } => EngineError::Hub(HubFailure::SearchRateLimited),
        HubError::Status { status, .. } => EngineError::Hub(HubFailure::SearchAnswered { status }),
        e => EngineError::Hub(HubFailure::Search { error: e.to_string() }),
    })?;
    let results = found.iter().filter_map(registry::search::result).take(limit as usize).collect();
    Ok(SearchResults {
        source: source.into(),
        query: query.into(),
        format: gguf.then(|| "gguf".into()),
        total,
        results,
    })
}

/// `POST /models/check-updates` (Lemonade v11): each downloaded Hugging Face model whose
/// repository's `main` now points past the commit it was downloaded at (its provenance, else
/// the cache's `refs/main`). A repository that cannot be asked counts as updated, as v11
/// assumes; every repository is asked once, one after another.
pub async fn check_updates(rt: &Engine) -> Result<CheckUpdates> {
    // At start (`--check-updates`) the first scan may still run: the check waits for it.
    rt.catalogue.scanned().await;
    let reg = rt.catalogue.registry();
    let mut by_repo: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in reg.models().filter(|m| m.downloaded && m.source != registry::Source::ExtraModelsDir) {
        by_repo.entry(Checkpoint::parse(&m.checkpoint).repo.to_string()).or_default().push(m.name.clone());
    }
    let hub = hub(rt, "checking Hugging Face for model updates")?;
    let mut models = Vec::new();
    for (repo, names) in by_repo {
        let local = host::hf_cache::local_commit(&rt.cfg.hf_cache, &repo);
        let newer = match hub.commit(&repo, "main").await {
            Ok(remote) => local.as_deref() != Some(remote.as_str()),
            Err(e) => {
                tracing::warn!(repo = %repo, error = %e, "update check failed; assuming an update");
                true
            }
        };
        if newer {
            models.extend(names);
        }
    }
    rt.updates.record(&models);
    Ok(CheckUpdates { status: "success".into(), updates_available: models.len(), models })
}

/// [`check_updates`] in its own task (`serve --check-updates`); its result is kept in
/// `rt.updates`.
pub fn check_updates_in_background(rt: &Engine) {
    let rt = rt.clone();
    tokio::spawn(async move {
        match check_updates(&rt).await {
            Ok(c) => tracing::info!(updates = c.updates_available, models = ?c.models, "update check done"),
            Err(e) => tracing::warn!(error = %e, "update check failed"),
        }
    });
}

/// `GET /models/{id}/files` (Lemonade v11): the model's resolved files (the main file, the
/// projector, and beyond v11 the main file's other shards as `shard`), each file's own size
/// and whether it exists; absolute paths only when asked for.
pub fn files(rt: &Engine, name: &str, include_paths: bool) -> Result<ModelFiles> {
    let m = rt.catalogue.get(name)?;
    let mut found: Vec<(&str, std::path::PathBuf)> = Vec::new();
    if let Some(main) = &m.main_path {
        found.push(("main", main.clone()));
        found.extend(registry::memory::other_shards(main).into_iter().map(|p| ("shard", p)));
    }
    if let Some(mm) = &m.mmproj_path {
        found.push(("mmproj", mm.clone()));
    }
    let files = found
        .into_iter()
        .map(|(role, p)| {
            let size = host::files::size_of(&p);
            ModelFile {
                name: p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default(),
                path: include_paths.then(|| p.display().to_string()),
                role: role.into(),
                size_bytes: size.unwrap_or(0),
                exists: size.is_some(),
            }
        })
        .collect();
    Ok(ModelFiles { model_id: m.name.clone(), files })
}
