//! The one Node patch that carries out a decision (pure): layout label, pool label, taints and
//! the controller's annotations together, with the node's resourceVersion as precondition, so a
//! node is never half-changed (a controller killed between two writes leaves either the old node
//! or the new one) and a node changed by someone else meanwhile is left for the next batch.

use super::decide::{Decision, Kind};
use super::nodes::{GpuNode, CHANGED_AT, LAST_DECISION, RECLAIM_LAYOUT};
use super::pods::DEDICATED_TAINT_KEY;
use crate::fleet::report::{LAYOUT_LABEL, POOL_LABEL};
use serde_json::{json, Value};

/// The merge patch for `d` on `node` (as read), requesting `layout` (`None` removes the label).
pub fn node_patch(node: &GpuNode, d: &Decision, layout: Option<&str>, now: i64) -> Value {
    let mut labels = json!({ LAYOUT_LABEL: layout });
    let mut annotations =
        json!({ CHANGED_AT: now.to_string(), LAST_DECISION: format!("{}: {}", d.kind.as_str(), d.change) });
    let mut patch = json!({"metadata": {"resourceVersion": node.resource_version}});
    let others: Vec<Value> = node
        .taints
        .iter()
        .filter(|t| t.key != DEDICATED_TAINT_KEY)
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    match d.kind {
        Kind::Repartition => {}
        Kind::Dedicate | Kind::Reserve => {
            labels[POOL_LABEL] = json!("dedicated");
            annotations[RECLAIM_LAYOUT] = json!(node.layout().unwrap_or(""));
            let mut taints = others;
            taints.push(json!({"key": DEDICATED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}));
            patch["spec"] = json!({ "taints": taints });
        }
        Kind::Reclaim => {
            labels[POOL_LABEL] = Value::Null;
            annotations[RECLAIM_LAYOUT] = Value::Null;
            patch["spec"] = json!({ "taints": others });
        }
    }
    patch["metadata"]["labels"] = labels;
    patch["metadata"]["annotations"] = annotations;
    patch
}

/// Whether a decision made on `read` still holds for `fresh` (the node as it is now): nobody
/// changed what the controller sets (layout, pool, taints, its annotations) and the GPUs are as
/// they were (nothing newly busy). Then a patch refused for a stale resourceVersion, because the
/// agent wrote its status meanwhile, is retried on the fresh node.
pub fn still_holds(read: &GpuNode, fresh: &GpuNode) -> bool {
    let ours = |n: &GpuNode| {
        (
            n.layout().map(str::to_string),
            n.labels.get(POOL_LABEL).cloned(),
            n.taints.iter().map(|t| (t.key.clone(), t.value.clone(), t.effect.clone())).collect::<Vec<_>>(),
            n.annotations.get(CHANGED_AT).cloned(),
            n.annotations.get(RECLAIM_LAYOUT).cloned(),
            n.cordoned,
        )
    };
    ours(read) == ours(fresh) && read.gpus == fresh.gpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::nodes::tests::node;
    use k8s_openapi::api::core::v1::Taint;

    fn decision(kind: Kind) -> Decision {
        Decision {
            node: "n".into(),
            kind,
            model: crate::mig::catalog::lookup("H100-SXM5-80GB").unwrap(),
            specs: Vec::new(),
            restore: None,
            pods: Vec::new(),
            destroyed: 0,
            created: 0,
            frag: 0.0,
            change: "GPU 0: +1 1g.10gb".into(),
        }
    }

    #[test]
    fn one_patch_sets_labels_taints_and_annotations_with_a_precondition() {
        let mut n = crate::controller::nodes::GpuNode::read(&node("n", "[]", &[(LAYOUT_LABEL, "all-3g.40gb")], false))
            .unwrap()
            .unwrap();
        n.taints.push(Taint { key: "other".into(), value: None, effect: "NoExecute".into(), time_added: None });
        let p = node_patch(&n, &decision(Kind::Dedicate), Some("gpupart-auto-1"), 42);
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["metadata"]["labels"][LAYOUT_LABEL], "gpupart-auto-1");
        assert_eq!(p["metadata"]["labels"][POOL_LABEL], "dedicated");
        assert_eq!(p["metadata"]["annotations"][RECLAIM_LAYOUT], "all-3g.40gb");
        assert_eq!(p["metadata"]["annotations"][CHANGED_AT], "42");
        let keys: Vec<&str> =
            p["spec"]["taints"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
        assert_eq!(keys, vec!["other", DEDICATED_TAINT_KEY]);
        let back = node_patch(&n, &decision(Kind::Reclaim), None, 43);
        assert!(back["metadata"]["labels"][LAYOUT_LABEL].is_null() && back["metadata"]["labels"][POOL_LABEL].is_null());
        assert_eq!(back["spec"]["taints"].as_array().unwrap().len(), 1);
        let mut agent_wrote = n.clone();
        agent_wrote.resource_version = Some("8".into());
        agent_wrote.annotations.insert("gpupart.io/state-reason".into(), "applied".into());
        assert!(still_holds(&n, &agent_wrote), "the agent's own status does not void a decision");
        let mut relabelled = agent_wrote.clone();
        relabelled.labels.insert(LAYOUT_LABEL.into(), "by-hand".into());
        assert!(!still_holds(&n, &relabelled), "a person's relabel does");
        let mut busier = agent_wrote.clone();
        busier.gpus.push(busier.gpus.first().cloned().unwrap_or_else(|| {
            crate::fleet::current::from_annotation("n", r#"[{"i":0,"model":"L4-24GB","mode":"none","busy":true}]"#)
                .unwrap()
                .remove(0)
        }));
        assert!(!still_holds(&n, &busier), "changed GPUs do");
        let plain = node_patch(&n, &decision(Kind::Repartition), Some("x"), 44);
        assert!(plain.get("spec").is_none());
        assert_eq!(plain["metadata"]["annotations"][LAST_DECISION], "repartition: GPU 0: +1 1g.10gb");
    }
}
