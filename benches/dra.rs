//! Publication order under a claim trace (`cargo bench --bench dra`): one node of 8 GPUs, MIG
//! claims of mixed sizes and whole-GPU claims of 1, 2, 4 and 8 GPUs arriving as a Poisson
//! process with long-tailed (log-normal) durations, allocated by the scheduler stand-in
//! (tests/support/allocator.rs) from NVIDIA's order (GPU, profile, placement ascending, never
//! reordered) and gpupart's (republished after every change); beside them two comparators that
//! are not orders: the capacity-only bound (a claim refused only when the free memory slices
//! cannot hold it at all) and free migration (every instance may move to another GPU or
//! placement at every arrival, which no publication order can do); and gpupart's order with
//! defragmentation: when a claim would be refused, the controller's room planner
//! (`gpupart_cluster::defrag::room`) moves the fewest movable claims (a stated share of the MIG
//! claims up to 3g, `MOVABLE_PERCENT`; never whole-GPU, 4g or 7g claims; at most `MAX_PODS` per
//! plan), the waiting claim takes the room first (the reservation), then the moved claims are
//! allocated again, each move costing its pod `RESTART` of downtime. Each row sums `TRACES`
//! traces of `CLAIMS` claims. Prints a table per model, load and mix: the default mix, and one
//! with a third of the whole-GPU claims. `cargo bench --bench dra -- traces` prints the tables
//! only; `GPUPART_BENCH_MODEL=A100` one model's rows; `GPUPART_BENCH_MOVABLE_PERCENT` and
//! `GPUPART_BENCH_MAX_PODS` change the share of movable claims and the bound.
//!
//! First, the latency of Prepare and Unprepare through the real binary (`gpupart agent --dra`
//! on the fake libnvidia-ml, called by the fake kubelet over its unix socket) and from an
//! allocation to the republished order — build the fakes first with
//! `cargo build --release -p fake-nvml -p fake-mps` — then the same calls in process with the
//! publication's cost.

#[path = "../tests/support/mod.rs"]
mod support;

use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::defrag::room::{self, Want};
use gpupart::dra::devices::{DeviceKind, DeviceRef};
use gpupart::dra::order::{nvidia_order, order, GpuView};
use gpupart::dra::publish::{content, names, Catalog, PublishedGpu};
use gpupart::dra::slices::{keep_unchanged, write_plan, SliceSpec};
use gpupart::mig::capacity::Occupancy;
use gpupart::mig::Placement;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::allocator::{Allocated, Allocator, Request};
use support::dra_rig::DraRig;
use support::rng::Rng;

const DRIVER: &str = "gpu.gpupart.io";
const NODE: &str = "node-a";
const GPUS: u32 = 8;
const CLAIMS: usize = 4000;
const TRACES: u64 = 4;

/// What a claim asks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ask {
    Mig(&'static str, u32),
    Whole(u32),
}

/// (what, weight): MIG profiles with their memory slices, whole-GPU claims of 1, 2, 4, 8.
const MIX: &[(Ask, f64)] = &[
    (Ask::Mig("1g.10gb", 1), 30.0),
    (Ask::Mig("1g.20gb", 2), 8.0),
    (Ask::Mig("2g.20gb", 2), 15.0),
    (Ask::Mig("3g.40gb", 4), 12.0),
    (Ask::Mig("4g.40gb", 4), 6.0),
    (Ask::Mig("7g.80gb", 8), 4.0),
    (Ask::Whole(1), 5.0),
    (Ask::Whole(2), 2.5),
    (Ask::Whole(4), 1.2),
    (Ask::Whole(8), 0.4),
];

fn slices_of(ask: Ask) -> u32 {
    match ask {
        Ask::Mig(_, s) => s,
        Ask::Whole(k) => 8 * k,
    }
}

#[derive(Debug, Clone, Copy)]
struct Event {
    at: f64,
    claim: usize,
    arrive: bool,
}

