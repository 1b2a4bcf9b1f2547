//! `gpupart agent` in Kubernetes mode, end to end: the real binary against the in-repo API test
//! server (real HTTP) and the fake NVML (and the simulator), driven by node-label changes.

#[macro_use]
mod support;

use std::time::{Duration, Instant};
use support::apiserver::ApiServer;
use support::kube_agent::{reason, start, start_logging, start_with, wait_event, wait_state, LAYOUT, NODE, STATE};
use support::{example_config, Backend, Node};

on_both_backends!(
    label_changes_reconfigure_and_report,
    bad_input_and_busy_instances_fail_clearly,
    survives_api_failures_and_stays_quiet,
    absent_label_changes_nothing_and_foreign_layouts_fail,
    the_write_that_says_success_carries_the_new_summary,
    resyncs_and_restarts_publish_nothing_new,
    an_api_server_restart_is_followed_within_seconds,
    an_outage_while_pausing_waits_instead_of_failing
);

/// With `--pause-gpu-clients`, the API going away while the agent waits for a client to stop
/// is not a failed change: the GPUs stay untouched, the state stays `pending`, and the change
/// completes once the API answers again, with the clients restored.
fn an_outage_while_pausing_waits_instead_of_failing(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let api = ApiServer::start(NODE);
    api.label(PLUGIN, Some("true"));
    api.put("pods", pod("stuck-monitor", PLUGIN));
    let log = node.dir.path().join("agent.log");
    let extra = ["--resync-interval", "1h", "--pause-gpu-clients", "--pause-timeout", "1h"];
    let _agent = start_logging(&node, &api, &extra, &log);
    let before = node.load();
    api.label(LAYOUT, Some("all-1g.10gb"));
    wait_until("the client is paused", || api.get_label(PLUGIN).as_deref() == Some("paused-for-mig-change"));
    api.go_down();
    api.delete("pods", "gpu-operator", "stuck-monitor"); // the client stops meanwhile
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node.load(), before, "no GPU changed while the API was away");
    api.come_back();
    wait_state(&api, "success", "all-1g.10gb");
    wait_until("the client label is restored", || {
        api.get_label(PLUGIN).as_deref() == Some("true")
            && !api.state().annotations.contains_key("gpupart.io/paused-clients")
    });
    let s = api.state();
    assert!(s.patches.iter().all(|p| p["metadata"]["labels"][STATE] != "failed"), "never failed: {:?}", s.patches);
    assert!(s.events.iter().all(|e| e["reason"] != "ReconfigureFailed"), "{:?}", s.events);
    let waited = s.patches.iter().any(|p| {
        p["metadata"]["annotations"]["gpupart.io/state-reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("waiting for the Kubernetes API"))
    });
    assert!(waited, "the pending state said what it waits for");
}

/// After an API-server restart (connections dropped and refused for 3 s, old resourceVersions
/// expired), a label change made right after it answers again is applied within seconds: the
/// watch re-lists at once on 410 and reconnects at least every second. The outage is logged
/// once per loop at WARN, with no ERROR lines.
fn an_api_server_restart_is_followed_within_seconds(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let api = ApiServer::start(NODE);
    let log = node.dir.path().join("agent.log");
    let _agent = start_logging(&node, &api, &["--resync-interval", "1h"], &log);
    api.label(LAYOUT, Some("all-1g.10gb"));
    wait_state(&api, "success", "all-1g.10gb");
    api.go_down();
    std::thread::sleep(Duration::from_secs(3));
    api.come_back();
    let t = Instant::now();
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "success", "all-balanced");
    let took = t.elapsed();
    println!("label -> success after the API server came back: {} ms", took.as_millis());
    // Was 21.5-29.9 s on a real kube-apiserver (a backoff step, then a re-list after the 410).
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(api.state().expired_sent >= 1, "the watch resumed from its old resourceVersion and got 410");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("watching the node: the Kubernetes API does not answer").count(), 1, "{text}");
    assert!(text.contains("watching the node: the Kubernetes API answers again"), "{text}");
    assert!(!text.contains("ERROR"), "{text}");
}

/// (node writes, Events) so far.
fn published(api: &ApiServer) -> (usize, usize) {
    let s = api.state();
    (s.patches.len(), s.events.len())
}

