//! Evicting pods through the Eviction API, as `gpupart controller --defrag` moves them: the
//! controller's eviction client (real HTTP through kube) against the API test server's
//! `pods/eviction` with PodDisruptionBudget semantics and its ReplicaSet stand-in.

mod support;

use gpupart::controller::evict::{evict, Eviction};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::apiserver::ApiServer;

/// A kube client of the server as the controller makes it for evictions (no retries of 429),
/// made inside `rt` (its connection pool lives there).
fn client(rt: &tokio::runtime::Runtime, api: &ApiServer) -> kube::Client {
    let url = format!("http://127.0.0.1:{}", api.port).parse().expect("a URL");
    let _inside = rt.enter();
    gpupart::kube::client_from(kube::Config::new(url), false).expect("a client")
}

fn replica_set(api: &ApiServer, name: &str, replicas: i64) {
    api.put(
        "replicasets",
        json!({"metadata": {"namespace": "ml", "name": name, "uid": format!("uid-rs-{name}")},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"containers": [{"name": "m", "image": "serve"}]}}}}),
    );
}

/// A running pod of `rs`, Ready or not.
fn pod(api: &ApiServer, rs: &str, name: &str, ready: bool) {
    api.put(
        "pods",
        json!({"metadata": {"namespace": "ml", "name": name, "labels": {"app": rs},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                                 "uid": format!("uid-rs-{rs}"), "controller": true}]},
               "spec": {"nodeName": "gpu-1", "containers": [{"name": "m", "image": "serve"}]},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}),
    );
}

fn budget(api: &ApiServer, name: &str, app: &str, spec: Value) {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    api.put(
        "poddisruptionbudgets",
        json!({"metadata": {"namespace": "ml", "name": name, "generation": 1}, "spec": spec}),
    );
}

fn pods_of(api: &ApiServer, app: &str) -> Vec<Value> {
    api.pods().into_iter().filter(|p| p["metadata"]["labels"]["app"] == app).collect()
}

fn wait(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_budget_at_its_limit_answers_blocked_until_the_replacement_is_ready() {
    let api = ApiServer::empty();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let c = client(&rt, &api);
    replica_set(&api, "small", 3);
    for i in 0..3 {
        pod(&api, "small", &format!("small-{i}"), true);
    }
    budget(&api, "small", "small", json!({"maxUnavailable": 1}));
    assert_eq!(rt.block_on(evict(&c, "ml", "small-0")).expect("answered"), Eviction::Evicted);
    assert!(api.get("pods", "ml", "small-0").is_none(), "the evicted pod is deleted");
    // The ReplicaSet stand-in recreates it, unscheduled; until it is Ready the budget is spent.
    wait("the replacement", || pods_of(&api, "small").len() == 3);
    let fresh: Vec<String> = pods_of(&api, "small")
        .iter()
        .filter(|p| p["status"]["phase"] == "Pending")
        .map(|p| p["metadata"]["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(fresh.len(), 1, "one replacement, pending: {:?}", pods_of(&api, "small"));
    match rt.block_on(evict(&c, "ml", "small-1")).expect("answered") {
        Eviction::Blocked(why) => {
            assert!(why.contains("disruption budget small needs 2 healthy pods and has 2"), "{why}")
        }
        other => panic!("expected a budget at its limit, got {other:?}"),
    }
    assert!(api.get("pods", "ml", "small-1").is_some(), "a blocked eviction deletes nothing");
    let status = api.get("poddisruptionbudgets", "ml", "small").expect("the budget")["status"].clone();
    assert_eq!(
        (status["disruptionsAllowed"].as_i64(), status["expectedPods"].as_i64()),
        (Some(0), Some(3)),
        "{status}"
    );
    // The replacement runs and is Ready: the next eviction goes through.
    let mut running = api.get("pods", "ml", &fresh[0]).expect("the replacement");
    running["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    api.put("pods", running);
    assert_eq!(rt.block_on(evict(&c, "ml", "small-1")).expect("answered"), Eviction::Evicted);
}

#[test]
fn min_available_pending_and_unready_pods_several_budgets_and_gone_pods() {
    let api = ApiServer::empty();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let c = client(&rt, &api);
    replica_set(&api, "llm", 2);
    pod(&api, "llm", "llm-0", true);
    pod(&api, "llm", "llm-1", false);
    budget(&api, "llm", "llm", json!({"minAvailable": 1}));
    // One healthy pod and one needed: a Ready pod may not go, an unready one may (the budget is met).
    assert!(matches!(rt.block_on(evict(&c, "ml", "llm-0")).expect("answered"), Eviction::Blocked(_)));
    assert_eq!(rt.block_on(evict(&c, "ml", "llm-1")).expect("answered"), Eviction::Evicted);
    // A pending pod goes whatever the budget.
    wait("the replacement", || pods_of(&api, "llm").len() == 2);
    let pending = pods_of(&api, "llm").into_iter().find(|p| p["status"]["phase"] == "Pending").expect("a pending pod");
    let name = pending["metadata"]["name"].as_str().expect("a name").to_string();
    assert_eq!(rt.block_on(evict(&c, "ml", &name)).expect("answered"), Eviction::Evicted);
    // Two budgets over one pod: the API server refuses, and the pod stays.
    budget(&api, "llm-too", "llm", json!({"maxUnavailable": "50%"}));
    match rt.block_on(evict(&c, "ml", "llm-0")).expect("answered") {
        Eviction::Refused(why) => assert!(why.contains("more than one PodDisruptionBudget"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(api.get("pods", "ml", "llm-0").is_some());
    assert_eq!(rt.block_on(evict(&c, "ml", "no-such-pod")).expect("answered"), Eviction::Gone);
    // A bare pod without a budget goes, and nothing recreates it.
    api.put(
        "pods",
        json!({"metadata": {"namespace": "ml", "name": "bare"}, "spec": {"containers": [{"name": "m"}]},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    assert_eq!(rt.block_on(evict(&c, "ml", "bare")).expect("answered"), Eviction::Evicted);
    std::thread::sleep(Duration::from_millis(200));
    assert!(api.pods().iter().all(|p| !p["metadata"]["name"].as_str().unwrap_or("").starts_with("bare")));
    // Evictions are POSTs to the subresource, never DELETEs of the pod.
    let s = api.store();
    assert!(s.requests.iter().all(|(m, p)| m != "DELETE" || !p.contains("/pods/")), "{:?}", s.requests);
}
