//! How plans begin: label-mode nodes reserved for a tensor-parallel pod, reservations a previous
//! leader wrote, and new plans for pods whose claims wait on DRA nodes.

use crate::controller::cluster::{pod_ref, Cluster};
use crate::controller::metrics::ControllerMetrics;
use gpupart_cluster::controller::decide::Drain;
use gpupart_cluster::defrag::dra_world;
use gpupart_cluster::defrag::gpu_room::{RoomNote, ROOM_ANNOTATION};
use gpupart_cluster::defrag::movable::{immovable, RunningPod};
use gpupart_cluster::defrag::room::{self, Bounds, Movable, Want};
use gpupart_node::dra::reservation::{Reservation, ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::campaign::*;
use super::{bound_node, key, waiting_since, Defrag, Seen};

impl Defrag {
    /// Starts a plan for each label-mode node reserved for a tensor-parallel pod whose pods can
    /// all move now, and for each room on a GPU whose node patch landed this batch (`made`).
    pub(super) async fn take_drains(
        &mut self,
        cluster: &Cluster,
        metrics: &ControllerMetrics,
        seen: &Seen,
        drains: &[Drain],
        made: &BTreeSet<String>,
        now: i64,
    ) {
        for d in drains {
            if self.campaigns.contains_key(&d.node) || self.campaigns.values().any(|c| c.waiting == d.for_pod) {
                continue;
            }
            // A room whose node patch did not land (refused, or a dry run) moves nothing.
            if d.room.is_some() && !made.contains(&d.node) {
                continue;
            }
            let moves = match &d.moves {
                Ok(m) => m,
                Err(why) => {
                    if self.tell(&d.for_pod, why) {
                        tracing::info!(pod = %d.for_pod, node = %d.node, reason = %why, "the reserved node cannot be emptied by moving pods now; it converts once its pods end");
                    }
                    continue;
                }
            };
            let signature = drain_signature(d);
            if let Some(f) = self.failed.get(&d.for_pod) {
                if f.signature == signature || now - f.at < self.args.defrag_cooldown.as_secs() as i64 {
                    continue;
                }
            }
            if let Some(why) = self.capped(&d.node, moves.len()) {
                if self.tell(&d.for_pod, &why) {
                    tracing::info!(pod = %d.for_pod, reason = %why, "a plan waits for the eviction caps");
                }
                continue;
            }
            let Some(p) = seen.pods.get(&d.for_pod) else { continue };
            let words: Vec<String> = moves.iter().map(|(pod, to)| format!("{pod} to node {to}")).collect();
            let (hold, until, note) = match &d.room {
                Some(r) => (
                    Hold::Gpu(r.clone()),
                    r.until,
                    format!(
                        "moving {} to make room for one {} instance on node {} GPU {}",
                        words.join(", "),
                        r.profile,
                        d.node,
                        r.gpu
                    ),
                ),
                None => (
                    Hold::Node,
                    now + self.args.defrag_confirm_timeout.as_secs() as i64,
                    format!("moving {} to empty node {}, reserved for it", words.join(", "), d.node),
                ),
            };
            metrics.plan("started", None);
            tracing::info!(pod = %d.for_pod, node = %d.node, moves = ?words, "defragmenting: {note}");
            let (ns, name) = d.for_pod.split_once('/').unwrap_or(("default", &d.for_pod));
            let uid = p.metadata.uid.clone().unwrap_or_default();
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmenting", "Plan", &note);
            let steps = moves
                .iter()
                .map(|(pod, to)| {
                    Step::new(
                        pod.clone(),
                        seen.pods.get(pod).and_then(|p| RunningPod::read(p).owner),
                        format!("node {to}"),
                    )
                })
                .collect();
            self.told.remove(&d.for_pod);
            self.campaigns.insert(
                d.node.clone(),
                Campaign {
                    waiting: d.for_pod.clone(),
                    uid: p.metadata.uid.clone(),
                    since: waiting_since(p, now),
                    node: d.node.clone(),
                    until,
                    hold,
                    steps,
                    signature,
                    adopted: false,
                },
            );
        }
    }

    /// Takes up the reservations (DRA) and rooms (label mode) found on nodes that this replica did
    /// not write: a previous leader's plans.
    pub(super) fn adopt(&mut self, seen: &Seen, now: i64) {
        for n in &seen.nodes {
            let Some(name) = n.metadata.name.as_deref() else { continue };
            if self.campaigns.contains_key(name) {
                continue;
            }
            let annotations = n.metadata.annotations.as_ref();
            let found = [ANNOTATION, ROOM_ANNOTATION]
                .into_iter()
                .find_map(|key| Some((key, annotations.and_then(|a| a.get(key))?)));
            let Some((key, text)) = found else {
                self.released.remove(name);
                continue;
            };
            if self.released.get(name) == Some(text) {
                continue;
            }
            let read = if key == ANNOTATION {
                serde_json::from_str::<Reservation>(text)
                    .map(|r| (r.pod.clone(), r.until, format!("{name}:{}", gpus_words(&r.gpus)), Hold::Dra(r)))
            } else {
                serde_json::from_str::<RoomNote>(text)
                    .map(|r| (r.pod.clone(), r.until, format!("{name}:GPU {}", r.gpu), Hold::Gpu(r)))
            };
            let Ok((pod, until, signature, hold)) = read else {
                if self.tell(&format!("node {name}"), text) {
                    tracing::warn!(node = name, annotation = key, "a reservation that does not parse; left alone");
                }
                continue;
            };
            tracing::info!(node = name, pod = %pod, annotation = key, "found a reservation made earlier; taking the plan up");
            let since = seen.pods.get(&pod).map_or(now, |p| waiting_since(p, now));
            self.campaigns.insert(
                name.to_string(),
                Campaign {
                    waiting: pod,
                    uid: None,
                    since,
                    node: name.to_string(),
                    signature,
                    until,
                    hold,
                    steps: Vec::new(),
                    adopted: true,
                },
            );
        }
    }

    /// New plans for the pods that wait and that nothing serves now.
    pub(super) async fn plan_new(&mut self, cluster: &Cluster, metrics: &ControllerMetrics, seen: &Seen, now: i64) {
        let claims: BTreeMap<(String, String), &k8s_openapi::api::resource::v1::ResourceClaim> = seen
            .claims
            .iter()
            .map(|c| {
                let k = (c.metadata.namespace.clone().unwrap_or_default(), c.metadata.name.clone().unwrap_or_default());
                (k, c)
            })
            .collect();
        let classes: BTreeMap<String, &k8s_openapi::api::resource::v1::DeviceClass> =
            seen.classes.iter().map(|c| (c.metadata.name.clone().unwrap_or_default(), c)).collect();
        let mut waiting: Vec<(&Arc<Pod>, Want)> = Vec::new();
        for p in seen.pods.values().filter(|p| dra_world::unschedulable(p)) {
            let k = key(p);
            if self.campaigns.values().any(|c| c.waiting == k) {
                continue;
            }
            match dra_world::want(p, &claims, &classes, &self.args.dra_driver) {
                Ok(Some(w)) => waiting.push((p, w)),
                Ok(None) => {}
                Err(why) => {
                    if self.tell(&k, &why) {
                        tracing::info!(pod = %k, reason = %why, "no defragmentation plan for this pod");
                    }
                }
            }
        }
        // The scheduler's queue order: higher priority first, then older.
        waiting.sort_by_key(|(p, _)| {
            let prio = p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            (std::cmp::Reverse(prio), p.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()), key(p))
        });
        let k8s_nodes: Vec<k8s_openapi::api::core::v1::Node> = seen.nodes.iter().map(|n| (**n).clone()).collect();
        let candidates = if waiting.is_empty() { Vec::new() } else { self.movable_pods(seen, &k8s_nodes, now) };
        for (p, want) in waiting {
            let k = key(p);
            if let Some(f) = self.failed.get(&k) {
                if now - f.at < self.args.defrag_cooldown.as_secs() as i64 {
                    continue;
                }
            }
            let free: Vec<room::Node> =
                seen.rooms.iter().filter(|n| !self.campaigns.contains_key(&n.name)).cloned().collect();
            let lands = dra_world::lands(p, &k8s_nodes);
            let movable = for_waiting(&candidates, p, &self.rules, now);
            let bounds = Bounds { max_pods: self.args.defrag_max_pods as usize, ..Bounds::default() };
            let search = room::plan(&free, &want, &|n: &str| lands.contains(n), &movable, bounds);
            if search.cut {
                tracing::info!(pod = %k, candidates = search.candidates, "the search bound cut the plan search short; the plan is the best found");
            }
            let Some(plan) = search.plan else {
                if self.tell(&k, "no plan") {
                    metrics.plan("no_plan", None);
                    tracing::info!(pod = %k, movable = movable.len(), "no plan: no set of movable pods makes room whose pods all fit elsewhere");
                }
                continue;
            };
            if plan.moves.is_empty() {
                tracing::debug!(pod = %k, node = %plan.node, "it fits without moving anything; left to the scheduler");
                continue;
            }
            let pods: Vec<&str> = plan.moves.iter().map(|m| m.pod.as_str()).collect();
            let signature = format!("{}:{}:{}", plan.node, gpus_words(&plan.room), pods.join(","));
            if self.failed.get(&k).is_some_and(|f| f.signature == signature) {
                if self.tell(&k, "failed before") {
                    tracing::info!(pod = %k, plan = %signature, "the same plan failed before; not tried again");
                }
                continue;
            }
            if let Some(why) = self.capped(&plan.node, plan.moves.len()) {
                if self.tell(&k, &why) {
                    tracing::info!(pod = %k, reason = %why, "a plan waits for the eviction caps");
                }
                continue;
            }
            let wants = wants_of(&want);
            let moves: Vec<String> = plan.moves.iter().map(|m| format!("{} to {}", m.pod, destination(m))).collect();
            let note = format!(
                "moving {} to make room for {} on node {} {}",
                moves.join(", "),
                words(&wants),
                plan.node,
                gpus_words(&plan.room)
            );
            let (ns, name) = k.split_once('/').unwrap_or(("default", &k));
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if self.dry_run {
                if self.tell(&k, &note) {
                    metrics.plan("dry_run", None);
                    tracing::info!(pod = %k, node = %plan.node, gpus = ?plan.room, moves = ?moves, share_slices = plan.cost.share, candidates = search.candidates, dry_run = true, "would defragment: {note}");
                    cluster.event(&pod_ref(ns, name, &uid), false, "WillDefragment", "Plan", &note);
                }
                continue;
            }
            let until = now + self.args.defrag_confirm_timeout.as_secs() as i64;
            let reservation = Reservation { pod: k.clone(), gpus: plan.room.clone(), wants, until };
            let text = match serde_json::to_string(&reservation) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write a reservation");
                    continue;
                }
            };
            let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: text}}});
            if let Err(e) = cluster.patch_node(&plan.node, &patch).await {
                tracing::warn!(node = %plan.node, error = %e, "reserving the room failed; the next batch plans again");
                continue;
            }
            metrics.plan("started", None);
            tracing::info!(pod = %k, node = %plan.node, gpus = ?plan.room, moves = ?moves, share_slices = plan.cost.share, candidates = search.candidates, "defragmenting: {note}");
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmenting", "Plan", &note);
            let steps = plan
                .moves
                .iter()
                .map(|m| {
                    Step::new(
                        m.pod.clone(),
                        seen.pods.get(&m.pod).and_then(|p| RunningPod::read(p).owner),
                        destination(m),
                    )
                })
                .collect();
            self.told.remove(&k);
            self.campaigns.insert(
                plan.node.clone(),
                Campaign {
                    waiting: k.clone(),
                    uid: p.metadata.uid.clone(),
                    since: waiting_since(p, now),
                    node: plan.node.clone(),
                    until,
                    hold: Hold::Dra(reservation),
                    steps,
                    signature,
                    adopted: false,
                },
            );
        }
    }

    /// The pods that may move for waiting pod `w`: bound, not leaving, opted in and allowed by
    /// The pods on DRA nodes that may move for some waiting pod, with the nodes each may land on
    /// (computed once a batch): bound, not leaving, opted in and within the rules; whether one
    /// belongs to a given waiting pod's own workload is judged per waiting pod ([`for_waiting`]).
    pub(super) fn movable_pods(
        &self,
        seen: &Seen,
        nodes: &[k8s_openapi::api::core::v1::Node],
        now: i64,
    ) -> Vec<(RunningPod, Movable)> {
        let held: BTreeSet<&str> =
            seen.rooms.iter().flat_map(|n| &n.gpus).flat_map(|g| g.held.iter().map(|h| h.by.as_str())).collect();
        let mut out = Vec::new();
        for k in held {
            let Some(p) = seen.pods.get(k) else { continue };
            if bound_node(p).is_none() || p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let r = RunningPod::read(p);
            // No waiting pod's workload here: every rule but that one.
            if immovable(&r, "", None, &self.rules, now).is_some() {
                continue;
            }
            let m = Movable { created: r.created.unwrap_or(now), lands: Some(dra_world::lands(p, nodes)) };
            out.push((r, m));
        }
        out
    }
}

/// Of `movable`, those that may move for waiting pod `w` (not of its own workload).
fn for_waiting(
    movable: &[(RunningPod, Movable)],
    w: &Pod,
    rules: &gpupart_cluster::defrag::movable::MoveRules,
    now: i64,
) -> BTreeMap<String, Movable> {
    let waiting = RunningPod::read(w);
    movable
        .iter()
        .filter(|(r, _)| immovable(r, &waiting.namespace, waiting.owner.as_ref(), rules, now).is_none())
        .map(|(r, m)| (r.key.clone(), m.clone()))
        .collect()
}
