//! GPU health in label mode end to end (both backends): a mixed node (2×A100 with MIG, 2×V100
//! with MPS) runs the agent against the API test server and a fake kubelet. An XID 79 injected
//! on GPU 1 (a 3g.40gb and room for more) takes its capacity out of the node annotation (`"unhealthy": "XID 79"`), an XID 79 on
//! GPU 3 turns its MPS slots Unhealthy at the kubelet, each with a Warning Event and
//! `gpupart_gpu_healthy 0`; an application XID 43 on GPU 0 changes nothing; a new layout leaves
//! the fenced GPUs as they are while GPU 0 changes; the operator's annotation brings them back
//! (Event, annotation removed, slots Healthy, the layout applied there too). On bare metal,
//! `status`, `export` and `health` show the fence and `health --recover` lifts it. An XID that
//! names one MIG device fences that device only: it is reported, its GPU is left as it is when a
//! new layout would change it, the other GPU changes. A GPU that falls off the bus is fenced
//! (`GPU is lost`, still listed as last seen) and back once it answers again (its reset observed).

#[macro_use]
mod support;

use std::time::{Duration, Instant};
use support::apiserver::ApiServer;
use support::kube_agent::{start_config, wait_event, wait_state, LAYOUT, NODE};
use support::kubelet::FakeKubelet;
use support::{Backend, Node};

on_both_backends!(
    an_xid_fences_a_gpu_until_the_operator_recovers_it,
    on_bare_metal_status_shows_the_fence_and_the_health_verb_lifts_it,
    an_xid_naming_a_mig_device_keeps_it_and_its_gpu_as_they_are_while_the_rest_serves,
    a_lost_gpu_is_fenced_and_back_once_it_answers_again
);

const CONFIG: &str = r#"version: v1
mig-configs:
  mixed:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {3g.40gb: 1}
    - devices: [2, 3]
      mig-enabled: false
      mps: {replicas: 2}
  small:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {1g.10gb: 7}
    - devices: [2, 3]
      mig-enabled: false
      mps: {replicas: 3}
"#;

/// The agent's `gpupart.io/gpus` entry for GPU `i`.
fn gpu_entry(api: &ApiServer, i: usize) -> serde_json::Value {
    let text = api.state().annotations.get("gpupart.io/gpus").cloned().unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text).map(|v| v[i].clone()).unwrap_or_default()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

fn gis(node: &Node, gpu: usize) -> usize {
    node.status()["gpus"][gpu]["instances"].as_array().map_or(0, Vec::len)
}

