//! `gpupart controller` in simulation: a 48-hour demand trace (diurnal small-model traffic whose
//! profile mix shifts between day and night, plus tensor-parallel jobs of 8 whole GPUs) replayed
//! minute by minute over 16 nodes of 8 H100-SXM5-80GB, with three policies:
//!
//! - **static**: 12 shared nodes in one fixed mix (`3g.40gb + 2g.20gb + 2 × 1g.10gb` per GPU) and
//!   4 dedicated nodes, never changed;
//! - **nos-style**: the same start; every minute every node with a better layout for the pending
//!   pods is repartitioned at once, with no cool-down, and a changed GPU is rebuilt: every idle
//!   instance on it is torn down and the new geometry created (busy ones stay), as nos's MIG
//!   partitioner applies a new geometry; the dedicated nodes stay as they are;
//! - **controller**: the same start (the 4 dedicated nodes as the controller would have made
//!   them); every minute the real decision (`gpupart::controller::decide`) with the defaults
//!   (2 nodes at once, 1 min cool-down, reclaim after 30 min), each decision applied as the agent
//!   applies it (the node planner's minimal diff) through the real node patch; also with a
//!   4 h reclaim time, and with `--reserve-for-dedicated`.
//!
//! A node that changes takes 2 minutes (3 with a MIG mode change) before pods bind to it.
//! The scheduler binds pending pods first fit, oldest first, every minute.
//!
//! First, one batch decision at 1,000 to 10,000 nodes with 500 and 5,000 pending pods: the first
//! batch with no memory (a new leader), then p50/p99 of the next ones with the memory of the batch
//! before, and the RSS. Run: `cargo bench --bench controller` (`GPUPART_BENCH_SCALE_ONLY=1` for that table alone,
//! `GPUPART_BENCH_NODES=1000` for its rows of that many nodes).

use gpupart::controller::decide::{decide, decide_with, idle_clocks, Decision, Kind, Options, World};
use gpupart::controller::layouts::generate;
use gpupart::controller::memo::Memo;
use gpupart::controller::nodes::{GpuNode, RECLAIM_LAYOUT};
use gpupart::controller::patch::node_patch;
use gpupart::controller::pods::{GpuPod, Resource, Standing, DEDICATED_TAINT_KEY};
use gpupart::defrag::movable::{MoveRules, Owner};
use gpupart::fleet::current::{CurrentGpu, CurrentInstance};
use gpupart::fleet::report::{GpuSpec, LAYOUT_LABEL, POOL_LABEL};
use gpupart::kube::keys::{STATE_LABEL, STATE_LAYOUT};
use gpupart::layout::DesiredDevices;
use gpupart::mig::catalog::{self, Model};
use gpupart::mig::{ProfileName, ProfileTable};
use gpupart::observed::{GiState, Process};
use gpupart::pools::Pools;
use std::collections::BTreeMap;
use std::time::Instant;

const MODEL: &str = "H100-SXM5-80GB";
const NODES: usize = 16;
const GPUS: usize = 8;
const DEDICATED: usize = 4;
const MINUTES: u32 = 48 * 60;
const STATIC_LAYOUT: &str = "balanced";

/// splitmix64: a fixed, dependency-free stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A pod of the trace.
#[derive(Clone)]
struct TracePod {
    arrive: u32,
    life: u32,
    resource: Resource,
    count: u32,
    tp: bool,
    /// The replacement of a pod moved by `--defrag` (its wait is the move's cost, not demand).
    moved: bool,
}