/// The trace with the whole-GPU claims' weights multiplied by `wscale`.
fn trace_mix(seed: u64, load: f64, wscale: f64) -> (Vec<Ask>, Vec<Event>) {
    let mut rng = Rng(seed);
    let mix: Vec<(Ask, f64)> =
        MIX.iter().map(|&(a, w)| (a, if matches!(a, Ask::Whole(_)) { w * wscale } else { w })).collect();
    let total: f64 = mix.iter().map(|m| m.1).sum();
    let mean_slices: f64 = mix.iter().map(|(a, w)| w / total * f64::from(slices_of(*a))).sum();
    let (median, sigma) = (1.0, 1.2);
    let mean_duration = median * (sigma * sigma / 2.0f64).exp();
    let rate = load * f64::from(GPUS * 8) / (mean_slices * mean_duration);
    let mut asks = Vec::new();
    let mut events = Vec::new();
    let mut t = 0.0;
    for claim in 0..CLAIMS {
        t += rng.exp(rate);
        let mut pick = rng.unit() * total;
        let ask = mix.iter().find(|(_, w)| {
            pick -= w;
            pick <= 0.0
        });
        asks.push(ask.map_or(MIX[0].0, |a| a.0));
        events.push(Event { at: t, claim, arrive: true });
        events.push(Event { at: t + rng.lognormal(median, sigma), claim, arrive: false });
    }
    events.sort_by(|a, b| a.at.total_cmp(&b.at));
    (asks, events)
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    claims: usize,
    refused: usize,
    refused_with_capacity: usize,
    mig_refused_with_capacity: usize,
    whole_claims: usize,
    whole_refused: usize,
    largest_sum: f64,
    largest_samples: usize,
    created: usize,
    destroyed: usize,
    /// Claims allocated.
    allocated: usize,
    /// ResourceSlice writes the publications took (only slices whose content changed).
    writes: usize,
    /// Defragmentation: claims moved (evicted and allocated again elsewhere).
    evictions: usize,
    /// Claims served by a plan (allocated after the moves).
    served_by_plan: usize,
    /// Moved claims whose replacement the stand-in refused (the plan promised it a place).
    replacements_refused: usize,
    /// Time the moved claims' pods spent restarting, summed.
    restart_time: f64,
    /// Time the claims held their devices, summed (the trace's offered work).
    held_time: f64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Self) {
        self.claims += o.claims;
        self.refused += o.refused;
        self.refused_with_capacity += o.refused_with_capacity;
        self.mig_refused_with_capacity += o.mig_refused_with_capacity;
        self.whole_claims += o.whole_claims;
        self.whole_refused += o.whole_refused;
        self.largest_sum += o.largest_sum;
        self.largest_samples += o.largest_samples;
        self.created += o.created;
        self.destroyed += o.destroyed;
        self.allocated += o.allocated;
        self.writes += o.writes;
        self.evictions += o.evictions;
        self.served_by_plan += o.served_by_plan;
        self.replacements_refused += o.replacements_refused;
        self.restart_time += o.restart_time;
        self.held_time += o.held_time;
    }
}

/// The node as allocated: per claim its devices.
struct Node {
    gpus: Vec<PublishedGpu>,
    views: Vec<GpuView>,
    allocator: Allocator,
    held: BTreeMap<usize, (Vec<Allocated>, Vec<DeviceRef>)>,
    /// The slices as last published, and the writes publishing took so far.
    current: BTreeMap<String, SliceSpec>,
    writes: usize,
}

impl Node {
    fn new(model: &str) -> Self {
        let b = SimBackend::open(Some(&format!("{model}:{GPUS}")), None).expect("simulator");
        for i in 0..GPUS {
            b.set_mig_mode(i, true).expect("MIG on");
        }
        let states = b.observe_all().expect("observe");
        let gpus = Catalog::default().gpus(&states, &b.driver_version().expect("driver version"));
        let views = gpus
            .iter()
            .map(|g| GpuView {
                index: g.info.index,
                table: g.table.clone(),
                mig_enabled: true,
                occupied: Vec::new(),
                whole_taken: false,
                mps_shares: 0,
                mps_device: false,
            })
            .collect();
        Self {
            gpus,
            views,
            allocator: Allocator::default(),
            held: BTreeMap::new(),
            current: BTreeMap::new(),
            writes: 0,
        }
    }

    /// Publishes every device, `offered` first in order within its group, as the plugin does
    /// (the allocated devices stay listed, so their counters stay accounted), counting the slice
    /// writes it takes.
    fn publish(&mut self, offered: &[DeviceRef]) {
        let slices = content(DRIVER, NODE, 1, &self.gpus, offered, &BTreeMap::new(), &BTreeMap::new());
        let slices = keep_unchanged(&self.current, slices, &names(&self.gpus, offered));
        self.writes += write_plan(&self.current, &slices).len();
        self.current = slices.iter().map(|s| (s.name.clone(), s.spec.clone())).collect();
        self.allocator.slices = slices.into_iter().map(|s| (s.name, s.spec)).collect();
    }

    /// gpupart's order.
    fn publish_gpupart(&mut self) {
        let offered = order(&self.views);
        self.publish(&offered);
    }

    fn free_slices(&self) -> Vec<u32> {
        self.views
            .iter()
            .map(|v| {
                if v.whole_taken {
                    0
                } else {
                    Occupancy::of(&v.table, v.occupied.iter().copied()).free_memory_slices(&v.table)
                }
            })
            .collect()
    }

    fn largest_mean(&self) -> f64 {
        let sum: u32 = self
            .views
            .iter()
            .map(|v| {
                if v.whole_taken {
                    0
                } else {
                    Occupancy::of(&v.table, v.occupied.iter().copied())
                        .largest_creatable(&v.table)
                        .map_or(0, |p| p.memory_slices)
                }
            })
            .sum();
        f64::from(sum) / self.views.len() as f64
    }

    fn parse(&self, name: &str) -> DeviceRef {
        let gpus = &self.gpus;
        DeviceRef::parse(name, |g| gpus.get(g as usize).map(|x| &x.table)).expect("a published device")
    }

