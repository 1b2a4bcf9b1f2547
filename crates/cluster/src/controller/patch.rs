//! The one Node patch that carries out a decision (pure): layout label, pool label, taints and
//! the controller's annotations together, with the node's resourceVersion as precondition, so a
//! node is never half-changed (a controller killed between two writes leaves either the old node
//! or the new one) and a node changed by someone else meanwhile is left for the next batch.
//! Dedicating a node records what it changes (the layout, the pool label's earlier value or its
//! absence); returning it puts exactly that back.

use super::decide::{Decision, Kind};
use super::nodes::{GpuNode, CHANGED_AT, LAST_DECISION, RECLAIM_LABELS, RECLAIM_LAYOUT};
use crate::defrag::gpu_room::{RoomNote, ROOM_ANNOTATION, ROOM_TAINT};
use crate::fleet::report::LAYOUT_LABEL;
use crate::pools::Pools;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The merge patch for `d` on `node` (as read), requesting `layout` (`None` removes the label),
/// with the pools as `pools` writes them.
pub fn node_patch(node: &GpuNode, d: &Decision, layout: Option<&str>, now: i64, pools: &Pools) -> Value {
    let mut labels = json!({ LAYOUT_LABEL: layout });
    let mut annotations =
        json!({ CHANGED_AT: now.to_string(), LAST_DECISION: format!("{}: {}", d.kind.as_str(), d.change) });
    let mut patch = json!({"metadata": {"resourceVersion": node.resource_version}});
    let others: Vec<Value> = node
        .taints
        .iter()
        .filter(|t| !pools.taint.is(t))
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    match d.kind {
        Kind::Repartition => {}
        Kind::MakeRoom => {
            // Every taint stays; the room's is added (once).
            let mut taints: Vec<Value> = node
                .taints
                .iter()
                .filter(|t| t.key != ROOM_TAINT)
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect();
            taints.push(serde_json::to_value(RoomNote::taint()).unwrap_or(Value::Null));
            patch["spec"] = json!({ "taints": taints });
            annotations[ROOM_ANNOTATION] = json!(d.room.as_ref().and_then(|r| serde_json::to_string(r).ok()));
        }
        Kind::Dedicate | Kind::Reserve => {
            labels[&pools.label] = json!(pools.dedicated);
            // A reserved node being converted keeps what was recorded when it was reserved.
            if !node.annotations.contains_key(RECLAIM_LAYOUT) {
                annotations[RECLAIM_LAYOUT] = json!(node.layout().unwrap_or(""));
            }
            if node.reclaim_labels().is_none() {
                let before = BTreeMap::from([(pools.label.clone(), node.labels.get(&pools.label).cloned())]);
                annotations[RECLAIM_LABELS] = json!(serde_json::to_string(&before).unwrap_or_default());
            }
            let mut taints = others;
            taints.push(serde_json::to_value(pools.taint.to_taint()).unwrap_or(Value::Null));
            patch["spec"] = json!({ "taints": taints });
        }
        Kind::Reclaim => {
            // Back as it was; a node dedicated by an older controller (nothing recorded) gets
            // the shared pool's label.
            let before = node
                .reclaim_labels()
                .unwrap_or_else(|| BTreeMap::from([(pools.label.clone(), Some(pools.shared.clone()))]));
            for (k, v) in before {
                labels[&k] = json!(v);
            }
            annotations[RECLAIM_LAYOUT] = Value::Null;
            annotations[RECLAIM_LABELS] = Value::Null;
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
pub fn still_holds(read: &GpuNode, fresh: &GpuNode, pools: &Pools) -> bool {
    let ours = |n: &GpuNode| {
        (
            n.layout().map(str::to_string),
            n.labels.get(&pools.label).cloned(),
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
    use crate::controller::pods::DEDICATED_TAINT_KEY;
    use crate::fleet::report::POOL_LABEL;
    use k8s_openapi::api::core::v1::Taint;

    /// `n` after `patch` (labels and annotations merged, taints replaced), as the API server
    /// applies a merge patch.
    fn applied(n: &GpuNode, patch: &Value) -> GpuNode {
        let mut out = n.clone();
        for (map, key) in [(&mut out.labels, "labels"), (&mut out.annotations, "annotations")] {
            for (k, v) in patch["metadata"][key].as_object().into_iter().flatten() {
                match v.as_str() {
                    Some(s) => map.insert(k.clone(), s.to_string()),
                    None => map.remove(k),
                };
            }
        }
        if let Some(t) = patch["spec"].get("taints") {
            out.taints = serde_json::from_value(t.clone()).unwrap();
        }
        out
    }

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
            room: None,
        }
    }

    #[test]
    fn a_room_sets_the_layout_adds_its_taint_once_and_records_the_room() {
        let mut n = crate::controller::nodes::GpuNode::read(&node("n", "[]", &[(LAYOUT_LABEL, "all-1g.10gb")], false))
            .unwrap()
            .unwrap();
        n.taints.push(Taint { key: "other".into(), value: None, effect: "NoExecute".into(), time_added: None });
        let mut d = decision(Kind::MakeRoom);
        let note = RoomNote { pod: "ml/big".into(), gpu: 1, profile: "7g.80gb".into(), until: 700 };
        d.room = Some(note.clone());
        let pools = Pools::default();
        let p = node_patch(&n, &d, Some("gpupart-auto-9"), 100, &pools);
        assert_eq!(p["metadata"]["labels"][LAYOUT_LABEL], "gpupart-auto-9");
        assert!(p["metadata"]["labels"].get(POOL_LABEL).is_none(), "the pool is not touched: {p}");
        let after = applied(&n, &p);
        assert_eq!(RoomNote::on(&after.annotations), Some(Ok(note)));
        let keys: Vec<&str> = after.taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, vec!["other", ROOM_TAINT]);
        assert_eq!(after.taints[1].effect, "NoSchedule");
        // Made again (a new leader, a retried patch): still one room taint.
        let again = applied(&after, &node_patch(&after, &d, Some("gpupart-auto-9"), 101, &pools));
        assert_eq!(again.taints.len(), 2);
    }

    #[test]
    fn one_patch_sets_labels_taints_and_annotations_with_a_precondition() {
        let mut n = crate::controller::nodes::GpuNode::read(&node("n", "[]", &[(LAYOUT_LABEL, "all-3g.40gb")], false))
            .unwrap()
            .unwrap();
        n.taints.push(Taint { key: "other".into(), value: None, effect: "NoExecute".into(), time_added: None });
        let pools = Pools::default();
        let p = node_patch(&n, &decision(Kind::Dedicate), Some("gpupart-auto-1"), 42, &pools);
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["metadata"]["labels"][LAYOUT_LABEL], "gpupart-auto-1");
        assert_eq!(p["metadata"]["labels"][POOL_LABEL], "dedicated");
        assert_eq!(p["metadata"]["annotations"][RECLAIM_LAYOUT], "all-3g.40gb");
        assert_eq!(p["metadata"]["annotations"][CHANGED_AT], "42");
        let keys: Vec<&str> =
            p["spec"]["taints"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
        assert_eq!(keys, vec!["other", DEDICATED_TAINT_KEY]);
        // Back: the node had no pool label, so it gets none.
        let dedicated = applied(&n, &p);
        let back = node_patch(&dedicated, &decision(Kind::Reclaim), Some("all-3g.40gb"), 43, &pools);
        assert!(back["metadata"]["labels"][POOL_LABEL].is_null(), "{back}");
        assert_eq!(back["spec"]["taints"].as_array().unwrap().len(), 1);
        let returned = applied(&dedicated, &back);
        assert_eq!((returned.labels.clone(), returned.taints.clone()), (n.labels.clone(), n.taints.clone()));
        assert!(
            !returned.annotations.contains_key(RECLAIM_LABELS) && !returned.annotations.contains_key(RECLAIM_LAYOUT)
        );
        // A node in the shared pool goes back to it; reserving then converting keeps the first record.
        let mut shared = n.clone();
        shared.labels.insert(POOL_LABEL.into(), "shared".into());
        let reserved =
            applied(&shared, &node_patch(&shared, &decision(Kind::Reserve), Some("all-3g.40gb"), 50, &pools));
        let converted = applied(&reserved, &node_patch(&reserved, &decision(Kind::Dedicate), Some("x"), 51, &pools));
        assert_eq!(converted.annotations[RECLAIM_LAYOUT], "all-3g.40gb");
        let back =
            applied(&converted, &node_patch(&converted, &decision(Kind::Reclaim), Some("all-3g.40gb"), 52, &pools));
        assert_eq!(back.labels, shared.labels);
        // Other pool names and taint, as flags give them.
        let mine = Pools::new("example.com/pool", "small", "large", "example.com/tp=yes:NoExecute").unwrap();
        let p = node_patch(&n, &decision(Kind::Dedicate), Some("y"), 53, &mine);
        assert_eq!(p["metadata"]["labels"]["example.com/pool"], "large");
        assert!(p["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "example.com/tp" && t["effect"] == "NoExecute"));
        // Nothing recorded (dedicated by an older controller): back to the shared pool's label.
        let mut legacy = dedicated.clone();
        legacy.annotations.remove(RECLAIM_LABELS);
        let back = node_patch(&legacy, &decision(Kind::Reclaim), None, 54, &pools);
        assert_eq!(back["metadata"]["labels"][POOL_LABEL], "shared");
        let mut agent_wrote = n.clone();
        agent_wrote.resource_version = Some("8".into());
        agent_wrote.annotations.insert("gpupart.io/state-reason".into(), "applied".into());
        assert!(still_holds(&n, &agent_wrote, &pools), "the agent's own status does not void a decision");
        let mut relabelled = agent_wrote.clone();
        relabelled.labels.insert(LAYOUT_LABEL.into(), "by-hand".into());
        assert!(!still_holds(&n, &relabelled, &pools), "a person's relabel does");
        let mut busier = agent_wrote.clone();
        busier.gpus.push(busier.gpus.first().cloned().unwrap_or_else(|| {
            crate::fleet::current::from_annotation("n", r#"[{"i":0,"model":"L4-24GB","mode":"none","busy":true}]"#)
                .unwrap()
                .remove(0)
        }));
        assert!(!still_holds(&n, &busier, &pools), "changed GPUs do");
        let plain = node_patch(&n, &decision(Kind::Repartition), Some("x"), 44, &pools);
        assert!(plain.get("spec").is_none());
        assert_eq!(plain["metadata"]["annotations"][LAST_DECISION], "repartition: GPU 0: +1 1g.10gb");
    }
}
