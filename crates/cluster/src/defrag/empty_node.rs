//! Label mode: the moves that empty a shared node for a tensor-parallel pod (pure). A node
//! reserved for the dedicated pool (tainted, so no new shared pod lands there) converts once its
//! pods end; moving them makes that now. Every GPU pod bound to the node must be movable and
//! must fit elsewhere now: on another node that takes shared pods, in the free units of its
//! resource there, in the scheduler's queue order and node order, given the moves before it. A
//! node with GPUs in use by something else than its pods is never emptied this way.

use super::movable::{immovable, MoveRules};
use crate::controller::capacity::NodeLedger;
use crate::controller::nodes::GpuNode;
use crate::controller::pods::{GpuPod, Resource};
use crate::pools::Pools;
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// A node as a move sees it.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    /// The node.
    pub node: &'a GpuNode,
    /// What it offers and what is taken there (the scheduler's placements of this batch included).
    pub ledger: &'a NodeLedger,
    /// Whether a moved pod's replacement may land there (a shared node, not cordoned, not
    /// changing).
    pub takes_replacements: bool,
}

/// The moves that empty a node, and what they cost (smaller is cheaper: fewer pods, then less
/// GPU share, then younger pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emptying {
    /// Each moved pod (`namespace/name`) and the node its replacement is expected on.
    pub moves: Vec<(String, String)>,
    /// (pods, GPU share in compute slices, the pods' creation times summed, reversed).
    pub cost: (usize, u32, Reverse<i64>),
}

/// Where each of `moving` (in the scheduler's queue order) lands off `hosts[room]`: the first host
/// that takes replacements, has a free unit of its resource left (given the moves before it) and
/// passes its fit rules; or which pod has nowhere to go.
pub fn place(room: usize, hosts: &[Host], moving: &[&GpuPod], pools: &Pools) -> Result<Vec<(String, String)>, String> {
    let mut used: Vec<BTreeMap<Resource, u32>> = vec![BTreeMap::new(); hosts.len()];
    let mut moves = Vec::new();
    for p in moving {
        let to = hosts.iter().enumerate().position(|(j, h)| {
            let free = h.ledger.free(&p.resource).saturating_sub(used[j].get(&p.resource).copied().unwrap_or(0));
            j != room
                && h.takes_replacements
                && free >= p.count
                && crate::controller::fit::blocked(
                    &p.constraints,
                    &h.node.name,
                    &h.node.labels,
                    &h.node.taints,
                    &h.node.room,
                    &pools.taint.key,
                )
                .is_none()
                && (!h.node.is_dedicated(pools) || p.dedicated)
        });
        let Some(j) = to else {
            return Err(format!("{} has nowhere to go: no other node has a free {}", p.key, p.resource.name("mps")));
        };
        *used[j].entry(p.resource.clone()).or_default() += p.count;
        moves.push((p.key.clone(), hosts[j].node.name.clone()));
    }
    Ok(moves)
}

/// The moves that empty `hosts[room]` for `waiting`, or why it cannot be emptied.
pub fn empty(
    room: usize,
    hosts: &[Host],
    pods: &[GpuPod],
    waiting: &GpuPod,
    rules: &MoveRules,
    now: i64,
    pools: &Pools,
) -> Result<Emptying, String> {
    let here = hosts[room].node.name.as_str();
    let mut bound: Vec<&GpuPod> = pods.iter().filter(|p| p.node() == Some(here)).collect();
    if bound.is_empty() {
        return Err(format!("no pod to move on node {here}"));
    }
    let mut by_pods: BTreeMap<&Resource, u32> = BTreeMap::new();
    for p in &bound {
        for (r, n) in p.asks() {
            *by_pods.entry(r).or_default() += n;
        }
    }
    if let Some((r, n)) = hosts[room].ledger.held.iter().find(|(r, n)| by_pods.get(r).copied().unwrap_or(0) < **n) {
        return Err(format!("node {here}: {n} {} in use by something else than its pods", r.name("mps")));
    }
    let waiting_pod = waiting.running();
    for p in &bound {
        if let Some(why) = immovable(&p.running(), &waiting_pod.namespace, waiting_pod.owner.as_ref(), rules, now) {
            return Err(format!("{} may not move: {why}", p.key));
        }
        if !p.also.is_empty() {
            return Err(format!("{} asks for several GPU resources", p.key));
        }
    }
    bound.sort_by(|a, b| a.queue_cmp(b));
    let moves = place(room, hosts, &bound, pools)?;
    let share: u32 = bound.iter().map(|p| p.resource.compute_slices() * p.count).sum();
    let age: i64 = bound.iter().map(|p| p.created.unwrap_or(now)).sum();
    Ok(Emptying { cost: (bound.len(), share, Reverse(age)), moves })
}
