//! Backend installs as the server runs them: plan (pure, `backends::releases`), one install of
//! a backend at a time (the runtime's keyed lock), the transaction itself (`host::install`),
//! and auto-install before a load.

use std::sync::Arc;

use backends::releases::{self, InstallPlan, InstallPlanError};
use host::install::{InstallError, Progress};

use crate::config::Config;
use crate::locks::Locks;

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
