//! Where the room for a waiting pod appears and where the moved pods go, on the GPUs of nodes
//! that publish DRA devices (pure). The waiting pod asks for one MIG device of a profile or for
//! whole GPUs; the plan names the GPUs that become its room (one GPU for a MIG device, `k` GPUs
//! of one node for whole GPUs), the movable pods that leave them, and where each moved pod's
//! replacement lands, as the scheduler would hand it out: the first free device of its kind in
//! gpupart's publication order ([`order`]), node by node, the room excluded (it is reserved for
//! the waiting pod while the plan runs). A plan where a moved pod has nowhere to go is never
//! returned.
//!
//! The plan is the cheapest: fewest pods, then the least GPU share (memory slices), then the
//! most room the nodes keep once it is carried out (as the publication order ranks placements),
//! then the youngest pods. Only pods holding a device on the room's GPUs move (never a chain of moves), and
//! never a pod whose replacement could take the room itself (a pod holding the profile the waiting
//! pod asks for, or a whole GPU when it asks for whole GPUs): the reservation leaves those
//! devices allocatable, so the replacement and the waiting pod would race for them.

use crate::mig::capacity::Occupancy;
use crate::mig::ProfileTable;
use gpupart_node::dra::devices::{DeviceKind, DeviceRef};
use gpupart_node::dra::order::{order, GpuView};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// What the waiting pod asks of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// One MIG device of this profile (`3g.40gb`).
    Mig(String),
    /// This many whole GPUs.
    Whole(u32),
}

/// A device and the pod that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The device.
    pub kind: DeviceKind,
    /// The pod (`namespace/name`), or whatever else holds it (another tool's instance, a process):
    /// only pods listed as movable ever move.
    pub by: String,
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Its MIG profiles (empty for a GPU without MIG).
    pub table: ProfileTable,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// What is held on it.
    pub held: Vec<Held>,
}

/// One node and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node name.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<Gpu>,
}

/// A pod that may move.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Movable {
    /// Creation time (seconds since the epoch): among plans of equal size and share, the one that
    /// moves the youngest pods wins.
    pub created: i64,
    /// The nodes its replacement may land on (its node selector, affinity and tolerations as the
    /// controller's fit rules judge them); `None`: any node.
    pub lands: Option<BTreeSet<String>>,
}

/// The search's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The most pods one plan moves.
    pub max_pods: usize,
    /// The most candidate plans simulated before the search gives up with what it has.
    pub max_candidates: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { max_pods: 4, max_candidates: 20_000 }
    }
}

/// What a plan costs; smaller is cheaper.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cost {
    /// Pods moved.
    pub pods: usize,
    /// Their GPU share, in memory slices.
    pub share: u32,
    /// The room the nodes keep once the plan is carried out (the pods left, the waiting pod took
    /// its devices, the replacements landed), reversed (more room costs less): how many more
    /// instances of each profile, largest first, their GPUs could take — as the publication order
    /// ranks placements.
    pub room: Reverse<Vec<u32>>,
    /// Their creation times summed, reversed (younger pods cost less).
    pub age: Reverse<i64>,
}

/// One moved pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The pod.
    pub pod: String,
    /// The devices it leaves (on the plan's node).
    pub from: Vec<DeviceRef>,
    /// The node its replacement lands on.
    pub to: String,
    /// The devices its replacement gets there.
    pub devices: Vec<DeviceRef>,
}

/// A plan: the room, who leaves it, where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The node of the room.
    pub node: String,
    /// The GPUs (NVML indices) that become the room, reserved for the waiting pod.
    pub room: Vec<u32>,
    /// The devices the waiting pod then gets.
    pub beneficiary: Vec<DeviceRef>,
    /// The pods that move, largest first.
    pub moves: Vec<Move>,
    /// What it costs.
    pub cost: Cost,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The cheapest plan found, if any.
    pub plan: Option<Plan>,
    /// Candidate plans simulated.
    pub candidates: usize,
    /// Whether `max_candidates` stopped the search before it had looked at every plan of the
    /// smallest size that has one.
    pub cut: bool,
}

