//! `gpupart controller --defrag` on nodes driven by the layout label, for a MIG pod: a 7g.80gb pod
//! that no repartition serves, because small pods hold a slice of every GPU, gets the GPU whose
//! two 1g.10gb pods may move re-cut for it. The node patch writes the new layout, a NoSchedule
//! taint and the room's record together; the pods are evicted (one at a time, by their budget);
//! their replacements land on the other node, never back on the GPU; the agent re-cuts it once
//! the pods are gone; the taint is lifted and the waiting pod is bound into the room. Real agents
//! on fake NVML that learn who holds each instance from the kubelet's PodResources API (served by
//! the binding stand-in), the API test server's Eviction API, PodDisruptionBudgets and ReplicaSet
//! stand-in.

mod support;

use serde_json::json;
use support::controller_rig::{NodeSpec, Rig};
use support::rbac::{assert_allowed, controller_role};
use support::scheduler::gpu_pod;

const ROOM: &str = "gpupart.io/defrag-room";

/// Two nodes of one H100 in seven 1g.10gb: gpu-a runs the two replicas of `small` (movable or
/// not), gpu-b a bare pod that is pinned there; no GPU can be re-cut to 7g.80gb as it is.
fn busy(movable: bool) -> Rig {
    let mut b = NodeSpec::new("gpu-b", "all-1g.10gb");
    b.labels = json!({"zone": "b"});
    let mut rig = Rig::start_nodes("H100-SXM5-80GB:1", &[NodeSpec::new("gpu-a", "all-1g.10gb"), b]);
    rig.schedule_with_kubelets();
    rig.replicas("serving", "small", "nvidia.com/mig-1g.10gb", 2, movable, "gpu-a");
    let mut tiny = gpu_pod("serving", "tiny", "nvidia.com/mig-1g.10gb", 1, false);
    tiny["spec"]["nodeSelector"] = json!({"zone": "b"});
    rig.api.put("pods", tiny);
    rig.wait("the pinned pod runs on gpu-b", 30, |r| {
        r.pod("serving", "tiny") == ("Running".into(), Some("gpu-b".into()))
    });
    // The agent names the pods holding gpu-a's instances (from PodResources).
    rig.wait("gpu-a's agent names its pods", 30, |r| {
        let n = r.api.get("nodes", "", "gpu-a").unwrap_or_default();
        let gpus = n["metadata"]["annotations"]["gpupart.io/gpus"].as_str().unwrap_or("").to_string();
        gpus.contains("serving/small-a") && gpus.contains("serving/small-b")
    });
    rig
}

fn taints(rig: &Rig, node: &str) -> Vec<String> {
    let n = rig.api.get("nodes", "", node).unwrap_or_default();
    n["spec"]["taints"].as_array().into_iter().flatten().filter_map(|t| t["key"].as_str().map(str::to_string)).collect()
}

