//! The cluster planner behind `gpupart plan` (pure; docs/plan.md): from node groups and
//! inference demand to node pools, per-node layouts, labels and taints.
//!
//! input → [`choose`] (a pool per model, with its reason) → dedicated nodes → whole GPUs →
//! MIG packing per GPU model ([`configs`], [`pack`]) → MPS slots → [`assign`] (pools onto nodes)
//! → [`PlannedNode`]s, which [`report`] turns into the documented output and [`baseline`]
//! compares with first-fit.

pub mod assign;
pub mod baseline;
pub mod choose;
pub use gpupart_node::plan::configs;
pub mod current;
pub mod input;
pub mod layout;
pub mod pack;
pub mod render;
pub mod report;

use crate::mig::catalog::Model;
use crate::mig::Placement;
use choose::{Choice, Pool, Target};
use gpupart_node::frag::Workload;
use input::Input;
use std::collections::BTreeMap;

/// A replica: (demand index, replica number).
pub type Replica = (usize, u32);

/// GPU instances of one GPU: (profile id, placement).
pub type Instances = Vec<(u32, Placement)>;

/// What one GPU of a plan holds.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuUse {
    /// Nothing.
    Idle,
    /// One of the GPUs of a tensor-parallel replica.
    Dedicated(Replica),
    /// A whole GPU for one replica.
    Whole(Replica),
    /// MIG instances: (profile id, placement) and the replica in each.
    Mig {
        /// The instances.
        instances: Vec<(u32, Placement)>,
        /// The replica of each instance, same order (`None`: an instance kept from today that
        /// no replica of the demand takes).
        replicas: Vec<Option<Replica>>,
    },
    /// A GPU without MIG that is in use today: kept as it is.
    Busy {
        /// Client slots of its MPS daemon, when one serves it.
        mps_slots: Option<u32>,
    },
    /// An MPS daemon with `slots` client slots of `slot_mib` each.
    Mps {
        /// Pinned memory per slot.
        slot_mib: u64,
        /// Slots configured.
        slots: u32,
        /// Replicas holding a slot.
        clients: Vec<Replica>,
    },
}

impl GpuUse {
    /// Whether anything runs on the GPU.
    pub fn is_used(&self) -> bool {
        !matches!(self, GpuUse::Idle)
    }

    /// The pool this use belongs to (`None` when idle).
    pub fn pool(&self) -> Option<Pool> {
        match self {
            GpuUse::Idle => None,
            GpuUse::Dedicated(_) => Some(Pool::Dedicated),
            GpuUse::Whole(_) | GpuUse::Busy { .. } => Some(Pool::Standard),
            GpuUse::Mig { .. } => Some(Pool::Shared),
            GpuUse::Mps { .. } => Some(Pool::Mps),
        }
    }
}

/// One node of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedNode {
    /// Index into [`Input::nodes`].
    pub node: usize,
    /// Per GPU, in index order.
    pub gpus: Vec<GpuUse>,
}

impl PlannedNode {
    /// The pools on the node, most GPUs first (ties in pool order).
    pub fn pools(&self) -> Vec<Pool> {
        let mut counts: BTreeMap<Pool, usize> = BTreeMap::new();
        for p in self.gpus.iter().filter_map(GpuUse::pool) {
            *counts.entry(p).or_default() += 1;
        }
        let mut v: Vec<(Pool, usize)> = counts.into_iter().collect();
        v.sort_by_key(|&(p, n)| (std::cmp::Reverse(n), p));
        v.into_iter().map(|(p, _)| p).collect()
    }
}

/// Replicas of one model that found no room, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Unplaced {
    /// Demand index.
    pub demand: usize,
    /// Replicas left out.
    pub replicas: u32,
    /// Why.
    pub reason: String,
}

