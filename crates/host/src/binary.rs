//! Where a backend's executable comes from:
//! `LEMONADE_<DIR>_<BACKEND>_BIN` (if the file exists), then the managed install under
//! `<cache>/bin/<dir>/<backend>/` (searched recursively, with `version.txt` beside it). The
//! `system` backend is the executable on `PATH` (never downloaded).

use std::path::{Path, PathBuf};

/// The managed directory of a recipe's backend: `<cache>/bin/<dir>/<backend>`.
pub fn managed_dir(cache_dir: &Path, recipe_dir: &str, backend: &str) -> PathBuf {
    cache_dir.join("bin").join(recipe_dir).join(backend)
}

pub use backends::releases::override_var;

/// How a binary was found, for logs and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Override(String),
    Managed { version: Option<String> },
    Path,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub found: Found,
}

/// Resolves `exe_name` for a recipe/backend. `env` and `path_var` are injected for tests.
pub fn resolve(
    cache_dir: &Path,
    recipe_dir: &str,
    backend: &str,
    exe_name: &str,
    env: impl Fn(&str) -> Option<String>,
    path_var: Option<String>,
) -> Option<Resolved> {
    let var = override_var(recipe_dir, backend);
    if let Some(p) = env(&var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(Resolved { path: p, found: Found::Override(var) });
        }
        tracing::warn!(variable = %var, path = %p.display(), "backend override does not exist; ignored");
    }
    if backend == "system" {
        return std::env::split_paths(&path_var?)
            .map(|d| d.join(exe_name))
            .find(|p| is_executable(p))
            .map(|p| Resolved { path: p, found: Found::Path });
    }
    let dir = managed_dir(cache_dir, recipe_dir, backend);
    if let Some(p) = find_recursive(&dir, exe_name) {
        let version = std::fs::read_to_string(dir.join("version.txt")).ok().map(|v| v.trim().to_string());
        return Some(Resolved { path: p, found: Found::Managed { version } });
    }
    None
}

/// [`resolve`] with this process's environment and `PATH`.
pub fn resolve_from_env(cache_dir: &Path, recipe_dir: &str, backend: &str, exe_name: &str) -> Option<Resolved> {
    resolve(cache_dir, recipe_dir, backend, exe_name, |k| std::env::var(k).ok(), std::env::var("PATH").ok())
}

/// The first executable named `name` under `dir` (files before subfolders, subfolders in order).
pub fn find_recursive(dir: &Path, name: &str) -> Option<PathBuf> {
    find_file(dir, name, &is_executable)
}

/// The first file named `name` under `dir` that `accept` takes, in the order of
/// [`find_recursive`] (which is this with "is executable").
pub fn find_file(dir: &Path, name: &str, accept: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            subdirs.push(p);
        } else if e.file_name() == name && accept(&p) {
            return Some(p);
        }
    }
    subdirs.sort();
    subdirs.into_iter().find_map(|d| find_file(&d, name, accept))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exe(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn override_var_names() {
        assert_eq!(override_var("llamacpp", "cpu"), "LEMONADE_LLAMACPP_CPU_BIN");
        assert_eq!(override_var("sd-cpp", "rocm"), "LEMONADE_SDCPP_ROCM_BIN");
        assert_eq!(override_var("ryzenai-server", "npu"), "LEMONADE_RYZENAISERVER_NPU_BIN");
    }

    #[test]
    fn precedence_override_then_managed_and_path_for_system() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let on_path = tmp.path().join("pathdir/llama-server");
        exe(&on_path);
        let path_var = Some(tmp.path().join("pathdir").display().to_string());
        let no_env = |_: &str| None;

        // PATH is the `system` backend only: `cpu` needs an install.
        assert_eq!(resolve(&cache, "llamacpp", "cpu", "llama-server", no_env, path_var.clone()), None);
        let r = resolve(&cache, "llamacpp", "system", "llama-server", no_env, path_var.clone()).unwrap();
        assert_eq!(r, Resolved { path: on_path.clone(), found: Found::Path });

        let managed = managed_dir(&cache, "llamacpp", "cpu").join("build/bin/llama-server");
        exe(&managed);
        std::fs::write(managed_dir(&cache, "llamacpp", "cpu").join("version.txt"), "b1234\n").unwrap();
        let r = resolve(&cache, "llamacpp", "cpu", "llama-server", no_env, path_var.clone()).unwrap();
        assert_eq!(r, Resolved { path: managed.clone(), found: Found::Managed { version: Some("b1234".into()) } });

        let custom = tmp.path().join("custom-llama");
        exe(&custom);
        let c = custom.display().to_string();
        let env = move |k: &str| (k == "LEMONADE_LLAMACPP_CPU_BIN").then(|| c.clone());
        let r = resolve(&cache, "llamacpp", "cpu", "llama-server", env, path_var.clone()).unwrap();
        assert_eq!(r.path, custom);

        // An override that does not exist is ignored.
        let env = |k: &str| (k == "LEMONADE_LLAMACPP_CPU_BIN").then(|| "/nonexistent/x".to_string());
        let r = resolve(&cache, "llamacpp", "cpu", "llama-server", env, path_var).unwrap();
        assert_eq!(r.path, managed);

        assert!(resolve(&cache, "llamacpp", "vulkan", "llama-server", no_env, None).is_none());
    }
}
