//! Registries and engines for the engine's own unit tests.

use registry::{CatalogueEntry, ModelFiles, Registry, RegistryConfig, Snapshot, UserFiles};

/// A cache with nothing in it.
pub struct NoFiles;

impl ModelFiles for NoFiles {
    fn snapshots(&self, _repo: &str) -> Vec<Snapshot> {
        Vec::new()
    }
    fn is_complete(&self, _file: &std::path::Path) -> bool {
        false
    }
    fn gguf_meta(&self, _file: &std::path::Path) -> Option<registry::gguf::GgufMeta> {
        None
    }
}

/// The built-in catalogue plus one `user.<key>` registration.
pub fn registry_with_user_model(key: &str) -> Registry {
    let entry = CatalogueEntry {
        checkpoint: "org/repo-GGUF:Q4_0".into(),
        recipe: "llamacpp".into(),
        labels: vec![],
        ..Default::default()
    };
    let user = UserFiles { user_models: [(key.to_string(), entry)].into(), ..Default::default() };
    let cfg = RegistryConfig { disable_filtering: true, ..Default::default() };
    Registry::build(&cfg, user, &NoFiles).expect("the built-in catalogue parses")
}
