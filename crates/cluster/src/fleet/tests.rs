use super::assign::{assign, mixed_nodes};
use super::choose::{Pool, Target};
use super::configs::{config, enumerate};
use super::input::parse;
use super::report::report;
use super::*;
use crate::mig::capacity::Occupancy;
use crate::mig::catalog;
use proptest::prelude::*;

fn input(yaml: &str) -> Input {
    parse(yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn a100_fleet(nodes: u32, gpus: u32, demand: &str) -> Input {
    input(&format!("fleet:\n  - {{name: a100, count: {nodes}, gpu: A100-SXM4-80GB, gpus: {gpus}}}\ndemand:\n{demand}"))
}

fn error(yaml: &str) -> String {
    match parse(yaml) {
        Err(e) => e.to_string(),
        Ok(i) => match plan(&i, &Options::default()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {yaml}"),
        },
    }
}

const FLEET: &str = "fleet:\n  - {name: a100, count: 2, gpu: A100-SXM4-80GB, gpus: 8}\n";

#[test]
fn input_errors_name_the_entry_and_key() {
    let cases = [
        (
            "fleet:\n  - {name: x, count: 1, gpu: A200, gpus: 8}\ndemand:\n  - {name: m, memory: 1Gi}\n",
            "fleet[0] 'x', key 'gpu': unknown GPU model 'A200'",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: m, memory: 1Gi, color: red}}\n"),
            "demand[0] 'm', key 'color': unknown key",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: m, memory: lots}}\n"),
            "demand[0] 'm', key 'memory': expected a quantity",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: m, memory: 1Gi}}\n  - {{name: m, memory: 2Gi}}\n"),
            "demand[1] 'm', key 'name': repeats",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: big, memory: 200Gi}}\n"),
            "demand[0] 'big', key 'memory': no GPU of the fleet holds 200 GiB",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: tp, gpus: 16}}\n"),
            "demand[0] 'tp', key 'gpus': needs 16 GPUs on one node",
        ),
        (
            &format!("{FLEET}demand:\n  - {{name: p, profile: 1g.12gb}}\n"),
            "demand[0] 'p', key 'profile': no GPU of the fleet has profile 1g.12gb",
        ),
        (&format!("{FLEET}demand:\n  - {{name: p, profile: 1c.3g.40gb}}\n"), "names a compute instance"),
        (&format!("{FLEET}demand:\n  - {{name: s, sharing: mps}}\n"), "demand[0] 's', key 'memory': sharing mps needs"),
        (
            &format!("{FLEET}demand:\n  - {{name: s, memory: 1Gi, sharing: nvlink}}\n"),
            "demand[0] 's', key 'sharing': unknown sharing 'nvlink'",
        ),
        (&format!("{FLEET}demand:\n  - {{name: s, gpus: 2, profile: 1g.10gb}}\n"), "demand[0] 's', key 'gpus'"),
        (&format!("{FLEET}demand:\n  - {{name: s}}\n"), "demand[0] 's': give 'memory', 'profile' or 'gpus'"),
        (
            "fleet:\n  - {name: x, gpu: T4-16GB, gpus: 1}\ndemand:\n  - {name: m, memory: 1Gi}\n",
            "fleet[0] 'x', key 'count': give 'count' or 'nodes'",
        ),
        (
            "fleet:\n  - {name: x, nodes: [a, a], gpu: T4-16GB, gpus: 1}\ndemand:\n  - {name: m, memory: 1Gi}\n",
            "node 'a' is already in the fleet",
        ),
        (&format!("{FLEET}demand: []\n"), "key 'demand': is empty"),
        (&format!("{FLEET}demand:\n  - {{name: m, memory: 30Gi, sharing: mig, replicas: -1}}\n"), "key 'replicas'"),
        (
            &format!("{FLEET}demand:\n  - {{name: m, memory: 79Gi, sharing: mig}}\n"),
            "key 'memory': needs 86.90 GiB with headroom",
        ),
    ];
    for (yaml, want) in cases {
        let got = error(yaml);
        assert!(got.contains(want), "{yaml}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn memory_quantities() {
    assert_eq!(input::parse_memory("30Gi"), Some(30 * 1024));
    assert_eq!(input::parse_memory("500Mi"), Some(500));
    assert_eq!(input::parse_memory("1G"), Some(954));
    assert_eq!(input::parse_memory("1.5Gi"), Some(1536));
    assert_eq!(input::parse_memory("0"), None);
    assert_eq!(input::parse_memory("7 GB"), None);
}

fn choice(fleet: &str, demand: &str) -> (Pool, String, String) {
    let i = input(&format!("{fleet}demand:\n  - {demand}\n"));
    let c = choose::choose(&i, 10).unwrap().remove(0);
    let what = match &c.target {
        Target::Dedicated { gpus } => format!("{gpus} whole"),
        Target::Whole { .. } => "whole".into(),
        Target::Mig { model, profile, .. } => format!("{profile} on {}", model.id),
        Target::Mps { slot_mib } => format!("mps {slot_mib}"),
    };
    (c.pool, what, c.reason)
}

#[test]
fn each_model_gets_its_pool_with_a_reason() {
    let (p, w, r) = choice(FLEET, "{name: llama-70b, gpus: 8}");
    assert_eq!((p, w.as_str()), (Pool::Dedicated, "8 whole"));
    assert!(r.contains("tensor parallel"), "{r}");
    // 30 GiB + 10% = 33 GiB: 2g.20gb is too small, 3g.40gb holds it.
    let (p, w, r) = choice(FLEET, "{name: llama-13b, memory: 30Gi}");
    assert_eq!((p, w.as_str()), (Pool::Shared, "3g.40gb on A100-SXM4-80GB"));
    assert!(r.contains("33 GiB") && r.contains("smallest MIG profile"), "{r}");
    // Equal memory: the profile with fewer compute slices (1g.20gb over 2g.20gb).
    assert_eq!(choice(FLEET, "{name: m, memory: 16Gi}").1, "1g.20gb on A100-SXM4-80GB");
    // Media engines only when asked.
    assert_eq!(choice(FLEET, "{name: m, memory: 9Gi}").1, "1g.20gb on A100-SXM4-80GB", "9 GiB + 10% is over 9.5 GiB");
    assert_eq!(choice(FLEET, "{name: m, memory: 8Gi}").1, "1g.10gb on A100-SXM4-80GB");
    assert_eq!(choice(FLEET, "{name: m, profile: 1g.10gb+me}").1, "1g.10gb+me on A100-SXM4-80GB");
    // Too big for 7g.80gb with headroom: a whole GPU.
    let (p, _, r) = choice(FLEET, "{name: m, memory: 75Gi}");
    assert_eq!(p, Pool::Standard);
    assert!(r.contains("more than the largest MIG profile (7g.80gb"), "{r}");
    assert_eq!(choice(FLEET, "{name: w, memory: 6Gi, sharing: mps}").1, format!("mps {}", 6 * 1024));
    assert_eq!(choice(FLEET, "{name: w, memory: 6Gi, sharing: whole}").0, Pool::Standard);
    // No MIG GPU in the fleet: MPS.
    let l4 = "fleet:\n  - {name: l4, count: 2, gpu: L4-24GB, gpus: 4}\n";
    let (p, _, r) = choice(l4, "{name: w, memory: 6Gi}");
    assert_eq!(p, Pool::Mps);
    assert!(r.contains("no MIG GPU in the fleet"), "{r}");
    // A slot over half of every GPU is a whole GPU.
    assert_eq!(choice(l4, "{name: w, memory: 16Gi}").0, Pool::Standard);
    // Headroom moves the choice.
    let i = input(&format!("{FLEET}demand:\n  - {{name: m, memory: 19Gi}}\n"));
    let at = |h| match &choose::choose(&i, h).unwrap()[0].target {
        Target::Mig { profile, .. } => profile.to_string(),
        _ => String::new(),
    };
    assert_eq!((at(0).as_str(), at(10).as_str()), ("1g.20gb", "3g.40gb"));
}

/// Every instance of a MIG GPU sits at a legal placement, checked with the driver's rules.
fn mig_gpus_are_legal(i: &Input, p: &FleetPlan) {
    for pn in &p.nodes {
        let t = i.nodes[pn.node].model.profile_table();
        for u in &pn.gpus {
            if let GpuUse::Mig { instances, replicas } = u {
                assert_eq!(instances.len(), replicas.len());
                let mut occ = Occupancy::empty();
                for &(id, pl) in instances {
                    let prof = t.by_id(id).unwrap();
                    occ.check(&t, prof, pl).unwrap_or_else(|e| panic!("{e}"));
                    occ.add(prof, pl);
                }
            }
        }
    }
}

/// Each replica is placed once (all GPUs of a dedicated one on one node) or counted unplaced.
fn replicas_add_up(i: &Input, p: &FleetPlan) {
    let mut seen: std::collections::BTreeMap<Replica, Vec<usize>> = Default::default();
    for pn in &p.nodes {
        for u in &pn.gpus {
            let reps: Vec<Replica> = match u {
                GpuUse::Idle => vec![],
                GpuUse::Dedicated(r) | GpuUse::Whole(r) => vec![*r],
                GpuUse::Mig { replicas, .. } => replicas.iter().flatten().copied().collect(),
                GpuUse::Mps { clients, .. } => clients.clone(),
                GpuUse::Busy { .. } => vec![],
            };
            for r in reps {
                seen.entry(r).or_default().push(pn.node);
            }
        }
    }
    for (di, d) in i.demand.iter().enumerate() {
        let placed = (0..d.replicas).filter(|r| seen.contains_key(&(di, *r))).count() as u32;
        let missing: u32 = p.unplaced.iter().filter(|u| u.demand == di).map(|u| u.replicas).sum();
        assert_eq!(placed + missing, d.replicas, "{}", d.name);
        let per = d.gpus.max(1) as usize;
        for r in 0..d.replicas {
            if let Some(nodes) = seen.get(&(di, r)) {
                assert_eq!(nodes.len(), per, "{} replica {r}", d.name);
                assert!(nodes.iter().all(|n| *n == nodes[0]), "{} replica {r} spans nodes", d.name);
            }
        }
    }
}

/// A dedicated node holds one model and nothing else.
fn dedicated_nodes_are_alone(p: &FleetPlan) {
    for pn in &p.nodes {
        let models: std::collections::BTreeSet<usize> =
            pn.gpus.iter().filter_map(|u| if let GpuUse::Dedicated((d, _)) = u { Some(*d) } else { None }).collect();
        if !models.is_empty() {
            assert_eq!(models.len(), 1);
            assert!(pn.gpus.iter().all(|u| matches!(u, GpuUse::Dedicated(_) | GpuUse::Idle)));
        }
    }
}

const DONE_WHEN: &str = "  - {name: llama-70b, gpus: 8, replicas: 2}
  - {name: llama-13b, memory: 30Gi, replicas: 6}
  - {name: llama-7b, memory: 16Gi, replicas: 14}
  - {name: embed, profile: 1g.10gb, replicas: 10}
";

#[test]
fn the_done_when_fleet() {
    let i = a100_fleet(8, 8, DONE_WHEN);
    let p = plan(&i, &Options::default()).unwrap();
    mig_gpus_are_legal(&i, &p);
    replicas_add_up(&i, &p);
    dedicated_nodes_are_alone(&p);
    let doc = report(&i, &p);
    assert!(doc.unplaced.is_empty());
    // 62 memory slices of MIG instances: 8 GPUs is the bound, and the plan meets it.
    assert_eq!(doc.summary.search.method, "exact");
    assert_eq!((doc.summary.search.mig_gpus, doc.summary.search.lower_bound_gpus), (8, 8));
    assert_eq!((doc.summary.gpus_used, doc.summary.gpus_idle), (24, 40));
    assert_eq!(doc.summary.pools["dedicated"].nodes, 2);
    assert_eq!(doc.summary.pools["shared"].replicas, 30);
    assert_eq!(doc.summary.mixed_nodes, 0);
    assert!(doc.summary.fragmentation_ratio <= doc.baseline.fragmentation_ratio);
    assert!(doc.baseline.gpus_used >= doc.summary.gpus_used);
    assert_eq!(doc.baselines[1].name, "whole-gpus");
    assert_eq!(doc.baselines[1].gpus_used, 16 + 30);
    let dedicated: Vec<&report::NodeDoc> = doc.nodes.iter().filter(|n| n.pool == "dedicated").collect();
    assert_eq!(dedicated.len(), 2);
    for n in &dedicated {
        assert_eq!(n.taints, vec!["gpu-dedicated=true:NoSchedule"]);
        assert_eq!(n.labels["gpu-pool"], "dedicated");
        assert_eq!(n.labels["nvidia.com/mig.config"], n.layout);
    }
    // The config parses, validates strictly and names every node's layout.
    let file = crate::config::parse(&doc.config).unwrap();
    let found = gpupart_node::validate::validate(&file, None, None).unwrap();
    assert!(found.problems.is_empty() && found.warnings.is_empty(), "{found:?}");
    for n in &doc.nodes {
        assert!(file.configs.iter().any(|c| c.name == n.layout), "{}", n.layout);
    }
}

#[test]
fn capacity_shortfall_is_unplaced_with_a_reason() {
    let i = input(
        "fleet:\n  - {name: big, count: 1, gpu: A100-SXM4-80GB, gpus: 4}\n  - {name: small, count: 1, gpu: A100-SXM4-80GB, gpus: 2}\n\
         demand:\n  - {name: embed, profile: 1g.10gb, replicas: 20}\n  - {name: tp, gpus: 4, replicas: 2}\n",
    );
    let p = plan(&i, &Options::default()).unwrap();
    replicas_add_up(&i, &p);
    let doc = report(&i, &p);
    assert_eq!(doc.unplaced.len(), 2, "{:?}", doc.unplaced);
    assert_eq!((doc.unplaced[0].model.as_str(), doc.unplaced[0].replicas), ("embed", 6));
    assert!(doc.unplaced[0].reason.contains("no free A100-SXM4-80GB GPU"), "{}", doc.unplaced[0].reason);
    assert!(doc.unplaced[1].reason.contains("no free node with 4 GPUs"), "{}", doc.unplaced[1].reason);
    assert_eq!(doc.summary.search.method, "heuristic");
}

#[test]
fn mps_slots_share_gpus_without_mig_and_render_an_mps_block() {
    let i = input(
        "fleet:\n  - {name: a, count: 1, gpu: A100-SXM4-80GB, gpus: 2}\n  - {name: t, count: 1, gpu: T4-16GB, gpus: 2}\n\
         demand:\n  - {name: whisper, memory: 6Gi, sharing: mps, replicas: 3}\n  - {name: e, profile: 1g.10gb, replicas: 2}\n",
    );
    let p = plan(&i, &Options::default()).unwrap();
    replicas_add_up(&i, &p);
    let doc = report(&i, &p);
    // Two 6 GiB slots per 15 GiB T4: two T4s, the A100s stay for MIG.
    let t4 = doc.nodes.iter().find(|n| n.name == "t-0").unwrap();
    assert_eq!(t4.pool, "mps");
    assert!(doc.config.contains("mps:\n        replicas: 2\n        pinned-memory-limit: 6144M"), "{}", doc.config);
    assert_eq!(doc.placements.iter().filter(|p| p.profile == "mps").count(), 3);
    let file = crate::config::parse(&doc.config).unwrap();
    let found = gpupart_node::validate::validate(&file, None, None).unwrap();
    assert!(found.problems.is_empty(), "{found:?}");
}

#[test]
fn remainders_mix_only_when_nodes_run_out() {
    // Three pools of 3 GPUs on two 8-GPU nodes: one node must hold two pools.
    let caps = [8, 8];
    let a = assign(&caps, &[(Pool::Shared, 3), (Pool::Standard, 3), (Pool::Mps, 3)]);
    assert_eq!(mixed_nodes(&a), 1);
    // Three nodes: none mixed.
    let a = assign(&[8, 8, 8], &[(Pool::Shared, 3), (Pool::Standard, 3), (Pool::Mps, 3)]);
    assert_eq!(mixed_nodes(&a), 0);
}

/// Brute force: every split of every pool's GPUs over the nodes; the fewest mixed nodes.
fn brute_mixed(caps: &[u32], requests: &[(Pool, u32)]) -> usize {
    fn split(caps: &[u32], reqs: &[(Pool, u32)], k: usize, free: &mut Vec<u32>, on: &mut Vec<u32>, best: &mut usize) {
        if k == reqs.len() {
            *best = (*best).min(on.iter().filter(|n| n.count_ones() > 1).count());
            return;
        }
        #[allow(clippy::too_many_arguments)] // a brute-force oracle's recursion state
        fn place(
            caps: &[u32],
            reqs: &[(Pool, u32)],
            k: usize,
            n: usize,
            left: u32,
            free: &mut Vec<u32>,
            on: &mut Vec<u32>,
            best: &mut usize,
        ) {
            if left == 0 {
                return split(caps, reqs, k + 1, free, on, best);
            }
            if n == caps.len() {
                return;
            }
            for take in 0..=left.min(free[n]) {
                free[n] -= take;
                let was = on[n];
                if take > 0 {
                    on[n] |= 1 << k;
                }
                place(caps, reqs, k, n + 1, left - take, free, on, best);
                on[n] = was;
                free[n] += take;
            }
        }
        place(caps, reqs, k, 0, reqs[k].1, free, on, best);
    }
    let mut best = usize::MAX;
    split(caps, requests, 0, &mut caps.to_vec(), &mut vec![0; caps.len()], &mut best);
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The node assignment touches as few nodes outside their pool as brute force can.
    #[test]
    fn assignment_mixes_as_little_as_brute_force(caps in proptest::collection::vec(1u32..4, 1..4), counts in proptest::collection::vec(0u32..4, 3)) {
        let total: u32 = caps.iter().sum();
        let pools = [Pool::Standard, Pool::Shared, Pool::Mps];
        let mut reqs: Vec<(Pool, u32)> = Vec::new();
        let mut room = total;
        for (p, c) in pools.iter().zip(&counts) {
            let c = (*c).min(room);
            room -= c;
            if c > 0 { reqs.push((*p, c)); }
        }
        let a = assign(&caps, &reqs);
        for (p, c) in &reqs {
            prop_assert_eq!(a.iter().filter(|x| x.pool == *p).map(|x| x.gpus).sum::<u32>(), *c);
        }
        for (n, cap) in caps.iter().enumerate() {
            prop_assert!(a.iter().filter(|x| x.node == n).map(|x| x.gpus).sum::<u32>() <= *cap);
        }
        prop_assert_eq!(mixed_nodes(&a), brute_mixed(&caps, &reqs));
    }
}

/// Brute force: every way to split the instances over GPUs (restricted growth strings), each
/// GPU feasible; the least (GPUs, fragmentation).
fn brute_pack(model: &str, profiles: &[u32], demand: &[u32], w: &Workload) -> (u32, f64) {
    let t = catalog::lookup(model).unwrap().profile_table();
    let items: Vec<usize> = demand.iter().enumerate().flat_map(|(k, &n)| std::iter::repeat_n(k, n as usize)).collect();
    let mut best = (u32::MAX, f64::MAX);
    let mut assign = vec![0usize; items.len()];
    #[allow(clippy::too_many_arguments)] // a brute-force oracle's recursion state
    fn rec(
        t: &crate::mig::ProfileTable,
        p: &[u32],
        w: &Workload,
        items: &[usize],
        a: &mut Vec<usize>,
        i: usize,
        bins: usize,
        best: &mut (u32, f64),
    ) {
        if bins as u32 > best.0 {
            return;
        }
        if i == items.len() {
            let mut frag = 0.0;
            for b in 0..bins {
                let mut counts = vec![0u32; p.len()];
                for (j, &k) in items.iter().enumerate() {
                    if a[j] == b {
                        counts[k] += 1;
                    }
                }
                match config(t, p, &counts, w) {
                    Some(c) => frag += c.frag_slices,
                    None => return,
                }
            }
            let cand = (bins as u32, frag);
            if cand.0 < best.0 || (cand.0 == best.0 && cand.1 < best.1 - 1e-9) {
                *best = cand;
            }
            return;
        }
        for b in 0..=bins {
            a[i] = b;
            rec(t, p, w, items, a, i + 1, bins.max(b + 1), best);
        }
    }
    rec(&t, profiles, w, &items, &mut assign, 0, 0, &mut best);
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The packing is exact: brute force finds no plan with fewer GPUs or less fragmentation.
    #[test]
    fn mig_packing_matches_brute_force(
        model in prop::sample::select(vec!["A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB", "RTX-PRO-6000-96GB"]),
        picks in proptest::collection::vec((0usize..4, 0u32..4), 1..4),
    ) {
        let m = catalog::lookup(model).unwrap();
        let t = m.profile_table();
        let base: Vec<u32> = t.profiles.iter().filter(|p| p.name.suffix.is_empty()).map(|p| p.id).collect();
        let mut profiles: Vec<u32> = picks.iter().map(|(k, _)| base[k % base.len()]).collect();
        profiles.sort_unstable();
        profiles.dedup();
        let demand: Vec<u32> = profiles.iter().map(|id| picks.iter().filter(|(k, _)| base[k % base.len()] == *id).map(|(_, n)| *n).sum::<u32>().min(4)).collect();
        prop_assume!(demand.iter().sum::<u32>() > 0 && demand.iter().sum::<u32>() <= 7);
        let w = Workload { weights: profiles.iter().zip(&demand).map(|(id, n)| (t.by_id(*id).unwrap().name.clone(), f64::from(*n))).collect() };
        let configs = enumerate(&t, &profiles, &w);
        let p = pack::pack(&t, &configs, &demand, 64);
        prop_assert!(p.exact);
        prop_assert!(p.unplaced.iter().all(|n| *n == 0));
        let (gpus, frag) = brute_pack(model, &profiles, &demand, &w);
        prop_assert_eq!(p.gpus.len() as u32, gpus);
        prop_assert!((p.frag_slices(&configs) - frag).abs() < 1e-6, "{} vs {}", p.frag_slices(&configs), frag);
        prop_assert!(p.lower_bound <= gpus);
    }

    /// Whole plans on small fleets keep every invariant, and never use more GPUs than first-fit.
    #[test]
    fn small_plans_keep_the_rules(
        nodes in 1u32..5,
        tp in prop::sample::select(vec![0u32, 2, 4, 8]),
        big in 0u32..3,
        mids in 0u32..8,
        smalls in 0u32..16,
        wholes in 0u32..3,
    ) {
        let mut demand = String::new();
        if tp > 0 { demand += &format!("  - {{name: tp, gpus: {tp}, replicas: {big}}}\n"); }
        demand += &format!("  - {{name: mid, memory: 30Gi, replicas: {mids}}}\n  - {{name: small, profile: 1g.10gb, replicas: {smalls}}}\n  - {{name: big, memory: 75Gi, replicas: {wholes}}}\n");
        let i = a100_fleet(nodes, 8, &demand);
        let p = plan(&i, &Options::default()).unwrap();
        mig_gpus_are_legal(&i, &p);
        replicas_add_up(&i, &p);
        dedicated_nodes_are_alone(&p);
        let doc = report(&i, &p);
        if doc.unplaced.is_empty() && doc.baseline.unplaced == 0 {
            prop_assert!(doc.summary.gpus_used <= doc.baseline.gpus_used, "{} > {}", doc.summary.gpus_used, doc.baseline.gpus_used);
        }
        let file = crate::config::parse(&doc.config).unwrap();
        let found = gpupart_node::validate::validate(&file, None, None).unwrap();
        prop_assert!(found.problems.is_empty() && found.warnings.is_empty(), "{:?}", found);
    }
}

#[test]
fn large_demand_is_heuristic_with_a_small_gap() {
    let i = a100_fleet(
        1000,
        8,
        "  - {name: tp, gpus: 8, replicas: 100}\n  - {name: a, memory: 30Gi, replicas: 3000}\n  - {name: b, memory: 16Gi, replicas: 7000}\n  - {name: c, profile: 1g.10gb, replicas: 5000}\n  - {name: w, memory: 75Gi, replicas: 300}\n",
    );
    let p = plan(&i, &Options::default()).unwrap();
    replicas_add_up(&i, &p);
    let doc = report(&i, &p);
    let s = &doc.summary.search;
    assert_eq!(s.method, "heuristic");
    assert!(s.mig_gpus >= s.lower_bound_gpus);
    assert!(f64::from(s.gap_gpus) <= 0.05 * f64::from(s.lower_bound_gpus), "{s:?}");
    assert!(doc.summary.gpus_used <= doc.baseline.gpus_used);
}

#[test]
fn the_json_keys_stay_as_documented() {
    let i = a100_fleet(2, 8, "  - {name: e, profile: 1g.10gb, replicas: 3}\n  - {name: tp, gpus: 8}\n  - {name: x, profile: 7g.80gb, replicas: 20}\n");
    let doc = serde_json::to_value(report(&i, &plan(&i, &Options::default()).unwrap())).unwrap();
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&doc),
        ["nodes", "placements", "unplaced", "config", "summary", "baseline", "baselines", "decisions", "moves"]
    );
    assert_eq!(keys(&doc["nodes"][0]), ["name", "pool", "layout", "labels", "taints", "gpu", "gpus", "pools"]);
    assert_eq!(keys(&doc["placements"][0]), ["model", "replica", "node", "gpu", "profile"]);
    assert_eq!(keys(&doc["unplaced"][0]), ["model", "replicas", "reason"]);
    for k in ["gpus_used", "gpus_idle", "fragmentation_ratio", "pools"] {
        assert!(doc["summary"].get(k).is_some(), "summary.{k}");
    }
    assert_eq!(keys(&doc["baseline"]), ["name", "gpus_used", "fragmentation_ratio", "unplaced", "mixed_nodes"]);
    assert_eq!(doc["baseline"]["name"], "first-fit");
}

