//! Publication order under a claim trace (`cargo bench --bench dra`): one node of 8 GPUs, MIG
//! claims of mixed sizes and whole-GPU claims of 1, 2, 4 and 8 GPUs arriving as a Poisson
//! process with long-tailed (log-normal) durations, allocated by the scheduler stand-in
//! (tests/support/allocator.rs) from NVIDIA's order (GPU, profile, placement ascending, never
//! reordered) and gpupart's (republished after every change); beside them two comparators that
//! are not orders: the capacity-only bound (a claim refused only when the free memory slices
//! cannot hold it at all) and free migration (every instance may move to another GPU or
//! placement at every arrival, which no publication order can do). Each row sums `TRACES`
//! traces of `CLAIMS` claims. Prints a table per model, load and mix: the default mix, and one
//! with a third of the whole-GPU claims.
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
        let slices = content(DRIVER, NODE, 1, &self.gpus, offered, &BTreeMap::new());
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

fn replay(model: &str, asks: &[Ask], events: &[Event], gpupart: bool) -> Tally {
    let mut node = Node::new(model);
    let mut t = Tally::default();
    if gpupart {
        node.publish_gpupart();
    } else {
        let all = nvidia_order(&node.views);
        node.publish(&all);
    }
    // The first publication is the same for every order: count what follows.
    node.writes = 0;
    for e in events {
        let ask = asks[e.claim];
        if !e.arrive {
            let d = node.drop_claim(e.claim);
            t.destroyed += d;
            if gpupart && (d > 0 || matches!(ask, Ask::Whole(_))) {
                node.publish_gpupart();
            }
            continue;
        }
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

/// Prepare and Unprepare latency through the real binary: `gpupart agent --dra` on the fake
/// libnvidia-ml with `delay_ms` per NVML change, the fake kubelet calling it over its socket and
/// the scheduler stand-in allocating from its slices; and from an allocation (the claim's status
/// written) to the publication that lists the device as taken.
fn latencies_through_the_binary(model: &str, delay_ms: u32) {
    let built = |f: &str| {
        std::env::current_exe().ok().and_then(|e| e.parent()?.parent().map(|d| d.join(f).exists())).unwrap_or(false)
    };
    let fakes = (built("libfake_nvml.so") || built("deps/libfake_nvml.so")) && built("fake-nvidia-cuda-mps-control");
    if !fakes {
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
                devices: vec![AllocatedDevice { request: "gpu".into(), pool: NODE.into(), device: name }],
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

/// The four runs of one trace: NVIDIA's order, gpupart's, the capacity-only bound, free
/// migration.
fn runs(model: &str, seed: u64, load: f64, wscale: f64) -> [Tally; 4] {
    let (asks, events) = trace_mix(seed, load, wscale);
    [
        replay(model, &asks, &events, false),
        replay(model, &asks, &events, true),
        bound(&asks, &events),
        move_all(model, &asks, &events),
    ]
}

fn main() {
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
    for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"] {
        for wscale in [1.0, 0.3] {
            for load in [0.8, 1.0] {
                let per_trace: Vec<[Tally; 4]> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..TRACES)
                        .map(|i| s.spawn(move || runs(model, 0x5EED_D1A5 + i * 7919, load, wscale)))
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("a trace's runs")).collect()
                });
                let mut sum = [Tally::default(); 4];
                for r in per_trace {
                    for (acc, t) in sum.iter_mut().zip(r) {
                        *acc += t;
                    }
                }
                for (name, t) in ["nvidia", "gpupart", "capacity", "move-all"].iter().zip(&sum) {
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
                    "{:<16} {:>5.1} {:>5.1} refused with capacity / nvidia's: gpupart {:.2}, move-all {:.2}; refused beyond the capacity bound: nvidia {:+}, gpupart {:+}",
                    model,
                    wscale,
                    load,
                    ratio(&sum[1]),
                    ratio(&sum[3]),
                    sum[0].refused as i64 - sum[2].refused as i64,
                    sum[1].refused as i64 - sum[2].refused as i64,
                );
            }
        }
    }
}
