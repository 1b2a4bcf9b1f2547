//! `gpupart controller --defrag` on the nodes that run `gpupart agent --dra` (docs/defrag.md):
//! for a pod whose claim the scheduler could not allocate, the cheapest set of movable pods whose
//! leaving makes room for it ([`gpupart_cluster::defrag::room`]); the room reserved on the node
//! first (the agent taints it), then the pods evicted through the Eviction API, one per workload
//! at a time, within the hourly caps; the plan confirmed when the waiting pod is bound into the
//! room, or released when it is not within the confirm timeout.
//!
//! What a plan needs to be finished by another replica is on the node (the reservation): a new
//! leader adopts it and evicts only the movable pods still on the reserved GPUs. Since the
//! replacements cannot land there, no pod is ever evicted twice for one room.

use super::cluster::{node_ref, pod_ref, Cluster};
use super::evict::{evict, Eviction};
use super::lease::Elector;
use super::metrics::ControllerMetrics;
use crate::cli::DefragArgs;
use gpupart_cluster::controller::decide::Drain;
use gpupart_cluster::defrag::dra_world;
use gpupart_cluster::defrag::movable::{immovable, MoveRules, Owner, RunningPod};
use gpupart_cluster::defrag::room::{self, Bounds, Movable, Want};
use gpupart_node::dra::reservation::{Reservation, Wants, ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Seconds in the window of the eviction caps.
const HOUR: i64 = 3600;

/// One eviction of a plan.
#[derive(Debug, Clone)]
struct Step {
    pod: String,
    owner: Option<Owner>,
    /// Where its replacement is expected.
    to: String,
    /// Not before (seconds): the backoff after a budget said no.
    next_try: i64,
    tries: u32,
    /// The budget's last answer, if it said no.
    blocked: Option<String>,
    /// Why it waits for its workload, if it does (the previous replacement not Ready).
    held_back: Option<String>,
    done: bool,
}

impl Step {
    fn new(pod: String, owner: Option<Owner>, to: String) -> Self {
        Step { pod, owner, to, next_try: 0, tries: 0, blocked: None, held_back: None, done: false }
    }
}

/// A plan under way: the room is reserved on `node`.
#[derive(Debug, Clone)]
struct Campaign {
    waiting: String,
    uid: Option<String>,
    /// Since when the pod waits (seconds).
    since: i64,
    node: String,
    reservation: Reservation,
    steps: Vec<Step>,
    /// The node and the pods, to recognize the same plan again.
    signature: String,
    /// Adopted from a reservation another replica wrote: the steps are the movable pods found
    /// on the room.
    adopted: bool,
    /// A label-mode node reserved for a tensor-parallel pod (its taint keeps the replacements
    /// off; no annotation).
    label: bool,
}

impl Campaign {
    /// The room in words: `one 7g.80gb device on node gpu-1 GPU 0`, `node gpu-a, reserved for it`.
    fn room(&self) -> String {
        if self.label {
            return format!("node {}, reserved for it", self.node);
        }
        let r = &self.reservation;
        format!("{} on node {} {}", words(&r.wants), self.node, gpus_words(&r.gpus))
    }
}

/// A plan that failed, for the cooldown.
#[derive(Debug, Clone)]
struct Failure {
    at: i64,
    signature: String,
}

/// How a plan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Served,
    ServedElsewhere,
    Expired,
    Blocked,
    Refused,
    Abandoned,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Served => "served",
            End::ServedElsewhere => "served_elsewhere",
            End::Expired => "expired",
            End::Blocked => "blocked",
            End::Refused => "refused",
            End::Abandoned => "abandoned",
        }
    }
}

/// The defragmenter's memory between batches (a new leader starts from the reservations).
pub struct Defrag {
    /// The eviction client (no retries of 429: the budget's answer is ours to act on).
    client: kube::Client,
    args: DefragArgs,
    rules: MoveRules,
    dry_run: bool,
    campaigns: BTreeMap<String, Campaign>,
    failed: BTreeMap<String, Failure>,
    /// (when, node) of each eviction in the last hour.
    evictions: Vec<(i64, String)>,
    /// Per workload (`namespace/Kind/name`): when its last pod was evicted.
    owner_evicted: BTreeMap<String, i64>,
    /// What was last said about each waiting pod (one log line and Event per new thing).
    told: BTreeMap<String, String>,
}

