//! Required inter-pod affinity and anti-affinity (pure), as kube-scheduler's InterPodAffinity
//! filter reads them (`pkg/scheduler/framework/plugins/interpodaffinity/filtering.go`):
//!
//! - a term matches a pod when the pod's namespace is among the term's namespaces (none listed and
//!   no namespace selector: the namespace of the pod that has the term; an empty namespace
//!   selector: every namespace) and its label selector matches the pod's labels (no selector
//!   matches no pod, an empty one every pod);
//! - a node is in a term's topology domain of another node when both carry the term's
//!   `topologyKey` label with the same value (`kubernetes.io/hostname`: the node itself);
//! - the pod's anti-affinity: no pod in the node's domain may match the term (a node without the
//!   key is not constrained);
//! - the placed pods' anti-affinity: no placed pod whose term matches the pod may be in the node's
//!   domain of that term;
//! - the pod's affinity: the node must carry every term's key, and in each term's domain there
//!   must be a pod that matches all the terms; except that when no placed pod anywhere matches
//!   all the terms and the pod matches them itself, it may go anywhere carrying the keys (the
//!   first pod of a group).
//!
//! The controller sees GPU pods only, so the placed pods are the GPU pods bound to nodes (and
//! those its simulation of the scheduler places). A non-empty namespace selector is read as
//! "every namespace" (namespace labels are not read).

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};

/// One required term.
#[derive(Debug, Clone, PartialEq)]
pub struct PodTerm {
    /// The label selector (`None`: matches no pod).
    pub selector: Option<LabelSelector>,
    /// The namespaces it looks in (`None`: every namespace).
    pub namespaces: Option<BTreeSet<String>>,
    /// The node label whose value makes a topology domain.
    pub topology_key: String,
}

/// A pod's required inter-pod terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodTerms {
    /// `podAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub affinity: Vec<PodTerm>,
    /// `podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub anti: Vec<PodTerm>,
}

impl PodTerms {
    /// Whether the pod has any required inter-pod term.
    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty() && self.anti.is_empty()
    }
}

fn term(t: &PodAffinityTerm, own_namespace: &str) -> PodTerm {
    let listed: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    let namespaces = match (&t.namespace_selector, listed.is_empty()) {
        (Some(_), _) => None,
        (None, true) => Some(BTreeSet::from([own_namespace.to_string()])),
        (None, false) => Some(listed),
    };
    PodTerm { selector: t.label_selector.clone(), namespaces, topology_key: t.topology_key.clone() }
}

/// The required inter-pod terms of `pod`.
pub fn terms(pod: &Pod) -> PodTerms {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let a = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    let read = |ts: Option<&Vec<PodAffinityTerm>>| ts.into_iter().flatten().map(|t| term(t, ns)).collect();
    PodTerms {
        affinity: read(
            a.and_then(|a| a.pod_affinity.as_ref())
                .and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()),
        ),
        anti: read(
            a.and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()),
        ),
    }
}

/// Whether a label selector matches `labels` (matchLabels and matchExpressions).
pub fn selector_matches(s: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let plain = s.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    plain
        && s.match_expressions.iter().flatten().all(|e| {
            let have = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
}

impl PodTerm {
    /// Whether the term matches a pod in `namespace` with `labels`.
    pub fn matches(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.contains(namespace))
            && self.selector.as_ref().is_some_and(|s| selector_matches(s, labels))
    }

    /// The node's value of the topology key.
    fn domain<'a>(&self, node_labels: &'a BTreeMap<String, String>) -> Option<&'a String> {
        node_labels.get(&self.topology_key)
    }
}

/// A pod as the filter needs it.
#[derive(Debug, Clone, Copy)]
pub struct PodView<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its required terms.
    pub terms: &'a PodTerms,
}

/// A pod placed on a node.
#[derive(Debug, Clone, Copy)]
pub struct Placed<'a> {
    /// The pod.
    pub pod: PodView<'a>,
    /// Its node's labels.
    pub node_labels: &'a BTreeMap<String, String>,
}

