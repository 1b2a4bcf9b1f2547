//! How plans go on (evictions, budgets, workloads one pod at a time, caps) and how they end.

use crate::controller::cluster::{node_ref, pod_ref, Cluster};
use crate::controller::evict::{evict, Eviction};
use crate::controller::lease::Leadership;
use crate::controller::metrics::ControllerMetrics;
use gpupart_cluster::controller::nodes::GpuNode;
use gpupart_cluster::defrag::dra_world;
use gpupart_cluster::defrag::gpu_room::{RoomNote, ROOM_ANNOTATION, ROOM_TAINT};
use gpupart_cluster::defrag::movable::{immovable, Owner, RunningPod};
use gpupart_node::dra::reservation::{Reservation, ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

use super::campaign::*;
use super::{bound_node, ready, Defrag, Seen};

impl Defrag {
    /// Carries plan `node` on, or ends it.
    pub(super) async fn go_on(
        &mut self,
        cluster: &Cluster,
        leadership: &Leadership,
        metrics: &ControllerMetrics,
        seen: &Seen,
        node: &str,
        now: i64,
    ) {
        let Some(mut c) = self.campaigns.get(node).cloned() else { return };
        let pod = seen.pods.get(&c.waiting).filter(|p| c.uid.is_none() || p.metadata.uid == c.uid);
        let end = match pod {
            None => Some((End::Abandoned, "the waiting pod is gone".to_string())),
            Some(p) => match bound_node(p) {
                Some(n) if n == c.node => Some((End::Served, format!("bound to node {n}, into the room"))),
                Some(n) => Some((End::ServedElsewhere, format!("bound to node {n}, not into the room"))),
                None if now >= c.until => {
                    let pending = |s: &&Step| !s.done;
                    Some(match c.steps.iter().filter(pending).find_map(|s| s.blocked.clone()) {
                        Some(why) => (End::Blocked, format!("a PodDisruptionBudget kept a pod in place: {why}")),
                        None => match c.steps.iter().filter(pending).find_map(|s| s.held_back.clone()) {
                            Some(why) => (End::Expired, format!("not bound within --defrag-confirm-timeout: {why}")),
                            None => (End::Expired, "not bound within --defrag-confirm-timeout".to_string()),
                        },
                    })
                }
                None => None,
            },
        };
        if let Some((end, why)) = end {
            self.end(cluster, metrics, c, end, &why, now).await;
            return;
        }
        let mut gpu_room: Option<(GpuNode, RoomNote)> = None;
        match c.hold.clone() {
            Hold::Node => {}
            Hold::Dra(reservation) => {
                let Some(room) = seen.rooms.iter().find(|r| r.name == c.node) else {
                    self.end(cluster, metrics, c, End::Abandoned, "the node no longer publishes its devices", now)
                        .await;
                    return;
                };
                if c.adopted && c.steps.is_empty() {
                    let holders: BTreeSet<String> = room
                        .gpus
                        .iter()
                        .filter(|g| reservation.gpus.contains(&g.index))
                        .flat_map(|g| g.held.iter().map(|h| h.by.clone()))
                        .collect();
                    match self.steps_of(seen, &c, holders, now) {
                        Ok(steps) => c.steps = steps,
                        Err(why) => {
                            self.end(cluster, metrics, c, End::Abandoned, &why, now).await;
                            return;
                        }
                    }
                }
                if !dra_world::reservation_published(&seen.slices, &self.args.dra_driver, room, &reservation, now) {
                    tracing::debug!(node, "waiting for the agent to publish the reservation before evicting");
                    self.campaigns.insert(node.to_string(), c);
                    return;
                }
            }
            Hold::Gpu(note) => {
                let read =
                    seen.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node)).map(|n| GpuNode::read(n));
                let Some(Ok(Some(gpus))) = read else {
                    self.end(cluster, metrics, c, End::Abandoned, "the node no longer reports its GPUs", now).await;
                    return;
                };
                if c.adopted && c.steps.is_empty() {
                    match self.steps_of(seen, &c, note.holders(&gpus), now) {
                        Ok(steps) => c.steps = steps,
                        Err(why) => {
                            self.end(cluster, metrics, c, End::Abandoned, &why, now).await;
                            return;
                        }
                    }
                }
                gpu_room = Some((gpus, note));
            }
        }
        let mut refused: Option<String> = None;
        for i in 0..c.steps.len() {
            let s = c.steps[i].clone();
            if s.done || s.next_try > now {
                continue;
            }
            let Some(p) = seen.pods.get(&s.pod).filter(|p| p.metadata.deletion_timestamp.is_none()) else {
                c.steps[i].done = true;
                continue;
            };
            let ns = p.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            if let Some(o) = &s.owner {
                if let Some(why) = self.owner_busy(seen, &ns, o) {
                    if c.steps[i].held_back.as_deref() != Some(why.as_str()) {
                        tracing::info!(pod = %s.pod, reason = %why, "waiting before the next eviction of its workload");
                    }
                    c.steps[i].held_back = Some(why);
                    continue;
                }
            }
            if let Some(why) = self.capped(node, 1) {
                if self.tell(&format!("cap {node}"), &why) {
                    tracing::info!(node, pod = %s.pod, reason = %why, "eviction postponed");
                }
                continue;
            }
            if !leadership.leads() {
                tracing::warn!("lost the Lease; the plan is left to the next leader");
                self.campaigns.insert(node.to_string(), c);
                return;
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            match evict(&self.client, &ns, &name).await {
                Ok(Eviction::Evicted) => {
                    metrics.eviction("evicted");
                    self.evictions.push((now, node.to_string()));
                    if let Some(o) = &s.owner {
                        self.owner_evicted.insert(workload(&ns, o), now);
                    }
                    c.steps[i].done = true;
                    c.steps[i].blocked = None;
                    let note = format!(
                        "evicted to make room for {} ({}); its replacement is expected on {}",
                        c.waiting,
                        c.room(),
                        s.to
                    );
                    tracing::info!(pod = %s.pod, for_pod = %c.waiting, node, replacement_on = %s.to, "evicted to make room");
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    cluster.event(&pod_ref(&ns, &name, &uid), false, "Defragmenting", "Evict", &note);
                }
                Ok(Eviction::Gone) => {
                    metrics.eviction("gone");
                    c.steps[i].done = true;
                }
                Ok(Eviction::Blocked(why)) => {
                    metrics.eviction("blocked");
                    let tries = s.tries + 1;
                    c.steps[i].tries = tries;
                    c.steps[i].next_try = now + (5i64 << tries.min(4)).min(60);
                    if s.blocked.is_none() {
                        tracing::info!(pod = %s.pod, for_pod = %c.waiting, reason = %why, "a PodDisruptionBudget allows no eviction now; retrying while the plan holds");
                        let (wns, wname) = c.waiting.split_once('/').unwrap_or(("default", &c.waiting));
                        let note = format!("moving {} waits: {why}", s.pod);
                        let uid = c.uid.clone().unwrap_or_default();
                        cluster.event(&pod_ref(wns, wname, &uid), true, "DefragmentBlocked", "Evict", &note);
                    }
                    c.steps[i].blocked = Some(why);
                }
                Ok(Eviction::Refused(why)) => {
                    metrics.eviction("refused");
                    refused = Some(format!("the eviction of {} was refused: {why}", s.pod));
                    break;
                }
                Err(e) => {
                    metrics.eviction("error");
                    tracing::warn!(pod = %s.pod, error = %format!("{e:#}"), "the eviction failed; retrying at the next batch");
                }
            }
        }
        if let Some(why) = refused {
            self.end(cluster, metrics, c, End::Refused, &why, now).await;
            return;
        }
        if let Some((gpus, note)) = gpu_room {
            open_room(cluster, &gpus, &note, &c).await;
        }
        self.campaigns.insert(node.to_string(), c);
    }

    /// The steps of an adopted plan: the pods `holders` of the reserved room, all of which must be
    /// movable.
    pub(super) fn steps_of(
        &self,
        seen: &Seen,
        c: &Campaign,
        holders: BTreeSet<String>,
        now: i64,
    ) -> Result<Vec<Step>, String> {
        let waiting = seen.pods.get(&c.waiting);
        let (wns, wowner) = waiting.map_or(("default".to_string(), None), |p| {
            let r = RunningPod::read(p);
            (r.namespace.clone(), r.owner)
        });
        let mut steps = Vec::new();
        for by in holders.iter().filter(|by| **by != c.waiting) {
            let Some(p) = seen.pods.get(by) else {
                return Err(format!("the room is held by {by}, which may not move"));
            };
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let r = RunningPod::read(p);
            if let Some(why) = immovable(&r, &wns, wowner.as_ref(), &self.rules, now) {
                return Err(format!("the room is held by {by}, which may not move: {why}"));
            }
            steps.push(Step::new(by.to_string(), r.owner, "another GPU".into()));
        }
        Ok(steps)
    }

    /// Why another pod of workload `owner` may not be evicted yet: its previous replacement is
    /// not Ready.
    pub(super) fn owner_busy(&self, seen: &Seen, ns: &str, owner: &Owner) -> Option<String> {
        let at = *self.owner_evicted.get(&workload(ns, owner))?;
        let of_owner: Vec<&Arc<Pod>> = seen
            .pods
            .values()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| RunningPod::read(p).owner.as_ref() == Some(owner))
            .collect();
        let replaced = of_owner
            .iter()
            .any(|p| p.metadata.creation_timestamp.as_ref().is_some_and(|t| t.0.as_second() >= at) && ready(p));
        let unready = of_owner.iter().any(|p| p.metadata.deletion_timestamp.is_none() && !ready(p));
        (!replaced || unready)
            .then(|| format!("the replacement of the last evicted pod of {} {} is not Ready", owner.kind, owner.name))
    }

    /// Why `n` more evictions on `node` would pass a cap, if they would.
    pub(super) fn capped(&self, node: &str, n: usize) -> Option<String> {
        let all = self.evictions.len();
        let here = self.evictions.iter().filter(|(_, x)| x == node).count();
        if all + n > self.args.defrag_max_evictions as usize {
            return Some(format!(
                "{all} evictions in the last hour, --defrag-max-evictions {}",
                self.args.defrag_max_evictions
            ));
        }
        if here + n > self.args.defrag_max_evictions_per_node as usize {
            return Some(format!(
                "{here} evictions on node {node} in the last hour, --defrag-max-evictions-per-node {}",
                self.args.defrag_max_evictions_per_node
            ));
        }
        None
    }

    /// Ends plan `c`: the reservation released, the outcome told and counted.
    pub(super) async fn end(
        &mut self,
        cluster: &Cluster,
        metrics: &ControllerMetrics,
        c: Campaign,
        end: End,
        why: &str,
        now: i64,
    ) {
        let node = cluster.nodes().into_iter().find(|n| n.metadata.name.as_deref() == Some(c.node.as_str()));
        if let Some(release) = node.as_deref().and_then(|n| release_patch(n, &c)) {
            if let Err(e) = cluster.patch_node(&c.node, &release.patch).await {
                tracing::warn!(node = %c.node, error = %e, "releasing the reservation failed; retrying at the next batch");
                self.campaigns.insert(c.node.clone(), c);
                return;
            }
            // Until the node cache shows it gone, the released reservation is not one to adopt.
            self.released.insert(c.node.clone(), release.text);
        }
        self.campaigns.remove(&c.node);
        let waited = (end == End::Served).then(|| (now - c.since).max(0) as f64);
        metrics.plan(end.as_str(), waited);
        let (ns, name) = c.waiting.split_once('/').unwrap_or(("default", &c.waiting));
        let uid = c.uid.clone().unwrap_or_default();
        let room = c.room();
        if end == End::Served {
            tracing::info!(pod = %c.waiting, node = %c.node, waited_s = waited.unwrap_or(0.0), "served: bound into the room");
            let note = format!("bound into the room made on {room}");
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmented", "Confirm", &note);
        } else {
            tracing::warn!(pod = %c.waiting, node = %c.node, outcome = end.as_str(), reason = why, "the plan ended without serving the pod; the room is released");
            if !matches!(end, End::ServedElsewhere | End::Abandoned) {
                self.failed.insert(c.waiting.clone(), Failure { at: now, signature: c.signature.clone() });
            }
            let note = format!("the room ({room}) is released: {why}");
            if end != End::Abandoned || !why.contains("gone") {
                cluster.event(&pod_ref(ns, name, &uid), true, "DefragmentFailed", "Release", &note);
            }
            cluster.event(
                &node_ref(&c.node, None),
                true,
                "DefragmentFailed",
                "Release",
                &format!("for {}: {note}", c.waiting),
            );
        }
    }
}