fn gpu(index: u32, model: &str, layout: &[(&str, u32, bool)]) -> current::CurrentGpu {
    current::CurrentGpu {
        index,
        model: model.into(),
        mig: !layout.is_empty(),
        instances: layout
            .iter()
            .map(|(p, s, b)| current::CurrentInstance {
                profile: p.parse().unwrap(),
                start: *s,
                busy: *b,
                foreign: false,
            })
            .collect(),
        busy: false,
        mps_slots: None,
        unhealthy: None,
    }
}

const M: &str = "A100-SXM4-80GB";

#[test]
fn today_busy_instances_stay_and_matching_gpus_are_kept_whole() {
    // Two nodes of 2 GPUs: a100-0 serves 3g.40gb ×2 on both GPUs (one busy), a100-1 is empty.
    let i = a100_fleet(2, 2, "  - {name: m13, memory: 30Gi, replicas: 3}\n  - {name: tp, gpus: 2}\n");
    let mut today = current::Current::new();
    today.insert(
        "a100-0".into(),
        vec![
            gpu(0, M, &[("3g.40gb", 0, true), ("3g.40gb", 4, false)]),
            gpu(1, M, &[("3g.40gb", 0, false), ("3g.40gb", 4, false)]),
        ],
    );
    let p = plan_from(&i, &Options::default(), &today).unwrap();
    replicas_add_up(&i, &p);
    mig_gpus_are_legal(&i, &p);
    let doc = report(&i, &p);
    // The dedicated replica takes the empty node; the busy GPU stays whole, the idle one keeps
    // the one 3g.40gb still wanted and releases the other: one instance moves.
    assert_eq!(doc.nodes[1].pool, "dedicated");
    assert_eq!((doc.summary.moves.kept, doc.summary.moves.busy_kept), (3, 1));
    assert_eq!((doc.summary.moves.destroyed, doc.summary.moves.created), (1, 0), "{:?}", doc.moves);
    assert_eq!(doc.moves.len(), 1);
    assert_eq!((doc.moves[0].node.as_str(), doc.moves[0].gpu), ("a100-0", 1));
    assert_eq!(doc.placements.iter().filter(|x| x.model == "m13").count(), 3);
}

