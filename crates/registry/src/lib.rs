//! The model catalogue: built-in models, the user's `user.*` registrations, loose GGUF files
//! from the extra models dir, and where each model's files are in the Hugging Face cache.
//!
//! Pure: a [`Registry`] is built from values (the parsed JSON files, a listing of the extra
//! models dir) and a [`ModelFiles`] view of the cache that the caller implements (`host` does,
//! over the real file system; tests do, in memory). Nothing here opens a file.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod extra;
pub mod gguf;
pub mod memory;
pub mod options;
pub mod plan;
pub mod search;
pub mod source;
pub mod variants;

pub use error::{LookupError, RegistryError};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use api_types::{LoadOptions, Model, ModelType};
use backends::Recipe;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use checkpoint::Checkpoint;

/// The built-in catalogue (started from Lemonade v9.4.1's `server_models.json`).
pub const BUILTIN_CATALOGUE: &str = include_str!("../data/server_models.json");
/// Backend version pins (Lemonade v9.4.1's `backend_versions.json`).
pub const BACKEND_VERSIONS: &str = include_str!("../data/backend_versions.json");

pub const USER_PREFIX: &str = "user.";
/// The canonical prefix of a built-in model (Lemonade v11); built-ins are listed by bare name.
pub const BUILTIN_PREFIX: &str = "builtin.";
/// `aliases.json`: alias → target model name.
pub const ALIASES_FILE: &str = "aliases.json";
/// Parameter variants of aliases (forced and removed request fields), by alias.
pub const ALIAS_PARAMS_FILE: &str = "alias_params.json";
pub const USER_MODELS_FILE: &str = "user_models.json";
pub const RECIPE_OPTIONS_FILE: &str = "recipe_options.json";

/// Name of the manifest Lemonade v9 keeps in a snapshot while a download is in progress.
pub const DOWNLOAD_MANIFEST: &str = ".download_manifest.json";

/// One snapshot of a repo in the cache, with its files (relative, `/`-separated, sorted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub files: Vec<String>,
}

/// What the registry needs to know of the files on disk. `host` implements it over the file
/// system; the registry only asks.
pub trait ModelFiles {
    /// The snapshots of `repo` in the Hugging Face cache: the one `refs/main` names first.
    fn snapshots(&self, repo: &str) -> Vec<Snapshot>;
    /// Whether a resolved file counts as downloaded: it exists, and no partial download or
    /// download manifest sits beside it.
    fn is_complete(&self, file: &Path) -> bool;
    /// The GGUF metadata of a file (None when it cannot be read; the implementor logs why).
    fn gguf_meta(&self, file: &Path) -> Option<gguf::GgufMeta>;
    /// The size of a file in bytes (None: unknown).
    fn size(&self, _file: &Path) -> Option<u64> {
        None
    }
    /// A small file's bytes (a collection's manifest; None: unreadable or too big).
    fn read(&self, _file: &Path) -> Option<Vec<u8>> {
        None
    }
}

/// The collection definition a repository's cached snapshot holds (Lemonade v11's
/// registry-backed collections: a `<Name>.json` whose `recipe` is `collection.*`, found by
/// content), or None.
pub fn collection_manifest(files: &dyn ModelFiles, repo: &str) -> Option<Value> {
    let snap = files.snapshots(repo).into_iter().next()?;
    let mut json: Vec<&String> = snap.files.iter().filter(|f| f.ends_with(".json") && !f.contains('/')).collect();
    json.sort();
    json.into_iter().find_map(|f| {
        let v: Value = serde_json::from_slice(&files.read(&snap.dir.join(f))?).ok()?;
        v["recipe"].as_str().is_some_and(|r| r.starts_with("collection.")).then_some(v)
    })
}

pub use extra::{ExtraFile, EXTRA_PREFIX};

