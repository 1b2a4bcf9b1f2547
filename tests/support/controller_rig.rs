//! A small simulated cluster for `gpupart controller` tests: the multi-object API server, one real
//! agent per node (fake NVML, config from the layouts ConfigMap through the API), the binding
//! stand-in, and controllers started on demand — every process the real binary, killed on drop.

use super::apiserver::ApiServer;
use super::scheduler::Scheduler;
use super::{Backend, Node};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Namespace and name of the layouts ConfigMap (as deploy/controller.yaml and daemonset.yaml
/// name it).
pub const LAYOUTS: (&str, &str) = ("gpupart-system", "gpupart-config");
pub use super::kube_agent::{LAYOUT, STATE};

/// A child process killed on drop.
pub use super::kube_agent::Agent as Proc;

/// The cluster.
pub struct Rig {
    /// The API server.
    pub api: Arc<ApiServer>,
    /// Simulated GPUs per node name.
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// The binding stand-in.
    pub scheduler: Option<Scheduler>,
    agents: Vec<Proc>,
    /// Scratch directory (kubeconfig, controller logs).
    pub dir: tempfile::TempDir,
}

/// Hand-written layouts for the tests.
pub const CONFIG: &str = "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n  all-1g.10gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n  all-3g.40gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n  half-whole:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 3\n    - devices: [1]\n      mig-enabled: false\n  mixed:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 1\n        \"1g.10gb\": 4\n";

impl Rig {
    /// `names.len()` nodes of `spec` GPUs (`A100-SXM4-80GB:2`), each asked for `layout`, with
    /// agents running and settled.
    pub fn start(spec: &str, names: &[&str], layout: &str) -> Self {
        let nodes: Vec<NodeSpec> = names.iter().map(|n| NodeSpec::new(n, layout)).collect();
        Self::start_nodes(spec, &nodes)
    }

    /// Nodes of `spec` GPUs as `nodes` describe them (layout, further labels, taints), with
    /// agents running and settled.
    pub fn start_nodes(spec: &str, specs: &[NodeSpec]) -> Self {
        let api = Arc::new(ApiServer::empty());
        let dir = tempfile::tempdir().unwrap();
        api.put(
            "configmaps",
            json!({"metadata": {"namespace": LAYOUTS.0, "name": LAYOUTS.1}, "data": {"config.yaml": CONFIG}}),
        );
        let mut nodes = BTreeMap::new();
        let mut agents = Vec::new();
        for s in specs {
            let mut labels = s.labels.clone();
            labels[LAYOUT] = json!(s.layout);
            api.put("nodes", json!({"metadata": {"name": s.name, "labels": labels}, "spec": {"taints": s.taints}}));
            let node = Arc::new(Node::with(Backend::Nvml, spec));
            agents.push(spawn_agent(&api, &node, &s.name));
            nodes.insert(s.name.clone(), node);
        }
        let rig = Self { api, nodes, scheduler: None, agents, dir };
        for s in specs {
            rig.wait(&format!("{} settles on {}", s.name, s.layout), 60, |r| r.settled(&s.name, &s.layout));
        }
        rig
    }

    /// Starts the binding stand-in.
    pub fn schedule(&mut self) {
        self.scheduler = Some(Scheduler::start(self.api.clone(), self.nodes.clone()));
    }

    /// Starts the binding stand-in with each node's kubelet PodResources API, so the agents name
    /// the pods holding each instance.
    pub fn schedule_with_kubelets(&mut self) {
        self.scheduler = Some(Scheduler::start_with_kubelets(self.api.clone(), self.nodes.clone()));
    }

    /// Starts a controller with `extra` flags; its log (info) goes to `<dir>/<identity>.log`.
    pub fn controller(&self, identity: &str, extra: &[&str]) -> Proc {
        // Each controller authenticates as `controller` (the RBAC test reads its requests).
        self.controller_as(identity, "controller", extra)
    }

    /// A cluster of `api`'s objects alone: no agents (its nodes carry what agents would publish).
    pub fn bare(api: Arc<ApiServer>) -> Self {
        Self { api, nodes: BTreeMap::new(), scheduler: None, agents: Vec::new(), dir: tempfile::tempdir().unwrap() }
    }

    /// A controller replica authenticating as `user` (to tell the replicas' requests apart).
    pub fn controller_as(&self, identity: &str, user: &str, extra: &[&str]) -> Proc {
        let kubeconfig = self.api.kubeconfig_as(self.dir.path(), user);
        let log = std::fs::File::create(self.dir.path().join(format!("{identity}.log"))).unwrap();
        // The shipped Deployment's flags, then the rig's (quick batches, short lease), then `extra`.
        let mut flags: Vec<(String, Option<String>)> = Vec::new();
        let mut set = |flag: &str, value: Option<&str>| {
            flags.retain(|(f, _)| f != flag);
            flags.push((flag.to_string(), value.map(str::to_string)));
        };
        for arg in deployment_args() {
            let (f, v) = arg.split_once('=').map_or((arg.as_str(), None), |(f, v)| (f, Some(v)));
            set(f, v);
        }
        for (f, v) in [
            ("--metrics-addr", "127.0.0.1:0"),
            ("--batch-window", "300ms"),
            ("--cooldown", "0s"),
            ("--lease-duration", "2s"),
            ("--resync-interval", "300ms"),
            ("--identity", identity),
        ] {
            set(f, Some(v));
        }
        let mut i = 0;
        while i < extra.len() {
            let value = extra.get(i + 1).filter(|v| !v.starts_with("--")).copied();
            set(extra[i], value);
            i += 1 + usize::from(value.is_some());
        }
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpupart"));
        c.arg("controller");
        for (f, v) in flags {
            c.arg(f);
            c.args(v);
        }
        c.env("KUBECONFIG", kubeconfig).env("RUST_LOG", "gpupart=info").stdout(Stdio::null()).stderr(Stdio::from(log));
        Proc(c.spawn().unwrap())
    }

    /// A controller's log so far.
    pub fn log(&self, identity: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{identity}.log"))).unwrap_or_default()
    }

    /// A controller's `/metrics` body (its port from the "serving" log line).
    pub fn metrics(&self, identity: &str) -> String {
        super::metrics_in_log(&self.log(identity))
    }

    /// Whether `node`'s agent reports `layout` applied.
    pub fn settled(&self, node: &str, layout: &str) -> bool {
        let Some(n) = self.api.get("nodes", "", node) else { return false };
        let md = &n["metadata"];
        md["labels"][LAYOUT] == layout
            && md["labels"][STATE] == "success"
            && md["annotations"]["gpupart.io/state-layout"] == layout
            && md["annotations"]["gpupart.io/gpus"].is_string()
    }

    /// Waits up to `secs` for `f`, panicking with `what` and the controllers' logs.
    pub fn wait(&self, what: &str, secs: u64, f: impl Fn(&Rig) -> bool) {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let logs: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| format!("--- {}\n{}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
            .collect();
        let nodes: Vec<Value> = self.api.store().all("nodes").into_iter().map(|n| n["metadata"].clone()).collect();
        panic!("timed out waiting until {what}\nnodes: {nodes:#?}\n{}", logs.join("\n"));
    }

    /// A pod's phase and node.
    pub fn pod(&self, ns: &str, name: &str) -> (String, Option<String>) {
        let p = self.api.get("pods", ns, name).unwrap_or(Value::Null);
        (p["status"]["phase"].as_str().unwrap_or("").into(), p["spec"]["nodeName"].as_str().map(str::to_string))
    }

    /// Each GPU's instances on a node as the agent reports them (`3g.40gb@0*`).
    pub fn layout_of(&self, node: &str) -> Vec<Vec<String>> {
        let n = self.api.get("nodes", "", node).unwrap_or(Value::Null);
        let gpus: Vec<Value> =
            serde_json::from_str(n["metadata"]["annotations"]["gpupart.io/gpus"].as_str().unwrap_or("[]")).unwrap();
        gpus.iter()
            .map(|g| {
                g["layout"].as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect()
            })
            .collect()
    }

    /// The layouts ConfigMap's config.
    pub fn layouts(&self) -> String {
        let cm = self.api.get("configmaps", LAYOUTS.0, LAYOUTS.1).unwrap_or(Value::Null);
        cm["data"]["config.yaml"].as_str().unwrap_or("").to_string()
    }

    /// A ReplicaSet `name` in `ns` (pods labelled `app: name`, asking one `resource` each, opted in
    /// to moves when `movable`), its pods `<name>-a`, `<name>-b`, … each waited for until it runs
    /// on `node`, and a PodDisruptionBudget letting one of them be down.
    pub fn replicas(&self, ns: &str, name: &str, resource: &str, count: usize, movable: bool, node: &str) {
        let annotations = if movable { json!({"gpupart.io/movable": "true"}) } else { json!({}) };
        let metadata = json!({"labels": {"app": name}, "annotations": annotations});
        let uid = format!("uid-rs-{name}");
        let template = super::scheduler::gpu_pod(ns, "x", resource, 1, false);
        self.api.put(
            "replicasets",
            json!({"metadata": {"namespace": ns, "name": name, "uid": uid},
                   "spec": {"replicas": count, "selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": metadata, "spec": template["spec"]}}}),
        );
        for k in 0..count {
            let pod = format!("{name}-{}", char::from(b'a' + k as u8));
            let mut p = super::scheduler::gpu_pod(ns, &pod, resource, 1, false);
            p["metadata"]["labels"] = metadata["labels"].clone();
            p["metadata"]["annotations"] = metadata["annotations"].clone();
            p["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": true}]);
            self.api.put("pods", p);
            self.wait(&format!("{pod} runs on {node}"), 30, |r| {
                r.pod(ns, &pod) == ("Running".into(), Some(node.to_string()))
            });
        }
        self.api.put(
            "poddisruptionbudgets",
            json!({"metadata": {"namespace": ns, "name": name, "generation": 1},
                   "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}}}),
        );
    }

    /// The pods of ReplicaSet `app` bound to `node`.
    pub fn replicas_on(&self, app: &str, node: &str) -> Vec<String> {
        self.api
            .pods()
            .iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app && p["spec"]["nodeName"] == node)
            .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The pods evicted to make room (their `Defragmenting` Events, not the waiting pod's), in
    /// order, with the Events' notes.
    pub fn evicted(&self, waiting: &str) -> Vec<(String, String)> {
        let events = self.api.events().into_iter();
        events.filter(|(on, r, _)| r == "Defragmenting" && on != waiting).map(|(on, _, note)| (on, note)).collect()
    }

    /// Waits until `waiting` (in `ns`) was told why it waits, a moment more, then checks that it
    /// is still Pending, that `running` still run and that no pod was moved.
    pub fn assert_nothing_moved(&self, ns: &str, waiting: &str, running: &[&str]) {
        self.wait(&format!("{waiting} told why it waits"), 30, |r| {
            r.api.events().iter().any(|(on, r, _)| on == waiting && r == "NotServed")
        });
        std::thread::sleep(Duration::from_secs(2));
        for name in running {
            assert_eq!(self.pod(ns, name).0, "Running", "{name}");
        }
        assert_eq!(self.evicted(waiting), Vec::new());
        assert_eq!(self.pod(ns, waiting).0, "Pending");
    }

    /// Stops the agents (before the nodes' directories go).
    pub fn stop_agents(&mut self) {
        self.agents.clear();
    }
}

/// A node of the rig: its name, the layout asked of it, further labels and taints.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The node's name.
    pub name: String,
    /// Its `nvidia.com/mig.config`.
    pub layout: String,
    /// Further labels (a JSON object).
    pub labels: Value,
    /// Its taints (a JSON array).
    pub taints: Value,
}

impl NodeSpec {
    /// A node with no further labels or taints.
    pub fn new(name: &str, layout: &str) -> Self {
        Self { name: name.into(), layout: layout.into(), labels: json!({}), taints: json!([]) }
    }
}

/// The controller container's arguments in deploy/controller.yaml, after the verb.
pub fn deployment_args() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/controller.yaml");
    let docs = serde_saphyr::from_multiple::<Value>(&std::fs::read_to_string(path).unwrap()).unwrap();
    let d = docs.iter().find(|d| d["kind"] == "Deployment").expect("deploy/controller.yaml has a Deployment");
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
    assert_eq!(args[0], "controller");
    args[1..].iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

fn spawn_agent(api: &ApiServer, node: &Node, name: &str) -> Proc {
    // Agents authenticate as `agent` (the RBAC test reads their requests).
    let kubeconfig = api.kubeconfig_as(node.dir.path(), "agent");
    let d = |p: &str| node.dir.path().join(p).to_str().unwrap().to_string();
    let config_map = format!("{}/{}", LAYOUTS.0, LAYOUTS.1);
    let args = [
        "agent",
        "--config-map",
        &config_map,
        "--node-name",
        name,
        "--lock-file",
        &d("agent.lock"),
        "--reboot-guard",
        &d("guard"),
        "--device-plugin-dir",
        &d("device-plugins"),
        "--retry-min",
        "100ms",
        "--retry-max",
        "500ms",
        "--poll-interval",
        "200ms",
        "--metrics-interval",
        "300ms",
        "--annotation-min-interval",
        "100ms",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let log = std::env::var_os("GPUPART_TEST_AGENT_LOG")
        .and_then(|p| std::fs::File::create(format!("{}.{name}", p.to_string_lossy())).ok());
    let stderr = log.map_or_else(Stdio::null, Stdio::from);
    let mut child = node.command(&args, &[("KUBECONFIG", kubeconfig.to_str().unwrap())]);
    Proc(child.stdout(Stdio::null()).stderr(stderr).spawn().unwrap())
}

/// What an agent publishes for 8 idle A100-80GB at `all-3g.40gb` (for nodes without an agent).
pub fn agent_annotations() -> serde_json::Value {
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            json!({"i": i, "uuid": format!("GPU-{i}"), "model": "A100-SXM4-80GB", "mode": "mig",
                   "layout": ["3g.40gb@0", "3g.40gb@4"], "creatable": {}, "largest": "none", "frag": 0.0})
        })
        .collect();
    json!({
        "gpupart.io/gpus": serde_json::to_string(&gpus).unwrap(),
        "gpupart.io/fragmentation": r#"{"ratio":0,"fragmentedGpus":0,"unallocatedGpus":0,"wholeFreeGpus":0,"workload":"uniform-base-profiles"}"#,
        "gpupart.io/state-layout": "all-3g.40gb",
    })
}

/// An API test server holding the layouts ConfigMap as shipped ([`CONFIG`]), for [`Rig::bare`].
pub fn layouts_api() -> Arc<ApiServer> {
    let api = Arc::new(ApiServer::empty());
    api.put(
        "configmaps",
        json!({"metadata": {"namespace": LAYOUTS.0, "name": LAYOUTS.1}, "data": {"config.yaml": CONFIG}}),
    );
    api
}

/// A Node without an agent process carrying what its agent publishes ([`agent_annotations`]),
/// settled at `all-3g.40gb`.
pub fn agent_node(name: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {LAYOUT: "all-3g.40gb", STATE: "success"},
           "annotations": agent_annotations()}, "spec": {}})
}

/// A pending pod in `serving` asking one `resource`, which the scheduler found no room for.
pub fn unschedulable(name: &str, resource: &str) -> Value {
    let mut p = super::scheduler::gpu_pod("serving", name, resource, 1, false);
    p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]);
    p
}