/// How the MIG packing was solved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchReport {
    /// Every MIG packing was solved exactly.
    pub exact: bool,
    /// GPUs the MIG packing uses.
    pub mig_gpus: u32,
    /// Lower bound on the GPUs the MIG packing needs.
    pub lower_bound_gpus: u32,
}

/// A computed plan.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Every node of the fleet, in input order.
    pub nodes: Vec<PlannedNode>,
    /// What did not fit.
    pub unplaced: Vec<Unplaced>,
    /// The pool choice of every model.
    pub choices: Vec<Choice>,
    /// The MIG search.
    pub search: SearchReport,
    /// Today's layouts the plan started from (empty for a fresh plan).
    pub current: current::Current,
}

/// Planner options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Percent added to a memory need before a MIG profile is chosen.
    pub headroom_pct: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self { headroom_pct: 10 }
    }
}

/// The demand's own MIG mix: profile name → replicas (fragmentation is measured against it).
pub fn demand_workload(input: &Input, choices: &[Choice]) -> Workload {
    let mut weights: Vec<(crate::mig::ProfileName, f64)> = Vec::new();
    for (d, c) in input.demand.iter().zip(choices) {
        if let Target::Mig { profile, .. } = &c.target {
            match weights.iter_mut().find(|(n, _)| n == profile) {
                Some((_, w)) => *w += f64::from(d.replicas),
                None => weights.push((profile.clone(), f64::from(d.replicas))),
            }
        }
    }
    Workload { weights }
}

/// Plans the fleet from scratch.
pub fn plan(input: &Input, opts: &Options) -> Result<FleetPlan, input::InputError> {
    plan_from(input, opts, &current::Current::new())
}

/// Plans the fleet starting from today's layouts: busy instances and busy GPUs stay as they are,
/// dedicated nodes come from nodes without instances first, every instance of today a replica
/// still wants stays (the fewest moves), kept GPUs take more wanted instances in their free
/// space, and the rest is packed afresh, matched to today's GPUs by overlap.
pub fn plan_from(input: &Input, opts: &Options, today: &current::Current) -> Result<FleetPlan, input::InputError> {
    let started = std::time::Instant::now();
    let replicas: u64 = input.demand.iter().map(|d| u64::from(d.replicas)).sum();
    // Large fleets say what they are doing (info); small ones only at debug.
    let big = input.nodes.len() >= LARGE_FLEET_NODES;
    let progress = |phase: &str| {
        let elapsed_ms = started.elapsed().as_millis() as u64;
        if big {
            tracing::info!(phase, elapsed_ms, "planning");
        } else {
            tracing::debug!(phase, elapsed_ms, "planning");
        }
    };
    progress(&format!(
        "{} nodes, {} models, {replicas} replicas: choosing pools",
        input.nodes.len(),
        input.demand.len()
    ));
    let choices = choose::choose(input, opts.headroom_pct)?;
    let mut b = Builder::new(input, &choices, today);
    b.freeze()?;
    progress("dedicated nodes");
    b.dedicated();
    b.keep();
    b.fill_kept();
    progress("packing MIG instances");
    b.mig();
    progress("whole GPUs and MPS slots");
    b.whole();
    b.mps();
    progress("assigning pools to nodes");
    let plan = b.finish();
    progress("done");
    Ok(plan)
}

/// Fleets of at least this many nodes log each planning phase at info.
const LARGE_FLEET_NODES: usize = 1000;

struct Builder<'a> {
    input: &'a Input,
    today: &'a current::Current,
    /// GPUs that stay as they are (busy today, or kept whole): node → GPU index → use.
    fixed: BTreeMap<usize, BTreeMap<usize, GpuUse>>,
    /// Today's idle MIG GPUs with instances, resolved once: (node, GPU index, instances).
    today_idle: Vec<(usize, u32, Instances)>,
    /// Replicas still wanting a MIG instance: (model id, profile id) → replicas in demand order.
    queues: BTreeMap<(&'static str, u32), std::collections::VecDeque<Replica>>,
    choices: &'a [Choice],
    workload: Workload,
    /// Nodes given to dedicated models: node → uses.
    dedicated: BTreeMap<usize, Vec<GpuUse>>,
    /// GPUs still free per model id (nodes not dedicated).
    free: BTreeMap<&'static str, u32>,
    /// Pool GPUs per model id, waiting for nodes.
    pending: BTreeMap<&'static str, Vec<GpuUse>>,
    unplaced: Vec<Unplaced>,
    search: SearchReport,
}