fn trace(peak: f64) -> Vec<TracePod> {
    let mut rng = Rng(42);
    let mut out = Vec::new();
    let p = |s: &str| Resource::Mig(s.parse::<ProfileName>().expect("profile"));
    for t in 0..MINUTES {
        let day = (f64::from(t) / 1440.0 * std::f64::consts::TAU - std::f64::consts::FRAC_PI_2).sin();
        // `peak` arrivals a minute at mid-day, a fifth of it at night.
        let rate = peak * (0.6 + 0.4 * day);
        let n = rate.floor() as u32 + u32::from(rng.next() < rate.fract());
        for _ in 0..n {
            // Day: more small chat models (1g.10gb); night: more 3g.40gb batch models.
            let (p1, p2) = (0.5 + 0.2 * day, 0.3);
            let u = rng.next();
            let r = if u < p1 {
                p("1g.10gb")
            } else if u < p1 + p2 {
                p("2g.20gb")
            } else {
                p("3g.40gb")
            };
            out.push(TracePod {
                arrive: t,
                life: 30 + (rng.next() * 120.0) as u32,
                resource: r,
                count: 1,
                tp: false,
                moved: false,
            });
        }
    }
    // Tensor-parallel jobs: one every 4 hours, two at once twice, 3 hours each.
    let mut jobs: Vec<u32> = (0..12).map(|k| 60 + k * 240).collect();
    jobs.extend([13 * 60, 37 * 60, 20 * 60 + 30, 44 * 60 + 30]);
    for t in jobs {
        out.push(TracePod { arrive: t, life: 180, resource: Resource::Gpu, count: 8, tp: true, moved: false });
    }
    out.sort_by_key(|p| p.arrive);
    out
}

#[derive(Clone)]
struct SimInstance {
    profile: ProfileName,
    start: u32,
    pod: Option<usize>,
}

#[derive(Clone)]
struct SimGpu {
    mig: bool,
    instances: Vec<SimInstance>,
    whole: Option<usize>,
}

struct SimNode {
    meta: GpuNode,
    gpus: Vec<SimGpu>,
    ready_at: u32,
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Static,
    Nos,
    Controller,
}

struct Sim {
    model: &'static Model,
    table: ProfileTable,
    nodes: Vec<SimNode>,
    layouts: BTreeMap<String, Vec<GpuSpec>>,
    pods: Vec<TracePod>,
    bound: Vec<Option<(usize, u32)>>,
    ended: Vec<bool>,
    destroyed: u64,
    destroyed_for_pools: u64,
    changes: u64,
    idle_since: BTreeMap<String, i64>,
    evictions: u64,
}

fn mixed() -> GpuSpec {
    GpuSpec::Mig(vec![("1g.10gb".into(), 2), ("2g.20gb".into(), 1), ("3g.40gb".into(), 1)])
}

