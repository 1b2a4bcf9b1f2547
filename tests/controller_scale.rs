//! `gpupart controller` at scale, two replicas, against an API server that answers every write in
//! 50 ms: many nodes carrying what their agents publish (8 × A100-80GB at `all-3g.40gb`, idle),
//! hundreds of pending `nvidia.com/mig-1g.10gb` pods. The Lease is renewed on its own clock while
//! the leader decides and writes, so its holder never changes and the standby never writes; the
//! Events a batch queues stay under the cap; the first node changes within seconds.

mod support;

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::apiserver::ApiServer;
use support::controller_rig::{agent_node, layouts_api, unschedulable, Rig, LAYOUT, LAYOUTS};

/// Nodes and pods of the run: enough that deciding and writing take longer than the Lease.
const NODES: usize = 1000;
const PODS: usize = 500;
/// `--events-per-batch` of the run.
const CAP: u64 = 50;

fn lease(api: &ApiServer) -> Option<(String, i64)> {
    let l = api.get("leases", LAYOUTS.0, "gpupart-controller")?;
    Some((l["spec"]["holderIdentity"].as_str()?.to_string(), l["spec"]["leaseTransitions"].as_i64().unwrap_or(0)))
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The layouts ConfigMap, `nodes` nodes carrying what their agents publish and `pods` pending
/// `nvidia.com/mig-1g.10gb` pods the scheduler found no room for.
fn cluster(nodes: usize, pods: usize) -> Arc<ApiServer> {
    let api = layouts_api();
    for k in 0..nodes {
        api.put("nodes", agent_node(&format!("gpu-{k:04}")));
    }
    for k in 0..pods {
        let mut p = unschedulable(&format!("small-{k:03}"), "nvidia.com/mig-1g.10gb");
        p["status"]["conditions"][0]["message"] =
            json!(format!("0/{nodes} nodes are available: {nodes} Insufficient nvidia.com/mig-1g.10gb."));
        api.put("pods", p);
    }
    api
}

#[test]
fn two_replicas_keep_one_leader_while_a_large_batch_is_decided_and_written() {
    let api = cluster(NODES, PODS);
    api.delay_writes(Duration::from_millis(50));
    let rig = Rig::bare(api.clone());
    let flags = ["--lease-duration", "3s", "--events-per-batch", "50", "--resync-interval", "2s"];
    let _a = rig.controller_as("replica-a", "replica-a", &flags);
    let started = Instant::now();
    rig.wait("replica-a holds the Lease", 60, |r| lease(&r.api).is_some_and(|(h, _)| h == "replica-a"));
    let _b = rig.controller_as("replica-b", "replica-b", &flags);
    // The first node change: its layout label no longer the one every node started with.
    let changed = |r: &Rig| {
        r.api.store().all("nodes").iter().any(|n| n["metadata"]["labels"][LAYOUT].as_str() != Some("all-3g.40gb"))
    };
    rig.wait("a node changes", 60, changed);
    let first_change = started.elapsed();
    // Watch the Lease for as long again as a batch and its writes took, at least 10 s.
    let until = Instant::now() + first_change.max(Duration::from_secs(10));
    while Instant::now() < until {
        let (holder, transitions) = lease(&api).expect("the Lease");
        assert_eq!((holder.as_str(), transitions), ("replica-a", 0), "the Lease changed hands");
        std::thread::sleep(Duration::from_millis(100));
    }
    let standby_writes: Vec<String> = api
        .store()
        .identities
        .iter()
        .filter(|i| i.is_write() && i.user.as_deref() == Some("replica-b"))
        .map(|i| format!("{} {}", i.method, i.path))
        .collect();
    assert!(standby_writes.is_empty(), "the standby wrote: {standby_writes:?}");
    // Events: at most the cap per batch, the rest counted as dropped.
    let m = rig.metrics("replica-a");
    let (batches, dropped) =
        (metric(&m, "gpupart_controller_batches_total"), metric(&m, "gpupart_controller_events_dropped_total"));
    let events = api.store().all("events").len() as u64;
    assert!(batches >= 1 && events <= CAP * batches, "{events} Events in {batches} batches, cap {CAP}");
    assert!(dropped > 0, "500 pods in one batch, cap 50: some are dropped\n{m}");
    assert!(rig.log("replica-a").matches("became the leader").count() == 1, "{}", rig.log("replica-a"));
    println!(
        "{NODES} nodes, {PODS} pods: first node change after {:.1} s, {batches} batches, {events} Events, {dropped} dropped, 0 Lease transitions",
        first_change.as_secs_f64()
    );
}

/// Lease writes refused with `429 TooManyRequests` (API Priority and Fairness shedding the
/// leader's flow) while the leader is busy posting Events: it stops writing once its renew
/// deadline passes, and every write of its successor comes after its last one.
#[test]
fn a_leader_whose_lease_writes_are_refused_stops_writing_before_another_takes_over() {
    // More pods than the first changes serve: each left waiting gets a NotServed Event, posted one
    // by one, so the leader is still writing when its Lease writes start being refused.
    let api = cluster(20, 400);
    api.delay_writes(Duration::from_millis(20));
    let rig = Rig::bare(api.clone());
    let flags = ["--lease-duration", "3s", "--events-per-batch", "1000"];
    let _a = rig.controller_as("replica-a", "replica-a", &flags);
    rig.wait("replica-a posts Events", 60, |r| r.api.store().all("events").len() >= 20);
    let _b = rig.controller_as("replica-b", "replica-b", &flags);
    rig.wait("replica-b stands by", 30, |r| r.log("replica-b").contains("standing by"));
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases", LAYOUTS.0);
    let from = api.store().identities.len();
    api.throttle("replica-a", &leases);
    rig.wait("replica-b takes the Lease", 30, |r| lease(&r.api).is_some_and(|(h, _)| h == "replica-b"));
    rig.wait("replica-b writes", 30, |r| {
        r.api.store().identities[from..]
            .iter()
            .any(|i| i.is_write() && i.user.as_deref() == Some("replica-b") && !i.path.starts_with(&leases))
    });
    api.unthrottle();
    let store = api.store();
    let writes: Vec<(usize, &str, &str)> = store.identities[from..]
        .iter()
        .enumerate()
        .filter(|(_, i)| i.is_write() && !i.path.starts_with(&leases))
        .map(|(k, i)| (k, i.user.as_deref().unwrap_or(""), i.path.as_str()))
        .collect();
    let first_b = writes.iter().find(|(_, u, _)| *u == "replica-b").map(|(k, _, _)| *k).expect("replica-b wrote");
    let a_after: Vec<&(usize, &str, &str)> =
        writes.iter().filter(|(k, u, _)| *u == "replica-a" && *k > first_b).collect();
    assert!(a_after.is_empty(), "replica-a wrote after replica-b had started: {a_after:?}");
    assert!(
        writes.iter().any(|(_, u, _)| *u == "replica-a"),
        "replica-a was still writing when its Lease writes were refused"
    );
    drop(store);
    assert_eq!(lease(&api).map(|(_, t)| t), Some(1), "one transition");
    let log = rig.log("replica-a");
    assert!(log.contains("stopped leading: the Lease was not renewed within the renew deadline"), "{log}");
}

/// A leader stopped with SIGTERM (a rolling update, a drained node) gives the Lease up, as
/// client-go's `ReleaseOnCancel` does: the standby leads within its retry period instead of
/// waiting out the lease duration (60 s here).
#[test]
fn a_leader_stopped_with_sigterm_releases_the_lease_to_the_standby() {
    let api = cluster(5, 0);
    let rig = Rig::bare(api.clone());
    let flags = ["--lease-duration", "60s"];
    let a = rig.controller_as("replica-a", "replica-a", &flags);
    rig.wait("replica-a holds the Lease", 60, |r| lease(&r.api).is_some_and(|(h, _)| h == "replica-a"));
    let _b = rig.controller_as("replica-b", "replica-b", &flags);
    rig.wait("replica-b stands by", 30, |r| r.log("replica-b").contains("standing by"));
    std::process::Command::new("kill").args(["-TERM", &a.0.id().to_string()]).status().unwrap();
    rig.wait("replica-a releases the Lease", 30, |r| r.log("replica-a").contains("released the Lease"));
    // Well within the 60 s the Lease would otherwise hold.
    rig.wait("replica-b takes the Lease", 30, |r| lease(&r.api).is_some_and(|(h, _)| h == "replica-b"));
    assert_eq!(lease(&api).map(|(_, t)| t), Some(1), "one transition");
}
