//! A plan under way: its evictions, how it ended, and the words the logs and Events use.

use gpupart_cluster::controller::decide::Drain;
use gpupart_cluster::defrag::gpu_room::RoomNote;
use gpupart_cluster::defrag::movable::Owner;
use gpupart_cluster::defrag::room::{self, Want};
use gpupart_node::dra::reservation::{Reservation, Wants};
use std::collections::BTreeSet;

/// One eviction of a plan.
#[derive(Debug, Clone)]
pub(super) struct Step {
    pub(super) pod: String,
    pub(super) owner: Option<Owner>,
    /// Where its replacement is expected.
    pub(super) to: String,
    /// Not before (seconds): the backoff after a budget said no.
    pub(super) next_try: i64,
    pub(super) tries: u32,
    /// The budget's last answer, if it said no.
    pub(super) blocked: Option<String>,
    /// Why it waits for its workload, if it does (the previous replacement not Ready).
    pub(super) held_back: Option<String>,
    pub(super) done: bool,
}

impl Step {
    /// A pod to evict, its replacement expected `to`.
    pub(super) fn new(pod: String, owner: Option<Owner>, to: String) -> Self {
        Step { pod, owner, to, next_try: 0, tries: 0, blocked: None, held_back: None, done: false }
    }
}

/// A plan under way: the room is reserved on `node`.
#[derive(Debug, Clone)]
pub(super) struct Campaign {
    pub(super) waiting: String,
    pub(super) uid: Option<String>,
    /// Since when the pod waits (seconds).
    pub(super) since: i64,
    pub(super) node: String,
    /// When the room is released unless the waiting pod got it (seconds).
    pub(super) until: i64,
    /// What keeps the room for the waiting pod.
    pub(super) hold: Hold,
    pub(super) steps: Vec<Step>,
    /// The node and the pods, to recognize the same plan again.
    pub(super) signature: String,
    /// Adopted from a reservation another replica wrote: the steps are the movable pods found
    /// on the room.
    pub(super) adopted: bool,
}

/// What keeps a room for the waiting pod until it is bound there.
#[derive(Debug, Clone)]
pub(super) enum Hold {
    /// A label-mode node reserved for a tensor-parallel pod: the dedicated pool's taint keeps the
    /// replacements off (the batch's decision wrote it; nothing else to release).
    Node,
    /// A DRA node: the reservation annotation, which the agent turns into device taints.
    Dra(Reservation),
    /// A label-mode GPU being re-cut: the room annotation and taint the decision wrote.
    Gpu(RoomNote),
}

impl Campaign {
    /// The room in words: `one 7g.80gb device on node gpu-1 GPU 0`, `node gpu-a, reserved for it`.
    pub(super) fn room(&self) -> String {
        match &self.hold {
            Hold::Node => format!("node {}, reserved for it", self.node),
            Hold::Dra(r) => format!("{} on node {} {}", words(&r.wants), self.node, gpus_words(&r.gpus)),
            Hold::Gpu(n) => format!("one {} instance on node {} GPU {}", n.profile, self.node, n.gpu),
        }
    }
}

/// A plan that failed, for the cooldown.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) at: i64,
    pub(super) signature: String,
}

/// How a plan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Served,
    ServedElsewhere,
    Expired,
    Blocked,
    Refused,
    Abandoned,
}

impl End {
    pub(super) fn as_str(self) -> &'static str {
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

/// A workload's key: `namespace/Kind/name`.
pub(super) fn workload(namespace: &str, owner: &Owner) -> String {
    format!("{namespace}/{}/{}", owner.kind, owner.name)
}

/// Where a moved pod's replacement is expected: `node gpu-2 GPU 1`.
pub(super) fn destination(m: &room::Move) -> String {
    let gpus: BTreeSet<u32> = m.devices.iter().map(|d| d.gpu).collect();
    format!("node {} {}", m.to, gpus_words(&gpus.into_iter().collect::<Vec<_>>()))
}

/// The reservation's form of what the waiting pod wants.
pub(super) fn wants_of(w: &Want) -> Wants {
    match w {
        Want::Mig(p) => Wants::Mig(p.clone()),
        Want::Whole(k) => Wants::Whole(*k),
    }
}

/// What the waiting pod wants, in words.
pub(super) fn words(w: &Wants) -> String {
    match w {
        Wants::Mig(p) => format!("one {p} device"),
        Wants::Whole(1) => "a whole GPU".into(),
        Wants::Whole(k) => format!("{k} whole GPUs"),
    }
}

/// `GPU 0`, `GPUs 0, 1`.
pub(super) fn gpus_words(gpus: &[u32]) -> String {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    format!("GPU{} {}", if gpus.len() == 1 { "" } else { "s" }, list.join(", "))
}

/// What identifies a label-mode plan: the node (and GPU, for a room) and the pods it moves.
pub(super) fn drain_signature(d: &Drain) -> String {
    let mut pods: Vec<&str> = d.moves.iter().flatten().map(|(p, _)| p.as_str()).collect();
    pods.sort_unstable();
    match &d.room {
        Some(r) => format!("{}:GPU {}:{}", d.node, r.gpu, pods.join(",")),
        None => format!("{}:{}", d.node, pods.join(",")),
    }
}