impl Sim {
    fn new(pods: Vec<TracePod>) -> Self {
        let model = catalog::lookup(MODEL).expect("model");
        let table = model.profile_table();
        let mut layouts = BTreeMap::from([(STATIC_LAYOUT.to_string(), vec![mixed(); GPUS])]);
        let off = generate(model, &vec![GpuSpec::Off; GPUS]).expect("layout");
        layouts.insert(off.name.clone(), vec![GpuSpec::Off; GPUS]);
        let n = pods.len();
        let mut sim = Sim {
            model,
            table,
            nodes: Vec::new(),
            layouts,
            pods,
            bound: vec![None; n],
            ended: vec![false; n],
            destroyed: 0,
            destroyed_for_pools: 0,
            changes: 0,
            idle_since: BTreeMap::new(),
            evictions: 0,
        };
        for i in 0..NODES {
            let dedicated = i >= NODES - DEDICATED;
            let layout = if dedicated { off.name.clone() } else { STATIC_LAYOUT.to_string() };
            let mut meta = GpuNode {
                name: format!("gpu-{i:02}"),
                labels: BTreeMap::from([(LAYOUT_LABEL.to_string(), layout.clone())]),
                annotations: BTreeMap::new(),
                taints: Vec::new(),
                gpus: Vec::new(),
                resource_version: Some("1".into()),
                cordoned: false,
                room: Default::default(),
            };
            if dedicated {
                meta.labels.insert(POOL_LABEL.into(), "dedicated".into());
                meta.annotations.insert(RECLAIM_LAYOUT.into(), STATIC_LAYOUT.into());
                meta.taints = serde_json::from_value(
                    serde_json::json!([{"key": DEDICATED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]),
                )
                .expect("taint");
            }
            let gpus = vec![SimGpu { mig: false, instances: Vec::new(), whole: None }; GPUS];
            sim.nodes.push(SimNode { meta, gpus, ready_at: 0 });
            let specs = sim.layouts[&layout].clone();
            for (g, s) in specs.iter().enumerate() {
                sim.apply_gpu(i, g, s, false);
            }
        }
        sim.destroyed = 0;
        sim
    }

    fn slices(&self, p: &ProfileName) -> u32 {
        self.table.profiles.iter().find(|x| &x.name == p).map_or(0, |x| x.slices)
    }

    /// Applies a spec to one GPU: the node planner's diff, or (`rebuild`) every idle instance
    /// torn down first. Returns whether the GPU's MIG mode changed.
    fn apply_gpu(&mut self, n: usize, g: usize, spec: &GpuSpec, rebuild: bool) -> bool {
        let gpu = &mut self.nodes[n].gpus[g];
        match spec {
            GpuSpec::Off => {
                let was = gpu.mig;
                if gpu.instances.iter().any(|i| i.pod.is_some()) {
                    return false;
                }
                self.destroyed += gpu.instances.len() as u64;
                gpu.instances.clear();
                gpu.mig = false;
                was
            }
            GpuSpec::Mps { .. } => false,
            GpuSpec::Mig(devs) => {
                let was = gpu.mig;
                if !gpu.mig && gpu.whole.is_some() {
                    return false;
                }
                gpu.mig = true;
                if rebuild {
                    let idle = gpu.instances.iter().filter(|i| i.pod.is_none()).count();
                    self.destroyed += idle as u64;
                    gpu.instances.retain(|i| i.pod.is_some());
                }
                let states: Vec<GiState> = gpu
                    .instances
                    .iter()
                    .enumerate()
                    .filter_map(|(k, i)| {
                        let p = self.table.profiles.iter().find(|p| p.name == i.profile)?;
                        let pl = p.placements.iter().copied().find(|pl| pl.start == i.start)?;
                        let mut s = GiState::with_full_ci(&self.table, k as u32 + 1, p.id, pl)?;
                        if i.pod.is_some() {
                            s.processes.push(Process { pid: 1, name: "pod".into(), used_memory_mib: 1 });
                        }
                        Some(s)
                    })
                    .collect();
                let devices: Vec<(ProfileName, u32)> =
                    devs.iter().filter_map(|(p, c)| Some((p.parse().ok()?, *c))).collect();
                let Ok(desired) = DesiredDevices::resolve(&self.table, &devices) else { return false };
                let Ok(plan) = gpupart::plan::plan(&self.table, &states, &desired, false) else { return false };
                let old = std::mem::take(&mut gpu.instances);
                let by_id = |id: u32| old.get(id as usize - 1).cloned();
                let mut next: Vec<SimInstance> = Vec::new();
                next.extend(plan.keep.iter().filter_map(|k| by_id(k.gi_id)));
                next.extend(plan.reshape.iter().filter_map(|k| by_id(k.gi_id)));
                for c in &plan.create {
                    if let Ok(p) = c.name.parse() {
                        next.push(SimInstance { profile: p, start: c.placement.start, pod: None });
                    }
                }
                self.destroyed += plan.destroy.len() as u64;
                gpu.instances = next;
                was != gpu.mig
            }
        }
    }

    fn current(&self, n: usize) -> Vec<CurrentGpu> {
        self.nodes[n]
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| CurrentGpu {
                index: i as u32,
                model: MODEL.into(),
                mig: g.mig,
                instances: g
                    .instances
                    .iter()
                    .map(|x| CurrentInstance {
                        profile: x.profile.clone(),
                        start: x.start,
                        busy: x.pod.is_some(),
                        foreign: false,
                    })
                    .collect(),
                busy: g.whole.is_some(),
                mps_slots: None,
                unhealthy: None,
            })
            .collect()
    }

