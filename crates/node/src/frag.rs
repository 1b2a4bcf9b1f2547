//! Fragmentation math (pure): what the free space of each GPU can still hold, and how much of it
//! a target workload cannot use. Definitions and worked examples: docs/fragmentation.md.
//!
//! Per MIG GPU: free/used memory and compute slices; `creatable(p)` (NVML's remaining capacity);
//! the largest creatable profile; `stranded(p)` = free memory slices that instances of `p` cannot
//! cover; `unusable_ratio(p)` = stranded(p) / free (Linux's `unusable_free_index` on the slice map,
//! 1 when nothing is free); FGD's expected fragmentation F(M) = Σ w_p · stranded(p) against a
//! workload mix M, in slices and as a ratio of free slices. Per node: unallocated and fragmented
//! GPU-equivalents and their ratio (FGD's fragmentation rate), whole free GPUs, idle GPUs with MIG
//! disabled.

use crate::mig::capacity::Occupancy;
use crate::mig::{ProfileName, ProfileTable};
use crate::observed::GpuState;
use serde::Serialize;

/// A target workload: profile name → popularity weight (normalised per GPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    /// The weights as configured.
    pub weights: Vec<(ProfileName, f64)>,
}

/// One profile's figures on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileFrag {
    /// Profile name.
    pub profile: String,
    /// Memory slices of one instance.
    pub memory_slices: u32,
    /// Instances that can be created now.
    pub creatable: u32,
    /// Free memory slices instances of this profile cannot cover.
    pub stranded_slices: u32,
    /// stranded / free (1 when nothing is free).
    pub unusable_ratio: f64,
}

/// One GPU's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuFrag {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Model.
    pub model: String,
    /// MIG enabled (otherwise the GPU is one allocatable unit).
    pub mig_enabled: bool,
    /// Memory slices of the GPU (0 without MIG).
    pub memory_slices: u32,
    /// Free memory slices.
    pub free_memory_slices: u32,
    /// Compute slices of the GPU (0 without MIG).
    pub compute_slices: u32,
    /// Free compute slices.
    pub free_compute_slices: u32,
    /// Largest creatable profile (memory slices, then compute slices).
    pub largest_creatable: Option<String>,
    /// Its memory slices (0 when nothing is creatable).
    pub largest_creatable_slices: u32,
    /// Per GI profile.
    pub profiles: Vec<ProfileFrag>,
    /// The workload mix used for the expected fragmentation: (profile, weight summing to 1).
    pub workload: Vec<(String, f64)>,
    /// FGD expected fragmentation Σ w·stranded, in memory slices.
    pub expected_fragmentation_slices: f64,
    /// Expected fragmentation / free memory slices (0 when nothing is free).
    pub expected_fragmentation_ratio: f64,
    /// Unallocated capacity in GPU-equivalents (free slices / slices; 1 or 0 without MIG).
    pub unallocated_gpus: f64,
    /// Fragmented capacity in GPU-equivalents.
    pub fragmented_gpus: f64,
    /// No instances and no processes: a whole GPU for a tensor-parallel model.
    pub whole_free: bool,
    /// MIG disabled (or not supported) and no processes.
    pub idle_without_mig: bool,
    /// MPS client slots the GPU serves (0 without an MPS daemon).
    pub mps_slots: u32,
    /// Slots in use (connected MPS clients, at most `mps_slots`).
    pub mps_slots_used: u32,
}

/// Node totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeFrag {
    /// GPUs on the node.
    pub gpus: usize,
    /// Unallocated GPU-equivalents.
    pub unallocated_gpus: f64,
    /// Fragmented GPU-equivalents (expected, against each GPU's workload mix).
    pub fragmented_gpus: f64,
    /// fragmented / unallocated (FGD's fragmentation rate; 0 when nothing is unallocated).
    pub fragmentation_ratio: f64,
    /// GPUs with no instances and no processes.
    pub whole_free_gpus: usize,
    /// Idle GPUs without MIG enabled.
    pub idle_without_mig_gpus: usize,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The weights used on this GPU: the configured ones that exist here, else uniform over the
