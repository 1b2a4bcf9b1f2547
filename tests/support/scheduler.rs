//! A binding stand-in that plays the scheduler and the pods' containers: every 100 ms it binds
//! each pending GPU pod to a node whose free partitions — as the agent reports them in
//! `gpupart.io/gpus`, less what it already gave away — fit the request, and starts a "process"
//! on each device it gives (in that node's simulated GPUs, so the agent sees the device busy);
//! a pod that fits nowhere gets `PodScheduled=False, reason Unschedulable`. Nodes whose agent is
//! reconfiguring are skipped (NVIDIA's device plugin is paused then), and the dedicated taint
//! keeps pods without its toleration away. Required inter-pod affinity and anti-affinity are
//! filtered as kube-scheduler's InterPodAffinity plugin does, against the pods bound before and
//! those bound earlier in the same pass. Deleting a pod stops its processes. Started with
//! kubelets, it also plays each node's kubelet PodResources API (a fake over the node's real
//! socket): `List` names the devices of every pod bound there, as the kubelet reports the device
//! plugin's allocations (MIG devices by UUID), until the pod is deleted.

use super::apiserver::{now_rfc3339, ApiServer};
use super::pod_resources::{FakePodResources, OwnedAlloc};
use super::Node;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A device given to a pod: (node, GPU index, placement start; `None` for a whole GPU).
type Device = (String, u32, Option<u32>);

/// The stand-in, running until dropped.
pub struct Scheduler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Devices given, by pod (`namespace/name`).
    pub given: Arc<Mutex<BTreeMap<String, Vec<Device>>>>,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Every (resource, count) of a pod's GPU requests (a pod may ask for several; all must come
/// from one node).
fn request(pod: &Value) -> Option<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for c in pod["spec"]["containers"].as_array()? {
        for (k, v) in c["resources"]["limits"].as_object().into_iter().flatten() {
            if k.starts_with("nvidia.com/") {
                out.push((k.clone(), v.as_str()?.parse().ok()?));
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

fn tolerates_dedicated(pod: &Value) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|ts| ts.iter().any(|t| t["key"] == "gpu-dedicated"))
}

fn dedicated(node: &Value) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|ts| ts.iter().any(|t| t["key"] == "gpu-dedicated"))
}

/// Free devices of `resource` on a node: from its annotation, less those given away.
fn free(node: &Value, name: &str, resource: &str, given: &BTreeMap<String, Vec<Device>>) -> Vec<Device> {
    let Some(text) = node["metadata"]["annotations"]["gpupart.io/gpus"].as_str() else { return Vec::new() };
    let gpus: Vec<Value> = serde_json::from_str(text).unwrap_or_default();
    let taken: Vec<&Device> = given.values().flatten().collect();
    let mut out = Vec::new();
    for g in gpus {
        let i = g["i"].as_u64().unwrap_or(0) as u32;
        if resource == "nvidia.com/gpu" {
            let d = (name.to_string(), i, None);
            if g["mode"] == "none" && g["busy"] == false && !taken.contains(&&d) {
                out.push(d);
            }
            continue;
        }
        let profile = resource.trim_start_matches("nvidia.com/mig-");
        for item in g["layout"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            let Some((p, start)) = item.split_once('@') else { continue };
            let d = (name.to_string(), i, start.parse().ok());
            if p == profile && !taken.contains(&&d) && !item.ends_with('*') {
                out.push(d);
            }
        }
    }
    out
}

impl Scheduler {
    /// Starts binding pods on `api`'s nodes; `nodes` maps node names to their simulated GPUs.
    pub fn start(api: Arc<ApiServer>, nodes: BTreeMap<String, Arc<Node>>) -> Self {
        Self::run(api, nodes, false)
    }

    /// [`Scheduler::start`], also serving each node's PodResources socket.
    pub fn start_with_kubelets(api: Arc<ApiServer>, nodes: BTreeMap<String, Arc<Node>>) -> Self {
        Self::run(api, nodes, true)
    }