    /// The nodes as the controller reads them at minute `t`.
    fn world_nodes(&self, t: u32) -> Vec<GpuNode> {
        (0..self.nodes.len())
            .map(|n| {
                let mut m = self.nodes[n].meta.clone();
                m.gpus = self.current(n);
                let layout = m.layout().unwrap_or("").to_string();
                let state = if t >= self.nodes[n].ready_at { "success" } else { "pending" };
                m.labels.insert(STATE_LABEL.into(), state.into());
                m.annotations.insert(STATE_LAYOUT.into(), layout);
                m
            })
            .collect()
    }

    fn world_pods(&self, t: u32, skip_tp: bool, defrag: bool) -> Vec<GpuPod> {
        let mut out = Vec::new();
        for (i, p) in self.pods.iter().enumerate() {
            if p.arrive > t || self.ended[i] || (skip_tp && p.tp && self.bound[i].is_none()) {
                continue;
            }
            let standing = match self.bound[i] {
                Some((n, _)) => Standing::Bound { node: self.nodes[n].meta.name.clone() },
                None => Standing::Unschedulable { since: Some(i64::from(p.arrive) * 60) },
            };
            out.push(GpuPod {
                key: format!("trace/p{i}"),
                namespace: "trace".into(),
                name: format!("p{i}"),
                uid: String::new(),
                resource: p.resource.clone(),
                count: p.count,
                standing,
                dedicated: p.tp,
                also: Vec::new(),
                unserved: None,
                constraints: Default::default(),
                scheduler_message: None,
                priority: 0,
                created: Some(i64::from(p.arrive) * 60),
                // With `--defrag`, every small model is a Deployment's replica that opted in.
                owner: (defrag && !p.tp).then(|| Owner { kind: "ReplicaSet".into(), name: format!("model-{i}") }),
                movable: (defrag && !p.tp).then(|| "true".to_string()),
            });
        }
        out
    }

    /// Evicts pod `i` at minute `t`: its device is free at once; its replacement (the rest of its
    /// life) asks for the same resource a restart later.
    fn evict(&mut self, i: usize, t: u32) {
        let Some((_, at)) = self.bound[i] else { return };
        self.free_devices(i);
        self.ended[i] = true;
        let p = &self.pods[i];
        let left = (at + p.life).saturating_sub(t).max(1);
        self.pods.push(TracePod { arrive: t + RESTART, life: left, moved: true, ..p.clone() });
        self.bound.push(None);
        self.ended.push(false);
        self.evictions += 1;
    }

    fn free_devices(&mut self, i: usize) {
        let Some((n, _)) = self.bound[i] else { return };
        for g in &mut self.nodes[n].gpus {
            if g.whole == Some(i) {
                g.whole = None;
            }
            for x in &mut g.instances {
                if x.pod == Some(i) {
                    x.pod = None;
                }
            }
        }
    }

    fn end_pods(&mut self, t: u32) {
        for i in 0..self.pods.len() {
            let Some((_, at)) = self.bound[i] else { continue };
            if self.ended[i] || at + self.pods[i].life > t {
                continue;
            }
            self.ended[i] = true;
            self.free_devices(i);
        }
    }

    fn bind(&mut self, t: u32) {
        for i in 0..self.pods.len() {
            let p = &self.pods[i];
            if p.arrive > t || self.bound[i].is_some() {
                continue;
            }
            let (tp, resource) = (p.tp, p.resource.clone());
            for n in 0..self.nodes.len() {
                let node = &mut self.nodes[n];
                if t < node.ready_at || node.meta.is_dedicated(&Pools::default()) != tp {
                    continue;
                }
                if tp {
                    if node.gpus.iter().all(|g| !g.mig && g.whole.is_none()) {
                        node.gpus.iter_mut().for_each(|g| g.whole = Some(i));
                        self.bound[i] = Some((n, t));
                        break;
                    }
                    continue;
                }
                let Resource::Mig(want) = &resource else { continue };
                let slot = node
                    .gpus
                    .iter_mut()
                    .flat_map(|g| g.instances.iter_mut())
                    .find(|x| x.pod.is_none() && &x.profile == want);
                if let Some(x) = slot {
                    x.pod = Some(i);
                    self.bound[i] = Some((n, t));
                    break;
                }
            }
        }
    }

