//! `gpupart plan` end to end: the binary on the examples, its JSON, its `kubectl apply` stream
//! (Kubernetes schemas, the config validating strictly), an agent applying a planned layout on a
//! simulated node, and errors that name the entry and key.

mod support;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use support::{baremetal, gpupart, tool, Node};

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name).to_str().unwrap().to_string()
}

fn plan_json(file: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["plan", "-f", file, "-o", "json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&gpupart(&args, &[]).ok().stdout).unwrap()
}

#[test]
fn the_example_plan_in_json() {
    let doc = plan_json(&example("plan.yaml"), &[]);
    let s = &doc["summary"];
    assert_eq!((s["gpus_used"].as_u64(), s["gpus_idle"].as_u64()), (Some(24), Some(40)), "{s}");
    assert_eq!(s["search"]["method"], "exact");
    assert_eq!(doc["baseline"]["name"], "first-fit");
    assert!(s["fragmentation_ratio"].as_f64().unwrap() <= doc["baseline"]["fragmentation_ratio"].as_f64().unwrap());
    assert_eq!(doc["unplaced"].as_array().unwrap().len(), 0);
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 8);
    let dedicated: Vec<_> = nodes.iter().filter(|n| n["pool"] == "dedicated").collect();
    assert_eq!(dedicated.len(), 2);
    assert!(dedicated.iter().all(|n| n["taints"][0] == "gpu-dedicated=true:NoSchedule"));
    // Every placement names a node of the fleet; 70B replicas take 8 whole GPUs each.
    let p = doc["placements"].as_array().unwrap();
    assert_eq!(p.iter().filter(|x| x["model"] == "llama-70b" && x["profile"] == "whole").count(), 16);
    assert_eq!(p.iter().filter(|x| x["model"] == "llama-13b" && x["profile"] == "3g.40gb").count(), 6);
    assert_eq!(p.iter().filter(|x| x["model"] == "embed" && x["profile"] == "1g.10gb").count(), 10);
    // Headroom changes the choice: with none, 30 GiB still needs 3g.40gb, 16 GiB 1g.20gb.
    let d = plan_json(&example("plan.yaml"), &["--headroom", "0"]);
    assert_eq!(d["decisions"][2]["profile"], "1g.20gb");
}