/// A reservation to release: the node patch, and the annotation's text it removes.
struct Release {
    patch: Value,
    text: String,
}

/// The patch that releases what plan `c` holds on `node`: its reservation (DRA) or its room note
/// and taint (label mode), when they are the plan's own; `None` when nothing of it is there.
fn release_patch(node: &k8s_openapi::api::core::v1::Node, c: &Campaign) -> Option<Release> {
    let annotation = |key: &str| node.metadata.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    match &c.hold {
        Hold::Node => None,
        Hold::Dra(_) => {
            let text = annotation(ANNOTATION)?;
            let ours = serde_json::from_str::<Reservation>(&text).is_ok_and(|r| r.pod == c.waiting);
            ours.then(|| Release { patch: json!({"metadata": {"annotations": {ANNOTATION: null}}}), text })
        }
        Hold::Gpu(_) => {
            let text = annotation(ROOM_ANNOTATION)?;
            let ours = serde_json::from_str::<RoomNote>(&text).is_ok_and(|r| r.pod == c.waiting);
            let mut patch = json!({"metadata": {"annotations": {ROOM_ANNOTATION: null}}});
            if let Some(taints) = without_room_taint(node) {
                patch["spec"] = json!({ "taints": taints });
                patch["metadata"]["resourceVersion"] = json!(node.metadata.resource_version);
            }
            ours.then_some(Release { patch, text })
        }
    }
}

