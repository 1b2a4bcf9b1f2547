use super::devices::{consumption, gpu_counters, DeviceKind, DeviceRef};
use super::order::{order, GpuView};
use super::slices::{layout, CounterSet, Device, Quantity, SliceSpec, MAX_COUNTER_SETS, MAX_DEVICES};
use crate::frag::expected_fragmentation;
use crate::mig::capacity::Occupancy;
use crate::mig::{catalog, Placement, ProfileTable};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn table(model: &str) -> ProfileTable {
    catalog::lookup(model).expect("catalog model").profile_table()
}

fn mig_models() -> Vec<&'static str> {
    catalog::models().filter(|m| m.mig_capable()).map(|m| m.id).collect()
}

fn idle(model: &str, n: u32) -> Vec<GpuView> {
    (0..n)
        .map(|index| GpuView {
            index,
            table: table(model),
            mig_enabled: true,
            occupied: Vec::new(),
            whole_taken: false,
        })
        .collect()
}

fn mig(d: DeviceRef) -> Option<(u32, u32, Placement)> {
    match d.kind {
        DeviceKind::Mig { profile_id, placement } => Some((d.gpu, profile_id, placement)),
        DeviceKind::Gpu => None,
    }
}

/// Takes the first offered device of `profile`, as the scheduler would, and records it.
fn take(gpus: &mut [GpuView], profile: &str) -> (u32, Placement) {
    let first = order(gpus)
        .into_iter()
        .filter_map(mig)
        .find(|(g, id, _)| gpus[*g as usize].table.by_id(*id).is_some_and(|p| p.name.to_string() == profile))
        .unwrap_or_else(|| panic!("no {profile} offered"));
    gpus[first.0 as usize].occupied.push((first.1, first.2));
    (first.0, first.2)
}

#[test]
fn device_names_are_dns_labels_and_read_back() {
    for model in mig_models() {
        let t = table(model);
        for p in &t.profiles {
            for &pl in &p.placements {
                let d = DeviceRef { gpu: 3, kind: DeviceKind::Mig { profile_id: p.id, placement: pl } };
                let name = d.name(&t);
                assert!(
                    name.len() <= 63 && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                    "{name}"
                );
                assert_eq!(DeviceRef::parse(&name, |_| Some(&t)), Some(d), "{model} {name}");
            }
        }
    }
    let whole = DeviceRef { gpu: 12, kind: DeviceKind::Gpu };
    assert_eq!(DeviceRef::parse(&whole.name(&ProfileTable::empty()), |_| None), Some(whole));
    let t = table("A100-SXM4-80GB");
    for bad in ["gpu-x", "gpu-0-mig-1g-10gb-19-3-", "gpu-0-mig-7g-80gb-0-3", "gpu-0-mig-2g-20gb-14-1", "cpu-0"] {
        assert_eq!(DeviceRef::parse(bad, |_| Some(&t)), None, "{bad}");
    }
}

#[test]
fn counters_hold_every_arrangement_and_refuse_too_much_compute() {
    let t = table("A100-SXM4-80GB");
    let c = gpu_counters(&t);
    assert_eq!((0..8).map(|i| c[&format!("memory-slice-{i}")]).sum::<u64>(), 8);
    // Seven 1g instances fit the counters; the 7g equals the most compute any set takes.
    let one = t.profiles.iter().find(|p| p.name.to_string() == "1g.10gb").unwrap();
    let seven = t.profiles.iter().find(|p| p.name.to_string() == "7g.80gb").unwrap();
    assert!(7 * u64::from(one.multiprocessors) <= c["multiprocessors"]);
    assert_eq!(c["multiprocessors"], u64::from(seven.multiprocessors).max(7 * u64::from(one.multiprocessors)));
    let whole = consumption(DeviceKind::Gpu, &t, &c);
    assert_eq!(whole, c, "the whole GPU consumes everything");
    let d = consumption(DeviceKind::Mig { profile_id: one.id, placement: Placement::new(6, 1) }, &t, &c);
    assert_eq!(d.get("memory-slice-6"), Some(&1));
    assert_eq!(d.keys().filter(|k| k.starts_with("memory-slice-")).count(), 1);
}

