//! The model catalogue: built-in models, the user's `user.*` registrations, loose GGUF files
//! from the extra models dir, and where each model's files are in the Hugging Face cache.
//!
//! Building a [`Registry`] reads files (catalogue, JSON files, cache listings, GGUF headers);
//! everything after that is pure lookups.

pub mod checkpoint;
pub mod gguf;
pub mod hf_cache;
pub mod hub;
pub mod plan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use api_types::{Model, ModelType, RecipeOptions};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use checkpoint::Checkpoint;

/// The built-in catalogue (started from Lemonade v9.4.1's `server_models.json`).
pub const BUILTIN_CATALOGUE: &str = include_str!("../data/server_models.json");
/// Backend version pins (Lemonade v9.4.1's `backend_versions.json`).
pub const BACKEND_VERSIONS: &str = include_str!("../data/backend_versions.json");

pub const USER_PREFIX: &str = "user.";
pub const EXTRA_PREFIX: &str = "extra.";
pub const USER_MODELS_FILE: &str = "user_models.json";
pub const RECIPE_OPTIONS_FILE: &str = "recipe_options.json";

/// Recipes this build can serve. Models of other recipes are filtered out (see [`Registry`]).
pub const IMPLEMENTED_RECIPES: &[&str] = &["llamacpp", "ryzenai-llm"];
/// Recipes that run on the AMD NPU (Windows only, as in Lemonade v9).
pub const NPU_RECIPES: &[&str] = &["ryzenai-llm", "flm"];

/// One entry of a catalogue file (`server_models.json`, `user_models.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CatalogueEntry {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub checkpoint: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checkpoints: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<String>,
    #[serde(default)]
    pub recipe: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggested: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_defaults: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    BuiltIn,
    User,
    ExtraModelsDir,
}

/// A model as the server sees it: catalogue data plus what the cache holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    /// `checkpoints["main"]`.
    pub checkpoint: String,
    pub checkpoints: BTreeMap<String, String>,
    pub recipe: String,
    pub suggested: bool,
    pub labels: Vec<String>,
    pub size: Option<f64>,
    pub image_defaults: Option<Value>,
    pub model_type: ModelType,
    pub source: Source,
    /// The main file (for llamacpp: the GGUF passed to `-m`, the first shard if sharded).
    pub main_path: Option<PathBuf>,
    pub mmproj_path: Option<PathBuf>,
    pub downloaded: bool,
}

impl ModelInfo {
    /// Device class of the recipe, as Lemonade reports it in `health`.
    pub fn device(&self) -> &'static str {
        device_for_recipe(&self.recipe)
    }
}

/// Labels → type: the first label that names a type wins; none → LLM.
pub fn type_from_labels(labels: &[String]) -> ModelType {
    for l in labels {
        match l.as_str() {
            "embeddings" | "embedding" => return ModelType::Embedding,
            "reranking" => return ModelType::Reranking,
            "audio" => return ModelType::Audio,
            "image" => return ModelType::Image,
            "tts" => return ModelType::Tts,
            _ => {}
        }
    }
    ModelType::Llm
}

/// Recipe → device (a llamacpp model is "gpu" even on the cpu backend, as in v9).
pub fn device_for_recipe(recipe: &str) -> &'static str {
    match recipe {
        "llamacpp" => "gpu",
        "ryzenai-llm" | "flm" => "npu",
        "whispercpp" | "sd-cpp" | "kokoro" => "cpu",
        _ => "none",
    }
}

/// The option keys each recipe accepts (reference §2.9).
pub fn recipe_option_keys(recipe: &str) -> &'static [&'static str] {
    match recipe {
        "llamacpp" => &["ctx_size", "llamacpp_backend", "llamacpp_args"],
        "flm" | "ryzenai-llm" => &["ctx_size"],
        "whispercpp" => &["whispercpp_backend"],
        "sd-cpp" => &["sd-cpp_backend", "steps", "cfg_scale", "width", "height"],
        _ => &[],
    }
}