fn an_xid_fences_a_gpu_until_the_operator_recovers_it(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2,V100-SXM2-32GB:2");
    let api = ApiServer::start(NODE);
    let kubelet = FakeKubelet::start(&node.dir.path().join("device-plugins"));
    let cfg = node.config("mixed.yaml", CONFIG);
    api.label(LAYOUT, Some("mixed"));
    let port = support::baremetal::free_port();
    let addr = format!("127.0.0.1:{port}");
    let extra = ["--annotation-min-interval", "50ms", "--metrics-interval", "200ms", "--metrics-addr", &addr];
    let _agent = start_config(&node, &api, &cfg, &extra, &[]);
    wait_state(&api, "success", "mixed");
    let all_healthy = |d: &[(String, String)]| d.len() == 4 && d.iter().all(|(_, h)| h == "Healthy");
    kubelet.wait_devices("4 healthy slots", all_healthy);
    let has_room = |g: serde_json::Value| g["creatable"].as_object().is_some_and(|m| !m.is_empty());
    wait_for("GPU 1's capacity in the annotation", || has_room(gpu_entry(&api, 1)));
    let v1 = node.status()["gpus"][3]["uuid"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set

    // An application's XID changes nothing.
    node.inject_xid(0, 43, None);
    // A device XID on the A100 GPU 1: its capacity leaves the annotation.
    let t = node.inject_xid(1, 79, None);
    wait_for("GPU 1 unhealthy in the annotation", || gpu_entry(&api, 1)["unhealthy"] == "XID 79");
    let to_annotation = t.elapsed();
    let g1 = gpu_entry(&api, 1);
    assert_eq!((g1["largest"].as_str(), g1["creatable"].as_object().map(|m| m.len())), (Some("none"), Some(0)), "{g1}");
    assert!(gpu_entry(&api, 0)["unhealthy"].is_null(), "XID 43 is an application's: {}", gpu_entry(&api, 0));
    assert!(has_room(gpu_entry(&api, 0)));
    let note = wait_event(&api, "GpuUnhealthy", "GPU 1 is unhealthy (XID 79)");
    println!("Event GpuUnhealthy: {note}");
    // A device XID on the V100 GPU 3: its MPS slots turn Unhealthy at the kubelet.
    let t = node.inject_xid(3, 79, None);
    let unhealthy_slots = |d: &[(String, String)]| {
        d.len() == 4 && d.iter().all(|(id, h)| (h == "Unhealthy") == id.starts_with(v1.as_str()))
    };
    kubelet.wait_devices("GPU 3's slots unhealthy, GPU 2's healthy", unhealthy_slots);
    let to_kubelet = t.elapsed();
    println!("XID 79 → node annotation in {to_annotation:?}, → Unhealthy at the kubelet in {to_kubelet:?}");
    let metrics = support::http_get(port, "/metrics");
    for want in [
        "gpupart_gpu_healthy{gpu=\"1\"} 0",
        "gpupart_gpu_healthy{gpu=\"0\"} 1",
        "gpupart_gpu_xid_errors_total{gpu=\"0\",xid=\"43\"} 1",
    ] {
        wait_for(want, || support::http_get(port, "/metrics").contains(want));
    }
    assert!(metrics.contains("gpupart_gpu_xid_errors_total{gpu=\"1\",xid=\"79\"} 1"), "{metrics}");
    let record = std::fs::read_to_string(node.health_file()).unwrap();
    assert!(record.contains("XID 79"), "{record}");

    // A new layout changes GPU 0 and leaves the fenced GPU 1 as it is.
    api.label(LAYOUT, Some("small"));
    wait_state(&api, "success", "small");
    assert_eq!((gis(&node, 0), gis(&node, 1)), (7, 1), "GPU 1 keeps its 3g.40gb");
    let reason = support::kube_agent::reason(&api);
    assert!(reason.contains("GPU 1 is unhealthy (XID 79), left as it is"), "{reason}");

    // The operator brings GPUs 1 and 3 back; a value that does not read is refused by name.
    api.annotate("gpupart.io/recover-gpus", Some("1,x"));
    wait_event(&api, "GpuRecoveryRefused", "'x' is not a GPU index");
    wait_for("the refused annotation removed", || !api.state().annotations.contains_key("gpupart.io/recover-gpus"));
    api.annotate("gpupart.io/recover-gpus", Some("1,3"));
    let note = wait_event(&api, "GpuRecovered", "GPU 1, 3 healthy again");
    println!("Event GpuRecovered: {note}");
    wait_for("the annotation removed", || !api.state().annotations.contains_key("gpupart.io/recover-gpus"));
    wait_for("GPU 1 gets the layout", || gis(&node, 1) == 7);
    wait_for("GPU 1 healthy in the annotation", || gpu_entry(&api, 1)["unhealthy"].is_null());
    kubelet.wait_devices("6 healthy slots", |d| d.len() == 6 && d.iter().all(|(_, h)| h == "Healthy"));
    assert!(!std::fs::read_to_string(node.health_file()).unwrap().contains("XID 79"));
}

fn on_bare_metal_status_shows_the_fence_and_the_health_verb_lifts_it(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = support::baremetal::start(&node, &layout, &["--poll-interval", "100ms", "--resync-interval", "1h"]);
    agent.wait_for("success", "all-balanced");
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    node.inject_xid(1, 48, None);
    wait_for("GPU 1 unhealthy in status", || node.status()["gpus"][1]["unhealthy"]["reason"] == "XID 48");
    assert!(node.status()["gpus"][0]["unhealthy"].is_null());
    let shown = node.run(&["health"]).ok().stdout;
    assert!(shown.starts_with("GPU 1 is unhealthy (XID 48) since 20"), "{shown}");
    let table = node.run(&["status"]).ok().stdout;
    assert!(table.contains("UNHEALTHY: GPU 1 is unhealthy (XID 48) (gpupart health --recover 1)"), "{table}");
    let exported = node.run(&["export"]).ok().stdout;
    assert!(exported.starts_with("# gpupart: GPU 1 is unhealthy (XID 48)\nversion: v1"), "{exported}");

    // A new layout reaches GPU 0 only.
    std::fs::write(&layout, "all-1g.10gb\n").unwrap();
    let s = agent.wait_for("success", "all-1g.10gb");
    assert!(s["reason"].as_str().unwrap().contains("GPU 1 is unhealthy (XID 48), left as it is"), "{s}");
    assert_eq!((gis(&node, 0), gis(&node, 1)), (7, 4), "GPU 1 keeps all-balanced");

    // Bad input names the offending item and changes nothing.
    let bad = node.run(&["health", "--recover", "1,x"]).failed();
    assert!(bad.stderr.contains("'x' is not a GPU index"), "{}", bad.stderr);
    assert!(node.status()["gpus"][1]["unhealthy"].is_object());
    assert_eq!(node.run(&["health", "--recover", "0,1"]).ok().stdout, "GPU 1: recovered\nGPU 0: was not unhealthy\n");
    wait_for("GPU 1 gets the layout", || gis(&node, 1) == 7);
    assert_eq!(
        node.run(&["health"]).ok().stdout.lines().next(),
        Some(format!("no unhealthy GPUs ({})", node.health_file().display())).as_deref()
    );
}

const MIG_CONFIG: &str = r#"version: v1
mig-configs:
  three:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.40gb: 1, 1g.10gb: 2}
  ones:
    - devices: all
      mig-enabled: true
      mig-devices: {1g.10gb: 7}
