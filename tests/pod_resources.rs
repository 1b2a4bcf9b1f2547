//! The kubelet's PodResources as a second busy signal (both backends): a MIG device allocated to
//! a pod, with no process on it, survives a layout change that would otherwise remove it, and the
//! refusal names the pod; an allocation made between planning and the first destructive call is
//! caught; a GPU a pod holds whole is not switched into MIG; an allocated MPS slot keeps its
//! daemon; `--force` overrides; an absent socket is reported and changes nothing else.

#[macro_use]
mod support;

use support::apiserver::ApiServer;
use support::kube_agent::{reason, start, wait_event, wait_state, LAYOUT, NODE};
use support::pod_resources::FakePodResources;
use support::{example_config, Backend, Node};

on_both_backends!(
    allocated_idle_instance_survives_and_the_refusal_names_the_pod,
    allocation_between_plan_and_change_is_caught,
    whole_gpu_and_mps_slot_allocations_are_respected,
    agent_names_the_pod_in_the_event_and_reports_a_missing_socket
);

const MIG_RES: &str = "nvidia.com/mig-1g.10gb";

/// A node in `all-1g.10gb`, and the MIG UUID of the 1g.10gb at slice 4 (all-balanced removes it).
fn node_with_1g(b: Backend) -> (Node, String) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    node.apply(&example_config(), "all-1g.10gb");
    let s = node.load();
    let gi = s.gpus[0].gpu_instances.iter().find(|g| g.placement.start == 4).unwrap();
    let uuid = gi.compute_instances[0].uuid.clone();
    (node, uuid)
}

fn mig_uuids(node: &Node) -> Vec<String> {
    node.status()["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["uuid"].as_str().unwrap().to_string())
        .collect()
}

fn allocated_idle_instance_survives_and_the_refusal_names_the_pod(b: Backend) {
    let (node, uuid) = node_with_1g(b);
    let pods = FakePodResources::start(&node.pod_resources_socket());
    pods.set(vec![("serving", "llm-0", "vllm", MIG_RES.to_string(), uuid.clone())]);
    pods.set_allocatable(vec![(MIG_RES.to_string(), uuid.clone()), (MIG_RES.to_string(), "MIG-other".to_string())]);
    let cfg = example_config();
    let before = node.load();
    let out = node.apply_result(&cfg, "all-balanced").failed();
    assert!(out.all().contains("is allocated to pod serving/llm-0/vllm (nvidia.com/mig-1g.10gb)"), "{}", out.all());
    assert!(out.all().contains(&uuid), "{}", out.all());
    assert_eq!(node.load(), before, "nothing changed");
    // status -o json shows the allocation and that the source was read.
    let s = node.status();
    assert_eq!(s["pod_resources"]["available"], true);
    assert_eq!(s["pod_resources"]["allocations"], 1);
    assert_eq!(s["pod_resources"]["allocatable"], 2);
    let inst =
        s["gpus"][0]["instances"].as_array().unwrap().iter().find(|i| i["uuid"] == uuid.as_str()).unwrap().clone();
    assert_eq!(inst["busy"], true);
    assert_eq!(inst["pods"][0]["pod"], "llm-0");
    // A layout that can keep it keeps it (minimal diff around the allocation).
    let keep = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 3, 3g.40gb: 1}\n";
    let kf = node.config("keep.yaml", keep);
    node.apply(&kf, "c");
    assert!(mig_uuids(&node).contains(&uuid), "the allocated MIG device survived");
    // --force overrides.
    node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "--force"]).ok();
    assert!(!mig_uuids(&node).contains(&uuid));
}

fn allocation_between_plan_and_change_is_caught(b: Backend) {
    let (node, uuid) = node_with_1g(b);
    let pods = FakePodResources::start(&node.pod_resources_socket());
    // The first read (planning) sees nothing; the kubelet admits a pod before the change starts.
    pods.script(vec![vec![], vec![("serving", "late", "llm", MIG_RES.to_string(), uuid.clone())]]);
    let before = node.load();
    let out = node.apply_result(&example_config(), "all-balanced").failed();
    assert!(out.all().contains("serving/late/llm"), "{}", out.all());
    assert!(pods.calls() >= 3, "planned, re-read, planned again: {} reads", pods.calls());
    assert_eq!(node.load(), before, "nothing changed");
}

