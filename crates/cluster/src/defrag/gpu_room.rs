//! Label mode: the cheapest GPU on which moving pods makes room for a waiting MIG pod (pure). A
//! GPU qualifies when every busy instance on it is held by pods the agent names
//! (`gpupart.io/gpus`, `pods`), all of them movable, each holding nothing on another GPU, each
//! fitting elsewhere now ([`place`]); and when the GPU, those instances idle, has a setting that
//! offers the waiting pod's profile (the controller's GPU options: the fewest instances destroyed,
//! the node planner's diff). Cheapest: fewest pods, then the least GPU share, then the youngest,
//! then the fewest instances destroyed.
//!
//! The controller carries a room out in one node patch: the node's layout with the GPU's new
//! setting, the [`ROOM_TAINT`] (no new pod lands on the node while its moved pods' instances are
//! free but not yet re-cut: their replacements go elsewhere) and the [`RoomNote`] under
//! [`ROOM_ANNOTATION`] (what a new leader needs to finish or release it). The agent applies the
//! layout once the moved pods are gone; the taint is lifted then, and the note when the waiting
//! pod is bound or the room expires.

use super::empty_node::{place, Host};
use super::movable::{immovable, MoveRules};
use crate::controller::gpu_options::{observed_spec, options};
use crate::controller::nodes::{GpuNode, Phase};
use crate::controller::pods::{GpuPod, Resource};
use crate::fleet::report::GpuSpec;
use crate::mig::catalog::Model;
use crate::pools::Pools;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// The node annotation recording a room being made ([`RoomNote`] as JSON).
pub const ROOM_ANNOTATION: &str = "gpupart.io/defrag-room";
/// The `NoSchedule` taint key that keeps new pods off a node while a room is made on it.
pub const ROOM_TAINT: &str = "gpupart.io/defrag-room";

/// A room being made on a node, as recorded on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoomNote {
    /// The waiting pod (`namespace/name`).
    pub pod: String,
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The MIG profile made room for.
    pub profile: String,
    /// When the room is released unless the pod got it (seconds since the epoch).
    pub until: i64,
}

impl RoomNote {
    /// The note on a node's annotations: `None` without one, `Err` when it does not parse.
    pub fn on(annotations: &BTreeMap<String, String>) -> Option<Result<RoomNote, String>> {
        let text = annotations.get(ROOM_ANNOTATION)?;
        Some(serde_json::from_str(text).map_err(|e| format!("annotation {ROOM_ANNOTATION} does not parse: {e}")))
    }

    /// Whether the room is there on `node` as read: the agent reports the requested layout
    /// applied, and the GPU has a free instance of the profile.
    pub fn ready(&self, node: &GpuNode) -> bool {
        node.phase() == Phase::Settled
            && node
                .gpus
                .iter()
                .filter(|g| g.index == self.gpu)
                .any(|g| g.instances.iter().any(|i| !i.busy && i.profile.to_string() == self.profile))
    }

    /// The pods holding instances of the GPU on `node`, apart from the one the room is for.
    pub fn holders(&self, node: &GpuNode) -> BTreeSet<String> {
        node.holders()
            .into_iter()
            .filter(|((g, _), _)| *g == self.gpu)
            .flat_map(|(_, who)| who)
            .filter(|w| *w != self.pod)
            .collect()
    }

    /// The taint that goes with it.
    pub fn taint() -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint { key: ROOM_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() }
    }
}

/// A GPU made room on.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRoom {
    /// The node.
    pub node: String,
    /// The GPU's NVML index.
    pub gpu: u32,
    /// Its new setting, which offers the waiting pod's profile.
    pub spec: GpuSpec,
    /// The change in words (`+1 7g.80gb`, `-7 1g.10gb`).
    pub change: Vec<String>,
    /// GPU instances it creates.
    pub created: u32,
    /// Each moved pod and the node its replacement is expected on.
    pub moves: Vec<(String, String)>,
    /// (pods, share in compute slices, creation times summed reversed, instances destroyed).
    pub cost: (usize, u32, Reverse<i64>, u32),
}

