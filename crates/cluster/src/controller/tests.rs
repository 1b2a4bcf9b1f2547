//! Batch decisions on small clusters built from fixtures.

use super::decide::{decide, Kind, Options, World};
use super::nodes::{GpuNode, CHANGED_AT, RECLAIM_LAYOUT};
use super::pods::{GpuPod, Resource, Standing};
use crate::fleet::report::{GpuSpec, LAYOUT_LABEL, POOL_LABEL};
use crate::keys::{STATE_LABEL, STATE_LAYOUT};
use std::collections::BTreeMap;

const A100: &str = "A100-SXM4-80GB";

/// An A100 node with one annotation item per GPU (`3g.40gb@0*,3g.40gb@4`; `off`, `off*`).
fn node(name: &str, gpus: &[&str]) -> GpuNode {
    node_of(A100, name, gpus)
}

/// A node of GPUs of `model` (`off`, `off*`, or a layout such as `3g.40gb@0*,3g.40gb@4`).
fn node_of(model: &str, name: &str, gpus: &[&str]) -> GpuNode {
    let items: Vec<String> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| match *g {
            "off" => format!(r#"{{"i":{i},"model":"{model}","mode":"none","busy":false}}"#),
            "off*" => format!(r#"{{"i":{i},"model":"{model}","mode":"none","busy":true}}"#),
            layout => {
                let l: Vec<String> = layout.split(',').filter(|s| !s.is_empty()).map(|s| format!("\"{s}\"")).collect();
                format!(r#"{{"i":{i},"model":"{model}","mode":"mig","layout":[{}]}}"#, l.join(","))
            }
        })
        .collect();
    let text = format!("[{}]", items.join(","));
    let n = super::nodes::tests::node(name, &text, &[(LAYOUT_LABEL, "all-3g.40gb"), (STATE_LABEL, "success")], false);
    let mut n = GpuNode::read(&n).unwrap().unwrap();
    n.annotations.insert(STATE_LAYOUT.into(), "all-3g.40gb".into());
    n
}

fn pod(name: &str, resource: Resource, count: u32, age: i64) -> GpuPod {
    super::pods::fixture("serving", name, resource, count, age)
}

fn mig(p: &str) -> Resource {
    Resource::Mig(p.parse().unwrap())
}

fn bound(mut p: GpuPod, node: &str) -> GpuPod {
    p.standing = Standing::Bound { node: node.into() };
    p
}

fn run(nodes: &[GpuNode], pods: &[GpuPod], opts: &Options) -> super::decide::Outcome {
    let idle = BTreeMap::new();
    decide(&World { nodes, pods, config: None, now: 10_000, idle_since: &idle }, opts)
}

#[test]
fn small_pods_on_3g_nodes_get_the_fewest_instances_changed_and_no_busy_one() {
    let nodes = vec![
        node("gpu-a", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0*,3g.40gb@4"]),
        node("gpu-b", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0*,3g.40gb@4*"]),
    ];
    let pods: Vec<GpuPod> = (0..3).map(|i| pod(&format!("small-{i}"), mig("1g.10gb"), 1, 100 + i)).collect();
    let out = run(&nodes, &pods, &Options::default());
    assert_eq!(out.decisions.len(), 1, "{out:#?}");
    let d = &out.decisions[0];
    assert_eq!((d.node.as_str(), d.kind.clone(), d.destroyed), ("gpu-a", Kind::Repartition, 1));
    assert_eq!(d.pods.len(), 3);
    assert_eq!(d.change, "GPU 1: +3 1g.10gb -1 3g.40gb");
    assert_eq!(d.specs[0], GpuSpec::Mig(vec![("3g.40gb".into(), 2)]));
    assert_eq!(d.specs[1], GpuSpec::Mig(vec![("1g.10gb".into(), 3), ("3g.40gb".into(), 1)]));
    assert!(out.not_served.is_empty());
}

#[test]
fn free_space_is_used_before_anything_is_destroyed_and_placeable_pods_wait_for_the_scheduler() {
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4*"]), node("gpu-b", &["3g.40gb@0*"])];
    let pods = vec![pod("p", mig("1g.10gb"), 2, 1)];
    let out = run(&nodes, &pods, &Options::default());
    let d = &out.decisions[0];
    assert_eq!((d.node.as_str(), d.destroyed, d.created), ("gpu-b", 0, 2));
    // A free instance of the profile exists: the scheduler can place the pod, nothing changes.
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,1g.10gb@4"])];
    let out = run(&nodes, &[pod("p", mig("1g.10gb"), 1, 1)], &Options::default());
    assert!(out.decisions.is_empty());
    assert_eq!(out.placeable, 1);
}

#[test]
fn a_pod_that_no_layout_serves_says_why_naming_the_pods_in_the_way() {
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4*"])];
    let holders =
        vec![bound(pod("llm-3", mig("3g.40gb"), 1, 1), "gpu-a"), bound(pod("llm-4", mig("3g.40gb"), 1, 1), "gpu-a")];
    let mut pods = holders.clone();
    pods.push(pod("big", mig("4g.40gb"), 1, 5));
    let out = run(&nodes, &pods, &Options::default());
    assert!(out.decisions.is_empty());
    assert_eq!(out.not_served.len(), 1);
    assert_eq!(
        out.not_served[0].reason,
        "needs 4g.40gb; no idle GPU can host it without evicting serving/llm-3, serving/llm-4"
    );
    let pods = vec![pod("tiny", mig("1g.5gb"), 1, 5)];
    let out = run(&nodes, &pods, &Options::default());
    assert!(out.not_served[0].reason.contains("no GPU model in the cluster has that MIG profile"));
}

#[test]
fn a_pod_asking_more_instances_than_any_node_holds_gets_the_real_reason_stably() {
    // Two nodes of two A100s, one 3g.40gb busy on each: 7g.80gb is one per GPU, two per node.
    let nodes = vec![node("gpu-a", &["3g.40gb@0*", ""]), node("gpu-b", &["3g.40gb@0*", ""])];
    let pods = vec![pod("base", mig("7g.80gb"), 3, 5)];
    let first = run(&nodes, &pods, &Options::default());
    assert!(first.decisions.is_empty());
    let n = &first.not_served[0];
    assert_eq!(n.reason, "needs 3 × 7g.80gb; no node can hold 3 instances of 7g.80gb (at most 2 on one node)");
    assert_eq!(n.kind, "too-large");
    // The reason does not depend on what else runs: a busier cluster says the same.
    let nodes = vec![node("gpu-a", &["3g.40gb@0*", "3g.40gb@4*"]), node("gpu-b", &["3g.40gb@0*", ""])];
    let again = run(&nodes, &pods, &Options::default());
    assert_eq!((again.not_served[0].kind, &again.not_served[0].reason), (n.kind, &n.reason));
}

#[test]
fn only_nodes_a_pod_could_land_on_change_and_a_pod_blocked_elsewhere_changes_nothing() {
    // gpu-a would be the cheaper change, but the pod selects gpu-b's label.
    let mut a = node("gpu-a", &["3g.40gb@0,3g.40gb@4*"]);
    let mut b = node("gpu-b", &["3g.40gb@0*,3g.40gb@4"]);
    b.labels.insert("disk".into(), "ssd".into());
    let mut p = pod("picky", mig("1g.10gb"), 1, 1);
    p.constraints.node_selector.insert("disk".into(), "ssd".into());
    let out = run(&[a.clone(), b.clone()], std::slice::from_ref(&p), &Options::default());
    assert_eq!(out.decisions.len(), 1);
    assert_eq!(out.decisions[0].node, "gpu-b");
    // More CPU than any node has left: nothing changes, and the pod is told why.
    a.room.cpu_millis = Some(32_000);
    b.room.cpu_millis = Some(32_000);
    b.room.cpu_requested = 30_000;
    let mut hungry = pod("hungry", mig("1g.10gb"), 1, 1);
    hungry.constraints.cpu_millis = 48_000;
    hungry.scheduler_message = Some("0/2 nodes are available: 2 Insufficient cpu.".into());
    let out = run(&[a, b], &[hungry], &Options::default());
    assert!(out.decisions.is_empty(), "{:?}", out.decisions);
    let n = &out.not_served[0];
    assert_eq!(n.kind, "blocked");
    assert_eq!(
        n.reason,
        "needs 1g.10gb but cannot land on any GPU node for other reasons: gpu-a: Insufficient cpu; gpu-b: Insufficient cpu (the scheduler: 0/2 nodes are available: 2 Insufficient cpu.)"
    );
}

#[test]
fn new_capacity_goes_to_the_pods_the_scheduler_serves_first_higher_priority_then_older() {
    // Half an A100 is free: room for one of the two 3 × 1g.10gb pods.
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4"])];
    let old = pod("old", mig("1g.10gb"), 3, 1);
    let mut urgent = pod("urgent", mig("1g.10gb"), 3, 2);
    urgent.priority = 1000;
    let out = run(&nodes, &[old.clone(), urgent], &Options::default());
    assert_eq!(out.decisions[0].pods, vec!["serving/urgent".to_string()]);
    // At equal priority the older one is served.
    let younger = pod("younger", mig("1g.10gb"), 3, 2);
    let out = run(&nodes, &[younger, old], &Options::default());
    assert_eq!(out.decisions[0].pods, vec!["serving/old".to_string()]);
}

#[test]
fn pods_the_controller_does_not_serve_take_new_capacity_only_where_they_could_bind() {
    // Half an A100 is free (room for 3 × 1g.10gb); an older pod also asks for a whole GPU.
    let mut rival = pod("rival", mig("1g.10gb"), 3, 1);
    rival.also = vec![(Resource::Gpu, 1)];
    rival.unserved = Some("asks for several GPU resources".into());
    let mine = pod("mine", mig("1g.10gb"), 3, 2);
    // No whole GPU here: the rival cannot bind, the new capacity is for `mine`.
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4"])];
    let out = run(&nodes, &[rival.clone(), mine.clone()], &Options::default());
    assert_eq!(out.decisions[0].pods, vec!["serving/mine".to_string()]);
    assert!(out.not_served.iter().all(|n| n.key != "serving/rival"), "told why by the reader, not here");
    // An idle whole GPU beside it: the older rival would take those 3 units first, so they do
    // not count for `mine` (the controller looks further instead of promising them).
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4", "off"])];
    let out = run(&nodes, &[rival, mine], &Options::default());
    assert!(out.decisions.iter().all(|d| !d.pods.contains(&"serving/rival".to_string())));
    let d = out.decisions.iter().find(|d| d.pods.contains(&"serving/mine".to_string())).expect("a change for mine");
    assert!(d.created >= 6, "room for the rival's 3 and mine: {d:?}");
}

#[test]
fn at_most_max_concurrent_nodes_change_and_unsettled_nodes_are_left_alone() {
    let mut nodes: Vec<GpuNode> = (0..4).map(|i| node(&format!("gpu-{i}"), &["3g.40gb@0,3g.40gb@4"])).collect();
    nodes[0].labels.insert(STATE_LABEL.into(), "pending".into());
    nodes[1].annotations.insert(CHANGED_AT.into(), "9990".into());
    let pods: Vec<GpuPod> = (0..30).map(|i| pod(&format!("s-{i}"), mig("1g.10gb"), 1, i)).collect();
    let opts = Options { max_concurrent_nodes: 2, ..Options::default() };
    let out = run(&nodes, &pods, &opts);
    assert_eq!(out.decisions.len(), 1, "one slot left besides the pending node: {out:#?}");
    let held: Vec<&str> = out.held.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(held, vec!["gpu-0", "gpu-1"]);
    assert!(out.held[1].1.contains("cooling down"), "{:?}", out.held);
    assert!(
        out.not_served.iter().all(|n| n.reason.contains("waits for a reconfiguration slot")),
        "{:?}",
        out.not_served
    );
}

#[test]
fn a_tensor_parallel_pod_converts_an_idle_node_to_dedicated_and_it_comes_back_later() {
    let nodes = vec![
        node("gpu-a", &["3g.40gb@0*,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]),
        node("gpu-b", &["3g.40gb@0,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]),
    ];
    let mut tp = pod("tp2", Resource::Gpu, 2, 1);
    tp.dedicated = true;
    let out = run(&nodes, &[tp.clone()], &Options::default());
    let d = &out.decisions[0];
    assert_eq!((d.node.as_str(), d.kind.clone(), d.destroyed), ("gpu-b", Kind::Dedicate, 4));
    assert_eq!(d.specs, vec![GpuSpec::Off, GpuSpec::Off]);
    assert_eq!(d.pods, vec!["serving/tp2"]);
    // A dedicated node the controller made, empty for the reclaim time, goes back.
    let mut ded = node("gpu-b", &["off", "off"]);
    ded.labels.insert(POOL_LABEL.into(), "dedicated".into());
    ded.annotations.insert(RECLAIM_LAYOUT.into(), "all-3g.40gb".into());
    let idle = BTreeMap::from([("gpu-b".to_string(), 10_000 - 1800)]);
    let nodes = vec![ded.clone()];
    let out =
        decide(&World { nodes: &nodes, pods: &[], config: None, now: 10_000, idle_since: &idle }, &Options::default());
    assert_eq!(out.decisions[0].kind, Kind::Reclaim);
    assert_eq!(out.decisions[0].restore.as_deref(), Some("all-3g.40gb"));
    let idle = BTreeMap::from([("gpu-b".to_string(), 10_000 - 60)]);
    let out =
        decide(&World { nodes: &nodes, pods: &[], config: None, now: 10_000, idle_since: &idle }, &Options::default());
    assert!(out.decisions.is_empty());
    // A bound pod keeps it.
    let pods = vec![bound(tp, "gpu-b")];
    let idle = BTreeMap::from([("gpu-b".to_string(), 0)]);
    let out = decide(
        &World { nodes: &nodes, pods: &pods, config: None, now: 10_000, idle_since: &idle },
        &Options::default(),
    );
    assert!(out.decisions.is_empty());
}

#[test]
fn whole_gpu_pods_get_an_idle_mig_gpu_turned_off() {
    let nodes = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0,3g.40gb@4"])];
    let out = run(&nodes, &[pod("w", Resource::Gpu, 1, 1)], &Options::default());
    let d = &out.decisions[0];
    assert_eq!(d.change, "GPU 1: MIG off");
    assert_eq!(d.destroyed, 2);
}

#[test]
fn opted_in_a_waiting_tensor_parallel_pod_reserves_the_node_that_drains_soonest() {
    let nodes = vec![
        node("gpu-a", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0*,3g.40gb@4"]),
        node("gpu-b", &["3g.40gb@0*,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]),
    ];
    let mut pods = vec![
        bound(pod("a1", mig("3g.40gb"), 1, 1), "gpu-a"),
        bound(pod("a2", mig("3g.40gb"), 1, 1), "gpu-a"),
        bound(pod("a3", mig("3g.40gb"), 1, 1), "gpu-a"),
        bound(pod("b1", mig("3g.40gb"), 1, 1), "gpu-b"),
    ];
    let mut tp = pod("tp2", Resource::Gpu, 2, 5);
    tp.dedicated = true;
    pods.push(tp.clone());
    // By default the pod waits for an idle node.
    let out = run(&nodes, &pods, &Options::default());
    assert!(out.decisions.is_empty(), "{out:#?}");
    assert!(out.not_served[0].reason.contains("no idle node can host it without evicting"), "{:?}", out.not_served);
    // Opted in, the node with the fewest pods is reserved; its layout stays.
    let opts = Options { reserve_for_dedicated: true, ..Options::default() };
    let out = run(&nodes, &pods, &opts);
    let d = &out.decisions[0];
    assert_eq!((d.node.as_str(), d.kind.clone(), d.destroyed), ("gpu-b", Kind::Reserve, 0));
    assert_eq!(d.restore.as_deref(), Some("all-3g.40gb"));
    assert_eq!(
        out.not_served[0].reason,
        "needs 2 whole GPUs on a dedicated node; node gpu-b is reserved for it and converts once its 1 pod(s) end"
    );
    let patch = super::patch::node_patch(&nodes[1], d, d.restore.as_deref(), 10_000, &opts.pools);
    assert_eq!(patch["metadata"]["labels"][LAYOUT_LABEL], "all-3g.40gb");
    assert_eq!(patch["spec"]["taints"][0]["key"], "gpu-dedicated");
    // Reserved: no second reservation while it drains.
    let mut reserved = nodes[1].clone();
    reserved.labels.insert(POOL_LABEL.into(), "dedicated".into());
    reserved.annotations.insert(RECLAIM_LAYOUT.into(), "all-3g.40gb".into());
    let two = vec![nodes[0].clone(), reserved.clone()];
    let out = run(&two, &pods, &opts);
    assert!(out.decisions.is_empty(), "{out:#?}");
    assert!(out.not_served[0].reason.contains("node gpu-b is reserved for it"));
    // Its pod ends: the node converts.
    let drained = vec![nodes[0].clone(), {
        let mut n = node("gpu-b", &["3g.40gb@0,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]);
        n.labels = reserved.labels.clone();
        n.annotations.insert(RECLAIM_LAYOUT.into(), "all-3g.40gb".into());
        n
    }];
    let left: Vec<GpuPod> = pods.iter().filter(|p| p.name != "b1").cloned().collect();
    let out = run(&drained, &left, &opts);
    assert_eq!((out.decisions[0].node.as_str(), out.decisions[0].kind.clone()), ("gpu-b", Kind::Dedicate));
    // The pod goes away before: the reservation is released, the layout stays.
    let no_tp: Vec<GpuPod> = pods.iter().filter(|p| p.name != "tp2").cloned().collect();
    let out = run(&two, &no_tp, &opts);
    let d = &out.decisions[0];
    assert_eq!((d.node.as_str(), d.kind.clone(), d.restore.as_deref()), ("gpu-b", Kind::Reclaim, Some("all-3g.40gb")));
}

/// The pools as users write them: pods select `gpu-pool`, the large model's replicas keep off
/// each other's nodes by a required anti-affinity on the hostname.
mod pools_as_written {
    use super::*;
    use crate::pools::Pools;

    fn labelled(name: &str, gpus: &[&str], pool: &str) -> GpuNode {
        let mut n = node(name, gpus);
        n.labels.insert(POOL_LABEL.into(), pool.into());
        n.labels.insert("kubernetes.io/hostname".into(), name.into());
        n.labels.insert("nvidia.com/gpu.product".into(), "NVIDIA-A100-SXM4-80GB".into());
        n
    }

    fn replica(name: &str, age: i64) -> GpuPod {
        let mut p = pod(name, Resource::Gpu, 4, age);
        p.dedicated = true;
        let spec: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "serving", "name": name, "labels": {"app": "llm-70b", "gpu-pool": "dedicated"}},
            "spec": {"containers": [{"name": "m"}],
                "nodeSelector": {"gpu-pool": "dedicated", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                "tolerations": [{"key": "gpu-dedicated", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchExpressions": [{"key": "gpu-pool", "operator": "In", "values": ["dedicated"]}]},
                     "topologyKey": "kubernetes.io/hostname"}]}}}
        }))
        .unwrap();
        p.constraints = super::super::fit::constraints(&spec);
        p
    }

    /// A dedicated node (label and taint) with eight whole GPUs; shared nodes in 3g.40gb.
    fn cluster() -> Vec<GpuNode> {
        let mut d = labelled("gpu-d", &["off"; 8], "dedicated");
        d.taints.push(Pools::default().taint.to_taint());
        let shared = |n: &str, busy: bool| {
            let g = if busy { "3g.40gb@0*,3g.40gb@4" } else { "3g.40gb@0,3g.40gb@4" };
            labelled(n, &[g; 8], "shared")
        };
        vec![d, shared("gpu-s1", true), shared("gpu-s2", false)]
    }

    #[test]
    fn the_second_replica_gets_the_idle_shared_node_dedicated_never_the_busy_one() {
        let nodes = cluster();
        let first = bound(replica("llm-0", 1), "gpu-d");
        let busy = bound(pod("small-0", mig("3g.40gb"), 1, 2), "gpu-s1");
        let pods = vec![first, busy, replica("llm-1", 3)];
        let out = run(&nodes, &pods, &Options::default());
        assert_eq!(out.decisions.len(), 1, "{out:#?}");
        let d = &out.decisions[0];
        assert_eq!(
            (d.node.as_str(), d.kind.clone(), d.pods.clone()),
            ("gpu-s2", Kind::Dedicate, vec!["serving/llm-1".to_string()])
        );
        // The dedicated node still has four free GPUs, but the anti-affinity keeps llm-1 off it.
        assert!(out.not_served.is_empty(), "{:?}", out.not_served);
        // Without the anti-affinity the scheduler would put it beside llm-0: nothing to do.
        let plain = |mut p: GpuPod| {
            p.constraints.terms = Default::default();
            p
        };
        let out =
            run(&nodes, &[plain(pods[0].clone()), pods[1].clone(), plain(replica("llm-1", 3))], &Options::default());
        assert!(out.decisions.is_empty() && out.not_served.is_empty(), "{out:#?}");
    }

    #[test]
    fn two_waiting_replicas_never_share_a_node_the_controller_dedicates() {
        let nodes = cluster();
        let pods =
            vec![replica("llm-0", 1), replica("llm-1", 2), replica("llm-2", 3), bound(replica("llm-x", 0), "gpu-s1")];
        let out = run(&nodes, &pods, &Options { max_concurrent_nodes: 3, ..Options::default() });
        // gpu-d takes one (the scheduler's first pick), gpu-s2 gets dedicated for one more, the
        // third waits: gpu-s1 holds llm-x (and is busy).
        let dedicated: Vec<(&str, &[String])> =
            out.decisions.iter().map(|d| (d.node.as_str(), d.pods.as_slice())).collect();
        assert_eq!(dedicated.len(), 1, "{out:#?}");
        assert_eq!(dedicated[0].0, "gpu-s2");
        assert_eq!(dedicated[0].1.len(), 1, "two replicas on one node would break their anti-affinity");
        assert_eq!(out.not_served.len(), 1, "{out:#?}");
    }

    #[test]
    fn a_pod_that_only_a_dedicated_node_satisfies_is_not_told_it_is_blocked_everywhere() {
        let nodes = cluster()[1..].to_vec();
        let busy = |n: &str, i| bound(pod(&format!("small-{i}"), mig("3g.40gb"), 1, 2), n);
        let pods = vec![busy("gpu-s1", 0), busy("gpu-s2", 1), replica("llm-0", 3)];
        let out = run(&nodes, &pods, &Options::default());
        assert!(out.decisions.is_empty(), "{out:#?}");
        let why = &out.not_served[0];
        assert_eq!(why.kind, "pods-in-the-way", "{why:?}");
        // A selector no node can ever satisfy is another matter.
        let mut lost = replica("llm-0", 3);
        lost.constraints.node_selector.insert("nvidia.com/gpu.product".into(), "NVIDIA-H200".into());
        let out = run(&nodes, &[pods[0].clone(), pods[1].clone(), lost], &Options::default());
        assert_eq!(out.not_served[0].kind, "blocked", "{:?}", out.not_served);
    }

    #[test]
    fn a_node_the_controller_returns_is_judged_as_it_will_be_once_returned() {
        // gpu-d was a shared node the controller dedicated; a small pod of the shared pool waits.
        let mut nodes = cluster();
        nodes[0].annotations.insert(RECLAIM_LAYOUT.into(), "all-3g.40gb".into());
        nodes[0].annotations.insert(super::super::nodes::RECLAIM_LABELS.into(), r#"{"gpu-pool":"shared"}"#.into());
        let mut small = pod("small-9", mig("3g.40gb"), 1, 5);
        small.constraints.node_selector = BTreeMap::from([(POOL_LABEL.to_string(), "shared".to_string())]);
        let only_d = vec![nodes[0].clone()];
        let out = run(&only_d, &[small.clone()], &Options::default());
        assert_ne!(out.not_served[0].kind, "blocked", "it lands there once returned: {:?}", out.not_served);
        // A node dedicated by hand is never returned: there the pod is blocked.
        let mut by_hand = nodes[0].clone();
        by_hand.annotations.clear();
        let out = run(&[by_hand], &[small], &Options::default());
        assert_eq!(out.not_served[0].kind, "blocked", "{:?}", out.not_served);
    }

    #[test]
    fn pool_names_come_from_the_options() {
        let pools = Pools::new("tier", "small", "large", "tier-large=yes:NoSchedule").unwrap();
        let mut nodes = cluster();
        for n in &mut nodes {
            let pool = n.labels.remove(POOL_LABEL).unwrap();
            n.labels.insert("tier".into(), if pool == "dedicated" { "large".into() } else { "small".into() });
            n.taints.clear();
        }
        nodes[0].taints.push(pools.taint.to_taint());
        let mut r = replica("llm-1", 3);
        r.constraints.node_selector = BTreeMap::from([("tier".to_string(), "large".to_string())]);
        r.constraints.tolerations =
            serde_json::from_value(serde_json::json!([{"key": "tier-large", "operator": "Exists"}])).unwrap();
        let mut first = r.clone();
        first.key = "serving/llm-0".into();
        let pods = vec![bound(first, "gpu-d"), bound(pod("small-0", mig("3g.40gb"), 1, 2), "gpu-s1"), r];
        let opts = Options { pools, ..Options::default() };
        let out = run(&nodes, &pods, &opts);
        assert_eq!(out.decisions.iter().map(|d| d.node.as_str()).collect::<Vec<_>>(), ["gpu-s2"], "{out:#?}");
    }
}

/// `--defrag` in label mode: the node whose movable pods all fit elsewhere is reserved for the
/// tensor-parallel pod, and once reserved its pods are moved.
mod defrag {
    use super::*;
    use crate::defrag::movable::{MoveRules, Owner};

    fn movable(mut p: GpuPod, owner: &str) -> GpuPod {
        p.owner = Some(Owner { kind: "ReplicaSet".into(), name: owner.into() });
        p.movable = Some("true".into());
        p
    }

    fn cluster() -> (Vec<GpuNode>, Vec<GpuPod>) {
        let nodes = vec![
            node("gpu-a", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0*,3g.40gb@4"]),
            node("gpu-b", &["3g.40gb@0*,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]),
        ];
        let mut tp = pod("tp2", Resource::Gpu, 2, 5);
        tp.dedicated = true;
        let pods = vec![
            movable(bound(pod("a1", mig("3g.40gb"), 1, 1), "gpu-a"), "a"),
            movable(bound(pod("a2", mig("3g.40gb"), 1, 1), "gpu-a"), "a"),
            movable(bound(pod("a3", mig("3g.40gb"), 1, 1), "gpu-a"), "a"),
            bound(pod("b1", mig("3g.40gb"), 1, 1), "gpu-b"),
            tp,
        ];
        (nodes, pods)
    }

    fn opts() -> Options {
        Options { defrag: Some(MoveRules { min_age_secs: 0, ..MoveRules::default() }), ..Options::default() }
    }

    #[test]
    fn the_node_whose_pods_can_all_move_is_reserved_and_then_emptied() {
        let (nodes, mut pods) = cluster();
        // b1 did not opt in: gpu-b cannot be emptied; gpu-a's three replicas fit in gpu-b's three free 3g.
        let out = run(&nodes, &pods, &opts());
        let d = &out.decisions[0];
        assert_eq!((d.node.as_str(), d.kind.clone()), ("gpu-a", Kind::Reserve), "{out:#?}");
        assert!(d.change.contains("moving its 3 pod(s) (serving/a1 to node gpu-b"), "{}", d.change);
        // b1 opts in: one move is cheaper than three.
        pods[3] = movable(pods[3].clone(), "b");
        let out = run(&nodes, &pods, &opts());
        assert_eq!(out.decisions[0].node, "gpu-b", "{out:#?}");
        assert!(out.decisions[0].change.contains("serving/b1 to node gpu-a"));
        // b1 belongs to the waiting pod's own workload: it stays, gpu-a is emptied instead.
        let mut own = pods.clone();
        own[4].owner = Some(Owner { kind: "ReplicaSet".into(), name: "b".into() });
        assert_eq!(run(&nodes, &own, &opts()).decisions[0].node, "gpu-a");
        // Reserved: the moves that empty it come out of the batch, nothing else changes.
        let mut reserved = nodes[1].clone();
        reserved.labels.insert(POOL_LABEL.into(), "dedicated".into());
        reserved.annotations.insert(RECLAIM_LAYOUT.into(), "all-3g.40gb".into());
        let two = vec![nodes[0].clone(), reserved];
        let out = run(&two, &pods, &opts());
        assert!(out.decisions.is_empty(), "{out:#?}");
        assert_eq!(out.drains.len(), 1);
        assert_eq!(out.drains[0].for_pod, "serving/tp2");
        assert_eq!(out.drains[0].moves, Ok(vec![("serving/b1".to_string(), "gpu-a".to_string())]));
        // Its pod cannot move any more (gpu-a full): the drain says why; nothing is moved.
        let mut full = pods.clone();
        full.push(bound(pod("a4", mig("3g.40gb"), 1, 1), "gpu-a"));
        let out = run(&two, &full, &opts());
        let why = out.drains[0].moves.clone().expect_err("nowhere to go");
        assert!(why.contains("serving/b1 has nowhere to go"), "{why}");
    }

    #[test]
    fn without_a_node_that_can_be_emptied_nothing_is_reserved() {
        let (nodes, mut pods) = cluster();
        for p in pods.iter_mut().take(3) {
            p.movable = Some("false".into());
        }
        let out = run(&nodes, &pods, &opts());
        assert!(out.decisions.is_empty(), "{out:#?}");
        assert!(out.drains.is_empty());
        // A GPU in use by something else than a pod keeps its node from being emptied: gpu-b's
        // younger pod would be the cheaper move, but its second busy instance has no pod.
        let (_, pods) = cluster();
        let nodes = vec![
            node("gpu-a", &["3g.40gb@0*,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]),
            node("gpu-b", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0,3g.40gb@4"]),
        ];
        let mut b1 = movable(bound(pod("b1", mig("3g.40gb"), 1, 9), "gpu-b"), "b");
        b1.created = Some(9);
        let pods = vec![pods[0].clone(), b1, pods[4].clone()];
        let out = run(&nodes, &pods, &opts());
        assert_eq!(out.decisions[0].node, "gpu-a", "{out:#?}");
        let mut idle_b = nodes.clone();
        idle_b[1] = node("gpu-b", &["3g.40gb@0*,3g.40gb@4", "3g.40gb@0,3g.40gb@4"]);
        assert_eq!(run(&idle_b, &pods, &opts()).decisions[0].node, "gpu-b", "the younger pod moves when it can");
    }
}

/// `--defrag` in label mode for a MIG pod: the GPU whose busy instances are all held by movable
/// pods that fit elsewhere is re-cut for it, in one decision that also names the moves; while the
/// room is being made, its node is left alone and its pod is not planned for again.
mod defrag_gpu_room {
    use super::*;
    use crate::defrag::gpu_room::{RoomNote, ROOM_ANNOTATION};
    use crate::defrag::movable::{MoveRules, Owner};

    fn raw(name: &str, items: &[&str]) -> GpuNode {
        let items: Vec<String> =
            items.iter().map(|i| i.replacen('{', &format!(r#"{{"model":"{A100}","mode":"mig","#), 1)).collect();
        let text = format!("[{}]", items.join(","));
        let n = super::super::nodes::tests::node(
            name,
            &text,
            &[(LAYOUT_LABEL, "all-1g.10gb"), (STATE_LABEL, "success")],
            false,
        );
        let mut n = GpuNode::read(&n).unwrap().unwrap();
        n.annotations.insert(STATE_LAYOUT.into(), "all-1g.10gb".into());
        n
    }

    fn ones(busy: &[u32]) -> String {
        let l: Vec<String> =
            (0..7).map(|k| format!(r#""1g.10gb@{k}{}""#, if busy.contains(&k) { "*" } else { "" })).collect();
        l.join(",")
    }

    fn cluster() -> (Vec<GpuNode>, Vec<GpuPod>) {
        let a0 = format!(
            r#"{{"i":0,"layout":[{}],"pods":{{"1g.10gb@0":["serving/s1"],"1g.10gb@1":["serving/s2"]}}}}"#,
            ones(&[0, 1])
        );
        let b0 = format!(r#"{{"i":0,"layout":[{}],"pods":{{"1g.10gb@0":["serving/b1"]}}}}"#, ones(&[0]));
        // GPU 1 of each node is in use by something no pod holds: never made room on.
        let busy = r#"{"i":1,"layout":["3g.40gb@0*","3g.40gb@4*"]}"#;
        let nodes = vec![raw("gpu-a", &[&a0, busy]), raw("gpu-b", &[&b0, busy])];
        let movable = |name: &str| {
            let mut p = bound(pod(name, mig("1g.10gb"), 1, 1), "gpu-a");
            p.owner = Some(Owner { kind: "ReplicaSet".into(), name: "small".into() });
            p.movable = Some("true".into());
            p
        };
        let pods = vec![
            movable("s1"),
            movable("s2"),
            bound(pod("b1", mig("1g.10gb"), 1, 1), "gpu-b"),
            pod("big", mig("7g.80gb"), 1, 5),
        ];
        (nodes, pods)
    }

    fn opts() -> Options {
        Options {
            defrag: Some(MoveRules { min_age_secs: 0, ..MoveRules::default() }),
            room_secs: 300,
            ..Options::default()
        }
    }

    #[test]
    fn the_gpu_whose_pods_can_move_is_re_cut_for_the_waiting_pod_and_then_left_alone() {
        let (nodes, pods) = cluster();
        // Without --defrag: nothing serves it.
        let out = run(&nodes, &pods, &Options::default());
        assert!(out.decisions.is_empty() && out.drains.is_empty(), "{out:#?}");
        let out = run(&nodes, &pods, &opts());
        assert_eq!(out.decisions.len(), 1, "{out:#?}");
        let d = &out.decisions[0];
        assert_eq!((d.node.as_str(), d.kind.clone()), ("gpu-a", Kind::MakeRoom));
        assert_eq!(d.specs[0], GpuSpec::Mig(vec![("7g.80gb".into(), 1)]));
        assert_eq!(d.specs[1], GpuSpec::Mig(vec![("3g.40gb".into(), 2)]), "the other GPU keeps its setting");
        assert_eq!(d.unblocks(), 0);
        let note = RoomNote { pod: "serving/big".into(), gpu: 0, profile: "7g.80gb".into(), until: 10_300 };
        assert_eq!(d.room.as_ref(), Some(&note));
        assert!(d.change.contains("+1 7g.80gb") && d.change.contains("serving/s1 to node gpu-b"), "{}", d.change);
        assert_eq!(out.drains.len(), 1);
        let moves =
            vec![("serving/s1".to_string(), "gpu-b".to_string()), ("serving/s2".to_string(), "gpu-b".to_string())];
        assert_eq!((out.drains[0].node.as_str(), out.drains[0].moves.clone()), ("gpu-a", Ok(moves)));
        assert_eq!(
            out.not_served.iter().map(|n| (n.key.as_str(), n.kind)).collect::<Vec<_>>(),
            [("serving/big", "reserved")]
        );
        // Being made: the node is left alone, the pod waits for it, nothing is planned again.
        let mut making = nodes.clone();
        making[0].annotations.insert(ROOM_ANNOTATION.into(), serde_json::to_string(&note).unwrap());
        let out = run(&making, &pods, &opts());
        assert!(out.decisions.is_empty() && out.drains.is_empty(), "{out:#?}");
        assert!(
            out.held.iter().any(|(n, why)| n == "gpu-a" && why.contains("making room on GPU 0 for serving/big")),
            "{out:#?}"
        );
        assert!(out.not_served[0].reason.contains("GPU 0 of node gpu-a is being re-cut"), "{out:#?}");
        // A note that does not parse holds its node and says why.
        making[0].annotations.insert(ROOM_ANNOTATION.into(), "{".into());
        let out = run(&making, &pods, &opts());
        assert!(out.held.iter().any(|(n, why)| n == "gpu-a" && why.contains(ROOM_ANNOTATION)), "{out:#?}");
        assert!(out.decisions.is_empty(), "{out:#?}");
        // The pods did not opt in: no room.
        let mut stay = pods.clone();
        stay[0].movable = None;
        let out = run(&nodes, &stay, &opts());
        assert!(out.decisions.is_empty() && out.drains.is_empty(), "{out:#?}");
    }
}

/// The node `--defrag` reserves for a tensor-parallel pod is, among the nodes whose pods may all
/// move, the one a brute force finds cheapest, and every move lands in room that exists.
mod defrag_props {
    use super::*;
    use crate::defrag::movable::{MoveRules, Owner};
    use proptest::prelude::*;

    /// Per node: (pods on it, how many of them opted in, their age).
    fn cluster(shape: &[(usize, usize, i64)]) -> (Vec<GpuNode>, Vec<GpuPod>) {
        let mut nodes = Vec::new();
        let mut pods = Vec::new();
        for (n, &(count, movable, age)) in shape.iter().enumerate() {
            let name = format!("gpu-{n}");
            // Two A100s in 3g.40gb: four instances, the first `count` busy.
            let inst: Vec<String> = (0..4)
                .map(|k| format!("3g.40gb@{}{}", if k % 2 == 0 { 0 } else { 4 }, if k < count { "*" } else { "" }))
                .collect();
            let gpus = [format!("{},{}", inst[0], inst[1]), format!("{},{}", inst[2], inst[3])];
            nodes.push(node(&name, &[gpus[0].as_str(), gpus[1].as_str()]));
            for k in 0..count {
                let mut p = bound(pod(&format!("p{n}-{k}"), mig("3g.40gb"), 1, age + k as i64), &name);
                if k < movable {
                    p.owner = Some(Owner { kind: "ReplicaSet".into(), name: format!("rs-{n}-{k}") });
                    p.movable = Some("true".into());
                }
                pods.push(p);
            }
        }
        let mut tp = pod("tp", Resource::Gpu, 2, 1);
        tp.dedicated = true;
        pods.push(tp);
        (nodes, pods)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn the_reserved_node_is_the_cheapest_that_can_be_emptied(
            shape in proptest::collection::vec((1usize..=4, 0usize..=4, 0i64..100), 2..5)
        ) {
            let shape: Vec<(usize, usize, i64)> = shape.into_iter().map(|(c, m, a)| (c, m.min(c), a)).collect();
            let (nodes, pods) = cluster(&shape);
            let opts = Options { defrag: Some(MoveRules { min_age_secs: 0, ..MoveRules::default() }), ..Options::default() };
            let out = run(&nodes, &pods, &opts);
            // Brute force: a node can be emptied when all its pods opted in and the others' free
            // instances hold them; cost (pods, share, younger first), then the name.
            let free: Vec<usize> = shape.iter().map(|(c, _, _)| 4 - c).collect();
            let total_free: usize = free.iter().sum();
            let best = shape
                .iter()
                .enumerate()
                .filter(|(n, (c, m, _))| m == c && total_free - free[*n] >= *c)
                .map(|(n, (c, _, a))| {
                    let ages: i64 = (0..*c as i64).map(|k| a + k).sum();
                    ((*c, std::cmp::Reverse(ages)), format!("gpu-{n}"))
                })
                .min();
            let reserved: Vec<&super::super::decide::Decision> = out.decisions.iter().filter(|d| d.kind == Kind::Reserve).collect();
            match best {
                None => prop_assert!(reserved.is_empty(), "{out:#?}"),
                Some((_, name)) => {
                    prop_assert_eq!(reserved.len(), 1, "{:#?}", out);
                    prop_assert_eq!(&reserved[0].node, &name);
                    // Every pod there is named with a node that has room for it.
                    let n: usize = name[4..].parse().unwrap();
                    let mut used = vec![0usize; shape.len()];
                    for k in 0..shape[n].0 {
                        let key = format!("serving/p{n}-{k} to node gpu-");
                        let at = reserved[0].change.find(&key);
                        prop_assert!(at.is_some(), "{} misses {key}", reserved[0].change);
                        let rest = &reserved[0].change[at.unwrap() + key.len()..];
                        let to: usize = rest.chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap();
                        prop_assert!(to != n);
                        used[to] += 1;
                        prop_assert!(used[to] <= free[to], "node gpu-{to} holds {} more: {}", used[to], reserved[0].change);
                    }
                }
            }
        }
    }
}

#[test]
fn an_unhealthy_gpu_offers_nothing_is_never_changed_and_the_explanation_says_so() {
    let fence = |mut n: GpuNode, gpu: usize| {
        n.gpus[gpu].unhealthy = Some("XID 79".into());
        n
    };
    // GPU 1 has a free 3g.40gb and room: healthy, the pod would be placed there as it is.
    let healthy = vec![node("gpu-a", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0"])];
    let pods = vec![pod("p", mig("3g.40gb"), 1, 1)];
    assert_eq!(run(&healthy, &pods, &Options::default()).placeable, 1);
    // Fenced, it offers nothing and no layout of it is considered.
    let fenced = vec![fence(healthy[0].clone(), 1)];
    let out = run(&fenced, &pods, &Options::default());
    assert_eq!((out.placeable, out.decisions.len()), (0, 0), "{out:#?}");
    let why = &out.not_served[0].reason;
    assert!(why.ends_with("; unhealthy GPUs offer nothing: gpu-a GPU 1 (XID 79)"), "{why}");
    // A 1g.10gb pod: on the healthy node GPU 1 would be repartitioned; fenced, nothing changes.
    let small = vec![pod("s", mig("1g.10gb"), 1, 1)];
    assert_eq!(run(&healthy, &small, &Options::default()).decisions.len(), 1);
    assert!(run(&fenced, &small, &Options::default()).decisions.is_empty());
    // A tensor-parallel node: the unhealthy GPU does not count, and keeps its setting.
    let idle = vec![fence(node("gpu-b", &["", "", "3g.40gb@0"]), 2)];
    let tp = |n: u32| {
        let mut p = pod("tp", Resource::Gpu, n, 1);
        p.dedicated = true;
        p
    };
    assert!(run(&idle, &[tp(3)], &Options::default()).decisions.is_empty(), "3 GPUs, one unhealthy");
    let out = run(&idle, &[tp(2)], &Options::default());
    assert_eq!(out.decisions.len(), 1, "{out:#?}");
    let d = &out.decisions[0];
    assert_eq!(d.kind, Kind::Dedicate);
    assert_eq!(d.specs[2], GpuSpec::Mig(vec![("3g.40gb".into(), 1)]));
    assert_eq!(d.change, "dedicated: 2 whole GPUs, 0 idle instance(s) torn down");
}

#[test]
fn a_faulty_mig_device_offers_nothing_and_is_never_torn_down() {
    let text = format!(
        r#"[{{"i":0,"model":"{A100}","mode":"mig","layout":["3g.40gb@0","3g.40gb@4"],"unhealthyDevices":{{"3g.40gb@4":"XID 94"}}}}]"#
    );
    let n =
        super::nodes::tests::node("gpu-a", &text, &[(LAYOUT_LABEL, "all-3g.40gb"), (STATE_LABEL, "success")], false);
    let mut n = GpuNode::read(&n).unwrap().unwrap();
    n.annotations.insert(STATE_LAYOUT.into(), "all-3g.40gb".into());
    assert!(n.gpus[0].instances[1].busy && !n.gpus[0].instances[0].busy);
    let two = vec![pod("a", mig("3g.40gb"), 1, 1), pod("b", mig("3g.40gb"), 1, 2)];
    assert_eq!(run(&[n.clone()], &two, &Options::default()).placeable, 1, "only the healthy 3g.40gb");
    let out = run(&[n], &[pod("s", mig("1g.10gb"), 1, 1)], &Options::default());
    let d = &out.decisions[0];
    assert_eq!((d.destroyed, d.change.as_str()), (1, "GPU 0: +1 1g.10gb -1 3g.40gb"), "{out:#?}");
    assert!(matches!(&d.specs[0], GpuSpec::Mig(m) if m.contains(&("3g.40gb".to_string(), 1))));
}

#[test]
fn among_nodes_alike_the_first_is_changed_and_one_that_differs_is_judged_on_its_own() {
    // 40 nodes alike: judged once each batch, the first of them stands for the rest.
    let mut nodes: Vec<GpuNode> = (0..40).map(|i| node(&format!("gpu-{i:02}"), &["3g.40gb@0,3g.40gb@4"])).collect();
    let pods: Vec<GpuPod> = (0..10).map(|i| pod(&format!("s-{i}"), mig("1g.10gb"), 1, i)).collect();
    let out = run(&nodes, &pods, &Options::default());
    let changed: Vec<&str> = out.decisions.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(changed, ["gpu-00", "gpu-01"], "{out:#?}");
    // A node that differs (already at 7 × 1g.10gb, first in name order) is not alike the rest:
    // the scheduler places seven pods there, and the others still get two alike nodes changed.
    nodes.push(node("gpu-!", &["1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,1g.10gb@4,1g.10gb@5,1g.10gb@6"]));
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let pods: Vec<GpuPod> = (0..20).map(|i| pod(&format!("s-{i}"), mig("1g.10gb"), 1, i)).collect();
    let out = run(&nodes, &pods, &Options::default());
    let changed: Vec<&str> = out.decisions.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(changed, ["gpu-00", "gpu-01"], "{out:#?}");
    assert_eq!(out.placeable, 7, "{out:#?}");
}

#[test]
fn nodes_whose_model_lacks_every_waiting_profile_are_never_judged() {
    // Two A100-80GB nodes with room, one A100-40GB node; the pods ask for 1g.5gb, which only the
    // A100-40GB has.
    let nodes = vec![
        node("gpu-80-a", &["3g.40gb@0*,3g.40gb@4"]),
        node("gpu-80-b", &["3g.40gb@0,3g.40gb@4*"]),
        node_of("A100-SXM4-40GB", "gpu-40", &["3g.20gb@0,3g.20gb@4"]),
    ];
    let pods: Vec<GpuPod> = (0..3).map(|i| pod(&format!("tiny-{i}"), mig("1g.5gb"), 1, 100 + i)).collect();
    let idle = BTreeMap::new();
    let mut memo = super::memo::Memo::new();
    let w = World { nodes: &nodes, pods: &pods, config: None, now: 10_000, idle_since: &idle };
    let out = super::decide::decide_with(&w, &Options::default(), &mut memo);
    let changed: Vec<&str> = out.decisions.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(changed, ["gpu-40"], "{:?}", out.decisions);
    // Only the A100-40GB node was judged: the A100-80GB nodes were skipped before any option.
    assert_eq!(memo.misses(), 1);
}

#[test]
fn an_unchanged_node_is_not_judged_again_in_the_next_batch_and_a_changed_one_is() {
    // Nodes differ in which instance is busy, so none stands for another.
    let mut nodes: Vec<GpuNode> = (0..4)
        .map(|k| {
            let gpus: Vec<String> = (0..2)
                .map(|g| {
                    let busy = |j: usize| if (k >> (2 * g + j)) & 1 == 1 { "*" } else { "" };
                    format!("3g.40gb@0{},3g.40gb@4{}", busy(0), busy(1))
                })
                .collect();
            node(&format!("gpu-{k}"), &gpus.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect();
    // More pods wait than all four nodes can serve (each at most 14 1g.10gb).
    let pods: Vec<GpuPod> = (0..60).map(|i| pod(&format!("small-{i}"), mig("1g.10gb"), 1, 100 + i)).collect();
    let idle = BTreeMap::new();
    let opts = Options::default();
    let mut memo = super::memo::Memo::new();
    let world = |nodes: &[GpuNode]| -> String {
        format!(
            "{:?}",
            super::decide::decide(&World { nodes, pods: &pods, config: None, now: 10_000, idle_since: &idle }, &opts)
                .decisions
        )
    };
    let remembered = |nodes: &[GpuNode], memo: &mut super::memo::Memo| -> String {
        let w = World { nodes, pods: &pods, config: None, now: 10_000, idle_since: &idle };
        format!("{:?}", super::decide::decide_with(&w, &opts, memo).decisions)
    };
    assert_eq!(remembered(&nodes, &mut memo), world(&nodes));
    // Two rounds (two slots): the second sees fewer pods waiting than a node can serve anyway,
    // so the four nodes are judged once each.
    assert_eq!((memo.misses(), memo.hits()), (4, 3));
    assert_eq!(remembered(&nodes, &mut memo), world(&nodes));
    assert_eq!((memo.misses(), memo.hits()), (4, 10), "the second batch is all remembered");
    // A process starts on gpu-3's second GPU: gpu-3 is judged again.
    nodes[3] = node("gpu-3", &["3g.40gb@0*,3g.40gb@4*", "3g.40gb@0*,3g.40gb@4"]);
    assert_eq!(remembered(&nodes, &mut memo), world(&nodes));
    assert_eq!(memo.misses(), 5);
    // gpu-3's old state was not used in that batch, so it is forgotten.
    assert_eq!(memo.len(), 4);
}