/// A room candidate: a node, GPUs on it, and the pods that may leave them.
struct Room {
    node: usize,
    gpus: Vec<usize>,
    /// Movable pods holding a device on the room's GPUs (for whole GPUs: all of them must go).
    pods: Vec<String>,
}

/// The memory slices `kind` takes on a GPU of `table`.
fn share_of(kind: &DeviceKind, table: &ProfileTable) -> u32 {
    match kind {
        // An MPS share holds the GPU as a whole does (no MIG device and no whole claim beside it).
        DeviceKind::Gpu | DeviceKind::Mps => table.memory_slices.max(1),
        DeviceKind::Mig { profile_id, .. } => table.by_id(*profile_id).map_or(0, |p| p.memory_slices),
    }
}

/// The profile name of a MIG device, if it is one.
fn profile_name(kind: &DeviceKind, table: &ProfileTable) -> Option<String> {
    match kind {
        DeviceKind::Gpu | DeviceKind::Mps => None,
        DeviceKind::Mig { profile_id, .. } => table.by_id(*profile_id).map(|p| p.name.to_string()),
    }
}

/// Whether a pod's replacement could take devices of the room the waiting pod asks for.
fn competes(nodes: &[Node], pod: &str, want: &Want) -> bool {
    nodes.iter().flat_map(|n| &n.gpus).any(|g| {
        g.held.iter().filter(|h| h.by == pod).any(|h| match want {
            Want::Whole(_) => h.kind == DeviceKind::Gpu,
            Want::Mig(p) => profile_name(&h.kind, &g.table).as_deref() == Some(p.as_str()),
        })
    })
}

/// The planner's view of a GPU without the pods of `gone`.
fn view(g: &Gpu, gone: &BTreeSet<&str>) -> GpuView {
    let kept = || g.held.iter().filter(|h| !gone.contains(h.by.as_str()));
    GpuView {
        index: g.index,
        table: g.table.clone(),
        mig_enabled: g.mig_enabled,
        occupied: kept()
            .filter_map(|h| match h.kind {
                DeviceKind::Mig { profile_id, placement } => Some((profile_id, placement)),
                DeviceKind::Gpu | DeviceKind::Mps => None,
            })
            .collect(),
        whole_taken: kept().any(|h| h.kind == DeviceKind::Gpu),
        mps_shares: kept().filter(|h| h.kind == DeviceKind::Mps).count() as u32,
        mps_device: g.table.profiles.is_empty(),
    }
}

/// Whether the room holds the waiting pod once `gone` left.
fn fits(node: &Node, room: &[usize], want: &Want, gone: &BTreeSet<&str>) -> bool {
    let views = room.iter().map(|&g| view(&node.gpus[g], gone));
    match want {
        Want::Whole(k) => room.len() == *k as usize && views.into_iter().all(|v| v.idle()),
        Want::Mig(p) => views.into_iter().next().is_some_and(|v| takes(&v, Some(p))),
    }
}

/// The devices the published order hands the waiting pod first on the room's GPUs once `gone`
/// left (the room holds it).
fn hand_out(node: &Node, room: &[usize], want: &Want, gone: &BTreeSet<&str>) -> Vec<DeviceRef> {
    let views: Vec<GpuView> = room.iter().map(|&g| view(&node.gpus[g], gone)).collect();
    let offered = order(&views);
    match want {
        Want::Whole(_) => offered.into_iter().filter(|d| d.kind == DeviceKind::Gpu).collect(),
        Want::Mig(p) => offered
            .into_iter()
            .find(|d| views.iter().any(|v| v.index == d.gpu && profile_name(&d.kind, &v.table).as_deref() == Some(p)))
            .into_iter()
            .collect(),
    }
}

/// A device a moved pod leaves: its profile's name (`None` for a whole GPU) and where it was.
type Leaving = (Option<String>, DeviceRef);

