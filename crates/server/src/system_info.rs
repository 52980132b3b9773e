//! `GET system-info` and `GET system-stats`: the machine (sysinfo for OS, CPU and memory; NVML
//! for NVIDIA GPUs; sysfs for AMD GPUs and NPUs) and the state of every recipe's backends.
//!
//! The hardware is detected once per process (it does not change while we run); backend states
//! are computed on every request, so an install or uninstall shows at once.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use axum::extract::{Query, State};
use axum::Json;
use backends::releases::{self, Hardware, Installed};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::routes::AppState;
use crate::runtime::Runtime;

/// What was found once, at the first request.
struct Detected {
    hw: Hardware,
    devices: Value,
    os_version: String,
    processor: String,
    memory: String,
}

static DETECTED: OnceLock<Detected> = OnceLock::new();

fn detected() -> &'static Detected {
    DETECTED.get_or_init(detect)
}

/// The machine as backends see it (for installs and support checks).
pub fn hardware() -> Hardware {
    detected().hw.clone()
}

fn detect() -> Detected {
    use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::nothing().with_cpu(CpuRefreshKind::nothing()).with_memory(MemoryRefreshKind::nothing().with_ram()),
    );
    let mut hw = Hardware::this_platform();
    let cpus = sys.as_ref().map(|s| s.cpus()).unwrap_or_default();
    let processor = cpus.first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
    let threads = cpus.len();
    let cores = System::physical_core_count().unwrap_or(threads);
    let mut devices = Map::new();
    devices.insert(
        "cpu".into(),
        json!({"name": processor, "cores": cores, "threads": threads, "available": true, "family": hw.cpu_family}),
    );

    let (igpu, dgpus) = amd_gpus(Path::new("/sys/class/kfd/kfd/topology/nodes"));
    if let Some(g) = &igpu {
        hw.amd_igpu = Some(g["family"].as_str().unwrap_or_default().to_string());
        devices.insert("amd_igpu".into(), g.clone());
    }
    hw.amd_dgpus = dgpus.iter().filter_map(|g| g["family"].as_str().map(str::to_string)).collect();
    devices.insert("amd_dgpu".into(), Value::Array(dgpus));

    match nvidia_gpus() {
        Ok(list) => {
            hw.nvidia_gpus = list.len();
            devices.insert("nvidia_dgpu".into(), Value::Array(list));
        }
        Err(e) => {
            devices.insert("nvidia_dgpu".into(), json!([]));
            devices.insert("nvidia_dgpu_error".into(), json!(e));
        }
    }
    let npu = amd_npu(Path::new("/sys/class/accel"), &processor);
    hw.xdna2_npu = npu["family"] == "XDNA2" && npu["available"] == true;
    devices.insert("amd_npu".into(), npu);

    let os_version = format!(
        "{}-{}{}",
        System::name().unwrap_or_else(|_| std::env::consts::OS.into()),
        System::kernel_version().unwrap_or_default(),
        System::os_version().map(|v| format!("-{v}")).unwrap_or_default()
    );
    let total = sys.as_ref().map(|s| s.total_memory()).unwrap_or_default();
    let memory = format!("{:.2} GB", total as f64 / (1u64 << 30) as f64);
    Detected { hw, devices: Value::Object(devices), os_version, processor, memory }
}

/// AMD GPUs from the KFD topology (`gfx_target_version` = major·10000 + minor·100 + stepping).
/// gfx1150/gfx1151 are the integrated GPUs v9 knows; gfx110x/gfx120x are grouped as v9's
/// `gfx110X`/`gfx120X` discrete families.
fn amd_gpus(nodes: &Path) -> (Option<Value>, Vec<Value>) {
    let mut igpu = None;
    let mut dgpus = Vec::new();
    let Ok(entries) = std::fs::read_dir(nodes) else { return (None, dgpus) };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for node in entries {
        let Ok(props) = std::fs::read_to_string(node.join("properties")) else { continue };
        let prop =
            |k: &str| props.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or_default();
        let (v, simd) = (prop("gfx_target_version "), prop("simd_count "));
        if v == 0 || simd == 0 {
            continue; // a CPU node
        }
        let (major, minor, step) = (v / 10000, (v / 100) % 100, v % 100);
        let gfx = format!("gfx{major}{minor:x}{step:x}");
        let name = std::fs::read_to_string(node.join("name")).map(|n| n.trim().to_string()).unwrap_or_default();
        let vram_gb = std::fs::read_dir(node.join("mem_banks"))
            .map(|banks| {
                banks
                    .filter_map(|b| b.ok())
                    .filter_map(|b| std::fs::read_to_string(b.path().join("properties")).ok())
                    .filter_map(|p| {
                        p.lines().find_map(|l| l.strip_prefix("size_in_bytes ")?.trim().parse::<u64>().ok())
                    })
                    .sum::<u64>() as f64
                    / (1u64 << 30) as f64
            })
            .unwrap_or_default();
        let name = if name.is_empty() { format!("AMD Radeon Graphics ({gfx})") } else { name };
        match gfx.as_str() {
            "gfx1150" | "gfx1151" | "gfx1152" | "gfx1103" | "gfx1035" | "gfx1036" if igpu.is_none() => {
                igpu = Some(json!({"name": name, "vram_gb": vram_gb, "available": true, "family": gfx}))
            }
            _ => {
                let family = match &gfx[..gfx.len().min(6)] {
                    "gfx110" => "gfx110X".to_string(),
                    "gfx120" => "gfx120X".to_string(),
                    _ => gfx.clone(),
                };
                dgpus.push(json!({"name": name, "vram_gb": vram_gb, "available": true, "family": family}));
            }
        }
    }
    (igpu, dgpus)
}

