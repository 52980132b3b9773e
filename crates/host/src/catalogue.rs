//! Builds the pure [`Registry`] from disk: lemonade's JSON files, a listing of the extra models
//! dir, and a [`ModelFiles`] view of the Hugging Face cache.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use registry::gguf::{self, GgufMeta};
use registry::{ExtraFile, ModelFiles, Registry, RegistryConfig, Snapshot, UserFiles};
use registry::{RECIPE_OPTIONS_FILE, USER_MODELS_FILE};

use crate::files::read_if_exists;
use crate::{hf_cache, HostError};

/// Where the catalogue is read from, and how it is filtered.
#[derive(Debug, Clone)]
pub struct CatalogueConfig {
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

/// The cache on disk, as the registry asks about it.
pub struct CacheFiles<'a> {
    pub hf_cache: &'a Path,
    /// GGUF headers already read, by file (None: read every header).
    pub headers: Option<&'a HeaderCache>,
}

/// GGUF header facts kept by (path, size, mtime), so a rescan reads only the files that
/// changed: a header is read again when its file's size or modification time differs.
#[derive(Default)]
pub struct HeaderCache {
    known: parking_lot::Mutex<std::collections::HashMap<PathBuf, HeaderFact>>,
    /// Headers read from disk so far (the rest came from the cache).
    reads: std::sync::atomic::AtomicU64,
}

/// A file's size and modification time when its header was read, and what it said.
type HeaderFact = (u64, std::time::SystemTime, Option<GgufMeta>);

impl HeaderCache {
    /// How many headers were read from disk (not answered from the cache).
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn meta(&self, file: &Path) -> Option<GgufMeta> {
        let stat = std::fs::metadata(file).ok().and_then(|m| Some((m.len(), m.modified().ok()?)));
        if let Some((len, mtime)) = stat {
            if let Some((l, t, meta)) = self.known.lock().get(file) {
                if (*l, *t) == (len, mtime) {
                    return meta.clone();
                }
            }
        }
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let meta = read_logged(file);
        if let Some((len, mtime)) = stat {
            self.known.lock().insert(file.to_path_buf(), (len, mtime, meta.clone()));
        }
        meta
    }
}

impl ModelFiles for CacheFiles<'_> {
    fn snapshots(&self, repo: &str) -> Vec<Snapshot> {
        hf_cache::snapshots(self.hf_cache, repo)
    }
    fn is_complete(&self, file: &Path) -> bool {
        hf_cache::is_complete(file)
    }
    fn size(&self, file: &Path) -> Option<u64> {
        std::fs::metadata(file).ok().map(|m| m.len())
    }
    fn read(&self, file: &Path) -> Option<Vec<u8>> {
        let f = std::fs::File::open(file).ok()?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_MANIFEST + 1), &mut bytes).ok()?;
        (bytes.len() as u64 <= MAX_MANIFEST).then_some(bytes)
    }
    fn gguf_meta(&self, file: &Path) -> Option<GgufMeta> {
        match self.headers {
            Some(h) => h.meta(file),
            None => read_logged(file),
        }
    }
}

fn read_logged(file: &Path) -> Option<GgufMeta> {
    match read_gguf(file) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(path = %file.display(), error = %e, "cannot read GGUF metadata");
            None
        }
    }
}

/// Reads the metadata of the GGUF file at `path`.
pub fn read_gguf(path: &Path) -> Result<GgufMeta, gguf::GgufError> {
    let f = std::fs::File::open(path)?;
    gguf::read_from(BufReader::with_capacity(64 * 1024, f))
}

fn json_file<T: serde::de::DeserializeOwned + Default>(path: &Path) -> Result<T, HostError> {
    match read_if_exists(path)? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
            HostError::Registry(registry::RegistryError::Json { path: path.display().to_string(), source })
        }),
        None => Ok(T::default()),
    }
}

/// The largest collection manifest read (bytes).
pub const MAX_MANIFEST: u64 = 1 << 20;

/// The collection manifest cached for `repo` in the Hugging Face cache, if any (blocking).
pub fn collection_manifest(hf_cache: &Path, repo: &str) -> Option<serde_json::Value> {
    registry::collection_manifest(&CacheFiles { hf_cache, headers: None }, repo)
}

