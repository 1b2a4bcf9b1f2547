use super::*;
use crate::mig::catalog;
use crate::mig::Placement;
use proptest::prelude::*;

fn table() -> ProfileTable {
    catalog::lookup("A100-SXM4-80GB").expect("A100 in the catalog").profile_table()
}

fn mig(t: &ProfileTable, name: &str, start: u32) -> DeviceKind {
    let p = t.profiles.iter().find(|p| p.name.to_string() == name).expect("a profile");
    DeviceKind::Mig { profile_id: p.id, placement: Placement::new(start, p.memory_slices) }
}

fn gpu(index: u32, held: Vec<(DeviceKind, &str)>) -> Gpu {
    Gpu {
        index,
        table: table(),
        mig_enabled: true,
        held: held.into_iter().map(|(kind, by)| Held { kind, by: by.to_string() }).collect(),
    }
}

fn movable(pods: &[&str]) -> BTreeMap<String, Movable> {
    pods.iter().map(|p| (p.to_string(), Movable::default())).collect()
}

/// Occupied placements of a GPU as the test reads them, for checking plans independently.
fn occupancy_of(t: &ProfileTable, kinds: &[DeviceKind]) -> Option<Occupancy> {
    let mut occ = Occupancy::empty();
    for k in kinds {
        if let DeviceKind::Mig { profile_id, placement } = k {
            let p = t.by_id(*profile_id)?;
            if !occ.can_add(t, p, *placement) {
                return None;
            }
            occ.add(p, *placement);
        }
    }
    Some(occ)
}

#[test]
fn a_7g_claim_is_served_by_moving_two_1g_claims_off_one_gpu() {
    let t = table();
    // GPU 0: two movable 1g; GPU 1: a 3g that stays (not movable) and room for two more 1g.
    let nodes = vec![Node {
        name: "n".into(),
        gpus: vec![
            gpu(0, vec![(mig(&t, "1g.10gb", 0), "ml/a"), (mig(&t, "1g.10gb", 1), "ml/b")]),
            gpu(1, vec![(mig(&t, "3g.40gb", 4), "ml/big"), (mig(&t, "2g.20gb", 0), "ml/c")]),
        ],
    }];
    let s =
        plan(&nodes, &Want::Mig("7g.80gb".into()), &|_| true, &movable(&["ml/a", "ml/b", "ml/c"]), Bounds::default());
    let p = s.plan.expect("a plan");
    assert_eq!(p.room, vec![0]);
    assert_eq!(p.moves.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(), ["ml/a", "ml/b"]);
    assert!(p.moves.iter().all(|m| m.devices.iter().all(|d| d.gpu == 1)), "{p:?}");
    assert_eq!(p.cost.pods, 2);
    assert_eq!(p.beneficiary, vec![DeviceRef { gpu: 0, kind: mig(&t, "7g.80gb", 0) }]);
}

#[test]
fn no_plan_when_a_moved_pod_has_nowhere_to_go_or_a_pod_may_not_move() {
    let t = table();
    let full = |i, by: &str| gpu(i, vec![(mig(&t, "7g.80gb", 0), by)]);
    let nodes =
        vec![Node { name: "n".into(), gpus: vec![gpu(0, vec![(mig(&t, "1g.10gb", 0), "ml/a")]), full(1, "ml/big")] }];
    let want = Want::Mig("7g.80gb".into());
    assert_eq!(plan(&nodes, &want, &|_| true, &movable(&["ml/a"]), Bounds::default()).plan, None, "nowhere to go");
    let mut roomy = nodes.clone();
    roomy[0].gpus.push(gpu(2, vec![]));
    // The idle GPU is itself the room: nothing moves.
    let p = plan(&roomy, &want, &|_| true, &movable(&["ml/a"]), Bounds::default()).plan.expect("a plan");
    assert!(p.moves.is_empty() && p.room == vec![2], "{p:?}");
    roomy[0].gpus[2].held.push(Held { kind: mig(&t, "3g.40gb", 4), by: "ml/c".into() });
    let p = plan(&roomy, &want, &|_| true, &movable(&["ml/a"]), Bounds::default()).plan.expect("a plan");
    assert_eq!((p.room.clone(), p.moves[0].devices[0].gpu), (vec![0], 2), "{p:?}");
    assert_eq!(plan(&roomy, &want, &|_| true, &movable(&[]), Bounds::default()).plan, None, "nothing opted in");
    // The replacement may land only on a node where the room is not.
    let mut only_elsewhere = movable(&["ml/a"]);
    only_elsewhere.get_mut("ml/a").expect("listed").lands = Some(BTreeSet::from(["m".to_string()]));
    assert_eq!(plan(&roomy, &want, &|_| true, &only_elsewhere, Bounds::default()).plan, None);
}