/// What one batch reads.
struct Seen {
    pods: BTreeMap<String, Arc<Pod>>,
    nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>>,
    rooms: Vec<room::Node>,
    slices: Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
    claims: Vec<k8s_openapi::api::resource::v1::ResourceClaim>,
    classes: Vec<k8s_openapi::api::resource::v1::DeviceClass>,
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

fn workload(namespace: &str, owner: &Owner) -> String {
    format!("{namespace}/{}/{}", owner.kind, owner.name)
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn bound_node(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

/// Since when a pod waits: its `PodScheduled=False` transition, else its creation.
fn waiting_since(p: &Pod, now: i64) -> i64 {
    let cond = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_second());
    cond.or_else(|| p.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second())).unwrap_or(now)
}

/// Where a moved pod's replacement is expected: `node gpu-2 GPU 1`.
fn destination(m: &room::Move) -> String {
    let gpus: BTreeSet<u32> = m.devices.iter().map(|d| d.gpu).collect();
    format!("node {} {}", m.to, gpus_words(&gpus.into_iter().collect::<Vec<_>>()))
}

fn wants_of(w: &Want) -> Wants {
    match w {
        Want::Mig(p) => Wants::Mig(p.clone()),
        Want::Whole(k) => Wants::Whole(*k),
    }
}

fn words(w: &Wants) -> String {
    match w {
        Wants::Mig(p) => format!("one {p} device"),
        Wants::Whole(1) => "a whole GPU".into(),
        Wants::Whole(k) => format!("{k} whole GPUs"),
    }
}

fn gpus_words(gpus: &[u32]) -> String {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    format!("GPU{} {}", if gpus.len() == 1 { "" } else { "s" }, list.join(", "))
}

impl Defrag {
    /// The defragmenter the flags ask for.
    pub fn new(client: kube::Client, args: &DefragArgs, dry_run: bool) -> Self {
        let rules = args.rules();
        Self {
            client,
            args: args.clone(),
            rules,
            dry_run,
            campaigns: BTreeMap::new(),
            failed: BTreeMap::new(),
            evictions: Vec::new(),
            owner_evicted: BTreeMap::new(),
            told: BTreeMap::new(),
        }
    }

    fn read(&self, cluster: &Cluster) -> Seen {
        let pods: BTreeMap<String, Arc<Pod>> = cluster.pods().into_iter().map(|p| (key(&p), p)).collect();
        let super::cluster::DraObjects { slices, claims, classes } = cluster.dra();
        let (rooms, problems) = dra_world::nodes(&slices, &claims, &self.args.dra_driver);
        for p in problems {
            tracing::debug!(problem = %p, "left out of defragmentation");
        }
        Seen { pods, nodes: cluster.nodes(), rooms, slices, claims, classes }
    }

    /// Says `what` about `pod` once (until something else is said).
    fn tell(&mut self, pod: &str, what: &str) -> bool {
        if self.told.get(pod).map(String::as_str) == Some(what) {
            return false;
        }
        self.told.insert(pod.to_string(), what.to_string());
        true
    }

    /// One batch: the plans under way go on or end, then new plans for pods that wait. `drains`
    /// are the label-mode nodes the batch's decision found reserved for a tensor-parallel pod.
    pub async fn step(
        &mut self,
        cluster: &Cluster,
        elector: &mut Elector,
        metrics: &ControllerMetrics,
        drains: &[Drain],
        now: i64,
    ) {
        self.evictions.retain(|(t, _)| now - t < HOUR);
        let seen = self.read(cluster);
        self.adopt(&seen, now);
        self.take_drains(cluster, metrics, &seen, drains, now).await;
        let nodes: Vec<String> = self.campaigns.keys().cloned().collect();
        for node in nodes {
            if !elector.is_leader() {
                return;
            }
            self.go_on(cluster, elector, metrics, &seen, &node, now).await;
        }
        self.plan_new(cluster, metrics, &seen, now).await;
    }