/// Whether `v` could take a device of `profile` (a whole GPU when `None`) now.
fn takes(v: &GpuView, profile: Option<&str>) -> bool {
    match profile {
        None => v.idle(),
        Some(name) => {
            let occ = Occupancy::of(&v.table, v.occupied.iter().copied());
            !v.whole_taken
                && v.table
                    .profiles
                    .iter()
                    .filter(|p| p.name.to_string() == name)
                    .any(|p| p.placements.iter().any(|pl| occ.can_add(&v.table, p, *pl)))
        }
    }
}

/// Where the moved pods' replacements land, in the scheduler's order, the room excluded; `None`
/// when one has nowhere to go.
fn replace(nodes: &[Node], room: &Room, pods: &[&String], movable: &BTreeMap<String, Movable>) -> Option<Vec<Move>> {
    let gone: BTreeSet<&str> = pods.iter().map(|p| p.as_str()).collect();
    let mut views: Vec<Vec<GpuView>> = nodes.iter().map(|n| n.gpus.iter().map(|g| view(g, &gone)).collect()).collect();
    for &g in &room.gpus {
        views[room.node][g].whole_taken = true;
    }
    // What each pod held: (profile name or whole GPU, its share), from the room's node.
    let node = &nodes[room.node];
    let mut pods: Vec<(&String, Vec<Leaving>, u32)> = pods
        .iter()
        .map(|&p| {
            let mut share = 0;
            let mut held = Vec::new();
            for g in &node.gpus {
                for h in g.held.iter().filter(|h| h.by == *p) {
                    share += share_of(&h.kind, &g.table);
                    held.push((profile_name(&h.kind, &g.table), DeviceRef { gpu: g.index, kind: h.kind }));
                }
            }
            (p, held, share)
        })
        .collect();
    pods.sort_by_key(|(p, _, share)| (Reverse(*share), (*p).clone()));
    // A quick necessary test before the scheduler is simulated: outside the room, every GPU
    // together can take at least as many of each profile (and whole GPUs) as the pods ask.
    let mut asked: BTreeMap<Option<&str>, u32> = BTreeMap::new();
    for (_, held, _) in &pods {
        for (profile, _) in held {
            *asked.entry(profile.as_deref()).or_default() += 1;
        }
    }
    let supply = |profile: Option<&str>| -> u32 {
        views
            .iter()
            .flatten()
            .map(|v| match profile {
                None => u32::from(v.idle()),
                Some(_) if v.whole_taken => 0,
                Some(name) => {
                    let occ = Occupancy::of(&v.table, v.occupied.iter().copied());
                    v.table
                        .profiles
                        .iter()
                        .filter(|p| p.name.to_string() == name)
                        .map(|p| occ.remaining_capacity(&v.table, p))
                        .sum()
                }
            })
            .sum()
    };
    if asked.iter().any(|(profile, n)| supply(*profile) < *n) {
        return None;
    }
    let mut moves = Vec::new();
    for (pod, held, _) in pods {
        let lands = movable.get(pod).and_then(|m| m.lands.as_ref());
        let target = (0..nodes.len()).filter(|&n| lands.is_none_or(|l| l.contains(&nodes[n].name))).find_map(|n| {
            // Each device alone must have a spot on the node before the scheduler is simulated.
            if !held.iter().all(|(profile, _)| views[n].iter().any(|v| takes(v, profile.as_deref()))) {
                return None;
            }
            let mut trial = views[n].clone();
            let mut got = Vec::new();
            for (profile, _) in &held {
                let offered = order(&trial);
                let d = offered.into_iter().find(|d| {
                    let table = &trial.iter().find(|v| v.index == d.gpu).map(|v| &v.table);
                    match (profile, d.kind) {
                        (None, DeviceKind::Gpu) => true,
                        (Some(p), k @ DeviceKind::Mig { .. }) => {
                            table.and_then(|t| profile_name(&k, t)).as_deref() == Some(p.as_str())
                        }
                        _ => false,
                    }
                })?;
                let v = trial.iter_mut().find(|v| v.index == d.gpu)?;
                match d.kind {
                    DeviceKind::Gpu => v.whole_taken = true,
                    DeviceKind::Mps => v.mps_shares += 1,
                    DeviceKind::Mig { profile_id, placement } => v.occupied.push((profile_id, placement)),
                }
                got.push(d);
            }
            Some((n, trial, got))
        });
        let (n, trial, got) = target?;
        views[n] = trial;
        moves.push(Move {
            pod: pod.clone(),
            from: held.into_iter().map(|(_, d)| d).collect(),
            to: nodes[n].name.clone(),
            devices: got,
        });
    }
    Some(moves)
}

