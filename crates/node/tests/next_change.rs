//! Placements chosen for the change after this one. Oracles use only the planner itself: the
//! operations of a swap are what `plan` spends from that arrangement, and the best arrangement of
//! a layout is found by trying every legal one.

use gpupart_node::frag::Workload;
use gpupart_node::layout::DesiredDevices;
use gpupart_node::mig::{catalog, Placement, ProfileTable};
use gpupart_node::observed::GiState;
use gpupart_node::plan::configs::enumerate;
use gpupart_node::plan::next::{swap_ops, NextSwaps};
use gpupart_node::plan::search::arrangements;
use gpupart_node::plan::{plan, plan_for_mix};
use proptest::prelude::*;

fn table(model: &str) -> ProfileTable {
    catalog::lookup(model).expect("catalog model").profile_table()
}

fn desired(t: &ProfileTable, ids: &[u32]) -> DesiredDevices {
    DesiredDevices::from_keys(ids.iter().map(|&id| (id, t.by_id(id).and_then(|p| p.full_ci()).map_or(0, |c| c.id))))
}

fn gis(t: &ProfileTable, arrangement: &[(u32, Placement)]) -> Vec<GiState> {
    let gi = |k: usize, &(id, pl): &(u32, Placement)| GiState::with_full_ci(t, k as u32 + 1, id, pl).expect("profile");
    arrangement.iter().enumerate().map(|(k, a)| gi(k, a)).collect()
}

/// Every feasible layout of the model, as GPU-instance profile ids.
fn layouts(t: &ProfileTable) -> Vec<Vec<u32>> {
    let ids: Vec<u32> = t.profiles.iter().map(|p| p.id).collect();
    enumerate(t, &ids, &Workload::default())
        .all
        .iter()
        .map(|c| ids.iter().zip(&c.counts).flat_map(|(&id, &n)| std::iter::repeat_n(id, n as usize)).collect())
        .collect()
}

/// The one-instance swaps of a layout that are feasible: (removed, added, target layout).
fn swaps(t: &ProfileTable, layout: &[u32], feasible: &[Vec<u32>]) -> Vec<(u32, u32, Vec<u32>)> {
    let mut kinds = layout.to_vec();
    kinds.dedup();
    let mut out = Vec::new();
    for &x in &kinds {
        for y in t.profiles.iter().map(|p| p.id).filter(|&y| y != x) {
            let mut target = layout.to_vec();
            let i = target.iter().position(|&p| p == x).expect("present");
            target[i] = y;
            let mut sorted = target.clone();
            sorted.sort_unstable();
            if feasible.iter().any(|f| {
                let mut g = f.clone();
                g.sort_unstable();
                g == sorted
            }) {
                out.push((x, y, target));
            }
        }
    }
    out
}

/// GPU-instance operations `plan` spends from `arrangement` to `target`.
fn planned_ops(t: &ProfileTable, arrangement: &[(u32, Placement)], target: &[u32]) -> usize {
    let p = plan(t, &gis(t, arrangement), &desired(t, target), false).expect("feasible target");
    p.destroy.len() + p.create.len()
}

/// What the planner creates on an empty GPU for `layout` (under `mix`).
fn created(t: &ProfileTable, layout: &[u32], mix: &[(u32, f64)]) -> Vec<(u32, Placement)> {
    let p = plan_for_mix(t, &[], &desired(t, layout), false, mix).expect("feasible");
    p.create.iter().map(|c| (c.profile_id, c.placement)).collect()
}

/// Weighted planner operations of every swap of `layout` from `arrangement`.
fn next_cost(
    t: &ProfileTable,
    arrangement: &[(u32, Placement)],
    swaps: &[(u32, u32, Vec<u32>)],
    mix: &[(u32, f64)],
) -> f64 {
    let weight = |y: u32| if mix.is_empty() { 1.0 } else { mix.iter().filter(|m| m.0 == y).map(|m| m.1).sum() };
    swaps.iter().map(|(_, y, target)| weight(*y) * planned_ops(t, arrangement, target) as f64).sum()
}

