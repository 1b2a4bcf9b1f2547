//! The pools as users write them, end to end: shared nodes labelled `gpu-pool=shared` in
//! `all-1g.10gb`, a dedicated node labelled `gpu-pool=dedicated` and tainted
//! `gpu-dedicated=true:NoSchedule`; small pods selecting the shared pool; the large model's
//! replicas selecting the dedicated pool and the GPU product, tolerating the taint and keeping
//! off each other's nodes by a required anti-affinity on the hostname. The real controller and
//! agents on fake NVML, the binding stand-in filtering as kube-scheduler does.

mod support;

use serde_json::{json, Value};
use support::controller_rig::{NodeSpec, Rig, LAYOUT};
use support::scheduler::gpu_pod;

const PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";

fn node(name: &str, pool: &str, layout: &str) -> NodeSpec {
    let mut n = NodeSpec::new(name, layout);
    n.labels = json!({"gpu-pool": pool, "kubernetes.io/hostname": name, "nvidia.com/gpu.product": PRODUCT});
    if pool == "dedicated" {
        n.taints = json!([{"key": "gpu-dedicated", "value": "true", "effect": "NoSchedule"}]);
    }
    n
}

/// A small inference pod of the shared pool.
fn small(name: &str, extra_selector: Value) -> Value {
    let mut p = gpu_pod("serving", name, "nvidia.com/mig-1g.10gb", 1, false);
    let mut selector = json!({"gpu-pool": "shared"});
    for (k, v) in extra_selector.as_object().into_iter().flatten() {
        selector[k] = v.clone();
    }
    p["metadata"]["labels"] = json!({"app": "small-model"});
    p["spec"]["nodeSelector"] = selector;
    p
}

/// A replica of the large model's Deployment (two whole GPUs).
fn replica(name: &str) -> Value {
    let mut p = gpu_pod("serving", name, "nvidia.com/gpu", 2, true);
    p["metadata"]["labels"] = json!({"app": "llm-70b", "gpu-pool": "dedicated"});
    p["spec"]["nodeSelector"] = json!({"gpu-pool": "dedicated", "nvidia.com/gpu.product": PRODUCT});
    p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchExpressions": [{"key": "gpu-pool", "operator": "In", "values": ["dedicated"]}]},
        "topologyKey": "kubernetes.io/hostname"}]}});
    p
}

#[test]
fn the_pools_as_written_a_second_replica_gets_the_idle_shared_node_which_returns_as_it_was() {
    let mut rig = Rig::start_nodes(
        "A100-SXM4-80GB:2",
        &[
            node("gpu-d", "dedicated", "all-disabled"),
            node("gpu-s1", "shared", "all-1g.10gb"),
            node("gpu-s2", "shared", "all-1g.10gb"),
        ],
    );
    rig.schedule();
    // The small pods run on the shared pool (the stand-in takes the first node that fits: gpu-s1).
    for i in 0..3 {
        rig.api.put("pods", small(&format!("small-{i}"), json!({})));
    }
    rig.wait("the small pods run", 30, |r| (0..3).all(|i| r.pod("serving", &format!("small-{i}")).0 == "Running"));
    for i in 0..3 {
        assert_eq!(rig.pod("serving", &format!("small-{i}")).1.as_deref(), Some("gpu-s1"));
    }
    rig.wait("the agent sees them busy", 30, |r| r.layout_of("gpu-s1").iter().flatten().any(|i| i.ends_with('*')));
    // The first replica runs on the dedicated node.
    rig.api.put("pods", replica("llm-0"));
    rig.wait("llm-0 runs", 30, |r| r.pod("serving", "llm-0").0 == "Running");
    assert_eq!(rig.pod("serving", "llm-0").1.as_deref(), Some("gpu-d"));
    // The second cannot go there (anti-affinity) nor to a shared node (selector, taint): waiting.
    rig.api.put("pods", replica("llm-1"));
    rig.wait("llm-1 is unschedulable", 30, |r| {
        r.api.get("pods", "serving", "llm-1").is_some_and(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["reason"] == "Unschedulable"))
        })
    });
    let message = rig.api.get("pods", "serving", "llm-1").unwrap()["status"]["conditions"][0]["message"].clone();
    assert!(message.as_str().unwrap().contains("anti-affinity"), "{message}");
    let _c = rig.controller("c1", &["--reclaim-after", "2s"]);
    rig.wait("llm-1 runs", 90, |r| r.pod("serving", "llm-1").0 == "Running");
    assert_eq!(rig.pod("serving", "llm-1").1.as_deref(), Some("gpu-s2"), "the idle shared node, never the busy one");
    let s2 = rig.api.get("nodes", "", "gpu-s2").unwrap();
    assert_eq!(s2["metadata"]["labels"]["gpu-pool"], "dedicated");
    assert!(s2["spec"]["taints"].as_array().unwrap().iter().any(|t| t["key"] == "gpu-dedicated"));
    assert_eq!(s2["metadata"]["annotations"]["gpupart.io/reclaim-labels"], r#"{"gpu-pool":"shared"}"#);
    assert_eq!(rig.api.node_label("gpu-s1", LAYOUT).as_deref(), Some("all-1g.10gb"), "the busy node stays");
    assert_eq!(rig.pod("serving", "small-0").1.as_deref(), Some("gpu-s1"));
    // The replica ends: the node returns as it was, and shared-pool pods land on it again.
    rig.api.delete("pods", "serving", "llm-1");
    rig.wait("gpu-s2 is back in all-1g.10gb", 90, |r| r.settled("gpu-s2", "all-1g.10gb"));
    let s2 = rig.api.get("nodes", "", "gpu-s2").unwrap();
    assert_eq!(s2["metadata"]["labels"]["gpu-pool"], "shared", "{s2}");
    assert!(s2["spec"]["taints"].as_array().is_none_or(|t| t.is_empty()), "{s2}");
    assert!(s2["metadata"]["annotations"]["gpupart.io/reclaim-labels"].is_null(), "{s2}");
    rig.api.put("pods", small("small-on-s2", json!({"kubernetes.io/hostname": "gpu-s2"})));
    rig.wait("a shared-pool pod runs on gpu-s2", 30, |r| r.pod("serving", "small-on-s2").0 == "Running");
    assert_eq!(rig.pod("serving", "small-on-s2").1.as_deref(), Some("gpu-s2"));
    // The dedicated node was never changed.
    let d = rig.api.get("nodes", "", "gpu-d").unwrap();
    assert_eq!(d["metadata"]["labels"]["gpu-pool"], "dedicated");
    assert_eq!(d["metadata"]["labels"][LAYOUT], "all-disabled");
}

