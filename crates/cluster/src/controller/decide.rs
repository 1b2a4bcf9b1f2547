//! The controller's decision for one batch (pure): which nodes get which layout so the most
//! pending GPU pods become schedulable, ranked by pods unblocked, then fewest instances destroyed
//! (never a busy one), then fragmentation afterwards; which idle nodes become dedicated for
//! tensor-parallel pods and which dedicated nodes go back; and, for every pod left waiting, why.

use super::affinity::{Placed, Placements};
use super::capacity::{layout_specs, ledger, schedule, served_in_order, NodeLedger};
use super::gpu_options::{observed_spec, options, Counts, GpuOption};
use super::memo::Memo;
use super::nodes::{GpuNode, Phase, RECLAIM_LAYOUT};
use super::pods::{GpuPod, NotServed, Resource};
use crate::config::ConfigFile;
use crate::defrag::empty_node::{empty, Host};
use crate::defrag::gpu_room::{self, RoomNote};
use crate::fleet::current::CurrentGpu;
use crate::fleet::report::GpuSpec;
use crate::mig::catalog::Model;
use crate::pools::Pools;
use k8s_openapi::api::core::v1::Taint;
use std::collections::{BTreeMap, BTreeSet};

/// Decision knobs (the controller's flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes reconfiguring at once, counting those already under way.
    pub max_concurrent_nodes: usize,
    /// Seconds after a change before the controller changes the node again.
    pub cooldown_secs: i64,
    /// Seconds a controller-made dedicated node stays without pods before it goes back.
    pub reclaim_after_secs: i64,
    /// Client slots of an MPS daemon the controller starts.
    pub mps_replicas: u32,
    /// A tensor-parallel pod no idle node serves gets the shared node that drains soonest
    /// reserved (tainted, so no new shared pod lands there; converted once idle).
    pub reserve_for_dedicated: bool,
    /// How the pools are written on nodes.
    pub pools: Pools,
    /// `--defrag`: a tensor-parallel pod nothing else serves gets the shared node whose movable
    /// pods all fit elsewhere reserved, and a MIG pod nothing else serves gets room made on one
    /// GPU ([`Kind::MakeRoom`]); the pods to move are in [`Outcome::drains`].
    pub defrag: Option<crate::defrag::movable::MoveRules>,
    /// Seconds a room made on a GPU waits for its pod before it is released
    /// (`--defrag-confirm-timeout`).
    pub room_secs: i64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_concurrent_nodes: 2,
            cooldown_secs: 60,
            reclaim_after_secs: 1800,
            mps_replicas: 4,
            reserve_for_dedicated: false,
            pools: Pools::default(),
            defrag: None,
            room_secs: 600,
        }
    }
}

/// Everything a decision reads.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// Nodes with an agent.
    pub nodes: &'a [GpuNode],
    /// Pods with GPU resources.
    pub pods: &'a [GpuPod],
    /// The layouts config (hand-written and generated layouts).
    pub config: Option<&'a ConfigFile>,
    /// Now, seconds since the epoch.
    pub now: i64,
    /// Per node: since when no pod has been bound to it (dedicated nodes).
    pub idle_since: &'a BTreeMap<String, i64>,
}

/// Starts or stops the idle clock of each node (`idle_since`, seconds): a controller-made
/// dedicated node that is settled and has no pod bound is idle since it was first seen so.
pub fn idle_clocks(
    idle_since: &mut BTreeMap<String, i64>,
    nodes: &[GpuNode],
    pods: &[GpuPod],
    now: i64,
    pools: &Pools,
) {
    let bound: BTreeSet<&str> = pods.iter().filter_map(GpuPod::node).collect();
    for n in nodes {
        if n.dedicated_by_controller(pools) && n.phase() == Phase::Settled && !bound.contains(n.name.as_str()) {
            idle_since.entry(n.name.clone()).or_insert(now);
        } else {
            idle_since.remove(&n.name);
        }
    }
}

/// What a decision does to a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A new layout in the shared pool.
    Repartition,
    /// Converted to the dedicated pool: taint, pool label, MIG off.
    Dedicate,
    /// Back from the dedicated pool to the shared one, with its earlier layout.
    Reclaim,
    /// Tainted for a waiting tensor-parallel pod while its shared pods end (layout unchanged).
    Reserve,
    /// One GPU re-cut for a waiting MIG pod once the movable pods on it have moved; the node
    /// takes no new pods meanwhile ([`crate::defrag::gpu_room`]).
    MakeRoom,
}

impl Kind {
    /// Metric label and Event reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Repartition => "repartition",
            Kind::Dedicate => "dedicate",
            Kind::Reclaim => "reclaim",
            Kind::Reserve => "reserve",
            Kind::MakeRoom => "make-room",
        }
    }
}

/// One node's change.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The node.
    pub node: String,
    /// What happens.
    pub kind: Kind,
    /// Its GPU model.
    pub model: &'static Model,
    /// The new per-GPU specs (empty for a reclaim to a named layout).
    pub specs: Vec<GpuSpec>,
    /// For a reclaim: the layout name to restore.
    pub restore: Option<String>,
    /// Pods it makes schedulable (`namespace/name`).
    pub pods: Vec<String>,
    /// GPU instances torn down (all idle).
    pub destroyed: u32,
    /// GPU instances created.
    pub created: u32,
    /// Expected fragmentation of the node's MIG free space afterwards, in memory slices.
    pub frag: f64,
    /// The change in words: `GPU 1: +2 1g.10gb -1 3g.40gb`.
    pub change: String,
    /// For [`Kind::MakeRoom`]: the room, as recorded on the node.
    pub room: Option<RoomNote>,
}

impl Decision {
    /// Pods it makes schedulable (a reservation or a room only starts moving pods for its pod).
    pub fn unblocks(&self) -> usize {
        if matches!(self.kind, Kind::Reserve | Kind::MakeRoom) {
            0
        } else {
            self.pods.len()
        }
    }
}

/// A batch's outcome.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Node changes, best first.
    pub decisions: Vec<Decision>,
    /// Pending pods no change serves this batch, and why.
    pub not_served: Vec<NotServed>,
    /// Nodes left alone, and why (reconfiguring, failed, cooling down, unreadable).
    pub held: Vec<(String, String)>,
    /// Pending GPU pods that the scheduler can place already (free units exist).
    pub placeable: usize,
    /// With `defrag`: the nodes reserved for a waiting tensor-parallel pod, and the moves that
    /// empty them (or why they cannot be emptied now).
    pub drains: Vec<Drain>,
}

/// A node reserved for a waiting tensor-parallel pod, to be emptied by moving its pods; or a
/// room being made on one of its GPUs for a waiting MIG pod (the decision's moves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// The node.
    pub node: String,
    /// The waiting pod (`namespace/name`).
    pub for_pod: String,
    /// Each pod to move and the node its replacement is expected on; or why not now.
    pub moves: Result<Vec<(String, String)>, String>,
    /// For a room on one GPU: the room (its node patch is the batch's [`Kind::MakeRoom`]
    /// decision, which must land before any pod moves).
    pub room: Option<RoomNote>,
}

