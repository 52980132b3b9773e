//! What the machine has: OS, CPU and memory (sysinfo), NVIDIA GPUs (NVML, loaded at run time,
//! so a machine without the driver just has none), AMD GPUs and NPUs (sysfs: the KFD topology
//! and the `amdxdna` accel driver, which no crate covers). Detected once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use parking_lot::Mutex;

use api_types::{CpuDevice, Devices, GpuDevice, GpuInfo, NpuDevice, SystemStats};
use backends::Hardware;

/// What was found once, at the first call.
#[derive(Debug, Clone)]
pub struct Detected {
    pub hw: Hardware,
    pub devices: Devices,
    pub os_version: String,
    pub processor: String,
    pub memory: String,
}

static DETECTED: OnceLock<Detected> = OnceLock::new();

/// The machine, detected at the first call (blocking: a few sysfs reads and NVML's init).
pub fn detected() -> &'static Detected {
    DETECTED.get_or_init(detect)
}

/// The machine as backends see it (for installs, support checks and adapters).
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
    let cpu = CpuDevice { name: processor.clone(), cores, threads, available: true, family: hw.cpu_family.clone() };

    let root = sys_root();
    let (igpu, amd_dgpu) = amd_gpus(&root.join("class/kfd/kfd/topology/nodes"));
    let amd_igpu = match igpu {
        Some(g) => {
            hw.amd_igpu = Some(g.family.clone());
            g
        }
        None => GpuDevice { error: Some("No AMD integrated GPU found".into()), ..GpuDevice::default() },
    };
    hw.amd_dgpus = amd_dgpu.iter().map(|g| g.family.clone()).collect();
    let (nvidia_dgpu, nvidia_dgpu_error) = match nvidia_gpus() {
        Ok(list) => (list, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    hw.nvidia_gpus = nvidia_dgpu.len();
    let amd_npu = amd_npu(&root.join("class/accel"), &processor);
    hw.xdna2_npu = amd_npu.family == "XDNA2" && amd_npu.available;

    let os_version = format!(
        "{}-{}{}",
        System::name().unwrap_or_else(|_| std::env::consts::OS.into()),
        System::kernel_version().unwrap_or_default(),
        System::os_version().map(|v| format!("-{v}")).unwrap_or_default()
    );
    let total = sys.as_ref().map(|s| s.total_memory()).unwrap_or_default();
    let memory = format!("{:.2} GB", total as f64 / (1u64 << 30) as f64);
    let amd_gpu = std::iter::once(&amd_igpu).filter(|g| g.available).chain(&amd_dgpu).cloned().collect();
    let devices = Devices { cpu, amd_igpu, amd_dgpu, amd_gpu, nvidia_dgpu, nvidia_dgpu_error, amd_npu };
    Detected { hw, devices, os_version, processor, memory }
}

/// AMD GPUs from the KFD topology (`gfx_target_version` = major·10000 + minor·100 + stepping).
/// gfx1150/gfx1151 are the integrated GPUs v9 knows; gfx110x/gfx120x are grouped as v9's
/// `gfx110X`/`gfx120X` discrete families.
pub fn amd_gpus(nodes: &Path) -> (Option<GpuDevice>, Vec<GpuDevice>) {
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
        let device =
            |family: String| GpuDevice { name: name.clone(), available: true, vram_gb, family, ..Default::default() };
        match gfx.as_str() {
            g if is_igpu(g) && igpu.is_none() => igpu = Some(device(gfx.clone())),
            _ => {
                let family = match &gfx[..gfx.len().min(6)] {
                    "gfx110" => "gfx110X".to_string(),
                    "gfx120" => "gfx120X".to_string(),
                    _ => gfx.clone(),
                };
                dgpus.push(device(family));
            }
        }
    }
    (igpu, dgpus)
}

/// The integrated GPUs v9 knows (and their older kin), by gfx target.
pub fn is_igpu(gfx: &str) -> bool {
    matches!(gfx, "gfx1150" | "gfx1151" | "gfx1152" | "gfx1103" | "gfx1035" | "gfx1036")
}

/// Each NVIDIA GPU's name and memory from NVML (none without the driver).
pub fn nvidia_memory() -> Vec<NvidiaGpu> {
    let Ok(nvml) = nvml() else { return Vec::new() };
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .filter_map(|d| {
            let m = d.memory_info().ok()?;
            Some(NvidiaGpu {
                name: d.name().unwrap_or_default(),
                total_bytes: m.total,
                used_bytes: m.used,
                free_bytes: Some(m.free),
            })
        })
        .collect()
}

