//! The layout planner: desired MIG devices vs. a GPU's current instances → the minimal set of
//! instances to destroy and create, with explicit placements. Pure; no I/O.
//!
//! Objective, in order: no busy instance destroyed; fewest GPU instances destroyed; fewest
//! created; fewest whose compute instances are redone (an idle GPU instance of a wanted profile
//! with another CI split stays in place and only its CIs change); then the fewest expected
//! operations of the next one-instance swap ([`next`]); then the most usable free space
//! ([`search::Quality`]). Every subset of the current
//! instances is considered for keeping (a GPU has at most 7), and each candidate is completed by
//! exact placement search, so a feasible layout is never rejected.

pub mod configs;
pub mod next;
pub mod pack;
pub mod search;

use crate::layout::{DesiredDevices, DeviceKey};
use crate::mig::{Placement, ProfileTable};
use crate::observed::{GiState, Process};
use next::NextSwaps;
use pack::{pack, GiShape};
use search::{at, search, search_ranked, Quality};
use std::cmp::Reverse;
use std::collections::HashMap;
use std::fmt;

/// A GPU instance the plan keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepGi {
    /// GI id.
    pub gi_id: u32,
    /// Profile name.
    pub name: String,
    /// Placement.
    pub placement: Placement,
}

/// A GPU instance the plan destroys (its CIs first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestroyGi {
    /// GI id.
    pub gi_id: u32,
    /// GI profile id.
    pub profile_id: u32,
    /// Profile name.
    pub name: String,
    /// Placement.
    pub placement: Placement,
    /// Its CI ids, destroyed first.
    pub ci_ids: Vec<u32>,
    /// Whether processes use it (only with `--force`).
    pub busy: bool,
}

/// A GPU instance the plan creates, then its CIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateGi {
    /// GI profile id.
    pub profile_id: u32,
    /// Profile name.
    pub name: String,
    /// Placement in memory slices.
    pub placement: Placement,
    /// CIs: (CI profile id, placement in compute slices).
    pub cis: Vec<(u32, Placement)>,
    /// MIG device names of those CIs.
    pub device_names: Vec<String>,
}

/// A GPU instance that stays where it is with a new compute-instance split: its CIs are
/// destroyed and the new ones created inside it (e.g. `3g.40gb` ↔ three `1c.3g.40gb`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshapeGi {
    /// GI id.
    pub gi_id: u32,
    /// Profile name.
    pub name: String,
    /// Placement (unchanged).
    pub placement: Placement,
    /// Its current CI ids, destroyed first.
    pub ci_ids: Vec<u32>,
    /// The new CIs: (CI profile id, placement in compute slices).
    pub cis: Vec<(u32, Placement)>,
    /// MIG device names of the new CIs.
    pub device_names: Vec<String>,
}

/// What to do on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Instances left as they are.
    pub keep: Vec<KeepGi>,
    /// Instances kept with their compute instances redone.
    pub reshape: Vec<ReshapeGi>,
    /// Instances to destroy.
    pub destroy: Vec<DestroyGi>,
    /// Instances to create.
    pub create: Vec<CreateGi>,
    /// Usability of the free space afterwards.
    pub quality: Quality,
}

impl Plan {
    /// True when nothing changes.
    pub fn is_noop(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty() && self.reshape.is_empty()
    }
}

/// A busy instance that stands in the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyInstance {
    /// GI id.
    pub gi_id: u32,
    /// Profile name.
    pub name: String,
    /// Placement.
    pub placement: Placement,
    /// MIG device UUIDs in it.
    pub uuids: Vec<String>,
    /// Processes using it.
    pub processes: Vec<Process>,
    /// Containers the kubelet allocated its MIG devices to.
    pub pods: Vec<crate::observed::PodUse>,
}

impl fmt::Display for BusyInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{} (GPU instance {}", self.name, self.placement.start, self.gi_id)?;
        for u in &self.uuids {
            write!(f, ", {u}")?;
        }
        let pids: Vec<String> = self
            .processes
            .iter()
            .map(|p| if p.name.is_empty() { p.pid.to_string() } else { format!("{} ({})", p.pid, p.name) })
            .collect();
        let pods: Vec<String> = self.pods.iter().map(ToString::to_string).collect();
        match (pids.is_empty(), pods.is_empty()) {
            (false, true) => write!(f, ") is used by pid {}", pids.join(", ")),
            (true, false) => write!(f, ") is allocated to pod {}", pods.join(", ")),
            _ => write!(f, ") is used by pid {} and allocated to pod {}", pids.join(", "), pods.join(", ")),
        }
    }
}