impl<'a> Builder<'a> {
    fn new(input: &'a Input, choices: &'a [Choice], today: &'a current::Current) -> Self {
        let mut free = BTreeMap::new();
        for n in &input.nodes {
            *free.entry(n.model.id).or_insert(0) += n.gpus;
        }
        let mut queues: BTreeMap<(&'static str, u32), std::collections::VecDeque<Replica>> = BTreeMap::new();
        for (di, c) in choices.iter().enumerate() {
            if let Target::Mig { model, profile_id, .. } = c.target {
                queues
                    .entry((model.id, profile_id))
                    .or_default()
                    .extend((0..input.demand[di].replicas).map(|r| (di, r)));
            }
        }
        Self {
            input,
            today,
            fixed: BTreeMap::new(),
            today_idle: Vec::new(),
            queues,
            choices,
            workload: demand_workload(input, choices),
            dedicated: BTreeMap::new(),
            free,
            pending: BTreeMap::new(),
            unplaced: Vec::new(),
            search: SearchReport { exact: true, ..SearchReport::default() },
        }
    }

    fn miss(&mut self, demand: usize, replicas: u32, reason: String) {
        if replicas == 0 {
            return;
        }
        match self.unplaced.iter_mut().find(|u| u.demand == demand && u.reason == reason) {
            Some(u) => u.replicas += replicas,
            None => self.unplaced.push(Unplaced { demand, replicas, reason }),
        }
    }

    /// Tensor-parallel replicas on whole nodes: a node already holding the model when it has
    /// room, else the free node wasting the fewest GPUs (GPUs without MIG first).
    fn dedicated(&mut self) {
        let mut order: Vec<usize> = (0..self.choices.len()).collect();
        order.sort_by_key(|&i| match self.choices[i].target {
            Target::Dedicated { gpus } => (0, std::cmp::Reverse(gpus), i),
            _ => (1, std::cmp::Reverse(0), i),
        });
        for di in order {
            let Target::Dedicated { gpus: tp } = self.choices[di].target else { continue };
            let d = &self.input.demand[di];
            for r in 0..d.replicas {
                let fits = |n: &input::Node| {
                    n.gpus >= tp && d.memory_mib.is_none_or(|m| n.model.memory_mib * u64::from(tp) >= m)
                };
                let same = self.dedicated.iter().find_map(|(&ni, uses)| {
                    let holds = uses.iter().any(|u| matches!(u, GpuUse::Dedicated((x, _)) if *x == di));
                    let idle = uses.iter().filter(|u| !u.is_used()).count() as u32;
                    (holds && idle >= tp && fits(&self.input.nodes[ni])).then_some(ni)
                });
                let fresh = || {
                    self.input
                        .nodes
                        .iter()
                        .enumerate()
                        .filter(|(i, n)| !self.dedicated.contains_key(i) && !self.fixed.contains_key(i) && fits(n))
                        .min_by_key(|(i, n)| {
                            (self.instances_today(n), n.gpus - tp, n.model.mig_capable(), n.model.memory_mib, *i)
                        })
                        .map(|(i, _)| i)
                };
                let Some(ni) = same.or_else(fresh) else {
                    let left = d.replicas - r;
                    self.miss(di, left, format!("no free node with {tp} GPUs left for a dedicated replica"));
                    break;
                };
                let node = &self.input.nodes[ni];
                if !self.dedicated.contains_key(&ni) {
                    if let Some(f) = self.free.get_mut(node.model.id) {
                        *f -= node.gpus;
                    }
                }
                let uses = self.dedicated.entry(ni).or_insert_with(|| vec![GpuUse::Idle; node.gpus as usize]);
                for u in uses.iter_mut().filter(|u| !u.is_used()).take(tp as usize) {
                    *u = GpuUse::Dedicated((di, r));
                }
            }
        }
    }

    /// Fleet models in the order whole GPUs (`mps == false`: without MIG first, then the
    /// smallest memory) or MPS GPUs (without MIG first, then the largest memory: most slots,
    /// fewest GPUs) are taken.
    fn models_by_preference(&self, mps: bool) -> Vec<&'static Model> {
        let mut models: Vec<&'static Model> =
            choose::fleet_models(&self.input.nodes).into_iter().map(|(m, _)| m).collect();
        models.sort_by_key(|m| {
            if mps {
                (m.mig_capable(), u64::MAX - m.memory_mib)
            } else {
                (m.mig_capable(), m.memory_mib)
            }
        });
        models
    }

