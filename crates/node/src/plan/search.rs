//! Exact placement search: puts new GPU instances on legal, free placements around the kept ones,
//! most constrained profile first with backtracking, and returns the arrangement whose free space
//! stays most usable.

use crate::mig::capacity::Occupancy;
use crate::mig::{Placement, ProfileTable};
use std::cmp::Reverse;

/// How usable the free space of a final layout is; larger is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quality {
    /// Memory slices, then compute slices, of the largest profile still creatable.
    pub largest: (u32, u32),
    /// Free memory slices no creatable profile can use (fewer is better).
    pub stranded: Reverse<u32>,
}

impl Quality {
    /// Quality of a final occupancy.
    pub fn of(table: &ProfileTable, occ: &Occupancy) -> Self {
        Self {
            largest: occ.largest_creatable(table).map_or((0, 0), |p| (p.memory_slices, p.slices)),
            stranded: Reverse(occ.stranded_slices(table)),
        }
    }
}

/// Why no arrangement exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible(pub String);

/// Display `name@start` for a placed profile.
pub fn at(table: &ProfileTable, profile_id: u32, placement: Placement) -> String {
    let name = table.by_id(profile_id).map_or_else(|| format!("profile {profile_id}"), |p| p.name.to_string());
    format!("{name}@{}", placement.start)
}

/// Placement-independent checks: instance counts, memory and compute slices, media engines.
fn precheck(table: &ProfileTable, all: &[u32]) -> Result<(), Infeasible> {
    for p in &table.profiles {
        let n = all.iter().filter(|id| **id == p.id).count() as u32;
        if n > p.instance_count {
            return Err(Infeasible(format!(
                "needs {n} GPU instances of {} but the GPU allows {}",
                p.name, p.instance_count
            )));
        }
    }
    let profiles: Vec<_> = all.iter().filter_map(|id| table.by_id(*id)).collect();
    let mem: u32 = profiles.iter().map(|p| p.memory_slices).sum();
    if mem > table.memory_slices {
        return Err(Infeasible(format!("needs {mem} of {} memory slices", table.memory_slices)));
    }
    let compute: u32 = profiles.iter().map(|p| p.slices).sum();
    if compute > table.compute_slices {
        return Err(Infeasible(format!("needs {compute} of {} compute slices", table.compute_slices)));
    }
    let totals = table.engine_totals();
    let jpeg: u32 = profiles.iter().map(|p| p.engines.jpeg).sum();
    let ofa: u32 = profiles.iter().map(|p| p.engines.ofa).sum();
    if jpeg > totals.jpeg || ofa > totals.ofa {
        return Err(Infeasible(format!(
            "needs {} JPEG/OFA media engines but the GPU has {} (profiles with +me exclude each other)",
            jpeg.max(ofa),
            totals.jpeg.max(totals.ofa)
        )));
    }
    Ok(())
}

struct Dfs<'a, K, F> {
    table: &'a ProfileTable,
    kept: &'a [(u32, Placement)],
    order: Vec<(usize, u32)>,
    chosen: Vec<Placement>,
    rank: F,
    /// Stop at the first legal arrangement (feasibility only).
    first: bool,
    best: Option<(K, Vec<Placement>)>,
    deepest: Option<(usize, u32, Vec<Placement>)>,
}

impl<K: Ord, F: FnMut(&Occupancy, &[(u32, Placement)]) -> K> Dfs<'_, K, F> {
    fn walk(&mut self, depth: usize, occ: &Occupancy) {
        if self.first && self.best.is_some() {
            return;
        }
        if depth == self.order.len() && self.first {
            self.best = Some(((self.rank)(occ, &[]), Vec::new()));
            return;
        }
        if depth == self.order.len() {
            let placed: Vec<(u32, Placement)> = self
                .kept
                .iter()
                .copied()
                .chain(self.order.iter().zip(&self.chosen).map(|(&(_, id), p)| (id, *p)))
                .collect();
            let key = (self.rank)(occ, &placed);
            if self.best.as_ref().is_none_or(|(b, _)| key > *b) {
                self.best = Some((key, self.chosen.clone()));
            }
            return;
        }
        let (_, pid) = self.order[depth];
        let Some(profile) = self.table.by_id(pid) else {
            return;
        };
        let min_start = match depth.checked_sub(1).map(|d| self.order[d]) {
            Some((_, prev)) if prev == pid => self.chosen[depth - 1].start + 1,
            _ => 0,
        };
        let mut placed_any = false;
        for pl in profile.placements.iter().copied().filter(|p| p.start >= min_start) {
            if !occ.can_add(self.table, profile, pl) {
                continue;
            }
            placed_any = true;
            let mut next = *occ;
            next.add(profile, pl);
            self.chosen.push(pl);
            self.walk(depth + 1, &next);
            self.chosen.pop();
        }
        if !placed_any && self.deepest.as_ref().is_none_or(|(d, _, _)| depth > *d) {
            self.deepest = Some((depth, pid, self.chosen.clone()));
        }
    }
}