#[test]
fn swap_ops_is_what_the_planner_spends_on_an_a30() {
    let t = table("A30-24GB");
    let feasible = layouts(&t);
    let mut checked = 0;
    for layout in &feasible {
        for arrangement in arrangements(&t, layout) {
            for (x, y, target) in swaps(&t, layout, &feasible) {
                assert_eq!(
                    swap_ops(&t, &arrangement, x, y),
                    Some(planned_ops(&t, &arrangement, &target)),
                    "{arrangement:?}: {x} -> {y}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} swaps checked");
}

#[test]
fn every_a30_layout_is_placed_best_for_the_next_swap() {
    let t = table("A30-24GB");
    let feasible = layouts(&t);
    for layout in &feasible {
        let swaps = swaps(&t, layout, &feasible);
        let best = arrangements(&t, layout).iter().map(|a| next_cost(&t, a, &swaps, &[]) as u64).min().expect("one");
        let chosen = created(&t, layout, &[]);
        assert_eq!(next_cost(&t, &chosen, &swaps, &[]) as u64, best, "{layout:?} placed {chosen:?}");
    }
}

#[test]
fn every_a100_layout_is_placed_best_for_the_next_swap() {
    // The swap matrix of benches/swaps.rs: summed over every feasible layout created from an
    // empty GPU, the planner's arrangements cost the next swap no more than the best fixed ones.
    let t = table("A100-SXM4-80GB");
    let feasible = layouts(&t);
    let (mut planned, mut best_total) = (0u64, 0u64);
    for layout in &feasible {
        let swaps = swaps(&t, layout, &feasible);
        let best = arrangements(&t, layout).iter().map(|a| next_cost(&t, a, &swaps, &[]) as u64).min().expect("one");
        let chosen = next_cost(&t, &created(&t, layout, &[]), &swaps, &[]) as u64;
        assert_eq!(chosen, best, "{layout:?}");
        planned += chosen;
        best_total += best;
    }
    assert_eq!((planned, best_total), (2086, 2086));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A100-SXM4-80GB: a random layout and arrangement; every swap's operations match the
    /// planner's, and the planner's own arrangement is the best of all (uniform or under a mix).
    #[test]
    fn a100_layouts_are_placed_best_for_the_next_swap(
        pick in 0usize..1000,
        arrangement_pick in 0usize..1000,
        weights in proptest::collection::vec(0u32..4, 7),
        use_mix in any::<bool>(),
    ) {
        let t = table("A100-SXM4-80GB");
        let feasible = layouts(&t);
        let layout = &feasible[pick % feasible.len()];
        let swaps = swaps(&t, layout, &feasible);
        let all = arrangements(&t, layout);
        let some = &all[arrangement_pick % all.len()];
        for (x, y, target) in &swaps {
            prop_assert_eq!(swap_ops(&t, some, *x, *y), Some(planned_ops(&t, some, target)));
        }
        let mix: Vec<(u32, f64)> = if use_mix {
            t.profiles.iter().zip(&weights).map(|(p, &w)| (p.id, f64::from(w))).collect()
        } else {
            Vec::new()
        };
        let best = all.iter().map(|a| next_cost(&t, a, &swaps, &mix)).fold(f64::INFINITY, f64::min);
        let chosen = created(&t, layout, &mix);
        prop_assert_eq!(next_cost(&t, &chosen, &swaps, &mix), best, "{:?} placed {:?}", layout, chosen);
    }
}

#[test]
fn the_workload_mix_changes_where_instances_go() {
    // When only 4g.40gb is ever added next, some A100-SXM4-80GB layout is placed so that this
    // next change is strictly cheaper than from the placement for uniform swaps.
    let t = table("A100-SXM4-80GB");
    let four = t.profiles.iter().find(|p| p.name.to_string() == "4g.40gb").expect("4g.40gb").id;
    let mix = [(four, 1.0)];
    let feasible = layouts(&t);
    let better = feasible.iter().find(|layout| {
        let swaps = swaps(&t, layout, &feasible);
        next_cost(&t, &created(&t, layout, &mix), &swaps, &mix) < next_cost(&t, &created(&t, layout, &[]), &swaps, &mix)
    });
    assert!(better.is_some(), "the mix never changed a placement");
    // Only swaps that add a 4g.40gb count under that mix.
    let layout = better.expect("checked");
    assert!(NextSwaps::of(&t, layout, &mix).len() < NextSwaps::of(&t, layout, &[]).len());
}
