//! Property tests of the controller's batch decision against a brute-force oracle: random small
//! clusters of A100 and H100 nodes (random MIG layouts with random busy instances, or MIG off),
//! random pending pods. With one reconfiguration slot the decision must be the best single-node
//! change over every combination of every GPU's options, ranked pods unblocked, then fewest
//! destroyed, fewest created, least fragmentation; it never loses a busy instance's units, and
//! the pods it names fit what the change offers. With several slots, decisions touch distinct
//! nodes, name each pod once, and unblock at least as many pods as the best single change.

use gpupart_cluster::controller::decide::{decide, decide_with as decide_remembering, Options, Outcome, World};
use gpupart_cluster::controller::gpu_options::{observed_spec, options, Counts, GpuOption};
use gpupart_cluster::controller::memo::Memo;
use gpupart_cluster::controller::nodes::GpuNode;
use gpupart_cluster::controller::pods::{GpuPod, Resource, Standing};
use gpupart_node::mig::capacity::Occupancy;
use gpupart_node::mig::catalog;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const MODELS: [&str; 2] = ["A100-SXM4-80GB", "H100-SXM5-80GB"];
const WANTED: [&str; 5] = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"];

/// One GPU of the annotation: `None` is MIG off (idle), else (profile, placement, busy) picks.
type GpuPicks = Option<Vec<(usize, usize, bool)>>;

fn annotation_item(model: &str, i: usize, picks: &GpuPicks) -> String {
    let Some(picks) = picks else { return format!(r#"{{"i":{i},"model":"{model}","mode":"none","busy":false}}"#) };
    let table = catalog::lookup(model).unwrap().profile_table();
    let mut occ = Occupancy::empty();
    let mut items = Vec::new();
    for &(pi, li, busy) in picks {
        let p = &table.profiles[pi % table.profiles.len()];
        let pl = p.placements[li % p.placements.len()];
        if occ.check(&table, p, pl).is_ok() {
            occ.add(p, pl);
            items.push(format!("\"{}@{}{}\"", p.name, pl.start, if busy { "*" } else { "" }));
        }
    }
    format!(r#"{{"i":{i},"model":"{model}","mode":"mig","layout":[{}]}}"#, items.join(","))
}

fn node(name: &str, model: &str, gpus: &[GpuPicks]) -> GpuNode {
    let items: Vec<String> = gpus.iter().enumerate().map(|(i, g)| annotation_item(model, i, g)).collect();
    let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"nvidia.com/mig.config": "today", "nvidia.com/mig.config.state": "success"},
            "annotations": {"gpupart.io/gpus": format!("[{}]", items.join(",")), "gpupart.io/state-layout": "today"}
        },
        "spec": {}
    }))
    .unwrap();
    GpuNode::read(&n).unwrap().unwrap()
}

fn pod(i: usize, resource: Resource, count: u32) -> GpuPod {
    GpuPod {
        key: format!("serving/p{i}"),
        namespace: "serving".into(),
        name: format!("p{i}"),
        uid: format!("u{i}"),
        resource,
        count,
        standing: Standing::Unschedulable { since: Some(i as i64) },
        dedicated: false,
        also: Vec::new(),
        unserved: None,
        constraints: Default::default(),
        scheduler_message: None,
        priority: 0,
        created: Some(i as i64),
        owner: None,
        movable: None,
    }
}

/// What a GPU offers as reported, and what its busy instances hold.
fn offered_and_held(n: &GpuNode) -> (Counts, Counts) {
    let (mut offered, mut held) = (Counts::new(), Counts::new());
    for g in &n.gpus {
        if g.mig {
            for i in &g.instances {
                *offered.entry(Resource::Mig(i.profile.clone())).or_default() += 1;
                if i.busy {
                    *held.entry(Resource::Mig(i.profile.clone())).or_default() += 1;
                }
            }
        } else {
            *offered.entry(Resource::Gpu).or_default() += 1;
        }
    }
    (offered, held)
}

/// How many pods (requests in the scheduler's order) `free` units serve as the scheduler serves
/// them: each in turn, if it still fits.
fn most_fitting(counts: &[u32], free: u32) -> usize {
    let mut left = free;
    counts
        .iter()
        .filter(|&&c| {
            let fits = c <= left;
            if fits {
                left -= c;
            }
            fits
        })
        .count()
}

type Score = (usize, i64, i64, i64);