    fn apply(&mut self, d: &Decision, t: u32, rebuild: bool) {
        let Some(n) = self.nodes.iter().position(|x| x.meta.name == d.node) else { return };
        let (layout, specs) = match d.kind {
            Kind::Reclaim => {
                let name = d.restore.clone().unwrap_or_else(|| STATIC_LAYOUT.into());
                let specs = self.layouts.get(&name).cloned().unwrap_or_else(|| vec![mixed(); GPUS]);
                (name, specs)
            }
            _ => match generate(self.model, &d.specs) {
                Ok(g) => (g.name, d.specs.clone()),
                Err(_) => return,
            },
        };
        self.layouts.insert(layout.clone(), specs.clone());
        let patch = node_patch(&self.nodes[n].meta, d, Some(&layout), i64::from(t) * 60, &Pools::default());
        merge_into(&mut self.nodes[n].meta, &patch);
        let mut mode_change = false;
        let before = self.destroyed;
        for (g, s) in specs.iter().enumerate() {
            mode_change |= self.apply_gpu(n, g, s, rebuild);
        }
        if d.kind != Kind::Repartition {
            self.destroyed_for_pools += self.destroyed - before;
        }
        self.nodes[n].ready_at = t + if mode_change { 3 } else { 2 };
        self.changes += 1;
    }

    /// Busy GPU-equivalents (compute slices / 7).
    fn busy_gpus(&self) -> f64 {
        let mut slices = 0u32;
        for n in &self.nodes {
            for g in &n.gpus {
                if g.whole.is_some() {
                    slices += 7;
                }
                slices += g.instances.iter().filter(|x| x.pod.is_some()).map(|x| self.slices(&x.profile)).sum::<u32>();
            }
        }
        f64::from(slices) / 7.0
    }
}

/// Applies the node patch's labels, annotations and taints (a JSON merge patch) to the node.
fn merge_into(node: &mut GpuNode, patch: &serde_json::Value) {
    for (key, map) in [("labels", &mut node.labels), ("annotations", &mut node.annotations)] {
        for (k, v) in patch["metadata"][key].as_object().into_iter().flatten() {
            match v.as_str() {
                Some(s) => {
                    map.insert(k.clone(), s.to_string());
                }
                None => {
                    map.remove(k);
                }
            }
        }
    }
    if let Some(t) = patch.get("spec").and_then(|s| s.get("taints")) {
        node.taints = serde_json::from_value(t.clone()).unwrap_or_default();
    }
}

struct Figures {
    utilisation: f64,
    peak: f64,
    served: usize,
    mean_wait: f64,
    p95_wait: f64,
    tp_wait: f64,
    unserved: usize,
    destroyed: u64,
    destroyed_for_pools: u64,
    changes: u64,
    decide_ms: f64,
    evictions: u64,
    moved_wait: f64,
}

/// How a run is set up: its policy and the controller's flags.
#[derive(Clone, Copy)]
struct Setup {
    policy: Policy,
    reclaim_after_secs: i64,
    reserve_for_dedicated: bool,
    defrag: bool,
}

/// Minutes a moved pod's replacement takes to start (scheduling, image, model load).
const RESTART: u32 = 2;
/// `--defrag-max-evictions`, `--defrag-max-evictions-per-node`: the controller's defaults.
const MAX_EVICTIONS: usize = 10;
const MAX_EVICTIONS_PER_NODE: usize = 4;