/// A node the batch may change.
struct Candidate<'a> {
    node: &'a GpuNode,
    model: &'static Model,
    ledger: NodeLedger,
    gpus: Vec<CurrentGpu>,
    current: Vec<GpuSpec>,
}

/// Score of a node choice: pods unblocked, fewer destroyed, fewer created (no instance nobody
/// waits for), less fragmentation afterwards (milli-slices).
type Score = (usize, i64, i64, i64);

struct Choice {
    picks: Vec<usize>,
    pods: Vec<String>,
    score: Score,
}

/// Most partial states the exact search of one node keeps; beyond, GPU by GPU.
const STATES: usize = 20_000;

/// The waiting pods by resource in the scheduler's order (higher priority, then older), with
/// running totals (the most any of them could use).
/// The pods waiting for one resource, as (pod, units of it) in the scheduler's order, and the
/// running totals of those units.
type Queue<'p> = (Vec<(&'p GpuPod, u32)>, Vec<u32>);

struct Waiting<'p> {
    /// Per resource, its queue.
    by_resource: BTreeMap<&'p Resource, Queue<'p>>,
    /// Each resource's requests in that order (what [`served_in_order`] reads).
    counts: BTreeMap<&'p Resource, Vec<u32>>,
}

impl<'p> Waiting<'p> {
    /// The pods to serve, and the rivals the controller does not serve: a rival competes for each
    /// of its resources wherever its other ones are free (`free(r, units)`), since only then can
    /// the scheduler bind it there.
    ///
    /// `most(r)` is the most units of `r` the node could offer: a pod asking more is never served
    /// there, and once `most(r)` pods of one unit are queued no later pod can be (each of them is
    /// served while a unit is left), so the queue stops there and nodes with more pods waiting
    /// than they can serve see the same queue.
    fn new(
        unmet: &[&'p GpuPod],
        rivals: &[&'p GpuPod],
        free: impl Fn(&Resource, u32) -> bool,
        most: impl Fn(&Resource) -> u32,
    ) -> Self {
        let mut by_resource: BTreeMap<&Resource, Queue<'p>> = BTreeMap::new();
        for p in unmet {
            by_resource.entry(&p.resource).or_default().0.push((p, p.count));
        }
        for p in rivals {
            for (r, n) in p.asks() {
                if p.asks().filter(|(o, _)| *o != r).all(|(o, m)| free(o, m)) {
                    by_resource.entry(r).or_default().0.push((p, n));
                }
            }
        }
        for (r, (pods, totals)) in by_resource.iter_mut() {
            pods.sort_by(|(a, _), (b, _)| a.queue_cmp(b));
            let most = most(r);
            pods.retain(|(_, n)| *n <= most);
            if let Some(cut) = pods.iter().enumerate().filter(|(_, (_, n))| *n == 1).nth(most as usize).map(|(k, _)| k)
            {
                pods.truncate(cut);
            }
            let mut sum = 0;
            *totals = pods
                .iter()
                .map(|(_, n)| {
                    sum += n;
                    sum
                })
                .collect();
        }
        let counts = by_resource.iter().map(|(r, (pods, _))| (*r, pods.iter().map(|(_, n)| *n).collect())).collect();
        Self { by_resource, counts }
    }

    /// The pods of `r` that `free` new units go to, as the scheduler hands them out (in its order,
    /// each that still fits), and the units they use. Pods the controller does not serve take
    /// their units but are not among those returned.
    fn served(&self, r: &Resource, free: u32) -> (Vec<&'p GpuPod>, u32) {
        let (Some((pods, _)), Some(counts)) = (self.by_resource.get(r), self.counts.get(r)) else {
            return (Vec::new(), 0);
        };
        let picked: Vec<(&GpuPod, u32)> = served_in_order(counts, free).into_iter().map(|k| pods[k]).collect();
        let ours: Vec<(&GpuPod, u32)> = picked.into_iter().filter(|(p, _)| p.unserved.is_none()).collect();
        let units = ours.iter().map(|(_, n)| n).sum();
        (ours.into_iter().map(|(p, _)| p).collect(), units)
    }

    /// What the queue looks like to a node's choice: per resource, runs of (units, ours) in order
    /// (which pods they are does not change the choice, only whom it serves).
    fn shape(&self) -> String {
        let mut out = String::new();
        for (r, (pods, _)) in &self.by_resource {
            out.push_str(&format!("{r:?}:"));
            let mut runs: Vec<((u32, bool), usize)> = Vec::new();
            for (p, n) in pods {
                let k = (*n, p.unserved.is_none());
                match runs.last_mut() {
                    Some((last, count)) if *last == k => *count += 1,
                    _ => runs.push((k, 1)),
                }
            }
            for ((n, ours), count) in runs {
                out.push_str(&format!("{count}x{n}{};", if ours { "" } else { "r" }));
            }
        }
        out
    }

    /// How many pods of `r` `free` new units serve, and the units they use.
    fn fitting(&self, r: &Resource, free: u32) -> (usize, u32) {
        let (pods, units) = self.served(r, free);
        (pods.len(), units)
    }
}

/// What the picks (one option per GPU) offer together.
fn offered(opts: &[NodeOpts], picks: &[usize]) -> Counts {
    let mut offered = Counts::new();
    for (g, &k) in picks.iter().enumerate() {
        super::capacity::add(&mut offered, &opts[g][k].offers);
    }
    offered
}

/// Evaluates picks (one option per GPU) on a node: the score and the units that go to waiting
/// pods (the greedy's guide); `None` when a pod there would lose its units.
fn evaluate(c: &Candidate, opts: &[NodeOpts], picks: &[usize], waiting: &Waiting) -> Option<(Score, u32)> {
    let offered = offered(opts, picks);
    let (mut destroyed, mut created, mut frag) = (0i64, 0i64, 0.0f64);
    for (g, &k) in picks.iter().enumerate() {
        let o = &opts[g][k];
        destroyed += i64::from(o.destroyed);
        created += i64::from(o.created);
        frag += o.frag;
    }
    let l = &c.ledger;
    if l.held.keys().chain(l.assigned.keys()).any(|r| offered.get(r).copied().unwrap_or(0) < l.taken(r)) {
        return None;
    }
    let (mut unblocked, mut useful) = (0usize, 0u32);
    for (r, have) in &offered {
        let (n, units) = waiting.fitting(r, have.saturating_sub(l.taken(r)));
        unblocked += n;
        useful += units;
    }
    Some(((unblocked, -destroyed, -created, -(frag * 1000.0).round() as i64), useful))
}

/// The pods the picks unblock, in the scheduler's order.
fn unblocked_pods(c: &Candidate, opts: &[NodeOpts], picks: &[usize], waiting: &Waiting) -> Vec<String> {
    let mut out = Vec::new();
    for (r, have) in &offered(opts, picks) {
        let (pods, _) = waiting.served(r, have.saturating_sub(c.ledger.taken(r)));
        out.extend(pods.iter().map(|p| p.key.clone()));
    }
    out
}

/// The exact best picks on one node, by dynamic programming over its GPUs: the state is what
/// the GPUs so far offer of each resource that matters (held, placed or waited for), capped at
/// what could be used, and each state keeps its cheapest picks (fewest destroyed, then created,
/// then least fragmentation, then fewest GPUs changed). The score depends only on the final state
/// and the costs add up, so this is the best over every combination. `None` when the states
/// outgrow [`STATES`] (then the greedy decides).
fn exact(c: &Candidate, opts: &[NodeOpts], waiting: &Waiting) -> Option<Option<Vec<usize>>> {
    let need = |r: &Resource| c.ledger.taken(r);
    let keys: BTreeSet<&Resource> =
        c.ledger.held.keys().chain(c.ledger.assigned.keys()).chain(waiting.by_resource.keys().copied()).collect();
    let axes: Vec<(&Resource, u32)> = keys
        .into_iter()
        .map(|r| (r, need(r) + waiting.by_resource.get(r).and_then(|(_, t)| t.last()).copied().unwrap_or(0)))
        .collect();
    let cheaper =
        |a: &Cost, b: &Cost| (a.0, a.1).cmp(&(b.0, b.1)).then(a.2.total_cmp(&b.2)).then(a.3.cmp(&b.3)).is_lt();
    let mut states: BTreeMap<Vec<u32>, (Cost, Vec<usize>)> =
        BTreeMap::from([(vec![0; axes.len()], ((0, 0, 0.0, 0), Vec::new()))]);
    for gpu in opts {
        let mut next: BTreeMap<Vec<u32>, (Cost, Vec<usize>)> = BTreeMap::new();
        for (state, (cost, picks)) in &states {
            for (k, o) in gpu.iter().enumerate() {
                let st: Vec<u32> = axes
                    .iter()
                    .zip(state)
                    .map(|((r, cap), have)| (have + o.offers.get(*r).copied().unwrap_or(0)).min(*cap))
                    .collect();
                let nc: Cost = (
                    cost.0 + i64::from(o.destroyed),
                    cost.1 + i64::from(o.created),
                    cost.2 + o.frag,
                    cost.3 + usize::from(k > 0),
                );
                if next.get(&st).is_none_or(|(old, _)| cheaper(&nc, old)) {
                    let mut p = picks.clone();
                    p.push(k);
                    next.insert(st, (nc, p));
                }
            }
        }
        if next.len() > STATES {
            return None;
        }
        states = next;
    }
    let mut best: Option<(Score, usize, Vec<usize>)> = None;
    for (state, (cost, picks)) in states {
        if axes.iter().zip(&state).any(|((r, _), have)| *have < need(r)) {
            continue;
        }
        let unblocked: usize = axes.iter().zip(&state).map(|((r, _), have)| waiting.fitting(r, have - need(r)).0).sum();
        let s: Score = (unblocked, -cost.0, -cost.1, -(cost.2 * 1000.0).round() as i64);
        if best.as_ref().is_none_or(|(b, bc, _)| (s, std::cmp::Reverse(cost.3)) > (*b, std::cmp::Reverse(*bc))) {
            best = Some((s, cost.3, picks));
        }
    }
    Some(best.map(|b| b.2))
}

/// One GPU's options, shared with the memory of batches.
type NodeOpts = std::sync::Arc<Vec<GpuOption>>;

/// A partial choice's cost: destroyed, created, fragmentation, GPUs changed.
type Cost = (i64, i64, f64, usize);

/// The best change of one node for the waiting pods: exact ([`exact`]) unless its states
/// outgrow the bound; then GPU by GPU the option that helps most (units toward waiting pods break
/// ties toward pods that need several GPUs), then every change that no longer helps undone.
fn best_on_node(c: &Candidate, opts: &[NodeOpts], waiting: &Waiting) -> Option<Vec<usize>> {
    match exact(c, opts, waiting) {
        Some(best) => best,
        None => greedy(c, opts, waiting),
    }
}

/// The choice `picks` make on the node: `None` unless they unblock a pod.
fn choice(c: &Candidate, opts: &[NodeOpts], picks: Vec<usize>, waiting: &Waiting) -> Option<Choice> {
    let (score, _) = evaluate(c, opts, &picks, waiting)?;
    (score.0 > 0).then(|| Choice { pods: unblocked_pods(c, opts, &picks, waiting), picks, score })
}

fn greedy(c: &Candidate, opts: &[NodeOpts], waiting: &Waiting) -> Option<Vec<usize>> {
    let mut picks = vec![0usize; opts.len()];
    let guide = |s: Score, useful: u32| (s.0, useful, s.1, s.2, s.3);
    let (s, u) = evaluate(c, opts, &picks, waiting)?;
    let mut best = guide(s, u);
    for g in 0..opts.len() {
        for k in 1..opts[g].len() {
            let mut p = picks.clone();
            p[g] = k;
            if let Some((s, u)) = evaluate(c, opts, &p, waiting) {
                if guide(s, u) > best {
                    best = guide(s, u);
                    picks = p;
                }
            }
        }
    }
    for g in 0..opts.len() {
        if picks[g] == 0 {
            continue;
        }
        let mut p = picks.clone();
        p[g] = 0;
        let (now, _) = evaluate(c, opts, &picks, waiting)?;
        if let Some((s, _)) = evaluate(c, opts, &p, waiting) {
            if s >= now {
                picks = p;
            }
        }
    }
    Some(picks)
}

fn change_words(opts: &[NodeOpts], picks: &[usize], gpus: &[CurrentGpu]) -> String {
    let parts: Vec<String> = picks
        .iter()
        .enumerate()
        .filter(|(_, &k)| k > 0)
        .map(|(g, &k)| format!("GPU {}: {}", gpus[g].index, opts[g][k].change.join(" ")))
        .collect();
    parts.join("; ")
}

/// How a node running the DRA plugin is held (its devices are made per claim, not by layout).
pub const DRA_HELD: &str = "runs the DRA plugin, devices are made per claim there";

/// Decides one batch, remembering nothing.
pub fn decide(world: &World, opts: &Options) -> Outcome {
    decide_with(world, opts, &mut Memo::new())
}

/// Decides one batch with the memory of the batches before ([`Memo`]): nodes and waiting pods
/// unchanged since are not judged again. The outcome is the one [`decide`] gives.
pub fn decide_with(world: &World, opts: &Options, memo: &mut Memo) -> Outcome {
    memo.begin();
    let out = decide_batch(world, opts, memo);
    memo.end();
    out
}

fn decide_batch(world: &World, opts: &Options, memo: &mut Memo) -> Outcome {
    let pools = &opts.pools;
    let mut out = Outcome::default();
    let mut cands: Vec<Candidate> = Vec::new();
    let mut ledgers: Vec<NodeLedger> = Vec::new();
    let mut dedicated: Vec<bool> = Vec::new();
    let mut usable: Vec<bool> = Vec::new();
    let mut busy_nodes = 0usize;
    // The pods bound to each node, indexed once (not searched again for every node).
    let mut on_node: std::collections::HashMap<&str, Vec<&GpuPod>> = std::collections::HashMap::new();
    for p in world.pods {
        if let Some(n) = p.node() {
            on_node.entry(n).or_default().push(p);
        }
    }
    for node in world.nodes {
        let model = match node.model() {
            Ok(Some(m)) => crate::mig::catalog::lookup(m),
            Ok(None) => None,
            Err(e) => {
                out.held.push((node.name.clone(), e));
                continue;
            }
        };
        let Some(model) = model else {
            out.held.push((node.name.clone(), "its GPU model is not in the catalog".into()));
            continue;
        };
        let here = on_node.get(node.name.as_str()).map_or(&[][..], Vec::as_slice);
        let (l, gpus) = ledger(node, model, here, world.config);
        let current = layout_specs(node, model, world.config)
            .filter(|s| s.len() == node.gpus.len() && node.phase() == Phase::Settled)
            .unwrap_or_else(|| node.gpus.iter().map(observed_spec).collect());
        ledgers.push(l.clone());
        dedicated.push(node.is_dedicated(pools));
        usable.push(!node.cordoned);
        if !matches!(node.phase(), Phase::Settled) {
            busy_nodes += 1;
        }
        cands.push(Candidate { node, model, ledger: l, gpus, current });
    }
    // The GPU pods bound to nodes, as the inter-pod affinity filter sees them.
    let labels_of: BTreeMap<&str, &BTreeMap<String, String>> =
        world.nodes.iter().map(|n| (n.name.as_str(), &n.labels)).collect();
    let bound: Placements = world
        .pods
        .iter()
        .filter_map(|p| Some(Placed { pod: p.view(), node_labels: labels_of.get(p.node()?)? }))
        .collect();
    let waiting_anti = world.pods.iter().any(|q| q.node().is_none() && !q.constraints.terms.anti.is_empty());
    let (unmet_all, assigned) = schedule(&mut ledgers, &dedicated, &usable, world.pods, |p, i, sim| {
        let node = cands[i].node;
        if fit_blocked(p, node, &node.labels, &node.taints, pools).is_some() {
            return false;
        }
        // Inter-pod terms matter only where some pod has them (most have none).
        if p.constraints.terms.is_empty() && bound.no_anti() && !waiting_anti {
            return true;
        }
        let mut placed = bound.for_pod(p.view()).to_vec();
        placed.extend(
            sim.iter()
                .filter(|(q, _)| !p.constraints.terms.is_empty() || !q.constraints.terms.anti.is_empty())
                .map(|(q, j)| Placed { pod: q.view(), node_labels: &cands[*j].node.labels }),
        );
        super::affinity::blocked(p.view(), &node.labels, &placed).is_none()
    });
    // Bound pods and those the scheduler will place: what the nodes hold once it has.
    let mut placed = bound.clone();
    for (q, j) in &assigned {
        placed.push(Placed { pod: q.view(), node_labels: &cands[*j].node.labels });
    }
    for (c, l) in cands.iter_mut().zip(&ledgers) {
        c.ledger = l.clone();
    }
    let pending = world.pods.iter().filter(|p| p.node().is_none()).count();
    let unmet_all: Vec<&GpuPod> = unmet_all.into_iter().filter(|p| p.is_unschedulable()).collect();
    // Pods the controller does not serve still take what the scheduler would give them.
    let competitors: Vec<&GpuPod> = unmet_all.iter().copied().filter(|p| p.unserved.is_some()).collect();
    let mut unmet: Vec<&GpuPod> = unmet_all.iter().copied().filter(|p| p.unserved.is_none()).collect();
    // Rooms being made on a GPU (with --defrag): their nodes are left alone, their pods wait.
    let mut rooms: BTreeMap<String, (usize, RoomNote)> = BTreeMap::new();
    let mut unreadable_rooms: BTreeMap<usize, String> = BTreeMap::new();
    if opts.defrag.is_some() {
        for (i, c) in cands.iter().enumerate() {
            match RoomNote::on(&c.node.annotations) {
                Some(Ok(note)) => {
                    rooms.insert(note.pod.clone(), (i, note));
                }
                Some(Err(e)) => {
                    unreadable_rooms.insert(i, e);
                }
                None => {}
            }
        }
        unmet.retain(|p| !rooms.contains_key(&p.key));
    }
    out.placeable = pending.saturating_sub(unmet_all.len());
    let mut budget = opts.max_concurrent_nodes.saturating_sub(busy_nodes);
    // Which nodes may change now.
    let mut changeable: Vec<usize> = Vec::new();
    for (i, c) in cands.iter().enumerate() {
        let room = rooms.values().find(|(j, _)| *j == i).map(|(_, n)| n);
        let dra = c.node.dra_plugin();
        let why = match c.node.phase() {
            _ if dra.is_some() => dra.map(|d| format!("{DRA_HELD}: {d}")),
            _ if room.is_some() => room.map(|n| format!("making room on GPU {} for {}", n.gpu, n.pod)),
            _ if unreadable_rooms.contains_key(&i) => unreadable_rooms.get(&i).cloned(),
            Phase::Reconfiguring(r) | Phase::Failed(r) => Some(r),
            Phase::Settled if c.node.cordoned => Some("cordoned".into()),
            Phase::Settled => match c.node.changed_at() {
                Some(t) if world.now - t < opts.cooldown_secs => {
                    Some(format!("cooling down for {} s after the last change", opts.cooldown_secs - (world.now - t)))
                }
                _ => None,
            },
        };
        match why {
            Some(w) => out.held.push((c.node.name.clone(), w)),
            None => changeable.push(i),
        }
    }
    let mut taken: BTreeSet<usize> = BTreeSet::new();
    // When no waiting pod names nodes, nodes alike score alike: the first stands for the rest.
    let names_nodes = |p: &&GpuPod| {
        let c = &p.constraints;
        !c.node_selector.is_empty() || !c.required_terms.is_empty() || !c.terms.is_empty()
    };
    let plain = !unmet.iter().chain(&competitors).any(names_nodes) && bound.no_anti() && !waiting_anti;
    let mut profiles_of: std::collections::HashMap<&str, BTreeMap<crate::mig::ProfileName, u32>> =
        std::collections::HashMap::new();
    let mut states: Vec<Option<String>> = vec![None; cands.len()];
    // The waiting pods by their constraints (what decides where a pod lands when no pod names
    // nodes).
    let classes: std::collections::HashMap<&str, usize> = {
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        unmet
            .iter()
            .chain(&competitors)
            .map(|p| {
                let n = seen.len();
                (p.key.as_str(), *seen.entry(format!("{:?}", p.constraints)).or_insert(n))
            })
            .collect()
    };
    while budget > 0 && !unmet.is_empty() {
        let shared: Vec<&GpuPod> = unmet.iter().copied().filter(|p| !p.is_tensor_parallel()).collect();
        let mut best: Option<(Score, usize, Decision)> = None;
        let mut judged: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut repartitions: std::collections::HashSet<String> = std::collections::HashSet::new();
        for &i in changeable.iter().filter(|i| !taken.contains(i)) {
            let c = &cands[i];
            // A node alike one judged before it scores as that one did, and ties keep the first.
            let state = states[i].get_or_insert_with(|| gpu_state(c)).clone();
            if plain && !judged.insert(alike(c, &state, pools)) {
                continue;
            }
            // Only pods that could land here apart from their GPUs count for this node. When no
            // pod names nodes, pods with the same constraints land alike: judged once a node.
            let mut verdicts: Vec<Option<bool>> = vec![None; classes.len()];
            let mut lands_here = |p: &&GpuPod| match classes.get(p.key.as_str()).filter(|_| plain) {
                Some(&k) => *verdicts[k].get_or_insert_with(|| lands(p, c.node, &placed, pools)),
                None => lands(p, c.node, &placed, pools),
            };
            let shared: Vec<&GpuPod> = shared.iter().copied().filter(&mut lands_here).collect();
            let rivals: Vec<&GpuPod> = competitors.iter().copied().filter(&mut lands_here).collect();
            let wanted: BTreeSet<Resource> = shared.iter().map(|p| p.resource.clone()).collect();
            if let Some(d) = dedicate(c, &unmet, &placed, pools) {
                let s: Score = (d.pods.len(), -i64::from(d.destroyed), 0, 0);
                if best.as_ref().is_none_or(|(b, _, _)| s > *b) {
                    best = Some((s, i, d));
                }
            }
            if c.node.is_dedicated(pools) || shared.is_empty() {
                continue;
            }
            // A node whose model offers none of what waits (a MIG profile it lacks) is skipped.
            let profiles = profiles_of.entry(c.model.id).or_insert_with(|| {
                c.model.profile_table().profiles.into_iter().map(|x| (x.name, x.instance_count)).collect()
            });
            if !wanted.iter().any(|r| !matches!(r, Resource::Mig(m) if !profiles.contains_key(m))) {
                continue;
            }
            // The most units of each resource the node could offer, bounding its queue.
            let gpus = c.gpus.len() as u32;
            let most = |r: &Resource| -> u32 {
                match r {
                    Resource::Mig(m) => gpus * profiles.get(m).copied().unwrap_or(0),
                    Resource::Gpu => gpus,
                    Resource::Mps => u32::MAX,
                }
            };
            let waiting = Waiting::new(&shared, &rivals, |r, n| c.ledger.free(r) >= n, most);
            // Nodes that hold the same GPUs, layout and ledger and see the same queue (whoever is
            // in it) repartition alike: within a batch the first stands for the rest (ties keep
            // it), and across batches the judgement is remembered.
            let key = format!("{state}|{}|{}", opts.mps_replicas, waiting.shape());
            if !repartitions.insert(key.clone()) {
                continue;
            }
            let (node_opts, picks) = match memo.recall(&key) {
                Some(judged) => judged,
                None => {
                    let node_opts: Vec<NodeOpts> = c
                        .gpus
                        .iter()
                        .zip(&c.current)
                        .map(|(g, cur)| {
                            let key = format!("{}|{g:?}|{cur:?}|{wanted:?}|{}", c.model.id, opts.mps_replicas);
                            memo.options(key, || {
                                options(c.model, g, cur.clone(), &wanted, opts.mps_replicas)
                                    .unwrap_or_else(|_| vec![keep(cur.clone())])
                            })
                        })
                        .collect();
                    let picks = best_on_node(c, &node_opts, &waiting);
                    memo.remember(key, (node_opts.clone(), picks.clone()));
                    (node_opts, picks)
                }
            };
            if let Some(ch) = picks.and_then(|picks| choice(c, &node_opts, picks, &waiting)) {
                if best.as_ref().is_none_or(|(b, _, _)| ch.score > *b) {
                    let specs = ch.picks.iter().enumerate().map(|(g, &k)| node_opts[g][k].spec.clone()).collect();
                    let sum = |f: fn(&GpuOption) -> f64| {
                        ch.picks.iter().enumerate().map(|(g, &k)| f(&node_opts[g][k])).sum::<f64>()
                    };
                    let d = Decision {
                        node: c.node.name.clone(),
                        kind: Kind::Repartition,
                        model: c.model,
                        specs,
                        restore: None,
                        pods: ch.pods.clone(),
                        destroyed: sum(|o| f64::from(o.destroyed)) as u32,
                        created: sum(|o| f64::from(o.created)) as u32,
                        frag: sum(|o| o.frag),
                        change: change_words(&node_opts, &ch.picks, &c.gpus),
                        room: None,
                    };
                    best = Some((ch.score, i, d));
                }
            }
        }
        let Some((_, i, d)) = best else { break };
        unmet.retain(|p| !d.pods.contains(&p.key));
        taken.insert(i);
        budget -= 1;
        out.decisions.push(d);
    }
    // With --defrag, a room on one GPU for the first waiting MIG pod that nothing else serves:
    // the cheapest GPU whose movable pods all fit elsewhere now, re-cut once they have moved. One
    // a batch, since the moved pods' destinations are judged against this batch's free units.
    if let Some(rules) = opts.defrag.as_ref().filter(|_| budget > 0) {
        let hosts = hosts_of(&cands, &taken, pools);
        let mut mig: Vec<(&GpuPod, &crate::mig::ProfileName)> = unmet
            .iter()
            .filter_map(|p| match &p.resource {
                Resource::Mig(m) if p.count == 1 && p.also.is_empty() => Some((*p, m)),
                _ => None,
            })
            .collect();
        mig.sort_by(|(a, _), (b, _)| a.queue_cmp(b));
        let may = |i: usize| {
            let c = &cands[i];
            (changeable.contains(&i) && !taken.contains(&i) && !c.node.is_dedicated(pools)).then_some(c.model)
        };
        let made = mig.into_iter().find_map(|(p, profile)| {
            let room = gpu_room::plan(&hosts, &may, world.pods, p, rules, world.now, pools)?;
            let i = cands.iter().position(|c| c.node.name == room.node)?;
            Some((p, profile, i, room))
        });
        if let Some((p, profile, i, room)) = made {
            let c = &cands[i];
            let specs: Vec<GpuSpec> = c
                .gpus
                .iter()
                .zip(&c.current)
                .map(|(g, cur)| if g.index == room.gpu { room.spec.clone() } else { cur.clone() })
                .collect();
            let moves: Vec<String> = room.moves.iter().map(|(pod, to)| format!("{pod} to node {to}")).collect();
            let note = RoomNote {
                pod: p.key.clone(),
                gpu: room.gpu,
                profile: profile.to_string(),
                until: world.now + opts.room_secs,
            };
            let change = format!(
                "GPU {}: {} for {}, once {} moved ({}); no new pods on the node meanwhile",
                room.gpu,
                room.change.join(" "),
                p.key,
                if moves.len() == 1 { "its pod has" } else { "its pods have" },
                moves.join(", ")
            );
            out.decisions.push(Decision {
                node: c.node.name.clone(),
                kind: Kind::MakeRoom,
                model: c.model,
                specs,
                restore: None,
                pods: vec![p.key.clone()],
                destroyed: room.cost.3,
                created: room.created,
                frag: 0.0,
                change,
                room: Some(note.clone()),
            });
            out.drains.push(Drain {
                node: c.node.name.clone(),
                for_pod: p.key.clone(),
                moves: Ok(room.moves),
                room: Some(note.clone()),
            });
            unmet.retain(|q| q.key != p.key);
            rooms.insert(p.key.clone(), (i, note));
            taken.insert(i);
            budget -= 1;
        }
    }
    // Reservations: waiting tensor-parallel pods keep (or, opted in, get) a shared node that
    // drains; reservations no pod waits for any more are released.
    let waiting_tp: Vec<&GpuPod> = unmet.iter().copied().filter(|p| p.is_tensor_parallel()).collect();
    let mut reserved: Vec<usize> =
        (0..cands.len()).filter(|&i| is_reserved(&cands[i], pools) && !taken.contains(&i)).collect();
    reserved.sort_by_key(|&i| (cands[i].ledger.pods.len(), cands[i].node.name.clone()));
    let mut reserved_for: BTreeMap<String, usize> = BTreeMap::new();
    for (p, &i) in waiting_tp.iter().zip(&reserved) {
        reserved_for.insert(p.key.clone(), i);
    }
    let hosts = hosts_of(&cands, &taken, pools);
    if opts.reserve_for_dedicated || opts.defrag.is_some() {
        for p in waiting_tp.iter().skip(reserved.len()) {
            let eligible: Vec<usize> = changeable
                .iter()
                .copied()
                .filter(|i| !taken.contains(i) && !cands[*i].node.is_dedicated(pools))
                .filter(|&i| cands[i].gpus.len() as u32 >= p.count && !cands[i].node.cordoned)
                .filter(|&i| lands_once_dedicated(p, cands[i].node, &placed, pools))
                .collect();
            let emptied = opts.defrag.as_ref().and_then(|rules| {
                eligible
                    .iter()
                    .filter_map(|&i| Some((i, empty(i, &hosts, world.pods, p, rules, world.now, pools).ok()?)))
                    .min_by(|(a, x), (b, y)| (&x.cost, &cands[*a].node.name).cmp(&(&y.cost, &cands[*b].node.name)))
            });
            let pick = emptied.as_ref().map(|(i, _)| *i).or_else(|| {
                opts.reserve_for_dedicated.then(|| {
                    eligible.iter().copied().min_by_key(|&i| {
                        let busy: usize =
                            cands[i].gpus.iter().map(|g| g.instances.iter().filter(|x| x.busy).count()).sum();
                        (cands[i].ledger.pods.len(), busy, cands[i].node.name.clone())
                    })
                })?
            });
            let Some(i) = pick else { continue };
            let c = &cands[i];
            let change = match &emptied {
                Some((_, e)) => {
                    let moves: Vec<String> = e.moves.iter().map(|(pod, to)| format!("{pod} to node {to}")).collect();
                    format!(
                        "reserved for {}: no new shared pods; moving its {} pod(s) ({}), then converts to dedicated",
                        p.key,
                        e.moves.len(),
                        moves.join(", ")
                    )
                }
                None => format!(
                    "reserved for {}: no new shared pods; converts to dedicated once its {} pod(s) end",
                    p.key,
                    c.ledger.pods.len()
                ),
            };
            let restore = c.node.layout().map(str::to_string);
            out.decisions.push(pool_change(c, Kind::Reserve, restore, vec![p.key.clone()], change));
            reserved_for.insert(p.key.clone(), i);
            taken.insert(i);
        }
    }
    // Nodes reserved already (their taint is on): the moves that empty them now.
    if let Some(rules) = &opts.defrag {
        for (pod, &i) in &reserved_for {
            let Some(p) = waiting_tp.iter().find(|p| p.key == *pod) else { continue };
            if !reserved.contains(&i) || cands[i].ledger.pods.is_empty() {
                continue;
            }
            let moves = empty(i, &hosts, world.pods, p, rules, world.now, pools).map(|e| e.moves);
            out.drains.push(Drain { node: cands[i].node.name.clone(), for_pod: pod.clone(), moves, room: None });
        }
    }
    let released: Vec<usize> = reserved
        .iter()
        .skip(waiting_tp.len())
        .copied()
        .filter(|i| changeable.contains(i) && !taken.contains(i))
        .collect();
    for i in released {
        let c = &cands[i];
        let change = "reservation released: no tensor-parallel pod waits for it".to_string();
        out.decisions.push(pool_change(c, Kind::Reclaim, reclaim_layout(c), Vec::new(), change));
        taken.insert(i);
    }
    // Dedicated nodes without pods for long enough go back to the shared pool.
    for &i in &changeable {
        let c = &cands[i];
        if budget == 0 || taken.contains(&i) || !c.node.dedicated_by_controller(pools) || is_reserved(c, pools) {
            continue;
        }
        let empty = c.ledger.pods.is_empty() && c.ledger.assigned.values().all(|n| *n == 0);
        let idle_for = world.idle_since.get(&c.node.name).map(|t| world.now - t);
        if empty && idle_for.is_some_and(|s| s >= opts.reclaim_after_secs) {
            let restore = reclaim_layout(c);
            let change = format!(
                "back to the shared pool{} after {} s without pods",
                restore.as_deref().map(|l| format!(" with layout '{l}'")).unwrap_or_default(),
                idle_for.unwrap_or(0)
            );
            out.decisions.push(pool_change(c, Kind::Reclaim, restore, Vec::new(), change));
            budget -= 1;
        }
    }
    let reconfiguring = busy_nodes + out.decisions.iter().filter(|d| d.kind != Kind::Reserve).count();
    for p in unmet_all.iter().filter(|p| rooms.contains_key(&p.key)) {
        let Some((i, note)) = rooms.get(&p.key) else { continue };
        let reason = format!(
            "needs {}; GPU {} of node {} is being re-cut for it once the pods on it have moved",
            what(p),
            note.gpu,
            cands[*i].node.name
        );
        out.not_served.push(NotServed { key: p.key.clone(), reason, kind: "reserved" });
    }
    let fenced_note = fenced_words(&cands);
    // Pods alike (the same request, constraints, namespace and scheduler message) get the same
    // reason: each kind is explained once a batch.
    let mut explained: std::collections::HashMap<String, (&'static str, String)> = std::collections::HashMap::new();
    for p in unmet {
        let (kind, reason) = match reserved_for.get(&p.key) {
            Some(&i) => (
                "reserved",
                format!(
                    "needs {}; node {} is reserved for it and converts once its {} pod(s) end",
                    what(p),
                    cands[i].node.name,
                    cands[i].ledger.pods.len()
                ),
            ),
            None => {
                let alike = format!(
                    "{:?}|{}|{:?}|{}|{}|{:?}|{:?}",
                    p.resource, p.count, p.also, p.dedicated, p.namespace, p.scheduler_message, p.constraints
                );
                explained
                    .entry(alike)
                    .or_insert_with(|| why_not(p, &cands, &changeable, &taken, reconfiguring, &placed, opts))
                    .clone()
            }
        };
        let reason = format!("{reason}{fenced_note}");
        out.not_served.push(NotServed { key: p.key.clone(), reason, kind });
    }
    out
}

/// The nodes as moves see them: a replacement lands on a shared node, not cordoned, not changed
/// by this batch.
fn hosts_of<'c>(cands: &'c [Candidate], taken: &BTreeSet<usize>, pools: &Pools) -> Vec<Host<'c>> {
    cands
        .iter()
        .enumerate()
        .map(|(j, c)| Host {
            node: c.node,
            ledger: &c.ledger,
            takes_replacements: !c.node.is_dedicated(pools) && !c.node.cordoned && !taken.contains(&j),
        })
        .collect()
}

/// A change of pool labels and taints only (no GPU is set differently by it).
fn pool_change(c: &Candidate, kind: Kind, restore: Option<String>, pods: Vec<String>, change: String) -> Decision {
    Decision {
        node: c.node.name.clone(),
        kind,
        model: c.model,
        specs: Vec::new(),
        restore,
        pods,
        destroyed: 0,
        created: 0,
        frag: 0.0,
        change,
        room: None,
    }
}

/// The layout a controller-made dedicated node returns to.
fn reclaim_layout(c: &Candidate) -> Option<String> {
    c.node.annotations.get(RECLAIM_LAYOUT).filter(|l| !l.is_empty()).cloned()
}

/// Reserved for the dedicated pool by the controller but not converted yet (MIG or MPS on).
fn is_reserved(c: &Candidate, pools: &Pools) -> bool {
    c.node.dedicated_by_controller(pools) && c.gpus.iter().any(|g| g.mig || g.mps_slots.is_some())
}

fn keep(spec: GpuSpec) -> GpuOption {
    GpuOption {
        offers: super::capacity::spec_offers(&spec),
        spec,
        destroyed: 0,
        created: 0,
        frag: 0.0,
        change: Vec::new(),
    }
}

/// A node converted to dedicated for the waiting tensor-parallel pods it can hold: only a shared
/// (or reserved) node with nothing in use and no pod bound or about to be. Each pod is judged
/// against the node as it will be once dedicated (the pool label and the taint set), in the
/// scheduler's order, beside the pods `placed` in the cluster and those served before it.
fn dedicate(c: &Candidate, unmet: &[&GpuPod], placed: &Placements, pools: &Pools) -> Option<Decision> {
    let open = !c.node.is_dedicated(pools) || is_reserved(c, pools);
    if !open || !c.ledger.pods.is_empty() || c.ledger.assigned.values().any(|n| *n > 0) {
        return None;
    }
    if c.gpus.iter().filter(|g| g.unhealthy.is_none()).any(CurrentGpu::any_busy) {
        return None;
    }
    let mut tp: Vec<&GpuPod> = unmet.iter().copied().filter(|p| p.is_tensor_parallel()).collect();
    tp.sort_by(|a, b| a.queue_cmp(b));
    let (labels, taints) = pools.once_dedicated(&c.node.labels, &c.node.taints);
    let mut left = c.gpus.iter().filter(|g| g.unhealthy.is_none()).count() as u32;
    let mut served: Vec<&GpuPod> = Vec::new();
    for p in tp {
        if p.count > left {
            continue;
        }
        let mut beside = placed.clone();
        for q in &served {
            beside.push(Placed { pod: q.view(), node_labels: &c.node.labels });
        }
        if blocked_with(p, c.node, &labels, &taints, &beside, pools).is_none() {
            left -= p.count;
            served.push(p);
        }
    }
    if served.is_empty() {
        return None;
    }
    let healthy = || c.gpus.iter().filter(|g| g.unhealthy.is_none());
    let destroyed: u32 = healthy().map(|g| g.instances.len() as u32 + u32::from(g.mps_slots.is_some())).sum();
    Some(Decision {
        node: c.node.name.clone(),
        kind: Kind::Dedicate,
        model: c.model,
        // An unhealthy GPU keeps its setting (the agent leaves it as it is).
        specs: c.gpus.iter().map(|g| if g.unhealthy.is_some() { observed_spec(g) } else { GpuSpec::Off }).collect(),
        restore: None,
        pods: served.iter().map(|p| p.key.clone()).collect(),
        destroyed,
        created: 0,
        frag: 0.0,
        change: format!("dedicated: {} whole GPUs, {destroyed} idle instance(s) torn down", healthy().count()),
        room: None,
    })
}

/// What decides a node's scores in a batch where no waiting pod names nodes (no node selector,
/// required node terms or inter-pod terms, and no bound pod with anti-affinity): its model, GPUs,
/// current layout, ledger, pool, reservation, taints and room. Nodes that share it score alike.
fn alike(c: &Candidate, state: &str, pools: &Pools) -> String {
    format!(
        "{}|{}|{}|{}|{:?}|{:?}",
        state,
        c.ledger.pods.is_empty(),
        c.node.is_dedicated(pools),
        is_reserved(c, pools),
        c.node.taints,
        c.node.room
    )
}

/// What a node's repartition depends on besides the pods that can land there: its model, GPUs,
/// current layout and ledger.
fn gpu_state(c: &Candidate) -> String {
    let l = &c.ledger;
    format!("{}|{:?}|{:?}|{:?}|{:?}|{:?}", c.model.id, c.gpus, c.current, l.offered, l.held, l.assigned)
}

/// `; unhealthy GPUs offer nothing: node-a GPU 1 (XID 79)` when candidates have unhealthy GPUs.
fn fenced_words(cands: &[Candidate]) -> String {
    let fenced: Vec<String> = cands
        .iter()
        .flat_map(|c| {
            c.node
                .gpus
                .iter()
                .filter_map(|g| g.unhealthy.as_ref().map(|r| format!("{} GPU {} ({r})", c.node.name, g.index)))
        })
        .collect();
    match fenced.len() {
        0 => String::new(),
        n if n > 3 => format!("; unhealthy GPUs offer nothing: {} and {} more", fenced[..3].join(", "), n - 3),
        _ => format!("; unhealthy GPUs offer nothing: {}", fenced.join(", ")),
    }
}

fn what(p: &GpuPod) -> String {
    match &p.resource {
        Resource::Mig(m) if p.count == 1 => m.to_string(),
        Resource::Mig(m) => format!("{} × {m}", p.count),
        Resource::Gpu if p.is_tensor_parallel() => format!("{} whole GPUs on a dedicated node", p.count),
        Resource::Gpu => format!("{} whole GPU(s) on one node", p.count),
        Resource::Mps => format!("{} MPS slot(s)", p.count),
    }
}

/// Why `p` could not land on `node` judged with these labels and taints, by the scheduler's
/// filters apart from GPUs and inter-pod affinity (the dedicated taint is judged apart).
fn fit_blocked(
    p: &GpuPod,
    node: &GpuNode,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    pools: &Pools,
) -> Option<String> {
    super::fit::blocked(&p.constraints, &node.name, labels, taints, &node.room, &pools.taint.key)
}

/// [`fit_blocked`], then inter-pod affinity against the `placed` pods.
fn blocked_with(
    p: &GpuPod,
    node: &GpuNode,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    placed: &Placements,
    pools: &Pools,
) -> Option<String> {
    fit_blocked(p, node, labels, taints, pools)
        .or_else(|| super::affinity::blocked(p.view(), labels, placed.for_pod(p.view())))
}

/// Whether `p` could land on `node` as it is, apart from its GPUs.
fn lands(p: &GpuPod, node: &GpuNode, placed: &Placements, pools: &Pools) -> bool {
    blocked_with(p, node, &node.labels, &node.taints, placed, pools).is_none()
}

/// Whether `p` could land on `node` once the controller dedicated it.
fn lands_once_dedicated(p: &GpuPod, node: &GpuNode, placed: &Placements, pools: &Pools) -> bool {
    let (labels, taints) = pools.once_dedicated(&node.labels, &node.taints);
    blocked_with(p, node, &labels, &taints, placed, pools).is_none()
}

/// Why `p` could not land on `node` apart from its GPUs, as it is and as the controller may make
/// it: once dedicated (a tensor-parallel pod, a node not dedicated) or once returned (another
/// pod, a node the controller dedicated); `None` when some way it could.
fn blocked_on(p: &GpuPod, node: &GpuNode, placed: &Placements, pools: &Pools) -> Option<String> {
    let why = blocked_with(p, node, &node.labels, &node.taints, placed, pools)?;
    let dedicable = p.is_tensor_parallel() && !node.is_dedicated(pools);
    if dedicable && lands_once_dedicated(p, node, placed, pools) {
        return None;
    }
    if !p.is_tensor_parallel() && node.dedicated_by_controller(pools) {
        let recorded = node.reclaim_labels();
        let (labels, taints) = pools.once_returned(&node.labels, &node.taints, recorded.as_ref());
        // Landing there once returned: not blocked.
        blocked_with(p, node, &labels, &taints, placed, pools)?;
    }
    Some(why)
}

/// Why a waiting pod is not served this batch: the kind of reason (stable from batch to batch
/// while nothing but the details change) and the sentence.
fn why_not(
    p: &GpuPod,
    cands: &[Candidate],
    changeable: &[usize],
    taken: &BTreeSet<usize>,
    reconfiguring: usize,
    placed: &Placements,
    opts: &Options,
) -> (&'static str, String) {
    let need = what(p);
    // Blocked everywhere by something other than GPUs: no change can help, say which.
    let blocked: Vec<String> = cands
        .iter()
        .filter_map(|c| blocked_on(p, c.node, placed, &opts.pools).map(|why| format!("{}: {why}", c.node.name)))
        .collect();
    if !cands.is_empty() && blocked.len() == cands.len() {
        let scheduler = p.scheduler_message.as_deref().map(|m| format!(" (the scheduler: {m})")).unwrap_or_default();
        return (
            "blocked",
            format!(
                "needs {need} but cannot land on any GPU node for other reasons: {}{scheduler}",
                blocked.join("; ")
            ),
        );
    }
    if let Resource::Mig(m) = &p.resource {
        // Instances of the profile one GPU of each model holds (each model's table built once).
        let mut per_model: BTreeMap<&str, u32> = BTreeMap::new();
        for c in cands {
            per_model.entry(c.model.id).or_insert_with(|| {
                c.model.profile_table().profiles.iter().find(|x| &x.name == m).map_or(0, |x| x.instance_count)
            });
        }
        if per_model.values().all(|n| *n == 0) {
            return ("no-profile", format!("needs {need}; no GPU model in the cluster has that MIG profile"));
        }
        // A pod's devices come from one node: the most instances of the profile any node holds.
        let per_node = |c: &Candidate| -> u32 { per_model.get(c.model.id).copied().unwrap_or(0) * c.gpus.len() as u32 };
        let most = cands.iter().map(per_node).max().unwrap_or(0);
        if p.count > most {
            return (
                "too-large",
                format!("needs {need}; no node can hold {} instances of {m} (at most {most} on one node)", p.count),
            );
        }
    }
    let largest = cands.iter().map(|c| c.gpus.len()).max().unwrap_or(0) as u32;
    if p.resource == Resource::Gpu && p.count > largest {
        return ("too-large", format!("needs {need}; no node has {} GPUs (the largest has {largest})", p.count));
    }
    let free_nodes = changeable.iter().filter(|i| !taken.contains(i)).count();
    if reconfiguring >= opts.max_concurrent_nodes && free_nodes > 0 {
        return (
            "waiting-for-slot",
            format!(
                "needs {need}; waits for a reconfiguration slot ({reconfiguring} node(s) reconfiguring, --max-concurrent-nodes {})",
                opts.max_concurrent_nodes
            ),
        );
    }
    // Name the pods in the way on the nodes that could otherwise host it.
    let mut in_way: Vec<String> = Vec::new();
    for &i in changeable.iter().filter(|i| !taken.contains(i)) {
        in_way.extend(cands[i].ledger.pods.iter().take(3).cloned());
    }
    in_way.sort();
    in_way.dedup();
    let held = cands.len() - changeable.len();
    let pool = if p.is_tensor_parallel() { "no idle node" } else { "no idle GPU" };
    match (in_way.is_empty(), held) {
        (false, _) => {
            let shown: Vec<&str> = in_way.iter().take(3).map(String::as_str).collect();
            let more = if in_way.len() > 3 { format!(" and {} more", in_way.len() - 3) } else { String::new() };
            ("pods-in-the-way", format!("needs {need}; {pool} can host it without evicting {}{more}", shown.join(", ")))
        }
        (true, 0) => ("no-room", format!("needs {need}; {pool} can host it")),
        (true, n) => (
            "nodes-busy",
            format!("needs {need}; {pool} can host it now ({n} node(s) reconfiguring, failed or cooling down)"),
        ),
    }
}