#[test]
fn whole_gpus_come_from_the_gpus_whose_pods_all_move_fewest_first() {
    let t = table();
    let nodes = vec![Node {
        name: "n".into(),
        gpus: vec![
            gpu(0, vec![(mig(&t, "1g.10gb", 0), "ml/a"), (mig(&t, "1g.10gb", 1), "ml/b")]),
            gpu(1, vec![(mig(&t, "1g.10gb", 0), "ml/c")]),
            gpu(2, vec![(mig(&t, "1g.10gb", 0), "kube-system/pinned")]),
            gpu(3, vec![(mig(&t, "1g.10gb", 6), "ml/d")]),
        ],
    }];
    let m = movable(&["ml/a", "ml/b", "ml/c", "ml/d"]);
    let p = plan(&nodes, &Want::Whole(2), &|_| true, &m, Bounds::default()).plan.expect("a plan");
    assert_eq!(p.room, vec![1, 3]);
    assert_eq!(p.cost.pods, 2);
    assert!(p.moves.iter().all(|m| m.devices.iter().all(|d| d.gpu == 0 || d.gpu == 2)), "{p:?}");
    assert_eq!(plan(&nodes, &Want::Whole(4), &|_| true, &m, Bounds::default()).plan, None, "a pinned pod");
    let tight = Bounds { max_pods: 1, ..Bounds::default() };
    assert_eq!(plan(&nodes, &Want::Whole(2), &|_| true, &m, tight).plan, None, "two pods are over the bound");
    let cut = plan(&nodes, &Want::Whole(2), &|_| true, &m, Bounds { max_candidates: 0, ..Bounds::default() });
    assert!(cut.cut && cut.plan.is_none());
}

#[test]
fn a_pod_whose_replacement_could_take_the_room_never_moves() {
    let t = table();
    // ml/a's 1g blocks the 3g placement at 0 on GPU 0, but ml/a also holds a 3g: its replacement
    // would ask for a 3g too, and the reserved room's 3g device stays allocatable.
    let nodes = vec![Node {
        name: "n".into(),
        gpus: vec![
            gpu(0, vec![(mig(&t, "1g.10gb", 0), "ml/a"), (mig(&t, "3g.40gb", 4), "x")]),
            gpu(1, vec![(mig(&t, "2g.20gb", 0), "y"), (mig(&t, "1g.10gb", 2), "z"), (mig(&t, "3g.40gb", 4), "ml/a")]),
        ],
    }];
    let want = Want::Mig("3g.40gb".into());
    assert_eq!(plan(&nodes, &want, &|_| true, &movable(&["ml/a"]), Bounds::default()).plan, None);
    // When the 3g is another pod's, ml/a moves.
    let mut small = nodes.clone();
    small[0].gpus[1].held[2].by = "w".into();
    let p = plan(&small, &want, &|_| true, &movable(&["ml/a"]), Bounds::default()).plan.expect("a plan");
    assert_eq!((p.room.clone(), p.moves.len()), (vec![0], 1), "{p:?}");
}

