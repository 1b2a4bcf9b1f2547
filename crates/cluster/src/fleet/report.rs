//! A plan's documented output (docs/plan.md, `plan -o json`): nodes with pool, layout, labels and
//! taints; placements; unplaced replicas; the mig-parted config; the summary and the baselines.

use super::choose::{Pool, Target};
use super::input::Input;
pub use super::layout::{GpuSpec, Layout};
use super::{baseline, demand_workload, FleetPlan, GpuUse, PlannedNode};
use crate::mig::capacity::Occupancy;
use crate::mig::ProfileTable;
use gpupart_node::frag::{expected_fragmentation, Workload};
use serde::Serialize;
use std::collections::BTreeMap;

/// The pool label (the controller's `--pool-label` default).
pub const POOL_LABEL: &str = crate::pools::DEFAULT_POOL_LABEL;
/// The layout label the agents read.
pub const LAYOUT_LABEL: &str = "nvidia.com/mig.config";
/// The taint of dedicated nodes (the controller's `--dedicated-taint` default).
pub const DEDICATED_TAINT: &str = crate::pools::DEFAULT_DEDICATED_TAINT;

/// `plan -o json`.
#[derive(Debug, Clone, Serialize)]
pub struct PlanDoc {
    /// Every node of the fleet.
    pub nodes: Vec<NodeDoc>,
    /// Where every placed replica runs (one entry per GPU for a tensor-parallel replica).
    pub placements: Vec<PlacementDoc>,
    /// Replicas that found no room.
    pub unplaced: Vec<UnplacedDoc>,
    /// The mig-parted v1 config holding every layout.
    pub config: String,
    /// Totals.
    pub summary: Summary,
    /// First-fit on the same input.
    pub baseline: BaselineDoc,
    /// Every baseline: first-fit, and one whole GPU per replica.
    pub baselines: Vec<BaselineDoc>,
    /// The pool choice of every model, with its reason.
    pub decisions: Vec<DecisionDoc>,
    /// Per GPU that changes against today's layouts (`--current`, `--from-cluster`).
    pub moves: Vec<MoveDoc>,
}

/// The instances one GPU loses and gains against today.
#[derive(Debug, Clone, Serialize)]
pub struct MoveDoc {
    /// Node name.
    pub node: String,
    /// GPU index.
    pub gpu: u32,
    /// Today's instances that go (`profile@start`); never a busy one.
    pub destroy: Vec<String>,
    /// Instances created (profile names).
    pub create: Vec<String>,
}

/// Instances kept, destroyed and created against today.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MovesDoc {
    /// Today's instances that stay.
    pub kept: u32,
    /// Of those, busy ones (always all of today's busy instances).
    pub busy_kept: u32,
    /// Today's instances destroyed.
    pub destroyed: u32,
    /// Instances created.
    pub created: u32,
}

/// One node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeDoc {
    /// Node name.
    pub name: String,
    /// Its pool (the one holding most of its GPUs; `idle` when none).
    pub pool: String,
    /// Layout name in `config` (the `nvidia.com/mig.config` label).
    pub layout: String,
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
    /// Taints to set, `key=value:Effect`.
    pub taints: Vec<String>,
    /// GPU model.
    pub gpu: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// Every pool on the node (more than one: touched outside its pool).
    pub pools: Vec<String>,
}

/// One placed replica on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementDoc {
    /// Model (demand name).
    pub model: String,
    /// Replica number, from 0.
    pub replica: u32,
    /// Node name.
    pub node: String,
    /// GPU index on the node.
    pub gpu: u32,
    /// MIG profile, `whole` or `mps`.
    pub profile: String,
}

/// Replicas left out.
#[derive(Debug, Clone, Serialize)]
pub struct UnplacedDoc {
    /// Model.
    pub model: String,
    /// How many replicas.
    pub replicas: u32,
    /// Why.
    pub reason: String,
}

/// Per-pool totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolDoc {
    /// Nodes whose pool this is.
    pub nodes: u32,
    /// GPUs this pool uses.
    pub gpus: u32,
    /// Replicas placed in it.
    pub replicas: u32,
}

/// How the MIG packing was solved.
#[derive(Debug, Clone, Serialize)]
pub struct SearchDoc {
    /// `exact` or `heuristic`.
    pub method: String,
    /// GPUs holding MIG instances.
    pub mig_gpus: u32,
    /// A lower bound on those GPUs.
    pub lower_bound_gpus: u32,
    /// mig_gpus − lower_bound_gpus (0 when exact only if the bound is tight).
    pub gap_gpus: u32,
}

