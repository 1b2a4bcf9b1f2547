//! `gpupart controller --defrag` on nodes driven by the layout label: a tensor-parallel pod that
//! no idle node serves, because a small pod keeps every node busy, gets a node emptied by moving
//! its pods (the node reserved first: tainted, so their replacements land elsewhere), then
//! dedicated. Real agents on fake NVML, the binding stand-in, the API test server's Eviction API,
//! PodDisruptionBudgets and ReplicaSet stand-in.

mod support;

use support::controller_rig::{NodeSpec, Rig};
use support::rbac::{assert_allowed, controller_role};
use support::scheduler::gpu_pod;

/// Two nodes of eight H100s: gpu-a in 3g.40gb runs two 3g.40gb replicas of `serve` (movable or
/// not, at most one unavailable by their budget), gpu-b in a mix of 3g.40gb and 1g.10gb runs a
/// small bare 1g.10gb pod; no node is idle.
fn busy(movable: bool) -> Rig {
    let mut rig =
        Rig::start_nodes("H100-SXM5-80GB:8", &[NodeSpec::new("gpu-a", "all-3g.40gb"), NodeSpec::new("gpu-b", "mixed")]);
    rig.schedule();
    rig.api.put("pods", gpu_pod("serving", "tiny", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("the 1g.10gb pod runs on gpu-b", 30, |r| {
        r.pod("serving", "tiny") == ("Running".into(), Some("gpu-b".into()))
    });
    rig.replicas("serving", "serve", "nvidia.com/mig-3g.40gb", 2, movable, "gpu-a");
    rig
}

#[test]
fn a_tp8_pod_is_served_by_moving_the_two_small_pods_that_kept_a_node_busy() {
    let rig = busy(true);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s"]);
    rig.api.put("pods", gpu_pod("training", "tp8", "nvidia.com/gpu", 8, true));
    rig.wait("the TP pod runs", 90, |r| r.pod("training", "tp8").0 == "Running");
    assert_eq!(rig.pod("training", "tp8").1.as_deref(), Some("gpu-a"));
    // Both replicas moved, once each, through the Eviction API; their replacements run on gpu-b,
    // beside the bare pod, which stayed.
    let evicted = rig.evicted("tp8");
    let names: Vec<&str> = evicted.iter().map(|(on, _)| on.as_str()).collect();
    assert_eq!(names, vec!["serve-a", "serve-b"], "{evicted:#?}");
    assert!(evicted.iter().all(|(_, note)| note.contains("training/tp8") && note.contains("gpu-b")), "{evicted:#?}");
    rig.wait("the replacements run", 30, |r| r.replicas_on("serve", "gpu-b").len() == 2);
    assert_eq!(rig.replicas_on("serve", "gpu-a").len(), 0);
    assert_eq!(rig.pod("serving", "tiny"), ("Running".into(), Some("gpu-b".into())));
    let events = rig.api.events();
    assert!(events.iter().any(|(on, r, _)| on == "gpu-a" && r == "Reserving"), "{events:#?}");
    assert!(events.iter().any(|(on, r, _)| on == "gpu-a" && r == "Dedicating"), "{events:#?}");
    rig.wait("the plan confirmed", 30, |r| r.log("c1").contains("served: bound into the room"));
    // Events are posted off the decision's path: the Event follows the log line.
    rig.wait("the Defragmented Event", 30, |r| {
        r.api.events().iter().any(|(on, reason, _)| on == "tp8" && reason == "Defragmented")
    });
    assert_allowed(&controller_role(), &rig.api.requests_by("controller"), "the controller");
}

#[test]
fn without_movable_pods_the_tp8_pod_waits_and_nothing_is_evicted() {
    let rig = busy(false);
    let _c = rig.controller("c1", &["--defrag", "--defrag-min-age", "0s"]);
    rig.api.put("pods", gpu_pod("training", "tp8", "nvidia.com/gpu", 8, true));
    rig.assert_nothing_moved("training", "tp8", &[]);
    for name in ["serve-a", "serve-b", "tiny"] {
        assert_eq!(rig.pod("serving", name).0, "Running", "{name}");
    }
    assert!(!rig.api.events().iter().any(|(_, r, _)| r == "Reserving"));
}
