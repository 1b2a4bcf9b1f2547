//! The agent's side of GPU health in label mode: each change of the record becomes an Event on
//! the node (Warning `GpuUnhealthy`, Normal `GpuRecovered`), and the operator's recovery
//! annotation (`gpupart.io/recover-gpus: 1,3` or `all`) is read and removed.

use super::report::Notice;
use crate::gpu_health::watch::Change;
use crate::gpu_health::{describe, GpuHealth};

/// The Event announcing `change`.
pub fn notice(change: &Change) -> Notice {
    match change {
        Change::Fenced { gpu, record } => Notice {
            type_: "Warning",
            reason: "GpuUnhealthy",
            note: format!("{}: no new work is placed on it until it is recovered", describe(*gpu, record)),
        },
        Change::Recovered { gpus, why } => {
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            Notice {
                type_: "Normal",
                reason: "GpuRecovered",
                note: format!("GPU {} healthy again: {why}", list.join(", ")),
            }
        }
    }
}

/// Acts on the recovery annotation's value: the change when it named unhealthy GPUs, `None` when
/// it named none of them, the error naming a value that does not read.
pub fn recover(value: &str, health: &GpuHealth) -> Result<Option<Change>, String> {
    let gpus = crate::health::parse_gpus(value, &health.snapshot())
        .map_err(|e| format!("annotation {}='{value}': {e}", crate::kube::keys::RECOVER_GPUS))?;
    let back = health.recover(&gpus);
    Ok((!back.is_empty()).then(|| Change::Recovered {
        gpus: back,
        why: format!("the operator's annotation {}", crate::kube::keys::RECOVER_GPUS),
    }))
}
