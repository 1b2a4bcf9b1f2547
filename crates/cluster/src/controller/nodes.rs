//! A GPU node as the controller sees it (pure): its GPUs and partitions from the agent's
//! `gpupart.io/gpus` annotation, the requested layout (`nvidia.com/mig.config`), the agent's
//! state, its pool (label and taint), and whether it is settled enough to change.

use crate::fleet::current::{from_annotation, CurrentGpu};
use crate::fleet::report::LAYOUT_LABEL;
use crate::keys::{DRA_DRIVER, DRA_LABEL, STATE_LABEL, STATE_LAYOUT};
use crate::pools::Pools;
use k8s_openapi::api::core::v1::{Node, Taint};
use std::collections::BTreeMap;

/// The agent's node summary annotation.
pub const GPUS_ANNOTATION: &str = "gpupart.io/gpus";
/// When the controller last changed the node (seconds since the epoch): the cool-down clock,
/// kept on the node so a new leader honours it.
pub const CHANGED_AT: &str = "gpupart.io/controller-changed-at";
/// The layout a dedicated node had before the controller converted it (restored on reclaim).
pub const RECLAIM_LAYOUT: &str = "gpupart.io/reclaim-layout";
/// The labels the controller changed when it dedicated the node, with their earlier values
/// (JSON: key → value, `null` for a label the node did not have), restored on reclaim.
pub const RECLAIM_LABELS: &str = "gpupart.io/reclaim-labels";
/// What the controller last did to the node, in words.
pub const LAST_DECISION: &str = "gpupart.io/controller-decision";

/// Whether the controller may change a node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// The agent reports `success` for the requested layout (or no layout is requested).
    Settled,
    /// The agent is applying a layout (or has not picked up the requested one yet).
    Reconfiguring(String),
    /// The agent reports `failed`: left alone until it settles.
    Failed(String),
}

/// A node with a gpupart agent.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuNode {
    /// Node name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Its GPUs as the agent last reported them.
    pub gpus: Vec<CurrentGpu>,
    /// resourceVersion when read (the precondition of the controller's patch).
    pub resource_version: Option<String>,
    /// Marked unschedulable (`kubectl cordon`).
    pub cordoned: bool,
    /// CPU and memory for pods: allocatable as reported, requested by the pods bound to it (the
    /// caller adds those).
    pub room: super::fit::NodeRoom,
}

impl GpuNode {
    /// Why the node runs the DRA plugin, if it does (its label or the plugin's annotation): its
    /// devices are made per claim, so the controller never sets a layout there.
    pub fn dra_plugin(&self) -> Option<String> {
        if self.labels.get(DRA_LABEL).is_some_and(|v| v == "true") {
            return Some(format!("labelled {DRA_LABEL}=true"));
        }
        let driver = self.annotations.get(DRA_DRIVER)?;
        Some(format!("its DRA plugin (driver {driver}) publishes its devices"))
    }