    fn run(api: Arc<ApiServer>, nodes: BTreeMap<String, Arc<Node>>, kubelets: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let given: Arc<Mutex<BTreeMap<String, Vec<Device>>>> = Arc::default();
        let (s, g) = (stop.clone(), given.clone());
        let kubelets: BTreeMap<String, FakePodResources> = if kubelets {
            nodes.iter().map(|(n, node)| (n.clone(), FakePodResources::start(&node.pod_resources_socket()))).collect()
        } else {
            BTreeMap::new()
        };
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                step(&api, &nodes, &g);
                if !kubelets.is_empty() {
                    report(&api, &nodes, &g, &kubelets);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { stop, thread: Some(thread), given }
    }
}

/// Each node's PodResources `List`: the devices given to the pods that still exist.
fn report(
    api: &ApiServer,
    nodes: &BTreeMap<String, Arc<Node>>,
    given: &Mutex<BTreeMap<String, Vec<Device>>>,
    kubelets: &BTreeMap<String, FakePodResources>,
) {
    let pods: Vec<Value> = api.store().all("pods").into_iter().cloned().collect();
    let given = given.lock().unwrap();
    let mut per_node: BTreeMap<&str, Vec<OwnedAlloc>> = kubelets.keys().map(|n| (n.as_str(), Vec::new())).collect();
    for p in &pods {
        let (Some(devices), Some(asks)) = (given.get(&key(p)), request(p)) else { continue };
        let resources = asks.iter().flat_map(|(r, n)| std::iter::repeat_n(r.clone(), *n as usize));
        for (d, resource) in devices.iter().zip(resources) {
            let (Some(node), Some(list)) = (nodes.get(&d.0), per_node.get_mut(d.0.as_str())) else { continue };
            let Some(id) = device_id(node, d) else { continue };
            let ns = p["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
            list.push((ns, name, "server".into(), resource, id));
        }
    }
    for (n, allocs) in per_node {
        kubelets[n].set_owned(allocs);
    }
}

/// The id the device plugin gives a device: the MIG device's UUID, or the GPU's.
fn device_id(node: &Node, d: &Device) -> Option<String> {
    let s = node.load();
    let gpu = s.gpus.iter().find(|g| g.index == d.1)?;
    match d.2 {
        None => Some(gpu.uuid.clone()),
        Some(start) => {
            let gi = gpu.gpu_instances.iter().find(|gi| gi.placement.start == start)?;
            Some(gi.compute_instances.first()?.uuid.clone())
        }
    }
}

fn pid_of(key: &str, k: usize) -> u32 {
    10_000 + (key.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))) % 50_000) + k as u32
}

/// Starts (or stops) a pod's process on a device of a simulated node.
fn process(node: &Node, d: &Device, pid: u32, on: bool) {
    let mut s = node.load();
    let Some(gpu) = s.gpus.iter_mut().find(|g| g.index == d.1) else { return };
    let procs = match d.2 {
        None => &mut gpu.processes,
        Some(start) => match gpu.gpu_instances.iter_mut().find(|gi| gi.placement.start == start) {
            Some(gi) if !gi.compute_instances.is_empty() => &mut gi.compute_instances[0].processes,
            _ => return,
        },
    };
    if on {
        procs.push(gpupart::mig::sim::SimProcess { pid, name: "model-server".into(), used_memory_mib: 1024 });
    } else {
        procs.retain(|p| p.pid != pid);
    }
    node.save(&s);
}

