//! `gpupart controller --defrag` on a node running `gpupart agent --dra` (fake NVML): a claim the
//! scheduler cannot allocate gets room made by evicting movable pods through the Eviction API,
//! the room reserved first (the agent taints it), with the ResourceClaim controller, the
//! scheduler and the kubelet played by tests/support/dra_cluster.rs and the ReplicaSet controller
//! and PodDisruptionBudgets by the API test server.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::controller_rig::Proc;
use support::dra_cluster::DraCluster;
use support::dra_rig::{DraRig, DRIVER, NODE};
use support::rbac::{assert_allowed, controller_role};

const RESERVATION: &str = "gpupart.io/defrag-reservation";

fn template(rig: &DraRig, name: &str, profile: &str) {
    let cel = format!("device.attributes['{DRIVER}'].profile == '{profile}'");
    rig.api.put(
        "resourceclaimtemplates",
        json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "mig.gpupart.io", "allocationMode": "ExactCount", "count": 1,
                                        "selectors": [{"cel": {"expression": cel}}]}}]}}}}),
    );
}

/// The `small` ReplicaSet: movable (or not) 1g.10gb inference replicas.
fn replica_set(rig: &DraRig, replicas: i64, movable: bool) {
    let annotations = if movable { json!({"gpupart.io/movable": "true"}) } else { json!({}) };
    rig.api.put(
        "replicasets",
        json!({"metadata": {"namespace": "ml", "name": "small", "uid": "uid-rs-small"},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "small"}},
                        "template": {"metadata": {"labels": {"app": "small"}, "annotations": annotations},
                                     "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-1g"}],
                                              "containers": [{"name": "m", "image": "serve"}]}}}}),
    );
}

/// A replica of the `small` ReplicaSet (`rs`) or a bare pod, opted in to moves or not.
struct Kind {
    rs: bool,
    movable: bool,
    ready: bool,
}

/// A pod already running on `device`, its claim (from `template`) prepared.
fn running(rig: &DraRig, dc: &mut DraCluster, name: &str, kind: Kind, template: &str, device: &str) {
    let Kind { rs, movable, ready } = kind;
    let claim = format!("{name}-gpu");
    let t = rig.api.get("resourceclaimtemplates", "ml", template).expect("the template");
    rig.api.put(
        "resourceclaims",
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": claim, "namespace": "ml", "uid": format!("uid-{claim}")}, "spec": t["spec"]["spec"]}),
    );
    rig.set_allocation(&claim, &[("gpu", DRIVER, NODE, device)]);
    edit(rig, "resourceclaims", &claim, |c| {
        c["status"]["reservedFor"] = json!([{"resource": "pods", "name": name, "uid": format!("uid-pod-{name}")}]);
    });
    rig.prepare(&claim).expect("prepared");
    let mut meta = json!({"name": name, "namespace": "ml", "uid": format!("uid-pod-{name}"),
                          "creationTimestamp": "2026-01-01T00:00:00Z"});
    if rs {
        meta["labels"] = json!({"app": "small"});
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "small",
                                          "uid": "uid-rs-small", "controller": true}]);
    }
    if movable {
        meta["annotations"] = json!({"gpupart.io/movable": "true"});
    }
    rig.api.put(
        "pods",
        json!({"metadata": meta, "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                                          "containers": [{"name": "m", "image": "serve"}]},
               "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}],
                          "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}),
    );
    dc.running(name, &[&claim]);
}

/// Two A100s: GPU 0 holds two movable 1g.10gb replicas, GPU 1 a 3g.40gb that may not move (and,
/// with `third`, a third replica, not Ready): no GPU has room for a 7g.80gb.
fn cluster(movable: bool, third: bool) -> (DraRig, DraCluster) {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    template(&rig, "one-1g", "1g.10gb");
    template(&rig, "one-3g", "3g.40gb");
    template(&rig, "one-7g", "7g.80gb");
    let mut dc = DraCluster::default();
    replica_set(&rig, if third { 3 } else { 2 }, movable);
    let replica = |ready| Kind { rs: true, movable, ready };
    running(&rig, &mut dc, "small-a", replica(true), "one-1g", "gpu-0-mig-1g-10gb-19-0");
    running(&rig, &mut dc, "small-b", replica(true), "one-1g", "gpu-0-mig-1g-10gb-19-3");
    let bare = Kind { rs: false, movable: false, ready: true };
    running(&rig, &mut dc, "big", bare, "one-3g", "gpu-1-mig-3g-40gb-9-0");
    if third {
        running(&rig, &mut dc, "small-c", replica(false), "one-1g", "gpu-1-mig-1g-10gb-19-4");
    }
    rig.wait_caught_up();
    (rig, dc)
}

/// The waiting pod: one 7g.80gb, a bare pod.
fn waiting(rig: &DraRig) {
    rig.api.put(
        "pods",
        json!({"metadata": {"name": "llm", "namespace": "ml", "uid": "uid-pod-llm"},
               "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-7g"}],
                        "containers": [{"name": "m", "image": "serve"}]},
               "status": {"phase": "Pending"}}),
    );
}