/// The oracle: the pods the scheduler places today (first fit, oldest first), then the best
/// score of any one node's any combination of GPU options for the rest.
fn oracle(nodes: &[GpuNode], pods: &[GpuPod]) -> (Vec<String>, Option<Score>) {
    let mut assigned: Vec<Counts> = vec![Counts::new(); nodes.len()];
    let views: Vec<(Counts, Counts)> = nodes.iter().map(offered_and_held).collect();
    let mut unmet: Vec<&GpuPod> = Vec::new();
    for p in pods {
        let fits = (0..nodes.len()).find(|&i| {
            let get = |c: &Counts| c.get(&p.resource).copied().unwrap_or(0);
            get(&views[i].0) >= get(&views[i].1) + get(&assigned[i]) + p.count
        });
        match fits {
            Some(i) => *assigned[i].entry(p.resource.clone()).or_default() += p.count,
            None => unmet.push(p),
        }
    }
    let wanted: BTreeSet<Resource> = unmet.iter().map(|p| p.resource.clone()).collect();
    let mut best: Option<Score> = None;
    for (k, n) in nodes.iter().enumerate() {
        let model = catalog::lookup(n.model().unwrap().unwrap()).unwrap();
        let per_gpu: Vec<Vec<GpuOption>> =
            n.gpus.iter().map(|g| options(model, g, observed_spec(g), &wanted, 4).unwrap()).collect();
        let total: usize = per_gpu.iter().map(Vec::len).product();
        for mut code in 0..total {
            let mut offered = Counts::new();
            let (mut destroyed, mut created, mut frag) = (0i64, 0i64, 0.0f64);
            for o in &per_gpu {
                let pick = &o[code % o.len()];
                code /= o.len();
                for (r, c) in &pick.offers {
                    *offered.entry(r.clone()).or_default() += c;
                }
                destroyed += i64::from(pick.destroyed);
                created += i64::from(pick.created);
                frag += pick.frag;
            }
            let need =
                |r: &Resource| views[k].1.get(r).copied().unwrap_or(0) + assigned[k].get(r).copied().unwrap_or(0);
            let keeps =
                views[k].1.keys().chain(assigned[k].keys()).all(|r| offered.get(r).copied().unwrap_or(0) >= need(r));
            if !keeps {
                continue;
            }
            let unblocked: usize = wanted
                .iter()
                .map(|r| {
                    let counts: Vec<u32> = unmet.iter().filter(|p| &p.resource == r).map(|p| p.count).collect();
                    most_fitting(&counts, offered.get(r).copied().unwrap_or(0).saturating_sub(need(r)))
                })
                .sum();
            let s = (unblocked, -destroyed, -created, -(frag * 1000.0).round() as i64);
            if s.0 > 0 && best.is_none_or(|b| s > b) {
                best = Some(s);
            }
        }
    }
    (unmet.iter().map(|p| p.key.clone()).collect(), best)
}

fn gpu_strategy() -> impl Strategy<Value = GpuPicks> {
    prop_oneof![
        1 => Just(None),
        4 => proptest::collection::vec((0usize..16, 0usize..8, proptest::bool::weighted(0.35)), 0..6).prop_map(Some),
    ]
}

/// Nodes (model index, GPUs) and pending pods (wanted profile index, whole GPU, count).
type ClusterSpec = (Vec<(usize, Vec<GpuPicks>)>, Vec<(usize, bool, u32)>);

fn cluster_strategy() -> impl Strategy<Value = ClusterSpec> {
    cluster_with_pods(1..7)
}

fn cluster_with_pods(pods: std::ops::Range<usize>) -> impl Strategy<Value = ClusterSpec> {
    (
        proptest::collection::vec((0usize..2, proptest::collection::vec(gpu_strategy(), 1..3)), 1..4),
        proptest::collection::vec((0usize..WANTED.len(), proptest::bool::weighted(0.15), 1u32..3), pods),
    )
}

/// What a user sees of an outcome: each change (node, kind, specs, pods, costs) and each reason.
fn seen(out: &Outcome) -> String {
    let d: Vec<String> = out
        .decisions
        .iter()
        .map(|d| {
            format!(
                "{} {:?} {:?} {:?} -{} +{} {:.3} {}",
                d.node, d.kind, d.specs, d.pods, d.destroyed, d.created, d.frag, d.change
            )
        })
        .collect();
    let n: Vec<String> = out.not_served.iter().map(|n| format!("{} {} {}", n.key, n.kind, n.reason)).collect();
    format!("{d:#?}\n{n:#?}\nplaceable {}", out.placeable)
}

fn build(spec: &ClusterSpec) -> (Vec<GpuNode>, Vec<GpuPod>) {
    let nodes: Vec<GpuNode> =
        spec.0.iter().enumerate().map(|(i, (m, gpus))| node(&format!("n{i}"), MODELS[*m], gpus)).collect();
    let pods = spec
        .1
        .iter()
        .enumerate()
        .map(|(i, &(w, whole, count))| {
            let r = if whole { Resource::Gpu } else { Resource::Mig(WANTED[w].parse().unwrap()) };
            pod(i, r, if whole { 1 } else { count })
        })
        .collect();
    (nodes, pods)
}