fn nvidia_gpus() -> Result<Vec<Value>, String> {
    let nvml = crate::admin::nvml()?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let count = nvml.device_count().map_err(|e| format!("NVML device count failed: {e}"))?;
    Ok((0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .map(|d| {
            let vram = d.memory_info().map(|m| m.total as f64 / (1u64 << 30) as f64).unwrap_or_default();
            json!({"name": d.name().unwrap_or_default(), "available": true, "vram_gb": vram, "driver_version": driver})
        })
        .collect())
}

/// An AMD NPU through the `amdxdna` accel driver: PCI 0x17f0 is XDNA 2 (Strix), 0x1502 XDNA 1.
fn amd_npu(accel: &Path, processor: &str) -> Value {
    let found = std::fs::read_dir(accel).ok().and_then(|entries| {
        entries.filter_map(|e| e.ok()).find_map(|e| {
            let dev = e.path().join("device");
            let driver = std::fs::read_link(dev.join("driver")).ok()?;
            if !driver.ends_with("amdxdna") {
                return None;
            }
            Some(std::fs::read_to_string(dev.join("device")).unwrap_or_default().trim().to_string())
        })
    });
    match found {
        Some(id) => {
            let family = if id == "0x1502" { "XDNA" } else { "XDNA2" };
            json!({"name": processor, "available": true, "family": family})
        }
        None => json!({"name": "AMD NPU", "available": false, "family": "", "error": "No AMD NPU found"}),
    }
}

/// What is installed for `recipe:backend` (override, managed directory or PATH).
pub fn installed(rt: &Runtime, recipe: &str, backend: &str) -> Installed {
    let Some((dir, exe)) = releases::recipe_dir_and_exe(recipe) else { return Installed::Missing };
    match backends::binary::resolve_from_env(&rt.cfg.cache_dir, dir, backend, exe) {
        None => Installed::Missing,
        Some(r) => match r.found {
            backends::binary::Found::Override(var) => Installed::Override(var),
            backends::binary::Found::Managed { version } => Installed::Managed(version),
            backends::binary::Found::Path => Installed::System(r.path.display().to_string()),
        },
    }
}

/// The `recipes` section: every recipe with every backend's state.
pub fn recipes(rt: &Runtime) -> Value {
    let hw = hardware();
    let pins = crate::install::pins(&rt.cfg.cache_dir);
    let mut out = Map::new();
    for (recipe, list) in releases::RECIPES {
        let mut backends_json = Map::new();
        let mut default_backend = None;
        for backend in *list {
            let inst = installed(rt, recipe, backend);
            let (devices, st) = releases::state(&hw, &pins, recipe, backend, &inst);
            if st.state != "unsupported" && default_backend.is_none() {
                default_backend = Some(backend.to_string());
            }
            let asset = releases::asset(&hw, recipe, backend, &st.version);
            backends_json.insert(
                backend.to_string(),
                json!({
                    "devices": devices,
                    "state": st.state,
                    "message": st.message,
                    "action": st.action,
                    "version": st.version,
                    "release_url": asset.as_ref().map(|a| a.release_url()).unwrap_or_default(),
                    "download_filename": asset.as_ref().map(|a| a.filename.clone()).unwrap_or_default(),
                    "can_uninstall": matches!(inst, Installed::Managed(_)),
                }),
            );
        }
        // llama.cpp models run on the configured backend, so that is the default we report.
        if *recipe == "llamacpp" {
            default_backend = Some(rt.cfg.llamacpp_backend.clone());
        }
        out.insert(
            recipe.to_string(),
            json!({"default_backend": default_backend.unwrap_or_default(), "backends": backends_json}),
        );
    }
    Value::Object(out)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct SystemInfoQuery {
    /// Add details: versions, paths, the backend binaries in use, free memory.
    #[serde(default)]
    pub verbose: Option<String>,
}

/// Hardware and backend states.
#[utoipa::path(get, path = "/api/v1/system-info", tag = "System", params(SystemInfoQuery),
    description = "`OS Version`, `Processor`, `Physical Memory`, `devices` (cpu; amd_igpu, amd_dgpu, nvidia_dgpu, \
        amd_npu with `available` flags) and `recipes` (each backend's `state`: unsupported, installable, \
        update_required or installed). A machine without GPUs answers 200 with empty lists.",
    responses((status = 200, description = "System information", body = Object)))]