fn step(api: &ApiServer, nodes: &BTreeMap<String, Arc<Node>>, given: &Mutex<BTreeMap<String, Vec<Device>>>) {
    let (pods, kube_nodes) = {
        let s = api.store();
        (
            s.all("pods").into_iter().cloned().collect::<Vec<_>>(),
            s.all("nodes").into_iter().cloned().collect::<Vec<_>>(),
        )
    };
    let mut given = given.lock().unwrap();
    // Pods deleted: their processes stop.
    let live: Vec<String> = pods.iter().map(key).collect();
    let gone: Vec<String> = given.keys().filter(|k| !live.contains(k)).cloned().collect();
    for k in gone {
        for (n, d) in given.remove(&k).unwrap_or_default().iter().enumerate() {
            if let Some(node) = nodes.get(&d.0) {
                process(node, d, pid_of(&k, n), false);
            }
        }
    }
    // The scheduler's queue: higher priority first, then older.
    let mut queue: Vec<&Value> = pods.iter().filter(|p| p["spec"]["nodeName"].is_null()).collect();
    queue.sort_by_key(|p| {
        let priority = p["spec"]["priority"].as_i64().unwrap_or(0);
        (std::cmp::Reverse(priority), p["metadata"]["creationTimestamp"].as_str().unwrap_or("").to_string(), key(p))
    });
    // Pods on nodes, as (pod, node name): the bound ones, then each one bound in this pass.
    let mut placed: Vec<(Value, String)> =
        pods.iter().filter_map(|p| Some((p.clone(), p["spec"]["nodeName"].as_str()?.to_string()))).collect();
    for pod in queue {
        let Some(asks) = request(pod) else { continue };
        let resource = asks[0].0.clone();
        let k = key(pod);
        // As the scheduler's filters: node selector, CPU against allocatable less what the bound
        // pods request, then the device plugin's free devices. Each refusal in its words.
        let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
        let mut refuse = |why: String| *refusals.entry(why).or_default() += 1;
        let fit = kube_nodes.iter().find_map(|n| {
            let name = n["metadata"]["name"].as_str()?.to_string();
            let state = n["metadata"]["labels"]["nvidia.com/mig.config.state"].as_str().unwrap_or("");
            // While the agent changes it, its device plugin offers nothing.
            if matches!(state, "pending" | "rebooting") {
                refuse(format!("Insufficient {resource}"));
                return None;
            }
            if dedicated(n) && !tolerates_dedicated(pod) {
                refuse("node(s) had untolerated taint {gpu-dedicated: true}".into());
                return None;
            }
            if let Some(t) = untolerated(pod, n) {
                refuse(format!("node(s) had untolerated taint {{{t}}}"));
                return None;
            }
            let labels = &n["metadata"]["labels"];
            let selected =
                pod["spec"]["nodeSelector"].as_object().is_none_or(|sel| sel.iter().all(|(k, v)| labels[k] == *v));
            if !selected || !affinity_matches(pod, labels) {
                refuse("node(s) didn't match Pod's node affinity/selector".into());
                return None;
            }
            let on_nodes: Vec<(&Value, &Value)> = placed
                .iter()
                .filter_map(|(p, on)| Some((p, kube_nodes.iter().find(|k| k["metadata"]["name"] == on.as_str())?)))
                .collect();
            if let Some(why) = inter_pod_refusal(pod, n, &on_nodes) {
                refuse(why.into());
                return None;
            }
            let on_node: Vec<&Value> = pods.iter().filter(|p| p["spec"]["nodeName"] == name.as_str()).collect();
            for (what, of_pod) in [("cpu", pod_cpu as fn(&Value) -> u64), ("memory", pod_memory)] {
                let alloc = n["status"]["allocatable"][what].as_str().and_then(|q| {
                    if what == "cpu" {
                        cpu_millis(q)
                    } else {
                        memory_bytes(q)
                    }
                });
                if let Some(alloc) = alloc {
                    let used: u64 = on_node.iter().map(|p| of_pod(p)).sum();
                    if of_pod(pod) > alloc.saturating_sub(used) {
                        refuse(format!("Insufficient {what}"));
                        return None;
                    }
                }
            }
            let mut devices = Vec::new();
            for (r, count) in &asks {
                let f = free(n, &name, r, &given);
                if f.len() < *count as usize {
                    refuse(format!("Insufficient {r}"));
                    return None;
                }
                devices.extend_from_slice(&f[..*count as usize]);
            }
            Some((name, devices))
        });
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
        match fit {
            Some((node, devices)) => {
                for (n, d) in devices.iter().enumerate() {
                    process(&nodes[&node], d, pid_of(&k, n), true);
                }
                given.insert(k.clone(), devices);
                placed.push((pod.clone(), node.clone()));
                let patch = json!({"spec": {"nodeName": node}, "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]}});
                api.change(|s| {
                    let key = ("pods".to_string(), ns, name);
                    if let Some(mut cur) = s.objects.get(&key).cloned() {
                        super::apiserver::merge(&mut cur, &patch);
                        s.put(key, cur);
                    }
                });
            }
            None => {
                let marked = pod["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "Unschedulable"));
                if !marked {
                    let why: Vec<String> = refusals.iter().map(|(w, n)| format!("{n} {w}")).collect();
                    let message = format!("0/{} nodes are available: {}.", kube_nodes.len(), why.join(", "));
                    let patch = json!({"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable", "message": message, "lastTransitionTime": now_rfc3339()}]}});
                    api.change(|s| {
                        let key = ("pods".to_string(), ns, name);
                        if let Some(mut cur) = s.objects.get(&key).cloned() {
                            super::apiserver::merge(&mut cur, &patch);
                            s.put(key, cur);
                        }
                    });
                }
            }
        }
    }
}

