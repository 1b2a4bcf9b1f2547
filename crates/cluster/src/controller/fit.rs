//! Whether a pod could land on a node apart from its GPUs (pure), as the scheduler's filters
//! judge it: the pod's node selector, its required node affinity, the node's NoSchedule /
//! NoExecute taints against its tolerations, and its CPU and memory requests against what the
//! node has left. The controller changes a node for a pod only where all of these pass.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration};
use std::collections::BTreeMap;

/// A pod's placement constraints besides its GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Constraints {
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `requiredDuringSchedulingIgnoredDuringExecution` terms (any one must match); empty: none.
    pub required_terms: Vec<NodeSelectorTerm>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// Requested CPU in millicores (the largest of the containers' sum and each init container).
    pub cpu_millis: u64,
    /// Requested memory in bytes (likewise).
    pub memory_bytes: u64,
    /// The pod's own labels (what other pods' affinity terms match).
    pub labels: BTreeMap<String, String>,
    /// Required inter-pod affinity and anti-affinity.
    pub terms: super::affinity::PodTerms,
}

/// What a node has for pods besides its GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRoom {
    /// Allocatable CPU in millicores (`None`: not reported, not checked).
    pub cpu_millis: Option<u64>,
    /// Allocatable memory in bytes (`None`: not reported).
    pub memory_bytes: Option<u64>,
    /// CPU requested by the pods bound to it.
    pub cpu_requested: u64,
    /// Memory requested by the pods bound to it.
    pub memory_requested: u64,
}

/// A Kubernetes CPU quantity in millicores (`500m`, `2`, `1.5`).
pub fn cpu_millis(q: &str) -> Option<u64> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    q.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).map(|v| (v * 1000.0).ceil() as u64)
}

/// A Kubernetes memory quantity in bytes (`512Mi`, `2Gi`, `1G`, `1000`).
pub fn memory_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: f64 = num.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    let factor: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((n * factor).ceil() as u64)
}

/// A pod's CPU and memory requests as the scheduler counts them.
pub fn requests(pod: &Pod) -> (u64, u64) {
    let Some(spec) = pod.spec.as_ref() else { return (0, 0) };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> (u64, u64) {
        let r = c.resources.as_ref();
        let get = |name: &str| {
            r.and_then(|r| r.requests.as_ref().and_then(|m| m.get(name)).or_else(|| r.limits.as_ref()?.get(name)))
                .map(|q| q.0.clone())
        };
        (
            get("cpu").and_then(|q| cpu_millis(&q)).unwrap_or(0),
            get("memory").and_then(|q| memory_bytes(&q)).unwrap_or(0),
        )
    };
    let (mut cpu, mut mem) = spec.containers.iter().map(of).fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    for init in spec.init_containers.iter().flatten() {
        let (c, m) = of(init);
        cpu = cpu.max(c);
        mem = mem.max(m);
    }
    (cpu, mem)
}

/// The constraints of `pod`.
pub fn constraints(pod: &Pod) -> Constraints {
    let spec = pod.spec.as_ref();
    let required_terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|ns| ns.node_selector_terms.clone())
        .unwrap_or_default();
    let (cpu_millis, memory_bytes) = requests(pod);
    Constraints {
        node_selector: spec.and_then(|s| s.node_selector.clone()).unwrap_or_default(),
        required_terms,
        tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        cpu_millis,
        memory_bytes,
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        terms: super::affinity::terms(pod),
    }
}

fn matches_requirement(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => value.and_then(|v| number(v)).zip(values.first().and_then(|v| number(v))).is_some_and(|(a, b)| a > b),
        "Lt" => value.and_then(|v| number(v)).zip(values.first().and_then(|v| number(v))).is_some_and(|(a, b)| a < b),
        _ => false,
    }
}

fn matches_term(t: &NodeSelectorTerm, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    let by_name: BTreeMap<String, String> = BTreeMap::from([("metadata.name".to_string(), name.to_string())]);
    // An empty term matches nothing, as the scheduler has it.
    !(exprs.is_empty() && fields.is_empty())
        && exprs.iter().all(|r| matches_requirement(r, labels))
        && fields.iter().all(|r| matches_requirement(r, &by_name))
}