/// Keeps the keys of `opts` that belong to `recipe`, dropping "unset" values (-1 and "").
pub fn filter_recipe_options(recipe: &str, opts: &RecipeOptions) -> RecipeOptions {
    let keys = recipe_option_keys(recipe);
    opts.iter()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .filter(|(_, v)| !(v.as_i64() == Some(-1) || v.as_str() == Some("")))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Where the registry reads from.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Lemonade's own cache dir (`user_models.json`, `recipe_options.json`).
    pub cache_dir: PathBuf,
    /// The Hugging Face hub cache root.
    pub hf_cache: PathBuf,
    pub extra_models_dir: Option<PathBuf>,
    /// Total RAM in GB, for the size filter; None disables it.
    pub physical_memory_gb: Option<f64>,
    /// `LEMONADE_DISABLE_MODEL_FILTERING`.
    pub disable_filtering: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Why a name did not resolve to a usable model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LookupError {
    #[error("Model '{name}' was not found. {hint}")]
    NotFound { name: String, hint: String },
    #[error("Model '{name}' is not available on this system. {reason}")]
    NotSupported { name: String, reason: String },
}

#[derive(Debug, Clone, Default)]
pub struct Registry {
    models: BTreeMap<String, ModelInfo>,
    /// Models hidden on this host, with the reason.
    filtered: BTreeMap<String, String>,
    /// Saved per-model options, keyed by full model name.
    recipe_options: BTreeMap<String, RecipeOptions>,
}

impl Registry {
    /// Reads the catalogue, the user's files, the extra models dir and the HF cache.
    pub fn load(cfg: &RegistryConfig) -> Result<Registry, RegistryError> {
        let builtin: BTreeMap<String, CatalogueEntry> = serde_json::from_str(BUILTIN_CATALOGUE)
            .map_err(|e| RegistryError::Json { path: "built-in catalogue".into(), source: e })?;
        let user: BTreeMap<String, CatalogueEntry> = read_json_or_default(&cfg.cache_dir.join(USER_MODELS_FILE))?;
        let recipe_options: BTreeMap<String, RecipeOptions> =
            read_json_or_default(&cfg.cache_dir.join(RECIPE_OPTIONS_FILE))?;

        let mut reg = Registry { recipe_options, ..Default::default() };
        for (name, e) in builtin {
            reg.add(name, e, Source::BuiltIn, cfg);
        }
        for (key, e) in user {
            reg.add(format!("{USER_PREFIX}{key}"), e, Source::User, cfg);
        }
        if let Some(dir) = &cfg.extra_models_dir {
            for (name, info) in scan_extra_models_dir(dir) {
                if reg.models.contains_key(&name) || reg.filtered.contains_key(&name) {
                    tracing::warn!(model = %name, "extra model skipped: the name is already registered");
                    continue;
                }
                reg.models.insert(name, info);
            }
        }
        Ok(reg)
    }

    fn add(&mut self, name: String, e: CatalogueEntry, source: Source, cfg: &RegistryConfig) {
        let mut info = entry_to_info(&name, e, source);
        if let Some(reason) = filter_reason(&info, cfg) {
            self.filtered.insert(name, reason);
            return;
        }
        resolve_files(&mut info, &cfg.hf_cache);
        self.models.insert(name, info);
    }

    /// Looks a model up; the error carries v9's message (suggestions or the filter reason).
    pub fn get(&self, name: &str) -> Result<&ModelInfo, LookupError> {
        if let Some(m) = self.models.get(name) {
            return Ok(m);
        }
        if let Some(reason) = self.filtered.get(name) {
            return Err(LookupError::NotSupported { name: name.into(), reason: reason.clone() });
        }
        let names: Vec<&str> = self.models.keys().map(String::as_str).collect();
        let shown: Vec<String> = names.iter().take(3).map(|n| format!("'{n}'")).collect();
        let mut hint = String::new();
        if !shown.is_empty() {
            hint = format!("Available models include: {}", shown.join(", "));
            if names.len() > 3 {
                hint.push_str(&format!(", and {} more", names.len() - 3));
            }
            hint.push_str(". ");
        }
        hint.push_str("Use 'lemonade list' or GET /api/v1/models?show_all=true to see all available models.");
        Err(LookupError::NotFound { name: name.into(), hint })
    }

    /// All models usable on this host, sorted by name.
    pub fn models(&self) -> impl Iterator<Item = &ModelInfo> {
        self.models.values()
    }

    /// Saved options of a model (`recipe_options.json`), filtered to its recipe's keys.
    pub fn saved_options(&self, m: &ModelInfo) -> RecipeOptions {
        self.recipe_options.get(&m.name).map(|o| filter_recipe_options(&m.recipe, o)).unwrap_or_default()
    }

    /// The API view of a model.
    pub fn to_api(&self, m: &ModelInfo) -> Model {
        Model {
            id: m.name.clone(),
            object: "model".into(),
            created: 1234567890,
            owned_by: "lemonade".into(),
            checkpoint: m.checkpoint.clone(),
            checkpoints: m.checkpoints.clone(),
            recipe: m.recipe.clone(),
            downloaded: m.downloaded,
            suggested: m.suggested,
            labels: m.labels.clone(),
            recipe_options: self.saved_options(m),
            size: m.size.filter(|s| *s > 0.0),
            model_type: Some(m.model_type),
            image_defaults: m.image_defaults.clone(),
        }
    }
}

fn read_json_or_default<T: serde::de::DeserializeOwned + Default>(path: &Path) -> Result<T, RegistryError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| RegistryError::Json { path: path.display().to_string(), source: e }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(RegistryError::Io { path: path.display().to_string(), source: e }),
    }
}