/// The cheapest room for `waiting` (one instance of a MIG profile) on a GPU of `hosts`, where
/// `model_of` gives a host's GPU model, `None` for a host the room may not be made on (one that
/// may not change now); `None` when no GPU qualifies.
pub fn plan(
    hosts: &[Host],
    model_of: &dyn Fn(usize) -> Option<&'static Model>,
    pods: &[GpuPod],
    waiting: &GpuPod,
    rules: &MoveRules,
    now: i64,
    pools: &Pools,
) -> Option<GpuRoom> {
    let Resource::Mig(_) = &waiting.resource else { return None };
    if waiting.count != 1 {
        return None;
    }
    let by_key: BTreeMap<&str, &GpuPod> = pods.iter().map(|p| (p.key.as_str(), p)).collect();
    let w = waiting.running();
    let mut best: Option<GpuRoom> = None;
    for (i, h) in hosts.iter().enumerate() {
        let node = h.node;
        let waiting_lands = crate::controller::fit::blocked(
            &waiting.constraints,
            &node.name,
            &node.labels,
            &node.taints,
            &node.room,
            &pools.taint.key,
        )
        .is_none();
        if !h.takes_replacements || !waiting_lands {
            continue;
        }
        let Some(model) = model_of(i) else { continue };
        let holders = node.holders();
        for g in node.gpus.iter().filter(|g| g.mig) {
            let mut moving: BTreeSet<&str> = BTreeSet::new();
            let mut ok = true;
            for inst in g.instances.iter().filter(|x| x.busy) {
                match holders.get(&(g.index, inst.start)) {
                    Some(who) if !who.is_empty() => moving.extend(who.iter().map(String::as_str)),
                    _ => ok = false,
                }
            }
            // Nothing to move (the scheduler or a repartition serves it) or something unnamed in use.
            if !ok || moving.is_empty() {
                continue;
            }
            let elsewhere = |k: &str| holders.iter().any(|((gi, _), who)| *gi != g.index && who.iter().any(|w| w == k));
            let mut moved: Vec<&GpuPod> = Vec::new();
            for k in &moving {
                match by_key.get(k) {
                    Some(p)
                        if p.node() == Some(node.name.as_str())
                            && p.also.is_empty()
                            && !elsewhere(k)
                            && immovable(&p.running(), &w.namespace, w.owner.as_ref(), rules, now).is_none() =>
                    {
                        moved.push(p)
                    }
                    _ => ok = false,
                }
            }
            if !ok {
                continue;
            }
            let mut idle = g.clone();
            for x in &mut idle.instances {
                x.busy = false;
            }
            let wanted = BTreeSet::from([waiting.resource.clone()]);
            let Ok(opts) = options(model, &idle, observed_spec(&idle), &wanted, 4) else { continue };
            let Some(o) = opts
                .into_iter()
                .filter(|o| o.offers.get(&waiting.resource).copied().unwrap_or(0) >= 1)
                .min_by_key(|o| o.destroyed)
            else {
                continue;
            };
            moved.sort_by(|a, b| a.queue_cmp(b));
            let Ok(moves) = place(i, hosts, &moved, pools) else { continue };
            let share: u32 = moved.iter().map(|p| p.resource.compute_slices() * p.count).sum();
            let age: i64 = moved.iter().map(|p| p.created.unwrap_or(now)).sum();
            let cost = (moved.len(), share, Reverse(age), o.destroyed);
            let room = GpuRoom {
                node: node.name.clone(),
                gpu: g.index,
                spec: o.spec,
                change: o.change,
                created: o.created,
                moves,
                cost,
            };
            if best.as_ref().is_none_or(|b| (&room.cost, &room.node, room.gpu) < (&b.cost, &b.node, b.gpu)) {
                best = Some(room);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests;