#[test]
fn a_7g_pod_is_served_by_moving_two_1g_pods_off_one_gpu() {
    let rig = busy(true);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s"]);
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.wait("the room is being made on gpu-a", 30, |r| {
        !r.api.get("nodes", "", "gpu-a").unwrap_or_default()["metadata"]["annotations"][ROOM].is_null()
    });
    let n = rig.api.get("nodes", "", "gpu-a").unwrap();
    assert!(taints(&rig, "gpu-a").iter().any(|t| t == ROOM), "the room's taint comes with its record");
    let note: serde_json::Value = serde_json::from_str(n["metadata"]["annotations"][ROOM].as_str().unwrap()).unwrap();
    assert_eq!(
        (note["pod"].as_str(), note["gpu"].as_u64(), note["profile"].as_str()),
        (Some("serving/big"), Some(0), Some("7g.80gb"))
    );
    rig.wait("the 7g.80gb pod runs", 90, |r| r.pod("serving", "big").0 == "Running");
    assert_eq!(rig.pod("serving", "big").1.as_deref(), Some("gpu-a"));
    rig.wait("gpu-a is one busy 7g.80gb", 30, |r| r.layout_of("gpu-a") == vec![vec!["7g.80gb@0*".to_string()]]);
    // Both replicas moved once each, through the Eviction API; their replacements run on gpu-b
    // (never on gpu-a, whose freed instances are gone), beside the pinned pod, which stayed.
    let evicted = rig.evicted("big");
    let names: Vec<&str> = evicted.iter().map(|(on, _)| on.as_str()).collect();
    assert_eq!(names, vec!["small-a", "small-b"], "{evicted:#?}");
    assert!(
        evicted.iter().all(|(_, note)| note.contains("serving/big") && note.contains("node gpu-b")),
        "{evicted:#?}"
    );
    rig.wait("the replacements run on gpu-b", 30, |r| r.replicas_on("small", "gpu-b").len() == 2);
    assert_eq!(rig.replicas_on("small", "gpu-a"), Vec::<String>::new());
    assert_eq!(rig.pod("serving", "tiny"), ("Running".into(), Some("gpu-b".into())));
    let events = rig.api.events();
    assert!(events.iter().any(|(on, r, _)| on == "gpu-a" && r == "MakingRoom"), "{events:#?}");
    // Confirmed; the room's record and taint are gone.
    rig.wait("the plan confirmed", 30, |r| r.log("c1").contains("served: bound into the room"));
    // Events are posted off the decision's path: the Event follows the log line.
    rig.wait("the Defragmented Event", 30, |r| {
        r.api.events().iter().any(|(on, reason, _)| on == "big" && reason == "Defragmented")
    });
    rig.wait("the room's record is released", 30, |r| {
        r.api.get("nodes", "", "gpu-a").unwrap_or_default()["metadata"]["annotations"][ROOM].is_null()
    });
    assert!(!taints(&rig, "gpu-a").iter().any(|t| t == ROOM));
    let metrics = rig.metrics("c1");
    assert!(metrics.contains(r#"gpupart_controller_defrag_plans_total{outcome="served"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"gpupart_controller_defrag_evictions_total{outcome="evicted"} 2"#), "{metrics}");
    assert_allowed(&controller_role(), &rig.api.requests_by("controller"), "the controller");
}

#[test]
fn without_movable_pods_the_7g_pod_waits_and_nothing_changes() {
    let rig = busy(false);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s"]);
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.assert_nothing_moved("serving", "big", &["small-a", "small-b", "tiny"]);
    assert!(!rig.api.events().iter().any(|(_, r, _)| r == "MakingRoom"));
    assert!(taints(&rig, "gpu-a").is_empty());
}

#[test]
fn a_new_leader_takes_the_room_up_and_evicts_only_what_is_left_on_the_gpu() {
    let rig = busy(true);
    let c1 = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s"]);
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.wait("the first replica is evicted", 30, |r| {
        r.api.events().iter().any(|(on, r, _)| on == "small-a" && r == "Defragmenting")
    });
    drop(c1);
    let _c2 = rig.controller("c2", &["--defrag", "--defrag-min-age", "0s"]);
    rig.wait("the 7g.80gb pod runs", 90, |r| r.pod("serving", "big").0 == "Running");
    assert_eq!(rig.pod("serving", "big").1.as_deref(), Some("gpu-a"));
    assert!(rig.log("c2").contains("found a reservation made earlier"), "{}", rig.log("c2"));
    // Each pod evicted once, whichever replica did it; the replacements were never touched.
    let evicted: Vec<String> = rig.evicted("big").into_iter().map(|(on, _)| on).collect();
    assert_eq!(evicted, vec!["small-a", "small-b"]);
    rig.wait("the replacements run on gpu-b", 30, |r| r.replicas_on("small", "gpu-b").len() == 2);
    rig.wait("the room's record is released", 30, |r| {
        r.api.get("nodes", "", "gpu-a").unwrap_or_default()["metadata"]["annotations"][ROOM].is_null()
    });
}

#[test]
fn a_dry_run_says_which_gpu_it_would_re_cut_and_changes_nothing() {
    let rig = busy(true);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s", "--dry-run"]);
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.wait("the plan is told", 30, |r| r.api.events().iter().any(|(on, r, _)| on == "gpu-a" && r == "WillMakeRoom"));
    let note = rig.api.events().into_iter().find(|(on, r, _)| on == "gpu-a" && r == "WillMakeRoom").unwrap().2;
    assert!(note.contains("+1 7g.80gb") && note.contains("serving/small-a to node gpu-b"), "{note}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    for name in ["small-a", "small-b", "tiny"] {
        assert_eq!(rig.pod("serving", name).0, "Running", "{name}");
    }
    assert!(!rig.api.events().iter().any(|(_, r, _)| r == "Defragmenting"));
    assert!(taints(&rig, "gpu-a").is_empty());
    assert_eq!(rig.layouts().matches("7g.80gb").count(), 0, "no layout written");
}

#[test]
fn the_eviction_caps_keep_a_room_from_being_made_when_its_moves_do_not_fit_in_them() {
    let rig = busy(true);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s", "--defrag-max-evictions-per-node", "1"]);
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.wait("the plan is held back by the cap", 30, |r| {
        r.log("c1").contains("no room made for this pod now")
            && r.log("c1").contains("--defrag-max-evictions-per-node 1")
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    // Not half done: no layout, no taint, no eviction.
    assert!(taints(&rig, "gpu-a").is_empty());
    assert!(!rig.api.events().iter().any(|(_, r, _)| r == "MakingRoom" || r == "Defragmenting"));
    for name in ["small-a", "small-b"] {
        assert_eq!(rig.pod("serving", name), ("Running".into(), Some("gpu-a".into())), "{name}");
    }
    assert_eq!(rig.layout_of("gpu-a")[0].len(), 7, "gpu-a keeps its seven 1g.10gb");
}