/// The inputs of [`Registry::build`] that come from lemonade's own files.
#[derive(Debug, Clone, Default)]
pub struct UserFiles {
    /// `user_models.json`: registrations by key (without `user.`).
    pub user_models: BTreeMap<String, CatalogueEntry>,
    /// `recipe_options.json` as written: saved options by full model name.
    pub recipe_options: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    /// Every `*.gguf` under the extra models dir (recursively), when one is set.
    pub extra_files: Vec<ExtraFile>,
    /// `aliases.json`: alias → target model name.
    pub aliases: BTreeMap<String, String>,
    /// `alias_params.json`: an alias's forced and removed request fields.
    pub alias_params: BTreeMap<String, api_types::AliasParams>,
}

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
    /// A collection's models (`collection.router`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<String>,
    /// A `collection.router`'s policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Value>,
    /// A `collection.omni`'s system prompt template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// A `collection.omni`'s planner format (`native`, `json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_format: Option<String>,
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
    pub recipe: Recipe,
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
    /// What its memory depends on, read from its GGUF when downloaded (llamacpp only).
    pub shape: Option<memory::ModelShape>,
}

impl ModelInfo {
    /// Device class of the recipe, as Lemonade reports it in `health`.
    pub fn device(&self) -> &'static str {
        self.recipe.device().as_str()
    }

    /// Whether a load may start without a pull first: its files are here, or it is an FLM
    /// model, which FLM keeps itself (its load runs `flm pull`).
    pub fn loads_without_pull(&self) -> bool {
        self.downloaded || self.recipe == Recipe::Flm
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

/// The options of `opts` that belong to `recipe`.
pub fn recipe_options(recipe: Recipe, opts: LoadOptions) -> LoadOptions {
    opts.keep(recipe.option_keys())
}

/// How the registry filters and names what it finds.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    pub extra_models_dir: Option<PathBuf>,
    /// Total RAM in GB, for the size filter; None disables it.
    pub physical_memory_gb: Option<f64>,
    /// `LEMONADE_DISABLE_MODEL_FILTERING`.
    pub disable_filtering: bool,
    /// The host has an XDNA 2 NPU (FastFlowLM models are shown on Windows and Linux).
    pub xdna2_npu: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Registry {
    models: BTreeMap<String, ModelInfo>,
    /// Models hidden on this host, with the reason.
    filtered: BTreeMap<String, String>,
    /// Saved per-model options, keyed by full model name (a value of the wrong type in the
    /// file reads as unset).
    recipe_options: BTreeMap<String, LoadOptions>,
    /// The same entries as written, keys this build does not know included.
    saved_entries: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    /// Alias → target model name (`aliases.json`).
    aliases: BTreeMap<String, String>,
    /// Collections (`collection.router`), by full name.
    collections: BTreeMap<String, Collection>,
    /// Parameter variants, by alias.
    alias_params: BTreeMap<String, api_types::AliasParams>,
    /// An extra model's v9 name (`extra.<file>.gguf`, a split folder's `extra.<folder>`) →
    /// its name now: still meant in a request, never listed.
    extra_names: BTreeMap<String, String>,
    /// Extra models renamed from v9's names whose saved options or aliases moved with them
    /// here (v9's name, the name now); the caller writes the files so.
    migrated: Vec<(String, String)>,
}

/// A collection (Lemonade v11's `collection.router` and `collection.omni`): a name that means
/// a decision among registered models made per request by its policy, or a chat model that
/// calls its components as tools.
#[derive(Debug, Clone)]
pub struct Collection {
    pub name: String,
    pub recipe: String,
    pub components: Vec<String>,
    /// The repository whose manifest defines it (v11's registry-backed collection; its
    /// components are read from the cached manifest at every scan, never saved).
    pub pointer: Option<String>,
    /// The policy or the omni settings, parsed and checked when the catalogue was built.
    pub kind: CollectionKind,
    /// The policy as stored (null for an omni collection).
    pub routing: Value,
}

/// What a collection does.
#[derive(Debug, Clone)]
pub enum CollectionKind {
    Router(std::sync::Arc<routing::Policy>),
    Omni(std::sync::Arc<routing::omni::Omni>),
}

impl Collection {
    /// A router collection's policy.
    pub fn policy(&self) -> Option<&routing::Policy> {
        match &self.kind {
            CollectionKind::Router(p) => Some(p),
            CollectionKind::Omni(_) => None,
        }
    }

    /// An omni collection's settings.
    pub fn omni(&self) -> Option<&routing::omni::Omni> {
        match &self.kind {
            CollectionKind::Omni(o) => Some(o),
            CollectionKind::Router(_) => None,
        }
    }
}

/// The definition `POST /pull` takes for a collection, from its stored entry.
pub fn collection_definition(recipe: &str, components: &[String], routing: &Value) -> Value {
    serde_json::json!({"version": routing::VERSION, "recipe": recipe, "components": components, "routing": routing})
}

impl Registry {
    /// Builds the registry from the built-in catalogue, the user's files and what `files`
    /// reports of the cache.
    pub fn build(cfg: &RegistryConfig, user: UserFiles, files: &dyn ModelFiles) -> Result<Registry, RegistryError> {
        let builtin: BTreeMap<String, CatalogueEntry> = serde_json::from_str(BUILTIN_CATALOGUE)
            .map_err(|e| RegistryError::Json { path: "built-in catalogue".into(), source: e })?;
        let recipe_options =
            user.recipe_options.iter().map(|(k, m)| (k.clone(), LoadOptions::from_map_lossy(m).0)).collect();
        let mut reg = Registry {
            recipe_options,
            saved_entries: user.recipe_options,
            aliases: user.aliases,
            alias_params: user.alias_params,
            ..Default::default()
        };
        for (name, e) in builtin {
            reg.add(name, e, Source::BuiltIn, cfg, files);
        }
        for (key, e) in user.user_models {
            reg.add(format!("{USER_PREFIX}{key}"), e, Source::User, cfg, files);
        }
        if let Some(dir) = &cfg.extra_models_dir {
            let scan = extra::scan(dir, user.extra_files);
            for f in scan.models {
                reg.models.insert(f.id.clone(), extra_info(f, files));
            }
            for (old, new) in scan.renamed {
                reg.extra_names.insert(old.clone(), new.clone());
                reg.migrate(old, new);
            }
        }
        Ok(reg)
    }

    /// Moves what is saved under an extra model's v9 name (its options, aliases naming it) to
    /// its name now; options already saved under the new name win.
    fn migrate(&mut self, old: String, new: String) {
        let mut moved = false;
        if !self.saved_entries.contains_key(&new) {
            if let Some(e) = self.saved_entries.remove(&old) {
                self.saved_entries.insert(new.clone(), e);
                if let Some(o) = self.recipe_options.remove(&old) {
                    self.recipe_options.insert(new.clone(), o);
                }
                moved = true;
            }
        }
        for target in self.aliases.values_mut().filter(|t| **t == old) {
            *target = new.clone();
            moved = true;
        }
        if moved {
            tracing::info!(from = %old, to = %new, "an extra model's saved options and aliases follow its new name");
            self.migrated.push((old, new));
        }
    }

    /// The extra models whose saved options or aliases [`Registry::build`] moved from a v9
    /// name to the name now: (old, new), for the caller to write to `recipe_options.json` and
    /// `aliases.json`.
    pub fn migrated(&self) -> &[(String, String)] {
        &self.migrated
    }

    fn add(&mut self, name: String, e: CatalogueEntry, source: Source, cfg: &RegistryConfig, files: &dyn ModelFiles) {
        if e.recipe.starts_with("collection.") {
            return self.add_collection(name, e, files);
        }
        let recipe = match Recipe::parse(&e.recipe) {
            Some(r) => r,
            None => {
                let reason = format!(
                    "The '{}' recipe is not supported by this lemonade build (supported: {}).",
                    e.recipe,
                    Recipe::runnable_names()
                );
                self.filtered.insert(name, reason);
                return;
            }
        };
        let mut info = entry_to_info(&name, e, recipe, source);
        if let Some(reason) = filter_reason(&info, cfg) {
            self.filtered.insert(name, reason);
            return;
        }
        resolve_files(&mut info, files);
        self.models.insert(name, info);
    }

    fn add_collection(&mut self, name: String, mut e: CatalogueEntry, files: &dyn ModelFiles) {
        let pointer = Some(e.checkpoints.get("main").cloned().unwrap_or_else(|| e.checkpoint.clone()))
            .filter(|p| !p.is_empty() && e.components.is_empty());
        if let Some(repo) = &pointer {
            // The manifest on disk is the definition (nothing of it is saved).
            if let Some(m) = collection_manifest(files, repo) {
                let strings = |v: &Value| -> Option<Vec<String>> {
                    v.as_array()?.iter().map(|c| c.as_str().map(str::to_string)).collect()
                };
                e.components = strings(&m["components"]).unwrap_or_default();
                e.routing = e.routing.or_else(|| Some(m["routing"].clone()).filter(|r| !r.is_null()));
                e.system_prompt = e.system_prompt.or_else(|| m["system_prompt"].as_str().map(str::to_string));
                e.tool_format = e.tool_format.or_else(|| m["tool_format"].as_str().map(str::to_string));
            }
        }
        let routing = e.routing.unwrap_or(Value::Null);
        let parsed = match e.recipe.as_str() {
            routing::ROUTER_RECIPE => {
                routing::Policy::parse(&collection_definition(&e.recipe, &e.components, &routing))
                    .map(|p| CollectionKind::Router(p.into()))
            }
            routing::OMNI_RECIPE => {
                let prompt = e.system_prompt.map(Value::from);
                let format = e.tool_format.map(Value::from);
                routing::omni::Omni::parse(prompt.as_ref(), format.as_ref()).map(|o| CollectionKind::Omni(o.into()))
            }
            other => Err(routing::PolicyError {
                path: "recipe".into(),
                message: format!("The '{other}' recipe is not supported by this lemonade build"),
            }),
        }
        .map_err(|e| e.to_string());
        match parsed {
            Ok(kind) => {
                let c = Collection {
                    name: name.clone(),
                    recipe: e.recipe,
                    components: e.components,
                    pointer,
                    kind,
                    routing,
                };
                self.collections.insert(name, c);
            }
            Err(reason) => {
                self.filtered.insert(name, format!("The collection cannot be used: {reason}"));
            }
        }
    }

    /// The collection `name` means: its full name, its bare name (`X` for `user.X`), or an
    /// alias of either.
    pub fn collection(&self, name: &str) -> Option<&Collection> {
        if self.collections.is_empty() {
            return None;
        }
        let direct = |n: &str| self.collections.get(n).or_else(|| self.collections.get(&format!("{USER_PREFIX}{n}")));
        direct(name).or_else(|| self.aliases.get(name).and_then(|t| direct(t)))
    }

    /// The forced and removed request fields of `name` when it is a parameter variant (an alias
    /// with params; a model's own name never is one).
    pub fn variant(&self, name: &str) -> Option<&api_types::AliasParams> {
        if self.alias_params.is_empty() {
            return None;
        }
        self.alias_params.get(name).filter(|_| self.aliases.contains_key(name) && !self.is_model_name(name))
    }

    /// `body` as a request through the variant `name` sends it: its `strip` fields removed, its
    /// `params` set over the request's. False (nothing changed) when `name` is no variant.
    pub fn apply_variant(&self, name: &str, body: &mut Value) -> bool {
        let (Some(v), Some(o)) = (self.variant(name), body.as_object_mut()) else { return false };
        for k in &v.strip {
            o.remove(k);
        }
        for (k, val) in &v.params {
            o.insert(k.clone(), val.clone());
        }
        true
    }

    /// Every collection, by name.
    pub fn collections(&self) -> impl Iterator<Item = &Collection> {
        self.collections.values()
    }

    /// Looks a model up; the error carries v9's message (suggestions or the filter reason).
    /// The model `name` means (Lemonade v11's naming): `user.X` and `extra.X` exactly, `builtin.X`
    /// the built-in `X`, a bare name the first of `user.X`, `extra.X` and built-in `X` (a
    /// registered model shadows a built-in of the same name), else an alias's target (named
    /// in any of those forms, or another alias's name, followed up to 8 hops).
    pub fn get(&self, name: &str) -> Result<&ModelInfo, LookupError> {
        match self.primary(name) {
            Some(Ok(m)) => return Ok(m),
            Some(Err(reason)) => return Err(LookupError::NotSupported { name: name.into(), reason: reason.clone() }),
            None => {}
        }
        if let Some(first) = self.aliases.get(name) {
            // An alias may name another alias (as v11 allows); the chain is followed a few
            // hops, never round a loop.
            let mut target = first;
            for _ in 0..8 {
                match self.aliases.get(target) {
                    Some(next) if self.primary(target).is_none() && next != name => target = next,
                    _ => break,
                }
            }
            return match self.primary(target) {
                Some(Ok(m)) => Ok(m),
                Some(Err(reason)) => Err(LookupError::NotSupported { name: name.into(), reason: reason.clone() }),
                None => Err(LookupError::NotFound {
                    name: name.into(),
                    hint: format!("It is an alias of '{target}', which is not a model here. Pull or register '{target}', or point the alias elsewhere."),
                }),
            };
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

    /// The model (or the reason it is hidden) a concrete name means, aliases aside. An extra
    /// model's v9 name means it (a split folder's name, bare too, its first quantization, ahead
    /// of a built-in).
    fn primary(&self, name: &str) -> Option<Result<&ModelInfo, &String>> {
        let exact = |n: &str| self.models.get(n).map(Ok).or_else(|| self.filtered.get(n).map(Err));
        let builtin = |n: &str| match exact(n) {
            Some(Ok(m)) if m.source != Source::BuiltIn => None,
            other => other,
        };
        let v9_extra = |n: &str| self.extra_names.get(n).and_then(|m| exact(m));
        if name.starts_with(USER_PREFIX) {
            return exact(name);
        }
        if name.starts_with(EXTRA_PREFIX) {
            return exact(name).or_else(|| v9_extra(name));
        }
        if let Some(bare) = name.strip_prefix(BUILTIN_PREFIX) {
            return builtin(bare);
        }
        exact(&format!("{USER_PREFIX}{name}"))
            .or_else(|| exact(&format!("{EXTRA_PREFIX}{name}")))
            .or_else(|| v9_extra(&format!("{EXTRA_PREFIX}{name}")))
            .or_else(|| builtin(name))
    }

    /// Whether `name` names a model (or a hidden one, or a collection) by itself, aliases aside.
    pub fn is_model_name(&self, name: &str) -> bool {
        self.primary(name).is_some() || self.collections.contains_key(name)
    }

    /// The id current Lemonade (v11) lists `m` under: its bare name when the bare name means
    /// it (a registered model shadows an extra one of the same name, and both a built-in),
    /// else its prefixed name (`extra.X`, `builtin.X`).
    pub fn v11_id(&self, m: &ModelInfo) -> String {
        let bare = m.name.strip_prefix(USER_PREFIX).or_else(|| m.name.strip_prefix(EXTRA_PREFIX)).unwrap_or(&m.name);
        match self.primary(bare) {
            Some(Ok(winner)) if winner.name == m.name => bare.to_string(),
            _ if m.source == Source::BuiltIn => format!("{BUILTIN_PREFIX}{bare}"),
            _ => m.name.clone(),
        }
    }

    /// The id the listings show for `m`: v11's ([`Registry::v11_id`]), or with `v9` names its
    /// own (`user.X`, `extra.X`, built-in `X`), as Lemonade v9 listed it.
    pub fn listed_id(&self, m: &ModelInfo, v9: bool) -> String {
        if v9 {
            m.name.clone()
        } else {
            self.v11_id(m)
        }
    }

    /// What the listings show, by id ([`Registry::listed_id`]): every model (downloaded ones
    /// unless `show_all`), then every alias whose target is shown, under the alias's own id.
    pub fn listed(&self, show_all: bool, v9: bool) -> Vec<(String, &ModelInfo)> {
        let shown = |m: &ModelInfo| show_all || m.downloaded;
        let mut models: Vec<(String, &ModelInfo)> =
            self.models().filter(|m| shown(m)).map(|m| (self.listed_id(m, v9), m)).collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        let aliases = self
            .aliases
            .keys()
            .filter(|a| !self.is_model_name(a))
            .filter_map(|a| self.get(a).ok().filter(|m| shown(m)).map(|m| (a.clone(), m)));
        models.into_iter().chain(aliases).collect()
    }

    /// The API view of the model `name` means: under its listed id ([`Registry::listed_id`]),
    /// or the id asked for when that is an alias.
    pub fn entry(&self, name: &str, v9: bool) -> Result<Model, LookupError> {
        let m = self.get(name)?;
        let id = if self.is_model_name(name) { self.listed_id(m, v9) } else { name.to_string() };
        Ok(Model { id, ..self.to_api(m) })
    }

    /// Every alias and its target, sorted by alias.
    pub fn aliases(&self) -> impl Iterator<Item = (&str, &str)> {
        self.aliases.iter().map(|(a, t)| (a.as_str(), t.as_str()))
    }

    /// All models usable on this host, sorted by name.
    pub fn models(&self) -> impl Iterator<Item = &ModelInfo> {
        self.models.values()
    }

    /// Saved options of a model (`recipe_options.json`), filtered to its recipe's keys.
    /// The `max_concurrent` and `priority` saved for `m`.
    pub fn saved_scheduling(&self, m: &ModelInfo) -> (Option<u32>, Option<i32>) {
        self.recipe_options.get(&m.name).map_or((None, None), |o| (o.max_concurrent, o.priority))
    }

    /// The idle timeout saved for `m` with `save_options` (seconds; 0 = never).
    pub fn saved_idle_timeout(&self, m: &ModelInfo) -> Option<u64> {
        self.recipe_options.get(&m.name)?.idle_timeout
    }

    /// `name`'s entry in `recipe_options.json` as written (`{}` when none).
    pub fn saved_entry(&self, name: &str) -> serde_json::Map<String, serde_json::Value> {
        self.saved_entries.get(name).cloned().unwrap_or_default()
    }

    /// `m`'s saved options, every one (the idle timeout included), typed.
    pub fn saved(&self, m: &ModelInfo) -> LoadOptions {
        self.recipe_options.get(&m.name).cloned().unwrap_or_default()
    }

    pub fn saved_options(&self, m: &ModelInfo) -> LoadOptions {
        self.recipe_options.get(&m.name).map(|o| recipe_options(m.recipe, o.clone())).unwrap_or_default()
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
            recipe: m.recipe.to_string(),
            downloaded: m.downloaded,
            suggested: m.suggested,
            labels: m.labels.clone(),
            recipe_options: self.saved_options(m),
            size: m.size.filter(|s| *s > 0.0),
            model_type: Some(m.model_type),
            image_defaults: m.image_defaults.clone(),
            upstream: None,
            context_length: m.shape.map(|s| s.trained_ctx).filter(|c| *c > 0),
            update_available: None,
            parallel: None,
            slot_ctx_size: None,
            components: None,
            routing: None,
            system_prompt: None,
            tool_format: None,
            omni_tools: None,
            registry_source: (m.source != Source::ExtraModelsDir && m.recipe != Recipe::Flm)
                .then(|| source::Registry::HuggingFace.as_str().to_string()),
            version: None,
        }
    }
}

fn entry_to_info(name: &str, e: CatalogueEntry, recipe: Recipe, source: Source) -> ModelInfo {
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
        recipe,
        // Built-in entries default to not suggested; user entries to suggested.
        suggested: e.suggested.unwrap_or(source == Source::User),
        labels: e.labels,
        size: e.size,
        image_defaults: e.image_defaults,
        source,
        main_path: None,
        mmproj_path: None,
        downloaded: false,
        shape: None,
    }
}

/// Why a model is hidden on this host, or None. Lemonade v9 filters by recipe support and by
/// size (`size > 0.8 × RAM`); this build also hides recipes it has no backend for.
fn filter_reason(m: &ModelInfo, cfg: &RegistryConfig) -> Option<String> {
    if cfg.disable_filtering {
        return None;
    }
    if !m.recipe.runnable() {
        return Some(format!(
            "The '{}' recipe is not supported by this lemonade build (supported: {}).",
            m.recipe,
            Recipe::runnable_names()
        ));
    }
    if m.recipe == Recipe::Flm && !cfg.xdna2_npu {
        return Some("The 'flm' recipe requires an AMD XDNA 2 NPU (Windows, or Linux with the amdxdna driver).".into());
    }
    if m.recipe.npu() && m.recipe != Recipe::Flm && !cfg!(windows) {
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
fn resolve_files(m: &mut ModelInfo, files: &dyn ModelFiles) {
    let main = Checkpoint::parse(&m.checkpoint);
    if main.repo.is_empty() {
        return;
    }
    for snap in files.snapshots(&main.repo) {
        if m.recipe == Recipe::RyzenAiLlm {
            // The model is the directory holding genai_config.json.
            let cfg = snap.files.iter().find(|f| f.rsplit('/').next() == Some("genai_config.json"));
            if let Some(rel) = cfg {
                let file = snap.dir.join(rel);
                m.downloaded = files.is_complete(&file);
                m.main_path = file.parent().map(Path::to_path_buf);
                break;
            }
            continue;
        }
        let found = checkpoint::resolve_for(m.recipe, &snap.files, &main.variant);
        if let Some(rel) = found {
            let path = snap.dir.join(rel);
            m.downloaded = files.is_complete(&path);
            if let Some(mm) = m.checkpoints.get("mmproj") {
                let v = Checkpoint::parse(mm).variant;
                m.mmproj_path = checkpoint::resolve_exact(&snap.files, &v).map(|r| snap.dir.join(r));
            }
            m.main_path = Some(path);
            break;
        }
    }
    if m.downloaded {
        apply_gguf(m, files);
    }
}

/// What a downloaded llamacpp model's GGUF header says, read once: its memory shape, and for a
/// model labelled as an LLM, whether it is really an embedding or reranking model.
fn apply_gguf(m: &mut ModelInfo, files: &dyn ModelFiles) {
    if m.recipe != Recipe::LlamaCpp {
        return;
    }
    let Some(path) = &m.main_path else { return };
    let Some(meta) = files.gguf_meta(path) else { return };
    let weights: u64 = std::iter::once(path.clone())
        .chain(memory::other_shards(path))
        .chain(m.mmproj_path.clone())
        .filter_map(|p| files.size(&p))
        .sum();
    m.shape = Some(memory::ModelShape::from_meta(&meta, weights));
    if m.model_type != ModelType::Llm {
        return;
    }
    if let Some(t) = meta.model_type() {
        m.model_type = t;
        let label = if t == ModelType::Reranking { "reranking" } else { "embeddings" };
        if !m.labels.iter().any(|l| l == label) {
            m.labels.push(label.into());
        }
    }
}

/// An extra model as the registry holds it.
fn extra_info(f: extra::Found, files: &dyn ModelFiles) -> ModelInfo {
    let checkpoint = f.checkpoint.display().to_string();
    let gib = f.bytes as f64 / (1u64 << 30) as f64;
    let mut info = ModelInfo {
        name: f.id,
        checkpoints: BTreeMap::from([("main".to_string(), checkpoint.clone())]),
        checkpoint,
        recipe: Recipe::LlamaCpp,
        suggested: true,
        labels: vec!["custom".into()],
        size: Some((gib * 100.0).round() / 100.0),
        image_defaults: None,
        model_type: ModelType::Llm,
        source: Source::ExtraModelsDir,
        downloaded: files.is_complete(&f.main),
        main_path: Some(f.main),
        mmproj_path: f.mmproj,
        shape: None,
    };
    if let Some(mm) = &info.mmproj_path {
        info.checkpoints.insert("mmproj".into(), extra::file_name(mm));
        info.labels.push("vision".into());
    }
    if info.downloaded {
        apply_gguf(&mut info, files);
    }
    info
}

#[cfg(test)]
mod tests;

/// `map` with `key` set to `value` (None removes it): the read-modify-write step of the JSON
/// files lemonade owns (`user_models.json`, `recipe_options.json`), as bytes to write.
pub fn updated_json_map<T: Serialize + serde::de::DeserializeOwned>(
    current: Option<&[u8]>,
    path: &str,
    key: &str,
    value: Option<T>,
) -> Result<Vec<u8>, RegistryError> {
    let json = |source| RegistryError::Json { path: path.to_string(), source };
    let mut all: BTreeMap<String, T> = match current {
        Some(bytes) => serde_json::from_slice(bytes).map_err(json)?,
        None => BTreeMap::new(),
    };
    match value {
        Some(v) => all.insert(key.to_string(), v),
        None => all.remove(key),
    };
    serde_json::to_vec_pretty(&all).map_err(json)
}

/// Why `user.<name>` cannot be registered: `name` must be 1–200 characters with no control
/// characters, no `/` or `\\`, and no `..` (it becomes a key in `user_models.json` and is shown
/// in tables and logs).
pub fn validate_user_name(name: &str) -> Result<(), RegistryError> {
    let key = name.strip_prefix(USER_PREFIX).unwrap_or(name);
    let bad = key.is_empty()
        || key.chars().count() > 200
        || key.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        || key.contains("..")
        || key.trim() != key;
    if bad {
        return Err(RegistryError::Invalid(format!(
            "Invalid model name '{}': after `user.` use 1 to 200 characters without control characters, '/', '\\', '..' or surrounding spaces",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// Why `alias` cannot be an alias: it must be 1–200 characters with no control characters,
/// no `/` or `\\`, no `..` and no surrounding spaces, and must not start with a canonical
/// prefix (`user.`, `extra.`, `builtin.`), which name models.
pub fn validate_alias(alias: &str) -> Result<(), RegistryError> {
    let bad = alias.is_empty()
        || alias.chars().count() > 200
        || alias.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        || alias.contains("..")
        || alias.trim() != alias;
    if bad {
        return Err(RegistryError::Invalid(format!(
            "Invalid alias '{}': use 1 to 200 characters without control characters, '/', '\\', '..' or surrounding spaces",
            alias.escape_debug()
        )));
    }
    if let Some(p) = [USER_PREFIX, EXTRA_PREFIX, BUILTIN_PREFIX].iter().find(|p| alias.starts_with(**p)) {
        return Err(RegistryError::Invalid(format!(
            "Invalid alias '{}': the prefix '{p}' is reserved for model names",
            alias.escape_debug()
        )));
    }
    Ok(())
}

/// Labels of a registration (v9): `custom`, the given labels, and one per flag (`embedding`
/// gives `embeddings`), plus `image` for sd-cpp and `audio` for whispercpp (and, beyond v9,
/// `tts` for kokoro, so a registered Kokoro model is a speech model); sorted, unique.
pub fn registration_labels(
    labels: &[String],
    reasoning: bool,
    vision: bool,
    embedding: bool,
    reranking: bool,
    recipe: Option<Recipe>,
) -> Vec<String> {
    let mut set: std::collections::BTreeSet<String> = labels.iter().cloned().collect();
    set.insert("custom".into());
    for (on, l) in [
        (reasoning, "reasoning"),
        (vision, "vision"),
        (embedding, "embeddings"),
        (reranking, "reranking"),
        (recipe == Some(Recipe::SdCpp), "image"),
        (recipe == Some(Recipe::WhisperCpp), "audio"),
        (recipe == Some(Recipe::Kokoro), "tts"),
    ] {
        if on {
            set.insert(l.into());
        }
    }
    set.into_iter().collect()
}
