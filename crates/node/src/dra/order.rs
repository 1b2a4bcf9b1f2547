//! The publication order, gpupart's placement policy (pure). The scheduler takes, for each
//! request, the first published device that matches and whose counters are free, so the order
//! in which a node lists its devices decides where every claim lands.
//!
//! Offered devices are those that can be created now: a MIG placement that overlaps no instance
//! (gpupart's, another tool's, or a device allocated but not yet prepared) and that the GPU's
//! compute slices and engines still allow; a whole GPU that holds nothing. Per profile (by
//! name, smallest first), candidates are ranked by the node they leave behind:
//! 1. its room, largest profile first: how many more instances of the largest profile the node's
//!    GPUs could still take in all, then of the next largest, and so on — so a wholly idle GPU
//!    (the only room for a full-GPU profile) is touched last, and a placement that keeps room for
//!    a 4g beats one that keeps room for two 1g;
//! 2. the GPU already most used (packing), then a GPU whose MIG mode is already on, then the
//!    lower GPU index;
//! 3. the least expected fragmentation of the free space (docs/fragmentation.md);
//! 4. placement start (a stable order).
//!
//! The candidates are then listed GPU by GPU (the GPU of the best candidate first, its placements
//! in rank order), so a publication that is a moment stale still fills one GPU before the next.
//! A media-extended profile (`+me`) comes after its plain twin. Whole GPUs come after every MIG
//! device, GPUs with MIG mode off first; MPS devices last, the GPU with the most shares first.

use super::devices::{DeviceKind, DeviceRef};
use crate::frag::expected_fragmentation;
use crate::mig::capacity::Occupancy;
use crate::mig::{GiProfile, Placement, ProfileTable};
use std::cmp::Reverse;

/// What the policy needs to know of one GPU.
#[derive(Debug, Clone)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// Its MIG profiles (empty for a GPU without MIG).
    pub table: ProfileTable,
    /// Whether MIG mode is on (creating a MIG device on a GPU with it off switches it on).
    pub mig_enabled: bool,
    /// Occupied placements: every GPU instance (whoever made it) and every MIG device allocated
    /// to a claim but not yet created, as (profile id, placement).
    pub occupied: Vec<(u32, Placement)>,
    /// The whole GPU is taken: allocated as a whole, or used by processes outside MIG (other
    /// than the clients of its MPS shares).
    pub whole_taken: bool,
    /// MPS shares of it allocated to claims.
    pub mps_shares: u32,
    /// It has an MPS device (a GPU without MIG; a MIG-capable one with `--dra-mps-on-mig-gpus`).
    pub mps_device: bool,
}

impl GpuView {
    /// Whether MIG devices can be offered on it at all.
    pub fn mig_capable(&self) -> bool {
        !self.table.profiles.is_empty()
    }

    /// Whether nothing at all is on it.
    pub fn idle(&self) -> bool {
        self.occupied.is_empty() && !self.whole_taken && self.mps_shares == 0
    }

    /// Whether its MPS device can take another share now: it has one, it is not taken whole,
    /// and it holds no MIG instance (a MIG-capable GPU with MIG mode on takes its first share
    /// only when idle: Prepare turns MIG off then).
    pub fn shareable(&self) -> bool {
        self.mps_device && !self.whole_taken && self.occupied.is_empty()
    }

    fn occupancy(&self) -> Occupancy {
        Occupancy::of(&self.table, self.occupied.iter().copied())
    }
}

/// A profile's place in the room comparison: larger (memory, then compute slices) first.
type SizeKey = (Reverse<u32>, Reverse<u32>, String);

fn size_key(p: &GiProfile) -> SizeKey {
    (Reverse(p.memory_slices), Reverse(p.slices), p.name.to_string())
}

/// How many more instances of each profile of `keys` one GPU could take.
fn room(keys: &[SizeKey], table: &ProfileTable, occ: &Occupancy) -> Vec<u32> {
    keys.iter()
        .map(|k| table.profiles.iter().find(|p| size_key(p) == *k).map_or(0, |p| occ.remaining_capacity(table, p)))
        .collect()
}

/// The rank of a candidate (smaller sorts first).
type Rank = (Reverse<Vec<u32>>, Reverse<u32>, bool, u32, u64, u32);