#[test]
fn seven_small_claims_pack_onto_one_gpu_and_leave_the_other_whole() {
    let mut gpus = idle("A100-SXM4-80GB", 2);
    let taken: Vec<(u32, Placement)> = (0..7).map(|_| take(&mut gpus, "1g.10gb")).collect();
    assert!(taken.iter().all(|(g, _)| *g == taken[0].0), "one GPU: {taken:?}");
    let other = 1 - taken[0].0;
    assert!(order(&gpus).contains(&DeviceRef { gpu: other, kind: DeviceKind::Gpu }), "the other GPU stays whole");
}

#[test]
fn small_claims_leave_room_for_a_4g() {
    // Three 1g claims on a GPU already in use leave the 4g placement free (NVIDIA's ascending
    // order takes slices 0, 1, 2 and blocks it).
    let mut gpus = idle("A100-SXM4-80GB", 1);
    for _ in 0..3 {
        take(&mut gpus, "1g.10gb");
    }
    take(&mut gpus, "4g.40gb");
}

#[test]
fn busy_gpus_offer_nothing_that_overlaps_and_no_whole_gpu() {
    let t = table("A100-SXM4-80GB");
    let three = t.profiles.iter().find(|p| p.name.to_string() == "3g.40gb").unwrap().id;
    let gpus = vec![
        GpuView {
            index: 0,
            table: t.clone(),
            mig_enabled: true,
            occupied: vec![(three, Placement::new(4, 4))],
            whole_taken: false,
        },
        GpuView { index: 1, table: t.clone(), mig_enabled: false, occupied: Vec::new(), whole_taken: true },
        GpuView {
            index: 2,
            table: ProfileTable::empty(),
            mig_enabled: false,
            occupied: Vec::new(),
            whole_taken: false,
        },
    ];
    let offered = order(&gpus);
    assert!(offered.iter().all(|d| d.gpu != 1), "a GPU taken whole offers nothing");
    assert!(!offered.contains(&DeviceRef { gpu: 0, kind: DeviceKind::Gpu }));
    assert_eq!(offered.last(), Some(&DeviceRef { gpu: 2, kind: DeviceKind::Gpu }), "a GPU without MIG: whole, last");
    for (g, _, pl) in offered.iter().filter_map(|d| mig(*d)) {
        assert!(g == 0 && !pl.overlaps(Placement::new(4, 4)), "{pl:?}");
    }
}

fn device(name: String) -> Device {
    Device { name, attributes: BTreeMap::new(), capacity: BTreeMap::new(), consumes_counters: Vec::new() }
}

#[test]
fn slices_respect_the_limits_and_sort_in_publication_order() {
    let sets: Vec<CounterSet> =
        (0..16).map(|i| CounterSet { name: format!("gpu-{i}-counter-set"), counters: BTreeMap::new() }).collect();
    let devices: Vec<Device> = (0..200).map(|i| device(format!("d{i}"))).collect();
    let slices = layout("gpu.gpupart.io", "node-a", 3, sets, devices, 0, &BTreeMap::new());
    assert_eq!(slices.len(), 2 + 4);
    for s in &slices {
        assert_eq!((s.spec.pool.generation, s.spec.pool.resource_slice_count), (3, 6));
        assert!(s.spec.devices.len() <= MAX_DEVICES && s.spec.shared_counters.len() <= MAX_COUNTER_SETS);
        assert!(s.spec.devices.is_empty() || s.spec.shared_counters.is_empty(), "one or the other");
    }
    let mut by_name: Vec<_> = slices.iter().filter(|s| !s.spec.devices.is_empty()).collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    let order: Vec<&str> = by_name.iter().flat_map(|s| s.spec.devices.iter().map(|d| d.name.as_str())).collect();
    let want: Vec<String> = (0..200).map(|i| format!("d{i}")).collect();
    assert_eq!(order, want.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        layout("d", "n", 1, Vec::new(), Vec::new(), 0, &BTreeMap::new()).len(),
        1,
        "an empty pool still has a slice"
    );
    let padded =
        layout("d", "n", 1, Vec::new(), (0..10).map(|i| device(format!("d{i}"))).collect(), 3, &BTreeMap::new());
    assert_eq!(padded.iter().map(|s| s.spec.devices.len()).collect::<Vec<_>>(), [10, 0, 0], "padded to three");
    assert!(padded.iter().all(|s| s.spec.pool.resource_slice_count == 3));
    assert_eq!(Quantity::of(85_899_345_920).as_u64(), Some(85_899_345_920));
    assert_eq!(Quantity { value: "80Gi".into() }.as_u64(), Some(80 << 30));
}

