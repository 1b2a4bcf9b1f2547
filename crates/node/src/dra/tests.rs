use super::devices::{consumption, gpu_counters, DeviceKind, DeviceRef};
use super::order::{order, GpuView};
use super::slices::{layout, CounterSet, Device, Quantity, SliceSpec, MAX_COUNTER_SETS, MAX_DEVICES};
use super::unavailable::unavailable;
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
            mps_shares: 0,
            mps_device: false,
        })
        .collect()
}

fn mig(d: DeviceRef) -> Option<(u32, u32, Placement)> {
    match d.kind {
        DeviceKind::Mig { profile_id, placement } => Some((d.gpu, profile_id, placement)),
        DeviceKind::Gpu | DeviceKind::Mps => None,
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
            mps_shares: 0,
            mps_device: false,
        },
        GpuView {
            index: 1,
            table: t.clone(),
            mig_enabled: false,
            occupied: Vec::new(),
            whole_taken: true,
            mps_shares: 0,
            mps_device: false,
        },
        GpuView {
            index: 2,
            table: ProfileTable::empty(),
            mig_enabled: false,
            occupied: Vec::new(),
            whole_taken: false,
            mps_shares: 0,
            mps_device: true,
        },
    ];
    let offered = order(&gpus);
    assert!(offered.iter().all(|d| d.gpu != 1), "a GPU taken whole offers nothing");
    assert!(!offered.contains(&DeviceRef { gpu: 0, kind: DeviceKind::Gpu }));
    let n = offered.len();
    assert_eq!(
        offered[n - 2..],
        [DeviceRef { gpu: 2, kind: DeviceKind::Gpu }, DeviceRef { gpu: 2, kind: DeviceKind::Mps }],
        "a GPU without MIG: whole, then its MPS device, last"
    );
    for (g, _, pl) in offered.iter().filter_map(|d| mig(*d)) {
        assert!(g == 0 && !pl.overlaps(Placement::new(4, 4)), "{pl:?}");
    }
}

fn device(name: String) -> Device {
    Device {
        name,
        attributes: BTreeMap::new(),
        capacity: BTreeMap::new(),
        allow_multiple_allocations: None,
        consumes_counters: Vec::new(),
        taints: Vec::new(),
    }
}

#[test]
fn slices_respect_the_limits_and_sort_in_publication_order() {
    let sets: Vec<CounterSet> =
        (0..16).map(|i| CounterSet { name: format!("gpu-{i}-counter-set"), counters: BTreeMap::new() }).collect();
    let group = |label: &str, n: usize| (label.to_string(), (0..n).map(|i| device(format!("{label}-d{i}"))).collect());
    let slices = layout("gpu.gpupart.io", "node-a", 3, sets, vec![group("mig-1g-10gb", 100), group("gpu", 8)]);
    assert_eq!(slices.len(), 2 + 2 + 1, "two counter slices, the large group split in two, the small one");
    for s in &slices {
        assert_eq!((s.spec.pool.generation, s.spec.pool.resource_slice_count), (3, 5));
        assert!(s.spec.devices.len() <= MAX_DEVICES && s.spec.shared_counters.len() <= MAX_COUNTER_SETS);
        assert!(s.spec.devices.is_empty() || s.spec.shared_counters.is_empty(), "one or the other");
    }
    let names: Vec<&str> = slices.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "node-a-gpu.gpupart.io-counters-000",
            "node-a-gpu.gpupart.io-counters-001",
            "node-a-gpu.gpupart.io-devices-000-mig-1g-10gb-0",
            "node-a-gpu.gpupart.io-devices-001-mig-1g-10gb-1",
            "node-a-gpu.gpupart.io-devices-002-gpu"
        ]
    );
    let mut by_name: Vec<_> = slices.iter().filter(|s| !s.spec.devices.is_empty()).collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    let order: Vec<&str> = by_name.iter().flat_map(|s| s.spec.devices.iter().map(|d| d.name.as_str())).collect();
    let want: Vec<String> =
        (0..100).map(|i| format!("mig-1g-10gb-d{i}")).chain((0..8).map(|i| format!("gpu-d{i}"))).collect();
    assert_eq!(order, want.iter().map(String::as_str).collect::<Vec<_>>(), "sorted by name, the groups in order");
    assert_eq!(layout("d", "n", 1, Vec::new(), Vec::new()).len(), 1, "an empty pool still has a slice");
    assert_eq!(Quantity::of(85_899_345_920).as_u64(), Some(85_899_345_920));
    assert_eq!(Quantity { value: "80Gi".into() }.as_u64(), Some(80 << 30));
}