/// The devices that can be created now, in the order to publish them.
pub fn order(gpus: &[GpuView]) -> Vec<DeviceRef> {
    let occs: Vec<Occupancy> = gpus.iter().map(GpuView::occupancy).collect();
    let mut keys: Vec<SizeKey> = gpus.iter().flat_map(|g| g.table.profiles.iter().map(size_key)).collect();
    keys.sort();
    keys.dedup();
    let counts = |g: &GpuView, occ: &Occupancy| {
        if g.whole_taken || !g.mig_capable() {
            vec![0; keys.len()]
        } else {
            room(&keys, &g.table, occ)
        }
    };
    let rooms: Vec<Vec<u32>> = gpus.iter().zip(&occs).map(|(g, o)| counts(g, o)).collect();
    let frags: Vec<f64> = gpus
        .iter()
        .zip(&occs)
        .map(|(g, o)| if g.mig_capable() { expected_fragmentation(&g.table, o, None) } else { 0.0 })
        .collect();
    let mut out = Vec::new();
    // Profiles smallest first; a media-extended one (`+me`, scarce) after the plain one.
    let mut listing: Vec<&SizeKey> = keys.iter().collect();
    listing.sort_by_key(|k| (Reverse(k.0), Reverse(k.1), k.2.contains('+'), k.2.clone()));
    for key in listing {
        let mut ranked: Vec<(Rank, DeviceRef)> = Vec::new();
        for (g, gpu) in gpus.iter().enumerate() {
            if gpu.whole_taken {
                continue;
            }
            let Some(p) = gpu.table.profiles.iter().find(|p| size_key(p) == *key) else { continue };
            for &pl in &p.placements {
                if !occs[g].can_add(&gpu.table, p, pl) {
                    continue;
                }
                let mut after = occs[g];
                after.add(p, pl);
                let mine = counts(gpu, &after);
                let node: Vec<u32> = (0..keys.len())
                    .map(|k| rooms.iter().enumerate().map(|(i, r)| if i == g { mine[k] } else { r[k] }).sum())
                    .collect();
                let frag: f64 = frags
                    .iter()
                    .enumerate()
                    .map(|(i, f)| if i == g { expected_fragmentation(&gpu.table, &after, None) } else { *f })
                    .sum();
                let used = gpu.table.memory_slices - occs[g].free_memory_slices(&gpu.table);
                let rank = (
                    Reverse(node),
                    Reverse(used),
                    !gpu.mig_enabled,
                    gpu.index,
                    (frag * 1000.0).round() as u64,
                    pl.start,
                );
                ranked.push((
                    rank,
                    DeviceRef { gpu: gpu.index, kind: DeviceKind::Mig { profile_id: p.id, placement: pl } },
                ));
            }
        }
        ranked.sort_by(|a, b| a.0.cmp(&b.0));
        // GPU by GPU, best GPU first: a publication a moment stale still fills one GPU first.
        let mut gpu_rank: Vec<u32> = Vec::new();
        for (_, d) in &ranked {
            if !gpu_rank.contains(&d.gpu) {
                gpu_rank.push(d.gpu);
            }
        }
        ranked.sort_by_key(|(_, d)| gpu_rank.iter().position(|g| *g == d.gpu));
        out.extend(ranked.into_iter().map(|(_, d)| d));
    }
    let mut whole: Vec<&GpuView> = gpus.iter().filter(|g| g.idle()).collect();
    whole.sort_by_key(|g| (g.mig_enabled, g.index));
    out.extend(whole.into_iter().map(|g| DeviceRef { gpu: g.index, kind: DeviceKind::Gpu }));
    // MPS devices last, the GPU with the most shares first (packing: an idle GPU stays whole).
    let mut shared: Vec<&GpuView> = gpus.iter().filter(|g| g.shareable()).collect();
    shared.sort_by_key(|g| (Reverse(g.mps_shares), g.index));
    out.extend(shared.into_iter().map(|g| DeviceRef { gpu: g.index, kind: DeviceKind::Mps }));
    out
}

/// NVIDIA's order, for comparison: per GPU, every profile (by profile id) at every placement
/// ascending, then the whole GPU; never reordered, whatever is allocated.
pub fn nvidia_order(gpus: &[GpuView]) -> Vec<DeviceRef> {
    let mut out = Vec::new();
    for g in gpus {
        let mut profiles: Vec<_> = g.table.profiles.iter().collect();
        profiles.sort_by_key(|p| p.id);
        for p in profiles {
            for &pl in &p.placements {
                out.push(DeviceRef { gpu: g.index, kind: DeviceKind::Mig { profile_id: p.id, placement: pl } });
            }
        }
        out.push(DeviceRef { gpu: g.index, kind: DeviceKind::Gpu });
    }
    out
}
