//! The node summary the agent publishes for schedulers and people: compact JSON annotations with
//! each GPU's layout (`profile@start`, `*` when busy), the pods holding its instances, creatable
//! counts and fragmentation, the node
//! figures, and a selectable boolean label. Contains no timestamps, so it only changes when the
//! GPUs do (zero writes at steady state).

use crate::frag::GpuFrag;
use crate::health::HealthBook;
use crate::observed::GpuState;
use serde_json::json;
use std::collections::BTreeMap;

/// Labels and annotations (keys without the prefix) describing the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Label name → value.
    pub labels: BTreeMap<String, String>,
    /// Annotation name → value.
    pub annotations: BTreeMap<String, String>,
}

/// Takes the capacity of unhealthy GPUs out of their figures: nothing creatable, not a free
/// whole GPU, no unallocated capacity (what schedulers and the controller read).
fn fence(frags: &mut [GpuFrag], book: &HealthBook) {
    for f in frags.iter_mut().filter(|f| book.is_unhealthy(f.index)) {
        f.profiles.iter_mut().for_each(|p| p.creatable = 0);
        (f.largest_creatable, f.largest_creatable_slices) = (None, 0);
        (f.whole_free, f.idle_without_mig) = (false, false);
        (f.unallocated_gpus, f.fragmented_gpus) = (0.0, 0.0);
    }
}

/// Builds the summary of the observed GPUs and their figures (`frags`, in `states` order): the
/// capacity of unhealthy GPUs is taken out first, and each carries `"unhealthy": "<reason>"`
/// (a faulty MIG device is listed in `unhealthyDevices`).
pub fn summarize(
    states: &[GpuState],
    mut frags: Vec<GpuFrag>,
    configured_workload: bool,
    fenced: &HealthBook,
    foreign: &BTreeMap<u32, Vec<u32>>,
) -> Summary {
    fence(&mut frags, fenced);
    let node = &crate::frag::node_frag(&frags);
    let frags = &frags;
    let gpus: Vec<serde_json::Value> = states
        .iter()
        .zip(frags)
        .map(|(s, f)| {
            let mut gis: Vec<_> = s.instances.iter().collect();
            gis.sort_by_key(|g| g.placement.start);
            let layout: Vec<String> = gis
                .iter()
                .map(|g| format!("{}@{}{}", s.gi_name(g), g.placement.start, if g.busy() { "*" } else { "" }))
                .collect();
            let creatable: BTreeMap<&str, u32> =
                f.profiles.iter().filter(|p| p.creatable > 0).map(|p| (p.profile.as_str(), p.creatable)).collect();
            let mode = f.partition_mode();
            let mut g = json!({"i": s.info.index, "uuid": s.info.uuid, "model": s.info.model, "mode": mode});
            if f.mps_slots > 0 {
                g["slots"] = json!(f.mps_slots);
                g["slotsUsed"] = json!(f.mps_slots_used);
            } else if f.mig_enabled {
                g["layout"] = json!(layout);
                // Who holds each instance the kubelet allocated (PodResources): `ns/name` by
                // `profile@start`, only for instances some pod holds.
                let pods: BTreeMap<String, Vec<String>> = gis
                    .iter()
                    .filter_map(|g| {
                        let mut who: Vec<String> = g.all_pods().map(|u| format!("{}/{}", u.namespace, u.pod)).collect();
                        who.sort();
                        who.dedup();
                        (!who.is_empty()).then(|| (format!("{}@{}", s.gi_name(g), g.placement.start), who))
                    })
                    .collect();
                if !pods.is_empty() {
                    g["pods"] = json!(pods);
                }
                // Instances the layout does not hold (the agent) or no claim holds (`--dra`).
                let strangers: Vec<String> = gis
                    .iter()
                    .filter(|g| foreign.get(&s.info.index).is_some_and(|f| f.contains(&g.placement.start)))
                    .map(|g| format!("{}@{}", s.gi_name(g), g.placement.start))
                    .collect();
                if !strangers.is_empty() {
                    g["foreign"] = json!(strangers);
                }
                g["creatable"] = json!(creatable);
                g["largest"] = json!(f.largest_creatable.as_deref().unwrap_or("none"));
                g["frag"] = json!((f.expected_fragmentation_ratio * 1000.0).round() / 1000.0);
            } else {
                g["busy"] = json!(!f.idle_without_mig);
            }
            if let Some(u) = fenced.unhealthy().get(&s.info.index) {
                g["unhealthy"] = json!(u.reason);
            }
            let faulty: BTreeMap<String, &str> =
                fenced.mig_faults(s.info.index).map(|m| (m.device(), m.fault.reason.as_str())).collect();
            if !faulty.is_empty() {
                g["unhealthyDevices"] = json!(faulty);
            }
            g
        })
        .collect();
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let fragmentation = json!({
        "ratio": round(node.fragmentation_ratio),
        "fragmentedGpus": round(node.fragmented_gpus),
        "unallocatedGpus": round(node.unallocated_gpus),
        "wholeFreeGpus": node.whole_free_gpus,
        "workload": if configured_workload { "config" } else { "uniform-base-profiles" },
    });
    let mut labels = BTreeMap::from([("free-full-gpus".to_string(), (node.whole_free_gpus > 0).to_string())]);
    if frags.iter().any(|f| f.mps_slots > 0) {
        labels.insert("mps".to_string(), "true".to_string());
    }
    Summary {
        labels,
        annotations: BTreeMap::from([
            ("gpus".to_string(), serde_json::to_string(&gpus).unwrap_or_default()),
            ("fragmentation".to_string(), fragmentation.to_string()),
        ]),
    }
}
