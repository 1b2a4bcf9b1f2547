//! The Events of GPU health on the node, in both agent modes: each change of the record becomes
//! a Warning `GpuUnhealthy` or `MigDeviceUnhealthy`, or a Normal `GpuRecovered`.

use super::report::Notice;
use crate::gpu_health::watch::Change;
use crate::gpu_health::{describe, describe_mig};

/// The Event announcing `change`.
pub fn notice(change: &Change) -> Notice {
    match change {
        Change::Fenced { gpu, record } => Notice {
            type_: "Warning",
            reason: "GpuUnhealthy",
            note: format!("{}: no new work is placed on it until it is recovered", describe(*gpu, record)),
        },
        Change::MigFenced(m) => Notice {
            type_: "Warning",
            reason: "MigDeviceUnhealthy",
            note: format!("{}: nothing is created over its memory slices until it is recovered", describe_mig(m)),
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
