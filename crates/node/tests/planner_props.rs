//! Property tests of the planner on every MIG model of the catalog: random current layouts with
//! random busy instances × random feasible desired layouts. The result must reach exactly the
//! desired devices with legal, disjoint placements, never destroy a busy instance without
//! `--force`, and destroy exactly as few instances as a brute-force search over all arrangements.

use gpupart_node::layout::DesiredDevices;
use gpupart_node::mig::capacity::Occupancy;
use gpupart_node::mig::{catalog, Placement, ProfileTable};
use gpupart_node::observed::{GiState, Process};
use gpupart_node::plan::{plan, PlanError};
use proptest::prelude::*;

fn mig_tables() -> Vec<(&'static str, ProfileTable)> {
    catalog::models().filter(|m| m.mig_capable()).map(|m| (m.id, m.profile_table())).collect()
}

/// Builds a layout by trying (profile, placement) picks in order and keeping those that fit.
fn build(table: &ProfileTable, picks: &[(usize, usize)]) -> Vec<(u32, Placement)> {
    let mut occ = Occupancy::empty();
    let mut out = Vec::new();
    for &(pi, li) in picks {
        let p = &table.profiles[pi % table.profiles.len()];
        let pl = p.placements[li % p.placements.len()];
        if occ.check(table, p, pl).is_ok() {
            occ.add(p, pl);
            out.push((p.id, pl));
        }
    }
    out
}

fn gi_state(table: &ProfileTable, id: u32, profile_id: u32, placement: Placement, busy: bool) -> GiState {
    let mut g = GiState::with_full_ci(table, id, profile_id, placement).unwrap();
    if busy {
        g.cis[0].processes.push(Process { pid: 1000 + id, name: "p".into(), used_memory_mib: 1 });
    }
    g
}

/// Every arrangement of the GI multiset `want` (profile ids) on an empty GPU.
fn arrangements(table: &ProfileTable, want: &[u32]) -> Vec<Vec<(u32, Placement)>> {
    fn go(
        t: &ProfileTable,
        want: &[u32],
        i: usize,
        occ: &Occupancy,
        cur: &mut Vec<(u32, Placement)>,
        out: &mut Vec<Vec<(u32, Placement)>>,
    ) {
        if i == want.len() {
            out.push(cur.clone());
            return;
        }
        let p = t.by_id(want[i]).unwrap();
        let min = if i > 0 && want[i - 1] == want[i] { cur[i - 1].1.start + 1 } else { 0 };
        for &pl in p.placements.iter().filter(|pl| pl.start >= min) {
            if occ.check(t, p, pl).is_ok() {
                let mut o = *occ;
                o.add(p, pl);
                cur.push((p.id, pl));
                go(t, want, i + 1, &o, cur, out);
                cur.pop();
            }
        }
    }
    let mut sorted = want.to_vec();
    sorted.sort_unstable();
    let mut out = Vec::new();
    go(table, &sorted, 0, &Occupancy::empty(), &mut Vec::new(), &mut out);
    out
}