fn key(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or("default"),
        pod["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// A pod asking for `count` of `resource` (`nvidia.com/mig-1g.10gb`, `nvidia.com/gpu`).
pub fn gpu_pod(ns: &str, name: &str, resource: &str, count: u32, dedicated: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"containers": [{"name": "server", "image": "vllm", "resources": {"limits": {resource: count.to_string()}}}]},
        "status": {"phase": "Pending"}
    });
    if dedicated {
        p["spec"]["tolerations"] =
            json!([{"key": "gpu-dedicated", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    }
    p
}

/// A CPU quantity in millicores (`500m`, `2`): the forms these tests write.
fn cpu_millis(q: &str) -> Option<u64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => q.parse::<u64>().ok().map(|c| c * 1000),
    }
}

/// A memory quantity in bytes (`512Mi`, `8Gi`, plain bytes): the forms these tests write.
fn memory_bytes(q: &str) -> Option<u64> {
    for (unit, f) in [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40)] {
        if let Some(n) = q.strip_suffix(unit) {
            return n.parse::<u64>().ok().map(|n| n * f);
        }
    }
    q.parse().ok()
}

/// The sum of a pod's containers' `requests[what]`, read by `parse`.
fn pod_request(pod: &Value, what: &str, parse: fn(&str) -> Option<u64>) -> u64 {
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers.iter().filter_map(|c| c["resources"]["requests"][what].as_str().and_then(parse)).sum()
}

fn pod_cpu(pod: &Value) -> u64 {
    pod_request(pod, "cpu", cpu_millis)
}

fn pod_memory(pod: &Value) -> u64 {
    pod_request(pod, "memory", memory_bytes)
}