/// The node's taints less the room's, when it carries it (a merge patch replaces the list, so the
/// patch that writes it holds the node's resourceVersion).
fn without_room_taint(node: &k8s_openapi::api::core::v1::Node) -> Option<Vec<Value>> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    if !taints.iter().any(|t| t.key == ROOM_TAINT) {
        return None;
    }
    Some(
        taints.iter().filter(|t| t.key != ROOM_TAINT).map(|t| serde_json::to_value(t).unwrap_or(Value::Null)).collect(),
    )
}

/// Lifts the room's taint once the room is there (the agent applied the layout, the GPU has a
/// free instance of the profile): the waiting pod can be bound then, and only it fits there.
async fn open_room(cluster: &Cluster, gpus: &GpuNode, note: &RoomNote, c: &Campaign) {
    if !note.ready(gpus) {
        return;
    }
    let Some(node) = cluster.nodes().into_iter().find(|n| n.metadata.name.as_deref() == Some(c.node.as_str())) else {
        return;
    };
    let Some(taints) = without_room_taint(&node) else { return };
    let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": taints}});
    match cluster.patch_node(&c.node, &patch).await {
        Ok(()) => {
            tracing::info!(node = %c.node, pod = %c.waiting, gpu = note.gpu, profile = %note.profile, "the room is ready: the node takes pods again")
        }
        Err(e) => {
            tracing::debug!(node = %c.node, error = %e, "lifting the room's taint failed; retrying at the next batch")
        }
    }
}
