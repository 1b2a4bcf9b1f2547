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
    // Applying a Node document would create a node that does not exist: none is in the stream.
    assert_eq!(kinds, ["ConfigMap", "ConfigMap"], "{kinds:?}");
    let policy = docs.iter().find(|d| d["metadata"]["name"] == "descheduler-policy-configmap").unwrap();
    let policy: serde_json::Value = serde_saphyr::from_str(policy["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(policy["kind"], "DeschedulerPolicy");
    let plugins = policy["profiles"][0]["pluginConfig"].to_string();
    for p in ["RemovePodsViolatingNodeAffinity", "RemovePodsViolatingNodeTaints"] {
        assert!(plugins.contains(p), "{p}: {plugins}");
    }
    // No balancing: LowNodeUtilization would spread GPU pods onto the nearly idle nodes.
    assert!(policy["profiles"][0]["plugins"]["balance"].is_null(), "{policy}");
    assert!(!plugins.contains("LowNodeUtilization"), "{plugins}");
    let cm = docs.iter().find(|d| d["metadata"]["name"] == "gpupart-config").unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let checked = gpupart(&["validate", "--strict", "-f", config.to_str().unwrap()], &[]).ok();
    assert!(checked.stdout.contains("0 warning(s)"), "{}", checked.all());
    // An idle GPU of a shared node keeps MIG on with no devices, and the config says why.
    let cfg_text = cm["data"]["config.yaml"].as_str().unwrap();
    let empty_entries = cfg_text.matches("mig-devices: {}").count();
    assert!(empty_entries > 0);
    assert_eq!(cfg_text.matches("# idle in the shared pool: MIG stays on").count(), empty_entries, "{cfg_text}");
    // Every node's label, set by the kubectl script, names a layout of the config.
    let text = std::fs::read_to_string(&config).unwrap();
    let layouts = labelled(&run_script(&example("plan-mixed.yaml"), &[], &[]).0);
    assert_eq!(layouts.len(), 8, "{layouts:?}");
    for (_, l) in &layouts {
        assert!(text.contains(&format!("  {l}:\n")), "{l}");
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

/// Runs `plan -o kubectl` for `file` (with `extra` arguments) under `sh`, with a stand-in
/// `kubectl` that records every call and, as kubectl does, refuses a node not in `existing`
/// (`existing` empty: every node exists). Returns the recorded calls and the script's exit code.
fn run_script(file: &str, extra: &[&str], existing: &[&str]) -> (Vec<String>, i32) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["plan", "-f", file, "-o", "kubectl"];
    args.extend_from_slice(extra);
    let script = gpupart(&args, &[]).ok().stdout;
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    let log = dir.path().join("calls");
    let known = existing.join(" ");
    let stand_in = format!(
        "#!/bin/sh\necho \"$*\" >> {}\nif [ \"$1 $2\" = \"apply --server-side\" ]; then cat > /dev/null; exit 0; fi\n\
         known=\"{known}\"\nif [ -n \"$known\" ]; then case \" $known \" in *\" $3 \"*) ;; *) echo \"Error from server (NotFound): nodes \\\"$3\\\" not found\" >&2; exit 1;; esac; fi\n",
        log.display()
    );
    let bin = dir.path().join("kubectl");
    std::fs::write(&bin, stand_in).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("sh").arg("-c").arg(&script).env("PATH", path).output().unwrap();
    let calls = std::fs::read_to_string(&log).unwrap_or_default().lines().map(String::from).collect();
    (calls, out.status.code().unwrap_or(-1))
}

/// (node, layout) of every `kubectl label node` call.
fn labelled(calls: &[String]) -> Vec<(String, String)> {
    calls
        .iter()
        .filter_map(|c| {
            let rest = c.strip_prefix("label node ")?;
            let node = rest.split_whitespace().next()?.to_string();
            let layout = rest.split_whitespace().find_map(|w| w.strip_prefix("nvidia.com/mig.config="))?;
            Some((node, layout.to_string()))
        })
        .collect()
}

#[test]
fn the_kubectl_script_patches_existing_nodes_and_never_creates_one() {
    let (calls, code) = run_script(&example("plan-mixed.yaml"), &[], &[]);
    assert_eq!(code, 0, "{calls:?}");
    assert!(calls[0].starts_with("apply --server-side --field-manager=gpupart-plan -f -"), "{calls:?}");
    // The dedicated node is tainted; the others lose the taint if they had it.
    assert!(calls.contains(&"taint node h100-0 --overwrite gpu-dedicated=true:NoSchedule".to_string()), "{calls:?}");
    assert!(calls.contains(&"taint node h100-1 gpu-dedicated-".to_string()), "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("label node edge-l4-a --overwrite ") && c.contains("gpu-pool=mps")));
    // A node kubectl does not know stops the script: nothing is created, the error is kubectl's.
    let (calls, code) = run_script(&example("plan-mixed.yaml"), &[], &["edge-l4-a", "edge-l4-b"]);
    assert_ne!(code, 0);
    assert_eq!(labelled(&calls).len(), 1, "stops at the first unknown node: {calls:?}");
}

#[test]
fn counted_nodes_take_the_real_names_of_todays_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let demand = dir.path().join("d.yaml");
    std::fs::write(
        &demand,
        "fleet:\n  - {name: a100, count: 2, gpu: A100-SXM4-80GB, gpus: 1}\ndemand:\n  - {name: e, profile: 1g.10gb, replicas: 3}\n",
    )
    .unwrap();
    let node = Node::new("A100-SXM4-80GB:1");
    let status = node.status();
    let today = dir.path().join("today.json");
    std::fs::write(&today, serde_json::json!({"gpu-node-7": status, "gpu-node-3": status}).to_string()).unwrap();
    let (calls, code) = run_script(demand.to_str().unwrap(), &["--current", today.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{calls:?}");
    let nodes: Vec<String> = labelled(&calls).into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes, ["gpu-node-3", "gpu-node-7"], "{calls:?}");
}

#[test]
fn mps_goes_to_gpus_without_mig_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.yaml");
    std::fs::write(
        &f,
        "fleet:\n  - {name: a100, count: 1, gpu: A100-SXM4-80GB, gpus: 8}\n  - {name: t4, count: 1, gpu: T4-16GB, gpus: 8}\n\
         demand:\n  - {name: small, memory: 4Gi, sharing: mps, replicas: 6}\n",
    )
    .unwrap();
    let doc = plan_json(f.to_str().unwrap(), &[]);
    let nodes: Vec<(&str, &str)> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["pool"].as_str().unwrap()))
        .collect();
    assert_eq!(nodes, [("a100-0", "idle"), ("t4-0", "mps")], "{doc}");
    assert!(doc["decisions"][0]["reason"].as_str().unwrap().contains("on GPUs without MIG (T4-16GB)"), "{doc}");
    // The example: whisper's slots on an L4 node, no H100 touched for them.
    let doc = plan_json(&example("plan-mixed.yaml"), &[]);
    let whisper: Vec<&str> = doc["placements"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["model"] == "whisper")
        .map(|p| p["node"].as_str().unwrap())
        .collect();
    assert_eq!(whisper.len(), 10);
    assert!(whisper.iter().all(|n| n.starts_with("edge-l4-")), "{whisper:?}");
    // Only without room on GPUs without MIG does a MIG GPU (MIG off) take slots, and the reason says why.
    std::fs::write(
        &f,
        "fleet:\n  - {name: a100, count: 1, gpu: A100-SXM4-80GB, gpus: 8}\n  - {name: t4, count: 1, gpu: T4-16GB, gpus: 1}\n\
         demand:\n  - {name: big, memory: 10Gi, sharing: mps, replicas: 4}\n",
    )
    .unwrap();
    let doc = plan_json(f.to_str().unwrap(), &[]);
    let reason = doc["decisions"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("A100-SXM4-80GB with MIG turned off") && reason.contains("T4-16GB"), "{reason}");
}

#[test]
fn over_subscribed_demand_reports_a_bound_no_higher_than_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.yaml");
    std::fs::write(
        &f,
        "fleet:\n  - {name: a100, count: 10, gpu: A100-SXM4-80GB, gpus: 8}\n\
         demand:\n  - {name: s, profile: 1g.10gb, replicas: 1000}\n  - {name: m, profile: 3g.40gb, replicas: 100}\n",
    )
    .unwrap();
    let doc = plan_json(f.to_str().unwrap(), &[]);
    let s = &doc["summary"]["search"];
    assert!(s["lower_bound_gpus"].as_u64() <= s["mig_gpus"].as_u64(), "{s}");
    assert_eq!(s["mig_gpus"], 80, "{s}");
    assert!(!doc["unplaced"].as_array().unwrap().is_empty());
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
