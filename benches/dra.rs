//! Publication order under a claim trace (`cargo bench --bench dra`): one node of 8 GPUs, MIG
//! claims of mixed sizes and whole-GPU claims of 1, 2, 4 and 8 GPUs arriving as a Poisson
//! process with long-tailed (log-normal) durations, allocated by the scheduler stand-in
//! (tests/support/allocator.rs) from three publication orders: NVIDIA's (GPU, profile, placement
//! ascending, never reordered), gpupart's (republished after every change), and the
//! capacity-only bound (a claim refused only when the free memory slices cannot hold it at all).
//! Prints a table per model, load and mix: the default mix, and one with a third of the whole-GPU
//! claims (`WHOLE_SCALE` sets that factor).

#[path = "../tests/support/allocator.rs"]
mod allocator;
#[path = "../tests/support/rng.rs"]
mod rng;

use allocator::{Allocated, Allocator, Request};
use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::dra::devices::{DeviceKind, DeviceRef};
use gpupart::dra::order::{nvidia_order, order, GpuView};
use gpupart::dra::publish::{content, Catalog, PublishedGpu};
use gpupart::mig::capacity::Occupancy;
use rng::Rng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const DRIVER: &str = "gpu.gpupart.io";
const NODE: &str = "node-a";
const GPUS: u32 = 8;
const CLAIMS: usize = 4000;

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

#[derive(Debug, Default, Clone)]
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
}

/// The node as allocated: per claim its devices.
struct Node {
    gpus: Vec<PublishedGpu>,
    views: Vec<GpuView>,
    allocator: Allocator,
    held: BTreeMap<usize, (Vec<Allocated>, Vec<DeviceRef>)>,
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
        Self { gpus, views, allocator: Allocator::default(), held: BTreeMap::new() }
    }

    /// Publishes `offered` in order, then the allocated devices (their counters stay accounted),
    /// as the plugin does.
    fn publish(&mut self, offered: &[DeviceRef]) {
        let allocated: Vec<DeviceRef> = self.held.values().flat_map(|(_, d)| d.iter().copied()).collect();
        let slices = content(DRIVER, NODE, 1, &self.gpus, offered, &allocated);
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
    let pct = |v: &mut Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
    };
    println!(
        "{model:<16} {:>4} ms/change  prepare p50 {:>6.0} ms p99 {:>6.0} ms   unprepare p50 {:>6.0} ms p99 {:>6.0} ms   publication p50 {:>6.1} ms p99 {:>6.1} ms",
        delay.as_millis(),
        pct(&mut prepare, 0.5),
        pct(&mut prepare, 0.99),
        pct(&mut unprepare, 0.5),
        pct(&mut unprepare, 0.99),
        pct(&mut publish, 0.5),
        pct(&mut publish, 0.99),
    );
}

fn main() {
    println!("Latency on one node of {GPUS} GPUs (40 one-instance claims, the simulator; publication = order + slices of the node):");
    for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"] {
        latencies(model, Duration::from_millis(50));
    }
    println!();
    println!("{CLAIMS} claims per run on one node of {GPUS} GPUs; load = offered memory slices / capacity;");
    println!("whole = weight of whole-GPU claims relative to the default mix; 'with capacity' = refused although");
    println!("a GPU had the slices (MIG) or the node's free slices added up to the GPUs asked (whole), MIG ones in ()");
    println!(
        "{:<16} {:>5} {:>5} {:<9} {:>8} {:>8} {:>14} {:>6} {:>14} {:>13} {:>8} {:>10}",
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
        "destroyed"
    );
    for model in ["A100-SXM4-80GB", "H100-SXM5-80GB"] {
        for wscale in [1.0, 0.3] {
            for load in [0.8, 1.0] {
                let (asks, events) = trace_mix(0x5EED_D1A5, load, wscale);
                let runs = [
                    ("nvidia", replay(model, &asks, &events, false)),
                    ("gpupart", replay(model, &asks, &events, true)),
                    ("capacity", bound(&asks, &events)),
                ];
                for (name, t) in &runs {
                    let largest =
                        if t.largest_samples > 0 { t.largest_sum / t.largest_samples as f64 } else { f64::NAN };
                    println!(
                        "{:<16} {:>5.1} {:>5.1} {:<9} {:>8} {:>7.1}% {:>14} {:>6} {:>14} {:>13.2} {:>8} {:>10}",
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
                        t.destroyed
                    );
                }
                let ratio = runs[1].1.refused_with_capacity as f64 / runs[0].1.refused_with_capacity.max(1) as f64;
                println!(
                    "{:<16} {:>5.1} {:>5.1} gpupart / nvidia refused with capacity: {ratio:.2}",
                    model, wscale, load
                );
            }
        }
    }
}