/// Why a GPU cannot be brought to the desired layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No arrangement of the desired layout exists on this GPU.
    #[error("layout cannot fit: {reason}")]
    Infeasible {
        /// The reason in words.
        reason: String,
    },
    /// Every arrangement destroys instances that are in use.
    #[error("{} busy instance(s) would have to be destroyed: {}; {reason}. Stop the processes (or pods) or pass --force", .instances.len(), .instances.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Blocked {
        /// The busy instances in the way.
        instances: Vec<BusyInstance>,
        /// Why they cannot stay.
        reason: String,
    },
}

struct Candidate {
    busy_destroyed: usize,
    destroyed: usize,
    created: usize,
    kept: Vec<usize>,
    shapes: Vec<GiShape>,
    /// (current GI index, shape index): idle GIs that take a new shape's CIs in place.
    reshaped: Vec<(usize, usize)>,
}

/// Pairs idle, not-kept GIs with new shapes of their profile and a different CI split, so each
/// stays in place and only its compute instances change.
fn reshapes(current: &[GiState], kept: &[usize], shapes: &[GiShape]) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (k, s) in shapes.iter().enumerate() {
        let mut want: Vec<u32> = s.cis.iter().map(|(id, _)| *id).collect();
        want.sort_unstable();
        let found = (0..current.len()).find(|&i| {
            let g = &current[i];
            let mut have: Vec<u32> = g.cis.iter().map(|c| c.profile_id).collect();
            have.sort_unstable();
            g.profile_id == s.profile_id
                && !g.busy()
                && have != want
                && !kept.contains(&i)
                && !pairs.iter().any(|(j, _)| *j == i)
        });
        if let Some(i) = found {
            pairs.push((i, k));
        }
    }
    pairs
}

impl Candidate {
    /// The shapes created as new GPU instances (not taken by a reshaped one).
    fn new_shapes(&self) -> impl Iterator<Item = &GiShape> {
        self.shapes.iter().enumerate().filter(|(k, _)| !self.reshaped.iter().any(|(_, r)| r == k)).map(|(_, s)| s)
    }

    /// Busy GIs destroyed, GIs destroyed, GIs created, then GIs whose CIs are redone.
    fn cost(&self) -> (usize, usize, usize, usize) {
        (self.busy_destroyed, self.destroyed, self.created, self.reshaped.len())
    }
}

fn devices_of(gi: &GiState) -> impl Iterator<Item = DeviceKey> + '_ {
    gi.cis.iter().map(move |c| (gi.profile_id, c.profile_id))
}

/// Subtracts the devices of `kept` from `desired`; `None` when a kept device is not wanted.
fn remainder(desired: &DesiredDevices, kept: &[&GiState]) -> Option<std::collections::BTreeMap<DeviceKey, u32>> {
    let mut rem = desired.counts.clone();
    for key in kept.iter().flat_map(|g| devices_of(g)) {
        let n = rem.get_mut(&key).filter(|n| **n > 0)?;
        *n -= 1;
    }
    rem.retain(|_, n| *n > 0);
    Some(rem)
}

fn unpackable() -> PlanError {
    PlanError::Infeasible { reason: "a MIG device does not fit its GPU-instance profile".into() }
}

/// Plans one GPU: `current` instances vs. `desired` devices. With `force`, busy instances may be
/// destroyed when no plan can keep them. Ties are broken for uniform next swaps.
pub fn plan(
    table: &ProfileTable,
    current: &[GiState],
    desired: &DesiredDevices,
    force: bool,
) -> Result<Plan, PlanError> {
    plan_for_mix(table, current, desired, force, &[])
}