/// Whether the `new` profile ids have legal placements around `kept` (no ranking).
pub fn fits(table: &ProfileTable, kept: &[(u32, Placement)], new: &[u32]) -> bool {
    let all: Vec<u32> = kept.iter().map(|(id, _)| *id).chain(new.iter().copied()).collect();
    if precheck(table, &all).is_err() {
        return false;
    }
    let base = Occupancy::of(table, kept.iter().copied());
    let mut dfs = Dfs {
        table,
        kept,
        order: most_constrained_first(table, &base, new),
        chosen: Vec::new(),
        rank: |_: &Occupancy, _: &[(u32, Placement)]| (),
        first: true,
        best: None,
        deepest: None,
    };
    dfs.walk(0, &base);
    dfs.best.is_some()
}

fn most_constrained_first(table: &ProfileTable, base: &Occupancy, new: &[u32]) -> Vec<(usize, u32)> {
    let mut order: Vec<(usize, u32)> = new.iter().copied().enumerate().collect();
    order.sort_by_key(|&(_, id)| {
        let p = table.by_id(id);
        let free = p.map_or(0, |p| base.free_placements(p).count());
        (free, Reverse(p.map_or(0, |p| p.memory_slices)), id)
    });
    order
}

/// Finds placements for `new` profile ids around `kept` (profile id, placement) instances.
/// Returns one placement per entry of `new`, in order, and the quality of the result.
pub fn search(
    table: &ProfileTable,
    kept: &[(u32, Placement)],
    new: &[u32],
) -> Result<(Vec<Placement>, Quality), Infeasible> {
    search_ranked(table, kept, new, |occ, _| Quality::of(table, occ))
}

/// [`search`] with another ranking of the finished arrangements: `rank` sees the final
/// occupancy and every instance (kept first, then the new ones placed); the largest key wins,
/// the first found on a tie.
pub fn search_ranked<K: Ord>(
    table: &ProfileTable,
    kept: &[(u32, Placement)],
    new: &[u32],
    rank: impl FnMut(&Occupancy, &[(u32, Placement)]) -> K,
) -> Result<(Vec<Placement>, K), Infeasible> {
    let all: Vec<u32> = kept.iter().map(|(id, _)| *id).chain(new.iter().copied()).collect();
    precheck(table, &all)?;
    let base = Occupancy::of(table, kept.iter().copied());
    let order = most_constrained_first(table, &base, new);
    let mut dfs = Dfs { table, kept, order, chosen: Vec::new(), rank, first: false, best: None, deepest: None };
    dfs.walk(0, &base);
    if let Some((quality, chosen)) = dfs.best {
        let mut out = vec![Placement::new(0, 0); new.len()];
        for (k, &(i, _)) in dfs.order.iter().enumerate() {
            out[i] = chosen[k];
        }
        return Ok((out, quality));
    }
    let (depth, pid, chosen) = dfs.deepest.unwrap_or((0, new.first().copied().unwrap_or(0), Vec::new()));
    let mut around: Vec<String> = kept.iter().map(|(id, p)| at(table, *id, *p)).collect();
    let kept_n = around.len();
    around.extend(dfs.order[..depth].iter().zip(&chosen).map(|(&(_, id), p)| at(table, id, *p)));
    let name = table.by_id(pid).map_or_else(|| format!("profile {pid}"), |p| p.name.to_string());
    let context = match (kept_n, around.len()) {
        (_, 0) => String::new(),
        (k, n) if k == n => format!(" once {} are kept", around.join(",")),
        (0, _) => format!(" once {} are placed", around.join(",")),
        _ => format!(" once {} are kept and {} placed", around[..kept_n].join(","), around[kept_n..].join(",")),
    };
    Err(Infeasible(format!("no legal placement for {name}{context}")))
}

/// Every legal arrangement of the GPU instances `ids` on an empty GPU (identical profiles in
/// increasing placement order, so each arrangement appears once): the oracle's search space.
pub fn arrangements(table: &ProfileTable, ids: &[u32]) -> Vec<Vec<(u32, Placement)>> {
    let mut out = Vec::new();
    let _ = search_ranked(table, &[], ids, |_, placed| {
        out.push(placed.to_vec());
    });
    out
}
