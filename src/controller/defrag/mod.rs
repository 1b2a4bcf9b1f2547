//! `gpupart controller --defrag` (docs/defrag.md): room for a pod that waits, made by evicting
//! the fewest movable pods. On nodes that run `gpupart agent --dra`, for a claim the scheduler
//! could not allocate, the cheapest set of movable pods whose leaving makes room for it
//! ([`gpupart_cluster::defrag::room`]), the room reserved on the node first (the agent taints it);
//! on label-driven nodes, the node the batch's decision reserved for a tensor-parallel pod
//! ([`gpupart_cluster::defrag::empty_node`]) and the GPU its decision re-cuts for a MIG pod
//! ([`gpupart_cluster::defrag::gpu_room`]; the room's taint is lifted here once the agent has
//! re-cut it). Then the pods are evicted through the Eviction API,
//! one per workload at a time, within the hourly caps; the plan is confirmed when the waiting pod
//! is bound into the room, or released when it is not within the confirm timeout.
//!
//! What a plan needs to be finished by another replica is on the node (the reservation): a new
//! leader adopts it and evicts only the movable pods still on the reserved GPUs or node. Since the
//! replacements cannot land there, no pod is ever evicted twice for one room.
//!
//! Here the defragmenter's memory and its batch step; [`campaign`] holds a plan under way and its
//! words, [`start`] how plans begin, [`progress`] how they go on and end.

mod campaign;
mod progress;
mod start;

use crate::cli::DefragArgs;
use crate::controller::cluster::Cluster;
use crate::controller::lease::Leadership;
use crate::controller::metrics::ControllerMetrics;
use gpupart_cluster::controller::decide::Drain;
use gpupart_cluster::defrag::dra_world;
use gpupart_cluster::defrag::movable::MoveRules;
use gpupart_cluster::defrag::room::{self};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Seconds in the window of the eviction caps.
const HOUR: i64 = 3600;

use campaign::{Campaign, Failure};

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
    /// Per node, the reservation this replica released (not adopted while the cache still shows it).
    released: BTreeMap<String, String>,
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

/// `namespace/name`.
fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether the pod is Ready.
fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node it is bound to.
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
            released: BTreeMap::new(),
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
    pub fn tell(&mut self, pod: &str, what: &str) -> bool {
        if self.told.get(pod).map(String::as_str) == Some(what) {
            return false;
        }
        self.told.insert(pod.to_string(), what.to_string());
        true
    }

    /// Why the batch's room on a GPU for `d.for_pod` is not to be made now: the eviction caps
    /// leave no room for all of its moves (a room is written before its pods move, so the check
    /// comes first), the plan for that pod failed within the cooldown, or the same plan failed
    /// before.
    pub fn refuses(&self, d: &Drain, now: i64) -> Option<String> {
        let moves = d.moves.as_ref().map_or(0, Vec::len);
        if let Some(why) = self.capped(&d.node, moves) {
            return Some(why);
        }
        let f = self.failed.get(&d.for_pod)?;
        if now - f.at < self.args.defrag_cooldown.as_secs() as i64 {
            return Some(format!("its last plan failed {} s ago (--defrag-cooldown)", now - f.at));
        }
        (f.signature == campaign::drain_signature(d)).then(|| "the same plan failed before".to_string())
    }

    /// One batch: the plans under way go on or end, then new plans for pods that wait. `drains`
    /// are the label-mode plans the batch's decision made: nodes reserved for a tensor-parallel
    /// pod, and rooms on a GPU, whose node patches landed when the node is in `made`.
    pub async fn step(
        &mut self,
        cluster: &Cluster,
        leadership: &Leadership,
        metrics: &ControllerMetrics,
        drains: &[Drain],
        made: &std::collections::BTreeSet<String>,
        now: i64,
    ) {
        self.evictions.retain(|(t, _)| now - t < HOUR);
        let seen = self.read(cluster);
        // What is remembered of pods that are gone goes with them.
        self.told.retain(|k, _| k.starts_with("cap ") || k.starts_with("node ") || seen.pods.contains_key(k));
        self.failed.retain(|k, _| seen.pods.contains_key(k));
        self.owner_evicted.retain(|_, t| now - *t < HOUR);
        // The batch's own plans first: a room this batch wrote is in the node cache already, and
        // is not another replica's to adopt.
        self.take_drains(cluster, metrics, &seen, drains, made, now).await;
        self.adopt(&seen, now);
        let nodes: Vec<String> = self.campaigns.keys().cloned().collect();
        for node in nodes {
            if !leadership.leads() {
                return;
            }
            self.go_on(cluster, leadership, metrics, &seen, &node, now).await;
        }
        self.plan_new(cluster, metrics, &seen, now).await;
    }
}