#[test]
fn today_changes_only_what_the_demand_no_longer_wants() {
    // Today: GPU 0 holds 1g.10gb ×7 (one busy at slot 3), GPU 1 holds 3g.40gb ×2. Demand: 3g ×2
    // and one 1g.10gb: GPU 1 stays, GPU 0 keeps its busy 1g and loses the rest.
    let i =
        a100_fleet(1, 2, "  - {name: a, memory: 30Gi, replicas: 2}\n  - {name: e, profile: 1g.10gb, replicas: 1}\n");
    let small: Vec<(&str, u32, bool)> = (0..7).map(|s| ("1g.10gb", s, s == 3)).collect();
    let mut today = current::Current::new();
    today.insert("a100-0".into(), vec![gpu(0, M, &small), gpu(1, M, &[("3g.40gb", 0, false), ("3g.40gb", 4, false)])]);
    let p = plan_from(&i, &Options::default(), &today).unwrap();
    let doc = report(&i, &p);
    assert_eq!(doc.summary.moves.busy_kept, 1);
    assert_eq!(doc.summary.moves.kept, 7 + 2, "a busy GPU keeps all its instances: {:?}", doc.moves);
    assert_eq!(doc.summary.moves.destroyed, 0);
    assert!(doc.moves.iter().all(|m| !m.destroy.iter().any(|d| d == "1g.10gb@3")));
    // Without the busy instance GPU 0 is not wanted whole and gets emptied: six destroyed.
    let idle: Vec<(&str, u32, bool)> = (0..7).map(|s| ("1g.10gb", s, false)).collect();
    today.insert("a100-0".into(), vec![gpu(0, M, &idle), gpu(1, M, &[("3g.40gb", 0, false), ("3g.40gb", 4, false)])]);
    let doc = report(&i, &plan_from(&i, &Options::default(), &today).unwrap());
    assert_eq!((doc.summary.moves.kept, doc.summary.moves.destroyed), (3, 6), "{:?}", doc.moves);
    assert_eq!(doc.moves.len(), 1);
    assert_eq!(doc.moves[0].gpu, 0);
}