fn entry_to_info(name: &str, e: CatalogueEntry, source: Source) -> ModelInfo {
    let mut checkpoints = e.checkpoints.clone();
    if !e.checkpoint.is_empty() {
        checkpoints.entry("main".into()).or_insert_with(|| e.checkpoint.clone());
    }
    let main = checkpoints.get("main").cloned().unwrap_or_default();
    if let Some(mmproj) = &e.mmproj {
        let repo = Checkpoint::parse(&main).repo;
        checkpoints.entry("mmproj".into()).or_insert_with(|| format!("{repo}:{mmproj}"));
    }
    ModelInfo {
        name: name.to_string(),
        checkpoint: main,
        checkpoints,
        model_type: type_from_labels(&e.labels),
        recipe: e.recipe,
        // Built-in entries default to not suggested; user entries to suggested.
        suggested: e.suggested.unwrap_or(source == Source::User),
        labels: e.labels,
        size: e.size,
        image_defaults: e.image_defaults,
        source,
        main_path: None,
        mmproj_path: None,
        downloaded: false,
    }
}

/// Why a model is hidden on this host, or None. Lemonade v9 filters by recipe support and by
/// size (`size > 0.8 × RAM`); this build also hides recipes it has no backend for.
fn filter_reason(m: &ModelInfo, cfg: &RegistryConfig) -> Option<String> {
    if cfg.disable_filtering {
        return None;
    }
    if !IMPLEMENTED_RECIPES.contains(&m.recipe.as_str()) {
        return Some(format!(
            "The '{}' recipe is not supported by this lemonade build (supported: {}).",
            m.recipe,
            IMPLEMENTED_RECIPES.join(", ")
        ));
    }
    if NPU_RECIPES.contains(&m.recipe.as_str()) && !cfg!(windows) {
        return Some(format!("The '{}' recipe requires an AMD XDNA 2 NPU on Windows.", m.recipe));
    }
    if let (Some(ram), Some(size)) = (cfg.physical_memory_gb, m.size) {
        let limit = 0.8 * ram;
        if ram > 0.0 && size > limit {
            return Some(format!(
                "This model requires approximately {size:.1} GB of memory, but your system only has {ram:.1} GB of RAM. \
                 Models larger than {limit:.1} GB (80% of system RAM) are filtered out."
            ));
        }
    }
    None
}

