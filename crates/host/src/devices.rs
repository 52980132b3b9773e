//! Each GPU and NPU models can be placed on, with its memory: NVIDIA GPUs from NVML, AMD GPUs
//! from the KFD topology and the amdgpu driver's sysfs counters (VRAM and GTT), the AMD NPU
//! from the `amdxdna` accel driver.
//!
//! `LEMONADE_HARDWARE_ROOT` points all of it at a stand-in tree, for tests on machines without
//! the hardware: sysfs under `ROOT/sys`, and `ROOT/nvml.json` answering for NVML (a list of
//! `{"name", "total_bytes", "used_bytes"}`).

use std::path::{Path, PathBuf};

use api_types::ComputeDevice;

use crate::hardware::stand_in_root;
pub use crate::hardware::{sys_root, NvidiaGpu};

/// The devices of this machine now (blocking: sysfs reads and NVML queries).
pub fn compute_devices() -> Vec<ComputeDevice> {
    match stand_in_root() {
        Some(root) => {
            let nvml = std::fs::read_to_string(root.join("nvml.json")).ok();
            let nvidia = nvml.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
            enumerate(&root.join("sys"), nvidia)
        }
        None => enumerate(Path::new("/sys"), crate::hardware::nvidia_memory()),
    }
}

/// The devices under the sysfs root `sys`, with NVML's GPUs: NVIDIA first (`gpu0`…, in NVML
/// order, which is CUDA's), then AMD in KFD order (HIP's), then the NPU. Vulkan indices follow
/// the same order.
pub fn enumerate(sys: &Path, nvidia: Vec<NvidiaGpu>) -> Vec<ComputeDevice> {
    let mut out: Vec<ComputeDevice> = Vec::new();
    for (i, g) in nvidia.into_iter().enumerate() {
        out.push(ComputeDevice {
            id: format!("gpu{}", out.len()),
            kind: "gpu".into(),
            vendor: "nvidia".into(),
            free_bytes: Some(g.free()),
            name: g.name,
            integrated: false,
            total_bytes: g.total_bytes,
            cuda_index: Some(i as u32),
            hip_index: None,
            vulkan_index: Some(out.len() as u32),
            source: "nvml".into(),
        });
    }
    for (j, g) in amd_gpus(sys).into_iter().enumerate() {
        out.push(ComputeDevice {
            id: format!("gpu{}", out.len()),
            hip_index: Some(j as u32),
            vulkan_index: Some(out.len() as u32),
            ..g
        });
    }
    if let Some(name) = amd_npu(&sys.join("class/accel")) {
        out.push(ComputeDevice {
            id: "npu0".into(),
            kind: "npu".into(),
            vendor: "amd".into(),
            name,
            source: "amdxdna".into(),
            ..ComputeDevice::default()
        });
    }
    out
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// AMD GPUs from the KFD topology, each with the amdgpu counters of its render node: a
/// discrete GPU has its VRAM; an integrated one its VRAM carve-out plus the GTT it may map.
fn amd_gpus(sys: &Path) -> Vec<ComputeDevice> {
    let Ok(nodes) = std::fs::read_dir(sys.join("class/kfd/kfd/topology/nodes")) else { return Vec::new() };
    let mut nodes: Vec<PathBuf> = nodes.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    nodes.sort_by_key(|p| p.file_name().and_then(|n| n.to_str()?.parse::<u32>().ok()).unwrap_or(u32::MAX));
    let mut out = Vec::new();
    for node in nodes {
        let Ok(props) = std::fs::read_to_string(node.join("properties")) else { continue };
        let prop = |k: &str| props.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok());
        let (Some(v), Some(simd)) = (prop("gfx_target_version "), prop("simd_count ")) else { continue };
        if v == 0 || simd == 0 {
            continue; // a CPU node
        }
        let gfx = format!("gfx{}{:x}{:x}", v / 10000, (v / 100) % 100, v % 100);
        let dev = sys.join(format!("class/drm/renderD{}/device", prop("drm_render_minor ").unwrap_or(0)));
        let counter = |f: &str| read_u64(&dev.join(f));
        let integrated = crate::hardware::is_igpu(&gfx);
        let (vram, vram_used) = (counter("mem_info_vram_total").unwrap_or(0), counter("mem_info_vram_used"));
        let (gtt, gtt_used) = (counter("mem_info_gtt_total").unwrap_or(0), counter("mem_info_gtt_used"));
        let (total, used) =
            if integrated { (vram + gtt, vram_used.zip(gtt_used).map(|(a, b)| a + b)) } else { (vram, vram_used) };
        let name = std::fs::read_to_string(dev.join("product_name"))
            .map(|n| n.trim().to_string())
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("AMD Radeon Graphics ({gfx})"));
        out.push(ComputeDevice {
            kind: "gpu".into(),
            vendor: "amd".into(),
            name,
            integrated,
            total_bytes: total,
            free_bytes: used.map(|u| total.saturating_sub(u)),
            source: "amdgpu sysfs".into(),
            ..ComputeDevice::default()
        });
    }
    out
}