#[test]
fn today_must_match_the_fleet() {
    let i = a100_fleet(1, 2, "  - {name: e, profile: 1g.10gb}\n");
    let mut today = current::Current::new();
    today.insert("a100-0".into(), vec![gpu(5, M, &[])]);
    let e = plan_from(&i, &Options::default(), &today).unwrap_err().to_string();
    assert!(e.contains("current 'a100-0', GPU 5") && e.contains("2 GPUs"), "{e}");
    today.insert("a100-0".into(), vec![gpu(0, "H100-SXM5-80GB", &[])]);
    let e = plan_from(&i, &Options::default(), &today).unwrap_err().to_string();
    assert!(e.contains("is a H100-SXM5-80GB, the fleet says A100-SXM4-80GB"), "{e}");
    today.insert("a100-0".into(), vec![gpu(0, M, &[("1g.5gb", 0, false)])]);
    let e = plan_from(&i, &Options::default(), &today).unwrap_err().to_string();
    assert!(e.contains("1g.5gb is not a GPU-instance profile of A100-SXM4-80GB"), "{e}");
}

#[test]
fn annotations_read_as_the_agent_writes_them() {
    let a = r#"[{"i":0,"uuid":"GPU-1","model":"A100-SXM4-80GB","mode":"mig","layout":["2g.20gb@0","1g.10gb@2*","3g.40gb@4"],"creatable":{},"largest":"none","frag":0.0},
               {"i":1,"uuid":"GPU-2","model":"A100-SXM4-80GB","mode":"mps","slots":4,"slotsUsed":1},
               {"i":2,"uuid":"GPU-3","model":"A100-SXM4-80GB","mode":"none","busy":false}]"#;
    let g = current::from_annotation("n", a).unwrap();
    assert_eq!(g.len(), 3);
    assert_eq!(g[0].instances.len(), 3);
    assert!(g[0].instances[1].busy && !g[0].instances[0].busy);
    assert_eq!(g[0].instances[2].start, 4);
    assert!(g[1].busy && g[1].mps_slots == Some(4) && !g[1].mig);
    assert!(!g[2].busy);
    let e = current::from_annotation("n", r#"[{"i":0,"model":"x","mode":"mig","layout":["3g"]}]"#).unwrap_err();
    assert!(e.to_string().contains("node 'n', annotation 'gpupart.io/gpus', [0]"), "{e}");
    // Who holds each instance, when the agent says.
    let held = r#"[{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["1g.10gb@2*","3g.40gb@4*"],
                    "pods":{"1g.10gb@2":["ml/a"],"3g.40gb@4":["ml/b","ml/c"],"bad":["x"]}},
                   {"i":1,"model":"A100-SXM4-80GB","mode":"none","busy":true}]"#;
    let h = current::holders_from_annotation(held);
    assert_eq!(h.len(), 2);
    assert_eq!(h[&(0, 2)], vec!["ml/a"]);
    assert_eq!(h[&(0, 4)], vec!["ml/b", "ml/c"]);
    assert!(current::holders_from_annotation(a).is_empty(), "an older agent's annotation names no pods");
    assert!(current::holders_from_annotation("{").is_empty());
}