#[test]
fn gpupart_plan_labels_and_taints_nodes_as_these_pods_select_and_the_controller_defaults() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plan.yaml");
    let doc: Value =
        serde_json::from_str(&support::gpupart(&["plan", "-f", file, "-o", "json"], &[]).ok().stdout).unwrap();
    let nodes = doc["nodes"].as_array().unwrap();
    let selects = |pod: &Value, labels: &Value| {
        pod["spec"]["nodeSelector"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.as_str() != "nvidia.com/gpu.product") // GPU feature discovery's label
            .all(|(k, v)| labels[k] == *v)
    };
    let tolerated = |pod: &Value, taint: &str| {
        pod["spec"]["tolerations"].as_array().into_iter().flatten().any(|t| {
            let written = format!(
                "{}={}:{}",
                t["key"].as_str().unwrap(),
                t["value"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            );
            written == taint
        })
    };
    let (large, small) = (replica("llm-0"), small("small-0", json!({})));
    let mut seen = (0, 0);
    for n in nodes {
        let taints: Vec<&str> = n["taints"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        match n["pool"].as_str().unwrap() {
            "dedicated" => {
                assert!(selects(&large, &n["labels"]) && taints.iter().all(|t| tolerated(&large, t)), "{n}");
                assert!(!selects(&small, &n["labels"]), "{n}");
                seen.0 += 1;
            }
            "shared" => {
                assert!(selects(&small, &n["labels"]) && taints.is_empty(), "{n}");
                assert!(!selects(&large, &n["labels"]), "{n}");
                seen.1 += 1;
            }
            _ => {}
        }
    }
    assert!(seen.0 > 0 && seen.1 > 0, "{seen:?}");
    // The controller's defaults name the same label, values and taint.
    let help = support::gpupart(&["controller", "--help"], &[]).ok().stdout;
    for default in
        ["[default: gpu-pool]", "[default: shared]", "[default: dedicated]", "[default: gpu-dedicated=true:NoSchedule]"]
    {
        assert!(help.contains(default), "{default} missing:\n{help}");
    }
}

#[test]
fn bad_pool_flags_are_refused_naming_the_flag() {
    for (flag, value, says) in [
        ("--pool-label", "gpu pool", "--pool-label 'gpu pool'"),
        ("--dedicated-pool", "shared", "must differ from --shared-pool"),
        ("--dedicated-taint", "gpu-dedicated=true", "taint 'gpu-dedicated=true'"),
    ] {
        let out = support::gpupart(&["controller", flag, value], &[("KUBECONFIG", "/nonexistent")]);
        assert!(out.code != 0 && out.stderr.contains(says), "{flag} {value}: {}", out.stderr);
    }
}