    fn hold(&mut self, claim: usize, got: Vec<Allocated>) {
        self.allocator.commit(&got);
        let refs: Vec<DeviceRef> = got.iter().map(|a| self.parse(&a.device)).collect();
        for r in &refs {
            let v = &mut self.views[r.gpu as usize];
            match r.kind {
                DeviceKind::Gpu => v.whole_taken = true,
                DeviceKind::Mps => v.mps_shares += 1,
                DeviceKind::Mig { profile_id, placement } => v.occupied.push((profile_id, placement)),
            }
        }
        self.held.insert(claim, (got, refs));
    }

    fn drop_claim(&mut self, claim: usize) -> usize {
        let Some((got, refs)) = self.held.remove(&claim) else { return 0 };
        self.allocator.release(&got);
        let mut destroyed = 0;
        for r in refs {
            let v = &mut self.views[r.gpu as usize];
            match r.kind {
                DeviceKind::Gpu => v.whole_taken = false,
                DeviceKind::Mps => v.mps_shares = v.mps_shares.saturating_sub(1),
                DeviceKind::Mig { profile_id, placement } => {
                    v.occupied.retain(|o| *o != (profile_id, placement));
                    destroyed += 1;
                }
            }
        }
        destroyed
    }
}

fn requests(ask: Ask) -> Vec<Request> {
    match ask {
        Ask::Mig(profile, _) => vec![Request::new("gpu", &[("type", "mig"), ("profile", profile)], 1)],
        Ask::Whole(k) => vec![Request::new("gpus", &[("type", "gpu")], k as usize)],
    }
}

fn had_capacity(free: &[u32], ask: Ask) -> bool {
    match ask {
        Ask::Mig(_, s) => free.iter().any(|f| *f >= s),
        Ask::Whole(k) => free.iter().sum::<u32>() >= 8 * k,
    }
}

/// The share of MIG claims up to 3g.40gb whose pods opt in to moving (percent;
/// `GPUPART_BENCH_MOVABLE_PERCENT` overrides it); whole-GPU, 4g and 7g claims never move.
const MOVABLE_PERCENT: u64 = 100;
/// The most pods one plan moves (`GPUPART_BENCH_MAX_PODS` overrides it).
const MAX_PODS: usize = 4;

/// A number from the environment, else `default`.
fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
/// What one move costs its pod: the time to restart elsewhere (trace units; durations have a
/// median of 1, so with a median of an hour this is 3 minutes).
const RESTART: f64 = 0.05;

/// Whether claim `claim` (asking `ask`) is one whose pod may move.
fn movable_claim(claim: usize, ask: Ask) -> bool {
    let small = matches!(ask, Ask::Mig(_, s) if s <= 4) && !matches!(ask, Ask::Mig("4g.40gb", _));
    let pct: u64 = knob("GPUPART_BENCH_MOVABLE_PERCENT", MOVABLE_PERCENT);
    small && (claim as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40 & 0xFFFF < pct * 0x10000 / 100
}

/// The policy a replay follows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    /// NVIDIA's order, published once.
    Nvidia,
    /// gpupart's order, republished after every change.
    Gpupart,
    /// gpupart's order, and moves (the controller's room planner) when a claim would be refused.
    Defrag,
}

/// Makes room for the refused `claim` by moving claims, as `gpupart controller --defrag` does on
/// a DRA node: the cheapest plan (gpupart_cluster's room planner), the moved claims deallocated,
/// the waiting claim allocated in the room first (the reservation), then each moved claim again.
/// Returns whether the claim was served.
fn defragment(node: &mut Node, claim: usize, asks: &[Ask], arrived: &[f64], t: &mut Tally) -> bool {
    let ask = asks[claim];
    let want = match ask {
        Ask::Mig(p, _) => Want::Mig(p.into()),
        Ask::Whole(k) => Want::Whole(k),
    };
    let mut gpus: Vec<room::Gpu> = node
        .views
        .iter()
        .map(|v| room::Gpu { index: v.index, table: v.table.clone(), mig_enabled: v.mig_enabled, held: Vec::new() })
        .collect();
    for (c, (_, refs)) in &node.held {
        for r in refs {
            gpus[r.gpu as usize].held.push(room::Held { kind: r.kind, by: c.to_string() });
        }
    }
    let movable = node
        .held
        .keys()
        .filter(|&&c| movable_claim(c, asks[c]))
        .map(|&c| (c.to_string(), room::Movable { created: (arrived[c] * 3600.0) as i64, lands: None }))
        .collect();
    let nodes = [room::Node { name: NODE.into(), gpus }];
    let Some(plan) = room::plan(
        &nodes,
        &want,
        &|_| true,
        &movable,
        room::Bounds { max_pods: knob("GPUPART_BENCH_MAX_PODS", MAX_PODS), ..room::Bounds::default() },
    )
    .plan
    else {
        return false;
    };
    let moved: Vec<usize> = plan.moves.iter().filter_map(|m| m.pod.parse().ok()).collect();
    // Whole GPUs idle before the moves may serve the claim as well as the room: the moved claims
    // then take the room's leftovers.
    let idle_before: Vec<u32> = node.views.iter().filter(|v| v.idle()).map(|v| v.index).collect();
    for &c in &moved {
        t.destroyed += node.drop_claim(c);
    }
    node.publish_gpupart();
    let got = node.allocator.allocate(&requests(ask)).expect("the room holds the claim it was made for");
    let landed: Vec<u32> = got.iter().map(|a| node.parse(&a.device).gpu).collect();
    let room_or_idle = |g: &u32| plan.room.contains(g) || idle_before.contains(g);
    assert!(landed.iter().all(room_or_idle), "claim {claim} landed on {landed:?}, not in the room {:?}", plan.room);
    node.hold(claim, got);
    node.publish_gpupart();
    t.served_by_plan += 1;
    t.allocated += 1;
    t.created += usize::from(matches!(ask, Ask::Mig(..)));
    for c in moved {
        t.evictions += 1;
        t.restart_time += RESTART;
        match node.allocator.allocate(&requests(asks[c])) {
            Some(got) => {
                node.hold(c, got);
                node.publish_gpupart();
                t.allocated += 1;
                t.created += 1;
            }
            None => t.replacements_refused += 1,
        }
    }
    true
}