/// A change is one `pending` and one `success` (writes and Events); resyncs that find the layout
/// applied, and a restarted agent, write nothing and emit no Event.
fn resyncs_and_restarts_publish_nothing_new(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let api = ApiServer::start(NODE);
    let agent = start(&node, &api, &["--resync-interval", "200ms"]);
    std::thread::sleep(Duration::from_millis(600));
    let idle = published(&api);
    api.label(LAYOUT, Some("all-1g.10gb"));
    wait_state(&api, "success", "all-1g.10gb");
    let reason_after_change = reason(&api);
    assert!(reason_after_change.starts_with("applied 'all-1g.10gb' in "), "{reason_after_change}");
    std::thread::sleep(Duration::from_millis(1000)); // five resync intervals
    let after = published(&api);
    let reasons: Vec<String> =
        api.state().events.iter().map(|e| e["reason"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(reasons, ["ReconfigureStarted", "Reconfigured"], "one Event per transition");
    assert_eq!(after.0 - idle.0, 2, "writes for one change (pending, success) and five resyncs");
    assert_eq!(reason(&api), reason_after_change, "a resync keeps the reason of the change");
    // A restarted agent finds its state on the node and leaves it.
    drop(agent);
    let _agent = start(&node, &api, &["--resync-interval", "200ms"]);
    let gets = || api.state().identities.iter().filter(|i| i.method == "GET").count();
    let before = gets();
    let deadline = Instant::now() + Duration::from_secs(10);
    while gets() < before + 2 {
        assert!(Instant::now() < deadline, "the restarted agent never read the node");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(published(&api), after, "a restart writes nothing and emits no Event");
    assert_eq!(reason(&api), reason_after_change);
    println!(
        "change + 5 resyncs: {} writes, {} Events; restart + 5 resyncs: 0 writes, 0 Events",
        after.0 - idle.0,
        after.1 - idle.1
    );
}

/// The Node never shows `success` next to the previous layout's summary: the write that sets
/// the state carries the new `gpupart.io/gpus` and `gpupart.io/free-full-gpus`, even with a long
/// rate limit for summary-only writes.
fn the_write_that_says_success_carries_the_new_summary(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let api = ApiServer::start(NODE);
    api.label(LAYOUT, Some("all-balanced"));
    let _agent = start(&node, &api, &["--annotation-min-interval", "1h"]);
    wait_state(&api, "success", "all-balanced");
    for (layout, instances, free) in [("all-1g.10gb", 7, "false"), ("all-disabled", 0, "true")] {
        api.label(LAYOUT, Some(layout));
        wait_state(&api, "success", layout);
        let s = api.state();
        let write = s
            .patches
            .iter()
            .rev()
            .find(|p| p["metadata"]["labels"][STATE] == "success")
            .expect("a write that sets success")
            .clone();
        drop(s);
        assert_eq!(write["metadata"]["annotations"]["gpupart.io/state-layout"], layout);
        let gpus: serde_json::Value = serde_json::from_str(
            write["metadata"]["annotations"]["gpupart.io/gpus"].as_str().expect("summary in the same write"),
        )
        .unwrap();
        let layout_len = gpus[0]["layout"].as_array().map_or(0, Vec::len);
        assert_eq!(layout_len, instances, "{layout}: {gpus}");
        assert_eq!(write["metadata"]["labels"]["gpupart.io/free-full-gpus"], free, "{layout}");
    }
}

fn absent_label_changes_nothing_and_foreign_layouts_fail(b: Backend) {
    let node = Node::with(b, "A30-24GB:1,V100-SXM2-16GB:1");
    let api = ApiServer::start(NODE);
    let before = node.load();
    let _agent = start(&node, &api, &["--resync-interval", "200ms"]);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(api.get_label(STATE), None, "no label: no state written");
    assert!(api.state().events.is_empty(), "no label: no events");
    assert!(api.writes() <= 1, "at most the one node-summary write");
    assert_eq!(node.load(), before);
    // A layout whose entries select none of this node's GPUs (A100 device filters on an A30 node).
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "failed", "all-balanced");
    assert!(reason(&api).contains("has no entry for this node's GPUs (A30-24GB, V100-SXM2-16GB)"), "{}", reason(&api));
    assert_eq!(node.load(), before);
}

fn label_changes_reconfigure_and_report(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let api = ApiServer::start(NODE);
    // The label is set before the agent starts: it must reconcile at start.
    api.label(LAYOUT, Some("all-balanced"));
    let _agent = start(&node, &api, &["--resync-interval", "1h", "--annotation-min-interval", "100ms"]);
    wait_state(&api, "success", "all-balanced");
    let cfg = example_config();
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();
    // The node summary: per-GPU layout, creatable counts, fragmentation, and a selectable label.
    let deadline = Instant::now() + Duration::from_secs(20);
    let gpus = loop {
        let v = api.state().annotations.get("gpupart.io/gpus").cloned().unwrap_or_default();
        if v.contains("3g.40gb@4") {
            break v;
        }
        assert!(Instant::now() < deadline, "no node summary: {v}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let parsed: serde_json::Value = serde_json::from_str(&gpus).unwrap();
    assert_eq!(parsed[0]["layout"], serde_json::json!(["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]), "{gpus}");
    assert_eq!(parsed[0]["largest"], "none");
    let frag: serde_json::Value = serde_json::from_str(&api.state().annotations["gpupart.io/fragmentation"]).unwrap();
    assert_eq!(frag["unallocatedGpus"], 0.0);
    assert_eq!(api.get_label("gpupart.io/free-full-gpus").as_deref(), Some("false"));
    wait_event(&api, "ReconfigureStarted", "all-balanced");
    wait_event(&api, "Reconfigured", "created 8 GPU instances");
    assert_eq!(api.get_label(LAYOUT).as_deref(), Some("all-balanced"), "the layout label is only read");
    // A node driven by simulated GPUs says so; one driven through NVML does not.
    let simulated = api.get_label("gpupart.io/simulated");
    assert_eq!(simulated.as_deref(), (b == Backend::Sim).then_some("true"), "{simulated:?}");

    // A second change keeps what it can: the 3g.40gb and a 2g.20gb per GPU survive.
    let uuids = |n: &Node| -> Vec<String> {
        n.load()
            .gpus
            .iter()
            .flat_map(|g| g.gpu_instances.iter().flat_map(|gi| gi.compute_instances.iter().map(|c| c.uuid.clone())))
            .collect()
    };
    let before = uuids(&node);
    api.label(LAYOUT, Some("mixed-3g-2g"));
    wait_state(&api, "success", "mixed-3g-2g");
    let after = uuids(&node);
    assert_eq!(before.iter().filter(|u| after.contains(u)).count(), 4, "2 MIG devices kept per GPU");
    node.run(&["assert", "-f", &cfg, "-c", "mixed-3g-2g"]).ok();

    // API requests of one reconcile (label change → success), by method. Reported, not asserted.
    wait_event(&api, "Reconfigured", "mixed-3g-2g");
    let r0 = api.state().requests.len();
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "success", "all-balanced");
    wait_event(&api, "Reconfigured", "all-balanced: applied");
    std::thread::sleep(Duration::from_millis(300));
    let reqs: Vec<(String, String)> = api.state().requests[r0..].to_vec();
    println!("{b:?}: API requests for one reconcile: {:?}", reqs);

    // Latency of label → success, 20 changes (no op delay). Reported, not asserted.
    let mut times = Vec::new();
    for i in 0..20 {
        let layout = if i % 2 == 0 { "all-balanced" } else { "mixed-3g-2g" };
        let t = Instant::now();
        api.label(LAYOUT, Some(layout));
        wait_state(&api, "success", layout);
        times.push(t.elapsed());
    }
    times.sort();
    println!("{b:?}: label -> success latency over 20 changes: median {:?}, max {:?}", times[10], times[19]);
}

fn bad_input_and_busy_instances_fail_clearly(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-1g.10gb");
    let api = ApiServer::start(NODE);
    api.label(LAYOUT, Some("all-1g.10gb"));
    let _agent = start(&node, &api, &["--resync-interval", "1h"]);
    wait_state(&api, "success", "all-1g.10gb");
    let before = node.load();
    api.label(LAYOUT, Some("bogus"));
    wait_state(&api, "failed", "bogus");
    assert!(reason(&api).contains("unknown layout 'bogus'"), "{}", reason(&api));
    wait_event(&api, "ReconfigureFailed", "unknown layout 'bogus'");
    assert_eq!(node.load(), before, "nothing touched");

    let gi = node.load().gpus[0].gpu_instances.iter().find(|g| g.placement.start == 4).unwrap().id;
    node.attach(0, gi, 4242);
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "failed", "all-balanced");
    assert!(reason(&api).contains("used by pid 4242"), "{}", reason(&api));
    wait_event(&api, "ReconfigureFailed", "4242");
    // The force annotation is honoured for the next change and removed afterwards (the driver
    // still refuses to destroy the busy instance, so the change keeps failing).
    api.annotate("gpupart.io/force-reconfigure", Some("true"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.state().annotations.contains_key("gpupart.io/force-reconfigure") {
        assert!(Instant::now() < deadline, "force annotation not removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The process ends: a retry (not a label change) brings success.
    let mut s = node.load();
    s.gpus[0].gpu_instances.iter_mut().for_each(|g| g.compute_instances.iter_mut().for_each(|c| c.processes.clear()));
    node.save(&s);
    wait_state(&api, "success", "all-balanced");
}

fn survives_api_failures_and_stays_quiet(b: Backend) {
    let node = Node::with(b, "H100-SXM5-80GB:1");
    let api = ApiServer::start(NODE);
    api.label(LAYOUT, Some("all-1g.10gb"));
    api.fail_next([500, 503, 500]);
    api.expire_watches(2);
    let _agent = start(&node, &api, &["--resync-interval", "300ms"]);
    wait_state(&api, "success", "all-1g.10gb");
    // Dropped watches, expired watches and 5xx on writes: the next label change still lands.
    api.drop_watches();
    api.expire_watches(1);
    api.fail_next([500, 502]);
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "success", "all-balanced");
    // Steady state: resyncs every 300 ms, no writes.
    std::thread::sleep(Duration::from_millis(500));
    let writes = api.writes();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(api.writes(), writes, "API writes at steady state");
}

const PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
const DCGM: &str = "nvidia.com/gpu.deploy.dcgm-exporter";
const GFD: &str = "nvidia.com/gpu.deploy.gpu-feature-discovery";

fn pod(name: &str, selector: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "gpu-operator"},
        "spec": {"nodeName": NODE, "nodeSelector": {selector: "true"}, "containers": []},
    })
}

/// Plays the GPU Operator's DaemonSet controller: a pod leaves when its selector label is not
/// `true` and comes back when it is, except pods named `stuck-*`. Records every paused value seen.
fn operand_controller(
    api: std::sync::Arc<ApiServer>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            {
                let labels = api.state().labels;
                for (k, v) in &labels {
                    if v == "paused-for-mig-change" && !seen.contains(k) {
                        seen.push(k.clone());
                    }
                }
                let mut pods = api.pods();
                for p in &pods {
                    let name = p["metadata"]["name"].as_str().unwrap_or_default();
                    let sel = p["spec"]["nodeSelector"].as_object().unwrap();
                    let keep = name.starts_with("stuck")
                        || sel.keys().all(|k| labels.get(k).map(String::as_str) == Some("true"));
                    if !keep {
                        api.delete("pods", "gpu-operator", name);
                    }
                }
                pods.retain(|p| {
                    api.get("pods", "gpu-operator", p["metadata"]["name"].as_str().unwrap_or_default()).is_some()
                });
                for (name, key) in [("device-plugin", PLUGIN), ("dcgm-exporter", DCGM)] {
                    let present = pods.iter().any(|p| p["metadata"]["name"] == name);
                    if !present && labels.get(key).map(String::as_str) == Some("true") {
                        api.put("pods", pod(name, key));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        seen
    })
}

fn deploy_labels(api: &ApiServer) -> (Option<String>, Option<String>, Option<String>, bool) {
    let s = api.state();
    (
        s.labels.get(PLUGIN).cloned(),
        s.labels.get(DCGM).cloned(),
        s.labels.get(GFD).cloned(),
        s.annotations.contains_key("gpupart.io/paused-clients"),
    )
}

fn restored(api: &ApiServer) -> bool {
    deploy_labels(api) == (Some("true".into()), Some("true".into()), Some("false".into()), false)
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pauses_gpu_clients_and_always_restores_them() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let node = Node::with(Backend::Sim, "A100-SXM4-80GB:1");
    let api = Arc::new(ApiServer::start(NODE));
    for (k, v) in [(PLUGIN, "true"), (DCGM, "true"), (GFD, "false")] {
        api.label(k, Some(v));
    }
    api.put("pods", pod("device-plugin", PLUGIN));
    api.put("pods", pod("dcgm-exporter", DCGM));
    let stop = Arc::new(AtomicBool::new(false));
    let controller = operand_controller(api.clone(), stop.clone());

    // Success: paused during the change, restored after; `false` labels are left alone.
    let fail = node.fail_env("nvmlDeviceCreateGpuInstanceWithPlacement:1:NVML_ERROR_UNKNOWN");
    let cfg = example_config();
    let spawn = |timeout: &str, env: &[(&str, &str)]| {
        let extra = ["--resync-interval", "1h", "--pause-gpu-clients", "--pause-timeout", timeout];
        start_with(&node, &api, &extra, env)
    };
    {
        // The first attempt fails after pausing (injected NVML error), the retry succeeds.
        let _agent = spawn("10s", &[(fail[0].0, fail[0].1.as_str())]);
        api.label(LAYOUT, Some("all-balanced"));
        wait_event(&api, "ReconfigureFailed", "NVML_ERROR_UNKNOWN");
        wait_state(&api, "success", "all-balanced");
        wait_until("labels are restored after failure and success", || restored(&api));
    }
    // Timeout: a client that never stops fails the change, with the labels restored.
    api.put("pods", pod("stuck-monitor", DCGM));
    {
        let _agent = spawn("1s", &[]);
        api.label(LAYOUT, Some("mixed-3g-2g"));
        wait_state(&api, "failed", "mixed-3g-2g");
        assert!(reason(&api).contains("waiting for gpu-operator/stuck-monitor to stop"), "{}", reason(&api));
        wait_until("labels are restored after a timeout", || restored(&api));
    }
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();

    // Restart: killed while clients are paused (a stuck client keeps it waiting); the next agent
    // restores them first.
    api.put("pods", pod("stuck-monitor", DCGM));
    {
        let agent = spawn("1h", &[]);
        api.label(LAYOUT, Some("all-1g.10gb"));
        wait_until("clients are paused", || deploy_labels(&api).3);
        drop(agent); // SIGKILL while waiting
        assert!(deploy_labels(&api).3, "still paused after the kill");
    }
    api.delete("pods", "gpu-operator", "stuck-monitor");
    let _agent = spawn("10s", &[]);
    wait_until("a restarted agent restores the paused labels", || {
        restored(&api) || api.get_label(STATE).as_deref() == Some("pending")
    });
    wait_state(&api, "success", "all-1g.10gb");
    wait_until("labels restored", || restored(&api));
    stop.store(true, Ordering::SeqCst);
    let seen = controller.join().unwrap();
    assert!(
        seen.contains(&PLUGIN.to_string()) && seen.contains(&DCGM.to_string()) && !seen.contains(&GFD.to_string()),
        "{seen:?}"
    );
    // Every request names the agent (User-Agent), every write its field manager: the paused
    // labels show `gpupart` as their manager, never `unknown`.
    let s = api.state();
    let writes: Vec<_> = s.identities.iter().filter(|i| i.is_write()).collect();
    assert!(writes.len() > 10, "{writes:?}");
    for w in &writes {
        assert_eq!(w.field_manager.as_deref(), Some("gpupart"), "{w:?}");
    }
    let agent = concat!("gpupart/", env!("CARGO_PKG_VERSION"));
    assert!(s.identities.iter().all(|i| i.user_agent.as_deref() == Some(agent)), "{:?}", s.identities);
    for key in [PLUGIN, DCGM, "gpupart.io/paused-clients"] {
        assert_eq!(s.last_writer.get(key).map(String::as_str), Some("gpupart"), "{key}");
    }
}

/// `--node-name` naming a Node the cluster does not have: the agent stops at start with one line
/// naming the node and the server, and writes nothing (no endless patching of a missing Node).
#[test]
fn an_agent_whose_node_does_not_exist_stops_at_start_and_writes_nothing() {
    let node = Node::with(Backend::Sim, "A100-SXM4-80GB:1");
    let api = ApiServer::empty();
    let log = node.dir.path().join("agent.log");
    let mut agent = start_logging(&node, &api, &[], &log);
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "still running: {}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "{text}");
    assert_eq!(text.matches(&format!("node {NODE} does not exist at http")).count(), 1, "{text}");
    let writes = api.writes_since(0);
    assert!(writes.is_empty(), "{writes:?}");
}