/// The name of the NPU bound to the `amdxdna` accel driver, if there is one.
fn amd_npu(accel: &Path) -> Option<String> {
    let entries = std::fs::read_dir(accel).ok()?;
    entries.filter_map(|e| e.ok()).find_map(|e| {
        let dev = e.path().join("device");
        std::fs::read_link(dev.join("driver")).ok()?.ends_with("amdxdna").then(|| {
            let id = std::fs::read_to_string(dev.join("device")).unwrap_or_default();
            if id.trim() == "0x1502" { "AMD XDNA NPU" } else { "AMD XDNA 2 NPU" }.to_string()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A sysfs tree with one AMD discrete GPU (KFD node 1, render node 129), a CPU node, and
    /// an NPU bound to `amdxdna`.
    pub fn fake_sys(root: &Path) {
        let write = |p: &str, s: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        let nodes = "class/kfd/kfd/topology/nodes";
        write(&format!("{nodes}/0/properties"), "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n");
        write(&format!("{nodes}/1/properties"), "simd_count 96\ngfx_target_version 110000\ndrm_render_minor 129\n");
        let dev = "class/drm/renderD129/device";
        write(&format!("{dev}/mem_info_vram_total"), &(24 * GIB).to_string());
        write(&format!("{dev}/mem_info_vram_used"), &GIB.to_string());
        write(&format!("{dev}/product_name"), "Radeon RX 7900 XTX\n");
        let npu = root.join("class/accel/accel0/device");
        std::fs::create_dir_all(&npu).unwrap();
        std::fs::write(npu.join("device"), "0x17f0\n").unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/amdxdna", npu.join("driver")).unwrap();
    }

    #[test]
    fn two_nvidia_gpus_and_one_amd_gpu_and_the_npu_each_get_an_id_memory_and_indices() {
        let tmp = tempfile::tempdir().unwrap();
        fake_sys(tmp.path());
        let nvidia = vec![
            NvidiaGpu {
                name: "NVIDIA GeForce RTX 4090".into(),
                total_bytes: 24 * GIB,
                used_bytes: 2 * GIB,
                free_bytes: None,
            },
            NvidiaGpu { name: "NVIDIA RTX A2000".into(), total_bytes: 12 * GIB, used_bytes: 0, free_bytes: None },
        ];
        let d = enumerate(tmp.path(), nvidia);
        let ids: Vec<(&str, &str, &str)> =
            d.iter().map(|d| (d.id.as_str(), d.kind.as_str(), d.vendor.as_str())).collect();
        assert_eq!(
            ids,
            [("gpu0", "gpu", "nvidia"), ("gpu1", "gpu", "nvidia"), ("gpu2", "gpu", "amd"), ("npu0", "npu", "amd")]
        );
        assert_eq!(
            (d[0].total_bytes, d[0].free_bytes, d[0].cuda_index, d[0].vulkan_index),
            (24 * GIB, Some(22 * GIB), Some(0), Some(0))
        );
        assert_eq!((d[1].cuda_index, d[1].hip_index, d[1].vulkan_index), (Some(1), None, Some(1)));
        let amd = &d[2];
        assert_eq!(
            (amd.name.as_str(), amd.integrated, amd.total_bytes, amd.free_bytes),
            ("Radeon RX 7900 XTX", false, 24 * GIB, Some(23 * GIB))
        );
        assert_eq!(
            (amd.cuda_index, amd.hip_index, amd.vulkan_index, amd.source.as_str()),
            (None, Some(0), Some(2), "amdgpu sysfs")
        );
        assert_eq!(d[3].name, "AMD XDNA 2 NPU");
    }

    #[test]
    fn an_integrated_gpu_counts_its_gtt_and_nothing_is_found_in_an_empty_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |p: &str, s: &str| {
            let p = tmp.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        write(
            "class/kfd/kfd/topology/nodes/1/properties",
            "simd_count 80\ngfx_target_version 110501\ndrm_render_minor 128\n",
        );
        for (f, v) in [("vram_total", GIB), ("vram_used", GIB / 2), ("gtt_total", 30 * GIB), ("gtt_used", GIB)] {
            write(&format!("class/drm/renderD128/device/mem_info_{f}"), &v.to_string());
        }
        let d = enumerate(tmp.path(), vec![]);
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].integrated, d[0].total_bytes, d[0].free_bytes),
            (true, 31 * GIB, Some(31 * GIB - 3 * GIB / 2))
        );
        assert_eq!(d[0].name, "AMD Radeon Graphics (gfx1151)");
        assert!(enumerate(&tmp.path().join("none"), vec![]).is_empty());
    }
}
