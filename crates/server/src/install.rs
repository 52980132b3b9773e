//! `install` / `uninstall`: backend release archives into `<cache>/bin/<dir>/<backend>/`.
//!
//! Invariant: at every instant the backend directory is either the old install or the new one,
//! never a mix. The archive is downloaded (resumable, retried, checked against a pinned sha256
//! when the pins carry one), extracted into `<cache>/bin/.staging/…` on the same filesystem,
//! checked (the executable is there and runs `--version`), given its `version.txt`, synced, and
//! only then swapped in with one `renameat2(RENAME_EXCHANGE)` (or a plain rename when there was
//! no old install). Leftovers of an interrupted install are removed at start-up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::PullProgress;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use backends::binary;
use backends::releases::{self, Asset, Pins};
use registry::plan::RepoFile;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::routes::AppState;
use crate::runtime::Runtime;

/// Body of `install` and `uninstall`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct InstallRequest {
    /// Recipe, e.g. `llamacpp`.
    pub recipe: Option<String>,
    /// Backend of the recipe, e.g. `cpu`.
    pub backend: Option<String>,
    /// Answer with SSE progress events (`progress`, `complete`, `error`), as `pull` does.
    pub stream: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InstallResponse {
    pub status: String,
    pub recipe: String,
    pub backend: String,
    /// The version now installed (install only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `<cache>/backend_versions.json` when present (a user's own pins, optionally with sha256s),
/// else v9.4.1's pins.
pub fn pins(cache_dir: &Path) -> Pins {
    let custom = cache_dir.join("backend_versions.json");
    if let Ok(text) = std::fs::read_to_string(&custom) {
        match Pins::parse(&text) {
            Ok(p) => return p,
            Err(e) => tracing::warn!(path = %custom.display(), error = %e, "ignoring unreadable backend pins"),
        }
    }
    Pins::parse(releases::DEFAULT_PINS).expect("built-in pins parse")
}

/// `LEMONADE_RELEASES_URL` (a mirror of GitHub's `<repo>/releases/download/<v>/<file>` layout).
pub fn releases_url() -> String {
    std::env::var("LEMONADE_RELEASES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| releases::DEFAULT_RELEASES_URL.into())
}

fn staging_root(cache_dir: &Path) -> PathBuf {
    cache_dir.join("bin").join(".staging")
}

/// Removes what an interrupted install or uninstall left (never a live backend directory).
pub fn clean_staging(cache_dir: &Path) {
    let root = staging_root(cache_dir);
    if root.exists() {
        if let Err(e) = std::fs::remove_dir_all(&root) {
            tracing::warn!(path = %root.display(), error = %e, "cannot remove an interrupted install's files");
        } else {
            tracing::debug!(path = %root.display(), "removed an interrupted install's files");
        }
    }
}

/// What an install is about: checked request plus the archive and where it goes.
struct Plan {
    recipe: String,
    backend: String,
    dir: &'static str,
    exe: &'static str,
    version: String,
    asset: Asset,
    sha256: Option<String>,
}

fn required(req: &InstallRequest) -> Result<(String, String), ApiError> {
    match (req.recipe.as_deref().filter(|s| !s.is_empty()), req.backend.as_deref().filter(|s| !s.is_empty())) {
        (Some(r), Some(b)) => Ok((r.to_string(), b.to_string())),
        _ => Err(ApiError::bad_request("Both 'recipe' and 'backend' are required", Some("recipe"))),
    }
}

fn known(recipe: &str, backend: &str) -> Result<(&'static str, &'static str), ApiError> {
    let Some((_, list)) = releases::RECIPES.iter().find(|(r, _)| *r == recipe) else {
        return Err(ApiError::BadRequest {
            message: format!(
                "Unknown recipe: {recipe}. Recipes: {}",
                releases::RECIPES.iter().map(|(r, _)| *r).collect::<Vec<_>>().join(", ")
            ),
            param: Some("recipe".into()),
            code: Some("unknown_recipe"),
        });
    };
    if !list.contains(&backend) {
        return Err(ApiError::BadRequest {
            message: format!("Unknown backend '{backend}' for {recipe}. Backends: {}", list.join(", ")),
            param: Some("backend".into()),
            code: Some("unknown_backend"),
        });
    }
    Ok(releases::recipe_dir_and_exe(recipe).expect("every listed recipe has a dir"))
}

fn plan(rt: &Runtime, recipe: &str, backend: &str) -> Result<Plan, ApiError> {
    let (dir, exe) = known(recipe, backend)?;
    let unsupported = |message: String| ApiError::BadRequest {
        message,
        param: Some("backend".into()),
        code: Some("backend_not_installable"),
    };
    let hw = crate::system_info::hardware();
    if let Err(why) = releases::support(&hw, recipe, backend) {
        return Err(unsupported(format!("{recipe}:{backend} cannot run on this machine: {why}")));
    }
    if backend == "system" {
        return Err(unsupported(format!(
            "{recipe}:system is the {exe} found on PATH; install llama.cpp with your package manager instead"
        )));
    }
    if !releases::RUNNABLE.contains(&recipe) {
        return Err(unsupported(format!("This lemonade does not run {recipe} models yet")));
    }
    let pins = pins(&rt.cfg.cache_dir);
    let version = pins
        .version(recipe, backend)
        .ok_or_else(|| unsupported(format!("No version of {recipe}:{backend} is pinned")))?
        .to_string();
    let asset = releases::asset(&hw, recipe, backend, &version)
        .ok_or_else(|| unsupported(format!("{recipe}:{backend} has no release archive for this platform")))?;
    let sha256 = pins.sha256(&asset.filename).map(str::to_string);
    Ok(Plan { recipe: recipe.into(), backend: backend.into(), dir, exe, version, asset, sha256 })
}

/// Progress callback: `(bytes done, total if known)`; false cancels.
type Progress<'a> = &'a mut (dyn FnMut(u64, Option<u64>) -> bool + Send);

/// The lock that makes installs and uninstalls of one backend wait for each other (a second
/// install then finds the backend installed).
fn backend_lock(rt: &Runtime, recipe: &str, backend: &str) -> Arc<tokio::sync::Mutex<()>> {
    rt.lock(&format!("backend:{recipe}:{backend}"))
}

/// Carries out `p` unless the pinned version is there; returns the bytes downloaded (0 when
/// nothing had to be done) and the version.
async fn install(rt: &Runtime, p: &Plan, progress: Progress<'_>) -> Result<(u64, String), ApiError> {
    let (recipe, backend) = (p.recipe.as_str(), p.backend.as_str());
    let lock = backend_lock(rt, recipe, backend);
    let _guard = lock.lock().await;
    let final_dir = binary::managed_dir(&rt.cfg.cache_dir, p.dir, &p.backend);
    let installed_version = std::fs::read_to_string(final_dir.join("version.txt")).ok().map(|v| v.trim().to_string());
    if installed_version.as_deref() == Some(p.version.as_str()) && binary::find_recursive(&final_dir, p.exe).is_some() {
        return Ok((0, p.version.clone()));
    }
    let t = Instant::now();
    let staging = staging_root(&rt.cfg.cache_dir);
    std::fs::create_dir_all(&staging).map_err(|e| io_error(&staging, e))?;
    // The archive stays between attempts (it is resumed), under a name naming its version.
    let downloads = rt.cfg.cache_dir.join("bin").join(".downloads");
    std::fs::create_dir_all(&downloads).map_err(|e| io_error(&downloads, e))?;
    let archive = downloads.join(&p.asset.filename);
    let url = p.asset.url(&releases_url());
    tracing::info!(recipe, backend, version = %p.version, %url, "installing backend");
    if !archive.is_file() {
        let mut fetcher = registry::hub::Hub::new(&releases_url(), None);
        // Fewer attempts than for models: an archive is small next to a model, and a load that
        // waits on an unreachable release site should fail in seconds, not minutes.
        fetcher.policy.attempts = 4;
        let file = RepoFile { path: p.asset.filename.clone(), size: None, sha256: p.sha256.clone(), blob: None };
        fetcher.fetch(&url, &archive, &file, progress).await.map_err(|e| match e {
            registry::hub::HubError::Sha256 { .. } => {
                ApiError::BackendUnavailable(format!("{e}. The installed backend (if any) is unchanged"))
            }
            e => ApiError::BackendUnavailable(format!("Download of {recipe}:{backend} failed: {e}")),
        })?;
    } else if let Some(expected) = &p.sha256 {
        // Downloaded by an earlier attempt that did not finish installing: check it again.
        let a = archive.clone();
        let got = tokio::task::spawn_blocking(move || registry::hub::sha256_file(&a))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| io_error(&archive, e))?;
        if &got != expected {
            let _ = std::fs::remove_file(&archive);
            return Err(ApiError::BackendUnavailable(format!(
                "{}: sha256 {got} does not match the pinned {expected}; the archive was removed and the installed backend (if any) is unchanged",
                p.asset.filename
            )));
        }
    }
    let bytes = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
    progress(bytes, Some(bytes));
    let (archive2, staging2, plan_exe, version) = (archive.clone(), staging.clone(), p.exe, p.version.clone());
    let tree = tokio::task::spawn_blocking(move || unpack(&archive2, &staging2, plan_exe, &version))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    check_runs(&tree, p.exe).await?;
    swap_in(&tree, &final_dir)?;
    let _ = std::fs::remove_file(&archive);
    tracing::info!(recipe, backend, version = %p.version, secs = t.elapsed().as_secs_f64(), "backend installed");
    Ok((bytes, p.version.clone()))
}

fn io_error(path: &Path, e: std::io::Error) -> ApiError {
    ApiError::Internal(format!("{}: {e}", path.display()))
}

/// Extracts `archive` into a fresh directory under `staging`, checks the executable is there,
/// makes it executable, writes `version.txt`, and syncs every file. Returns the directory.
fn unpack(archive: &Path, staging: &Path, exe: &str, version: &str) -> Result<PathBuf, ApiError> {
    let tree =
        tempfile::Builder::new().prefix("install-").tempdir_in(staging).map_err(|e| io_error(staging, e))?.keep();
    let name = archive.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let bad = |e: String| {
        let _ = std::fs::remove_file(archive);
        ApiError::BackendUnavailable(format!("{name} is not a valid archive ({e}); it was removed"))
    };
    if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        let f = std::fs::File::open(archive).map_err(|e| io_error(archive, e))?;
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        ar.set_preserve_permissions(true);
        ar.set_overwrite(false);
        // `unpack` refuses entries that would land outside `tree` (`..`, absolute paths).
        ar.unpack(&tree).map_err(|e| bad(e.to_string()))?;
    } else if name.ends_with(".zip") {
        let out = std::process::Command::new("unzip")
            .args(["-q", "-o"])
            .arg(archive)
            .arg("-d")
            .arg(&tree)
            .output()
            .map_err(|e| ApiError::BackendUnavailable(format!("cannot run unzip for {name}: {e}")))?;
        if !out.status.success() {
            return Err(bad(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
    } else {
        return Err(bad("unknown archive type".into()));
    }
    // By name, executable bit or not (archives made on Windows may lack it).
    let exe_path = binary::find_file(&tree, exe, &|_| true).ok_or_else(|| bad(format!("it contains no {exe}")))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe_path, std::fs::Permissions::from_mode(0o755)).map_err(|e| io_error(&exe_path, e))?;
    std::fs::write(tree.join("version.txt"), format!("{version}\n")).map_err(|e| io_error(&tree, e))?;
    sync_tree(&tree).map_err(|e| io_error(&tree, e))?;
    Ok(tree)
}

fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            sync_tree(&p)?;
        } else if meta.is_file() {
            std::fs::File::open(&p)?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// The new executable must start: `--version` within 30 s (a wrong-architecture or truncated
/// binary fails here, before it replaces anything).
async fn check_runs(tree: &Path, exe: &str) -> Result<(), ApiError> {
    let path = binary::find_recursive(tree, exe)
        .ok_or_else(|| ApiError::Internal(format!("{exe} vanished from {}", tree.display())))?;
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(&path).arg("--version").kill_on_drop(true).output(),
    )
    .await;
    match out {
        Ok(Ok(o)) if o.status.success() => Ok(()),
        Ok(Ok(o)) => Err(ApiError::BackendUnavailable(format!(
            "the downloaded {exe} does not run ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default()
        ))),
        Ok(Err(e)) => Err(ApiError::BackendUnavailable(format!("the downloaded {exe} does not run: {e}"))),
        Err(_) => Err(ApiError::BackendUnavailable(format!("the downloaded {exe} did not answer --version in 30 s"))),
    }
}

/// Puts `tree` at `final_dir` atomically: exchanged with the old install in one syscall, or
/// renamed when there is none. The old install ends up in the staging area and is removed.
fn swap_in(tree: &Path, final_dir: &Path) -> Result<(), ApiError> {
    let parent = final_dir.parent().expect("backend dir has a parent");
    std::fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
    if final_dir.exists() {
        exchange(tree, final_dir).map_err(|e| io_error(final_dir, e))?;
        // `tree` now holds the old install.
        let _ = std::fs::remove_dir_all(tree);
    } else {
        std::fs::rename(tree, final_dir).map_err(|e| io_error(final_dir, e))?;
    }
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| io_error(parent, e))
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths; renameat2 does not keep them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes `recipe:backend`'s managed directory (after unloading the models that run on it).
/// The directory is first renamed into the staging area, so it disappears in one step.
async fn uninstall(rt: &Runtime, recipe: &str, backend: &str) -> Result<(), ApiError> {
    let (dir, _) = known(recipe, backend)?;
    if backend == "system" {
        return Err(ApiError::bad_request(
            format!("{recipe}:system is the llama-server on PATH; lemonade does not remove it"),
            Some("backend"),
        ));
    }
    let lock = backend_lock(rt, recipe, backend);
    let _guard = lock.lock().await;
    for (r, _) in rt.loaded() {
        let uses = r.info.recipe == recipe
            && r.options.get("llamacpp_backend").and_then(|v| v.as_str()).unwrap_or(&rt.cfg.llamacpp_backend)
                == backend;
        if uses || (r.info.recipe == recipe && recipe != "llamacpp") {
            tracing::info!(model = %r.info.name, "unloading: its backend is being uninstalled");
            let _ = rt.unload(Some(&r.info.name)).await;
        }
    }
    let final_dir = binary::managed_dir(&rt.cfg.cache_dir, dir, backend);
    if !final_dir.exists() {
        return Err(ApiError::BadRequest {
            message: format!("{recipe}:{backend} is not installed"),
            param: Some("backend".into()),
            code: Some("backend_not_installed"),
        });
    }
    let staging = staging_root(&rt.cfg.cache_dir);
    std::fs::create_dir_all(&staging).map_err(|e| io_error(&staging, e))?;
    let gone = staging.join(format!("uninstall-{recipe}-{backend}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&gone);
    std::fs::rename(&final_dir, &gone).map_err(|e| io_error(&final_dir, e))?;
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(gone)).await;
    tracing::info!(recipe, backend, "backend uninstalled");
    Ok(())
}

/// Installs the backend a load needs when it is missing and this platform has a release for
/// it. `Ok(false)`: nothing can be installed (the caller reports the missing binary).
pub async fn auto_install(rt: &Runtime, recipe: &str, backend: &str) -> Result<bool, String> {
    let Ok(p) = plan(rt, recipe, backend) else { return Ok(false) };
    tracing::info!(recipe, backend, "backend not installed: installing it before loading");
    install(rt, &p, &mut |_, _| true).await.map(|_| true).map_err(|e| e.to_string())
}

/// Downloads and installs a backend's pinned release.
#[utoipa::path(post, path = "/api/v1/install", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1. Downloads the pinned release archive of `recipe:backend` for \
        this platform from `LEMONADE_RELEASES_URL` (default https://github.com), verifies it (the pinned sha256 \
        when `<cache>/backend_versions.json` carries one; the executable must run `--version`), and swaps it \
        into `<cache>/bin/<dir>/<backend>/` atomically: an interrupted install leaves the old backend. With \
        `stream: true` the answer is SSE like `pull` (one file); an installed pinned version answers one \
        `complete` event with 0 bytes.",
    request_body = InstallRequest,
    responses(
        (status = 200, description = "Installed (or SSE events)", body = InstallResponse),
        (status = 400, description = "Missing or unknown recipe/backend, or not installable here", body = api_types::ErrorResponse),
        (status = 502, description = "Download or verification failed; the old backend is unchanged", body = api_types::ErrorResponse),
    ))]