/// Finds the model's files in the HF cache and decides `downloaded`; for GGUF models, reads
/// the header so embedding and reranking GGUFs are served as such even without labels.
fn resolve_files(m: &mut ModelInfo, hf_cache: &Path) {
    let main = Checkpoint::parse(&m.checkpoint);
    if main.repo.is_empty() {
        return;
    }
    for snap in hf_cache::snapshots(hf_cache, &main.repo) {
        if m.recipe == "ryzenai-llm" {
            // The model is the directory holding genai_config.json.
            let cfg = snap.files.iter().find(|f| f.rsplit('/').next() == Some("genai_config.json"));
            if let Some(rel) = cfg {
                let file = snap.dir.join(rel);
                m.downloaded = hf_cache::is_complete(&file);
                m.main_path = file.parent().map(Path::to_path_buf);
                break;
            }
            continue;
        }
        let found = if m.recipe == "llamacpp" {
            checkpoint::resolve_gguf(&snap.files, &main.variant)
        } else {
            checkpoint::resolve_exact(&snap.files, &main.variant)
        };
        if let Some(rel) = found {
            let path = snap.dir.join(rel);
            m.downloaded = hf_cache::is_complete(&path);
            if let Some(mm) = m.checkpoints.get("mmproj") {
                let v = Checkpoint::parse(mm).variant;
                m.mmproj_path = checkpoint::resolve_exact(&snap.files, &v).map(|r| snap.dir.join(r));
            }
            m.main_path = Some(path);
            break;
        }
    }
    if m.downloaded {
        apply_gguf_type(m);
    }
}

fn apply_gguf_type(m: &mut ModelInfo) {
    if m.recipe != "llamacpp" || m.model_type != ModelType::Llm {
        return;
    }
    let Some(path) = &m.main_path else { return };
    match gguf::read_metadata(path) {
        Ok(meta) => {
            if let Some(t) = meta.model_type() {
                m.model_type = t;
                let label = if t == ModelType::Reranking { "reranking" } else { "embeddings" };
                if !m.labels.iter().any(|l| l == label) {
                    m.labels.push(label.into());
                }
            }
        }
        Err(e) => {
            tracing::warn!(model = %m.name, path = %path.display(), error = %e, "cannot read GGUF metadata")
        }
    }
}

/// Scans `dir` recursively for `*.gguf` (case-insensitive), as Lemonade v9 does:
/// files directly in `dir` become `extra.<file name>`; files in a subfolder are grouped by
/// their immediate parent folder into `extra.<folder>` (main file: the smallest non-mmproj
/// path, i.e. the first shard; an mmproj file adds `checkpoints.mmproj` and the `vision` label).
pub fn scan_extra_models_dir(dir: &Path) -> Vec<(String, ModelInfo)> {
    let mut files = Vec::new();
    collect_ggufs(dir, &mut files);
    files.sort();
    let mut groups: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    let mut out = Vec::new();
    for f in files {
        let parent = f.parent().map(Path::to_path_buf).unwrap_or_default();
        if parent == dir {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.contains("mmproj") {
                continue;
            }
            let size = file_gib(&f);
            out.push((format!("{EXTRA_PREFIX}{name}"), extra_info(&name, f.clone(), None, size)));
        } else {
            groups.entry(parent).or_default().push(f);
        }
    }
    for (folder, files) in groups {
        let (mmproj, main): (Vec<_>, Vec<_>) =
            files.iter().partition(|f| f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("mmproj")));
        let Some(main_file) = main.first() else {
            continue;
        };
        let name = folder.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let size = files.iter().map(|f| file_gib(f)).sum();
        let mut info = extra_info(&name, (*main_file).clone(), mmproj.first().map(|p| (*p).clone()), size);
        if let Some(mm) = mmproj.first() {
            let mm_name = mm.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            info.checkpoints.insert("mmproj".into(), mm_name.into());
            info.labels.push("vision".into());
        }
        out.push((format!("{EXTRA_PREFIX}{name}"), info));
    }
    out
}

fn extra_info(name: &str, main: PathBuf, mmproj: Option<PathBuf>, size_gib: f64) -> ModelInfo {
    let checkpoint = main.display().to_string();
    let mut info = ModelInfo {
        name: format!("{EXTRA_PREFIX}{name}"),
        checkpoints: BTreeMap::from([("main".to_string(), checkpoint.clone())]),
        checkpoint,
        recipe: "llamacpp".into(),
        suggested: true,
        labels: vec!["custom".into()],
        size: Some((size_gib * 100.0).round() / 100.0),
        image_defaults: None,
        model_type: ModelType::Llm,
        source: Source::ExtraModelsDir,
        downloaded: hf_cache::is_complete(&main),
        main_path: Some(main),
        mmproj_path: mmproj,
    };
    if info.downloaded {
        apply_gguf_type(&mut info);
    }
    info
}