/// Brute-force minimum of (busy destroyed, destroyed) over all final arrangements.
fn oracle(table: &ProfileTable, current: &[GiState], want: &[u32]) -> (usize, usize) {
    arrangements(table, want)
        .iter()
        .map(|arr| {
            let kept: Vec<&GiState> = current.iter().filter(|g| arr.contains(&(g.profile_id, g.placement))).collect();
            let busy = current.iter().filter(|g| g.busy() && !kept.iter().any(|k| k.id == g.id)).count();
            (busy, current.len() - kept.len())
        })
        .min()
        .expect("the desired layout is feasible by construction")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_minimal_legal_and_safe(
        model in 0usize..9,
        current_picks in proptest::collection::vec((0usize..16, 0usize..8), 0..10),
        busy in proptest::collection::vec(proptest::bool::weighted(0.25), 10),
        desired_picks in proptest::collection::vec((0usize..16, 0usize..8), 0..10),
    ) {
        let tables = mig_tables();
        let (name, table) = &tables[model % tables.len()];
        let current: Vec<GiState> = build(table, &current_picks)
            .into_iter()
            .enumerate()
            .map(|(i, (pid, pl))| gi_state(table, i as u32 + 1, pid, pl, busy[i]))
            .collect();
        let want: Vec<u32> = build(table, &desired_picks).into_iter().map(|(pid, _)| pid).collect();
        let desired = DesiredDevices::from_keys(want.iter().map(|pid| (*pid, table.by_id(*pid).unwrap().full_ci().unwrap().id)));
        let (best_busy, best_destroyed) = oracle(table, &current, &want);

        let forced = plan(table, &current, &desired, true);
        prop_assert!(forced.is_ok(), "{name}: a feasible layout was rejected: {:?}", forced);
        match plan(table, &current, &desired, false) {
            Ok(p) => {
                prop_assert_eq!(best_busy, 0);
                prop_assert!(p.destroy.iter().all(|d| !d.busy), "{}: busy instance destroyed", name);
                prop_assert_eq!(p.destroy.len(), best_destroyed, "{}: not minimal", name);
                // Replay: kept + created must be legal, disjoint and exactly the desired devices.
                let kept: Vec<&GiState> = current.iter().filter(|g| p.keep.iter().any(|k| k.gi_id == g.id)).collect();
                prop_assert_eq!(kept.len() + p.destroy.len(), current.len());
                let mut occ = Occupancy::of(table, kept.iter().map(|g| (g.profile_id, g.placement)));
                let mut keys: Vec<(u32, u32)> = kept.iter().flat_map(|g| g.cis.iter().map(|c| (g.profile_id, c.profile_id))).collect();
                for c in &p.create {
                    let prof = table.by_id(c.profile_id).unwrap();
                    prop_assert!(occ.check(table, prof, c.placement).is_ok(), "{}: illegal {:?}", name, c);
                    occ.add(prof, c.placement);
                    keys.extend(c.cis.iter().map(|(ci, _)| (c.profile_id, *ci)));
                }
                prop_assert_eq!(DesiredDevices::from_keys(keys), desired);
            }
            Err(PlanError::Blocked { instances, .. }) => {
                prop_assert!(best_busy > 0, "{}: blocked although a plan keeps every busy instance", name);
                prop_assert!(!instances.is_empty());
                prop_assert!(instances.iter().all(|b| current.iter().any(|g| g.id == b.gi_id && g.busy())));
            }
            Err(e) => prop_assert!(false, "{}: unexpected {}", name, e),
        }
        let f = forced.unwrap();
        prop_assert_eq!((f.destroy.iter().filter(|d| d.busy).count(), f.destroy.len()), (best_busy, best_destroyed));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Desired layouts with compute-instance splits (`1c.3g.40gb` …): counts are MIG devices,
    /// packed into as few GPU instances as fit, with legal CI placements.
    #[test]
    fn compute_instance_splits_pack_and_place(
        model in 0usize..9,
        current_picks in proptest::collection::vec((0usize..16, 0usize..8), 0..8),
        desired_picks in proptest::collection::vec((0usize..16, 0usize..8, 0usize..8), 0..8),
    ) {
        let tables = mig_tables();
        let (name, table) = &tables[model % tables.len()];
        let current: Vec<GiState> = build(table, &current_picks)
            .into_iter()
            .enumerate()
            .map(|(i, (pid, pl))| gi_state(table, i as u32 + 1, pid, pl, false))
            .collect();
        let picks: Vec<(usize, usize)> = desired_picks.iter().map(|&(p, l, _)| (p, l)).collect();
        let mut keys = Vec::new();
        for ((pid, _), &(_, _, c)) in build(table, &picks).into_iter().zip(&desired_picks) {
            let gi = table.by_id(pid).unwrap();
            let ci = &gi.ci_profiles[c % gi.ci_profiles.len()];
            // A full GI's worth of this CI profile, as the placements allow.
            let mut mask = 0u32;
            for &s in &ci.placements {
                let m = Placement::new(s, ci.slices).mask();
                if m & mask == 0 && keys.iter().filter(|k| **k == (pid, ci.id)).count() < 64 {
                    mask |= m;
                    keys.push((pid, ci.id));
                }
            }
        }
        let desired = DesiredDevices::from_keys(keys);
        let p = plan(table, &current, &desired, false);
        prop_assert!(p.is_ok(), "{}: {:?}", name, p);
        let p = p.unwrap();
        let kept: Vec<&GiState> = current.iter().filter(|g| p.keep.iter().any(|k| k.gi_id == g.id)).collect();
        let mut got: Vec<(u32, u32)> = kept.iter().flat_map(|g| g.cis.iter().map(|c| (g.profile_id, c.profile_id))).collect();
        // New GIs and reshaped ones (same GI, new CIs) alike: legal, disjoint CI placements.
        let reshaped = p.reshape.iter().map(|r| {
            let g = current.iter().find(|g| g.id == r.gi_id).unwrap();
            (g.profile_id, &r.cis)
        });
        for (profile_id, cis) in p.create.iter().map(|c| (c.profile_id, &c.cis)).chain(reshaped) {
            let gi = table.by_id(profile_id).unwrap();
            let mut used = 0u32;
            for (ci, pl) in cis {
                let cp = gi.ci(*ci).unwrap();
                prop_assert!(cp.placements.contains(&pl.start) && pl.size == cp.slices && used & pl.mask() == 0);
                used |= pl.mask();
                got.push((profile_id, *ci));
            }
        }
        prop_assert_eq!(kept.len() + p.reshape.len() + p.destroy.len(), current.len());
        prop_assert_eq!(DesiredDevices::from_keys(got), desired);
    }
}
