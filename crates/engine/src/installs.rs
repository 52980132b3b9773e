//! Backend installs: plan (pure, `backends::releases`), one install of a backend at a time
//! (the engine's keyed lock), the transaction itself (`host::install`), progress as
//! [`PullEvent`]s, auto-install before a load, and uninstall.

use std::collections::BTreeMap;
use std::sync::Arc;

use api_types::{BackendInfo, RecipeInfo};
use backends::releases::{self, InstallPlan, InstallPlanError, Installed};
use backends::Recipe;
use host::binary::{self, Found};
use host::install::{InstallError, Progress};

use tokio::sync::mpsc;

use crate::config::Config;
use crate::error::Result;
use crate::locks::Locks;
use crate::progress::{progress_reporter, PullEvent};

/// What installing `recipe:backend` means on this machine.
pub fn plan(cfg: &Config, recipe: &str, backend: &str) -> Result<InstallPlan, InstallPlanError> {
    let hw = host::hardware::hardware();
    releases::plan_install(&hw, &host::install::pins(&cfg.cache_dir), recipe, backend)
}

/// The lock that makes installs and uninstalls of one backend wait for each other (a second
/// install then finds the backend installed).
pub fn backend_lock(locks: &Locks, recipe: &str, backend: &str) -> Arc<tokio::sync::Mutex<()>> {
    locks.get(&format!("backend:{recipe}:{backend}"))
}

/// Installs `p` (one install of a backend at a time); returns the bytes downloaded (0 when the
/// pinned version was there) and the version.
pub async fn install(
    cfg: &Config,
    locks: &Locks,
    p: &InstallPlan,
    progress: Progress<'_>,
) -> Result<(u64, String), InstallError> {
    // Offline, only an install that downloads nothing (the pinned version is there) goes on.
    let pinned_there = matches!(installed(cfg, p.recipe, &p.backend), Installed::Managed(Some(v)) if v == p.version);
    if cfg.live.offline() && !pinned_there {
        return Err(InstallError::Offline(format!("{}:{}", p.recipe.as_str(), p.backend)));
    }
    let lock = backend_lock(locks, p.recipe.as_str(), &p.backend);
    let _guard = lock.lock().await;
    host::install::install(&cfg.cache_dir, p, progress).await
}

/// Installs the backend a load needs when it is missing and this platform has a release for
/// it. `Ok(false)`: nothing can be installed (the caller reports the missing binary).
pub async fn auto_install(cfg: &Config, locks: &Locks, recipe: &str, backend: &str) -> Result<bool, InstallError> {
    let Ok(p) = plan(cfg, recipe, backend) else { return Ok(false) };
    tracing::info!(recipe, backend, "backend not installed: installing it before loading");
    install(cfg, locks, &p, &mut |_, _| true).await.map(|_| true)
}

/// [`plan`], as an engine error.
pub fn plan_for(cfg: &Config, recipe: &str, backend: &str) -> Result<InstallPlan> {
    Ok(plan(cfg, recipe, backend)?)
}

/// Installs `p` now (no progress); returns the version installed.
pub async fn install_now(cfg: &Config, locks: &Locks, p: &InstallPlan) -> Result<String> {
    Ok(install(cfg, locks, p, &mut |_, _| true).await?.1)
}

/// [`install`] in its own task, its progress on the returned channel as one file's
/// [`PullEvent`]s, ending with `Complete` (0 bytes when the pinned version was there) or
/// `Error`. Dropping the receiver cancels the download (the old backend stays).
pub fn install_in_background(cfg: &Arc<Config>, locks: &Arc<Locks>, p: InstallPlan) -> mpsc::Receiver<PullEvent> {
    let (tx, rx) = mpsc::channel(64);
    let (cfg, locks) = (cfg.clone(), locks.clone());
    tokio::spawn(async move {
        let file = p.asset.filename.clone();
        let mut report = progress_reporter(tx.clone(), file.clone(), 1, 1);
        let result = install(&cfg, &locks, &p, &mut report).await;
        let last = match result {
            Ok((bytes, _)) => PullEvent::Complete { file, index: 1, total: 1, bytes },
            Err(e) => PullEvent::Error(e.to_string()),
        };
        let _ = tx.send(last).await;
    });
    rx
}

/// What is installed for `recipe:backend` (override, managed directory or PATH).
pub fn installed(cfg: &Config, recipe: Recipe, backend: &str) -> Installed {
    let (dir, exe) = recipe.dir_and_exe();
    match binary::resolve_from_env(&cfg.cache_dir, dir, backend, exe) {
        None => Installed::Missing,
        Some(r) => match r.found {
            Found::Override(var) => Installed::Override(var),
            Found::Managed { version } => Installed::Managed(version),
            Found::Path => Installed::System(r.path.display().to_string()),
        },
    }
}

/// The `recipes` section: every recipe with every backend's state.
pub fn recipes(cfg: &Config) -> BTreeMap<String, RecipeInfo> {
    let hw = host::hardware::hardware();
    let pins = host::install::pins(&cfg.cache_dir);
    let mut out = BTreeMap::new();
    for (recipe, list) in releases::recipes() {
        let mut info = RecipeInfo::default();
        for backend in list {
            let inst = installed(cfg, recipe, backend);
            let (devices, st) = releases::state(&hw, &pins, recipe.as_str(), backend, &inst);
            if st.state != "unsupported" && info.default_backend.is_empty() {
                info.default_backend = backend.to_string();
            }
            // The release a page and an archive are named by: the installed one for a managed
            // release, else the pin (an override, PATH or a source build is no release).
            let from_release =
                matches!(inst, Installed::Managed(_)) && !releases::built_from_source(&hw, recipe.as_str());
            let tag = if from_release {
                st.version.clone()
            } else {
                pins.version(recipe.as_str(), backend).unwrap_or_default().into()
            };
            let asset = releases::asset(&hw, recipe.as_str(), backend, &tag);
            let b = BackendInfo {
                devices: devices.iter().map(|d| d.to_string()).collect(),
                state: st.state.to_string(),
                message: st.message,
                action: st.action,
                release_url: releases::release_url(recipe, backend, &tag).unwrap_or_default(),
                version: st.version,
                download_filename: asset.map(|a| a.filename).unwrap_or_default(),
                can_uninstall: matches!(inst, Installed::Managed(_)),
            };
            info.backends.insert(backend.to_string(), b);
        }
        // llama.cpp models run on the configured backend, so that is the default we report.
        if recipe == Recipe::LlamaCpp {
            info.default_backend = cfg.live.llamacpp_backend();
        }
        let default = info.backends.get(&info.default_backend).or_else(|| info.backends.values().next());
        info.release_url = default.map(|b| b.release_url.clone()).unwrap_or_default();
        out.insert(recipe.to_string(), info);
    }
    out
}
