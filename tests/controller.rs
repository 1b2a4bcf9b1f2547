//! `gpupart controller` end to end: the real controller and one real agent per simulated node
//! (fake NVML) against the API test server, with the binding stand-in playing the scheduler.

mod support;

use support::controller_rig::{Rig, LAYOUT, LAYOUTS};
use support::rbac::{assert_allowed, controller_role, Permissions};
use support::scheduler::gpu_pod;

/// Three nodes of two A100s in `all-3g.40gb`; the stand-in fills all but one 3g.40gb instance.
fn busy_cluster() -> Rig {
    let mut rig = Rig::start("A100-SXM4-80GB:2", &["gpu-a", "gpu-b", "gpu-c"], "all-3g.40gb");
    rig.schedule();
    for i in 0..11 {
        rig.api.put("pods", gpu_pod("serving", &format!("llm-{i}"), "nvidia.com/mig-3g.40gb", 1, false));
    }
    rig.wait("the 3g.40gb pods run", 30, |r| (0..11).all(|i| r.pod("serving", &format!("llm-{i}")).0 == "Running"));
    rig.wait("the agents see them busy", 30, |r| {
        let busy: usize = ["gpu-a", "gpu-b", "gpu-c"]
            .iter()
            .map(|n| r.layout_of(n).iter().flatten().filter(|i| i.ends_with('*')).count())
            .sum();
        busy == 11
    });
    rig
}

/// A series' value in a classic-text scrape.
fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn instances(rig: &Rig) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for n in ["gpu-a", "gpu-b", "gpu-c"] {
        for (g, l) in rig.layout_of(n).into_iter().enumerate() {
            out.extend(l.into_iter().map(|i| (n.to_string(), g, i)));
        }
    }
    out
}

#[test]
fn pending_small_pods_get_partitions_with_the_fewest_changes_and_no_busy_instance_touched() {
    let rig = busy_cluster();
    let before = instances(&rig);
    let _c = rig.controller("c1", &[]);
    for i in 0..3 {
        rig.api.put("pods", gpu_pod("serving", &format!("small-{i}"), "nvidia.com/mig-1g.10gb", 1, false));
    }
    // A 4g.40gb fits no GPU without evicting: the pod is told why, naming pods in the way.
    rig.api.put("pods", gpu_pod("serving", "big", "nvidia.com/mig-4g.40gb", 1, false));
    rig.wait("the 4g.40gb pod is told why", 30, |r| {
        r.api.events().iter().any(|(n, reason, note)| {
            n == "big"
                && reason == "NotServed"
                && note.starts_with("needs 4g.40gb; no idle GPU can host it without evicting serving/llm-")
        })
    });
    // Told once: batches that follow (every 300 ms here) do not repeat the Event while the kind
    // of reason stays, even as the pods in the way change.
    rig.wait("the 1g.10gb pods run", 60, |r| (0..3).all(|i| r.pod("serving", &format!("small-{i}")).0 == "Running"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let told = rig.api.events().iter().filter(|(n, reason, _)| n == "big" && reason == "NotServed").count();
    assert_eq!(told, 1, "one NotServed Event per kind of reason");
    rig.api.delete("pods", "serving", "big");
    rig.wait("the 1g.10gb pods run", 60, |r| (0..3).all(|i| r.pod("serving", &format!("small-{i}")).0 == "Running"));
    let after = instances(&rig);
    let busy_before: Vec<String> =
        before.iter().filter(|(_, _, i)| i.ends_with('*')).map(|(n, g, i)| format!("{n}/{g}/{i}")).collect();
    for b in &busy_before {
        assert!(after.iter().any(|(n, g, i)| format!("{n}/{g}/{i}") == *b), "busy instance {b} is gone: {after:?}");
    }
    let destroyed: Vec<_> = before
        .iter()
        .filter(|(n, g, i)| {
            !after.iter().any(|(n2, g2, i2)| n2 == n && g2 == g && i2.trim_end_matches('*') == i.trim_end_matches('*'))
        })
        .collect();
    assert_eq!(destroyed.len(), 1, "exactly the one idle 3g.40gb goes: {destroyed:?}");
    let changed = destroyed[0].0.clone();
    let label = rig.api.node_label(&changed, LAYOUT).unwrap();
    assert!(label.starts_with("gpupart-auto-"), "{label}");
    assert!(rig.layouts().contains(&label) && rig.layouts().contains("all-3g.40gb"), "{}", rig.layouts());
    let notes: Vec<String> =
        rig.api.events().into_iter().filter(|(n, r, _)| n == "small-0" && r == "Repartitioning").map(|e| e.2).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("repartitioning node {changed}: GPU")) && n.contains("+3 1g.10gb -1 3g.40gb")),
        "{notes:?}"
    );
    // Only the changed node got a new layout.
    for n in ["gpu-a", "gpu-b", "gpu-c"].iter().filter(|n| **n != changed) {
        assert_eq!(rig.api.node_label(n, LAYOUT).as_deref(), Some("all-3g.40gb"));
    }
    // The controller's metrics say what it did, and time it from Pending to applied.
    rig.wait("the metrics settle", 30, |r| {
        let m = r.metrics("c1");
        value(&m, "gpupart_controller_pending_to_applied_seconds_count") == Some(3.0)
            && !m.contains("gpupart_controller_pending_gpu_pods{")
    });
    let m = rig.metrics("c1");
    support::promtool(&m);
    for (series, want) in [
        ("gpupart_controller_decisions_total{kind=\"repartition\",mode=\"applied\"}", 1.0),
        ("gpupart_controller_decisions_total{kind=\"dedicate\",mode=\"applied\"}", 0.0),
        ("gpupart_controller_pods_unblocked_total", 3.0),
        ("gpupart_controller_unserved_gpu_pods", 0.0),
        ("gpupart_controller_leader", 1.0),
        ("gpupart_controller_paused", 0.0),
    ] {
        assert_eq!(value(&m, series), Some(want), "{series} in\n{m}");
    }
    assert!(m.contains("gpupart_controller_cluster_fragmentation_ratio "), "{m}");
}