/// The pods on nodes, kept apart as the filter reads them: a pod without terms of its own is
/// judged only against the placed pods with anti-affinity terms (usually few), so most checks do
/// not walk every pod of the cluster.
#[derive(Debug, Clone, Default)]
pub struct Placements<'a> {
    all: Vec<Placed<'a>>,
    anti: Vec<Placed<'a>>,
}

impl<'a> Placements<'a> {
    /// Adds a placed pod.
    pub fn push(&mut self, p: Placed<'a>) {
        if !p.pod.terms.anti.is_empty() {
            self.anti.push(p);
        }
        self.all.push(p);
    }

    /// Whether no placed pod has an anti-affinity term.
    pub fn no_anti(&self) -> bool {
        self.anti.is_empty()
    }

    /// The placed pods that can matter to `pod`.
    pub fn for_pod(&self, pod: PodView<'_>) -> &[Placed<'a>] {
        if pod.terms.is_empty() {
            &self.anti
        } else {
            &self.all
        }
    }
}

impl<'a> FromIterator<Placed<'a>> for Placements<'a> {
    fn from_iter<I: IntoIterator<Item = Placed<'a>>>(iter: I) -> Self {
        let mut out = Placements::default();
        for p in iter {
            out.push(p);
        }
        out
    }
}

