//! Which running pods may be moved (evicted, to be recreated elsewhere by their controller) to
//! make room for a pod that waits (pure). Only pods that opt in, by the annotation
//! `gpupart.io/movable: "true"` or by running in a namespace the operator names; never a pod
//! without a controller owner (nothing would recreate it), a DaemonSet's pod (it comes back on the
//! same node), a pod at or above the priority limit, a pod younger than the minimum age, or a pod
//! of the waiting pod's own workload. `gpupart.io/movable: "false"` keeps a pod in place even in a
//! named namespace.

use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeSet;

/// The annotation by which a pod opts in (`"true"`) or out (`"false"`).
pub const MOVABLE_ANNOTATION: &str = "gpupart.io/movable";

/// The operator's rules (the controller's `--defrag-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRules {
    /// Namespaces whose pods are movable without the annotation.
    pub namespaces: BTreeSet<String>,
    /// Pods with this priority or higher never move.
    pub max_priority: i32,
    /// Pods younger than this (seconds) never move.
    pub min_age_secs: i64,
}

impl Default for MoveRules {
    fn default() -> Self {
        Self { namespaces: BTreeSet::new(), max_priority: 1000, min_age_secs: 600 }
    }
}

/// A pod's controlling owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `ReplicaSet`, `StatefulSet`, `Job`, `DaemonSet`, …
    pub kind: String,
    /// Its name.
    pub name: String,
}

/// A running pod as the defragmenter judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPod {
    /// `namespace/name`.
    pub key: String,
    /// Namespace.
    pub namespace: String,
    /// The controlling owner, if any.
    pub owner: Option<Owner>,
    /// The `gpupart.io/movable` annotation's value, if set.
    pub movable: Option<String>,
    /// `spec.priority`.
    pub priority: i32,
    /// Creation time (seconds since the epoch), if known.
    pub created: Option<i64>,
}

impl RunningPod {
    /// Reads a pod.
    pub fn read(pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| Owner { kind: o.kind.clone(), name: o.name.clone() });
        RunningPod {
            key: format!("{namespace}/{name}"),
            namespace,
            owner,
            movable: pod.metadata.annotations.as_ref().and_then(|a| a.get(MOVABLE_ANNOTATION)).cloned(),
            priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        }
    }
}

/// Why a pod stays where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Immovable {
    /// Neither the annotation nor a named namespace opts it in (or the annotation opts it out).
    #[error("not opted in (annotation {MOVABLE_ANNOTATION}: \"true\" or a --defrag-namespaces namespace)")]
    NotOptedIn,
    /// No controller would recreate it.
    #[error("no controller owner would recreate it")]
    Bare,
    /// A DaemonSet's pod comes back on the same node.
    #[error("a DaemonSet's pod comes back on the same node")]
    DaemonSet,
    /// Its priority is at or above the limit.
    #[error("priority {0} is at or above --defrag-max-priority {1}")]
    Priority(i32, i32),
    /// It started too recently.
    #[error("{0} s old, younger than --defrag-min-age {1} s")]
    TooYoung(i64, i64),
    /// It belongs to the waiting pod's own workload.
    #[error("it belongs to the waiting pod's own workload")]
    SameWorkload,
}

/// Why `pod` may not be moved to make room for a pod of `waiting_owner` in `waiting_namespace`,
/// at `now` (seconds); `None` when it may.
pub fn immovable(
    pod: &RunningPod,
    waiting_namespace: &str,
    waiting_owner: Option<&Owner>,
    rules: &MoveRules,
    now: i64,
) -> Option<Immovable> {
    let opted_in = match pod.movable.as_deref() {
        Some("true") => true,
        Some("false") => false,
        _ => rules.namespaces.contains(&pod.namespace),
    };
    if !opted_in {
        return Some(Immovable::NotOptedIn);
    }
    let Some(owner) = &pod.owner else { return Some(Immovable::Bare) };
    if owner.kind == "DaemonSet" {
        return Some(Immovable::DaemonSet);
    }
    if pod.priority >= rules.max_priority {
        return Some(Immovable::Priority(pod.priority, rules.max_priority));
    }
    let age = pod.created.map_or(0, |c| now - c);
    if age < rules.min_age_secs {
        return Some(Immovable::TooYoung(age, rules.min_age_secs));
    }
    if pod.namespace == waiting_namespace && waiting_owner == Some(owner) {
        return Some(Immovable::SameWorkload);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> RunningPod {
        RunningPod::read(&serde_json::from_value(json).unwrap())
    }

    fn owned(ns: &str, name: &str, kind: &str, extra: serde_json::Value) -> RunningPod {
        let mut p = serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "creationTimestamp": "2026-12-06T10:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "small-7d9f", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "m"}], "priority": 0}
        });
        if let Some(a) = extra.get("annotations") {
            p["metadata"]["annotations"] = a.clone();
        }
        if let Some(pr) = extra.get("priority") {
            p["spec"]["priority"] = pr.clone();
        }
        pod(p)
    }

    #[test]
    fn only_opted_in_pods_of_a_controller_below_the_limits_move() {
        let created = owned("x", "x", "Job", serde_json::json!({})).created.expect("a creation time");
        let now = created + 3600;
        let rules = MoveRules { namespaces: BTreeSet::from(["batch".to_string()]), ..MoveRules::default() };
        let yes = serde_json::json!({"annotations": {MOVABLE_ANNOTATION: "true"}});
        let waiting = Owner { kind: "ReplicaSet".into(), name: "llm-70b-5c8d".into() };
        let judge = |p: &RunningPod| immovable(p, "serving", Some(&waiting), &rules, now);
        assert_eq!(judge(&owned("serving", "a", "ReplicaSet", yes.clone())), None, "annotated");
        assert_eq!(judge(&owned("batch", "b", "Job", serde_json::json!({}))), None, "a named namespace");
        assert_eq!(judge(&owned("serving", "c", "ReplicaSet", serde_json::json!({}))), Some(Immovable::NotOptedIn));
        let out = serde_json::json!({"annotations": {MOVABLE_ANNOTATION: "false"}});
        assert_eq!(judge(&owned("batch", "d", "Job", out)), Some(Immovable::NotOptedIn), "opted out");
        assert_eq!(judge(&owned("serving", "e", "DaemonSet", yes.clone())), Some(Immovable::DaemonSet));
        let bare = pod(
            serde_json::json!({"metadata": {"namespace": "batch", "name": "f", "creationTimestamp": "2026-12-06T10:00:00Z"}}),
        );
        assert_eq!(judge(&bare), Some(Immovable::Bare));
        let high = serde_json::json!({"annotations": {MOVABLE_ANNOTATION: "true"}, "priority": 1000});
        assert_eq!(judge(&owned("serving", "g", "ReplicaSet", high)), Some(Immovable::Priority(1000, 1000)));
        let young = immovable(&owned("batch", "h", "Job", serde_json::json!({})), "serving", None, &rules, now - 3300);
        assert_eq!(young, Some(Immovable::TooYoung(300, 600)));
        let mut sibling = owned("serving", "i", "ReplicaSet", yes);
        sibling.owner = Some(waiting.clone());
        assert_eq!(judge(&sibling), Some(Immovable::SameWorkload));
        assert!(Immovable::NotOptedIn.to_string().contains("gpupart.io/movable"));
    }
}