/// base profiles (no `+`/`-` attribute); normalised to sum to 1.
fn mix(t: &ProfileTable, workload: Option<&Workload>) -> Vec<(u32, String, f64)> {
    let mut out: Vec<(u32, String, f64)> = workload
        .map(|w| {
            w.weights
                .iter()
                .filter(|(_, wt)| *wt > 0.0)
                .filter_map(|(n, wt)| t.resolve(&n.gi_name()).ok().map(|(p, _)| (p.id, p.name.to_string(), *wt)))
                .collect()
        })
        .unwrap_or_default();
    if out.is_empty() {
        out = t.profiles.iter().filter(|p| p.name.suffix.is_empty()).map(|p| (p.id, p.name.to_string(), 1.0)).collect();
    }
    let sum: f64 = out.iter().map(|(_, _, w)| w).sum();
    out.iter_mut().for_each(|(_, _, w)| *w = ratio(*w, sum));
    out
}

/// Figures for one GPU.
pub fn gpu_frag(state: &GpuState, workload: Option<&Workload>) -> GpuFrag {
    let busy = state.all_processes().next().is_some() || !state.pods.is_empty();
    let mut g = GpuFrag {
        index: state.info.index,
        uuid: state.info.uuid.clone(),
        model: state.info.model.clone(),
        mig_enabled: state.info.mig_capable && state.mig_mode.current,
        memory_slices: 0,
        free_memory_slices: 0,
        compute_slices: 0,
        free_compute_slices: 0,
        largest_creatable: None,
        largest_creatable_slices: 0,
        profiles: Vec::new(),
        workload: Vec::new(),
        expected_fragmentation_slices: 0.0,
        expected_fragmentation_ratio: 0.0,
        unallocated_gpus: 0.0,
        fragmented_gpus: 0.0,
        whole_free: state.instances.is_empty() && !busy,
        idle_without_mig: false,
        mps_slots: 0,
        mps_slots_used: 0,
    };
    if !g.mig_enabled {
        g.idle_without_mig = !busy;
        g.unallocated_gpus = if busy { 0.0 } else { 1.0 };
        return g;
    }
    let t = &state.profiles;
    let occ = Occupancy::of(t, state.instances.iter().map(|i| (i.profile_id, i.placement)));
    let free = occ.free_memory_slices(t);
    g.memory_slices = t.memory_slices;
    g.free_memory_slices = free;
    g.compute_slices = t.compute_slices;
    g.free_compute_slices = occ.free_compute_slices(t);
    if let Some(p) = occ.largest_creatable(t) {
        g.largest_creatable = Some(p.name.to_string());
        g.largest_creatable_slices = p.memory_slices;
    }
    for p in &t.profiles {
        let (creatable, stranded) = creatable_and_stranded(t, &occ, free, p);
        let unusable = if free == 0 { 1.0 } else { f64::from(stranded) / f64::from(free) };
        g.profiles.push(ProfileFrag {
            profile: p.name.to_string(),
            memory_slices: p.memory_slices,
            creatable,
            stranded_slices: stranded,
            unusable_ratio: unusable,
        });
    }
    let weights = mix(t, workload);
    g.expected_fragmentation_slices = weights
        .iter()
        .map(|(_, name, w)| {
            w * g.profiles.iter().find(|p| &p.profile == name).map_or(0.0, |p| f64::from(p.stranded_slices))
        })
        .sum();
    g.workload = weights.into_iter().map(|(_, n, w)| (n, w)).collect();
    g.expected_fragmentation_ratio = ratio(g.expected_fragmentation_slices, f64::from(free));
    g.unallocated_gpus = ratio(f64::from(free), f64::from(t.memory_slices));
    g.fragmented_gpus = ratio(g.expected_fragmentation_slices, f64::from(t.memory_slices));
    g
}