fn whole_gpu_and_mps_slot_allocations_are_respected(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1,V100-SXM2-32GB:1");
    let status = node.status();
    let (a100, v100) = (
        status["gpus"][0]["uuid"].as_str().unwrap().to_string(),
        status["gpus"][1]["uuid"].as_str().unwrap().to_string(),
    );
    let text = "version: v1\nmig-configs:\n  mig:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {3g.40gb: 2}\n  mps:\n    - devices: [1]\n      mig-enabled: false\n      mps: {replicas: 2}\n  plain:\n    - devices: [1]\n      mig-enabled: false\n";
    let cfg = node.config("c.yaml", text);
    let pods = FakePodResources::start(&node.pod_resources_socket());
    pods.set(vec![("train", "tp-0", "trainer", "nvidia.com/gpu".to_string(), a100.clone())]);
    let out = node.apply_result(&cfg, "mig").failed();
    assert!(
        out.all().contains("allocated to pod train/tp-0/trainer (nvidia.com/gpu); a GPU a pod holds is never switched"),
        "{}",
        out.all()
    );
    assert_eq!(node.status()["gpus"][0]["mig_mode"]["current"], false);
    // An allocated MPS slot keeps its daemon through a change that would stop it.
    pods.set(vec![]);
    node.apply(&cfg, "mps");
    let pid = node.mps_pid(&v100);
    pods.set(vec![("serving", "small", "llm", "gpupart.io/mps".to_string(), format!("{v100}::1"))]);
    let out = node.apply_result(&cfg, "plain").failed();
    assert!(out.all().contains("slots allocated to pod serving/small/llm (gpupart.io/mps)"), "{}", out.all());
    assert_eq!(node.mps_pid(&v100), pid);
}

fn agent_names_the_pod_in_the_event_and_reports_a_missing_socket(b: Backend) {
    let (node, uuid) = node_with_1g(b);
    let api = ApiServer::start(NODE);
    api.label(LAYOUT, Some("all-1g.10gb"));
    // No PodResources socket yet: the agent goes on with NVML processes only.
    let port = support::baremetal::free_port();
    let addr = format!("127.0.0.1:{port}");
    let agent = start(&node, &api, &["--metrics-interval", "1h", "--metrics-addr", &addr]);
    wait_state(&api, "success", "all-1g.10gb");
    let metrics = support::http_get(port, "/metrics");
    assert!(metrics.contains("gpupart_pod_resources_up 0"), "{metrics}");
    let s = node.status();
    assert_eq!(s["pod_resources"]["available"], false);
    assert!(s["pod_resources"]["error"].as_str().unwrap().contains("does not exist"), "{}", s["pod_resources"]);
    drop(agent);
    let pods = FakePodResources::start(&node.pod_resources_socket());
    pods.set(vec![("serving", "llm-0", "vllm", MIG_RES.to_string(), uuid.clone())]);
    let _agent = start(&node, &api, &["--metrics-interval", "1h"]);
    api.label(LAYOUT, Some("all-balanced"));
    wait_state(&api, "failed", "all-balanced");
    assert!(reason(&api).contains("serving/llm-0/vllm"), "{}", reason(&api));
    let note = wait_event(&api, "ReconfigureFailed", "serving/llm-0/vllm (nvidia.com/mig-1g.10gb)");
    assert!(note.contains(&uuid), "{note}");
    assert!(mig_uuids(&node).contains(&uuid));
    // The node summary names the pod holding the instance.
    let gpus = api.state().annotations.get("gpupart.io/gpus").cloned().unwrap_or_default();
    let held = gpupart::fleet::current::holders_from_annotation(&gpus);
    assert_eq!(held.values().cloned().collect::<Vec<_>>(), vec![vec!["serving/llm-0".to_string()]], "{gpus}");
    // The pod goes: the retry applies the layout.
    pods.set(vec![]);
    wait_state(&api, "success", "all-balanced");
}