pub async fn system_info(State(rt): State<AppState>, Query(q): Query<SystemInfoQuery>) -> Json<Value> {
    let rt2 = rt.clone();
    let v = tokio::task::spawn_blocking(move || {
        let d = detected();
        let mut v = json!({
            "OS Version": d.os_version,
            "Processor": d.processor,
            "Physical Memory": d.memory,
            "devices": d.devices,
            "recipes": recipes(&rt2),
        });
        if q.verbose.as_deref().is_some_and(|s| matches!(s, "true" | "1" | "yes")) {
            v["details"] = verbose_details(&rt2);
        }
        v
    })
    .await
    .unwrap_or_else(|e| json!({"error": e.to_string()}));
    Json(v)
}

fn verbose_details(rt: &Runtime) -> Value {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()));
    let mut bins = Map::new();
    for (recipe, list) in releases::RECIPES {
        let Some((dir, exe)) = releases::recipe_dir_and_exe(recipe) else { continue };
        for backend in *list {
            if let Some(r) = backends::binary::resolve_from_env(&rt.cfg.cache_dir, dir, backend, exe) {
                bins.insert(format!("{recipe}:{backend}"), json!(r.path.display().to_string()));
            }
        }
    }
    json!({
        "lemonade_version": crate::VERSION,
        "kernel": System::kernel_long_version().ok(),
        "host_name": System::host_name().ok(),
        "cpu_arch": System::cpu_arch(),
        "available_memory_gb": sys.map(|s| s.available_memory() as f64 / (1u64 << 30) as f64).ok(),
        "cache_dir": rt.cfg.cache_dir.display().to_string(),
        "hf_cache": rt.cfg.hf_cache.display().to_string(),
        "releases_url": crate::install::releases_url(),
        "backend_binaries": bins,
        "llamacpp_backend": rt.cfg.llamacpp_backend,
    })
}

static CPU: Mutex<Option<Result<sysinfo::System, String>>> = Mutex::new(None);

/// CPU (since the previous call) and memory use.
#[utoipa::path(get, path = "/api/v1/system-stats", tag = "System",
    description = "`cpu_percent` is the use since the previous call (0 on the first). GPU figures are null \
        where no AMD GPU reports them.",
    responses((status = 200, description = "Usage", body = Object)))]
pub async fn system_stats() -> Json<Value> {
    let v = tokio::task::spawn_blocking(|| {
        let mut guard = CPU.lock().unwrap_or_else(|e| e.into_inner());
        let first = guard.is_none();
        let sys = match guard.get_or_insert_with(|| sysinfo::System::new().map_err(|e| e.to_string())) {
            Ok(s) => s,
            Err(e) => {
                return json!({"cpu_percent": null, "memory_gb": null, "gpu_percent": null, "vram_gb": null, "error": e})
            }
        };
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        let cpu = if first { 0.0 } else { sys.global_cpu_usage() as f64 };
        json!({
            "cpu_percent": cpu,
            "memory_gb": sys.used_memory() as f64 / (1u64 << 30) as f64,
            "gpu_percent": null,
            "vram_gb": null,
        })
    })
    .await
    .unwrap_or_else(|e| json!({"error": e.to_string()}));
    Json(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kfd_topology_classifies_igpus_and_dgpus() {
        let tmp = tempfile::tempdir().unwrap();
        let node = |n: &str, props: &str| {
            let d = tmp.path().join(n);
            std::fs::create_dir_all(d.join("mem_banks/0")).unwrap();
            std::fs::write(d.join("properties"), props).unwrap();
            std::fs::write(d.join("mem_banks/0/properties"), "heap_type 1\nsize_in_bytes 536870912\n").unwrap();
        };
        node("0", "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n");
        node("1", "simd_count 80\ngfx_target_version 110501\n");
        node("2", "simd_count 96\ngfx_target_version 110000\n");
        node("3", "simd_count 64\ngfx_target_version 120001\n");
        let (igpu, dgpus) = amd_gpus(tmp.path());
        let igpu = igpu.unwrap();
        assert_eq!((igpu["family"].as_str(), igpu["vram_gb"].as_f64()), (Some("gfx1151"), Some(0.5)));
        let families: Vec<_> = dgpus.iter().map(|g| g["family"].as_str().unwrap()).collect();
        assert_eq!(families, ["gfx110X", "gfx120X"]);
        assert_eq!(amd_gpus(&tmp.path().join("none")), (None, vec![]));
    }

    #[test]
    fn no_npu_is_reported_unavailable() {
        let tmp = tempfile::tempdir().unwrap();
        let v = amd_npu(tmp.path(), "cpu");
        assert_eq!(v["available"], false);
    }
}