#[test]
fn the_kubectl_stream_validates_and_an_agent_applies_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpupart(&["plan", "-f", &example("plan-mixed.yaml"), "-o", "yaml"], &[]).ok().stdout;
    let stream = dir.path().join("plan.yaml");
    std::fs::write(&stream, &out).unwrap();
    let (ok, report) = tool("kubernetes-validate", &["--strict", stream.to_str().unwrap()]);
    assert!(ok, "{report}\n{out}");
    let docs = serde_saphyr::from_multiple::<serde_json::Value>(&out).unwrap();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "Node").count(), 8, "{kinds:?}");
    let policy = docs.iter().find(|d| d["metadata"]["name"] == "descheduler-policy-configmap").unwrap();
    let policy: serde_json::Value = serde_saphyr::from_str(policy["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(policy["kind"], "DeschedulerPolicy");
    let plugins = policy["profiles"][0]["pluginConfig"].to_string();
    for p in
        ["RemovePodsViolatingNodeAffinity", "RemovePodsViolatingNodeTaints", "LowNodeUtilization", "nvidia.com/gpu"]
    {
        assert!(plugins.contains(p), "{p}: {plugins}");
    }
    let cm = docs.iter().find(|d| d["metadata"]["name"] == "gpupart-config").unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let checked = gpupart(&["validate", "--strict", "-f", config.to_str().unwrap()], &[]).ok();
    assert!(checked.stdout.contains("0 warning(s)"), "{}", checked.all());
    // Every node's label names a layout of the config.
    let text = std::fs::read_to_string(&config).unwrap();
    let mut layouts = Vec::new();
    for n in docs.iter().filter(|d| d["kind"] == "Node") {
        let l = n["metadata"]["labels"]["nvidia.com/mig.config"].as_str().unwrap().to_string();
        assert!(text.contains(&format!("  {l}:\n")), "{l}");
        layouts.push((n["metadata"]["name"].as_str().unwrap().to_string(), l));
    }
    // The agent on a simulated H100 node follows the shared layout planned for h100-1.
    let (_, shared) = layouts.iter().find(|(n, _)| n == "h100-1").unwrap();
    assert!(shared.starts_with("gpupart-shared"), "{shared}");
    let node = Node::new("H100-SXM5-80GB:8");
    let layout_file = node.dir.path().join("layout");
    std::fs::write(&layout_file, shared).unwrap();
    let agent = baremetal::start_with(&node, config.to_str().unwrap(), &layout_file, &[]);
    agent.wait_for("success", shared);
    let plan = plan_json(&example("plan-mixed.yaml"), &[]);
    let placed = plan["placements"].as_array().unwrap().iter().filter(|p| p["node"] == "h100-1").count();
    let status = node.status();
    let instances: usize =
        status["gpus"].as_array().unwrap().iter().map(|g| g["instances"].as_array().unwrap().len()).sum();
    assert_eq!(instances, placed, "{status}");
}

#[test]
fn errors_name_the_entry_and_key_and_stdin_works() {
    let bad = "fleet:\n  - {name: a, count: 1, gpu: A100-SXM4-80GB, gpus: 8}\ndemand:\n  - {name: ok, memory: 5Gi}\n  - {name: huge, memory: 2Ti}\n";
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpupart"))
        .args(["plan", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bad.as_bytes()).unwrap();
    let out = support::Run::from(child.wait_with_output().unwrap()).failed();
    assert!(out.stderr.contains("<stdin>") && out.stderr.contains("demand[1] 'huge', key 'memory'"), "{}", out.stderr);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.yaml");
    std::fs::write(&f, "fleet:\n  - {name: a, count: 1, gpu: Z100, gpus: 8}\ndemand:\n  - {name: m, memory: 1Gi}\n")
        .unwrap();
    let out = gpupart(&["plan", "-f", f.to_str().unwrap()], &[]).failed();
    assert!(out.stderr.contains("fleet[0] 'a', key 'gpu': unknown GPU model 'Z100'"), "{}", out.stderr);
    let text = gpupart(&["plan", "-f", &example("plan.yaml")], &[]).ok().stdout;
    assert!(text.contains("Summary: 24 of 64 GPUs used") && text.contains("Baseline first-fit"), "{text}");
}

const FLEET_OF_TWO: &str = "fleet:\n  - {name: a, nodes: [gpu-node-1], gpu: A100-SXM4-80GB, gpus: 2}\n  - {name: b, nodes: [gpu-node-2], gpu: A100-SXM4-80GB, gpus: 2}\n\
    demand:\n  - {name: tp, gpus: 2}\n  - {name: embed, profile: 1g.10gb, replicas: 7}\n";

/// Today: gpu-node-1 runs all-1g.10gb with a process in one instance of GPU 0.
fn busy_node() -> Node {
    let node = Node::new("A100-SXM4-80GB:2");
    node.apply(&support::example_config(), "all-1g.10gb").ok();
    let gi = node.status()["gpus"][0]["instances"][2]["gpu_instance_id"].as_u64().unwrap() as u32;
    node.attach(0, gi, 4242);
    node
}

fn check_busy_plan(doc: &serde_json::Value) {
    // The busy GPU stays whole and serves the 7 embeddings; the dedicated replica takes the other
    // node (its 2 × 7 instances go); the idle GPU of gpu-node-1 is emptied; no busy instance is
    // ever destroyed.
    let s = &doc["summary"]["moves"];
    assert_eq!(s["busy_kept"], 1, "{doc}");
    assert_eq!(s["destroyed"], 7 + 2 * 7, "{doc}");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.iter().find(|n| n["name"] == "gpu-node-2").unwrap()["pool"], "dedicated");
    for m in doc["moves"].as_array().unwrap() {
        assert!(!(m["node"] == "gpu-node-1" && m["gpu"] == 0), "the busy GPU moves: {m}");
    }
    assert_eq!(
        doc["placements"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["model"] == "embed" && p["node"] == "gpu-node-1" && p["gpu"] == 0)
            .count(),
        7
    );
}

#[test]
fn current_layouts_from_status_documents() {
    let dir = tempfile::tempdir().unwrap();
    let one = busy_node();
    let two = Node::new("A100-SXM4-80GB:2");
    two.apply(&support::example_config(), "all-1g.10gb").ok();
    let current = dir.path().join("current.json");
    std::fs::write(&current, serde_json::json!({"gpu-node-1": one.status(), "gpu-node-2": two.status()}).to_string())
        .unwrap();
    let demand = dir.path().join("demand.yaml");
    std::fs::write(&demand, FLEET_OF_TWO).unwrap();
    let doc = plan_json(demand.to_str().unwrap(), &["--current", current.to_str().unwrap()]);
    check_busy_plan(&doc);
    // A node of today with another model is refused, naming it.
    let three = Node::new("H100-SXM5-80GB:2");
    std::fs::write(&current, serde_json::json!({"gpu-node-1": three.status()}).to_string()).unwrap();
    let out = gpupart(&["plan", "-f", demand.to_str().unwrap(), "--current", current.to_str().unwrap()], &[]).failed();
    assert!(out.stderr.contains("current 'gpu-node-1', GPU 0: is a H100-SXM5-80GB"), "{}", out.stderr);
}

#[test]
fn current_layouts_and_fragmentation_from_the_cluster() {
    use support::apiserver::ApiServer;
    use support::kube_agent::{start, wait_state, LAYOUT, NODE};
    let node = busy_node();
    let api = ApiServer::start(NODE);
    api.label(LAYOUT, Some("all-1g.10gb"));
    let _agent = start(&node, &api, &[]);
    wait_state(&api, "success", "all-1g.10gb");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !api.state().annotations.get("gpupart.io/gpus").is_some_and(|g| g.contains('*')) {
        assert!(std::time::Instant::now() < deadline, "no busy instance in {:?}", api.state().annotations);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A second node as its agent would publish it: all-1g.10gb, nothing busy.
    let gpus = api.state().annotations["gpupart.io/gpus"].replace('*', "");
    let frag =
        r#"{"ratio":0.5,"fragGpus":0.125,"unallocGpus":0.25,"wholeFreeGpus":0,"workload":"uniform-base-profiles"}"#;
    api.add_node("gpu-node-2", &[("gpupart.io/gpus", &gpus), ("gpupart.io/fragmentation", frag)]);
    api.add_node("cpu-node", &[]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let kc = kubeconfig.to_str().unwrap();
    let demand = dir.path().join("demand.yaml");
    std::fs::write(&demand, FLEET_OF_TWO).unwrap();
    let out =
        gpupart(&["plan", "-f", demand.to_str().unwrap(), "--from-cluster", "-o", "json"], &[("KUBECONFIG", kc)]).ok();
    check_busy_plan(&serde_json::from_str(&out.stdout).unwrap());
    // Agents with another prefix publish elsewhere: read there, today is empty.
    let args =
        ["plan", "-f", demand.to_str().unwrap(), "--from-cluster", "--annotation-prefix", "other.io/", "-o", "json"];
    let doc: serde_json::Value = serde_json::from_str(&gpupart(&args, &[("KUBECONFIG", kc)]).ok().stdout).unwrap();
    assert_eq!(doc["summary"]["moves"]["kept"], 0, "{doc}");
    let out = gpupart(&["frag", "--cluster", "-o", "json"], &[("KUBECONFIG", kc)]).ok();
    let c: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(c["nodes"].as_array().unwrap().len(), 2, "{c}");
    assert_eq!(c["without_agent"], serde_json::json!(["cpu-node"]));
    let published: serde_json::Value =
        serde_json::from_str(&api.state().annotations["gpupart.io/fragmentation"]).unwrap();
    let (f, u) =
        (published["fragmentedGpus"].as_f64().unwrap() + 0.125, published["unallocatedGpus"].as_f64().unwrap() + 0.25);
    assert!((c["fragmentation_ratio"].as_f64().unwrap() - if u > 0.0 { f / u } else { 0.0 }).abs() < 1e-9, "{c}");
    let table = gpupart(&["frag", "--cluster"], &[("KUBECONFIG", kc)]).ok().stdout;
    assert!(
        table.contains("gpu-node-2") && table.contains("total") && table.contains("without a gpupart agent: cpu-node"),
        "{table}"
    );
}
