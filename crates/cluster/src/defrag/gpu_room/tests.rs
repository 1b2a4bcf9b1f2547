use super::*;
use crate::controller::capacity::{ledger, NodeLedger};
use crate::controller::nodes::GpuNode;
use crate::controller::pods::Standing;
use crate::defrag::movable::Owner;

const A100: &str = "A100-SXM4-80GB";

/// A node from its GPUs' annotation items (`{"i":0,…}` without the model).
fn node(name: &str, items: &[&str]) -> GpuNode {
    let items: Vec<String> =
        items.iter().map(|i| i.replacen('{', &format!(r#"{{"model":"{A100}","mode":"mig","#), 1)).collect();
    let text = format!("[{}]", items.join(","));
    GpuNode::read(&crate::controller::nodes::tests::node(name, &text, &[], false)).unwrap().unwrap()
}

fn pod(name: &str, profile: &str, on: Option<&str>, movable: bool) -> GpuPod {
    let mut p = crate::controller::pods::fixture("ml", name, Resource::Mig(profile.parse().unwrap()), 1, 1);
    if let Some(n) = on {
        p.standing = Standing::Bound { node: n.into() };
    }
    if movable {
        p.owner = Some(Owner { kind: "ReplicaSet".into(), name: format!("rs-{name}") });
        p.movable = Some("true".into());
    }
    p
}

fn room(nodes: &[GpuNode], pods: &[GpuPod], waiting: &GpuPod) -> Option<GpuRoom> {
    let model = crate::mig::catalog::lookup(A100).unwrap();
    let all: Vec<&GpuPod> = pods.iter().collect();
    let ledgers: Vec<NodeLedger> = nodes.iter().map(|n| ledger(n, model, &all, None).0).collect();
    let hosts: Vec<Host> =
        nodes.iter().zip(&ledgers).map(|(node, ledger)| Host { node, ledger, takes_replacements: true }).collect();
    let rules = MoveRules { min_age_secs: 0, ..MoveRules::default() };
    plan(&hosts, &|_| Some(model), pods, waiting, &rules, 100, &Pools::default())
}

fn cluster(free_1g: usize) -> Vec<GpuNode> {
    let free: Vec<String> = (0..free_1g).map(|k| format!(r#""1g.10gb@{k}""#)).collect();
    vec![
        node(
            "gpu-a",
            &[
                r#"{"i":0,"layout":["1g.10gb@0*","1g.10gb@1*"],"pods":{"1g.10gb@0":["ml/a"],"1g.10gb@1":["ml/b"]}}"#,
                r#"{"i":1,"layout":["3g.40gb@0*","3g.40gb@4"],"pods":{"3g.40gb@0":["ml/big"]}}"#,
            ],
        ),
        node(
            "gpu-b",
            &[
                &format!(r#"{{"i":0,"layout":[{}]}}"#, free.join(",")),
                r#"{"i":1,"layout":["3g.40gb@0*"],"pods":{"3g.40gb@0":["ml/c"]}}"#,
            ],
        ),
    ]
}

fn pods(b_movable: bool) -> Vec<GpuPod> {
    vec![
        pod("a", "1g.10gb", Some("gpu-a"), true),
        pod("b", "1g.10gb", Some("gpu-a"), b_movable),
        pod("big", "3g.40gb", Some("gpu-a"), false),
        pod("c", "3g.40gb", Some("gpu-b"), false),
    ]
}

#[test]
fn a_7g_pod_gets_the_gpu_whose_two_1g_pods_move_to_free_instances_elsewhere() {
    let waiting = pod("llm", "7g.80gb", None, false);
    let r = room(&cluster(3), &pods(true), &waiting).expect("a room");
    assert_eq!((r.node.as_str(), r.gpu), ("gpu-a", 0));
    assert_eq!(r.spec, GpuSpec::Mig(vec![("7g.80gb".into(), 1)]));
    assert_eq!(r.moves, vec![("ml/a".to_string(), "gpu-b".to_string()), ("ml/b".to_string(), "gpu-b".to_string())]);
    assert_eq!(r.cost.0, 2);
}

#[test]
fn no_room_when_a_pod_may_not_move_has_nowhere_to_go_or_is_not_named() {
    let waiting = pod("llm", "7g.80gb", None, false);
    assert_eq!(room(&cluster(3), &pods(false), &waiting), None, "b did not opt in");
    assert_eq!(room(&cluster(1), &pods(true), &waiting), None, "one free 1g.10gb for two pods");
    // An instance in use that the agent names no pod for (a process outside Kubernetes).
    let mut nodes = cluster(3);
    nodes[0] = node(
        "gpu-a",
        &[
            r#"{"i":0,"layout":["1g.10gb@0*","1g.10gb@1*"],"pods":{"1g.10gb@0":["ml/a"]}}"#,
            r#"{"i":1,"layout":["3g.40gb@0*","3g.40gb@4"],"pods":{"3g.40gb@0":["ml/big"]}}"#,
        ],
    );
    assert_eq!(room(&nodes, &pods(true), &waiting), None);
    // A smaller profile on the same GPU: the setting that destroys the fewest instances.
    let four = pod("mid", "4g.40gb", None, false);
    let r = room(&cluster(3), &pods(true), &four).expect("a room");
    assert_eq!((r.node.as_str(), r.gpu), ("gpu-a", 0));
    assert!(matches!(&r.spec, GpuSpec::Mig(d) if d.iter().any(|(p, n)| p == "4g.40gb" && *n == 1)), "{:?}", r.spec);
}