/// The room the nodes keep once the plan is carried out (see [`Cost::room`]): `gone` left, the
/// waiting pod took `beneficiary` on `nodes[node]`, and each moved pod's replacement landed.
fn room_after(
    nodes: &[Node],
    node: usize,
    beneficiary: &[DeviceRef],
    gone: &BTreeSet<&str>,
    moves: &[Move],
) -> Vec<u32> {
    let mut views: Vec<Vec<GpuView>> = nodes.iter().map(|n| n.gpus.iter().map(|g| view(g, gone)).collect()).collect();
    let mut take = |n: usize, d: &DeviceRef| {
        if let Some(v) = views[n].iter_mut().find(|v| v.index == d.gpu) {
            match d.kind {
                DeviceKind::Gpu => v.whole_taken = true,
                DeviceKind::Mps => v.mps_shares += 1,
                DeviceKind::Mig { profile_id, placement } => v.occupied.push((profile_id, placement)),
            }
        }
    };
    beneficiary.iter().for_each(|d| take(node, d));
    for m in moves {
        if let Some(n) = nodes.iter().position(|x| x.name == m.to) {
            m.devices.iter().for_each(|d| take(n, d));
        }
    }
    let mut sizes: Vec<(Reverse<u32>, Reverse<u32>, String)> = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .flat_map(|g| {
            g.table.profiles.iter().map(|p| (Reverse(p.memory_slices), Reverse(p.slices), p.name.to_string()))
        })
        .collect();
    sizes.sort();
    sizes.dedup();
    let views: Vec<&GpuView> = views.iter().flatten().filter(|v| !v.whole_taken).collect();
    let occupancies: Vec<Occupancy> =
        views.iter().map(|v| Occupancy::of(&v.table, v.occupied.iter().copied())).collect();
    sizes
        .iter()
        .map(|(_, _, name)| {
            views
                .iter()
                .zip(&occupancies)
                .flat_map(|(v, occ)| {
                    v.table
                        .profiles
                        .iter()
                        .filter(|p| p.name.to_string() == *name)
                        .map(|p| occ.remaining_capacity(&v.table, p))
                })
                .sum()
        })
        .collect()
}

/// What moving `pods` costs, the room it leaves aside (known once the plan is simulated).
fn cost(nodes: &[Node], pods: &[&String], movable: &BTreeMap<String, Movable>) -> Cost {
    let share = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.held.iter().filter(|h| pods.contains(&&h.by)).map(|h| share_of(&h.kind, &g.table)).sum::<u32>())
        .sum();
    let age = pods.iter().map(|p| movable.get(*p).map_or(0, |m| m.created)).sum();
    Cost { pods: pods.len(), share, room: Reverse(Vec::new()), age: Reverse(age) }
}

/// Every subset of `0..n` of size `size`, as index lists.
fn subsets(n: usize, size: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut pick = Vec::with_capacity(size);
    fn walk(n: usize, size: usize, from: usize, pick: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if pick.len() == size {
            out.push(pick.clone());
            return;
        }
        for i in from..n {
            if n - i < size - pick.len() {
                break;
            }
            pick.push(i);
            walk(n, size, i + 1, pick, out);
            pick.pop();
        }
    }
    walk(n, size, 0, &mut pick, &mut out);
    out
}