/// Instances of `p` that can be created now and the free slices they cannot cover.
fn creatable_and_stranded(t: &ProfileTable, occ: &Occupancy, free: u32, p: &crate::mig::GiProfile) -> (u32, u32) {
    let creatable = occ.remaining_capacity(t, p);
    // Instances of one profile never overlap each other, so they cover creatable × size slices.
    (creatable, free.saturating_sub(creatable * p.memory_slices))
}

/// FGD's expected fragmentation of one MIG GPU's free space against `workload`, in memory
/// slices (what [`GpuFrag::expected_fragmentation_slices`] reports, from an occupancy alone).
pub fn expected_fragmentation(t: &ProfileTable, occ: &Occupancy, workload: Option<&Workload>) -> f64 {
    let free = occ.free_memory_slices(t);
    mix(t, workload)
        .iter()
        .filter_map(|(id, _, w)| t.by_id(*id).map(|p| w * f64::from(creatable_and_stranded(t, occ, free, p).1)))
        .sum()
}

impl GpuFrag {
    /// How the GPU is shared: `mig`, `mps` (it serves MPS slots) or `none` (one whole GPU).
    pub fn partition_mode(&self) -> &'static str {
        if self.mig_enabled {
            "mig"
        } else if self.mps_slots > 0 {
            "mps"
        } else {
            "none"
        }
    }
}

/// Counts an MPS GPU by its client slots: unallocated = free slots / slots; it is never a whole
/// free GPU (its slots are what it offers), and its free slots are not fragmented (any free slot
/// serves any slot request).
pub fn count_mps_slots(g: &mut GpuFrag, slots: u32, used: u32) {
    if slots == 0 {
        return;
    }
    let used = used.min(slots);
    g.mps_slots = slots;
    g.mps_slots_used = used;
    g.unallocated_gpus = f64::from(slots - used) / f64::from(slots);
    g.fragmented_gpus = 0.0;
    g.whole_free = false;
    g.idle_without_mig = false;
}

/// Every GPU's figures, MPS GPUs counted by slots (`daemons` in `states` order; `None` where no
/// daemon runs; shorter or empty means none).
pub fn node_gpu_frags(
    states: &[GpuState],
    daemons: &[Option<crate::mps::daemon::DaemonStatus>],
    workload: Option<&Workload>,
) -> Vec<GpuFrag> {
    states
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut g = gpu_frag(s, workload);
            if let Some(Some(d)) = daemons.get(i) {
                if let (Some(settings), true) = (d.settings, d.running()) {
                    let used = (d.clients.len() as u32).max(allocated_slots(s));
                    count_mps_slots(&mut g, settings.replicas, used);
                }
            }
            g
        })
        .collect()
}

/// MPS slots of this GPU the kubelet allocated to pods (`<gpu-uuid>::<n>` ids in PodResources).
pub fn allocated_slots(state: &GpuState) -> u32 {
    let prefix = format!("{}::", state.info.uuid);
    state.pods.iter().filter(|p| p.device_id.starts_with(&prefix)).count() as u32
}

/// Node totals over GPU figures.
pub fn node_frag(gpus: &[GpuFrag]) -> NodeFrag {
    let unallocated: f64 = gpus.iter().map(|g| g.unallocated_gpus).sum();
    let fragmented: f64 = gpus.iter().map(|g| g.fragmented_gpus).sum();
    NodeFrag {
        gpus: gpus.len(),
        unallocated_gpus: unallocated,
        fragmented_gpus: fragmented,
        fragmentation_ratio: ratio(fragmented, unallocated),
        whole_free_gpus: gpus.iter().filter(|g| g.whole_free).count(),
        idle_without_mig_gpus: gpus.iter().filter(|g| g.idle_without_mig).count(),
    }
}

#[cfg(test)]
mod tests;