"#;

fn an_xid_naming_a_mig_device_keeps_it_and_its_gpu_as_they_are_while_the_rest_serves(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let api = ApiServer::start(NODE);
    let cfg = node.config("mig.yaml", MIG_CONFIG);
    api.label(LAYOUT, Some("three"));
    let _agent = start_config(&node, &api, &cfg, &["--annotation-min-interval", "50ms"], &[]);
    wait_state(&api, "success", "three");
    let status = node.status();
    let three =
        status["gpus"][0]["instances"].as_array().unwrap().iter().find(|i| i["profile"] == "3g.40gb").unwrap().clone();
    let id = |k: &str| three[k].as_u64().unwrap() as u32;
    let start = three["placement"]["start"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    node.inject_xid(0, 94, Some((id("gpu_instance_id"), id("compute_instance_id"))));
    let device = format!("3g.40gb@{start}");
    wait_for("the faulty device in the annotation", || gpu_entry(&api, 0)["unhealthyDevices"][&device] == "XID 94");
    assert!(gpu_entry(&api, 0)["unhealthy"].is_null(), "the rest of GPU 0 serves on");
    let note = wait_event(&api, "MigDeviceUnhealthy", &format!("GPU 0's MIG device {device}"));
    println!("Event MigDeviceUnhealthy: {note}");
    assert_eq!(node.status()["gpus"][0]["unhealthy_mig_devices"][0]["profile"], "3g.40gb");

    // A layout that would destroy it leaves GPU 0 as it is; GPU 1 changes.
    api.label(LAYOUT, Some("ones"));
    wait_state(&api, "success", "ones");
    assert_eq!((gis(&node, 0), gis(&node, 1)), (3, 7));
    let reason = support::kube_agent::reason(&api);
    assert!(
        reason.contains(&format!("GPU 0's MIG device {device}")) && reason.contains("GPU 0 left as it is"),
        "{reason}"
    );

    api.annotate("gpupart.io/recover-gpus", Some("all"));
    wait_event(&api, "GpuRecovered", "GPU 0 healthy again");
    wait_for("GPU 0 gets the layout", || gis(&node, 0) == 7);
    wait_for("the annotation clears", || gpu_entry(&api, 0)["unhealthyDevices"].is_null());
}

fn a_lost_gpu_is_fenced_and_back_once_it_answers_again(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let api = ApiServer::start(NODE);
    let cfg = node.config("mig.yaml", MIG_CONFIG);
    api.label(LAYOUT, Some("three"));
    let _agent =
        start_config(&node, &api, &cfg, &["--annotation-min-interval", "50ms", "--metrics-interval", "200ms"], &[]);
    wait_state(&api, "success", "three");
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    node.set_lost(1, true);
    wait_for("GPU 1 lost in the annotation", || gpu_entry(&api, 1)["unhealthy"] == "GPU is lost");
    let g1 = gpu_entry(&api, 1);
    assert_eq!(g1["layout"].as_array().map(Vec::len), Some(3), "listed as last seen: {g1}");
    assert_eq!(g1["largest"], "none");
    assert!(gpu_entry(&api, 0)["unhealthy"].is_null());
    wait_event(&api, "GpuUnhealthy", "GPU 1 is unhealthy (GPU is lost)");
    // A new layout reaches GPU 0; the lost GPU is left as it is.
    api.label(LAYOUT, Some("ones"));
    wait_state(&api, "success", "ones");
    assert_eq!(gis(&node, 0), 7);
    let reason = support::kube_agent::reason(&api);
    assert!(reason.contains("GPU 1 is unhealthy (GPU is lost), left as it is"), "{reason}");
    // Its reset: it answers again, and is back without anyone saying so.
    node.set_lost(1, false);
    let note =
        wait_event(&api, "GpuRecovered", "GPU 1 healthy again: it answers again after it was lost (reset observed)");
    println!("Event GpuRecovered: {note}");
    wait_for("GPU 1 healthy in the annotation", || gpu_entry(&api, 1)["unhealthy"].is_null());
    assert!(!std::fs::read_to_string(node.health_file()).unwrap().contains("lost"));
    wait_for("GPU 1 gets the layout", || gis(&node, 1) == 7);
}