    fn take_gpu(&mut self, model: &'static Model, usage: GpuUse) {
        if let Some(f) = self.free.get_mut(model.id) {
            *f -= 1;
        }
        self.pending.entry(model.id).or_default().push(usage);
    }

    /// Nodes of `model` touched outside their pool once `extra` more GPUs of `pool` join the
    /// pending ones, minus those touched already.
    fn mixing(&self, model: &'static Model, pool: Pool, extra: u32) -> usize {
        let caps: Vec<u32> = (0..self.input.nodes.len())
            .filter(|i| self.input.nodes[*i].model.id == model.id && !self.dedicated.contains_key(i))
            .map(|i| self.input.nodes[i].gpus)
            .collect();
        let mut requests: BTreeMap<Pool, u32> = BTreeMap::new();
        for p in self.pending.get(model.id).into_iter().flatten().filter_map(GpuUse::pool) {
            *requests.entry(p).or_default() += 1;
        }
        let before = assign::mixed_nodes(&assign::assign(&caps, &requests.clone().into_iter().collect::<Vec<_>>()));
        *requests.entry(pool).or_default() += extra;
        let after = assign::mixed_nodes(&assign::assign(&caps, &requests.into_iter().collect::<Vec<_>>()));
        after.saturating_sub(before)
    }