/// Totals of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// GPUs in the fleet.
    pub gpus_total: u32,
    /// GPUs holding at least one replica.
    pub gpus_used: u32,
    /// GPUs holding nothing.
    pub gpus_idle: u32,
    /// Unallocated GPU-equivalents (free MIG slices, free MPS slots, idle GPUs).
    pub unallocated_gpus: f64,
    /// Fragmented GPU-equivalents against the demand's MIG mix.
    pub fragmented_gpus: f64,
    /// fragmented / unallocated (docs/fragmentation.md).
    pub fragmentation_ratio: f64,
    /// Nodes holding more than one pool.
    pub mixed_nodes: u32,
    /// Per pool.
    pub pools: BTreeMap<String, PoolDoc>,
    /// The MIG search.
    pub search: SearchDoc,
    /// Against today's layouts (all zero for a fresh plan).
    pub moves: MovesDoc,
}

/// A baseline's figures.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineDoc {
    /// `first-fit` or `whole-gpus`.
    pub name: String,
    /// GPUs holding at least one replica.
    pub gpus_used: u32,
    /// fragmented / unallocated.
    pub fragmentation_ratio: f64,
    /// Replicas left out.
    pub unplaced: u32,
    /// Nodes holding more than one pool.
    pub mixed_nodes: u32,
}

/// One model's pool choice.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionDoc {
    /// Model.
    pub model: String,
    /// Pool.
    pub pool: String,
    /// MIG profile, when shared.
    pub profile: Option<String>,
    /// GPU model of the MIG instances, when shared.
    pub gpu: Option<String>,
    /// Why.
    pub reason: String,
}

/// Fragmentation and use of a set of planned nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measure {
    /// GPUs holding a replica.
    pub gpus_used: u32,
    /// GPUs holding nothing.
    pub gpus_idle: u32,
    /// Unallocated GPU-equivalents.
    pub unallocated: f64,
    /// Fragmented GPU-equivalents.
    pub fragmented: f64,
}

impl Measure {
    /// fragmented / unallocated (0 when nothing is unallocated).
    pub fn ratio(&self) -> f64 {
        if self.unallocated > 0.0 {
            self.fragmented / self.unallocated
        } else {
            0.0
        }
    }
}