#[test]
fn dry_run_reports_what_it_would_do_and_changes_nothing() {
    let rig = busy_cluster();
    let _c = rig.controller("c1", &["--dry-run"]);
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("a dry-run Event", 30, |r| {
        r.api.events().iter().any(|(n, reason, _)| n == "small-0" && reason == "WillRepartition")
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (_, _, note) = rig.api.events().into_iter().find(|(n, r, _)| n == "small-0" && r == "WillRepartition").unwrap();
    assert!(note.starts_with("will repartition node gpu-") && note.contains("+1 1g.10gb -1 3g.40gb"), "{note}");
    for n in ["gpu-a", "gpu-b", "gpu-c"] {
        assert_eq!(rig.api.node_label(n, LAYOUT).as_deref(), Some("all-3g.40gb"));
    }
    assert_eq!(rig.layouts(), support::controller_rig::CONFIG);
    assert!(
        rig.api
            .writes_by("gpupart-controller")
            .iter()
            .all(|(m, p)| m == "POST" && (p.contains("/events") || p.contains("/leases"))
                || (m == "PUT" && p.contains("/leases/"))),
        "{:?}",
        rig.api.writes_by("gpupart-controller")
    );
    assert_eq!(rig.pod("serving", "small-0").0, "Pending");
    // Batch after batch decides the same, and it is told once.
    let batches = |r: &Rig| value(&r.metrics("c1"), "gpupart_controller_batches_total").unwrap_or(0.0);
    let after = batches(&rig);
    rig.wait("three more batches", 60, |r| batches(r) >= after + 3.0);
    let told: Vec<(String, String, String)> =
        rig.api.events().into_iter().filter(|(_, r, _)| r == "WillRepartition").collect();
    assert_eq!(told.iter().filter(|(n, _, _)| n == "small-0").count(), 1, "{told:?}");
    assert_eq!(told.iter().filter(|(n, _, _)| n.starts_with("gpu-")).count(), 1, "{told:?}");
}

#[test]
fn a_tensor_parallel_pod_gets_an_idle_node_dedicated_which_returns_after_the_reclaim_time() {
    let mut rig = Rig::start("H100-SXM5-80GB:8", &["gpu-a", "gpu-b"], "all-3g.40gb");
    rig.schedule();
    rig.api.put("pods", gpu_pod("serving", "llm-0", "nvidia.com/mig-3g.40gb", 1, false));
    rig.wait("the 3g.40gb pod runs", 30, |r| r.pod("serving", "llm-0").0 == "Running");
    let busy_node = rig.pod("serving", "llm-0").1.unwrap();
    let idle_node = if busy_node == "gpu-a" { "gpu-b" } else { "gpu-a" };
    rig.wait("the agent sees it busy", 30, |r| r.layout_of(&busy_node).iter().flatten().any(|i| i.ends_with('*')));
    let _c = rig.controller("c1", &["--reclaim-after", "2s"]);
    rig.api.put("pods", gpu_pod("training", "tp8", "nvidia.com/gpu", 8, true));
    rig.wait("the TP=8 pod runs", 60, |r| r.pod("training", "tp8").0 == "Running");
    assert_eq!(rig.pod("training", "tp8").1.as_deref(), Some(idle_node));
    let node = rig.api.get("nodes", "", idle_node).unwrap();
    assert_eq!(node["metadata"]["labels"]["gpu-pool"], "dedicated");
    assert_eq!(node["spec"]["taints"][0]["key"], "gpu-dedicated");
    assert_eq!(node["metadata"]["annotations"]["gpupart.io/reclaim-layout"], "all-3g.40gb");
    assert_eq!(rig.api.node_label(&busy_node, LAYOUT).as_deref(), Some("all-3g.40gb"), "the busy node stays");
    assert!(rig.api.events().iter().any(|(n, r, note)| n == "tp8" && r == "Dedicating" && note.contains(idle_node)));
    // The job ends; two seconds later the node is back in the shared pool with its layout.
    rig.api.delete("pods", "training", "tp8");
    rig.wait("the node returns to all-3g.40gb", 60, |r| r.settled(idle_node, "all-3g.40gb"));
    let node = rig.api.get("nodes", "", idle_node).unwrap();
    assert!(node["metadata"]["labels"]["gpu-pool"].is_null(), "{node}");
    assert!(node["spec"]["taints"].as_array().is_none_or(|t| t.is_empty()), "{node}");
    assert!(node["metadata"]["annotations"]["gpupart.io/reclaim-layout"].is_null());
    assert!(rig.api.events().iter().any(|(n, r, _)| n == idle_node && r == "Reclaiming"));
    assert_eq!(value(&rig.metrics("c1"), "gpupart_controller_reclaimed_nodes_total"), Some(1.0));
    // Everything the controller and the agents asked of the API, their manifests' RBAC allows.
    assert_allowed(&controller_role(), &rig.api.requests_by("controller"), "the controller");
    let daemonset = format!("{}/daemonset.yaml", env!("CARGO_MANIFEST_DIR"));
    let agents = Permissions::of(&[&daemonset], "gpupart-system", "gpupart-agent");
    assert_allowed(&agents, &rig.api.requests_by("agent"), "the agents");
}

#[test]
fn a_leader_killed_mid_decision_leaves_no_node_half_changed_and_its_replacement_finishes() {
    let rig = busy_cluster();
    // No resync to fall back on: the successor must decide as soon as it leads.
    let slow = ["--resync-interval", "1h"];
    let c1 = rig.controller("c1", &slow);
    rig.wait("c1 leads", 30, |r| r.log("c1").contains("became the leader"));
    let _c2 = rig.controller("c2", &slow);
    rig.wait("c2 stands by", 30, |r| r.log("c2").contains("standing by"));
    let before = rig.layouts();
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    // Kill c1 between its two writes: the layout is in the ConfigMap, no node asks for it yet.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rig.layouts() == before && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut c1 = c1;
    let _ = c1.0.kill();
    let _ = c1.0.wait();
    let died = std::time::Instant::now();
    // The standby decided nothing while c1 led: one replica acts.
    assert!(!rig.log("c2").contains("batch decided"), "{}", rig.log("c2"));
    assert!(rig.log("c1").contains("batch decided"));
    let asked: Vec<Option<String>> =
        ["gpu-a", "gpu-b", "gpu-c"].iter().map(|n| rig.api.node_label(n, LAYOUT)).collect();
    assert!(asked.iter().all(|l| l.as_deref() == Some("all-3g.40gb")), "killed after the node patch: {asked:?}");
    rig.wait("c2 takes over and decides", 30, |r| r.log("c2").contains("batch decided"));
    let first_decision = died.elapsed();
    println!("leader killed → successor's first decision: {} ms (lease 2 s)", first_decision.as_millis());
    rig.wait("c2 serves the pod", 60, |r| r.pod("serving", "small-0").0 == "Running");
    assert!(rig.log("c2").contains("became the leader"));
    let config = rig.layouts();
    for n in ["gpu-a", "gpu-b", "gpu-c"] {
        let node = rig.api.get("nodes", "", n).unwrap();
        let label = node["metadata"]["labels"][LAYOUT].as_str().unwrap().to_string();
        assert!(config.contains(&format!("{label}:")), "{n} asks for {label}, which the config lacks");
        let changed = node["metadata"]["annotations"]["gpupart.io/controller-changed-at"].is_string();
        assert_eq!(changed, label != "all-3g.40gb", "{n}: label and annotations change together");
    }
}

/// Sets the controller's off switch (the layouts ConfigMap's `gpupart.io/controller: off`).
fn switch(rig: &Rig, on: bool) {
    let annotations = if on { serde_json::json!({}) } else { serde_json::json!({"gpupart.io/controller": "off"}) };
    rig.api.change(|s| {
        let key = ("configmaps".to_string(), LAYOUTS.0.to_string(), LAYOUTS.1.to_string());
        let mut cm = s.objects.get(&key).cloned().unwrap();
        cm["metadata"]["annotations"] = annotations;
        s.put(key, cm);
    });
}

#[test]
fn the_off_switch_pauses_the_controller() {
    let rig = busy_cluster();
    switch(&rig, false);
    // No resync to fall back on: switching back on must be noticed from the watch.
    let _c = rig.controller("c1", &["--resync-interval", "1h"]);
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("c1 notices the switch", 30, |r| r.log("c1").contains("off switch"));
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(["gpu-a", "gpu-b", "gpu-c"]
        .iter()
        .all(|n| rig.api.node_label(n, LAYOUT).as_deref() == Some("all-3g.40gb")));
    assert_eq!(rig.pod("serving", "small-0").0, "Pending");
    switch(&rig, true);
    let on = std::time::Instant::now();
    rig.wait("the pod is served once switched on", 60, |r| r.pod("serving", "small-0").0 == "Running");
    println!("switched on → pod running: {} ms", on.elapsed().as_millis());
}

#[test]
fn with_defrag_on_a_server_without_resource_v1_the_controller_says_so_and_still_serves_pods() {
    let rig = busy_cluster();
    // Kubernetes 1.33: resource.k8s.io in beta versions only, so no ResourceClaim watch can start.
    rig.api.serve_release(support::served::Served::v1_33());
    let _c = rig.controller("c1", &["--defrag"]);
    rig.wait("c1 watches", 30, |r| r.log("c1").contains("watching nodes and pods"));
    let log = rig.log("c1");
    let line = log.lines().find(|l| l.contains("resource.k8s.io/v1")).unwrap_or_else(|| panic!("not said:\n{log}"));
    assert!(line.contains("WARN") && line.contains("DRA claims are not watched") && line.contains("v1beta2"), "{line}");
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("the pod is served", 60, |r| r.pod("serving", "small-0").0 == "Running");
}

#[test]
fn a_burst_of_200_pending_pods_is_handled_in_a_few_batches() {
    let names: Vec<String> = (0..16).map(|i| format!("gpu-{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut rig = Rig::start("A100-SXM4-80GB:2", &refs, "all-3g.40gb");
    rig.schedule();
    let _c = rig.controller("c1", &["--max-concurrent-nodes", "16", "--batch-window", "2s"]);
    rig.wait("c1 leads", 30, |r| r.log("c1").contains("became the leader"));
    // The burst lands while the controller is switched off, then it is switched on: how fast the
    // API test server takes 200 pods on a loaded machine does not split the burst.
    switch(&rig, false);
    rig.wait("c1 notices the switch", 30, |r| r.log("c1").contains("off switch"));
    let burst = std::time::Instant::now();
    for i in 0..200 {
        rig.api.put("pods", gpu_pod("burst", &format!("p-{i:03}"), "nvidia.com/mig-1g.10gb", 1, false));
    }
    // The scheduler stand-in marks each pod unschedulable in its own time; the controller serves
    // what the scheduler has given up on, so the switch waits for all 200 to be marked.
    rig.wait("the scheduler marks all 200 pods unschedulable", 120, |r| {
        (0..200).all(|i| {
            let p = r.api.get("pods", "burst", &format!("p-{i:03}")).unwrap_or_default();
            p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["reason"] == "Unschedulable")
        })
    });
    switch(&rig, true);
    rig.wait("all 200 pods run", 120, |r| (0..200).all(|i| r.pod("burst", &format!("p-{i:03}")).0 == "Running"));
    let batches = rig.log("c1").lines().filter(|l| l.contains("batch decided")).count();
    eprintln!("burst: 200 pods on 16 nodes served in {batches} batch(es), {:.1} s", burst.elapsed().as_secs_f64());
    assert!((1..=3).contains(&batches), "{batches} batches:\n{}", rig.log("c1"));
}

#[test]
fn opted_in_a_draining_node_is_reserved_for_a_tensor_parallel_pod_and_converted_once_idle() {
    let mut rig = Rig::start("H100-SXM5-80GB:2", &["gpu-a"], "all-3g.40gb");
    rig.schedule();
    rig.api.put("pods", gpu_pod("serving", "llm-0", "nvidia.com/mig-3g.40gb", 1, false));
    rig.wait("the 3g.40gb pod runs", 30, |r| r.pod("serving", "llm-0").0 == "Running");
    rig.wait("the agent sees it busy", 30, |r| r.layout_of("gpu-a").iter().flatten().any(|i| i.ends_with('*')));
    let _c = rig.controller("c1", &["--reserve-for-dedicated"]);
    rig.api.put("pods", gpu_pod("training", "tp2", "nvidia.com/gpu", 2, true));
    rig.wait("the node is reserved", 30, |r| {
        r.api.events().iter().any(|(n, reason, note)| n == "tp2" && reason == "Reserving" && note.contains("gpu-a"))
    });
    let node = rig.api.get("nodes", "", "gpu-a").unwrap();
    assert_eq!(node["spec"]["taints"][0]["key"], "gpu-dedicated");
    assert_eq!(node["metadata"]["labels"][LAYOUT], "all-3g.40gb", "the layout stays while it drains");
    assert_eq!(rig.pod("serving", "llm-0").0, "Running", "nothing is evicted");
    // A new shared pod no longer lands there.
    rig.api.put("pods", gpu_pod("serving", "llm-1", "nvidia.com/mig-3g.40gb", 1, false));
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(rig.pod("serving", "llm-1").0, "Pending");
    rig.api.delete("pods", "serving", "llm-1");
    // Its pod ends: the node converts and the TP pod runs.
    rig.api.delete("pods", "serving", "llm-0");
    rig.wait("the TP pod runs", 60, |r| r.pod("training", "tp2").0 == "Running");
    assert!(rig.api.events().iter().any(|(n, r, _)| n == "gpu-a" && r == "Dedicating"));
}

#[test]
fn a_node_patch_refused_because_the_node_changed_is_tried_again_at_once() {
    let rig = busy_cluster();
    // The node changes under the controller twice in a row (its agent writing, say).
    rig.api.change(|s| {
        for _ in 0..2 {
            s.conflicts.push(("gpupart-controller".into(), "/api/v1/nodes/".into()));
        }
    });
    let _c = rig.controller("c1", &["--resync-interval", "1h"]);
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("the pod runs", 60, |r| r.pod("serving", "small-0").0 == "Running");
    let log = rig.log("c1");
    assert!(!log.contains("the node patch was refused"), "{log}");
    assert!(log.contains("repartitioning node"), "the change is logged once made: {log}");
    let patches = rig
        .api
        .requests_by("controller")
        .iter()
        .filter(|(m, p)| m == "PATCH" && p.starts_with("/api/v1/nodes/"))
        .count();
    assert_eq!(patches, 3, "two conflicts, then the patch that landed");
    assert!(rig.api.change(|s| s.conflicts.is_empty()));
}

#[test]
fn pods_blocked_by_something_else_than_gpus_change_no_node_and_are_told_why() {
    let rig = busy_cluster();
    // 32 CPUs on every node; nothing else runs there.
    rig.api.change(|s| {
        for n in ["gpu-a", "gpu-b", "gpu-c"] {
            let key = ("nodes".to_string(), String::new(), n.to_string());
            let mut node = s.objects.get(&key).cloned().unwrap();
            node["status"]["allocatable"] = serde_json::json!({"cpu": "32", "memory": "256Gi"});
            s.put(key, node);
        }
    });
    let before = instances(&rig);
    let _c = rig.controller("c1", &[]);
    let mut selector = gpu_pod("serving", "s6-selector", "nvidia.com/mig-1g.10gb", 1, false);
    selector["spec"]["nodeSelector"] = serde_json::json!({"disk": "ssd"});
    let mut cpu = gpu_pod("serving", "s6-cpu", "nvidia.com/mig-1g.10gb", 1, false);
    cpu["spec"]["containers"][0]["resources"]["requests"] = serde_json::json!({"cpu": "64"});
    rig.api.put("pods", selector);
    rig.api.put("pods", cpu);
    for name in ["s6-selector", "s6-cpu"] {
        rig.wait("the pod is told why", 30, |r| {
            r.api.events().iter().any(|(n, reason, note)| {
                n == name && reason == "NotServed" && note.contains("cannot land on any GPU node for other reasons")
            })
        });
    }
    let told = |name: &str| rig.api.events().into_iter().find(|(n, r, _)| n == name && r == "NotServed").unwrap().2;
    assert!(
        told("s6-selector").contains("gpu-a: didn't match Pod's node affinity/selector"),
        "{}",
        told("s6-selector")
    );
    assert!(told("s6-cpu").contains("gpu-a: Insufficient cpu"), "{}", told("s6-cpu"));
    assert!(
        told("s6-cpu").contains("(the scheduler: 0/3 nodes are available: 3 Insufficient cpu.)"),
        "{}",
        told("s6-cpu")
    );
    // A servable pod beside them is served as usual; nothing is changed for the blocked two.
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("small-0 runs", 60, |r| r.pod("serving", "small-0").0 == "Running");
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let for_blocked = rig
        .api
        .events()
        .iter()
        .filter(|(obj, r, n)| r == "Repartitioning" && (n.contains("s6-") || obj.starts_with("s6-")))
        .count();
    assert_eq!(for_blocked, 0, "changes made for pods that can never bind");
    let destroyed = before
        .iter()
        .filter(|x| {
            !instances(&rig)
                .iter()
                .any(|y| y.0 == x.0 && y.1 == x.1 && y.2.trim_end_matches('*') == x.2.trim_end_matches('*'))
        })
        .count();
    assert_eq!(destroyed, 1, "only the change for small-0");
    assert_eq!(rig.pod("serving", "s6-cpu").0, "Pending");
    assert_eq!(rig.pod("serving", "s6-selector").0, "Pending");
}

#[test]
fn a_mixed_burst_with_blocked_pods_changes_nothing_for_pods_that_never_bind() {
    let names = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"];
    let mut rig = Rig::start("A100-SXM4-80GB:2", &names, "all-3g.40gb");
    rig.api.change(|s| {
        for n in names {
            let key = ("nodes".to_string(), String::new(), n.to_string());
            let mut node = s.objects.get(&key).cloned().unwrap();
            node["status"]["allocatable"] = serde_json::json!({"cpu": "32", "memory": "256Gi"});
            s.put(key, node);
        }
    });
    rig.schedule();
    let _c = rig.controller("c1", &["--max-concurrent-nodes", "4"]);
    rig.wait("c1 leads", 30, |r| r.log("c1").contains("became the leader"));
    let mut servable = Vec::new();
    for (i, profile) in ["1g.10gb"; 10].iter().chain(&["2g.20gb"; 4]).chain(&["3g.40gb"; 4]).enumerate() {
        let name = format!("m{i:02}");
        rig.api.put("pods", gpu_pod("serving", &name, &format!("nvidia.com/mig-{profile}"), 1, false));
        servable.push(name);
    }
    let mut selector = gpu_pod("serving", "s6-selector", "nvidia.com/mig-1g.10gb", 1, false);
    selector["spec"]["nodeSelector"] = serde_json::json!({"disk": "ssd"});
    let mut cpu = gpu_pod("serving", "s6-cpu", "nvidia.com/mig-2g.20gb", 1, false);
    cpu["spec"]["containers"][0]["resources"]["requests"] = serde_json::json!({"cpu": "64"});
    let mut two = gpu_pod("serving", "two-resources", "nvidia.com/mig-1g.10gb", 1, false);
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = serde_json::json!("1");
    let mut affinity = gpu_pod("serving", "s6-affinity", "nvidia.com/mig-1g.10gb", 1, false);
    affinity["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]}]}}});
    let mut memory = gpu_pod("serving", "s6-memory", "nvidia.com/mig-1g.10gb", 1, false);
    memory["spec"]["containers"][0]["resources"]["requests"] = serde_json::json!({"memory": "512Gi"});
    let blocked = ["s6-selector", "s6-cpu", "two-resources", "s6-affinity", "s6-memory"];
    for p in [selector, cpu, two, affinity, memory] {
        rig.api.put("pods", p);
    }
    let burst = std::time::Instant::now();
    rig.wait("every servable pod runs", 90, |r| servable.iter().all(|n| r.pod("serving", n).0 == "Running"));
    let served_in = burst.elapsed();
    std::thread::sleep(std::time::Duration::from_secs(1));
    // Changes made for pods that then never bound: pod-level Repartitioning Events on pods still
    // pending, and node-level ones naming them.
    let pending: Vec<String> =
        blocked.iter().filter(|n| rig.pod("serving", n).0 != "Running").map(|n| n.to_string()).collect();
    let events = rig.api.events();
    let for_never_bound = events
        .iter()
        .filter(|(obj, r, note)| {
            r == "Repartitioning"
                && (pending.contains(obj) || pending.iter().any(|p| note.contains(&format!("serving/{p}"))))
        })
        .count();
    let changes = events.iter().filter(|(obj, r, _)| r == "Repartitioning" && obj.starts_with("gpu-")).count();
    println!(
        "burst of {} pods ({} blocked or unservable): {} servable running in {} ms, {changes} node change(s), {for_never_bound} made for pods that never bound",
        servable.len() + blocked.len(),
        blocked.len(),
        servable.len(),
        served_in.as_millis()
    );
    assert_eq!(pending.len(), blocked.len(), "the blocked pods stay pending");
    assert_eq!(for_never_bound, 0);
    for n in blocked {
        assert_eq!(events.iter().filter(|(o, r, _)| o == n && r == "NotServed").count(), 1, "{n}: one NotServed Event");
    }
}

#[test]
fn a_running_pod_the_controller_cannot_serve_is_never_told_so_nor_counted() {
    let rig = busy_cluster();
    // Bound and running, with two GPU resources: none of the controller's business.
    let mut running = gpu_pod("serving", "running-two", "nvidia.com/mig-1g.10gb", 1, false);
    running["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = serde_json::json!("1");
    running["spec"]["nodeName"] = serde_json::json!("gpu-a");
    running["status"] = serde_json::json!({"phase": "Running"});
    rig.api.put("pods", running);
    let _c = rig.controller("c1", &[]);
    rig.wait("c1 decides", 30, |r| r.log("c1").contains("became the leader"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!rig.api.events().iter().any(|(n, r, _)| n == "running-two" && r == "NotServed"), "{:?}", rig.api.events());
    let scrape = rig.metrics("c1");
    assert_eq!(value(&scrape, "gpupart_controller_unserved_gpu_pods"), Some(0.0), "{scrape}");
}

#[test]
fn new_capacity_is_made_for_the_pod_the_scheduler_serves_first() {
    let rig = busy_cluster();
    let _c = rig.controller("c1", &[]);
    rig.wait("c1 leads", 30, |r| r.log("c1").contains("became the leader"));
    // Room for one of them: the older one asks first, the other has the higher priority.
    rig.api.put("pods", gpu_pod("serving", "older", "nvidia.com/mig-1g.10gb", 3, false));
    let mut urgent = gpu_pod("serving", "urgent", "nvidia.com/mig-1g.10gb", 3, false);
    urgent["spec"]["priority"] = serde_json::json!(1000);
    rig.api.put("pods", urgent);
    rig.wait("the urgent pod runs", 60, |r| r.pod("serving", "urgent").0 == "Running");
    let made_for = |name: &str| rig.api.events().iter().any(|(n, r, _)| n == name && r == "Repartitioning");
    assert!(made_for("urgent"), "{:?}", rig.api.events());
    assert!(!made_for("older"), "the capacity was not promised to the pod the scheduler serves second");
}

#[test]
fn capacity_made_for_a_pod_counts_the_older_pod_the_controller_does_not_serve() {
    // GPU 0: three 1g.10gb and free room; GPU 1 whole.
    let mut rig = Rig::start("A100-SXM4-80GB:2", &["gpu-a"], "half-whole");
    rig.schedule();
    for i in 0..3 {
        rig.api.put("pods", gpu_pod("serving", &format!("small-{i}"), "nvidia.com/mig-1g.10gb", 1, false));
    }
    rig.wait("the 1g.10gb instances are taken", 30, |r| {
        (0..3).all(|i| r.pod("serving", &format!("small-{i}")).0 == "Running")
    });
    // Older: a 1g.10gb and a whole GPU (whole GPUs are free): the scheduler binds it first.
    let mut rival = gpu_pod("serving", "rival", "nvidia.com/mig-1g.10gb", 1, false);
    rival["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = serde_json::json!("1");
    rig.api.put("pods", rival);
    // Creation times have one-second resolution, as in Kubernetes.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    rig.api.put("pods", gpu_pod("serving", "mine", "nvidia.com/mig-1g.10gb", 1, false));
    let refused = |r: &Rig, n: &str| {
        r.api.get("pods", "serving", n).is_some_and(|p| p["status"]["conditions"].to_string().contains("Unschedulable"))
    };
    rig.wait("the scheduler refuses both", 30, |r| refused(r, "rival") && refused(r, "mine"));
    let _c = rig.controller("c1", &[]);
    let both = |r: &Rig| r.pod("serving", "mine").0 == "Running" && r.pod("serving", "rival").0 == "Running";
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !both(&rig) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        both(&rig),
        "{}\n{:?}\n{:?}",
        rig.log("c1"),
        rig.pod("serving", "mine"),
        rig.api.get("nodes", "", "gpu-a").unwrap()["metadata"]["annotations"]["gpupart.io/gpus"]
    );
    let changes = rig.api.events().iter().filter(|(o, r, _)| o == "gpu-a" && r == "Repartitioning").count();
    assert_eq!(changes, 1, "one change made room for both: {:?}", rig.api.events());
}

#[test]
fn an_unhealthy_gpu_is_not_recut_and_the_waiting_pod_is_told_until_the_operator_recovers_it() {
    let mut rig = Rig::start("A100-SXM4-80GB:1", &["gpu-a"], "all-3g.40gb");
    rig.schedule();
    let node = rig.nodes["gpu-a"].clone();
    node.inject_xid(0, 79, None);
    let gpus = |r: &Rig| {
        let n = r.api.get("nodes", "", "gpu-a").unwrap();
        n["metadata"]["annotations"]["gpupart.io/gpus"].as_str().unwrap_or_default().to_string()
    };
    rig.wait("the agent reports GPU 0 unhealthy", 30, |r| gpus(r).contains(r#""unhealthy":"XID 79""#));
    let _c = rig.controller("c1", &[]);
    rig.api.put("pods", gpu_pod("serving", "small-0", "nvidia.com/mig-1g.10gb", 1, false));
    rig.wait("the pod is told why", 30, |r| {
        r.api.events().iter().any(|(n, reason, note)| {
            n == "small-0"
                && reason == "NotServed"
                && note.ends_with("unhealthy GPUs offer nothing: gpu-a GPU 0 (XID 79)")
        })
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(rig.api.node_label("gpu-a", LAYOUT).as_deref(), Some("all-3g.40gb"), "the fenced GPU is not re-cut");
    assert_eq!(rig.pod("serving", "small-0").0, "Pending");
    rig.api.change(|s| {
        let key = ("nodes".to_string(), String::new(), "gpu-a".to_string());
        let mut n = s.objects.get(&key).cloned().unwrap();
        n["metadata"]["annotations"]["gpupart.io/recover-gpus"] = serde_json::json!("0");
        s.put(key, n);
    });
    rig.wait("the pod is served once the GPU is back", 60, |r| r.pod("serving", "small-0").0 == "Running");
}

/// Nodes running the DRA plugin (labelled `gpupart.io/dra=true`, or carrying the plugin's
/// `gpupart.io/dra-driver` annotation) make their devices per claim: the controller never sets a
/// layout there, says once why, and serves the waiting pods on the other node.
#[test]
fn nodes_running_the_dra_plugin_are_never_repartitioned() {
    use support::controller_rig::{agent_node, layouts_api, unschedulable};
    let api = layouts_api();
    let mut labelled = agent_node("gpu-a-dra-label");
    labelled["metadata"]["labels"]["gpupart.io/dra"] = serde_json::json!("true");
    let mut annotated = agent_node("gpu-b-dra-plugin");
    annotated["metadata"]["annotations"]["gpupart.io/dra-driver"] = serde_json::json!("gpu.gpupart.io");
    for n in [labelled, annotated, agent_node("gpu-c")] {
        api.put("nodes", n);
    }
    // More 4g.40gb pods than one node of 8 GPUs holds: a second node would change if it could.
    for k in 0..10 {
        api.put("pods", unschedulable(&format!("mid-{k}"), "nvidia.com/mig-4g.40gb"));
    }
    let rig = Rig::bare(api.clone());
    let _c = rig.controller_as("ctl", "ctl", &[]);
    rig.wait("gpu-c changes", 60, |r| r.api.node_label("gpu-c", LAYOUT).as_deref() != Some("all-3g.40gb"));
    let batches = |r: &Rig| value(&r.metrics("ctl"), "gpupart_controller_batches_total").unwrap_or(0.0);
    let after = batches(&rig);
    rig.wait("three more batches", 60, |r| batches(r) >= after + 3.0);
    for n in ["gpu-a-dra-label", "gpu-b-dra-plugin"] {
        assert_eq!(api.node_label(n, LAYOUT).as_deref(), Some("all-3g.40gb"), "{n} was repartitioned");
        let writes: Vec<(String, String)> =
            api.requests_by("ctl").into_iter().filter(|(m, p)| m != "GET" && p.contains(n)).collect();
        assert!(writes.is_empty(), "{n} written: {writes:?}");
    }
    let log = rig.log("ctl");
    assert_eq!(log.matches("leaving node gpu-a-dra-label alone").count(), 1, "{log}");
    assert!(log.contains("labelled gpupart.io/dra=true"), "{log}");
    assert_eq!(log.matches("leaving node gpu-b-dra-plugin alone").count(), 1, "{log}");
    assert!(log.contains("its DRA plugin (driver gpu.gpupart.io) publishes its devices"), "{log}");
}

/// A `--layouts-configmap` that names no ConfigMap (a typo) is warned of at start, and its
/// creation at the first change is logged.
#[test]
fn a_layouts_configmap_that_does_not_exist_is_warned_of_at_start_and_its_creation_logged() {
    use support::controller_rig::{agent_node, layouts_api, unschedulable};
    let api = layouts_api();
    api.put("nodes", agent_node("gpu-a"));
    api.put("pods", unschedulable("mid-0", "nvidia.com/mig-4g.40gb"));
    let rig = Rig::bare(api.clone());
    let typo = format!("{}/gpupart-confg", LAYOUTS.0);
    let _c = rig.controller_as("ctl", "ctl", &["--layouts-configmap", &typo]);
    rig.wait("gpu-a changes", 60, |r| r.api.node_label("gpu-a", LAYOUT).as_deref() != Some("all-3g.40gb"));
    let log = rig.log("ctl");
    assert!(log.contains(&format!("ConfigMap {typo} does not exist: the agents read their layouts from it")), "{log}");
    assert!(log.contains(&format!("creating ConfigMap {typo} with the controller's layouts")), "{log}");
    assert!(
        log.find("does not exist").unwrap() < log.find("creating ConfigMap").unwrap(),
        "warned of before it was created: {log}"
    );
}