#[test]
fn filling_the_node_rewrites_the_same_slices() {
    use super::publish::{content, Catalog};
    use crate::backend::{sim::SimBackend, GpuBackend};
    let model = "A100-SXM4-80GB";
    let b = SimBackend::open(Some(&format!("{model}:3")), None).expect("simulator");
    let gpus = Catalog::default().gpus(&b.observe_all().expect("observe"), "550.54.15");
    let shape = |views: &[GpuView], allocated: &[DeviceRef]| {
        let slices = content("d", "n", 1, &gpus, &order(views), allocated, &BTreeMap::new());
        let devices: usize = slices.iter().map(|s| s.spec.devices.len()).sum();
        let names: Vec<(String, i64)> =
            slices.into_iter().map(|s| (s.name, s.spec.pool.resource_slice_count)).collect();
        (names, devices)
    };
    let mut views = idle(model, 3);
    let (before, listed) = shape(&views, &[]);
    assert!(listed > MAX_DEVICES, "the idle node needs several device slices: {listed}");
    let id = table(model).profiles.iter().find(|p| p.name.to_string() == "7g.80gb").expect("7g").id;
    let mut allocated = Vec::new();
    for _ in 0..3 {
        let (gpu, placement) = take(&mut views, "7g.80gb");
        allocated.push(DeviceRef { gpu, kind: DeviceKind::Mig { profile_id: id, placement } });
        let (after, listed_now) = shape(&views, &allocated);
        assert!(listed_now < listed, "fewer devices listed once a GPU is full");
        assert_eq!(after, before, "the same slices, whatever the occupancy");
    }
}