fn replay(model: &str, asks: &[Ask], events: &[Event], policy: Policy) -> Tally {
    let mut node = Node::new(model);
    let mut t = Tally::default();
    let gpupart = policy != Policy::Nvidia;
    if gpupart {
        node.publish_gpupart();
    } else {
        let all = nvidia_order(&node.views);
        node.publish(&all);
    }
    let mut arrived = vec![0.0; asks.len()];
    // The first publication is the same for every order: count what follows.
    node.writes = 0;
    for e in events {
        let ask = asks[e.claim];
        if !e.arrive {
            if node.held.contains_key(&e.claim) {
                t.held_time += e.at - arrived[e.claim];
            }
            let d = node.drop_claim(e.claim);
            t.destroyed += d;
            if gpupart && (d > 0 || matches!(ask, Ask::Whole(_))) {
                node.publish_gpupart();
            }
            continue;
        }
        arrived[e.claim] = e.at;
        t.claims += 1;
        t.largest_sum += node.largest_mean();
        t.largest_samples += 1;
        let whole = matches!(ask, Ask::Whole(_));
        t.whole_claims += usize::from(whole);
        match node.allocator.allocate(&requests(ask)) {
            Some(got) => {
                t.created += usize::from(!whole);
                t.allocated += 1;
                node.hold(e.claim, got);
                if gpupart {
                    node.publish_gpupart();
                }
            }
            None if policy == Policy::Defrag && defragment(&mut node, e.claim, asks, &arrived, &mut t) => {}
            None => {
                t.refused += 1;
                t.whole_refused += usize::from(whole);
                let had = had_capacity(&node.free_slices(), ask);
                t.refused_with_capacity += usize::from(had);
                t.mig_refused_with_capacity += usize::from(had && !whole);
            }
        }
    }
    t.writes = node.writes;
    t
}

/// The capacity-only bound: memory slices as a fluid per GPU (best fit for MIG claims), whole
/// GPUs as 8 slices each taken from the freest GPUs.
fn bound(asks: &[Ask], events: &[Event]) -> Tally {
    let mut free = vec![8u32; GPUS as usize];
    let mut held: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
    let mut t = Tally::default();
    for e in events {
        let ask = asks[e.claim];
        if !e.arrive {
            for (g, s) in held.remove(&e.claim).unwrap_or_default() {
                free[g] += s;
            }
            continue;
        }
        t.claims += 1;
        let whole = matches!(ask, Ask::Whole(_));
        t.whole_claims += usize::from(whole);
        let taken = match ask {
            Ask::Mig(_, s) => {
                (0..free.len()).filter(|&g| free[g] >= s).min_by_key(|&g| (free[g], g)).map(|g| vec![(g, s)])
            }
            Ask::Whole(k) if free.iter().sum::<u32>() >= 8 * k => {
                let mut need = 8 * k;
                let mut by_free: Vec<usize> = (0..free.len()).collect();
                by_free.sort_by_key(|&g| std::cmp::Reverse(free[g]));
                let mut parts = Vec::new();
                for g in by_free {
                    let s = free[g].min(need);
                    if s > 0 {
                        parts.push((g, s));
                        need -= s;
                    }
                }
                Some(parts)
            }
            Ask::Whole(_) => None,
        };
        match taken {
            Some(parts) => {
                for (g, s) in &parts {
                    free[*g] -= s;
                }
                held.insert(e.claim, parts);
            }
            None => {
                t.refused += 1;
                t.whole_refused += usize::from(whole);
            }
        }
    }
    t
}