/// The first NoSchedule/NoExecute taint of the node (other than the dedicated pool's, judged
/// apart) that no toleration of the pod matches, as `key: value`.
fn untolerated(pod: &Value, node: &Value) -> Option<String> {
    let tolerations = pod["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
    let taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
    taints
        .iter()
        .filter(|t| t["key"] != "gpu-dedicated" && (t["effect"] == "NoSchedule" || t["effect"] == "NoExecute"))
        .find(|t| {
            !tolerations.iter().any(|tol| {
                let key = tol["key"].is_null() && tol["operator"] == "Exists" || tol["key"] == t["key"];
                let value = tol["operator"] == "Exists" || tol["value"] == t["value"];
                let effect = tol["effect"].is_null() || tol["effect"] == t["effect"];
                key && value && effect
            })
        })
        .map(|t| format!("{}: {}", t["key"].as_str().unwrap_or(""), t["value"].as_str().unwrap_or("")))
}

/// Required node affinity (`matchExpressions` with In / NotIn / Exists / DoesNotExist): some term
/// whose every expression holds; no affinity matches every node.
fn affinity_matches(pod: &Value, labels: &Value) -> bool {
    let terms =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let Some(terms) = terms.as_array() else { return true };
    terms.iter().any(|term| {
        term["matchExpressions"].as_array().is_some_and(|exprs| exprs.iter().all(|e| requirement_holds(e, labels)))
    })
}

/// One `{key, operator, values}` requirement (In / NotIn / Exists / DoesNotExist) against labels,
/// as node selector terms and label selectors both read it.
fn requirement_holds(e: &Value, labels: &Value) -> bool {
    let have = labels[e["key"].as_str().unwrap_or("")].as_str();
    let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    match e["operator"].as_str().unwrap_or("") {
        "In" => have.is_some_and(|h| values.contains(&h)),
        "NotIn" => have.is_none_or(|h| !values.contains(&h)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        _ => false,
    }
}

/// The pod's required terms of `kind` (`podAffinity`, `podAntiAffinity`).
fn required_terms(pod: &Value, kind: &str) -> Vec<Value> {
    pod["spec"]["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn namespace_of(pod: &Value) -> &str {
    pod["metadata"]["namespace"].as_str().unwrap_or("default")
}

/// A label selector against labels: no selector selects nothing, `{}` everything.
fn selects(selector: &Value, labels: &Value) -> bool {
    if !selector.is_object() {
        return false;
    }
    let plain = selector["matchLabels"].as_object().into_iter().flatten().all(|(k, v)| labels[k] == *v);
    plain && selector["matchExpressions"].as_array().into_iter().flatten().all(|e| requirement_holds(e, labels))
}

/// Whether the term of a pod in `owner_ns` matches `pod`: its namespaces (none and no selector:
/// the owner's; a namespace selector: any, namespace labels unread here) and its label selector.
fn term_selects(term: &Value, owner_ns: &str, pod: &Value) -> bool {
    let listed: Vec<&str> = term["namespaces"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let ns = namespace_of(pod);
    let in_ns = if term["namespaceSelector"].is_object() {
        true
    } else if listed.is_empty() {
        ns == owner_ns
    } else {
        listed.contains(&ns)
    };
    in_ns && selects(&term["labelSelector"], &pod["metadata"]["labels"])
}

/// kube-scheduler's InterPodAffinity filter for `pod` on `node`, given the pods on nodes: the
/// refusal in its words, or `None`.
fn inter_pod_refusal(pod: &Value, node: &Value, on_nodes: &[(&Value, &Value)]) -> Option<&'static str> {
    let value = |n: &Value, term: &Value| {
        n["metadata"]["labels"][term["topologyKey"].as_str().unwrap_or("")].as_str().map(str::to_string)
    };
    let together = |term: &Value, other: &Value| value(node, term).is_some() && value(node, term) == value(other, term);
    let ns = namespace_of(pod);
    for (q, qn) in on_nodes {
        if required_terms(q, "podAntiAffinity").iter().any(|t| term_selects(t, namespace_of(q), pod) && together(t, qn))
        {
            return Some("node(s) didn't satisfy existing pods anti-affinity rules");
        }
    }
    for t in required_terms(pod, "podAntiAffinity") {
        if on_nodes.iter().any(|(q, qn)| together(&t, qn) && term_selects(&t, ns, q)) {
            return Some("node(s) didn't match pod anti-affinity rules");
        }
    }
    let affinity = required_terms(pod, "podAffinity");
    if affinity.is_empty() {
        return None;
    }
    let refused = Some("node(s) didn't match pod affinity rules");
    if affinity.iter().any(|t| value(node, t).is_none()) {
        return refused;
    }
    let all = |q: &Value| affinity.iter().all(|t| term_selects(t, ns, q));
    if affinity.iter().all(|t| on_nodes.iter().any(|(q, qn)| all(q) && together(t, qn))) {
        return None;
    }
    // The first of a group: no pod matching every term sits on a node with their keys.
    let first = !on_nodes.iter().any(|(q, qn)| all(q) && affinity.iter().any(|t| value(qn, t).is_some()));
    if first && all(pod) {
        None
    } else {
        refused
    }
}