/// Random nodes of A100s: instances at random legal placements, held by pods (`p0..p3` on `n0`,
/// `p4..p7` on `n1`, some holding two) or by `other` (never movable), and sometimes a whole GPU
/// held by a pod.
fn arb_nodes() -> impl Strategy<Value = Vec<Node>> {
    let t = table();
    let names: Vec<String> =
        t.profiles.iter().filter(|p| !p.name.to_string().contains('+')).map(|p| p.name.to_string()).collect();
    let gpu_strategy = (proptest::collection::vec((0..names.len(), 0u32..8, 0usize..9), 3..9), 0u32..10);
    proptest::collection::vec(proptest::collection::vec(gpu_strategy, 1..4), 1..3).prop_map(move |nodes| {
        nodes
            .into_iter()
            .enumerate()
            .map(|(n, gpus)| Node {
                name: format!("n{n}"),
                gpus: gpus
                    .into_iter()
                    .enumerate()
                    .map(|(i, (tries, whole))| {
                        let mut g = gpu(i as u32, vec![]);
                        if whole == 0 {
                            g.held.push(Held { kind: DeviceKind::Gpu, by: format!("p{}", 3 + 4 * n) });
                            return g;
                        }
                        let mut occ = Occupancy::empty();
                        for (pi, start, pod) in tries {
                            let p = t.profiles.iter().find(|p| p.name.to_string() == names[pi]).expect("a profile");
                            let pl = Placement::new(start, p.memory_slices);
                            if p.placements.contains(&pl) && occ.can_add(&t, p, pl) {
                                occ.add(p, pl);
                                let by = if pod == 8 { "other".to_string() } else { format!("p{}", pod % 4 + 4 * n) };
                                g.held.push(Held { kind: DeviceKind::Mig { profile_id: p.id, placement: pl }, by });
                            }
                        }
                        g
                    })
                    .collect(),
            })
            .collect()
    })
}

fn arb_want() -> impl Strategy<Value = Want> {
    prop_oneof![
        prop::sample::select(vec!["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "7g.80gb"])
            .prop_map(|p| Want::Mig(p.into())),
        (1u32..3).prop_map(Want::Whole),
    ]
}

/// Movable pods among `p0..p7`, with creation times and sometimes a node they must land on.
fn arb_movable() -> impl Strategy<Value = BTreeMap<String, Movable>> {
    proptest::collection::vec((0u8..4, 0i64..100, 0u8..4), 8).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .filter(|(_, (m, _, _))| *m > 0)
            .map(|(i, (_, created, lands))| {
                let lands = match lands {
                    0 => Some(BTreeSet::from(["n0".to_string()])),
                    1 => Some(BTreeSet::from(["n1".to_string()])),
                    _ => None,
                };
                (format!("p{i}"), Movable { created, lands })
            })
            .collect()
    })
}

/// Brute force: the cheapest cost over every set of movable pods and every room, with the rules
/// checked here independently of the search: every moved pod holds a device in the room and could
/// not take it back; the room then holds the waiting pod; the replacements land as the scheduler
/// hands out devices (the shared simulation, [`replace`]).
fn oracle(nodes: &[Node], want: &Want, movable: &BTreeMap<String, Movable>, max_pods: usize) -> Option<Cost> {
    let pods: Vec<&String> = movable.keys().collect();
    let mut best: Option<Cost> = None;
    for mask in 0u32..(1 << pods.len()) {
        let chosen: Vec<&String> = (0..pods.len()).filter(|i| mask & (1 << i) != 0).map(|i| pods[i]).collect();
        if chosen.len() > max_pods {
            continue;
        }
        for (n, node) in nodes.iter().enumerate() {
            let room_sets: Vec<Vec<usize>> = match want {
                Want::Mig(_) => (0..node.gpus.len()).map(|g| vec![g]).collect(),
                Want::Whole(k) => subsets(node.gpus.len(), *k as usize),
            };
            for room in room_sets {
                let on_room = |p: &str| room.iter().any(|&g| node.gpus[g].held.iter().any(|h| h.by == p));
                if !chosen.iter().all(|p| on_room(p)) {
                    continue;
                }
                let takes_back = chosen.iter().any(|p| {
                    nodes.iter().flat_map(|x| &x.gpus).flat_map(|g| g.held.iter().map(move |h| (g, h))).any(|(g, h)| {
                        h.by == **p
                            && match want {
                                Want::Whole(_) => h.kind == DeviceKind::Gpu,
                                Want::Mig(w) => profile_name(&h.kind, &g.table).as_deref() == Some(w.as_str()),
                            }
                    })
                });
                if takes_back {
                    continue;
                }
                let left = |g: usize| -> Vec<DeviceKind> {
                    node.gpus[g].held.iter().filter(|h| !chosen.contains(&&h.by)).map(|h| h.kind).collect()
                };
                let fits = match want {
                    Want::Whole(_) => room.iter().all(|&g| left(g).is_empty()),
                    Want::Mig(w) => {
                        let g = room[0];
                        let t = &node.gpus[g].table;
                        let kinds = left(g);
                        match (t.profiles.iter().find(|p| p.name.to_string() == *w), occupancy_of(t, &kinds)) {
                            (Some(p), Some(occ)) if !kinds.contains(&DeviceKind::Gpu) => {
                                p.placements.iter().any(|pl| occ.can_add(t, p, *pl))
                            }
                            _ => false,
                        }
                    }
                };
                let r = Room { node: n, gpus: room.clone(), pods: Vec::new() };
                let moves = if fits { replace(nodes, &r, &chosen, movable) } else { None };
                if let Some(moves) = moves {
                    let share: u32 = nodes
                        .iter()
                        .flat_map(|x| &x.gpus)
                        .flat_map(|g| g.held.iter().map(move |h| (g, h)))
                        .filter(|(_, h)| chosen.contains(&&h.by))
                        .map(|(g, h)| share_of(&h.kind, &g.table))
                        .sum();
                    let age: i64 = chosen.iter().map(|p| movable[*p].created).sum();
                    let gone: BTreeSet<&str> = chosen.iter().map(|p| p.as_str()).collect();
                    let beneficiary = hand_out(node, &room, want, &gone);
                    let room = Reverse(room_after(nodes, n, &beneficiary, &gone, &moves));
                    let c = Cost { pods: chosen.len(), share, room, age: Reverse(age) };
                    best = Some(best.map_or(c.clone(), |b| b.min(c)));
                }
            }
        }
    }
    best
}