/// Why no NVIDIA GPU is listed (shown as `gpu-memory`'s and the hardware's `error`).
#[derive(Debug, thiserror::Error)]
enum NoNvidia {
    #[error("NVML is unavailable: {0}")]
    Unavailable(&'static nvml_wrapper::error::NvmlError),
    #[error("NVML device count failed: {0}")]
    Count(nvml_wrapper::error::NvmlError),
}

static NVML: OnceLock<Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError>> = OnceLock::new();

/// The NVML library, loaded once; the error says why it is unavailable (no driver here).
fn nvml() -> Result<&'static nvml_wrapper::Nvml, NoNvidia> {
    NVML.get_or_init(nvml_wrapper::Nvml::init).as_ref().map_err(NoNvidia::Unavailable)
}

fn nvidia_gpus() -> Result<Vec<GpuDevice>, NoNvidia> {
    let nvml = nvml()?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let count = nvml.device_count().map_err(NoNvidia::Count)?;
    Ok((0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .map(|d| GpuDevice {
            name: d.name().unwrap_or_default(),
            available: true,
            vram_gb: d.memory_info().map(|m| m.total as f64 / (1u64 << 30) as f64).unwrap_or_default(),
            driver_version: Some(driver.clone()),
            ..Default::default()
        })
        .collect())
}

/// NVIDIA GPU memory now (blocking), or why there is none.
pub fn gpu_memory() -> (Vec<GpuInfo>, Option<String>) {
    let nvml = match nvml() {
        Ok(n) => n,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => return (Vec::new(), Some(NoNvidia::Count(e).to_string())),
    };
    let mut out = Vec::new();
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        let (Ok(name), Ok(mem)) = (d.name(), d.memory_info()) else { continue };
        let (used, total) = (mem.used >> 20, mem.total >> 20);
        out.push(GpuInfo {
            index: i,
            name,
            used_mib: used,
            total_mib: total,
            used_over_total: format!("{used}MiB / {total}MiB"),
        });
    }
    (out, None)
}

/// An AMD NPU through the `amdxdna` accel driver: PCI 0x17f0 is XDNA 2 (Strix), 0x1502 XDNA 1.
pub fn amd_npu(accel: &Path, processor: &str) -> NpuDevice {
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
        Some(id) => NpuDevice {
            name: processor.to_string(),
            available: true,
            family: if id == "0x1502" { "XDNA" } else { "XDNA2" }.into(),
            error: None,
        },
        None => NpuDevice {
            name: "AMD NPU".into(),
            available: false,
            family: String::new(),
            error: Some("No AMD NPU found".into()),
        },
    }
}

/// Total RAM in GB from /proc/meminfo (Linux), for the catalogue's size filter.
pub fn physical_memory_gb() -> Option<f64> {
    Some(kib_field("/proc/meminfo", "MemTotal:")? as f64 / 1024.0 / 1024.0)
}

/// The `key  N kB` line of a /proc file, in KiB.
fn kib_field(file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(file).ok()?;
    s.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

/// Kernel, host name, CPU architecture and free memory, for `system-info?verbose`.
pub fn details() -> (Option<String>, Option<String>, String, Option<f64>) {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()));
    (
        System::kernel_long_version().ok(),
        System::host_name().ok(),
        System::cpu_arch(),
        sys.map(|s| s.available_memory() as f64 / (1u64 << 30) as f64).ok(),
    )
}

static CPU: Mutex<Option<Result<sysinfo::System, String>>> = Mutex::new(None);

/// CPU use since the previous call (0 on the first) and memory in use (blocking).
pub fn usage() -> SystemStats {
    let mut guard = CPU.lock();
    let first = guard.is_none();
    let sys = match guard.get_or_insert_with(|| sysinfo::System::new().map_err(|e| e.to_string())) {
        Ok(s) => s,
        Err(e) => return SystemStats { error: Some(e.clone()), ..Default::default() },
    };
    sys.refresh_cpu_usage();
    sys.refresh_memory();
    SystemStats {
        cpu_percent: Some(if first { 0.0 } else { sys.global_cpu_usage() as f64 }),
        memory_gb: Some(sys.used_memory() as f64 / (1u64 << 30) as f64),
        gpu_percent: None,
        vram_gb: None,
        error: None,
    }
}

/// Memory available for new processes now (MemAvailable), in bytes.
pub fn available_memory() -> Option<u64> {
    Some(kib_field("/proc/meminfo", "MemAvailable:")? * 1024)
}

/// `--memory-budget auto`: what is available now, less a margin for everything else (a
/// tenth, at least 1 GiB).
pub fn auto_memory_budget() -> Option<u64> {
    let avail = available_memory()?;
    Some(avail.saturating_sub((avail / 10).max(1 << 30)))
}