fn run(setup: Setup, pods: &[TracePod]) -> Figures {
    let Setup { policy, reclaim_after_secs, reserve_for_dedicated, defrag } = setup;
    let mut evicted_at: Vec<(u32, String)> = Vec::new();
    let mut sim = Sim::new(pods.to_vec());
    let (mut busy_sum, mut peak, mut decide_ms) = (0.0, 0.0f64, 0.0);
    let total = (NODES * GPUS) as f64;
    // The controller keeps its memory from batch to batch; the other policies use none.
    let mut memo = Memo::new();
    for t in 0..MINUTES {
        sim.end_pods(t);
        sim.bind(t);
        if policy != Policy::Static {
            let nodes = sim.world_nodes(t);
            let pods = sim.world_pods(t, policy == Policy::Nos, defrag);
            let opts = match policy {
                Policy::Nos => Options {
                    max_concurrent_nodes: NODES,
                    cooldown_secs: 0,
                    reclaim_after_secs: i64::MAX,
                    mps_replicas: 4,
                    reserve_for_dedicated: false,
                    pools: Pools::default(),
                    defrag: None,
                    room_secs: 600,
                },
                _ => Options {
                    reclaim_after_secs,
                    reserve_for_dedicated,
                    defrag: defrag.then(MoveRules::default),
                    ..Options::default()
                },
            };
            if policy == Policy::Controller {
                idle_clocks(&mut sim.idle_since, &nodes, &pods, i64::from(t) * 60, &Pools::default());
            }
            let idle = sim.idle_since.clone();
            let started = Instant::now();
            let out = decide_with(
                &World { nodes: &nodes, pods: &pods, config: None, now: i64::from(t) * 60, idle_since: &idle },
                &opts,
                &mut memo,
            );
            decide_ms += started.elapsed().as_secs_f64() * 1000.0;
            for d in &out.decisions {
                if policy == Policy::Nos && d.kind != Kind::Repartition {
                    continue;
                }
                sim.apply(d, t, policy == Policy::Nos);
            }
            // The moves that empty reserved nodes, within the hourly caps.
            evicted_at.retain(|(at, _)| at + 60 > t);
            for drain in &out.drains {
                for (pod, _) in drain.moves.iter().flatten() {
                    let here = evicted_at.iter().filter(|(_, n)| *n == drain.node).count();
                    if evicted_at.len() >= MAX_EVICTIONS || here >= MAX_EVICTIONS_PER_NODE {
                        break;
                    }
                    let Some(i) = pod.strip_prefix("trace/p").and_then(|i| i.parse::<usize>().ok()) else { continue };
                    sim.evict(i, t);
                    evicted_at.push((t, drain.node.clone()));
                }
            }
        }
        let b = sim.busy_gpus();
        busy_sum += b;
        peak = peak.max(b / total);
    }
    let mut waits: Vec<u32> = Vec::new();
    let mut tp_waits: Vec<u32> = Vec::new();
    let mut moved_waits: Vec<u32> = Vec::new();
    let mut unserved = 0;
    for (i, p) in sim.pods.iter().enumerate() {
        match sim.bound[i] {
            Some((_, at)) if p.moved => moved_waits.push(at - p.arrive + RESTART),
            None if p.moved => {}
            Some((_, at)) if p.tp => tp_waits.push(at - p.arrive),
            Some((_, at)) => waits.push(at - p.arrive),
            None => unserved += 1,
        }
    }
    waits.sort_unstable();
    let mean =
        |v: &[u32]| if v.is_empty() { 0.0 } else { v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64 };
    Figures {
        utilisation: busy_sum / f64::from(MINUTES) / total,
        peak,
        served: waits.len() + tp_waits.len(),
        mean_wait: mean(&waits),
        p95_wait: waits.get(waits.len() * 95 / 100).map_or(0.0, |w| f64::from(*w)),
        tp_wait: mean(&tp_waits),
        unserved,
        destroyed: sim.destroyed,
        destroyed_for_pools: sim.destroyed_for_pools,
        changes: sim.changes,
        decide_ms,
        evictions: sim.evictions,
        moved_wait: mean(&moved_waits),
    }
}

