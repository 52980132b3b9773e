//! The prompt cache at run time: llama-server saves each slot that holds a prompt before
//! lemonade stops it for any reason but a crash, and a request that continues a saved prompt
//! after the model loads again gets that slot back, so only its new tokens are prefilled.
//! The decisions (who may cache, the key, which prompt a request continues, what to evict)
//! are `backends::prompt_cache`'s; the files are `host::prompt_cache`'s.
//!
//! Restores are lazy: a request of a model that has saved prompts left to restore has its
//! prompt rendered and tokenized by the backend (`/apply-template`, `/tokenize`: a few
//! milliseconds), and only a request whose tokens begin with (most of) a saved prompt's waits
//! for that file to be checked and restored. Once every saved prompt of the load was restored
//! or discarded, requests pass without a look.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backends::prompt_cache::{self as rules, Entry};
use host::prompt_cache::{now_ms, SlotFileError, Store, PART};
use serde_json::{json, Value};

use crate::metrics::Metrics;
use futures_util::future::BoxFuture;

/// Saved prompts a load looks at for restores (the most recently used).
const PENDING: usize = 8;
/// A prefix shorter than this (tokens) is not worth a restore, nor a slot worth a save.
const MIN_TOKENS: usize = 32;
/// Bounds on the backend's answers, so a wedged backend cannot hold a stop or a request up.
const SLOTS_TIMEOUT: Duration = Duration::from_secs(2);
const SAVE_TIMEOUT: Duration = Duration::from_secs(60);

/// The prompt cache of one running llama-server.
#[derive(Debug)]
pub struct Attached {
    store: Store,
    /// The folder llama-server saves this load's slots in (`--slot-save-path`).
    pub dir: PathBuf,
    material: String,
    model: String,
    /// Saved prompts of this key not restored into this backend yet.
    pending: tokio::sync::Mutex<Vec<Entry>>,
    any_pending: AtomicBool,
}

/// Whether the load of `model` with `args` keeps a prompt cache; if so its save directory is
/// added to `args`. None when the cache is off, the load is not eligible, or the directory
/// cannot be made.
pub fn attach(
    store: &Store,
    limit: u64,
    model: &str,
    model_type: api_types::ModelType,
    has_mmproj: bool,
    main: &FileKey,
    args: &mut Vec<String>,
) -> Option<Attached> {
    if limit == 0 {
        return None;
    }
    if let Some(why) = rules::unsafe_reason(model_type, has_mmproj, args) {
        tracing::debug!(model, why, "no prompt cache for this load");
        return None;
    }
    #[cfg(feature = "testing")]
    let args_in_key: &[String] =
        if crate::mutation::on(crate::mutation::Mutation::CacheKeyWithoutOptions) { &[] } else { args };
    #[cfg(not(feature = "testing"))]
    let args_in_key: &[String] = args;
    let material = rules::key_material(&main.path, main.len, main.mtime_ns, args_in_key);
    let dir =
        store.dir(&rules::key_dir(&material)).map_err(|e| tracing::warn!(error = %e, "no prompt cache dir")).ok()?;
    let pending: Vec<Entry> =
        store.entries(&dir).into_iter().filter(|e| e.material == material).take(PENDING).collect();
    args.push(rules::SAVE_PATH_ARG.into());
    args.push(format!("{}/", dir.display()));
    Some(Attached {
        store: store.clone(),
        dir,
        material,
        model: model.to_string(),
        any_pending: AtomicBool::new(!pending.is_empty()),
        pending: tokio::sync::Mutex::new(pending),
    })
}

/// What identifies a model file in the cache's key: its path, length and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileKey {
    pub path: String,
    pub len: u64,
    pub mtime_ns: u128,
}

impl FileKey {
    /// `path`'s, from its metadata (None when it cannot be read).
    pub fn of(path: &Path) -> Option<FileKey> {
        let meta = std::fs::metadata(path).ok()?;
        let mtime_ns = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        Some(FileKey { path: path.display().to_string(), len: meta.len(), mtime_ns })
    }
}