/// [`plan`], breaking ties for the next swap under a workload mix (GPU-instance profile id,
/// weight); an empty mix weighs every swap alike.
pub fn plan_for_mix(
    table: &ProfileTable,
    current: &[GiState],
    desired: &DesiredDevices,
    force: bool,
    mix: &[(u32, f64)],
) -> Result<Plan, PlanError> {
    let n = current.len();
    if n > 16 {
        return Err(PlanError::Infeasible {
            reason: format!("{n} GPU instances exist, more than any MIG GPU supports"),
        });
    }
    let mut candidates = Vec::new();
    for mask in 0u32..(1 << n) {
        let kept: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        let kept_gis: Vec<&GiState> = kept.iter().map(|&i| &current[i]).collect();
        if kept_gis.iter().any(|g| g.cis.is_empty() || table.by_id(g.profile_id).is_none()) {
            continue;
        }
        let Some(rem) = remainder(desired, &kept_gis) else {
            continue;
        };
        let shapes = pack(table, &rem).ok_or_else(unpackable)?;
        let busy_destroyed = (0..n).filter(|i| mask & (1 << i) == 0 && current[*i].busy()).count();
        let reshaped = reshapes(current, &kept, &shapes);
        if !reshaped.is_empty() {
            candidates.push(Candidate {
                busy_destroyed,
                destroyed: n - kept.len() - reshaped.len(),
                created: shapes.len() - reshaped.len(),
                kept: kept.clone(),
                shapes: shapes.clone(),
                reshaped,
            });
        }
        candidates.push(Candidate {
            busy_destroyed,
            destroyed: n - kept.len(),
            created: shapes.len(),
            kept,
            shapes,
            reshaped: Vec::new(),
        });
    }
    candidates.sort_by_key(|c| c.cost());
    let mut next = NextChange { table, mix, swaps: HashMap::new(), ops: HashMap::new(), best: u64::MAX };
    let mut best: Option<(&Candidate, Vec<Placement>, Rank)> = None;
    for group in candidates.chunk_by(|a, b| a.cost() == b.cost()) {
        for cand in group {
            let kept: Vec<(u32, Placement)> = cand
                .kept
                .iter()
                .chain(cand.reshaped.iter().map(|(i, _)| i))
                .map(|&i| (current[i].profile_id, current[i].placement))
                .collect();
            let new: Vec<u32> = cand.new_shapes().map(|s| s.profile_id).collect();
            let ranked = search_ranked(table, &kept, &new, |occ, placed| {
                (Reverse(next.weighted_ops(placed)), Quality::of(table, occ))
            });
            if let Ok((placements, rank)) = ranked {
                if best.as_ref().is_none_or(|(_, _, r)| rank > *r) {
                    best = Some((cand, placements, rank));
                }
            }
        }
        if best.is_some() {
            break;
        }
    }
    let Some((cand, placements, (_, quality))) = best else {
        let shapes = pack(table, &desired.counts).ok_or_else(unpackable)?;
        let new: Vec<u32> = shapes.iter().map(|s| s.profile_id).collect();
        let reason = match search(table, &[], &new) {
            Err(e) => e.0,
            Ok(_) => "no arrangement keeps the existing instances".into(),
        };
        return Err(PlanError::Infeasible { reason });
    };
    if cand.busy_destroyed > 0 && !force {
        return Err(blocked(table, current, desired, &cand.kept));
    }
    Ok(build(table, current, cand, &placements, quality))
}

/// How a finished arrangement ranks among plans of equal cost; larger is better.
type Rank = (Reverse<u64>, Quality);

/// The next-swap figures of the arrangements one plan call ranks, each computed once.
struct NextChange<'a> {
    table: &'a ProfileTable,
    mix: &'a [(u32, f64)],
    /// Swaps per layout (sorted profile ids).
    swaps: HashMap<Vec<u32>, NextSwaps>,
    /// Weighted next-swap operations per arrangement (sorted), where computed in full.
    ops: HashMap<Vec<(u32, Placement)>, u64>,
    /// The fewest seen so far: an arrangement sure to need more is not computed in full.
    best: u64,
}