/// Profile tables of the fleet's models, built once.
pub struct Tables(BTreeMap<&'static str, ProfileTable>);

impl Tables {
    /// Tables for every model of `input`.
    pub fn of(input: &Input) -> Self {
        Self(input.nodes.iter().map(|n| (n.model.id, n.model.profile_table())).collect())
    }

    /// The table of a model id.
    pub fn get(&self, id: &str) -> Option<&ProfileTable> {
        self.0.get(id)
    }
}

/// Measures planned nodes against the demand's mix.
pub fn measure(input: &Input, tables: &Tables, nodes: &[PlannedNode], workload: &Workload) -> Measure {
    let mut m = Measure::default();
    for pn in nodes {
        let model = input.nodes[pn.node].model;
        for u in &pn.gpus {
            let (free, frag) = match u {
                GpuUse::Idle => (1.0, 0.0),
                GpuUse::Dedicated(_) | GpuUse::Whole(_) | GpuUse::Busy { .. } => (0.0, 0.0),
                GpuUse::Mps { slots, clients, .. } => {
                    (f64::from(slots.saturating_sub(clients.len() as u32)) / f64::from((*slots).max(1)), 0.0)
                }
                GpuUse::Mig { instances, .. } => match tables.get(model.id) {
                    Some(t) => {
                        let occ = Occupancy::of(t, instances.iter().copied());
                        let slices = f64::from(t.memory_slices.max(1));
                        let frag = expected_fragmentation(t, &occ, Some(workload));
                        (f64::from(occ.free_memory_slices(t)) / slices, frag / slices)
                    }
                    None => (0.0, 0.0),
                },
            };
            if u.is_used() {
                m.gpus_used += 1;
            } else {
                m.gpus_idle += 1;
            }
            m.unallocated += free;
            m.fragmented += frag;
        }
    }
    m
}

/// The per-GPU specs of a planned node (its layout).
pub fn node_specs(input: &Input, tables: &Tables, pn: &PlannedNode) -> Vec<GpuSpec> {
    let model = input.nodes[pn.node].model;
    let mig_node = pn.pools().first() == Some(&Pool::Shared);
    pn.gpus
        .iter()
        .map(|u| match u {
            GpuUse::Idle if mig_node => GpuSpec::Mig(Vec::new()),
            GpuUse::Idle | GpuUse::Dedicated(_) | GpuUse::Whole(_) | GpuUse::Busy { mps_slots: None } => GpuSpec::Off,
            GpuUse::Busy { mps_slots: Some(slots) } => GpuSpec::Mps { slots: *slots, limit_mib: None },
            GpuUse::Mps { slot_mib, slots, .. } => GpuSpec::Mps {
                slots: *slots,
                limit_mib: crate::mps::settings::model_limits(model).1.then_some(*slot_mib),
            },
            GpuUse::Mig { instances, .. } => {
                let mut counts: BTreeMap<String, u32> = BTreeMap::new();
                for (id, _) in instances {
                    let name = tables
                        .get(model.id)
                        .and_then(|t| t.by_id(*id))
                        .map_or_else(|| format!("profile-{id}"), |p| p.name.to_string());
                    *counts.entry(name).or_default() += 1;
                }
                GpuSpec::Mig(counts.into_iter().collect())
            }
        })
        .collect()
}

/// Builds the documented output of a plan.
pub fn report(input: &Input, plan: &FleetPlan) -> PlanDoc {
    let tables = Tables::of(input);
    let workload = demand_workload(input, &plan.choices);
    // Layouts: one name per distinct node layout, numbered per pool when a pool has several.
    let specs: Vec<Vec<GpuSpec>> = plan.nodes.iter().map(|pn| node_specs(input, &tables, pn)).collect();
    let pool_of = |pn: &PlannedNode| pn.pools().first().map_or("idle", |p| p.as_str());
    let mut layouts: Vec<Layout> = Vec::new();
    for (pn, spec) in plan.nodes.iter().zip(&specs) {
        let model = input.nodes[pn.node].model;
        if !layouts.iter().any(|l| l.pool == pool_of(pn) && l.model.id == model.id && &l.specs == spec) {
            layouts.push(Layout { name: String::new(), pool: pool_of(pn).to_string(), model, specs: spec.clone() });
        }
    }
    for k in 0..layouts.len() {
        let same: Vec<usize> = (0..layouts.len()).filter(|&j| layouts[j].pool == layouts[k].pool).collect();
        let pool = &layouts[k].pool;
        layouts[k].name = match same.iter().position(|&j| j == k) {
            Some(n) if same.len() > 1 => format!("gpupart-{pool}-{}", n + 1),
            _ => format!("gpupart-{pool}"),
        };
    }
    let name_of = |pool: &str, model: &str, spec: &Vec<GpuSpec>| {
        layouts
            .iter()
            .find(|l| l.pool == pool && l.model.id == model && &l.specs == spec)
            .map_or_else(|| format!("gpupart-{pool}"), |l| l.name.clone())
    };
    let mut nodes = Vec::new();
    let mut placements = Vec::new();
    let mut pools: BTreeMap<String, PoolDoc> = BTreeMap::new();
    let mut replicas_seen: std::collections::BTreeSet<(Pool, usize, u32)> = Default::default();
    for (pn, spec) in plan.nodes.iter().zip(&specs) {
        let node = &input.nodes[pn.node];
        let pool = pool_of(pn).to_string();
        let layout = name_of(&pool, node.model.id, spec);
        let mut labels = BTreeMap::new();
        labels.insert(LAYOUT_LABEL.to_string(), layout.clone());
        labels.insert(POOL_LABEL.to_string(), pool.clone());
        let taints = if pool == Pool::Dedicated.as_str() { vec![DEDICATED_TAINT.to_string()] } else { Vec::new() };
        pools.entry(pool.clone()).or_default().nodes += 1;
        for (gi, u) in pn.gpus.iter().enumerate() {
            let mut place = |(di, r): (usize, u32), profile: String| {
                placements.push(PlacementDoc {
                    model: input.demand[di].name.clone(),
                    replica: r,
                    node: node.name.clone(),
                    gpu: gi as u32,
                    profile,
                });
            };
            match u {
                GpuUse::Idle | GpuUse::Busy { .. } => {}
                GpuUse::Dedicated(rep) | GpuUse::Whole(rep) => place(*rep, "whole".into()),
                GpuUse::Mps { clients, .. } => clients.iter().for_each(|rep| place(*rep, "mps".into())),
                GpuUse::Mig { instances, replicas } => {
                    for ((id, _), rep) in instances.iter().zip(replicas).filter_map(|(i, r)| r.map(|r| (i, r))) {
                        let name = tables
                            .get(node.model.id)
                            .and_then(|t| t.by_id(*id))
                            .map_or_else(String::new, |p| p.name.to_string());
                        place(rep, name);
                    }
                }
            }
            if let Some(p) = u.pool() {
                let entry = pools.entry(p.as_str().to_string()).or_default();
                entry.gpus += 1;
                let reps: Vec<(usize, u32)> = match u {
                    GpuUse::Dedicated(r) | GpuUse::Whole(r) => vec![*r],
                    GpuUse::Mps { clients, .. } => clients.clone(),
                    GpuUse::Mig { replicas, .. } => replicas.iter().flatten().copied().collect(),
                    GpuUse::Idle | GpuUse::Busy { .. } => Vec::new(),
                };
                for (di, r) in reps {
                    if replicas_seen.insert((p, di, r)) {
                        entry.replicas += 1;
                    }
                }
            }
        }
        nodes.push(NodeDoc {
            name: node.name.clone(),
            pool,
            layout,
            labels,
            taints,
            gpu: node.model.id.to_string(),
            gpus: node.gpus,
            pools: pn.pools().iter().map(|p| p.as_str().to_string()).collect(),
        });
    }
    let m = measure(input, &tables, &plan.nodes, &workload);
    let (moves, moves_total) = moves(input, &tables, plan);
    let s = &plan.search;
    let summary = Summary {
        gpus_total: m.gpus_used + m.gpus_idle,
        gpus_used: m.gpus_used,
        gpus_idle: m.gpus_idle,
        unallocated_gpus: m.unallocated,
        fragmented_gpus: m.fragmented,
        fragmentation_ratio: m.ratio(),
        mixed_nodes: plan.nodes.iter().filter(|pn| pn.pools().len() > 1).count() as u32,
        pools,
        search: SearchDoc {
            method: if s.exact { "exact" } else { "heuristic" }.to_string(),
            mig_gpus: s.mig_gpus,
            lower_bound_gpus: s.lower_bound_gpus,
            gap_gpus: s.mig_gpus.saturating_sub(s.lower_bound_gpus),
        },
        moves: moves_total,
    };
    let baselines: Vec<BaselineDoc> = baseline::all(input, &plan.choices)
        .into_iter()
        .map(|(name, b)| {
            let bm = measure(input, &tables, &b.nodes, &workload);
            BaselineDoc {
                name: name.to_string(),
                gpus_used: bm.gpus_used,
                fragmentation_ratio: bm.ratio(),
                unplaced: b.unplaced.iter().map(|u| u.replicas).sum(),
                mixed_nodes: b.nodes.iter().filter(|pn| pn.pools().len() > 1).count() as u32,
            }
        })
        .collect();
    PlanDoc {
        config: super::layout::config_yaml(&layouts),
        nodes,
        placements,
        unplaced: plan
            .unplaced
            .iter()
            .map(|u| UnplacedDoc {
                model: input.demand[u.demand].name.clone(),
                replicas: u.replicas,
                reason: u.reason.clone(),
            })
            .collect(),
        summary,
        baseline: baselines[0].clone(),
        baselines,
        decisions: input
            .demand
            .iter()
            .zip(&plan.choices)
            .map(|(d, c)| {
                let (profile, gpu) = match &c.target {
                    Target::Mig { model, profile, .. } => (Some(profile.to_string()), Some(model.id.to_string())),
                    _ => (None, None),
                };
                DecisionDoc {
                    model: d.name.clone(),
                    pool: c.pool.as_str().to_string(),
                    profile,
                    gpu,
                    reason: c.reason.clone(),
                }
            })
            .collect(),
        moves,
    }
}

/// The per-GPU changes against today, and their totals: an instance of today stays when the
/// planned GPU holds an instance of its profile (the agent's planner keeps existing instances of
/// a wanted profile where they are).
fn moves(input: &Input, tables: &Tables, plan: &FleetPlan) -> (Vec<MoveDoc>, MovesDoc) {
    let mut out = Vec::new();
    let mut total = MovesDoc::default();
    for pn in &plan.nodes {
        let node = &input.nodes[pn.node];
        let Some(today) = plan.current.get(&node.name) else { continue };
        let Some(t) = tables.get(node.model.id) else { continue };
        for (gi, u) in pn.gpus.iter().enumerate() {
            let now: Vec<&super::current::CurrentInstance> =
                today.iter().find(|g| g.index as usize == gi).map(|g| g.instances.iter().collect()).unwrap_or_default();
            let mut planned: Vec<(String, u32)> = match u {
                GpuUse::Mig { instances, .. } => instances
                    .iter()
                    .filter_map(|(id, pl)| t.by_id(*id).map(|p| (p.name.to_string(), pl.start)))
                    .collect(),
                _ => Vec::new(),
            };
            let mut destroy = Vec::new();
            for i in now {
                match planned.iter().position(|(n, _)| *n == i.profile.to_string()) {
                    Some(k) => {
                        planned.swap_remove(k);
                        total.kept += 1;
                        total.busy_kept += u32::from(i.busy);
                    }
                    None => destroy.push(format!("{}@{}", i.profile, i.start)),
                }
            }
            total.destroyed += destroy.len() as u32;
            total.created += planned.len() as u32;
            if !destroy.is_empty() || !planned.is_empty() {
                out.push(MoveDoc {
                    node: node.name.clone(),
                    gpu: gi as u32,
                    destroy,
                    create: planned.into_iter().map(|(n, _)| n).collect(),
                });
            }
        }
    }
    (out, total)
}