/// Why a call to llama-server's slot API failed (logged: the cache never fails a request).
#[derive(Debug, thiserror::Error)]
enum SlotCallError {
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
    #[error(transparent)]
    InMemory(#[from] host::net::Unanswered),
    #[error("it answered {status}: {excerpt}")]
    Answered { status: u16, excerpt: String },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Where a backend's slot API answers: its address, and, for a process that lives in memory
/// (the simulation's), its answers there (the launcher implements it for every process).
pub trait SlotApi: Sync {
    fn base_url(&self) -> String;
    /// The answer in memory; None: the request goes over HTTP.
    fn answer(
        &self,
        req: &reqwest::Request,
    ) -> Option<BoxFuture<'static, Result<reqwest::Response, host::net::Unanswered>>>;
}

/// A backend's slot API, and the client that reaches it over HTTP.
pub struct Backend<'a, P: SlotApi + ?Sized> {
    pub http: &'a reqwest::Client,
    pub process: &'a P,
}

impl<P: SlotApi + ?Sized> Clone for Backend<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: SlotApi + ?Sized> Copy for Backend<'_, P> {}

impl<P: SlotApi + ?Sized> Backend<'_, P> {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.process.base_url())
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, SlotCallError> {
        let req = req.build()?;
        if let Some(answer) = self.process.answer(&req) {
            return Ok(answer.await?);
        }
        Ok(self.http.execute(req).await?)
    }
}

async fn post(
    b: Backend<'_, impl SlotApi + ?Sized>,
    path: &str,
    body: &Value,
    timeout: Duration,
) -> Result<Value, SlotCallError> {
    let r = b.send(b.http.post(b.url(path)).json(body).timeout(timeout)).await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        return Err(SlotCallError::Answered { status: status.as_u16(), excerpt: text.chars().take(300).collect() });
    }
    Ok(serde_json::from_str(&text)?)
}

async fn slots(b: Backend<'_, impl SlotApi + ?Sized>) -> Result<Vec<Value>, SlotCallError> {
    let r = b.send(b.http.get(b.url("/slots")).timeout(SLOTS_TIMEOUT)).await?;
    if !r.status().is_success() {
        return Err(SlotCallError::Answered { status: r.status().as_u16(), excerpt: String::new() });
    }
    Ok(r.json::<Vec<Value>>().await?)
}

/// Saves every slot of backend `b` that holds a prompt, then keeps the whole cache
/// under `limit` bytes. Called before a stop that is not a crash; failures are logged and
/// never keep the backend from stopping.
pub async fn save(b: Backend<'_, impl SlotApi + ?Sized>, att: &Attached, limit: u64, metrics: &Metrics) {
    let t = Instant::now();
    let all = match slots(b).await {
        Ok(s) => s,
        Err(e) => return tracing::debug!(model = %att.model, error = %e, "prompt cache: no slots to save"),
    };
    let mut saved = 0;
    for s in &all {
        let Some(id) = s["id"].as_u64() else { continue };
        if !rules::holds_prompt(s, MIN_TOKENS as u64) {
            continue;
        }
        let file = format!("{}-{id}.bin", now_ms());
        let path = format!("/slots/{id}?action=save");
        if let Err(e) = post(b, &path, &json!({"filename": format!("{file}{PART}")}), SAVE_TIMEOUT).await {
            let part = att.dir.join(format!("{file}{PART}"));
            let _ = host::offload::offload(move || std::fs::remove_file(part)).await;
            tracing::warn!(model = %att.model, slot = id, error = %e, "prompt cache: the backend did not save its slot");
            continue;
        }
        let (store, dir, model, material) =
            (att.store.clone(), att.dir.clone(), att.model.clone(), att.material.clone());
        let committed = host::offload::offload(move || store.commit(&dir, &file, &model, &material)).await;
        match committed.unwrap_or_else(|e| Err(SlotFileError::Task(e.to_string()))) {
            Ok(e) => {
                saved += 1;
                metrics.cache_saved(&att.model);
                tracing::debug!(model = %att.model, slot = id, tokens = e.token_ids.len(), bytes = e.bytes, "prompt cache: slot saved");
            }
            Err(e) => tracing::warn!(model = %att.model, error = %e, "prompt cache: cannot keep a saved slot"),
        }
    }
    let store = att.store.clone();
    let evicted = host::offload::offload(move || store.enforce(limit)).await.unwrap_or_default();
    if saved > 0 || evicted > 0 {
        tracing::info!(model = %att.model, saved, evicted, ms = t.elapsed().as_millis() as u64,
            "prompt cache: slots saved before the backend stops");
    }
}

