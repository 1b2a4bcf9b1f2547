//! Every way one MIG GPU can hold a mix of the demanded profiles (pure): the feasible multisets,
//! each with the arrangement the node planner would choose and its fragmentation.

use crate::frag::{expected_fragmentation, Workload};
use crate::mig::capacity::Occupancy;
use crate::mig::{Placement, ProfileTable};
use crate::plan::search::search;

/// One GPU's content: how many instances of each demanded profile.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuConfig {
    /// Instances per profile, in the order of [`Configs::profiles`].
    pub counts: Vec<u32>,
    /// The arrangement the node planner picks for it: (profile id, placement).
    pub placements: Vec<(u32, Placement)>,
    /// Expected fragmentation of the free space under the demand's mix, in memory slices.
    pub frag_slices: f64,
    /// Memory slices the instances occupy.
    pub memory_slices: u32,
    /// Instances.
    pub instances: u32,
}

/// The feasible configurations of one GPU model for a set of profiles.
#[derive(Debug, Clone)]
pub struct Configs {
    /// GI profile ids, the axes of every `counts`.
    pub profiles: Vec<u32>,
    /// Every non-empty feasible configuration.
    pub all: Vec<GpuConfig>,
}

fn ids(profiles: &[u32], counts: &[u32]) -> Vec<u32> {
    profiles.iter().zip(counts).flat_map(|(&id, &n)| std::iter::repeat_n(id, n as usize)).collect()
}

/// Builds the configuration of `counts`, or `None` when no arrangement exists.
pub fn config(table: &ProfileTable, profiles: &[u32], counts: &[u32], workload: &Workload) -> Option<GpuConfig> {
    let new = ids(profiles, counts);
    let (placements, _) = search(table, &[], &new).ok()?;
    let placed: Vec<(u32, Placement)> = new.into_iter().zip(placements).collect();
    let occ = Occupancy::of(table, placed.iter().copied());
    Some(GpuConfig {
        counts: counts.to_vec(),
        frag_slices: expected_fragmentation(table, &occ, Some(workload)),
        memory_slices: table.memory_slices - occ.free_memory_slices(table),
        instances: counts.iter().sum(),
        placements: placed,
    })
}

/// Enumerates every non-empty feasible configuration (feasibility is monotone: a superset of an
/// infeasible multiset is infeasible, so the walk stops growing a count at the first failure).
pub fn enumerate(table: &ProfileTable, profiles: &[u32], workload: &Workload) -> Configs {
    let mut all = Vec::new();
    let mut counts = vec![0u32; profiles.len()];
    walk(table, profiles, workload, 0, &mut counts, &mut all);
    Configs { profiles: profiles.to_vec(), all }
}

fn walk(
    table: &ProfileTable,
    profiles: &[u32],
    w: &Workload,
    k: usize,
    counts: &mut Vec<u32>,
    out: &mut Vec<GpuConfig>,
) {
    if k == profiles.len() {
        return;
    }
    walk(table, profiles, w, k + 1, counts, out);
    loop {
        counts[k] += 1;
        match config(table, profiles, counts, w) {
            Some(c) => {
                out.push(c);
                walk(table, profiles, w, k + 1, counts, out);
            }
            None => break,
        }
    }
    counts[k] = 0;
}