/// Every moment of a plan's writes: the pool after each write, as name → device names.
fn moments(current: &BTreeMap<String, SliceSpec>, plan: &[super::slices::Slice]) -> Vec<BTreeMap<String, Vec<String>>> {
    let names = |m: &BTreeMap<String, SliceSpec>| -> BTreeMap<String, Vec<String>> {
        m.iter().map(|(n, s)| (n.clone(), s.devices.iter().map(|d| d.name.clone()).collect())).collect()
    };
    let mut state = current.clone();
    let mut out = vec![names(&state)];
    for w in plan {
        state.insert(w.name.clone(), w.spec.clone());
        out.push(names(&state));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Republishing after every allocation and release, one slice write at a time: no moment
    /// lists a device twice, and a device allocated before and after is listed at every moment.
    #[test]
    fn rewrites_never_list_a_device_twice_nor_drop_an_allocated_one(
        steps in proptest::collection::vec((0usize..6, any::<bool>(), 0usize..32), 1..24)
    ) {
        use super::publish::{content, Catalog};
        use super::slices::write_plan;
        use crate::backend::{sim::SimBackend, GpuBackend};
        let model = "A100-SXM4-80GB";
        let b = SimBackend::open(Some(&format!("{model}:4")), None).expect("simulator");
        let gpus = Catalog::default().gpus(&b.observe_all().expect("observe"), "550.54.15");
        let t = table(model);
        let profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb", "4g.40gb", "7g.80gb"];
        let mut views = idle(model, 4);
        let mut held: Vec<DeviceRef> = Vec::new();
        let mut current: BTreeMap<String, SliceSpec> = BTreeMap::new();
        for (k, (profile, release, pick)) in std::iter::once((0, false, 0)).chain(steps).enumerate() {
            let before: Vec<DeviceRef> = held.clone();
            if k > 0 {
                if release && !held.is_empty() {
                    let d = held.remove(pick % held.len());
                    if let DeviceKind::Mig { profile_id, placement } = d.kind {
                        views[d.gpu as usize].occupied.retain(|o| *o != (profile_id, placement));
                    }
                } else {
                    let name = profiles[profile];
                    let id = t.profiles.iter().find(|p| p.name.to_string() == name).expect("profile").id;
                    let offered = order(&views);
                    if let Some(d) = offered.into_iter().find(|d| matches!(d.kind, DeviceKind::Mig { profile_id, .. } if profile_id == id)) {
                        if let DeviceKind::Mig { profile_id, placement } = d.kind {
                            views[d.gpu as usize].occupied.push((profile_id, placement));
                        }
                        held.push(d);
                    }
                }
            }
            let next = content("d", "n", 1, &gpus, &order(&views), &held, &super::slices::listed_at("d", "n", &current));
            let plan = write_plan(&current, &next);
            let kept: Vec<String> = held
                .iter()
                .filter(|d| before.contains(d))
                .map(|d| d.name(&t))
                .collect();
            for m in moments(&current, &plan) {
                let listed: Vec<&String> = m.values().flatten().collect();
                let mut unique = listed.clone();
                unique.sort();
                unique.dedup();
                prop_assert_eq!(unique.len(), listed.len(), "a device listed twice: {:?}", m);
                if !current.is_empty() {
                    for a in &kept {
                        prop_assert!(listed.contains(&a), "allocated {} missing: {:?}", a, m);
                    }
                }
            }
            for w in plan {
                current.insert(w.name, w.spec);
            }
            let want: BTreeMap<String, SliceSpec> = next.into_iter().map(|s| (s.name, s.spec)).collect();
            prop_assert_eq!(&current, &want);
        }
    }
}

/// How many instances of `p` a GPU could still take, by brute force over placements.
fn most_of(t: &ProfileTable, occ: Occupancy, p: &crate::mig::GiProfile) -> u32 {
    p.placements
        .iter()
        .filter(|pl| occ.can_add(t, p, **pl))
        .map(|pl| {
            let mut next = occ;
            next.add(p, *pl);
            1 + most_of(t, next, p)
        })
        .max()
        .unwrap_or(0)
}

/// The figures the order ranks by, computed from scratch for the node after adding `extra`:
/// (the node's room per profile, largest profile first; the GPU's used slices before; its index;
/// the expected fragmentation after).
fn outcome(gpus: &[GpuView], extra: (u32, u32, Placement)) -> (Vec<u32>, u32, u32, f64) {
    let t = &gpus[0].table;
    let mut profiles: Vec<&crate::mig::GiProfile> = t.profiles.iter().collect();
    profiles.sort_by(|a, b| {
        (b.memory_slices, b.slices).cmp(&(a.memory_slices, a.slices)).then(a.name.to_string().cmp(&b.name.to_string()))
    });
    let mut room = vec![0; profiles.len()];
    let mut frag = 0.0;
    let mut used = 0;
    for g in gpus {
        let mut inst = g.occupied.clone();
        if g.index == extra.0 {
            used = g.table.memory_slices - Occupancy::of(&g.table, inst.iter().copied()).free_memory_slices(&g.table);
            inst.push((extra.1, extra.2));
        }
        let occ = Occupancy::of(&g.table, inst);
        for (k, p) in profiles.iter().enumerate() {
            room[k] += most_of(&g.table, occ, p);
        }
        frag += expected_fragmentation(&g.table, &occ, None);
    }
    (room, used, extra.0, frag)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(80))]

    /// On random nodes: no offered device overlaps what is there or breaks the GPU's limits, a
    /// GPU in use never offers itself whole, and the first device of each profile is the best of
    /// a brute force over every candidate: the most room left for the largest profiles, then the
    /// most used GPU (the lowest index among equals), then the least fragmentation.
    #[test]
    fn the_order_offers_only_free_placements_and_puts_the_best_first(
        model in 0usize..4,
        gpus in 1u32..4,
        adds in proptest::collection::vec((0u32..4, 0usize..64), 0..14),
    ) {
        let models = mig_models();
        let model = models[model % models.len()];
        let mut view = idle(model, gpus);
        for (g, pick) in adds {
            let g = (g % gpus) as usize;
            let t = view[g].table.clone();
            let occ = Occupancy::of(&t, view[g].occupied.iter().copied());
            let free: Vec<(u32, Placement)> = t.profiles.iter()
                .flat_map(|p| p.placements.iter().map(move |&pl| (p, pl)))
                .filter(|(p, pl)| occ.can_add(&t, p, *pl))
                .map(|(p, pl)| (p.id, pl))
                .collect();
            if !free.is_empty() {
                view[g].occupied.push(free[pick % free.len()]);
            }
        }
        let offered = order(&view);
        for d in &offered {
            let g = &view[d.gpu as usize];
            match d.kind {
                DeviceKind::Gpu => prop_assert!(g.occupied.is_empty()),
                DeviceKind::Mig { profile_id, placement } => {
                    let occ = Occupancy::of(&g.table, g.occupied.iter().copied());
                    let p = g.table.by_id(profile_id).unwrap();
                    prop_assert!(occ.can_add(&g.table, p, placement));
                    prop_assert!(g.occupied.iter().all(|(_, o)| !o.overlaps(placement)));
                }
            }
        }
        // Brute force: every creatable candidate of each profile; none beats the first offered.
        let t = view[0].table.clone();
        for p in &t.profiles {
            let mut candidates = Vec::new();
            for g in &view {
                let occ = Occupancy::of(&g.table, g.occupied.iter().copied());
                for &pl in &p.placements {
                    if occ.can_add(&g.table, p, pl) {
                        candidates.push((g.index, p.id, pl));
                    }
                }
            }
            let first = offered.iter().filter_map(|d| mig(*d)).find(|(_, id, _)| *id == p.id);
            prop_assert_eq!(first.is_some(), !candidates.is_empty());
            let Some(first) = first else { continue };
            let best = outcome(&view, first);
            for c in candidates {
                let o = outcome(&view, c);
                let better = o.0 > best.0
                    || (o.0 == best.0 && (o.1 > best.1 || (o.1 == best.1 && (o.2 < best.2 || (o.2 == best.2 && o.3 < best.3 - 1e-3)))));
                prop_assert!(!better, "{:?} ranks {:?} but the first offered {:?} ranks {:?}", c, o, first, best);
            }
        }
    }

    /// The counters never refuse a set of instances the GPU can hold.
    #[test]
    fn counters_never_refuse_a_feasible_set(model in 0usize..8, picks in proptest::collection::vec(0usize..64, 0..8)) {
        let models = mig_models();
        let t = table(models[model % models.len()]);
        let c = gpu_counters(&t);
        let mut occ = Occupancy::empty();
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        for pick in picks {
            let free: Vec<_> = t.profiles.iter()
                .flat_map(|p| p.placements.iter().map(move |&pl| (p, pl)))
                .filter(|(p, pl)| occ.can_add(&t, p, *pl))
                .collect();
            if free.is_empty() { break; }
            let (p, pl) = free[pick % free.len()];
            occ.add(p, pl);
            for (k, v) in consumption(DeviceKind::Mig { profile_id: p.id, placement: pl }, &t, &c) {
                *used.entry(k).or_default() += v;
            }
        }
        for (k, v) in used {
            prop_assert!(v <= c[&k], "{} uses {} of {}", k, v, c[&k]);
        }
    }
}

