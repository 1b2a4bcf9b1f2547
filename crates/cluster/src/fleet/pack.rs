//! Packing MIG instances onto the fewest GPUs of one model, then the least fragmentation (pure).
//!
//! Exact when the demand is small: a dynamic programme over the remaining demand vector, one
//! GPU configuration at a time, where the configuration must hold an instance of the first
//! profile still wanted (every plan has such a GPU, so nothing optimal is lost). Beyond
//! [`EXACT_STATES`] states, whole GPUs are filled greedily (the configuration that occupies the
//! most memory slices, then the least fragmentation) until the rest is small enough for the
//! exact programme; the result is reported against a lower bound.

use crate::mig::ProfileTable;
use gpupart_node::plan::configs::{Configs, GpuConfig};

/// Largest number of demand states solved exactly.
pub const EXACT_STATES: u64 = 60_000;

/// The packing of one model's instances.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// Index into [`Configs::all`] per GPU used.
    pub gpus: Vec<usize>,
    /// Instances per profile that found no GPU (capacity).
    pub unplaced: Vec<u32>,
    /// Whether the GPU count and fragmentation are proven optimal.
    pub exact: bool,
    /// A lower bound on the GPUs the placed demand needs (all of it when everything fits; over
    /// capacity, what was placed, so it never exceeds `gpus`).
    pub lower_bound: u32,
}

impl Packing {
    /// Total expected fragmentation in memory slices.
    pub fn frag_slices(&self, configs: &Configs) -> f64 {
        self.gpus.iter().map(|&i| configs.all[i].frag_slices).sum()
    }
}

/// Lower bound on GPUs for `demand`: memory slices, compute slices, and per-profile instance caps.
pub fn lower_bound(table: &ProfileTable, configs: &Configs, demand: &[u32]) -> u32 {
    let (mut mem, mut compute, mut per_profile) = (0u64, 0u64, 0u64);
    for (&id, &n) in configs.profiles.iter().zip(demand) {
        let Some(p) = table.by_id(id) else { continue };
        mem += u64::from(n) * u64::from(p.memory_slices);
        compute += u64::from(n) * u64::from(p.slices);
        per_profile = per_profile.max(u64::from(n).div_ceil(u64::from(p.instance_count.max(1))));
    }
    let by = |x: u64, cap: u32| x.div_ceil(u64::from(cap.max(1)));
    by(mem, table.memory_slices).max(by(compute, table.compute_slices)).max(per_profile) as u32
}

/// Number of demand vectors at or below `d`.
fn states(d: &[u32]) -> u64 {
    d.iter().fold(1u64, |acc, &n| acc.saturating_mul(u64::from(n) + 1))
}

fn fits(c: &GpuConfig, d: &[u32]) -> bool {
    c.counts.iter().zip(d).all(|(a, b)| a <= b)
}

fn take(d: &mut [u32], c: &GpuConfig) {
    d.iter_mut().zip(&c.counts).for_each(|(x, n)| *x -= n);
}

/// (GPUs, fragmentation) ordering with a tolerance on the float.
fn better(a: (u32, f64), b: (u32, f64)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1 - 1e-9)
}