/// The rooms the waiting pod could get on the nodes it may land on.
fn rooms(nodes: &[Node], want: &Want, lands: &dyn Fn(&str) -> bool, movable: &BTreeMap<String, Movable>) -> Vec<Room> {
    let may_go = |p: &str| movable.contains_key(p) && !competes(nodes, p, want);
    let mut out = Vec::new();
    for (n, node) in nodes.iter().enumerate().filter(|(_, n)| lands(&n.name)) {
        let holders = |gpus: &[usize]| -> BTreeSet<String> {
            gpus.iter().flat_map(|&g| node.gpus[g].held.iter().map(|h| h.by.clone())).collect()
        };
        match want {
            Want::Mig(p) => {
                for (g, gpu) in node.gpus.iter().enumerate() {
                    if gpu.table.profiles.iter().any(|x| x.name.to_string() == *p) {
                        let pods = holders(&[g]).into_iter().filter(|h| may_go(h)).collect();
                        out.push(Room { node: n, gpus: vec![g], pods });
                    }
                }
            }
            Want::Whole(k) => {
                for gpus in subsets(node.gpus.len(), *k as usize) {
                    let pods = holders(&gpus);
                    if pods.iter().all(|h| may_go(h)) {
                        out.push(Room { node: n, gpus, pods: pods.into_iter().collect() });
                    }
                }
            }
        }
    }
    out
}

/// The cheapest plan that makes room for `want` on a node `lands` accepts, moving only pods of
/// `movable`, within `bounds`.
pub fn plan(
    nodes: &[Node],
    want: &Want,
    lands: &dyn Fn(&str) -> bool,
    movable: &BTreeMap<String, Movable>,
    bounds: Bounds,
) -> Search {
    let rooms = rooms(nodes, want, lands, movable);
    let mut candidates = 0;
    for size in 0..=bounds.max_pods {
        // Every plan of this size whose room then holds the waiting pod, cheapest first.
        let mut sized: Vec<(Cost, usize, Vec<&String>)> = Vec::new();
        for (r, room) in rooms.iter().enumerate() {
            let picks = match want {
                Want::Whole(_) if room.pods.len() == size => vec![(0..size).collect()],
                Want::Whole(_) => Vec::new(),
                Want::Mig(_) => subsets(room.pods.len(), size),
            };
            for pick in picks {
                let pods: Vec<&String> = pick.iter().map(|&i| &room.pods[i]).collect();
                let gone: BTreeSet<&str> = pods.iter().map(|p| p.as_str()).collect();
                if fits(&nodes[room.node], &room.gpus, want, &gone) {
                    sized.push((cost(nodes, &pods, movable), r, pods));
                }
            }
        }
        sized.sort_by(|a, b| (&a.0, a.1, &a.2).cmp(&(&b.0, b.1, &b.2)));
        // Tier by tier of (pods, share): every plan of the tier is simulated and the one that
        // leaves the most room (then moves the youngest pods) wins.
        let mut from = 0;
        while from < sized.len() {
            let tier = (sized[from].0.pods, sized[from].0.share);
            let to = sized[from..].iter().position(|x| (x.0.pods, x.0.share) != tier).map_or(sized.len(), |i| from + i);
            let mut best: Option<Plan> = None;
            for (c, r, pods) in &sized[from..to] {
                if candidates == bounds.max_candidates {
                    return Search { plan: best, candidates, cut: true };
                }
                candidates += 1;
                let room = &rooms[*r];
                let Some(moves) = replace(nodes, room, pods, movable) else { continue };
                let node = &nodes[room.node];
                let gone: BTreeSet<&str> = pods.iter().map(|p| p.as_str()).collect();
                let beneficiary = hand_out(node, &room.gpus, want, &gone);
                let mut cost = c.clone();
                cost.room = Reverse(room_after(nodes, room.node, &beneficiary, &gone, &moves));
                if best.as_ref().is_none_or(|b| cost < b.cost) {
                    best = Some(Plan {
                        node: node.name.clone(),
                        room: room.gpus.iter().map(|&g| node.gpus[g].index).collect(),
                        beneficiary,
                        moves,
                        cost,
                    });
                }
            }
            if best.is_some() {
                return Search { plan: best, candidates, cut: false };
            }
            from = to;
        }
    }
    Search { plan: None, candidates, cut: false }
}

#[cfg(test)]
mod tests;