    /// Starts a plan for each label-mode node reserved for a tensor-parallel pod whose pods can
    /// all move now.
    async fn take_drains(
        &mut self,
        cluster: &Cluster,
        metrics: &ControllerMetrics,
        seen: &Seen,
        drains: &[Drain],
        now: i64,
    ) {
        for d in drains {
            if self.campaigns.contains_key(&d.node) || self.campaigns.values().any(|c| c.waiting == d.for_pod) {
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
            let mut pods: Vec<&str> = moves.iter().map(|(p, _)| p.as_str()).collect();
            pods.sort_unstable();
            let signature = format!("{}:{}", d.node, pods.join(","));
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
            let note = format!("moving {} to empty node {}, reserved for it", words.join(", "), d.node);
            metrics.plan("started", None);
            tracing::info!(pod = %d.for_pod, node = %d.node, moves = ?words, "defragmenting: {note}");
            let (ns, name) = d.for_pod.split_once('/').unwrap_or(("default", &d.for_pod));
            let uid = p.metadata.uid.clone().unwrap_or_default();
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmenting", "Plan", &note).await;
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
            let until = now + self.args.defrag_confirm_timeout.as_secs() as i64;
            self.told.remove(&d.for_pod);
            self.campaigns.insert(
                d.node.clone(),
                Campaign {
                    waiting: d.for_pod.clone(),
                    uid: p.metadata.uid.clone(),
                    since: waiting_since(p, now),
                    node: d.node.clone(),
                    reservation: Reservation {
                        pod: d.for_pod.clone(),
                        gpus: Vec::new(),
                        wants: Wants::Whole(0),
                        until,
                    },
                    steps,
                    signature,
                    adopted: false,
                    label: true,
                },
            );
        }
    }

    /// Takes up the reservations found on nodes that this replica did not write (a previous
    /// leader's plan).
    fn adopt(&mut self, seen: &Seen, now: i64) {
        for n in &seen.nodes {
            let Some(name) = n.metadata.name.as_deref() else { continue };
            if self.campaigns.contains_key(name) {
                continue;
            }
            let Some(text) = n.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) else { continue };
            let Ok(r) = serde_json::from_str::<Reservation>(text) else {
                tracing::warn!(
                    node = name,
                    annotation = ANNOTATION,
                    "a reservation that does not parse; left to expire"
                );
                continue;
            };
            tracing::info!(node = name, pod = %r.pod, gpus = ?r.gpus, "found a reservation made earlier; taking the plan up");
            let since = seen.pods.get(&r.pod).map_or(now, |p| waiting_since(p, now));
            self.campaigns.insert(
                name.to_string(),
                Campaign {
                    waiting: r.pod.clone(),
                    uid: None,
                    since,
                    node: name.to_string(),
                    signature: format!("{name}:{}", gpus_words(&r.gpus)),
                    reservation: r,
                    steps: Vec::new(),
                    adopted: true,
                    label: false,
                },
            );
        }
    }