/// Checks a plan against the nodes independently: every device the plan hands out is legal where
/// it lands once the moved pods left, none lands in the room but the waiting pod's, and each
/// replacement lands on a node it may.
fn check_plan(nodes: &[Node], want: &Want, movable: &BTreeMap<String, Movable>, p: &Plan) -> Result<(), String> {
    let gone: Vec<&String> = p.moves.iter().map(|m| &m.pod).collect();
    let mut placed: BTreeMap<(String, u32), Vec<DeviceKind>> = BTreeMap::new();
    for n in nodes {
        for g in &n.gpus {
            let kept = g.held.iter().filter(|h| !gone.contains(&&h.by)).map(|h| h.kind);
            placed.entry((n.name.clone(), g.index)).or_default().extend(kept);
        }
    }
    for m in &p.moves {
        if movable[&m.pod].lands.as_ref().is_some_and(|l| !l.contains(&m.to)) {
            return Err(format!("{} lands on {}, which it may not", m.pod, m.to));
        }
        for d in &m.devices {
            if m.to == p.node && p.room.contains(&d.gpu) {
                return Err(format!("{}'s replacement lands in the room", m.pod));
            }
            placed.entry((m.to.clone(), d.gpu)).or_default().push(d.kind);
        }
    }
    for d in &p.beneficiary {
        placed.entry((p.node.clone(), d.gpu)).or_default().push(d.kind);
    }
    match want {
        Want::Whole(k) if p.beneficiary.len() != *k as usize => return Err("too few whole GPUs".into()),
        _ => {}
    }
    for ((node, index), kinds) in &placed {
        let t = &nodes
            .iter()
            .find(|n| n.name == *node)
            .and_then(|n| n.gpus.iter().find(|g| g.index == *index))
            .ok_or("no GPU")?
            .table;
        let whole = kinds.iter().filter(|k| **k == DeviceKind::Gpu).count();
        if whole > 1 || (whole == 1 && kinds.len() > 1) || occupancy_of(t, kinds).is_none() {
            return Err(format!("{node} GPU {index} over-allocated: {kinds:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn the_plan_is_legal_and_no_cheaper_plan_exists(nodes in arb_nodes(), want in arb_want(), movable in arb_movable(), max_pods in 1usize..4) {
        let bounds = Bounds { max_pods, max_candidates: usize::MAX };
        let s = plan(&nodes, &want, &|_| true, &movable, bounds);
        let best = oracle(&nodes, &want, &movable, max_pods);
        prop_assert_eq!(s.plan.as_ref().map(|p| p.cost.clone()), best, "{:?}", s.plan);
        if let Some(p) = &s.plan {
            prop_assert!(p.moves.len() <= max_pods);
            if let Err(e) = check_plan(&nodes, &want, &movable, p) {
                prop_assert!(false, "{}: {:?}", e, p);
            }
        }
    }
}
