//! The change after this one: how many GPU-instance operations the next one-instance swap costs
//! from a final arrangement, on average over the swaps a layout can take. The planner uses it to
//! choose, among plans of equal cost, the placements that make the next change cheapest.
//!
//! A swap replaces one instance of profile `x` by one of profile `y` (the layout stays feasible).
//! From an arrangement, the planner spends `2 × (1 + m)` operations on it: `x` destroyed and `y`
//! created, plus `m` other instances destroyed and created elsewhere, `m` the fewest that make
//! room ([`swap_ops`]). Swaps are weighted 1 each, or by the workload mix's weight of `y`.

use super::search::fits;
use crate::mig::capacity::Occupancy;
use crate::mig::{GiProfile, Placement, ProfileTable};

/// The one-instance swaps a layout can take, with their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct NextSwaps {
    /// (removed profile id, added profile id, weight), each pair once.
    swaps: Vec<(u32, u32, f64)>,
}

impl NextSwaps {
    /// The feasible swaps of the layout `profiles` (GPU-instance profile ids). `mix` weighs the
    /// added profile (profile id, weight); empty means every swap weighs 1, and a profile the mix
    /// leaves out is never added.
    pub fn of(table: &ProfileTable, profiles: &[u32], mix: &[(u32, f64)]) -> Self {
        let mut removable: Vec<u32> = profiles.to_vec();
        removable.sort_unstable();
        removable.dedup();
        let mut swaps = Vec::new();
        for &x in &removable {
            for y in table.profiles.iter().map(|p| p.id).filter(|&y| y != x) {
                let weight =
                    if mix.is_empty() { 1.0 } else { mix.iter().filter(|(id, _)| *id == y).map(|(_, w)| *w).sum() };
                if weight <= 0.0 {
                    continue;
                }
                let mut target = profiles.to_vec();
                if let Some(i) = target.iter().position(|&p| p == x) {
                    target[i] = y;
                }
                if fits(table, &[], &target) {
                    swaps.push((x, y, weight));
                }
            }
        }
        // Large additions first: they move instances most often, so a bound cuts early.
        swaps.sort_by_key(|&(_, y, _)| std::cmp::Reverse(table.by_id(y).map_or(0, |p| p.memory_slices)));
        Self { swaps }
    }

    /// How many swaps there are.
    pub fn len(&self) -> usize {
        self.swaps.len()
    }

    /// Whether the layout takes no swap at all.
    pub fn is_empty(&self) -> bool {
        self.swaps.is_empty()
    }

    /// Total weighted operations of the next swap from `arrangement`, in thousandths of an
    /// operation per unit of weight (an integer, so plans compare exactly), or `None` as soon as
    /// it is sure to exceed `limit` (every swap costs at least 2 operations, 4 when something
    /// must move, so the rest is bounded below).
    pub fn weighted_ops_milli_within(
        &self,
        table: &ProfileTable,
        arrangement: &[(u32, Placement)],
        limit: u64,
    ) -> Option<u64> {
        let milli = |w: f64, ops: usize| (w * ops as f64 * 1000.0).round() as u64;
        // First the cheap pass: which swaps need nothing moved (2 operations); every other one
        // needs at least 4, which bounds the total before any costly search.
        let easy: Vec<bool> = self.swaps.iter().map(|&(x, y, _)| nothing_moves(table, arrangement, x, y)).collect();
        let mut bound: u64 = self.swaps.iter().zip(&easy).map(|(&(_, _, w), &e)| milli(w, if e { 2 } else { 4 })).sum();
        if bound > limit {
            return None;
        }
        for (&(x, y, w), _) in self.swaps.iter().zip(&easy).filter(|(_, e)| !**e) {
            let ops = swap_ops(table, arrangement, x, y).unwrap_or(2 * (arrangement.len() + 1));
            bound = bound - milli(w, 4) + milli(w, ops);
            if bound > limit {
                return None;
            }
        }
        Some(bound)
    }
}

/// Operations (destroys + creates) the fewest-destroys plan spends turning `arrangement` into
/// the layout with one `x` replaced by a `y`: `2 × (1 + m)`, `m` the fewest other instances that
/// must move. `None` when the arrangement holds no `x` or the target has no legal arrangement.
pub fn swap_ops(table: &ProfileTable, arrangement: &[(u32, Placement)], x: u32, y: u32) -> Option<usize> {
    let added = table.by_id(y)?;
    let placed: Vec<(&GiProfile, Placement)> =
        arrangement.iter().filter_map(|&(id, pl)| table.by_id(id).map(|p| (p, pl))).collect();
    let n = placed.len();
    let copies: Vec<usize> = (0..n).filter(|&i| placed[i].0.id == x).collect();
    if nothing_moves(table, arrangement, x, y) {
        return Some(2);
    }
    for m in 1..n {
        for &i in &copies {
            for moved in subsets(n, m).filter(|s| s & (1 << i) == 0) {
                let mut occ = Occupancy::empty();
                for k in (0..n).filter(|&k| k != i && moved & (1 << k) == 0) {
                    occ.add(placed[k].0, placed[k].1);
                }
                let mut new: Vec<&GiProfile> = (0..n).filter(|&k| moved & (1 << k) != 0).map(|k| placed[k].0).collect();
                new.push(added);
                new.sort_by_key(|p| std::cmp::Reverse(p.memory_slices));
                if place_all(table, occ, &new) {
                    return Some(2 * (1 + m));
                }
            }
        }
    }
    None
}

/// Whether every profile of `new` gets a legal placement on top of `occ` (small inputs: a plain
/// depth-first search, largest first).
fn place_all(table: &ProfileTable, occ: Occupancy, new: &[&GiProfile]) -> bool {
    let Some((p, rest)) = new.split_first() else { return true };
    p.placements.iter().any(|&pl| {
        occ.can_add(table, p, pl) && {
            let mut next = occ;
            next.add(p, pl);
            place_all(table, next, rest)
        }
    })
}

/// Whether `y` fits in the room one `x` of `arrangement` leaves (the common case, cheaply).
fn nothing_moves(table: &ProfileTable, arrangement: &[(u32, Placement)], x: u32, y: u32) -> bool {
    let Some(added) = table.by_id(y) else { return false };
    (0..arrangement.len()).filter(|&i| arrangement[i].0 == x).any(|i| {
        let rest = arrangement.iter().enumerate().filter(|(k, _)| *k != i).map(|(_, a)| *a);
        let occ = Occupancy::of(table, rest);
        added.placements.iter().any(|&pl| occ.can_add(table, added, pl))
    })
}

/// Bit masks over `n` items with exactly `k` set.
fn subsets(n: usize, k: usize) -> impl Iterator<Item = u32> {
    (0u32..(1 << n)).filter(move |m| m.count_ones() as usize == k)
}
