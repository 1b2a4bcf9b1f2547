//! What the kubelet's allocations mean for the GPUs (pure): device ids from PodResources mapped
//! onto the observed GPUs. `MIG-…` ids (and the old `MIG-<gpu-uuid>/<gi>/<ci>` and
//! `<gpu-uuid>:<gi>:<ci>` forms) are MIG devices; a `GPU-…` id is a whole GPU; `<gpu-uuid>::<n>`
//! is a shared replica of a GPU (an MPS slot, or NVIDIA's time-slicing/MPS replicas). Ids that
//! name nothing on this node's GPUs are ignored.

use crate::observed::{GpuState, PodUse};

/// Reads the devices the kubelet has allocated to containers (the kubelet's PodResources API
/// in the agent; anything that lists allocations in tests).
pub trait AllocationSource: Send + Sync {
    /// Every allocated device of every pod on the node.
    fn read(&self) -> Result<Vec<PodUse>, String>;
}

/// Where a device id points on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A MIG device: (GPU position, GI position, CI position).
    Mig(usize, usize, usize),
    /// A whole GPU or a replica of it: GPU position.
    Gpu(usize),
}

fn locate(states: &[GpuState], id: &str) -> Option<Target> {
    for (g, s) in states.iter().enumerate() {
        for (i, gi) in s.instances.iter().enumerate() {
            if let Some(c) = gi.cis.iter().position(|c| c.uuid == id) {
                return Some(Target::Mig(g, i, c));
            }
        }
    }
    // Old forms: MIG-<gpu-uuid>/<gi>/<ci> and <gpu-uuid>:<gi>:<ci>.
    let old = id
        .strip_prefix("MIG-")
        .and_then(|rest| {
            let mut p = rest.rsplitn(3, '/');
            let (ci, gi, gpu) = (p.next()?, p.next()?, p.next()?);
            Some((gpu, gi, ci))
        })
        .or_else(|| {
            let mut p = id.rsplitn(3, ':');
            let (ci, gi, gpu) = (p.next()?, p.next()?, p.next()?);
            (!gpu.is_empty() && !gi.is_empty()).then_some((gpu, gi, ci))
        });
    if let Some((gpu, gi, ci)) = old {
        if let (Ok(gi), Ok(ci)) = (gi.parse::<u32>(), ci.parse::<u32>()) {
            for (g, s) in states.iter().enumerate().filter(|(_, s)| s.info.uuid == gpu) {
                if let Some(i) = s.instances.iter().position(|x| x.id == gi) {
                    if let Some(c) = s.instances[i].cis.iter().position(|x| x.id == ci) {
                        return Some(Target::Mig(g, i, c));
                    }
                }
            }
        }
    }
    let gpu = id.split_once("::").map_or(id, |(u, _)| u);
    states.iter().position(|s| s.info.uuid == gpu).map(Target::Gpu)
}

/// Attaches every allocation to what it names; returns the allocations that named nothing here.
pub fn attach(states: &mut [GpuState], uses: &[PodUse]) -> Vec<PodUse> {
    let mut unknown = Vec::new();
    for u in uses {
        match locate(states, &u.device_id) {
            Some(Target::Mig(g, i, c)) => states[g].instances[i].cis[c].pods.push(u.clone()),
            Some(Target::Gpu(g)) => states[g].pods.push(u.clone()),
            None => unknown.push(u.clone()),
        }
    }
    unknown
}

#[cfg(test)]
mod tests;

/// The allocations in `fresh` that were not in `before` and stand in the way of the planned
/// change: a MIG device of a GPU instance to be destroyed, a GPU whose MIG mode changes, or a GPU
/// whose MPS daemon stops or restarts.
pub fn in_the_way(
    before: &[PodUse],
    fresh: &[PodUse],
    jobs: &[crate::prepare::Job],
    mps: &[crate::mps::GpuMps],
) -> Vec<PodUse> {
    let states: Vec<GpuState> = jobs.iter().map(|j| j.state.clone()).collect();
    let mut out = Vec::new();
    for u in fresh.iter().filter(|u| !before.contains(u)) {
        let hit = match locate(&states, &u.device_id) {
            Some(Target::Mig(g, i, _)) => {
                let gi = states[g].instances[i].id;
                jobs[g].plan.as_ref().is_some_and(|p| p.destroy.iter().any(|d| d.gi_id == gi))
                    || jobs[g].mode_change.is_some()
            }
            Some(Target::Gpu(g)) => {
                jobs[g].mode_change.is_some()
                    || mps.iter().any(|m| {
                        m.gpu == states[g].info.index
                            && matches!(m.action, crate::mps::Action::Stop | crate::mps::Action::Restart(_))
                    })
            }
            None => false,
        };
        if hit {
            out.push(u.clone());
        }
    }
    out
}
