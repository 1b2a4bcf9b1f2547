//! `gpupart controller` end to end: the real controller and one real agent per simulated node
//! (fake NVML) against the API test server, with the binding stand-in playing the scheduler.

mod support;

use support::controller_rig::{Rig, LAYOUT};
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
}