/// The tokens a request to `path` with `body` makes, as the backend renders and tokenizes
/// its prompt for the completion; None for requests that are not completions.
async fn request_tokens(b: Backend<'_, impl SlotApi + ?Sized>, path: &str, body: &[u8]) -> Option<Vec<i32>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let prompt = if path.ends_with("/chat/completions") {
        let mut t = v;
        t.as_object_mut()?.remove("stream");
        let answer = post(b, "/apply-template", &t, SLOTS_TIMEOUT).await.ok()?;
        answer["prompt"].as_str()?.to_string()
    } else if path.ends_with("/completions") || path.ends_with("/completion") {
        v["prompt"].as_str()?.to_string()
    } else {
        return None;
    };
    let body = json!({"content": prompt, "add_special": true, "parse_special": true});
    let answer = post(b, "/tokenize", &body, SLOTS_TIMEOUT).await.ok()?;
    answer["tokens"].as_array()?.iter().map(|t| t.as_i64().and_then(|t| i32::try_from(t).ok())).collect()
}

/// Before a request is forwarded: if it continues a saved prompt, check that prompt's file
/// and restore it into a free slot of backend `b`. Never fails the request: a file that does
/// not check out, or that the backend refuses, is discarded with a log line.
pub async fn before_request(
    b: Backend<'_, impl SlotApi + ?Sized>,
    att: &Attached,
    path: &str,
    body: &[u8],
    metrics: &Metrics,
) {
    if !att.any_pending.load(Ordering::Acquire) {
        return;
    }
    let mut pending = att.pending.lock().await;
    if pending.is_empty() {
        return;
    }
    let Some(tokens) = request_tokens(b, path, body).await else { return };
    let Some(entry) = rules::continued(&pending, &tokens, MIN_TOKENS).cloned() else { return };
    pending.retain(|e| e.file != entry.file);
    att.any_pending.store(!pending.is_empty(), Ordering::Release);
    let t = Instant::now();
    let (store, dir, e) = (att.store.clone(), att.dir.clone(), entry.clone());
    let checked = host::offload::offload(move || store.verify(&dir, &e))
        .await
        .unwrap_or_else(|e| Err(SlotFileError::Task(e.to_string())));
    if let Err(why) = checked {
        return discard(att, &entry, &why.to_string(), metrics);
    }
    // A slot that holds nothing, else one that is not busy, else the first (the backend
    // waits until it is free).
    let all = slots(b).await.unwrap_or_default();
    let free = |s: &&Value| s["is_processing"].as_bool() != Some(true);
    let id = all
        .iter()
        .filter(free)
        .find(|s| !rules::holds_prompt(s, 1))
        .or_else(|| all.iter().find(free))
        .and_then(|s| s["id"].as_u64())
        .unwrap_or(0);
    let url = format!("/slots/{id}?action=restore");
    match post(b, &url, &json!({"filename": entry.file}), SAVE_TIMEOUT).await {
        Ok(v) => {
            let tokens = v["n_restored"].as_u64().unwrap_or(entry.token_ids.len() as u64);
            metrics.cache_restored(&att.model, tokens);
            let (store, dir) = (att.store.clone(), att.dir.clone());
            let _ = host::offload::offload(move || store.touch(&dir, &entry)).await;
            tracing::info!(model = %att.model, slot = id, tokens, ms = t.elapsed().as_millis() as u64,
                "prompt cache: restored a saved prompt this request continues");
        }
        Err(why) => discard(att, &entry, &format!("the backend refused it: {why}"), metrics),
    }
}

fn discard(att: &Attached, e: &Entry, why: &str, metrics: &Metrics) {
    tracing::warn!(model = %att.model, file = %e.file, why, "prompt cache: saved prompt discarded");
    metrics.cache_discarded(&att.model);
    att.store.remove(&att.dir, e);
}