#[test]
fn every_device_stays_listed_in_its_slice_whatever_the_occupancy() {
    use super::publish::{content, Catalog};
    use crate::backend::{sim::SimBackend, GpuBackend};
    for (model, n) in [("A100-SXM4-80GB", 3), ("H100-SXM5-80GB", 8), ("H200-SXM-141GB", 8), ("B200-180GB", 8)] {
        let b = SimBackend::open(Some(&format!("{model}:{n}")), None).expect("simulator");
        let gpus = Catalog::default().gpus(&b.observe_all().expect("observe"), "550.54.15");
        let homes = |views: &[GpuView]| {
            let slices = content("d", "n", 1, &gpus, &order(views), &unavailable(views, views), &BTreeMap::new());
            let mut home: BTreeMap<String, String> = BTreeMap::new();
            for s in &slices {
                assert!(s.spec.devices.len() <= MAX_DEVICES, "{model}: {} lists {}", s.name, s.spec.devices.len());
                for d in &s.spec.devices {
                    assert!(home.insert(d.name.clone(), s.name.clone()).is_none(), "{model}: {} listed twice", d.name);
                }
            }
            home
        };
        let mut views = idle(model, n);
        let before = homes(&views);
        let every: usize =
            gpus.iter().map(|g| 1 + g.table.profiles.iter().map(|p| p.placements.len()).sum::<usize>()).sum();
        assert_eq!(before.len(), every, "{model}: every placement of every profile and each GPU whole");
        let profiles: Vec<String> = table(model).profiles.iter().map(|p| p.name.to_string()).collect();
        assert!(before.values().collect::<std::collections::BTreeSet<_>>().len() <= profiles.len() + 1);
        for k in 0..n as usize {
            take(&mut views, &profiles[k % profiles.len()]);
            assert_eq!(homes(&views), before, "{model}: the same devices in the same slices");
        }
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
    /// lists a device twice or drops one, no device ever changes slice, and each republication
    /// writes each slice at most once.
    #[test]
    fn rewrites_never_list_a_device_twice_nor_drop_nor_move_one(
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
            let next = content("d", "n", 1, &gpus, &order(&views), &unavailable(&views, &views), &BTreeMap::new());
            let plan = write_plan(&current, &next);
            let mut written: Vec<&str> = plan.iter().map(|s| s.name.as_str()).collect();
            written.sort_unstable();
            prop_assert!(written.windows(2).all(|w| w[0] != w[1]), "a slice written twice: {:?}", written);
            let kept: Vec<String> = held
                .iter()
                .filter(|d| before.contains(d))
                .map(|d| d.name(&t))
                .collect();
            let home = |m: &BTreeMap<String, Vec<String>>| -> BTreeMap<String, String> {
                m.iter().flat_map(|(s, ds)| ds.iter().map(move |d| (d.clone(), s.clone()))).collect()
            };
            let first = home(&moments(&current, &[])[0]);
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
                    prop_assert_eq!(&home(&m), &first, "a device left its slice or the pool");
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
                DeviceKind::Mps => prop_assert!(g.table.profiles.is_empty() && !g.whole_taken),
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

/// A set of MIG devices on one GPU: (profile id, placement) each.
type DeviceSet = [(u32, Placement)];

/// Every set of MIG devices the counters let the scheduler allocate together on one GPU.
fn counter_sets_accepted(
    t: &ProfileTable,
    c: &BTreeMap<String, u64>,
    options: &[(u32, Placement)],
    from: usize,
    used: &mut BTreeMap<String, u64>,
    chosen: &mut Vec<(u32, Placement)>,
    visit: &mut dyn FnMut(&DeviceSet),
) {
    visit(chosen);
    for (i, &(id, pl)) in options.iter().enumerate().skip(from) {
        let want = consumption(DeviceKind::Mig { profile_id: id, placement: pl }, t, c);
        if want.iter().any(|(k, v)| used.get(k).copied().unwrap_or(0) + v > c[k]) {
            continue;
        }
        for (k, v) in &want {
            *used.entry(k.clone()).or_default() += v;
        }
        chosen.push((id, pl));
        counter_sets_accepted(t, c, options, i + 1, used, chosen, visit);
        chosen.pop();
        for (k, v) in &want {
            *used.entry(k.clone()).or_default() -= v;
        }
    }
}

/// The counters are exact: every set of devices they let through can be created together, on
/// every MIG model of the catalog (so a device that cannot be created because of allocated
/// devices is refused by the counters alone, and may stay listed).
#[test]
fn the_counters_refuse_every_set_the_gpu_cannot_hold() {
    for model in mig_models() {
        let t = table(model);
        let c = gpu_counters(&t);
        let options: Vec<(u32, Placement)> =
            t.profiles.iter().flat_map(|p| p.placements.iter().map(move |&pl| (p.id, pl))).collect();
        let mut bad: Vec<Vec<String>> = Vec::new();
        let mut sets = 0usize;
        counter_sets_accepted(&t, &c, &options, 0, &mut BTreeMap::new(), &mut Vec::new(), &mut |set| {
            sets += 1;
            let mut occ = Occupancy::empty();
            for &(id, pl) in set {
                let p = t.by_id(id).expect("profile");
                if !occ.can_add(&t, p, pl) {
                    if bad.len() < 5 {
                        bad.push(
                            set.iter().map(|(id, pl)| format!("{}@{}", t.by_id(*id).unwrap().name, pl.start)).collect(),
                        );
                    }
                    return;
                }
                occ.add(p, pl);
            }
        });
        assert!(bad.is_empty(), "{model}: the counters let through sets it cannot hold ({sets} sets): {bad:?}");
    }
}

#[test]
fn only_what_no_claim_holds_taints_the_devices_it_blocks() {
    let t = table("A100-SXM4-80GB");
    let p4 = t.profiles.iter().find(|p| p.name.to_string() == "4g.40gb").unwrap();
    let p3 = t.profiles.iter().find(|p| p.name.to_string() == "3g.40gb").unwrap();
    let foreign = (p4.id, Placement::new(0, 4));
    let claimed = (p3.id, Placement::new(4, 4));
    let mut everything = idle("A100-SXM4-80GB", 3);
    everything[0].occupied = vec![foreign, claimed];
    everything[1].whole_taken = true; // processes outside MIG
    let mut held = idle("A100-SXM4-80GB", 3);
    held[0].occupied = vec![claimed];
    let u = unavailable(&everything, &held);
    let names: Vec<String> = u.keys().map(|d| d.name(&t)).collect();
    // On GPU 0 what overlaps the foreign 4g (slices 0-3) and the whole GPU, but nothing the
    // claimed 3g blocks (its counters do).
    assert!(names.contains(&"gpu-0-mig-4g-40gb-5-0".to_string()), "{names:?}");
    assert!(names.contains(&"gpu-0-mig-1g-10gb-19-0".to_string()), "{names:?}");
    assert!(!names.contains(&"gpu-0".to_string()), "the claimed 3g already refuses the whole GPU: {names:?}");
    assert!(!names.iter().any(|n| n.starts_with("gpu-0-") && (n.ends_with("-4") || n.ends_with("-6"))), "{names:?}");
    // GPU 1 busy outside MIG: everything on it; GPU 2 idle: nothing.
    assert!(names.contains(&"gpu-1".to_string()) && names.contains(&"gpu-1-mig-7g-80gb-0-0".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("gpu-2")), "{names:?}");
    // Without the claim, the whole GPU 0 is blocked by the foreign instance only: tainted.
    let none = idle("A100-SXM4-80GB", 3);
    let mut only_foreign = idle("A100-SXM4-80GB", 3);
    only_foreign[0].occupied = vec![foreign];
    assert!(unavailable(&only_foreign, &none).contains_key(&DeviceRef { gpu: 0, kind: DeviceKind::Gpu }));
}

/// GPUs without MIG: their MPS devices come last, the GPU with the most shares first; a GPU held
/// whole offers no share, and a GPU with shares is neither offered whole nor left untainted whole.
#[test]
fn mps_shares_pack_onto_the_busiest_gpu_and_never_beside_a_whole_claim() {
    let view = |index: u32, whole_taken: bool, mps_shares: u32| GpuView {
        index,
        table: crate::mig::ProfileTable::empty(),
        mig_enabled: false,
        occupied: Vec::new(),
        whole_taken,
        mps_shares,
        mps_device: true,
    };
    let gpus = vec![view(0, false, 1), view(1, false, 3), view(2, true, 0), view(3, false, 0)];
    let offered = order(&gpus);
    let at = |d: DeviceRef| offered.iter().position(|x| *x == d);
    let mps = |gpu| DeviceRef { gpu, kind: DeviceKind::Mps };
    let whole = |gpu| DeviceRef { gpu, kind: DeviceKind::Gpu };
    assert_eq!(offered, vec![whole(3), mps(1), mps(0), mps(3)], "idle GPUs whole first; shares on the busiest GPU");
    assert_eq!(at(mps(2)), None, "a GPU held whole takes no share");
    let taints = unavailable(&gpus, &gpus);
    assert_eq!(taints.get(&whole(0)).map(String::as_str), Some(crate::dra::unavailable::SHARED));
    assert_eq!(taints.get(&whole(1)).map(String::as_str), Some(crate::dra::unavailable::SHARED));
    assert!(!taints.contains_key(&whole(3)) && !taints.contains_key(&mps(3)));
    // A MIG GPU shared through MPS (--dra-mps-on-mig-gpus): its MIG devices are tainted too, for
    // schedulers that do not count a shared device's counters; its MPS device is not.
    let mig_shared = GpuView { table: table("A100-SXM4-80GB"), mps_shares: 2, ..view(4, false, 0) };
    let taints = unavailable(std::slice::from_ref(&mig_shared), std::slice::from_ref(&mig_shared));
    assert!(taints
        .iter()
        .any(|(d, why)| matches!(d.kind, DeviceKind::Mig { .. }) && why == crate::dra::unavailable::SHARED));
    assert!(taints.keys().filter(|d| matches!(d.kind, DeviceKind::Mig { .. })).count() >= 18);
    assert!(!taints.contains_key(&mps(4)));
}

#[test]
fn a_health_record_fences_a_whole_gpu_or_only_what_holds_a_faulty_devices_slices() {
    use super::publish::fence_of;
    use crate::health::{EventKind, GpuEvent, HealthBook, XidPolicy};
    let t = table("A100-SXM4-80GB");
    let p = XidPolicy::default();
    let mut book = HealthBook::default();
    let xid = |gpu, instance| GpuEvent { gpu, kind: EventKind::Xid(94), instance, at: 1 };
    book.record(&xid(1, None), &[0, 1], &p).unwrap();
    book.record_mig(&xid(0, Some((3, 0))), "1g.10gb", Placement::new(6, 1), &[0, 1], &p).unwrap();
    let mig = |gpu, profile: &str, start| {
        let pr = t.profiles.iter().find(|x| x.name.to_string() == profile).unwrap();
        let placement = *pr.placements.iter().find(|pl| pl.start == start).unwrap();
        DeviceRef { gpu, kind: DeviceKind::Mig { profile_id: pr.id, placement } }
    };
    let fenced = |d| fence_of(d, &book).map(|f| f.why);
    // GPU 1: everything, saying the GPU is unhealthy.
    assert_eq!(fenced(mig(1, "1g.10gb", 0)).as_deref(), Some("is on GPU 1, which is unhealthy (XID 94)"));
    assert!(fenced(DeviceRef { gpu: 1, kind: DeviceKind::Gpu }).is_some());
    // GPU 0: what spans slice 6, and the whole GPU; not the rest.
    for (profile, start, hit) in [
        ("1g.10gb", 6, true),
        ("1g.20gb", 6, true),
        ("3g.40gb", 4, true),
        ("7g.80gb", 0, true),
        ("1g.10gb", 5, false),
        ("2g.20gb", 4, false),
        ("4g.40gb", 0, false),
        ("3g.40gb", 0, false),
    ] {
        assert_eq!(fenced(mig(0, profile, start)).is_some(), hit, "{profile}@{start}");
    }
    assert_eq!(
        fenced(DeviceRef { gpu: 0, kind: DeviceKind::Gpu }).as_deref(),
        Some("holds the slices of GPU 0's faulty MIG device 1g.10gb@6 (XID 94)")
    );
}
