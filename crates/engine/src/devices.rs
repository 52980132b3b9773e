//! The devices models are placed on: found once at start (`host::devices`), given to the
//! scheduler as ledgers with budgets, named by the `device` load option, and told to each
//! backend where it is placed.

use api_types::{ComputeDevice, LoadOptions};
use backends::devices::Placed;
use scheduler::{Device, Placement, Shares};

use crate::error::{EngineError, Result};

/// What is kept free on each GPU for everything else: a tenth of its free memory, at least
/// 512 MiB (as `--vram-budget auto`).
fn margin(free: u64) -> u64 {
    (free / 10).max(512 << 20)
}

/// The scheduler's view of `list`: each GPU with a budget of its free memory (its total where
/// the driver does not say) less the margin; each NPU with one model at a time.
pub fn ledgers(list: &[ComputeDevice]) -> Vec<Device> {
    list.iter()
        .map(|d| match d.kind.as_str() {
            "npu" => Device::npu(&d.id),
            _ => {
                let free = d.free_bytes.unwrap_or(d.total_bytes);
                Device::gpu(&d.id, Some(free.saturating_sub(margin(free))))
            }
        })
        .collect()
}

/// Where `options` ask a model to run (their `device`; `auto` when unset or unreadable: a
/// bad value was refused where it entered).
pub fn placement(options: &LoadOptions) -> Placement {
    match options.device.as_deref().map(backends::options::device_ids) {
        Some(Ok(ids)) if !ids.is_empty() => Placement::On(ids),
        _ => Placement::Auto,
    }
}

/// A 400 naming `device` when `options` name a device this machine does not have.
pub fn check(list: &[ComputeDevice], options: &LoadOptions) -> Result<()> {
    let Placement::On(ids) = placement(options) else { return Ok(()) };
    match ids.iter().find(|id| !list.iter().any(|d| &d.id == *id)) {
        None => Ok(()),
        Some(id) => {
            let known: Vec<String> = list.iter().map(|d| d.id.clone()).collect();
            let why = scheduler::Rejection::UnknownDevice { device: id.clone(), known };
            Err(EngineError::Rejected { model: String::new(), why })
        }
    }
}

/// The devices of `shares` as a backend is told of them, in the order of `list`.
pub fn placed(list: &[ComputeDevice], shares: &Shares) -> Vec<Placed> {
    list.iter()
        .filter_map(|d| {
            let bytes = *shares.get(&d.id)?;
            Some(Placed {
                id: d.id.clone(),
                vendor: d.vendor.clone(),
                npu: d.kind == "npu",
                cuda_index: d.cuda_index,
                hip_index: d.hip_index,
                vulkan_index: d.vulkan_index,
                bytes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, free: u64) -> ComputeDevice {
        ComputeDevice {
            id: id.into(),
            kind: "gpu".into(),
            total_bytes: free * 2,
            free_bytes: Some(free),
            ..Default::default()
        }
    }

    #[test]
    fn budgets_keep_a_margin_and_unknown_devices_are_refused_naming_those_there_are() {
        let list = [gpu("gpu0", 10 << 30), gpu("gpu1", 1 << 30)];
        let l = ledgers(&list);
        assert_eq!((l[0].budget, l[1].budget), (Some(9 << 30), Some(512 << 20)));
        let ask = |d: &str| LoadOptions { device: Some(d.into()), ..Default::default() };
        assert_eq!(placement(&ask("gpu1,gpu0")), Placement::On(vec!["gpu1".into(), "gpu0".into()]));
        assert_eq!(placement(&ask("auto")), Placement::Auto);
        check(&list, &ask("gpu0,gpu1")).unwrap();
        let e = check(&list, &ask("gpu2")).unwrap_err().to_string();
        assert!(e.contains("no device 'gpu2'") && e.contains("gpu0, gpu1"), "{e}");
        let p = placed(&list, &Shares::from([("gpu1".into(), 5)]));
        assert_eq!((p.len(), p[0].id.as_str(), p[0].bytes), (1, "gpu1", 5));
    }
}