/// Exact minimum (GPUs, fragmentation) for every demand vector ≤ `d`, bottom-up in mixed-radix
/// order (a vector minus a configuration encodes to a smaller number); returns the GPU list.
fn exact(configs: &Configs, d: &[u32]) -> Option<Vec<usize>> {
    let radix: Vec<u64> = d.iter().map(|&n| u64::from(n) + 1).collect();
    let total = states(d) as usize;
    let mut best: Vec<(u32, f64, u32)> = vec![(u32::MAX, 0.0, u32::MAX); total];
    best[0] = (0, 0.0, u32::MAX);
    let mut v = vec![0u32; d.len()];
    let weights: Vec<u64> = radix
        .iter()
        .scan(1u64, |w, &r| {
            let here = *w;
            *w *= r;
            Some(here)
        })
        .collect();
    // A demand vector's mixed-radix key.
    let encode = |counts: &[u32]| -> u64 { counts.iter().zip(&weights).map(|(&n, &w)| u64::from(n) * w).sum() };
    for key in 1..total {
        // Decode key into v.
        let mut rest = key as u64;
        for (k, r) in radix.iter().enumerate() {
            v[k] = (rest % r) as u32;
            rest /= r;
        }
        let first = v.iter().position(|&n| n > 0).unwrap_or(0);
        let mut here = (u32::MAX, 0.0, u32::MAX);
        for (ci, c) in configs.all.iter().enumerate() {
            if c.counts[first] == 0 || !fits(c, &v) {
                continue;
            }
            let sub = encode(&c.counts);
            let prev = best[key - sub as usize];
            if prev.0 == u32::MAX {
                continue;
            }
            let cand = (prev.0 + 1, prev.1 + c.frag_slices);
            if here.0 == u32::MAX || better(cand, (here.0, here.1)) {
                here = (cand.0, cand.1, ci as u32);
            }
        }
        best[key] = here;
    }
    let mut key = encode(d);
    let mut out = Vec::new();
    while key > 0 {
        let (_, _, ci) = best[key as usize];
        let c = configs.all.get(ci as usize)?;
        out.push(ci as usize);
        key -= encode(&c.counts);
    }
    Some(out)
}

/// The greedy step: the configuration that fits `d` and fills the most memory slices.
fn greedy_pick(configs: &Configs, d: &[u32]) -> Option<usize> {
    configs
        .all
        .iter()
        .enumerate()
        .filter(|(_, c)| fits(c, d))
        .max_by(|(ia, a), (ib, b)| {
            (a.memory_slices, a.instances)
                .cmp(&(b.memory_slices, b.instances))
                .then(b.frag_slices.total_cmp(&a.frag_slices))
                .then(ib.cmp(ia))
        })
        .map(|(i, _)| i)
}

/// Packs `demand` (instances per profile of `configs`) onto at most `cap` GPUs.
pub fn pack(table: &ProfileTable, configs: &Configs, demand: &[u32], cap: u32) -> Packing {
    pack_with(table, configs, demand, cap, EXACT_STATES)
}

/// [`pack`] solving at most `exact_states` demand states exactly (1: greedy only).
pub fn pack_with(table: &ProfileTable, configs: &Configs, demand: &[u32], cap: u32, exact_states: u64) -> Packing {
    let lower_bound = lower_bound(table, configs, demand);
    let mut d = demand.to_vec();
    let mut gpus = Vec::new();
    let mut exact_run = true;
    while states(&d) > exact_states.max(1) {
        let Some(i) = greedy_pick(configs, &d) else { break };
        take(&mut d, &configs.all[i]);
        gpus.push(i);
        exact_run = false;
    }
    match exact(configs, &d) {
        Some(tail) => gpus.extend(tail),
        None => exact_run = false,
    }
    // Whatever no configuration holds stays unplaced.
    let mut unplaced = demand.to_vec();
    for &i in &gpus {
        take(&mut unplaced, &configs.all[i]);
    }
    if gpus.len() > cap as usize {
        // Keep the fullest GPUs; the instances of the rest have no room.
        gpus.sort_by(|&a, &b| configs.all[b].memory_slices.cmp(&configs.all[a].memory_slices).then(a.cmp(&b)));
        for i in gpus.split_off(cap as usize) {
            unplaced.iter_mut().zip(&configs.all[i].counts).for_each(|(u, n)| *u += n);
        }
        exact_run = false;
    }
    gpus.sort_unstable();
    // Over capacity, the bound is the one of what was placed: the GPUs it could not beat.
    let lower_bound = if unplaced.iter().any(|&u| u > 0) {
        let placed: Vec<u32> = demand.iter().zip(&unplaced).map(|(d, u)| d - u).collect();
        self::lower_bound(table, configs, &placed).min(gpus.len() as u32)
    } else {
        lower_bound
    };
    Packing { gpus, unplaced, exact: exact_run, lower_bound }
}