/// Why `pod` may not land on a node with `node_labels` given the `placed` pods, in the
/// scheduler's words; `None` when it may.
pub fn blocked(pod: PodView<'_>, node_labels: &BTreeMap<String, String>, placed: &[Placed<'_>]) -> Option<String> {
    let same = |t: &PodTerm, other: &BTreeMap<String, String>| {
        t.domain(node_labels).is_some_and(|v| t.domain(other) == Some(v))
    };
    // The placed pods' anti-affinity.
    let existing = placed
        .iter()
        .any(|q| q.pod.terms.anti.iter().any(|t| t.matches(pod.namespace, pod.labels) && same(t, q.node_labels)));
    if existing {
        return Some("node(s) didn't satisfy existing pods anti-affinity rules".into());
    }
    // The pod's anti-affinity.
    let anti = pod
        .terms
        .anti
        .iter()
        .any(|t| placed.iter().any(|q| same(t, q.node_labels) && t.matches(q.pod.namespace, q.pod.labels)));
    if anti {
        return Some("node(s) didn't match pod anti-affinity rules".into());
    }
    // The pod's affinity.
    let aff = &pod.terms.affinity;
    if aff.is_empty() {
        return None;
    }
    let refused = Some("node(s) didn't match pod affinity rules".to_string());
    if aff.iter().any(|t| t.domain(node_labels).is_none()) {
        return refused;
    }
    let all = |ns: &str, labels: &BTreeMap<String, String>| aff.iter().all(|t| t.matches(ns, labels));
    let matching: Vec<&Placed> = placed.iter().filter(|q| all(q.pod.namespace, q.pod.labels)).collect();
    if aff.iter().all(|t| matching.iter().any(|q| same(t, q.node_labels))) {
        return None;
    }
    // The first pod of a group: nothing placed matches all terms on a node with their keys.
    let counted = matching.iter().any(|q| aff.iter().any(|t| t.domain(q.node_labels).is_some()));
    if !counted && all(pod.namespace, pod.labels) {
        return None;
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, labels: &[(&str, &str)], affinity: serde_json::Value) -> Pod {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": "p", "labels": labels},
            "spec": {"containers": [{"name": "m"}], "affinity": affinity}
        }))
        .unwrap()
    }

    fn labels(p: &Pod) -> BTreeMap<String, String> {
        p.metadata.labels.clone().unwrap_or_default()
    }

    fn host(n: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("kubernetes.io/hostname".to_string(), n.to_string()), ("zone".to_string(), "z1".to_string())])
    }

    const HOST: &str = "kubernetes.io/hostname";

    #[test]
    fn anti_affinity_keeps_replicas_apart_both_ways() {
        let anti = serde_json::json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [{"key": "gpu-pool", "operator": "In", "values": ["dedicated"]}]}, "topologyKey": HOST}]}});
        let a = pod("serving", &[("gpu-pool", "dedicated")], anti.clone());
        let (la, ta) = (labels(&a), terms(&a));
        let view = PodView { namespace: "serving", labels: &la, terms: &ta };
        let (n1, n2) = (host("n1"), host("n2"));
        let placed = [Placed { pod: view, node_labels: &n1 }];
        assert_eq!(
            blocked(view, &n1, &placed).as_deref(),
            Some("node(s) didn't satisfy existing pods anti-affinity rules")
        );
        assert_eq!(blocked(view, &n2, &placed), None, "another host");
        // A pod without terms that the placed pod's anti-affinity matches is kept off too.
        let plain = pod("serving", &[("gpu-pool", "dedicated")], serde_json::Value::Null);
        let (lp, tp) = (labels(&plain), terms(&plain));
        let pv = PodView { namespace: "serving", labels: &lp, terms: &tp };
        assert!(blocked(pv, &n1, &placed).is_some());
        // ... but not from another namespace (the term looks in its own pod's namespace).
        assert_eq!(blocked(PodView { namespace: "other", ..pv }, &n1, &placed), None);
        // The pod's own anti-affinity against a placed pod without terms.
        let placed_plain = [Placed { pod: pv, node_labels: &n1 }];
        assert_eq!(blocked(view, &n1, &placed_plain).as_deref(), Some("node(s) didn't match pod anti-affinity rules"));
        // A node without the topology key is not constrained by anti-affinity.
        let bare = BTreeMap::new();
        assert_eq!(blocked(view, &bare, &[Placed { pod: pv, node_labels: &bare }]), None);
    }

    #[test]
    fn affinity_needs_a_match_in_the_domain_except_for_the_first_of_a_group() {
        let aff = serde_json::json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": HOST}]}});
        let me = pod("a", &[("app", "web")], aff.clone());
        let (lm, tm) = (labels(&me), terms(&me));
        let view = PodView { namespace: "a", labels: &lm, terms: &tm };
        let cache = pod("a", &[("app", "cache")], serde_json::Value::Null);
        let (lc, tc) = (labels(&cache), terms(&cache));
        let cv = PodView { namespace: "a", labels: &lc, terms: &tc };
        let (n1, n2) = (host("n1"), host("n2"));
        let placed = [Placed { pod: cv, node_labels: &n1 }];
        assert_eq!(blocked(view, &n1, &placed), None);
        assert_eq!(blocked(view, &n2, &placed).as_deref(), Some("node(s) didn't match pod affinity rules"));
        // Nothing matches anywhere and the pod does not match its own term: refused.
        assert!(blocked(view, &n1, &[]).is_some());
        // A pod with affinity to its own kind, the first of its group: allowed where the key is.
        let self_aff = serde_json::json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": HOST}]}});
        let first = pod("a", &[("app", "cache")], self_aff);
        let (lf, tf) = (labels(&first), terms(&first));
        let fv = PodView { namespace: "a", labels: &lf, terms: &tf };
        assert_eq!(blocked(fv, &n2, &[]), None);
        assert!(blocked(fv, &BTreeMap::new(), &[]).is_some(), "the node must carry the key");
        // No selector matches nothing; an empty one everything; a namespace selector all namespaces.
        let t = PodTerm { selector: None, namespaces: None, topology_key: HOST.into() };
        assert!(!t.matches("a", &lc));
        let t = PodTerm { selector: Some(LabelSelector::default()), namespaces: None, topology_key: HOST.into() };
        assert!(t.matches("zzz", &BTreeMap::new()));
    }
}