fn controller(rig: &DraRig, identity: &str, extra: &[&str]) -> Proc {
    let dir = rig.node.dir.path();
    // As the `controller` user: the test checks its requests against the shipped RBAC.
    let kubeconfig = rig.api.kubeconfig_as(dir, "controller");
    let log = std::fs::File::create(dir.join(format!("{identity}.log"))).unwrap();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpupart"));
    c.args([
        "controller",
        "--defrag",
        "--defrag-min-age",
        "0s",
        "--batch-window",
        "300ms",
        "--resync-interval",
        "300ms",
    ]);
    c.args(["--lease-duration", "2s", "--cooldown", "0s", "--metrics-addr", "127.0.0.1:0", "--identity", identity]);
    c.args(extra);
    c.env("KUBECONFIG", kubeconfig).env("RUST_LOG", "gpupart=info");
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::from(log));
    Proc(c.spawn().unwrap())
}

fn log(rig: &DraRig, identity: &str) -> String {
    std::fs::read_to_string(rig.node.dir.path().join(format!("{identity}.log"))).unwrap_or_default()
}

/// Runs the cluster until `ok`, at most `secs`.
fn until(rig: &DraRig, dc: &mut DraCluster, what: &str, secs: u64, mut ok: impl FnMut(&DraRig) -> bool) {
    let t = Instant::now();
    loop {
        dc.tick(rig);
        if ok(rig) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}; events: {:#?}",
            rig.api.events()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pod(rig: &DraRig, name: &str) -> Option<Value> {
    rig.api.get("pods", "ml", name)
}

fn events(rig: &DraRig, reason: &str) -> Vec<(String, String)> {
    rig.api.events().into_iter().filter(|(_, r, _)| r == reason).map(|(on, _, note)| (on, note)).collect()
}

fn reservation(rig: &DraRig) -> Option<String> {
    rig.api.get("nodes", "", NODE).and_then(|n| n["metadata"]["annotations"][RESERVATION].as_str().map(str::to_string))
}

/// The devices the claims of the pods of `app` hold now.
fn devices_of_app(rig: &DraRig, app: &str) -> Vec<String> {
    let names: Vec<String> = rig
        .api
        .pods()
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app)
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names
        .iter()
        .filter_map(|n| rig.api.get("resourceclaims", "ml", &format!("{n}-gpu")))
        .filter_map(|c| c["status"]["allocation"]["devices"]["results"][0]["device"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_7g_claim_is_served_by_moving_the_two_1g_claims_off_one_gpu() {
    let (rig, mut dc) = cluster(true, false);
    budget(&rig, "small", json!({"maxUnavailable": 1}));
    let _c = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "the 7g.80gb pod bound", 60, |r| pod(r, "llm").is_some_and(|p| p["spec"]["nodeName"] == NODE));
    // It got the 7g.80gb of GPU 0, where the two 1g.10gb were.
    let llm = rig.api.get("resourceclaims", "ml", "llm-gpu").expect("the claim");
    assert_eq!(llm["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0-mig-7g-80gb-0-0");
    // Both small replicas moved, once each, through the Eviction API; their replacements run on
    // GPU 1, never in the room.
    assert!(pod(&rig, "small-a").is_none() && pod(&rig, "small-b").is_none());
    let evicted = events(&rig, "Defragmenting");
    let on_pods: Vec<&str> = evicted.iter().map(|(on, _)| on.as_str()).filter(|on| on.starts_with("small")).collect();
    assert_eq!(on_pods, vec!["small-a", "small-b"], "{evicted:#?}");
    assert!(evicted.iter().any(|(on, n)| on == "small-a" && n.contains("make room for ml/llm") && n.contains("GPU 0")));
    assert!(evicted.iter().any(|(on, n)| on == "llm" && n.contains("ml/small-a") && n.contains("ml/small-b")));
    until(&rig, &mut dc, "the replacements running", 20, |r| devices_of_app(r, "small").len() == 2);
    for d in devices_of_app(&rig, "small") {
        assert!(d.starts_with("gpu-1-mig-1g-10gb"), "a replacement took {d}");
    }
    assert!(dc.allocations.iter().all(|(c, d)| c == "llm-gpu" || !d.starts_with("gpu-0")), "{:?}", dc.allocations);
    // The pod that did not opt in stayed; the plan is confirmed and the room released.
    assert_eq!(pod(&rig, "big").expect("big stays")["metadata"]["uid"], "uid-pod-big");
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
    // Events are posted off the decision's path: the Event may follow the released room.
    until(&rig, &mut dc, "the Defragmented Event", 10, |r| events(r, "Defragmented").iter().any(|(on, _)| on == "llm"));
    assert!(log(&rig, "c1").contains("served: bound into the room"), "{}", log(&rig, "c1"));
    let m = metrics(&rig, "c1");
    for line in [
        r#"gpupart_controller_defrag_plans_total{outcome="started"} 1"#,
        r#"gpupart_controller_defrag_plans_total{outcome="served"} 1"#,
        r#"gpupart_controller_defrag_evictions_total{outcome="evicted"} 2"#,
        "gpupart_controller_defrag_pods_served_total 1",
        "gpupart_controller_defrag_wait_seconds_count 1",
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
    // Everything it asked of the API, deploy/controller.yaml allows.
    assert_allowed(&controller_role(), &rig.api.requests_by("controller"), "the controller");
}

#[test]
fn a_budget_at_its_limit_delays_the_plan_and_a_new_leader_finishes_it_without_evicting_twice() {
    let (rig, mut dc) = cluster(true, true);
    // Three replicas, one of them not Ready: the budget allows no eviction until it is.
    budget(&rig, "small", json!({"maxUnavailable": 1}));
    let first = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "the room reserved and the budget saying no", 30, |r| {
        reservation(r).is_some() && !events(r, "DefragmentBlocked").is_empty()
    });
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some(), "the budget is never broken");
    // The leader dies mid-plan; another replica takes the Lease and finds the reservation.
    drop(first);
    let _second = controller(&rig, "c2", &[]);
    edit(&rig, "pods", "small-c", |p| {
        p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    });
    until(&rig, &mut dc, "the 7g.80gb pod bound", 60, |r| pod(r, "llm").is_some_and(|p| p["spec"]["nodeName"] == NODE));
    let llm = rig.api.get("resourceclaims", "ml", "llm-gpu").expect("the claim");
    assert_eq!(llm["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0-mig-7g-80gb-0-0");
    let evicted: Vec<String> =
        events(&rig, "Defragmenting").into_iter().map(|(on, _)| on).filter(|on| on != "llm").collect();
    assert_eq!(evicted.len(), 2, "each pod of the room evicted once: {evicted:?}");
    assert!(evicted.contains(&"small-a".to_string()) && evicted.contains(&"small-b".to_string()), "{evicted:?}");
    assert!(pod(&rig, "small-c").is_some(), "a pod off the room stays");
    assert!(log(&rig, "c2").contains("taking the plan up"), "{}", log(&rig, "c2"));
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
}

#[test]
fn a_budget_that_never_allows_ends_the_plan_with_nothing_evicted_and_it_is_not_tried_again() {
    let (rig, mut dc) = cluster(true, false);
    budget(&rig, "small", json!({"maxUnavailable": 0}));
    let _c = controller(&rig, "c1", &["--defrag-confirm-timeout", "4s"]);
    waiting(&rig);
    until(&rig, &mut dc, "the plan ended", 40, |r| !events(r, "DefragmentFailed").is_empty());
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some(), "nothing evicted");
    let failed = events(&rig, "DefragmentFailed");
    assert!(failed.iter().any(|(on, n)| on == "llm" && n.contains("PodDisruptionBudget")), "{failed:#?}");
    settle(&rig, &mut dc);
    assert!(reservation(&rig).is_none(), "no new reservation for the plan that failed");
    assert_eq!(events(&rig, "Defragmenting").len(), 1, "one plan started");
    let m = metrics(&rig, "c1");
    assert!(m.contains(r#"gpupart_controller_defrag_plans_total{outcome="blocked"} 1"#), "{m}");
    assert!(m.contains(r#"gpupart_controller_defrag_evictions_total{outcome="evicted"} 0"#), "{m}");
}

#[test]
fn two_budgets_over_a_pod_refuse_its_eviction_and_the_room_is_released() {
    let (rig, mut dc) = cluster(true, false);
    budget(&rig, "small", json!({"maxUnavailable": 1}));
    budget(&rig, "also-small", json!({"maxUnavailable": 1}));
    let _c = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "the plan ended", 30, |r| !events(r, "DefragmentFailed").is_empty());
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some(), "nothing evicted");
    let failed = events(&rig, "DefragmentFailed");
    assert!(failed.iter().any(|(on, n)| on == "llm" && n.contains("was refused")), "{failed:#?}");
    let m = metrics(&rig, "c1");
    assert!(m.contains(r#"gpupart_controller_defrag_evictions_total{outcome="refused"} 1"#), "{m}");
}

#[test]
fn pods_that_did_not_opt_in_never_move() {
    let (rig, mut dc) = cluster(false, false);
    let _c = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "no plan said", 30, |r| log(r, "c1").contains("no plan"));
    settle(&rig, &mut dc);
    assert!(reservation(&rig).is_none());
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some());
    assert!(events(&rig, "Defragmenting").is_empty());
    // Opting a namespace in by flag makes them movable; an annotation "false" still keeps a pod.
    drop(_c);
    edit(&rig, "pods", "small-b", |p| {
        p["metadata"]["annotations"] = json!({"gpupart.io/movable": "false"});
    });
    let _c = controller(&rig, "c2", &["--defrag-namespaces", "ml,other"]);
    until(&rig, &mut dc, "no plan said", 30, |r| log(r, "c2").contains("no plan"));
    settle(&rig, &mut dc);
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some());
}

#[test]
fn a_dry_run_tells_the_plan_and_evicts_nothing() {
    let (rig, mut dc) = cluster(true, false);
    let _c = controller(&rig, "c1", &["--dry-run"]);
    waiting(&rig);
    until(&rig, &mut dc, "the plan told", 30, |r| !events(r, "WillDefragment").is_empty());
    settle(&rig, &mut dc);
    let told = events(&rig, "WillDefragment");
    assert_eq!(told.len(), 1, "told once: {told:#?}");
    assert!(told[0].1.contains("ml/small-a to node gpu-node-1 GPU 1"), "{told:#?}");
    assert!(reservation(&rig).is_none());
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some());
    assert!(log(&rig, "c1").contains("would defragment"));
}

#[test]
fn a_waiting_pod_deleted_mid_plan_releases_the_room() {
    let (rig, mut dc) = cluster(true, false);
    budget(&rig, "small", json!({"maxUnavailable": 0}));
    let _c = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "the room reserved", 30, |r| reservation(r).is_some());
    rig.api.delete("pods", "ml", "llm");
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
    assert!(pod(&rig, "small-a").is_some() && pod(&rig, "small-b").is_some(), "nothing evicted");
    assert!(log(&rig, "c1").contains("the waiting pod is gone"), "{}", log(&rig, "c1"));
}

#[test]
fn owners_that_do_not_recreate_their_pods_and_a_refused_eviction_still_end_with_the_pod_served() {
    let (rig, mut dc) = cluster(true, false);
    // Each small pod belongs to a workload of its own that no stand-in recreates.
    for (name, owner) in [("small-a", "lws-a"), ("small-b", "lws-b")] {
        edit(&rig, "pods", name, |p| {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                                       "name": owner, "uid": format!("uid-{owner}"), "controller": true}]);
        });
    }
    // The API server refuses the first eviction of small-a once.
    rig.api.change(|s| s.fail.push(("POST".into(), "/api/v1/namespaces/ml/pods/small-a/eviction".into(), 503)));
    let _c = controller(&rig, "c1", &[]);
    waiting(&rig);
    until(&rig, &mut dc, "the 7g.80gb pod bound", 60, |r| pod(r, "llm").is_some_and(|p| p["spec"]["nodeName"] == NODE));
    assert!(pod(&rig, "small-a").is_none() && pod(&rig, "small-b").is_none());
    assert_eq!(rig.api.pods().len(), 2, "big and llm; nothing replaced the moved pods");
    let log = log(&rig, "c1");
    assert!(log.contains("the eviction failed; retrying at the next batch"), "{log}");
    let m = metrics(&rig, "c1");
    assert!(m.contains(r#"gpupart_controller_defrag_evictions_total{outcome="error"} 1"#), "{m}");
    assert!(m.contains(r#"gpupart_controller_defrag_evictions_total{outcome="evicted"} 2"#), "{m}");
}

#[test]
fn a_replacement_that_stays_pending_holds_back_its_workload_and_the_plan_expires_with_nothing_more_evicted() {
    let (rig, mut dc) = cluster(true, false);
    // The ReplicaSet's template asks for a zone no node is in: its replacements never land.
    edit(&rig, "replicasets", "small", |rs| {
        rs["spec"]["template"]["spec"]["nodeSelector"] = json!({"zone": "nowhere"});
    });
    let _c = controller(&rig, "c1", &["--defrag-confirm-timeout", "5s"]);
    waiting(&rig);
    until(&rig, &mut dc, "the plan ended", 40, |r| !events(r, "DefragmentFailed").is_empty());
    until(&rig, &mut dc, "the reservation released", 10, |r| reservation(r).is_none());
    // small-a went; small-b, of the same workload, waited for a replacement that never ran.
    assert!(pod(&rig, "small-a").is_none());
    assert!(pod(&rig, "small-b").is_some(), "not evicted while its workload's replacement is not Ready");
    let failed = events(&rig, "DefragmentFailed");
    assert!(failed.iter().any(|(on, n)| on == "llm" && n.contains("is not Ready")), "{failed:#?}");
    // The replacement that waits is left to the scheduler: no plan moves anything for it.
    settle(&rig, &mut dc);
    let moved: Vec<(String, String)> =
        events(&rig, "Defragmenting").into_iter().filter(|(on, _)| on != "llm").collect();
    assert_eq!(moved.len(), 1, "{moved:#?}");
    assert_eq!(pod(&rig, "big").expect("big stays")["metadata"]["uid"], "uid-pod-big");
}

/// Changes object `name` of `plural` in namespace `ml` in place.
fn edit(rig: &DraRig, plural: &str, name: &str, f: impl FnOnce(&mut Value)) {
    let key = (plural.to_string(), "ml".to_string(), name.to_string());
    rig.api.change(|s| {
        let mut o = s.objects.get(&key).cloned().unwrap_or_else(|| panic!("no {plural} {name}"));
        f(&mut o);
        s.put(key.clone(), o);
    });
}

fn budget(rig: &DraRig, name: &str, spec: Value) {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": "small"}});
    rig.api.put(
        "poddisruptionbudgets",
        json!({"metadata": {"namespace": "ml", "name": name, "generation": 1}, "spec": spec}),
    );
}

/// A second of the cluster going on.
fn settle(rig: &DraRig, dc: &mut DraCluster) {
    for _ in 0..10 {
        dc.tick(rig);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A controller's `/metrics` body.
fn metrics(rig: &DraRig, identity: &str) -> String {
    support::metrics_in_log(&log(rig, identity))
}