/// Free and total VRAM in bytes, summed over the NVIDIA GPUs (NVML) and the AMD ones (the
/// amdgpu driver's sysfs counters); None: no GPU reports any.
pub fn vram() -> Option<(u64, u64)> {
    let gpus = nvidia_memory();
    let nvidia = (!gpus.is_empty()).then(|| gpus.iter().fold((0, 0), |(f, t), g| (f + g.free(), t + g.total_bytes)));
    let amd = amd_vram(Path::new("/sys/class/drm"));
    match (nvidia, amd) {
        (Some((f1, t1)), Some((f2, t2))) => Some((f1 + f2, t1 + t2)),
        (one, other) => one.or(other),
    }
}

/// Free and total VRAM of the amdgpu cards under `drm` (`card*/device/mem_info_vram_*`).
pub fn amd_vram(drm: &Path) -> Option<(u64, u64)> {
    let read = |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut found = None;
    for e in std::fs::read_dir(drm).ok()?.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        // card0, card1 … (not card0-DP-1 connectors, nor renderD128).
        if !name.strip_prefix("card").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let dev = e.path().join("device");
        let (Some(total), Some(used)) = (read(&dev.join("mem_info_vram_total")), read(&dev.join("mem_info_vram_used")))
        else {
            continue;
        };
        let (f, t) = found.unwrap_or((0, 0));
        found = Some((f + total.saturating_sub(used), t + total));
    }
    found
}

/// `--vram-budget auto`: the VRAM free now less a margin (a tenth, at least 512 MiB); None
/// when there is no GPU.
pub fn auto_vram_budget() -> Option<u64> {
    let (free, _) = vram()?;
    Some(free.saturating_sub((free / 10).max(512 << 20)))
}

/// Bytes of NVIDIA GPU memory process `pid` holds, summed over the GPUs (NVML's compute and
/// graphics processes); None without NVML or when it holds none there.
pub fn process_vram(pid: u32) -> Option<u64> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let nvml = nvml().ok()?;
    let mut held = None::<u64>;
    for i in 0..nvml.device_count().ok()? {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        let procs = d.running_compute_processes().unwrap_or_default().into_iter();
        for p in procs.chain(d.running_graphics_processes().unwrap_or_default()).filter(|p| p.pid == pid) {
            if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                held = Some(held.unwrap_or(0) + b);
            }
        }
    }
    held
}

/// Bytes resident in memory of process `pid` (VmRSS), for measuring the estimate.
pub fn process_rss(pid: u32) -> Option<u64> {
    Some(kib_field(&format!("/proc/{pid}/status"), "VmRSS:")? * 1024)
}

/// One NVIDIA GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct NvidiaGpu {
    pub name: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// What NVML reports free (total less used and reserved); the stand-in may leave it out.
    #[serde(default)]
    pub free_bytes: Option<u64>,
}

impl NvidiaGpu {
    pub fn free(&self) -> u64 {
        self.free_bytes.unwrap_or(self.total_bytes.saturating_sub(self.used_bytes))
    }
}

/// The stand-in root, if one is set.
pub(crate) fn stand_in_root() -> Option<PathBuf> {
    std::env::var_os("LEMONADE_HARDWARE_ROOT").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The root of sysfs: `/sys`, or the stand-in tree's `sys`.
pub fn sys_root() -> PathBuf {
    stand_in_root().map_or_else(|| PathBuf::from("/sys"), |r| r.join("sys"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_vram_sums_the_amdgpu_cards_and_skips_connectors_and_other_drivers() {
        let tmp = tempfile::tempdir().unwrap();
        let card = |n: &str, files: &[(&str, &str)]| {
            let d = tmp.path().join(n).join("device");
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), v).unwrap();
            }
        };
        assert_eq!(amd_vram(tmp.path()), None, "no card");
        card("card0", &[("mem_info_vram_total", "17163091968\n"), ("mem_info_vram_used", "1073741824\n")]);
        card("card1", &[("mem_info_vram_total", "536870912"), ("mem_info_vram_used", "268435456")]);
        card("card0-DP-1", &[("mem_info_vram_total", "999"), ("mem_info_vram_used", "0")]);
        card("card2", &[("vendor", "0x10de")]); // not amdgpu: no counters
        card("renderD128", &[("mem_info_vram_total", "999"), ("mem_info_vram_used", "0")]);
        assert_eq!(amd_vram(tmp.path()), Some((17163091968 - 1073741824 + 268435456, 17163091968 + 536870912)));
        assert_eq!(amd_vram(&tmp.path().join("none")), None);
    }

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
        assert_eq!((igpu.family.as_str(), igpu.vram_gb), ("gfx1151", 0.5));
        let families: Vec<_> = dgpus.iter().map(|g| g.family.as_str()).collect();
        assert_eq!(families, ["gfx110X", "gfx120X"]);
        assert_eq!(amd_gpus(&tmp.path().join("none")), (None, vec![]));
    }

    #[test]
    fn no_npu_is_reported_unavailable() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!amd_npu(tmp.path(), "cpu").available);
    }
}
