//! `system-info` and `system-stats`: the machine (sysinfo for OS, CPU and memory; NVML for
//! NVIDIA GPUs; sysfs for AMD GPUs and NPUs) and the state of every recipe's backends. The
//! hardware is detected once per process (it does not change while we run); backend states are
//! computed on every call, so an install or uninstall shows at once. Both read files: call them
//! off the async threads.

use std::collections::BTreeMap;

use api_types::{SystemDetails, SystemInfo, SystemStats};
use backends::releases;
use host::binary;

use crate::Engine;

/// The machine and every recipe's backends; with `verbose`, versions, paths, the binaries in
/// use and the free memory (blocking).
pub fn info(rt: &Engine, verbose: bool) -> SystemInfo {
    let d = host::hardware::detected();
    SystemInfo {
        os_version: d.os_version.clone(),
        processor: d.processor.clone(),
        physical_memory: d.memory.clone(),
        devices: d.devices.clone(),
        compute_devices: rt.lifecycle.devices().to_vec(),
        recipes: crate::installs::recipes(&rt.cfg),
        details: verbose.then(|| details(rt)),
        cloud: crate::cloud::info(rt),
    }
}

fn details(rt: &Engine) -> SystemDetails {
    let mut backend_binaries = BTreeMap::new();
    for (recipe, list) in releases::recipes() {
        let (dir, exe) = recipe.dir_and_exe();
        for backend in list {
            if let Some(r) = binary::resolve_from_env(&rt.cfg.cache_dir, dir, backend, exe) {
                backend_binaries.insert(format!("{recipe}:{backend}"), r.path.display().to_string());
            }
        }
    }
    let (kernel, host_name, cpu_arch, available_memory_gb) = host::hardware::details();
    SystemDetails {
        lemonade_version: crate::VERSION.into(),
        kernel,
        host_name,
        cpu_arch,
        available_memory_gb,
        cache_dir: rt.cfg.cache_dir.display().to_string(),
        hf_cache: rt.cfg.hf_cache.display().to_string(),
        releases_url: host::install::releases_url(),
        backend_binaries,
        llamacpp_backend: rt.cfg.live.llamacpp_backend(),
    }
}

/// CPU use since the previous call and memory in use (blocking).
pub fn stats() -> SystemStats {
    host::hardware::usage()
}
