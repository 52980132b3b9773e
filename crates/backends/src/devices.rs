//! How a backend is told the devices the scheduler placed its model on. Pure.
//!
//! ggml backends see only the devices the environment shows them: `CUDA_VISIBLE_DEVICES`
//! (CUDA builds), `HIP_VISIBLE_DEVICES` (ROCm builds), `GGML_VK_VISIBLE_DEVICES` (Vulkan
//! builds). Shown only its devices, a backend numbers them from 0, so llama-server needs no
//! `--device` (which a CPU build refuses); a model split over several gets `--tensor-split`
//! in proportion to its share on each, and `--main-gpu 0`.

/// A device the scheduler placed the model on, as its backend is told of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// `gpu0`, `npu0`.
    pub id: String,
    /// `nvidia` or `amd`.
    pub vendor: String,
    pub npu: bool,
    pub cuda_index: Option<u32>,
    pub hip_index: Option<u32>,
    pub vulkan_index: Option<u32>,
    /// Bytes of the model's estimate it holds there.
    pub bytes: u64,
}

/// The environment that shows a backend only its GPUs (none for the `cpu` backend, which
/// uses none, or when no GPU was chosen).
pub fn env(backend: &str, devices: &[Placed]) -> Vec<(String, String)> {
    let gpus: Vec<&Placed> = devices.iter().filter(|d| !d.npu).collect();
    if gpus.is_empty() || backend == "cpu" {
        return Vec::new();
    }
    let list = |f: &dyn Fn(&Placed) -> Option<u32>| {
        let v: Vec<String> = gpus.iter().filter_map(|d| f(d)).map(|i| i.to_string()).collect();
        (!v.is_empty()).then(|| v.join(","))
    };
    let mut out = Vec::new();
    for (var, f) in [
        ("CUDA_VISIBLE_DEVICES", &(|d: &Placed| d.cuda_index) as &dyn Fn(&Placed) -> Option<u32>),
        ("HIP_VISIBLE_DEVICES", &|d: &Placed| d.hip_index),
        ("GGML_VK_VISIBLE_DEVICES", &|d: &Placed| d.vulkan_index),
    ] {
        if let Some(v) = list(f) {
            out.push((var.to_string(), v));
        }
    }
    out
}

/// llama-server's flags for a model split over several GPUs: `--tensor-split` (MiB held on
/// each, in the order the environment shows them) and `--main-gpu 0`. None for one device.
pub fn llama_split_args(devices: &[Placed]) -> Vec<String> {
    let gpus: Vec<&Placed> = devices.iter().filter(|d| !d.npu).collect();
    if gpus.len() < 2 {
        return Vec::new();
    }
    let mib: Vec<String> = gpus.iter().map(|d| ((d.bytes >> 20).max(u64::from(d.bytes > 0))).to_string()).collect();
    vec!["--tensor-split".into(), mib.join(","), "--main-gpu".into(), "0".into()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, vendor: &str, cuda: Option<u32>, hip: Option<u32>, vk: u32, mib: u64) -> Placed {
        Placed {
            id: id.into(),
            vendor: vendor.into(),
            cuda_index: cuda,
            hip_index: hip,
            vulkan_index: Some(vk),
            bytes: mib << 20,
            ..Placed::default()
        }
    }

    #[test]
    fn a_backend_sees_only_its_gpus_and_a_split_gets_its_proportions() {
        let one = [gpu("gpu1", "nvidia", Some(1), None, 1, 900)];
        assert_eq!(
            env("vulkan", &one),
            [("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()), ("GGML_VK_VISIBLE_DEVICES".into(), "1".into())]
        );
        assert!(llama_split_args(&one).is_empty());
        let two = [gpu("gpu1", "nvidia", Some(1), None, 1, 600), gpu("gpu2", "amd", None, Some(0), 2, 300)];
        let e = env("rocm", &two);
        assert_eq!(
            e,
            [
                ("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()),
                ("HIP_VISIBLE_DEVICES".into(), "0".into()),
                ("GGML_VK_VISIBLE_DEVICES".into(), "1,2".into())
            ]
        );
        assert_eq!(llama_split_args(&two), ["--tensor-split", "600,300", "--main-gpu", "0"]);
        assert!(env("cpu", &two).is_empty(), "the cpu backend uses no GPU");
        let npu = [Placed { id: "npu0".into(), npu: true, ..Placed::default() }];
        assert!(env("vulkan", &npu).is_empty() && llama_split_args(&npu).is_empty());
    }
}