/// The controller's decision with `slots` reconfiguration slots and no cool-down.
fn decide_with(nodes: &[GpuNode], pods: &[GpuPod], slots: usize) -> Outcome {
    let idle = BTreeMap::new();
    let opts = Options { max_concurrent_nodes: slots, cooldown_secs: 0, ..Options::default() };
    decide(&World { nodes, pods, config: None, now: 100, idle_since: &idle }, &opts)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn one_slot_gets_the_best_single_node_change(spec in cluster_strategy()) {
        let (nodes, pods) = build(&spec);
        let out = decide_with(&nodes, &pods, 1);
        let (unmet, best) = oracle(&nodes, &pods);
        prop_assert_eq!(out.placeable, pods.len() - unmet.len());
        match (out.decisions.first(), best) {
            (None, None) => {}
            (Some(d), Some(b)) => {
                let got = (d.pods.len(), -i64::from(d.destroyed), -i64::from(d.created), -(d.frag * 1000.0).round() as i64);
                prop_assert_eq!(got, b, "decision {:?}", d);
                // The pods it names wait, and fit what the change offers on top of what stays held.
                let n = nodes.iter().find(|n| n.name == d.node).unwrap();
                let (_, held) = offered_and_held(n);
                let mut offered = Counts::new();
                for s in &d.specs {
                    for (r, c) in gpupart_cluster::controller::capacity::spec_offers(s) {
                        *offered.entry(r).or_default() += c;
                    }
                }
                for (r, h) in &held {
                    prop_assert!(offered.get(r).copied().unwrap_or(0) >= *h, "busy {:?} lost on {}", r, d.node);
                }
                let mut asked = Counts::new();
                for k in &d.pods {
                    prop_assert!(unmet.contains(k), "{} did not wait", k);
                    let p = pods.iter().find(|p| &p.key == k).unwrap();
                    *asked.entry(p.resource.clone()).or_default() += p.count;
                }
                for (r, a) in &asked {
                    let room = offered.get(r).copied().unwrap_or(0).saturating_sub(held.get(r).copied().unwrap_or(0));
                    prop_assert!(*a <= room, "{:?}: {} asked, {} offered", r, a, room);
                }
            }
            (d, b) => prop_assert!(false, "decision {:?}, oracle {:?}", d, b),
        }
    }

    /// More pods wait than a node can serve (its queue is cut at what it could ever offer): the
    /// decision is still the oracle's.
    #[test]
    fn many_waiting_pods_still_get_the_best_single_node_change(spec in cluster_with_pods(10..40)) {
        let (nodes, pods) = build(&spec);
        let out = decide_with(&nodes, &pods, 1);
        let (unmet, best) = oracle(&nodes, &pods);
        prop_assert_eq!(out.placeable, pods.len() - unmet.len());
        let got = out.decisions.first().map(|d| (d.pods.len(), -i64::from(d.destroyed), -i64::from(d.created), -(d.frag * 1000.0).round() as i64));
        prop_assert_eq!(got, best, "decisions {:?}", out.decisions);
    }

    /// A memory carried from batch to batch (other clusters between, then the same one again)
    /// decides exactly as no memory does.
    #[test]
    fn remembering_earlier_batches_changes_no_decision(a in cluster_strategy(), b in cluster_with_pods(1..20), slots in 1usize..3) {
        let idle = BTreeMap::new();
        let opts = Options { max_concurrent_nodes: slots, cooldown_secs: 0, ..Options::default() };
        let mut memo = Memo::new();
        for spec in [&a, &b, &a, &a, &b] {
            let (nodes, pods) = build(spec);
            let world = World { nodes: &nodes, pods: &pods, config: None, now: 100, idle_since: &idle };
            prop_assert_eq!(seen(&decide_remembering(&world, &opts, &mut memo)), seen(&decide(&world, &opts)));
        }
    }

    #[test]
    fn several_slots_touch_distinct_nodes_and_do_no_worse(spec in cluster_strategy()) {
        let (nodes, pods) = build(&spec);
        let out = decide_with(&nodes, &pods, 3);
        let (_, best) = oracle(&nodes, &pods);
        let names: BTreeSet<&str> = out.decisions.iter().map(|d| d.node.as_str()).collect();
        prop_assert_eq!(names.len(), out.decisions.len());
        let all: Vec<&String> = out.decisions.iter().flat_map(|d| &d.pods).collect();
        let unique: BTreeSet<&String> = all.iter().copied().collect();
        prop_assert_eq!(unique.len(), all.len(), "a pod named twice");
        prop_assert!(out.decisions.len() <= 3);
        prop_assert!(all.len() >= best.map_or(0, |b| b.0));
        prop_assert_eq!(all.len() + out.not_served.len() + out.placeable, pods.len());
    }
}