    /// Reads a Node: `Ok(None)` when no agent has published its GPUs; `Err` when the
    /// annotation does not parse.
    pub fn read(node: &Node) -> Result<Option<GpuNode>, String> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let Some(text) = annotations.get(GPUS_ANNOTATION) else { return Ok(None) };
        let gpus = from_annotation(&name, text).map_err(|e| e.to_string())?;
        let spec = node.spec.as_ref();
        let allocatable = |r: &str| {
            node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(r)).map(|q| q.0.clone())
        };
        Ok(Some(GpuNode {
            name,
            labels: node.metadata.labels.clone().unwrap_or_default(),
            annotations,
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            gpus,
            resource_version: node.metadata.resource_version.clone(),
            cordoned: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            room: super::fit::NodeRoom {
                cpu_millis: allocatable("cpu").and_then(|q| super::fit::cpu_millis(&q)),
                memory_bytes: allocatable("memory").and_then(|q| super::fit::memory_bytes(&q)),
                ..Default::default()
            },
        }))
    }

    /// The pods holding each MIG instance, as the agent reports them: (GPU index, placement
    /// start) → `namespace/name`s.
    pub fn holders(&self) -> BTreeMap<(u32, u32), Vec<String>> {
        self.annotations
            .get(GPUS_ANNOTATION)
            .map(|t| crate::fleet::current::holders_from_annotation(t))
            .unwrap_or_default()
    }

    /// The requested layout.
    pub fn layout(&self) -> Option<&str> {
        self.labels.get(LAYOUT_LABEL).map(String::as_str)
    }

    /// The agent's state label.
    pub fn state(&self) -> Option<&str> {
        self.labels.get(STATE_LABEL).map(String::as_str)
    }

    /// In the dedicated pool (its taint or its pool label).
    pub fn is_dedicated(&self, pools: &Pools) -> bool {
        pools.is_dedicated(&self.labels, &self.taints)
    }

    /// Converted to dedicated by the controller (it remembers the layout to restore).
    pub fn dedicated_by_controller(&self, pools: &Pools) -> bool {
        self.is_dedicated(pools) && self.annotations.contains_key(RECLAIM_LAYOUT)
    }

    /// The labels the controller changed when it dedicated the node, with their earlier values
    /// (`None`: the node did not have the label); `None` when it recorded none (an older
    /// controller dedicated it).
    pub fn reclaim_labels(&self) -> Option<BTreeMap<String, Option<String>>> {
        self.annotations.get(RECLAIM_LABELS).and_then(|t| serde_json::from_str(t).ok())
    }

    /// When the controller last changed it.
    pub fn changed_at(&self) -> Option<i64> {
        self.annotations.get(CHANGED_AT).and_then(|v| v.parse().ok())
    }

    /// Its GPU model id (`None` without GPUs; `Err` for a node with several models).
    pub fn model(&self) -> Result<Option<&str>, String> {
        let mut models: Vec<&str> = self.gpus.iter().map(|g| g.model.as_str()).collect();
        models.dedup();
        match models.as_slice() {
            [] => Ok(None),
            [m] => Ok(Some(m)),
            more => Err(format!(
                "holds several GPU models ({}); the controller changes single-model nodes",
                more.join(", ")
            )),
        }
    }

    /// Whether the agent has settled on the requested layout.
    pub fn phase(&self) -> Phase {
        let state = self.state().unwrap_or("");
        let reason = self.annotations.get(crate::keys::STATE_REASON).cloned().unwrap_or_default();
        match (state, self.layout()) {
            ("failed", _) => Phase::Failed(if reason.is_empty() { "the agent reports failed".into() } else { reason }),
            ("pending" | "rebooting", Some(l)) => {
                Phase::Reconfiguring(format!("the agent is applying '{l}' ({state})"))
            }
            (_, None) => Phase::Settled,
            (_, Some(l)) if self.annotations.get(STATE_LAYOUT).map(String::as_str) != Some(l) => {
                Phase::Reconfiguring(format!("the agent has not reported '{l}' yet"))
            }
            ("success", _) => Phase::Settled,
            (other, Some(l)) => Phase::Reconfiguring(format!("the agent reports '{other}' for '{l}'")),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Node object with an agent's annotation for `gpus` (annotation items), labels and taints.
    pub fn node(name: &str, gpus: &str, labels: &[(&str, &str)], dedicated: bool) -> Node {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": "7", "annotations": {GPUS_ANNOTATION: gpus}},
            "spec": {}
        }))
        .unwrap();
        n.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        if dedicated {
            n.spec.as_mut().unwrap().taints = Some(vec![Taint {
                key: crate::controller::pods::DEDICATED_TAINT_KEY.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]);
        }
        n
    }

    #[test]
    fn the_phase_follows_the_agents_state_for_the_requested_layout() {
        let g = r#"[{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["3g.40gb@0*","3g.40gb@4"]}]"#;
        let n = GpuNode::read(&node("a", g, &[(LAYOUT_LABEL, "x"), (STATE_LABEL, "success")], false)).unwrap().unwrap();
        assert!(matches!(n.phase(), Phase::Reconfiguring(r) if r.contains("not reported 'x'")));
        let mut n2 = n.clone();
        n2.annotations.insert(STATE_LAYOUT.into(), "x".into());
        assert_eq!(n2.phase(), Phase::Settled);
        n2.labels.insert(STATE_LABEL.into(), "failed".into());
        assert!(matches!(n2.phase(), Phase::Failed(_)));
        assert_eq!(n.gpus[0].instances.len(), 2);
        assert!(n.gpus[0].instances[0].busy);
        assert_eq!(n.model(), Ok(Some("A100-SXM4-80GB")));
        assert!(!n.is_dedicated(&Pools::default()));
        let d = GpuNode::read(&node("d", g, &[], true)).unwrap().unwrap();
        assert!(d.is_dedicated(&Pools::default()) && !d.dedicated_by_controller(&Pools::default()));
        let plain: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "cpu"}})).unwrap();
        assert_eq!(GpuNode::read(&plain), Ok(None));
        let bad = node("b", "{", &[], false);
        assert!(GpuNode::read(&bad).unwrap_err().contains("node 'b'"));
    }
}