    /// Carries plan `node` on, or ends it.
    async fn go_on(
        &mut self,
        cluster: &Cluster,
        elector: &mut Elector,
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
                None if now >= c.reservation.until => {
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
        if !c.label {
            let Some(room) = seen.rooms.iter().find(|r| r.name == c.node) else {
                self.end(cluster, metrics, c, End::Abandoned, "the node no longer publishes its devices", now).await;
                return;
            };
            if c.adopted && c.steps.is_empty() {
                match self.steps_on_room(seen, room, &c) {
                    Ok(steps) => c.steps = steps,
                    Err(why) => {
                        self.end(cluster, metrics, c, End::Abandoned, &why, now).await;
                        return;
                    }
                }
            }
            if !dra_world::reservation_published(&seen.slices, &self.args.dra_driver, room, &c.reservation, now) {
                tracing::debug!(node, "waiting for the agent to publish the reservation before evicting");
                self.campaigns.insert(node.to_string(), c);
                return;
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
            if !elector.renew_if_due().await {
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
                    cluster.event(&pod_ref(&ns, &name, &uid), false, "Defragmenting", "Evict", &note).await;
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
                        cluster.event(&pod_ref(wns, wname, &uid), true, "DefragmentBlocked", "Evict", &note).await;
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
        self.campaigns.insert(node.to_string(), c);
    }

    /// The steps of an adopted plan: the pods on the reserved GPUs, all of which must be movable.
    fn steps_on_room(&self, seen: &Seen, room: &room::Node, c: &Campaign) -> Result<Vec<Step>, String> {
        let waiting = seen.pods.get(&c.waiting);
        let (wns, wowner) = waiting.map_or(("default".to_string(), None), |p| {
            let r = RunningPod::read(p);
            (r.namespace.clone(), r.owner)
        });
        let now = crate::clock::now_secs();
        let mut steps = Vec::new();
        let holders: BTreeSet<&str> = room
            .gpus
            .iter()
            .filter(|g| c.reservation.gpus.contains(&g.index))
            .flat_map(|g| g.held.iter().map(|h| h.by.as_str()))
            .collect();
        for by in holders {
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
    fn owner_busy(&self, seen: &Seen, ns: &str, owner: &Owner) -> Option<String> {
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
    fn capped(&self, node: &str, n: usize) -> Option<String> {
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
    async fn end(
        &mut self,
        cluster: &Cluster,
        metrics: &ControllerMetrics,
        c: Campaign,
        end: End,
        why: &str,
        now: i64,
    ) {
        let ours = cluster
            .nodes()
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(c.node.as_str()))
            .and_then(|n| n.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)).cloned())
            .and_then(|t| serde_json::from_str::<Reservation>(&t).ok())
            .is_some_and(|r| r.pod == c.waiting);
        if ours {
            let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: null}}});
            if let Err(e) = cluster.patch_node(&c.node, &patch).await {
                tracing::warn!(node = %c.node, error = %e, "releasing the reservation failed; retrying at the next batch");
                self.campaigns.insert(c.node.clone(), c);
                return;
            }
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
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmented", "Confirm", &note).await;
        } else {
            tracing::warn!(pod = %c.waiting, node = %c.node, outcome = end.as_str(), reason = why, "the plan ended without serving the pod; the room is released");
            if !matches!(end, End::ServedElsewhere | End::Abandoned) {
                self.failed.insert(c.waiting.clone(), Failure { at: now, signature: c.signature.clone() });
            }
            let note = format!("the room ({room}) is released: {why}");
            if end != End::Abandoned || !why.contains("gone") {
                cluster.event(&pod_ref(ns, name, &uid), true, "DefragmentFailed", "Release", &note).await;
            }
            cluster
                .event(
                    &node_ref(&c.node, None),
                    true,
                    "DefragmentFailed",
                    "Release",
                    &format!("for {}: {note}", c.waiting),
                )
                .await;
        }
    }

    /// New plans for the pods that wait and that nothing serves now.
    async fn plan_new(&mut self, cluster: &Cluster, metrics: &ControllerMetrics, seen: &Seen, now: i64) {
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
            let movable = self.movable(seen, p, &k8s_nodes, now);
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
                    cluster.event(&pod_ref(ns, name, &uid), false, "WillDefragment", "Plan", &note).await;
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
            cluster.event(&pod_ref(ns, name, &uid), false, "Defragmenting", "Plan", &note).await;
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
                    reservation,
                    steps,
                    signature,
                    adopted: false,
                    label: false,
                },
            );
        }
    }

    /// The pods that may move for waiting pod `w`: bound, not leaving, opted in and allowed by
    /// the rules, each with the nodes its replacement may land on.
    fn movable(
        &self,
        seen: &Seen,
        w: &Pod,
        nodes: &[k8s_openapi::api::core::v1::Node],
        now: i64,
    ) -> BTreeMap<String, Movable> {
        let waiting = RunningPod::read(w);
        let held: BTreeSet<&str> =
            seen.rooms.iter().flat_map(|n| &n.gpus).flat_map(|g| g.held.iter().map(|h| h.by.as_str())).collect();
        let mut out = BTreeMap::new();
        for k in held {
            let Some(p) = seen.pods.get(k) else { continue };
            if bound_node(p).is_none() || p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let r = RunningPod::read(p);
            if immovable(&r, &waiting.namespace, waiting.owner.as_ref(), &self.rules, now).is_some() {
                continue;
            }
            let lands = Some(dra_world::lands(p, nodes));
            out.insert(k.to_string(), Movable { created: r.created.unwrap_or(now), lands });
        }
        out
    }
}