/// The worked example of docs/dra.md.
#[test]
fn the_documented_example_holds() {
    let mut gpus = idle("A100-SXM4-80GB", 2);
    let t = table("A100-SXM4-80GB");
    let first: Vec<String> = order(&gpus).into_iter().take(3).map(|d| d.name(&t)).collect();
    assert_eq!(first, ["gpu-0-mig-1g-10gb-19-6", "gpu-0-mig-1g-10gb-19-4", "gpu-0-mig-1g-10gb-19-5"]);
    let small: Vec<(u32, u32)> = (0..3).map(|_| take(&mut gpus, "1g.10gb")).map(|(g, p)| (g, p.start)).collect();
    assert_eq!(small, [(0, 6), (0, 4), (0, 5)]);
    assert_eq!(take(&mut gpus, "4g.40gb"), (0, Placement::new(0, 4)), "the 4g still fits on GPU 0");
    assert_eq!(take(&mut gpus, "3g.40gb"), (1, Placement::new(4, 4)), "GPU 1 keeps its 4g placement");
    let last = order(&gpus);
    assert!(!last.contains(&DeviceRef { gpu: 1, kind: DeviceKind::Gpu }), "GPU 1 is in use now");
    // +me twins come after their plain profile.
    let names: Vec<String> = last.iter().map(|d| d.name(&t)).collect();
    let plain = names.iter().position(|n| n.contains("-1g-10gb-19-")).unwrap();
    let me = names.iter().position(|n| n.contains("-1g-10gb-me-")).unwrap();
    assert!(plain < me, "{names:?}");
}