pub async fn install_route(State(rt): State<AppState>, body: JsonBody<InstallRequest>) -> Result<Response, ApiError> {
    let req = body.value;
    let (recipe, backend) = required(&req)?;
    let p = plan(&rt, &recipe, &backend)?;
    if req.stream != Some(true) {
        let (_, version) = install(&rt, &p, &mut |_, _| true).await?;
        return Ok(
            Json(InstallResponse { status: "success".into(), recipe, backend, version: Some(version) }).into_response()
        );
    }
    let (tx, rx) = mpsc::channel::<(&'static str, String)>(64);
    let response = crate::pull::sse_events(&rt, rx);
    tokio::spawn(async move {
        let mut progress = crate::pull::progress_events(tx.clone(), p.asset.filename.clone(), 1, 1);
        match install(&rt, &p, &mut progress).await {
            Ok((bytes, _)) => {
                let done = PullProgress {
                    file: p.asset.filename,
                    file_index: 1,
                    total_files: 1,
                    bytes_downloaded: bytes,
                    bytes_total: bytes,
                    percent: 100,
                };
                let _ = tx.send(("complete", serde_json::to_string(&done).unwrap_or_default())).await;
            }
            Err(e) => {
                let _ = tx.send(("error", serde_json::json!({"error": e.to_string()}).to_string())).await;
            }
        }
    });
    Ok(response)
}

/// Removes a managed backend, unloading the models that use it first.
#[utoipa::path(post, path = "/api/v1/uninstall", tag = "Lemonade",
    description = "Also under /api/v0, /v0 and /v1.",
    request_body = InstallRequest,
    responses(
        (status = 200, description = "Uninstalled", body = InstallResponse),
        (status = 400, description = "Missing, unknown or not installed", body = api_types::ErrorResponse),
    ))]
pub async fn uninstall_route(
    State(rt): State<AppState>,
    body: JsonBody<InstallRequest>,
) -> Result<Json<InstallResponse>, ApiError> {
    let (recipe, backend) = required(&body.value)?;
    uninstall(&rt, &recipe, &backend).await?;
    Ok(Json(InstallResponse { status: "success".into(), recipe, backend, version: None }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_swaps_two_directories_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("version.txt"), "new").unwrap();
        std::fs::write(b.join("version.txt"), "old").unwrap();
        swap_in(&a, &b).unwrap();
        assert_eq!(std::fs::read_to_string(b.join("version.txt")).unwrap(), "new");
        assert!(!a.exists(), "the old install is removed");
    }
}