/// Why `pod` could not land on the node (`name`, `labels`, `taints`, `room`) apart from its
/// GPUs, in the scheduler's words where it has them; `None` when it could. `skip_taint` is a taint
/// key judged elsewhere (the dedicated pool's).
pub fn blocked(
    c: &Constraints,
    name: &str,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    room: &NodeRoom,
    skip_taint: &str,
) -> Option<String> {
    if !c.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return Some("didn't match Pod's node affinity/selector".into());
    }
    if !c.required_terms.is_empty() && !c.required_terms.iter().any(|t| matches_term(t, name, labels)) {
        return Some("didn't match Pod's node affinity/selector".into());
    }
    let untolerated = taints
        .iter()
        .filter(|t| t.key != skip_taint && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .find(|t| !c.tolerations.iter().any(|tol| crate::pools::tolerates(tol, t)));
    if let Some(t) = untolerated {
        return Some(format!("had untolerated taint {{{}: {}}}", t.key, t.value.as_deref().unwrap_or("")));
    }
    if room.cpu_millis.is_some_and(|a| c.cpu_millis > a.saturating_sub(room.cpu_requested)) {
        return Some("Insufficient cpu".into());
    }
    if room.memory_bytes.is_some_and(|a| c.memory_bytes > a.saturating_sub(room.memory_requested)) {
        return Some("Insufficient memory".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn quantities_read_as_the_api_writes_them() {
        assert_eq!(cpu_millis("500m"), Some(500));
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(cpu_millis("1.5"), Some(1500));
        assert_eq!(memory_bytes("1Gi"), Some(1 << 30));
        assert_eq!(memory_bytes("1G"), Some(1_000_000_000));
        assert_eq!(memory_bytes("12x"), None);
    }

    #[test]
    fn selectors_affinity_taints_and_requests_each_block_as_the_scheduler_says() {
        let p = pod(serde_json::json!({
            "nodeSelector": {"disk": "ssd"},
            "containers": [{"name": "m", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "6"}}}]
        }));
        let c = constraints(&p);
        assert_eq!((c.cpu_millis, c.memory_bytes), (6000, 8 << 30), "init containers count as the largest");
        let room =
            NodeRoom { cpu_millis: Some(8000), memory_bytes: Some(64 << 30), cpu_requested: 0, memory_requested: 0 };
        let none: Vec<Taint> = Vec::new();
        assert_eq!(
            blocked(&c, "n", &labels(&[]), &none, &room, "x").as_deref(),
            Some("didn't match Pod's node affinity/selector")
        );
        let ssd = labels(&[("disk", "ssd")]);
        assert_eq!(blocked(&c, "n", &ssd, &none, &room, "x"), None);
        let busy = NodeRoom { cpu_requested: 4000, ..room.clone() };
        assert_eq!(blocked(&c, "n", &ssd, &none, &busy, "x").as_deref(), Some("Insufficient cpu"));
        let taint: Taint =
            serde_json::from_value(serde_json::json!({"key": "team", "value": "a", "effect": "NoSchedule"})).unwrap();
        assert!(blocked(&c, "n", &ssd, std::slice::from_ref(&taint), &room, "x")
            .unwrap()
            .contains("untolerated taint {team: a}"));
        assert_eq!(blocked(&c, "n", &ssd, std::slice::from_ref(&taint), &room, "team"), None, "judged elsewhere");
        // Required affinity: In / NotIn, and matchFields on the name.
        let p = pod(serde_json::json!({
            "containers": [{"name": "m"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-z"]}]}
            ]}}}
        }));
        let c = constraints(&p);
        assert_eq!(blocked(&c, "gpu-x", &labels(&[("zone", "b")]), &none, &room, "x"), None);
        assert!(blocked(&c, "gpu-x", &labels(&[("zone", "c")]), &none, &room, "x").is_some());
        assert_eq!(blocked(&c, "gpu-z", &labels(&[]), &none, &room, "x"), None);
    }
}