impl NextChange<'_> {
    fn weighted_ops(&mut self, placed: &[(u32, Placement)]) -> u64 {
        let mut key = placed.to_vec();
        key.sort_by_key(|(id, p)| (*id, p.start));
        if let Some(&v) = self.ops.get(&key) {
            return v;
        }
        let layout: Vec<u32> = key.iter().map(|(id, _)| *id).collect();
        let (table, mix) = (self.table, self.mix);
        let swaps = self.swaps.entry(layout.clone()).or_insert_with(|| NextSwaps::of(table, &layout, mix));
        // Sure to lose: ranked below every arrangement computed in full.
        let Some(v) = swaps.weighted_ops_milli_within(table, &key, self.best) else {
            return u64::MAX;
        };
        self.best = self.best.min(v);
        self.ops.insert(key, v);
        v
    }
}

fn build(
    table: &ProfileTable,
    current: &[GiState],
    cand: &Candidate,
    placements: &[Placement],
    quality: Quality,
) -> Plan {
    let name = |id: u32| table.by_id(id).map_or_else(|| format!("profile {id}"), |p| p.name.to_string());
    let keep = cand
        .kept
        .iter()
        .map(|&i| KeepGi { gi_id: current[i].id, name: name(current[i].profile_id), placement: current[i].placement })
        .collect();
    let reshaped = |i: &usize| cand.reshaped.iter().any(|(j, _)| j == i);
    let destroy = (0..current.len())
        .filter(|i| !cand.kept.contains(i) && !reshaped(i))
        .map(|i| {
            let g = &current[i];
            DestroyGi {
                gi_id: g.id,
                profile_id: g.profile_id,
                name: name(g.profile_id),
                placement: g.placement,
                ci_ids: g.cis.iter().map(|c| c.id).collect(),
                busy: g.busy(),
            }
        })
        .collect();
    let device_names = |s: &GiShape| -> Vec<String> {
        let gi = table.by_id(s.profile_id);
        s.cis.iter().map(|(ci, _)| gi.map_or_else(String::new, |g| g.device_name(*ci).to_string())).collect()
    };
    let reshape = cand
        .reshaped
        .iter()
        .map(|&(i, k)| {
            let g = &current[i];
            ReshapeGi {
                gi_id: g.id,
                name: name(g.profile_id),
                placement: g.placement,
                ci_ids: g.cis.iter().map(|c| c.id).collect(),
                cis: cand.shapes[k].cis.clone(),
                device_names: device_names(&cand.shapes[k]),
            }
        })
        .collect();
    let mut create: Vec<CreateGi> = cand
        .new_shapes()
        .zip(placements)
        .map(|(s, p)| CreateGi {
            profile_id: s.profile_id,
            name: name(s.profile_id),
            placement: *p,
            cis: s.cis.clone(),
            device_names: device_names(s),
        })
        .collect();
    create.sort_by_key(|c| c.placement.start);
    Plan { keep, reshape, destroy, create, quality }
}

fn blocked(table: &ProfileTable, current: &[GiState], desired: &DesiredDevices, kept: &[usize]) -> PlanError {
    let busy: Vec<&GiState> = current.iter().filter(|g| g.busy()).collect();
    let instances = current
        .iter()
        .enumerate()
        .filter(|(i, g)| g.busy() && !kept.contains(i))
        .map(|(_, g)| BusyInstance {
            gi_id: g.id,
            name: table.by_id(g.profile_id).map_or_else(|| format!("profile {}", g.profile_id), |p| p.name.to_string()),
            placement: g.placement,
            uuids: g.cis.iter().map(|c| c.uuid.clone()).collect(),
            processes: g.all_processes().cloned().collect(),
            pods: g.all_pods().cloned().collect(),
        })
        .collect();
    let reason = match remainder(desired, &busy) {
        None => "their MIG devices are not part of the desired layout".to_string(),
        Some(rem) => {
            let kept: Vec<(u32, Placement)> = busy.iter().map(|g| (g.profile_id, g.placement)).collect();
            let new: Vec<u32> = pack(table, &rem).unwrap_or_default().iter().map(|s| s.profile_id).collect();
            match search(table, &kept, &new) {
                Err(e) => e.0,
                Ok(_) => format!(
                    "the layout cannot be completed around {}",
                    kept.iter().map(|(id, p)| at(table, *id, *p)).collect::<Vec<_>>().join(",")
                ),
            }
        }
    };
    PlanError::Blocked { instances, reason }
}

#[cfg(test)]
mod tests;