/// Reads the catalogue, the user's files, the extra models dir and the HF cache.
pub fn load(cfg: &CatalogueConfig) -> Result<Registry, HostError> {
    load_with(cfg, None)
}

/// Reads lemonade's own files (`user_models.json`, `recipe_options.json`), so a damaged one is
/// reported at once, before the slower scan of the model files.
pub fn check_files(cfg: &CatalogueConfig) -> Result<(), HostError> {
    json_file::<std::collections::BTreeMap<String, registry::CatalogueEntry>>(&cfg.cache_dir.join(USER_MODELS_FILE))?;
    json_file::<std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>>(
        &cfg.cache_dir.join(RECIPE_OPTIONS_FILE),
    )?;
    json_file::<std::collections::BTreeMap<String, String>>(&cfg.cache_dir.join(registry::ALIASES_FILE))?;
    json_file::<std::collections::BTreeMap<String, api_types::AliasParams>>(
        &cfg.cache_dir.join(registry::ALIAS_PARAMS_FILE),
    )?;
    Ok(())
}

/// Lemonade's own files (`user_models.json`, `recipe_options.json`, `aliases.json`) as the registry takes
/// them; absent files are empty.
pub fn own_files(cfg: &CatalogueConfig) -> Result<UserFiles, HostError> {
    Ok(UserFiles {
        user_models: json_file(&cfg.cache_dir.join(USER_MODELS_FILE))?,
        recipe_options: json_file(&cfg.cache_dir.join(RECIPE_OPTIONS_FILE))?,
        aliases: json_file(&cfg.cache_dir.join(registry::ALIASES_FILE))?,
        alias_params: json_file(&cfg.cache_dir.join(registry::ALIAS_PARAMS_FILE))?,
        extra_files: Vec::new(),
    })
}

/// [`load`], reading a GGUF header only when `headers` has no fact of its file as it is now.
pub fn load_with(cfg: &CatalogueConfig, headers: Option<&HeaderCache>) -> Result<Registry, HostError> {
    let user = UserFiles {
        extra_files: cfg.extra_models_dir.as_deref().map(list_ggufs).unwrap_or_default(),
        ..own_files(cfg)?
    };
    let rcfg = RegistryConfig {
        extra_models_dir: cfg.extra_models_dir.clone(),
        physical_memory_gb: cfg.physical_memory_gb,
        disable_filtering: cfg.disable_filtering,
        xdna2_npu: crate::hardware::detected().hw.xdna2_npu,
    };
    let reg = Registry::build(&rcfg, user, &CacheFiles { hf_cache: &cfg.hf_cache, headers })?;
    write_migrated(cfg, &reg)?;
    Ok(reg)
}

/// Writes what [`Registry::build`] moved from an extra model's v9 name to its name now: the
/// saved options under the new key (the old one removed), aliases pointing at the new name.
/// Once written, a later scan finds nothing to move.
fn write_migrated(cfg: &CatalogueConfig, reg: &Registry) -> Result<(), HostError> {
    for (old, new) in reg.migrated() {
        let entry = reg.saved_entry(new);
        if !entry.is_empty() {
            crate::files::save_recipe_options(&cfg.cache_dir, new, Some(&entry))?;
            crate::files::save_recipe_options(&cfg.cache_dir, old, None)?;
        }
        for (alias, target) in reg.aliases().filter(|(_, t)| t == new) {
            crate::files::save_alias(&cfg.cache_dir, alias, Some(target))?;
        }
    }
    Ok(())
}

/// Every `*.gguf` (any case) under `dir`, recursively, with its size.
pub fn list_ggufs(dir: &Path) -> Vec<ExtraFile> {
    let mut out = Vec::new();
    collect_ggufs(dir, &mut out);
    out
}

fn collect_ggufs(dir: &Path, out: &mut Vec<ExtraFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => collect_ggufs(&p, out),
            Ok(m) if p.extension().and_then(|x| x.to_str()).is_some_and(|x| x.eq_ignore_ascii_case("gguf")) => {
                out.push(ExtraFile { path: p, bytes: m.len() })
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