fn collect_ggufs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => collect_ggufs(&p, out),
            Ok(_) if p.extension().and_then(|x| x.to_str()).is_some_and(|x| x.eq_ignore_ascii_case("gguf")) => {
                out.push(p)
            }
            _ => {}
        }
    }
}

fn file_gib(p: &Path) -> f64 {
    std::fs::metadata(p).map(|m| m.len() as f64 / (1u64 << 30) as f64).unwrap_or(0.0)
}

#[cfg(test)]
mod tests;

/// Replaces `name`'s saved options in `<cache_dir>/recipe_options.json` (None removes them).
/// The file is written atomically: temp file, fsync, rename, fsync of the directory, so a
/// crash at any point leaves either the old or the new file.
pub fn save_recipe_options(cache_dir: &Path, name: &str, options: Option<&RecipeOptions>) -> Result<(), RegistryError> {
    update_json_map(&cache_dir.join(RECIPE_OPTIONS_FILE), name, options)
}

/// Sets (or with None removes) `key` in the JSON object file at `path`: one writer at a time,
/// atomic replacement.
fn update_json_map<T: Serialize + serde::de::DeserializeOwned + Clone>(
    path: &Path,
    key: &str,
    value: Option<&T>,
) -> Result<(), RegistryError> {
    let _one_writer = FILES.lock().unwrap_or_else(|e| e.into_inner());
    let mut all: BTreeMap<String, T> = read_json_or_default(path)?;
    match value {
        Some(v) => all.insert(key.to_string(), v.clone()),
        None => all.remove(key),
    };
    let bytes = serde_json::to_vec_pretty(&all)
        .map_err(|e| RegistryError::Json { path: path.display().to_string(), source: e })?;
    write_atomic(path, &bytes).map_err(|e| RegistryError::Io { path: path.display().to_string(), source: e })
}

/// Serializes the read-modify-write of the files we own, so concurrent updates are not lost.
static FILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes `bytes` to `path` atomically (same-directory temp file, fsync, rename, fsync dir).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Adds or replaces `user.<key>` in `<cache_dir>/user_models.json` (atomically), or removes it
/// when `entry` is None.
pub fn save_user_model(cache_dir: &Path, key: &str, entry: Option<&CatalogueEntry>) -> Result<(), RegistryError> {
    update_json_map(&cache_dir.join(USER_MODELS_FILE), key, entry)
}

/// Why `user.<name>` cannot be registered: `name` must be 1–200 characters with no control
/// characters, no `/` or `\\`, and no `..` (it becomes a key in `user_models.json` and is shown
/// in tables and logs).
pub fn validate_user_name(name: &str) -> Result<(), String> {
    let key = name.strip_prefix(USER_PREFIX).unwrap_or(name);
    let bad = key.is_empty()
        || key.chars().count() > 200
        || key.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        || key.contains("..")
        || key.trim() != key;
    if bad {
        return Err(format!(
            "Invalid model name '{}': after `user.` use 1 to 200 characters without control characters, '/', '\\', '..' or surrounding spaces",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// Labels of a registration (v9): `custom`, the given labels, and one per flag (`embedding`
/// gives `embeddings`), plus `image` for sd-cpp and `audio` for whispercpp; sorted, unique.
pub fn registration_labels(
    labels: &[String],
    reasoning: bool,
    vision: bool,
    embedding: bool,
    reranking: bool,
    recipe: &str,
) -> Vec<String> {
    let mut set: std::collections::BTreeSet<String> = labels.iter().cloned().collect();
    set.insert("custom".into());
    for (on, l) in [
        (reasoning, "reasoning"),
        (vision, "vision"),
        (embedding, "embeddings"),
        (reranking, "reranking"),
        (recipe == "sd-cpp", "image"),
        (recipe == "whispercpp", "audio"),
    ] {
        if on {
            set.insert(l.into());
        }
    }
    set.into_iter().collect()
}