/// One GPU under free migration: `None` when taken whole, else its instances as (claim,
/// profile, placement).
type Held = Option<Vec<(usize, &'static str, Placement)>>;

/// Free migration, a comparator no publication order can reach: a MIG claim goes on the most
/// used GPU where it fits as things stand, at the placement that leaves the GPU the most room
/// (largest profiles first); when it fits nowhere, or a whole-GPU claim finds too few idle GPUs,
/// every instance is repacked (largest first, each on the first GPU that takes it, placed the
/// same way) and kept if the claim then fits. A moved instance counts as destroyed and
/// created.
fn move_all(model: &str, asks: &[Ask], events: &[Event]) -> Tally {
    let table = Node::new(model).gpus[0].table.clone();
    let profile = |name: &str| table.profiles.iter().find(|p| p.name.to_string() == name).cloned();
    let occupancy = |l: &[(usize, &'static str, Placement)]| {
        Occupancy::of(&table, l.iter().filter_map(|(_, n, pl)| profile(n).map(|p| (p.id, *pl))))
    };
    let mut largest_first: Vec<_> = table.profiles.clone();
    largest_first.sort_by_key(|p| (Reverse(p.memory_slices), Reverse(p.slices)));
    // How many more of each profile, largest first, a GPU could take.
    let room =
        |occ: &Occupancy| -> Vec<u32> { largest_first.iter().map(|p| occ.remaining_capacity(&table, p)).collect() };
    // `claim` on the first GPU in `visit` order that takes it, at the placement leaving the most room.
    let place = |gpus: &mut [Held], visit: &[usize], claim: usize, name: &'static str| -> bool {
        let Some(p) = profile(name) else { return false };
        for &g in visit {
            let Some(l) = gpus[g].as_mut() else { continue };
            let occ = occupancy(l);
            let best = p.placements.iter().copied().filter(|pl| occ.can_add(&table, &p, *pl)).max_by_key(|pl| {
                let mut after = occ;
                after.add(&p, *pl);
                (room(&after), Reverse(pl.start))
            });
            if let Some(pl) = best {
                l.push((claim, name, pl));
                return true;
            }
        }
        false
    };
    // Every instance repacked, plus `extra`; None when they do not all fit.
    let repack = |gpus: &[Held], extra: Option<(usize, &'static str)>| -> Option<Vec<Held>> {
        let mut all: Vec<(usize, &'static str)> = gpus.iter().flatten().flatten().map(|x| (x.0, x.1)).collect();
        all.extend(extra);
        let size = |n: &str| profile(n).map_or((0, 0), |p| (p.memory_slices, p.slices));
        all.sort_by_key(|(c, n)| (Reverse(size(n)), *c));
        let mut fresh: Vec<Held> = gpus.iter().map(|g| g.as_ref().map(|_| Vec::new())).collect();
        let visit: Vec<usize> = (0..fresh.len()).collect();
        all.iter().all(|(c, n)| place(&mut fresh, &visit, *c, n)).then_some(fresh)
    };
    let moved = |a: &[Held], b: &[Held]| {
        let at = |gs: &[Held]| -> BTreeMap<usize, (usize, Placement)> {
            gs.iter().enumerate().flat_map(|(g, l)| l.iter().flatten().map(move |(c, _, pl)| (*c, (g, *pl)))).collect()
        };
        let (before, after) = (at(a), at(b));
        before.iter().filter(|(c, w)| after.get(c).is_some_and(|x| x != *w)).count()
    };
    let mut gpus: Vec<Held> = vec![Some(Vec::new()); GPUS as usize];
    let mut whole: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut t = Tally::default();
    for e in events {
        let ask = asks[e.claim];
        if !e.arrive {
            for l in gpus.iter_mut().flatten() {
                let n = l.len();
                l.retain(|x| x.0 != e.claim);
                t.destroyed += n - l.len();
            }
            for g in whole.remove(&e.claim).unwrap_or_default() {
                gpus[g] = Some(Vec::new());
            }
            continue;
        }
        let free: Vec<u32> =
            gpus.iter().map(|g| g.as_ref().map_or(0, |l| occupancy(l).free_memory_slices(&table))).collect();
        let largest: u32 =
            gpus.iter().flatten().map(|l| occupancy(l).largest_creatable(&table).map_or(0, |p| p.memory_slices)).sum();
        t.claims += 1;
        t.largest_sum += f64::from(largest) / f64::from(GPUS);
        t.largest_samples += 1;
        let ok = match ask {
            Ask::Mig(name, _) => {
                let mut visit: Vec<usize> = (0..gpus.len()).collect();
                visit.sort_by_key(|&g| (free[g], g));
                let fits = place(&mut gpus, &visit, e.claim, name)
                    || repack(&gpus, Some((e.claim, name))).is_some_and(|fresh| {
                        let m = moved(&gpus, &fresh);
                        t.destroyed += m;
                        t.created += m;
                        gpus = fresh;
                        true
                    });
                t.created += usize::from(fits);
                fits
            }
            Ask::Whole(k) => {
                t.whole_claims += 1;
                let idle = |gs: &[Held]| -> Vec<usize> {
                    (0..gs.len()).filter(|&g| gs[g].as_ref().is_some_and(Vec::is_empty)).collect()
                };
                if idle(&gpus).len() < k as usize {
                    if let Some(fresh) = repack(&gpus, None).filter(|f| idle(f).len() >= k as usize) {
                        let m = moved(&gpus, &fresh);
                        t.destroyed += m;
                        t.created += m;
                        gpus = fresh;
                    }
                }
                let free_gpus = idle(&gpus);
                let fits = free_gpus.len() >= k as usize;
                if fits {
                    let take: Vec<usize> = free_gpus.into_iter().rev().take(k as usize).collect();
                    for g in &take {
                        gpus[*g] = None;
                    }
                    whole.insert(e.claim, take);
                } else {
                    t.whole_refused += 1;
                }
                fits
            }
        };
        if !ok {
            t.refused += 1;
            let had = had_capacity(&free, ask);
            t.refused_with_capacity += usize::from(had);
            t.mig_refused_with_capacity += usize::from(had && matches!(ask, Ask::Mig(..)));
        }
    }
    t
}

/// Whether the fake libnvidia-ml and the fake MPS control program are built beside the bench.
fn fakes_built() -> bool {
    let built = |f: &str| {
        std::env::current_exe().ok().and_then(|e| e.parent()?.parent().map(|d| d.join(f).exists())).unwrap_or(false)
    };
    (built("libfake_nvml.so") || built("deps/libfake_nvml.so")) && built("fake-nvidia-cuda-mps-control")
}

/// Prepare and Unprepare latency through the real binary: `gpupart agent --dra` on the fake
/// libnvidia-ml with `delay_ms` per NVML change, the fake kubelet calling it over its socket and
/// the scheduler stand-in allocating from its slices; and from an allocation (the claim's status
/// written) to the publication that lists the device as taken.
fn latencies_through_the_binary(model: &str, delay_ms: u32) {
    if !fakes_built() {
        println!("{model:<16} (skipped: build the fakes first: `cargo build --release -p fake-nvml -p fake-mps`)");
        return;
    }
    let delay = delay_ms.to_string();
    let rig = DraRig::start_with(&format!("{model}:{GPUS}"), &[], &[("FAKE_NVML_OP_DELAY_MS", delay.as_str())]);
    rig.wait_slices("the whole pool", |s| {
        s.first().is_some_and(|(_, x)| x.pool.resource_slice_count == s.len() as i64)
            && s.iter().any(|(_, x)| !x.devices.is_empty())
    });
    let (mut prepare, mut unprepare, mut republish) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..5 {
        let mut names = Vec::new();
        for (i, profile) in ["1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb"].iter().cycle().take(8).enumerate() {
            let name = format!("bench-{round}-{i}");
            rig.mig_claim(&name, profile);
            rig.schedule(&name).expect("the stand-in allocates the claim");
            let t = Instant::now();
            if rig.wait_caught_up() {
                republish.push(t.elapsed());
            }
            let t = Instant::now();
            rig.prepare(&name).expect("prepared");
            prepare.push(t.elapsed());
            names.push(name);
        }
        for name in names {
            let t = Instant::now();
            let err = rig.unprepare(&name);
            assert!(err.is_empty(), "unprepare {name}: {err}");
            unprepare.push(t.elapsed());
            rig.delete_claim(&name);
        }
    }
    println!(
        "{model:<16} {delay_ms:>4} ms/change  prepare p50 {:>6.0} ms p99 {:>6.0} ms   unprepare p50 {:>6.0} ms p99 {:>6.0} ms   allocation to republication p50 {:>5.0} ms p99 {:>5.0} ms",
        percentile(&mut prepare, 0.5),
        percentile(&mut prepare, 0.99),
        percentile(&mut unprepare, 0.5),
        percentile(&mut unprepare, 0.99),
        percentile(&mut republish, 0.5),
        percentile(&mut republish, 0.99),
    );
}

/// MPS shares through the real binary: `gpupart agent --dra` on the fake libnvidia-ml with GPUs
/// without MIG, the fake MPS control program, the fake kubelet over gRPC and the allocator
/// stand-in with consumable capacity. Each round prepares four 1 GiB shares on one GPU (the first
/// starts the GPU's MPS daemon) and unprepares them (the last stops it).
fn mps_latencies_through_the_binary(model: &str) {
    if !fakes_built() {
        println!("{model:<16} (skipped: build the fakes first: `cargo build --release -p fake-nvml -p fake-mps`)");
        return;
    }
    let rig = DraRig::start(&format!("{model}:1"));
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the MPS device", |s| s.iter().flat_map(|(_, x)| &x.devices).any(|d| d.name == "gpu-0-mps"));
    let (mut first, mut next, mut unprepare, mut last) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..10 {
        let names: Vec<String> = (0..4).map(|i| format!("share-{round}-{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            rig.mps_claim(name, "1Gi");
            rig.schedule(name).expect("the stand-in allocates the share");
            let t = Instant::now();
            rig.prepare(name).expect("prepared");
            if i == 0 {
                first.push(t.elapsed())
            } else {
                next.push(t.elapsed())
            }
        }
        for (i, name) in names.iter().enumerate() {
            let t = Instant::now();
            let err = rig.unprepare(name);
            assert!(err.is_empty(), "unprepare {name}: {err}");
            if i == names.len() - 1 {
                last.push(t.elapsed())
            } else {
                unprepare.push(t.elapsed())
            }
            rig.delete_claim(name);
        }
    }
    println!(
        "{model:<16} first share (starts the daemon) p50 {:>5.0} ms p99 {:>5.0} ms   next shares p50 {:>5.0} ms p99 {:>5.0} ms   unprepare p50 {:>5.0} ms p99 {:>5.0} ms   last (stops it) p50 {:>5.0} ms p99 {:>5.0} ms",
        percentile(&mut first, 0.5),
        percentile(&mut first, 0.99),
        percentile(&mut next, 0.5),
        percentile(&mut next, 0.99),
        percentile(&mut unprepare, 0.5),
        percentile(&mut unprepare, 0.99),
        percentile(&mut last, 0.5),
        percentile(&mut last, 0.99),
    );
}

/// The `p` quantile of `v`, in milliseconds.
fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// Prepare and Unprepare latency through the node driver on the simulator with `delay` per NVML
/// change; and the time to compute one publication (order and slices) of a full node.
fn latencies(model: &str, delay: Duration) {
    use gpupart::dra::driver::{AllocatedDevice, ClaimToPrepare, Driver, DriverConfig};
    let dir = std::env::temp_dir().join(format!("gpupart-dra-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = DriverConfig {
        pool: NODE.into(),
        cdi_dir: dir.join("cdi"),
        mig_minors: dir.join("mig-minors"),
        state_dir: dir.join("state"),
    };
    let b = SimBackend::open(Some(&format!("{model}:{GPUS}")), None).expect("simulator");
    for i in 0..GPUS {
        b.set_mig_mode(i, true).expect("MIG on");
        b.reset_gpu(i).expect("reset");
    }
    let b = b.with_op_delay(delay);
    let mut minors = String::new();
    for g in 0..GPUS {
        for gi in 0..16 {
            minors.push_str(&format!(
                "gpu{g}/gi{gi}/access {}\ngpu{g}/gi{gi}/ci0/access {}\n",
                1000 + 2 * gi,
                1001 + 2 * gi
            ));
        }
    }
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(&cfg.mig_minors, minors).expect("minors");
    let mut d = Driver::open(cfg).expect("driver");
    let mut prepare = Vec::new();
    let mut unprepare = Vec::new();
    let mut publish = Vec::new();
    let mut node = Node::new(model);
    for round in 0..5 {
        let mut uids = Vec::new();
        for i in 0..8 {
            let views = d.views(&b.observe_all().expect("observe"), &[]);
            let offered = order(&views);
            node.views = views;
            let t = Instant::now();
            node.publish_gpupart();
            publish.push(t.elapsed());
            let first = offered.iter().find(|x| matches!(x.kind, DeviceKind::Mig { .. })).expect("a MIG device");
            let name = first.name(&node.gpus[first.gpu as usize].table);
            let uid = format!("c{round}-{i}");
            let claim = ClaimToPrepare {
                uid: uid.clone(),
                namespace: "ml".into(),
                name: uid.clone(),
                devices: vec![AllocatedDevice::whole("gpu", NODE, &name)],
                share_config: None,
            };
            let t = Instant::now();
            d.prepare(&b, &claim).expect("prepared");
            prepare.push(t.elapsed());
            uids.push(uid);
        }
        for uid in uids {
            let t = Instant::now();
            d.unprepare(&b, &uid).expect("unprepared");
            unprepare.push(t.elapsed());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{model:<16} {:>4} ms/change  prepare p50 {:>6.0} ms p99 {:>6.0} ms   unprepare p50 {:>6.0} ms p99 {:>6.0} ms   publication p50 {:>6.1} ms p99 {:>6.1} ms",
        delay.as_millis(),
        percentile(&mut prepare, 0.5),
        percentile(&mut prepare, 0.99),
        percentile(&mut unprepare, 0.5),
        percentile(&mut unprepare, 0.99),
        percentile(&mut publish, 0.5),
        percentile(&mut publish, 0.99),
    );
}

/// The five runs of one trace: NVIDIA's order, gpupart's, gpupart's with defragmentation, the
/// capacity-only bound, free migration.
fn runs(model: &str, seed: u64, load: f64, wscale: f64) -> [Tally; 5] {
    let (asks, events) = trace_mix(seed, load, wscale);
    [
        replay(model, &asks, &events, Policy::Nvidia),
        replay(model, &asks, &events, Policy::Gpupart),
        replay(model, &asks, &events, Policy::Defrag),
        bound(&asks, &events),
        move_all(model, &asks, &events),
    ]
}

fn main() {
    // `cargo bench --bench dra -- traces`: the trace tables only.
    // `cargo bench --bench dra -- mps`: the MPS share latencies only.
    if std::env::args().any(|a| a == "mps") {
        for model in ["T4-16GB", "V100-SXM2-16GB"] {
            mps_latencies_through_the_binary(model);
        }
        return;
    }
    if !std::env::args().any(|a| a == "traces") {
        println!("MPS shares through the binary on one GPU without MIG (10 rounds of four 1 GiB shares, the fake MPS control program):");
        for model in ["T4-16GB", "V100-SXM2-16GB"] {
            mps_latencies_through_the_binary(model);
        }
        println!();
        println!("Latency through the binary on one node of {GPUS} GPUs (40 one-instance claims, the fake libnvidia-ml, gRPC from the fake kubelet):");
        for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"] {
            latencies_through_the_binary(model, 50);
        }
        println!();
        println!("The same in process (the node driver on the simulator; publication = order + slices of the node):");
        for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"] {
            latencies(model, Duration::from_millis(50));
        }
        println!();
    }
    println!("{TRACES} traces of {CLAIMS} claims per row on one node of {GPUS} GPUs; load = offered memory slices / capacity;");
    println!("whole = weight of whole-GPU claims relative to the default mix; 'with capacity' = refused although");
    println!(
        "a GPU had the slices (MIG) or the node's free slices added up to the GPUs asked (whole), MIG ones in ();"
    );
    println!("'move-all' may move every instance at every arrival, which no order can: a comparator, not a policy");
    println!(
        "{:<16} {:>5} {:>5} {:<9} {:>8} {:>8} {:>14} {:>6} {:>14} {:>13} {:>8} {:>10} {:>13}",
        "model",
        "whole",
        "load",
        "order",
        "refused",
        "(% all)",
        "with capacity",
        "(MIG)",
        "whole refused",
        "mean largest",
        "created",
        "destroyed",
        "writes/alloc"
    );
    // Per model, summed over its rows: refused with capacity (nvidia, gpupart, defrag, move-all).
    let mut totals: Vec<(&str, [usize; 4], Tally)> = Vec::new();
    // `GPUPART_BENCH_MODEL=A100`: that model's rows only.
    let only = std::env::var("GPUPART_BENCH_MODEL").unwrap_or_default();
    for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"].into_iter().filter(|m| m.starts_with(&only)) {
        let mut total = ([0usize; 4], Tally::default());
        for wscale in [1.0, 0.3] {
            for load in [0.8, 1.0] {
                let per_trace: Vec<[Tally; 5]> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..TRACES)
                        .map(|i| s.spawn(move || runs(model, 0x5EED_D1A5 + i * 7919, load, wscale)))
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("a trace's runs")).collect()
                });
                let mut sum = [Tally::default(); 5];
                for r in per_trace {
                    for (acc, t) in sum.iter_mut().zip(r) {
                        *acc += t;
                    }
                }
                for (name, t) in ["nvidia", "gpupart", "defrag", "capacity", "move-all"].iter().zip(&sum) {
                    let largest =
                        if t.largest_samples > 0 { t.largest_sum / t.largest_samples as f64 } else { f64::NAN };
                    println!(
                        "{:<16} {:>5.1} {:>5.1} {:<9} {:>8} {:>7.1}% {:>14} {:>6} {:>14} {:>13.2} {:>8} {:>10} {:>13}",
                        model,
                        wscale,
                        load,
                        name,
                        t.refused,
                        100.0 * t.refused as f64 / t.claims as f64,
                        t.refused_with_capacity,
                        format!("({})", t.mig_refused_with_capacity),
                        format!("{}/{}", t.whole_refused, t.whole_claims),
                        largest,
                        t.created,
                        t.destroyed,
                        if t.allocated > 0 && t.writes > 0 {
                            format!("{:.2}", t.writes as f64 / t.allocated as f64)
                        } else {
                            "-".to_string()
                        }
                    );
                }
                let ratio = |t: &Tally| t.refused_with_capacity as f64 / sum[0].refused_with_capacity.max(1) as f64;
                println!(
                    "{:<16} {:>5.1} {:>5.1} refused with capacity / nvidia's: gpupart {:.2}, defrag {:.2}, move-all {:.2}; refused beyond the capacity bound: nvidia {:+}, gpupart {:+}, defrag {:+}",
                    model,
                    wscale,
                    load,
                    ratio(&sum[1]),
                    ratio(&sum[2]),
                    ratio(&sum[4]),
                    sum[0].refused as i64 - sum[3].refused as i64,
                    sum[1].refused as i64 - sum[3].refused as i64,
                    sum[2].refused as i64 - sum[3].refused as i64,
                );
                print_moves(model, wscale, load, &sum[2]);
                for (i, k) in [0, 1, 2, 4].into_iter().enumerate() {
                    total.0[i] += sum[k].refused_with_capacity;
                }
                total.1 += sum[2];
            }
        }
        totals.push((model, total.0, total.1));
    }
    println!();
    println!("Summed over each model's four rows: refused with capacity, and as a share of NVIDIA's order:");
    for (model, r, d) in &totals {
        let share = |x: usize| x as f64 / r[0].max(1) as f64;
        println!(
            "{model:<16} nvidia {}  gpupart {} ({:.2})  defrag {} ({:.2})  move-all {} ({:.2})",
            r[0],
            r[1],
            share(r[1]),
            r[2],
            share(r[2]),
            r[3],
            share(r[3])
        );
        print_moves(model, f64::NAN, f64::NAN, d);
    }
}

/// The moves defragmentation made in `t`: evictions per claim, the restart time they cost
/// against the time claims held devices, claims served by a plan, replacements refused.
fn print_moves(model: &str, wscale: f64, load: f64, t: &Tally) {
    println!(
        "{:<16} {:>5.1} {:>5.1} defrag moves: {} evictions for {} claims ({:.3} per claim), {} claims served by a plan, restart time {:.1} = {:.2}% of the time claims held devices, {} replacements refused",
        model,
        wscale,
        load,
        t.evictions,
        t.claims,
        t.evictions as f64 / t.claims.max(1) as f64,
        t.served_by_plan,
        t.restart_time,
        100.0 * t.restart_time / t.held_time.max(f64::MIN_POSITIVE),
        t.replacements_refused,
    );
}