    /// `models` reordered so those where `gpus(model)` more GPUs of `pool` mix no node come
    /// first (the objective's first term), keeping the order otherwise.
    fn least_mixing(&self, models: &[&'static Model], pool: Pool, gpus: impl Fn(&Model) -> u32) -> Vec<&'static Model> {
        let mut ranked: Vec<(usize, usize, &'static Model)> = models
            .iter()
            .enumerate()
            .map(|(k, m)| (self.mixing(m, pool, gpus(m).min(self.free[m.id])), k, *m))
            .collect();
        ranked.sort_by_key(|&(cost, k, _)| (cost, k));
        ranked.into_iter().map(|(_, _, m)| m).collect()
    }

    fn whole(&mut self) {
        let preferred = self.models_by_preference(false);
        for (di, c) in self.choices.iter().enumerate() {
            let Target::Whole { need_mib } = c.target else { continue };
            let d = &self.input.demand[di];
            let models = self.least_mixing(&preferred, Pool::Standard, |_| d.replicas);
            for r in 0..d.replicas {
                let pick = models.iter().copied().find(|m| m.memory_mib >= need_mib && self.free[m.id] > 0);
                match pick {
                    Some(m) => self.take_gpu(m, GpuUse::Whole((di, r))),
                    None => {
                        self.miss(di, d.replicas - r, format!("no free GPU with {} left", choose::gib(need_mib)));
                        break;
                    }
                }
            }
        }
    }

    fn mig(&mut self) {
        let mut by_model: Vec<(&'static Model, Vec<u32>)> = Vec::new();
        for c in self.choices {
            if let Target::Mig { model, profile_id, .. } = c.target {
                match by_model.iter_mut().find(|(m, _)| m.id == model.id) {
                    Some((_, v)) if !v.contains(&profile_id) => v.push(profile_id),
                    Some(_) => {}
                    None => by_model.push((model, vec![profile_id])),
                }
            }
        }
        for (model, mut profiles) in by_model {
            let table = model.profile_table();
            profiles.sort_unstable();
            let all = configs::enumerate(&table, &profiles, &self.workload);
            let demand: Vec<u32> =
                profiles.iter().map(|p| self.queues.get(&(model.id, *p)).map_or(0, |q| q.len() as u32)).collect();
            let cap = self.free[model.id];
            let packing = pack::pack(&table, &all, &demand, cap);
            self.search.exact &= packing.exact;
            self.search.mig_gpus += packing.gpus.len() as u32;
            self.search.lower_bound_gpus += packing.lower_bound;
            for &gi in &packing.gpus {
                let cfg = &all.all[gi];
                let replicas: Vec<Option<Replica>> = cfg
                    .placements
                    .iter()
                    .map(|(id, _)| self.queues.get_mut(&(model.id, *id)).and_then(|q| q.pop_front()))
                    .collect();
                self.take_gpu(model, GpuUse::Mig { instances: cfg.placements.clone(), replicas });
            }
            for p in &profiles {
                let mut per: BTreeMap<usize, u32> = BTreeMap::new();
                for (di, _) in self.queues.remove(&(model.id, *p)).unwrap_or_default() {
                    *per.entry(di).or_default() += 1;
                }
                for (di, n) in per {
                    self.miss(di, n, format!("no free {} GPU left for its MIG instances", model.id));
                }
            }
        }
    }

    fn mps(&mut self) {
        let mut replicas: Vec<(u64, Replica)> = Vec::new();
        for (di, c) in self.choices.iter().enumerate() {
            if let Target::Mps { slot_mib } = c.target {
                replicas.extend((0..self.input.demand[di].replicas).map(|r| (slot_mib, (di, r))));
            }
        }
        replicas.sort_by_key(|&(slot, rep)| (std::cmp::Reverse(slot), rep));
        let Some(&(largest, _)) = replicas.first() else { return };
        let count = replicas.len() as u32;
        // GPUs without MIG first; a MIG-capable GPU (with MIG off) only once those are full.
        // Within each group, the models that mix no node come first.
        let (plain, mig): (Vec<&'static Model>, Vec<&'static Model>) =
            self.models_by_preference(true).into_iter().partition(|m| !m.mig_capable());
        let gpus = |m: &Model| {
            let per = crate::mps::settings::model_limits(m).0.min((m.memory_mib / largest.max(1)) as u32).max(1);
            count.div_ceil(per)
        };
        let mut models = self.least_mixing(&plain, Pool::Mps, gpus);
        models.extend(self.least_mixing(&mig, Pool::Mps, gpus));
        let mut open: Vec<(&'static Model, GpuUse)> = Vec::new();
        for (need, rep) in replicas {
            let room = open.iter_mut().find(|(_, u)| {
                matches!(u, GpuUse::Mps { slot_mib, slots, clients } if *slot_mib >= need && (clients.len() as u32) < *slots)
            });
            if let Some((_, GpuUse::Mps { clients, .. })) = room {
                clients.push(rep);
                continue;
            }
            let pick = models.iter().copied().find(|m| m.memory_mib >= 2 * need && self.free[m.id] > 0);
            let Some(m) = pick else {
                self.miss(rep.0, 1, format!("no free GPU left for an MPS slot of {}", choose::gib(need)));
                continue;
            };
            if let Some(f) = self.free.get_mut(m.id) {
                *f -= 1;
            }
            let slots = crate::mps::settings::model_limits(m).0.min((m.memory_mib / need) as u32);
            open.push((m, GpuUse::Mps { slot_mib: need, slots, clients: vec![rep] }));
        }
        for (m, u) in open {
            self.pending.entry(m.id).or_default().push(u);
        }
    }

    /// Puts the pending pool GPUs onto nodes and fills the rest with idle GPUs.
    fn finish(mut self) -> FleetPlan {
        let mut nodes: Vec<PlannedNode> = Vec::new();
        let mut shared: BTreeMap<usize, Vec<GpuUse>> = BTreeMap::new();
        let mut models: Vec<&'static str> = self.input.nodes.iter().map(|n| n.model.id).collect();
        models.dedup();
        models.sort_unstable();
        models.dedup();
        for model in models {
            let members: Vec<usize> = (0..self.input.nodes.len())
                .filter(|i| self.input.nodes[*i].model.id == model && !self.dedicated.contains_key(i))
                .collect();
            let caps: Vec<u32> = members
                .iter()
                .map(|&i| self.input.nodes[i].gpus - self.fixed.get(&i).map_or(0, |f| f.len() as u32))
                .collect();
            let mut uses = self.pending.remove(model).unwrap_or_default();
            // Identical MIG GPUs side by side, so nodes share layouts.
            uses.sort_by_key(key);
            let mut by_pool: BTreeMap<Pool, std::collections::VecDeque<GpuUse>> = BTreeMap::new();
            for u in uses {
                if let Some(p) = u.pool() {
                    by_pool.entry(p).or_default().push_back(u);
                }
            }
            let requests: Vec<(Pool, u32)> = by_pool.iter().map(|(p, v)| (*p, v.len() as u32)).collect();
            for a in assign::assign(&caps, &requests) {
                let node = members[a.node];
                let list = shared.entry(node).or_default();
                if let Some(q) = by_pool.get_mut(&a.pool) {
                    list.extend((0..a.gpus).filter_map(|_| q.pop_front()));
                }
            }
        }
        for (i, n) in self.input.nodes.iter().enumerate() {
            let gpus = match self.dedicated.remove(&i) {
                Some(mut g) => {
                    g.resize(n.gpus as usize, GpuUse::Idle);
                    g
                }
                None => self.lay_out(i, shared.remove(&i).unwrap_or_default()),
            };
            nodes.push(PlannedNode { node: i, gpus });
        }
        self.unplaced.sort_by_key(|u| u.demand);
        FleetPlan {
            nodes,
            unplaced: self.unplaced,
            choices: self.choices.to_vec(),
            search: self.search,
            current: self.today.clone(),
        }
    }
}

impl Builder<'_> {
    /// GPU instances today on a node.
    fn instances_today(&self, n: &input::Node) -> usize {
        self.today.get(&n.name).map_or(0, |g| g.iter().map(|g| g.instances.len()).sum())
    }

    /// Checks today's layouts against the fleet and fixes what is busy: a GPU with a busy
    /// instance keeps all its instances, a busy GPU without MIG stays as it is.
    fn freeze(&mut self) -> Result<(), input::InputError> {
        for (ni, n) in self.input.nodes.iter().enumerate() {
            let Some(gpus) = self.today.get(&n.name) else { continue };
            let table = n.model.profile_table();
            for g in gpus {
                let at = format!("current '{}', GPU {}", n.name, g.index);
                let bad = |message: String| input::InputError { at: at.clone(), message };
                if g.index >= n.gpus {
                    return Err(bad(format!("the fleet gives node '{}' {} GPUs", n.name, n.gpus)));
                }
                if !g.model.eq_ignore_ascii_case(n.model.id) {
                    return Err(bad(format!("is a {}, the fleet says {}", g.model, n.model.id)));
                }
                let mut instances = Vec::new();
                for i in &g.instances {
                    let p =
                        table.profiles.iter().find(|p| p.name == i.profile).ok_or_else(|| {
                            bad(format!("{} is not a GPU-instance profile of {}", i.profile, n.model.id))
                        })?;
                    instances.push((p.id, Placement::new(i.start, p.memory_slices)));
                }
                if !g.any_busy() {
                    if g.mig && !instances.is_empty() {
                        self.today_idle.push((ni, g.index, instances));
                    }
                    continue;
                }
                let usage = if g.mig {
                    GpuUse::Mig { replicas: vec![None; instances.len()], instances }
                } else {
                    GpuUse::Busy { mps_slots: g.mps_slots }
                };
                self.fix(ni, g.index as usize, usage);
            }
        }
        Ok(())
    }

    fn fix(&mut self, node: usize, gpu: usize, usage: GpuUse) {
        let model = self.input.nodes[node].model.id;
        if let Some(f) = self.free.get_mut(model) {
            *f = f.saturating_sub(1);
        }
        self.fixed.entry(node).or_default().insert(gpu, usage);
    }

    /// Gives today's instances to replicas: first those on busy GPUs, then whole idle GPUs whose
    /// every instance a replica still wants (they move nothing).
    fn keep(&mut self) {
        for (ni, gpus) in self.fixed.iter_mut() {
            let model = self.input.nodes[*ni].model.id;
            for u in gpus.values_mut() {
                if let GpuUse::Mig { instances, replicas } = u {
                    for ((id, _), r) in instances.iter().zip(replicas.iter_mut()) {
                        *r = self.queues.get_mut(&(model, *id)).and_then(|q| q.pop_front());
                    }
                }
            }
        }
        // Idle GPUs whose every instance is wanted stay whole first; then every other idle GPU
        // keeps the instances a replica still wants (the rest go): each kept instance saves a
        // destroy and a create, so keeping as many as the demand wants is the fewest moves.
        self.keep_wanted(true);
        self.keep_wanted(false);
    }

    /// Keeps today's idle instances that replicas still want; with `whole_only`, only on GPUs
    /// where every instance is wanted.
    fn keep_wanted(&mut self, whole_only: bool) {
        let idle = std::mem::take(&mut self.today_idle);
        for (ni, gpu, instances) in &idle {
            let model = self.input.nodes[*ni].model.id;
            let fixed = self.fixed.get(ni).is_some_and(|f| f.contains_key(&(*gpu as usize)));
            if self.dedicated.contains_key(ni) || fixed {
                continue;
            }
            let wanted = |id: u32| instances.iter().filter(|(x, _)| *x == id).count();
            let all_wanted =
                instances.iter().all(|(id, _)| self.queues.get(&(model, *id)).is_some_and(|q| q.len() >= wanted(*id)));
            if whole_only && !all_wanted {
                continue;
            }
            let (mut kept, mut replicas) = (Vec::new(), Vec::new());
            for &(id, pl) in instances {
                if let Some(r) = self.queues.get_mut(&(model, id)).and_then(|q| q.pop_front()) {
                    kept.push((id, pl));
                    replicas.push(Some(r));
                }
            }
            if !kept.is_empty() {
                self.fix(*ni, *gpu as usize, GpuUse::Mig { instances: kept, replicas });
            }
        }
        self.today_idle = idle;
    }

    /// Fills the free space of the GPUs kept from today (busy or not) with instances still
    /// wanted on their model, largest first, at the first legal placement: no move, fewer GPUs.
    fn fill_kept(&mut self) {
        for (ni, gpus) in self.fixed.iter_mut() {
            let model = self.input.nodes[*ni].model;
            let table = model.profile_table();
            for u in gpus.values_mut() {
                let GpuUse::Mig { instances, replicas } = u else { continue };
                let mut occ = crate::mig::capacity::Occupancy::of(&table, instances.iter().copied());
                let mut wanted: Vec<&crate::mig::GiProfile> = table
                    .profiles
                    .iter()
                    .filter(|p| self.queues.get(&(model.id, p.id)).is_some_and(|q| !q.is_empty()))
                    .collect();
                wanted.sort_by_key(|p| (std::cmp::Reverse(p.memory_slices), std::cmp::Reverse(p.slices), p.id));
                for p in wanted {
                    while let Some(pl) = p.placements.iter().copied().find(|pl| occ.check(&table, p, *pl).is_ok()) {
                        let Some(r) = self.queues.get_mut(&(model.id, p.id)).and_then(|q| q.pop_front()) else { break };
                        occ.add(p, pl);
                        instances.push((p.id, pl));
                        replicas.push(Some(r));
                    }
                }
            }
        }
    }

    /// A node's GPUs: the fixed ones at their index, the assigned ones on the other indices,
    /// each MIG GPU where today's instances overlap it most.
    fn lay_out(&self, ni: usize, mut assigned: Vec<GpuUse>) -> Vec<GpuUse> {
        let n = &self.input.nodes[ni];
        let mut gpus: Vec<Option<GpuUse>> = vec![None; n.gpus as usize];
        for (&g, u) in self.fixed.get(&ni).into_iter().flatten() {
            if let Some(slot) = gpus.get_mut(g) {
                *slot = Some(u.clone());
            }
        }
        let today: Vec<Vec<String>> = (0..n.gpus)
            .map(|i| {
                self.today
                    .get(&n.name)
                    .and_then(|g| g.iter().find(|g| g.index == i))
                    .map(|g| g.instances.iter().map(|x| x.profile.to_string()).collect())
                    .unwrap_or_default()
            })
            .collect();
        let table = n.model.profile_table();
        let names = |u: &GpuUse| -> Vec<String> {
            match u {
                GpuUse::Mig { instances, .. } => {
                    instances.iter().filter_map(|(id, _)| table.by_id(*id).map(|p| p.name.to_string())).collect()
                }
                _ => Vec::new(),
            }
        };
        // Most overlapping pairs first, greedily.
        let mut pairs: Vec<(usize, usize, usize)> = Vec::new();
        for (k, u) in assigned.iter().enumerate() {
            let want = names(u);
            for (g, slot) in gpus.iter().enumerate() {
                if slot.is_none() {
                    pairs.push((overlap(&want, &today[g]), k, g));
                }
            }
        }
        pairs.sort_by_key(|&(o, k, g)| (std::cmp::Reverse(o), k, g));
        let mut placed = vec![false; assigned.len()];
        for (o, k, g) in pairs {
            if o == 0 || placed[k] || gpus[g].is_some() {
                continue;
            }
            gpus[g] = Some(std::mem::replace(&mut assigned[k], GpuUse::Idle));
            placed[k] = true;
        }
        let mut rest = assigned.into_iter().zip(placed).filter(|(_, p)| !p).map(|(u, _)| u);
        gpus.into_iter().map(|slot| slot.or_else(|| rest.next()).unwrap_or(GpuUse::Idle)).collect()
    }
}

/// Instances two profile lists have in common (multiset intersection).
pub fn overlap(a: &[String], b: &[String]) -> usize {
    let mut b: Vec<&String> = b.iter().collect();
    a.iter()
        .filter(|x| match b.iter().position(|y| y == x) {
            Some(i) => {
                b.swap_remove(i);
                true
            }
            None => false,
        })
        .count()
}

/// Sort key grouping equal GPU uses: pool, then the MIG profile multiset.
fn key(u: &GpuUse) -> (Option<Pool>, Vec<u32>) {
    let mut ids: Vec<u32> = match u {
        GpuUse::Mig { instances, .. } => instances.iter().map(|(id, _)| *id).collect(),
        _ => Vec::new(),
    };
    ids.sort_unstable();
    (u.pool(), ids)
}

#[cfg(test)]
mod tests;