fn main() {
    scale();
    if std::env::var_os("GPUPART_BENCH_SCALE_ONLY").is_some() {
        return;
    }
    println!("\n## Controller simulation: 48 h, {NODES} nodes × {GPUS} {MODEL}");
    for (load, peak) in [("moderate", 3.9), ("heavy", 6.0)] {
        let pods = trace(peak);
        let small = pods.iter().filter(|p| !p.tp).count();
        println!(
            "\n### {load} load: {small} small-model pods (1g.10gb / 2g.20gb / 3g.40gb, diurnal, peak {peak}/min, \
             mix shifting day to night, 30–150 min each), {} tensor-parallel jobs (8 whole GPUs, 3 h each)\n",
            pods.len() - small
        );
        println!("| policy | GPU utilisation (mean) | peak | pods served | not served by the end | small pods: mean pending min | p95 | TP jobs: mean pending min | instances destroyed | of which for dedicate/reclaim | node changes | evictions (moved pods: mean min to run again) | decision time s |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let setup = |policy, reclaim_after_secs, reserve_for_dedicated, defrag| Setup {
            policy,
            reclaim_after_secs,
            reserve_for_dedicated,
            defrag,
        };
        let rows = [
            ("static layouts", setup(Policy::Static, 0, false, false)),
            ("nos-style full repartitioning", setup(Policy::Nos, 0, false, false)),
            ("gpupart controller (defaults, --reclaim-after 30m)", setup(Policy::Controller, 1800, false, false)),
            ("gpupart controller --reclaim-after 4h", setup(Policy::Controller, 4 * 3600, false, false)),
            ("gpupart controller --reserve-for-dedicated", setup(Policy::Controller, 1800, true, false)),
            ("gpupart controller --defrag (small models movable)", setup(Policy::Controller, 1800, false, true)),
            ("gpupart controller --defrag --reserve-for-dedicated", setup(Policy::Controller, 1800, true, true)),
        ];
        for (name, s) in rows {
            let f = run(s, &pods);
            println!(
                "| {name} | {:.1} % | {:.1} % | {} | {} | {:.1} | {:.0} | {:.1} | {} | {} | {} | {} ({:.1}) | {:.2} |",
                f.utilisation * 100.0,
                f.peak * 100.0,
                f.served,
                f.unserved,
                f.mean_wait,
                f.p95_wait,
                f.tp_wait,
                f.destroyed,
                f.destroyed_for_pools,
                f.changes,
                f.evictions,
                f.moved_wait,
                f.decide_ms / 1000.0
            );
        }
    }
}

/// How the nodes of a scale row differ.
#[derive(Clone, Copy, PartialEq)]
enum Variety {
    /// All alike: 8 idle A100-80GB at `all-3g.40gb`.
    Alike,
    /// Each with an allocatable CPU of its own (what decides where pods land differs).
    OwnCpu,
    /// Each with its own GPUs: which of its 16 instances are in use follows the node's number.
    OwnGpus,
}

/// A node as its agent publishes it: 8 A100-80GB at `all-3g.40gb`, differing as `variety` says.
fn scale_node(k: usize, variety: Variety) -> GpuNode {
    let busy = |bit: usize| variety == Variety::OwnGpus && (k >> bit) & 1 == 1;
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let layout: Vec<String> = [0, 4]
                .iter()
                .enumerate()
                .map(|(j, s)| format!("3g.40gb@{s}{}", if busy(2 * i + j) { "*" } else { "" }))
                .collect();
            serde_json::json!({"i": i, "uuid": format!("GPU-{k}-{i}"), "model": "A100-SXM4-80GB", "mode": "mig",
                "layout": layout, "creatable": {}, "largest": "none", "frag": 0.0})
        })
        .collect();
    let cpu = match variety {
        Variety::OwnCpu => serde_json::json!({"cpu": format!("{}m", 64_000 + k)}),
        _ => serde_json::json!({}),
    };
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("gpu-{k:05}"),
            "labels": {LAYOUT_LABEL: "all-3g.40gb", STATE_LABEL: "success"},
            "annotations": {"gpupart.io/gpus": serde_json::to_string(&gpus).unwrap(), STATE_LAYOUT: "all-3g.40gb",
                "gpupart.io/fragmentation": r#"{"ratio":0,"fragmentedGpus":0,"unallocatedGpus":0,"wholeFreeGpus":0}"#}},
        "spec": {},
        "status": {"allocatable": cpu}
    }))
    .expect("a Node");
    GpuNode::read(&node).expect("the annotation parses").expect("a GPU node")
}