#[test]
fn kept_gpus_take_more_instances_in_their_free_space() {
    // Today: two GPUs each with 3g.40gb@0 and 1g.10gb@4, idle. Demand: 3g ×2 and 1g.10gb ×4.
    let i =
        a100_fleet(1, 2, "  - {name: a, memory: 30Gi, replicas: 2}\n  - {name: e, profile: 1g.10gb, replicas: 4}\n");
    let mut today = current::Current::new();
    let g = |k| gpu(k, M, &[("3g.40gb", 0, false), ("1g.10gb", 4, false)]);
    today.insert("a100-0".into(), vec![g(0), g(1)]);
    let p = plan_from(&i, &Options::default(), &today).unwrap();
    mig_gpus_are_legal(&i, &p);
    replicas_add_up(&i, &p);
    let doc = report(&i, &p);
    assert!(doc.unplaced.is_empty());
    assert_eq!((doc.summary.moves.kept, doc.summary.moves.destroyed, doc.summary.moves.created), (4, 0, 2));
    assert_eq!(doc.summary.gpus_used, 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// From any today, the plan keeps every busy instance and as many idle ones as the demand
    /// wants, which no plan can beat: the fewest moves.
    #[test]
    fn plans_from_today_keep_the_most_instances(
        picks in proptest::collection::vec((0usize..200, proptest::collection::vec(any::<bool>(), 7)), 1..4),
        want in proptest::collection::vec(0u32..6, 3),
    ) {
        let m = catalog::lookup(M).unwrap();
        let t = m.profile_table();
        let base: Vec<u32> = ["1g.10gb", "2g.20gb", "3g.40gb"].iter().map(|n| t.resolve(&n.parse().unwrap()).unwrap().0.id).collect();
        let all = enumerate(&t, &base, &Workload::default()).all;
        let gpus: Vec<current::CurrentGpu> = picks
            .iter()
            .enumerate()
            .map(|(k, (c, busy))| {
                let cfg = &all[c % all.len()];
                let instances = cfg
                    .placements
                    .iter()
                    .zip(busy)
                    .map(|((id, pl), b)| current::CurrentInstance { profile: t.by_id(*id).unwrap().name.clone(), start: pl.start, busy: *b && k == 0, foreign: false })
                    .collect();
                current::CurrentGpu { index: k as u32, model: M.into(), mig: true, instances, busy: false, mps_slots: None, unhealthy: None }
            })
            .collect();
        let names = ["1g.10gb", "2g.20gb", "3g.40gb"];
        let demand: String = names.iter().zip(&want).map(|(n, r)| format!("  - {{name: m{n}, profile: {n}, replicas: {r}}}\n")).collect();
        let i = a100_fleet(1, picks.len() as u32, &demand);
        let mut today = current::Current::new();
        today.insert("a100-0".into(), gpus.clone());
        let p = plan_from(&i, &Options::default(), &today).unwrap();
        mig_gpus_are_legal(&i, &p);
        replicas_add_up(&i, &p);
        let doc = report(&i, &p);
        let count = |name: &str, busy: bool| gpus.iter().flat_map(|g| &g.instances).filter(|x| x.profile.to_string() == name && x.busy == busy).count() as u32;
        // A GPU with a busy instance keeps all of it; its idle instances count as busy-held here.
        let held = |name: &str| gpus.iter().filter(|g| g.any_busy()).flat_map(|g| &g.instances).filter(|x| x.profile.to_string() == name).count() as u32;
        let idle_elsewhere = |name: &str| gpus.iter().filter(|g| !g.any_busy()).flat_map(|g| &g.instances).filter(|x| x.profile.to_string() == name).count() as u32;
        let best: u32 = names.iter().zip(&want).map(|(n, w)| held(n) + idle_elsewhere(n).min(w.saturating_sub(held(n)))).sum();
        let busy: u32 = names.iter().map(|n| count(n, true)).sum();
        prop_assert_eq!(doc.summary.moves.busy_kept, busy);
        prop_assert_eq!(doc.summary.moves.kept, best, "{:?}", doc.moves);
        for mv in &doc.moves {
            for d in &mv.destroy {
                let (name, start) = d.split_once('@').unwrap();
                let g = &gpus[mv.gpu as usize];
                prop_assert!(!g.instances.iter().any(|x| x.busy && x.profile.to_string() == name && x.start.to_string() == start), "busy {d} destroyed");
            }
        }
    }
}
