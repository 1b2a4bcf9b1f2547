//! The devices the counters cannot refuse although they cannot be created now (pure).
//!
//! Every device stays listed ([`super::publish::content`]). The scheduler refuses a device whose
//! counters are taken by allocated (or in-flight) devices, and the counters are exact: every set
//! of devices they let through fits the GPU (`the_counters_refuse_every_set_the_gpu_cannot_hold`).
//! What they cannot express is an occupant no claim of the pool holds: another tool's MIG
//! instance, an instance whose claim is gone but which is still in use, processes on a GPU with
//! MIG off. A device blocked only by such an occupant gets a `NoSchedule` device taint instead of
//! leaving the pool.

use super::devices::{every_device, DeviceKind, DeviceRef};
use super::order::GpuView;
use crate::mig::capacity::Occupancy;
use std::collections::BTreeMap;

/// Why a device is unavailable although its counters are free: a MIG instance or processes that
/// no claim of the pool holds.
pub const OCCUPIED: &str = "occupied-outside-claims";

/// Whether `d` could be created on `g` (whose occupancy is `occ`) now.
fn creatable(g: &GpuView, occ: &Occupancy, d: DeviceRef) -> bool {
    match d.kind {
        DeviceKind::Gpu => g.idle(),
        DeviceKind::Mps => g.shareable(),
        DeviceKind::Mig { profile_id, placement } => {
            let Some(p) = g.table.by_id(profile_id) else { return false };
            !g.whole_taken && occ.can_add(&g.table, p, placement)
        }
    }
}

/// Why the whole GPU and the MIG devices of a GPU with MPS shares are not offered: the counters
/// say so from Kubernetes 1.36.2 on; schedulers before it do not count a shared device's
/// counters, and only this taint keeps them from handing the GPU out beside its shares.
pub const SHARED: &str = "shared-through-mps";

/// The devices that cannot be created given `everything` on the GPUs but could given only what
/// the pool's claims hold (`claimed`, the same GPUs in the same order), with why; and every device
/// but the MPS one of a GPU with MPS shares ([`SHARED`]).
pub fn unavailable(everything: &[GpuView], claimed: &[GpuView]) -> BTreeMap<DeviceRef, String> {
    let occupancy = |g: &GpuView| Occupancy::of(&g.table, g.occupied.iter().copied());
    let mut out = BTreeMap::new();
    for all in everything {
        let Some(held) = claimed.iter().find(|g| g.index == all.index) else { continue };
        let (all_occ, held_occ) = (occupancy(all), occupancy(held));
        let mut devices = every_device(all.index, &all.table);
        if all.mps_device && !all.table.profiles.is_empty() {
            devices.push(DeviceRef { gpu: all.index, kind: DeviceKind::Mps });
        }
        for d in devices {
            if d.kind != DeviceKind::Mps && (all.mps_shares > 0 || held.mps_shares > 0) {
                out.insert(d, SHARED.to_string());
            } else if !creatable(all, &all_occ, d) && creatable(held, &held_occ, d) {
                out.insert(d, OCCUPIED.to_string());
            }
        }
    }
    out
}