/// A pending pod asking one `nvidia.com/mig-1g.10gb`, unschedulable.
fn scale_pod(k: usize) -> GpuPod {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "serving", "name": format!("small-{k:05}"), "uid": format!("uid-{k}")},
        "spec": {"containers": [{"name": "s", "image": "vllm", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    }))
    .expect("a Pod");
    gpupart::controller::pods::read(&pod, "gpupart.io/mps").expect("readable").expect("a GPU pod")
}

/// Resident set size now and at its peak, MiB (`/proc/self/status`).
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
    };
    (kib("VmRSS:").unwrap_or(0.0) / 1024.0, kib("VmHWM:").unwrap_or(0.0) / 1024.0)
}

/// One batch decision at thousands of nodes: p50 and p99 over repeated batches, and the RSS.
fn scale() {
    let config = gpupart::config::parse(
        "version: v1\nmig-configs:\n  all-3g.40gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 2}\n",
    )
    .expect("config");
    println!("\n## Controller batch decision at scale (release build; 8 × A100-80GB per node at all-3g.40gb, idle; pending nvidia.com/mig-1g.10gb pods)\n");
    println!("| nodes | pending pods | first batch ms | batches | next batches p50 ms | p99 ms | decisions | RSS MiB (peak) |");
    println!("|---|---|---|---|---|---|---|---|");
    use Variety::*;
    let rows = [(1000usize, 500usize, Alike), (1000, 5000, Alike), (5000, 500, Alike), (5000, 5000, Alike)];
    let rows = rows.into_iter().chain([(10_000, 500, Alike), (10_000, 5000, Alike)]);
    let rows = rows.chain([(1000, 500, OwnCpu), (5000, 500, OwnCpu), (1000, 500, OwnGpus), (5000, 500, OwnGpus)]);
    // `GPUPART_BENCH_NODES=1000`: only the rows of that many nodes (to profile one size).
    let only: Option<usize> = std::env::var("GPUPART_BENCH_NODES").ok().and_then(|v| v.parse().ok());
    for (nodes, pods, variety) in rows.filter(|(n, _, _)| only.is_none_or(|o| *n == o)) {
        let ns: Vec<GpuNode> = (0..nodes).map(|k| scale_node(k, variety)).collect();
        let ps: Vec<GpuPod> = (0..pods).map(scale_pod).collect();
        let idle = BTreeMap::new();
        let world = World { nodes: &ns, pods: &ps, config: Some(&config), now: 1_000_000, idle_since: &idle };
        let opts = Options::default();
        let runs = if nodes * pods >= 5_000_000 { 5 } else { 11 };
        // The first batch starts with no memory (a new leader); the next ones have the
        // controller's memory of the batch before (nothing changed between them).
        let t = Instant::now();
        let first = decide(&world, &opts);
        let first_ms = t.elapsed().as_secs_f64() * 1000.0;
        let mut memo = Memo::new();
        let warm = decide_with(&world, &opts, &mut memo);
        assert_eq!(format!("{:?}", warm.decisions), format!("{:?}", first.decisions), "memory changed a decision");
        let mut ms = Vec::new();
        let mut decided = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let out = decide_with(&world, &opts, &mut memo);
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            decided = out.decisions.len();
        }
        ms.sort_by(f64::total_cmp);
        let (rss, peak) = rss_mib();
        println!(
            "| {nodes}{} | {pods} | {first_ms:.0} | {runs} | {:.0} | {:.0} | {decided} | {rss:.0} ({peak:.0}) |",
            match variety {
                Alike => "",
                OwnCpu => ", each its own CPU room",
                OwnGpus => ", each its own GPUs in use",
            },
            ms[runs / 2],
            ms[(runs - 1) * 99 / 100]
        );
    }
}
