//! The obvious ways, for comparison (pure): first-fit with the same pool choices (each replica
//! on the first GPU, in node order, where it fits at the lowest free placement), and one whole
//! GPU per replica (no sharing at all).

use super::choose::{Choice, Target};
use super::input::Input;
use super::{GpuUse, PlannedNode, Unplaced};
use crate::mig::capacity::Occupancy;

/// A baseline's placement.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Every node, in input order.
    pub nodes: Vec<PlannedNode>,
    /// What did not fit.
    pub unplaced: Vec<Unplaced>,
}

/// Both baselines, named.
pub fn all(input: &Input, choices: &[Choice]) -> Vec<(&'static str, Baseline)> {
    vec![("first-fit", first_fit(input, choices, false)), ("whole-gpus", first_fit(input, choices, true))]
}

fn empty(input: &Input) -> Vec<PlannedNode> {
    input
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| PlannedNode { node: i, gpus: vec![GpuUse::Idle; n.gpus as usize] })
        .collect()
}

fn miss(unplaced: &mut Vec<Unplaced>, demand: usize) {
    match unplaced.iter_mut().find(|u| u.demand == demand) {
        Some(u) => u.replicas += 1,
        None => unplaced.push(Unplaced { demand, replicas: 1, reason: "no room (baseline)".into() }),
    }
}

/// The fleet's GPUs in node order, with what first-fit needs to skip full ones quickly.
struct Gpus<'a> {
    input: &'a Input,
    nodes: Vec<PlannedNode>,
    /// (node, gpu) in scan order.
    order: Vec<(usize, usize)>,
    /// Occupancy of MIG GPUs, by scan position.
    occ: Vec<Occupancy>,
    /// Profile tables by model id.
    tables: std::collections::BTreeMap<&'static str, crate::mig::ProfileTable>,
    /// First scan position that may still take a request (GPUs only fill up, so a GPU that
    /// refused a request refuses it for good).
    cursor: std::collections::HashMap<(u8, u64, &'static str), usize>,
    /// Scan positions of the MPS GPUs opened so far, in order.
    mps_open: Vec<usize>,
}

/// First-fit; with `whole`, every replica takes whole GPUs.
pub fn first_fit(input: &Input, choices: &[Choice], whole: bool) -> Baseline {
    let nodes = empty(input);
    let order: Vec<(usize, usize)> =
        nodes.iter().flat_map(|pn| (0..pn.gpus.len()).map(move |g| (pn.node, g))).collect();
    let tables = input.nodes.iter().map(|n| (n.model.id, n.model.profile_table())).collect();
    let mut g = Gpus {
        input,
        nodes,
        occ: vec![Occupancy::empty(); order.len()],
        order,
        tables,
        cursor: Default::default(),
        mps_open: Vec::new(),
    };
    let mut unplaced = Vec::new();
    for (di, (d, c)) in input.demand.iter().zip(choices).enumerate() {
        for r in 0..d.replicas {
            let rep = (di, r);
            let placed = match &c.target {
                Target::Dedicated { gpus } => g.dedicated(rep, *gpus),
                _ if whole => g.whole_gpu(rep, need_mib(c, input, di)),
                Target::Whole { need_mib } => g.whole_gpu(rep, *need_mib),
                Target::Mig { model, profile_id, .. } => g.mig(rep, model.id, *profile_id),
                Target::Mps { slot_mib } => g.mps(rep, *slot_mib),
            };
            if !placed {
                miss(&mut unplaced, di);
            }
        }
    }
    Baseline { nodes: g.nodes, unplaced }
}

fn need_mib(c: &Choice, input: &Input, di: usize) -> u64 {
    match &c.target {
        Target::Whole { need_mib } => *need_mib,
        Target::Mps { slot_mib } => *slot_mib,
        Target::Mig { model, profile_id, .. } => {
            model.profile_table().by_id(*profile_id).map_or(input.demand[di].memory_mib.unwrap_or(0), |p| p.memory_mib)
        }
        Target::Dedicated { .. } => 0,
    }
}

impl Gpus<'_> {
    fn dedicated(&mut self, rep: (usize, u32), tp: u32) -> bool {
        let mem = self.input.demand[rep.0].memory_mib;
        for pn in self.nodes.iter_mut() {
            let n = &self.input.nodes[pn.node];
            let idle = pn.gpus.iter().filter(|u| !u.is_used()).count() as u32;
            if idle >= tp && mem.is_none_or(|m| n.model.memory_mib * u64::from(tp) >= m) {
                for u in pn.gpus.iter_mut().filter(|u| !u.is_used()).take(tp as usize) {
                    *u = GpuUse::Dedicated(rep);
                }
                return true;
            }
        }
        false
    }

    /// Scans from the request's cursor for the first GPU `try_one` takes.
    fn scan(&mut self, key: (u8, u64, &'static str), mut try_one: impl FnMut(&mut Self, usize) -> bool) -> bool {
        let start = self.cursor.get(&key).copied().unwrap_or(0);
        for pos in start..self.order.len() {
            if try_one(self, pos) {
                self.cursor.insert(key, pos);
                return true;
            }
        }
        self.cursor.insert(key, self.order.len());
        false
    }

    fn slot(&mut self, pos: usize) -> (&'static crate::mig::catalog::Model, &mut GpuUse) {
        let (n, g) = self.order[pos];
        (self.input.nodes[n].model, &mut self.nodes[n].gpus[g])
    }

    fn whole_gpu(&mut self, rep: (usize, u32), need: u64) -> bool {
        self.scan((0, need, ""), |s, pos| {
            let (m, u) = s.slot(pos);
            if m.memory_mib < need || u.is_used() {
                return false;
            }
            *u = GpuUse::Whole(rep);
            true
        })
    }

    fn mig(&mut self, rep: (usize, u32), model: &'static str, profile_id: u32) -> bool {
        let Some(table) = self.tables.get(model).cloned() else { return false };
        let Some(profile) = table.by_id(profile_id).cloned() else { return false };
        self.scan((1, u64::from(profile_id), model), |s, pos| {
            let occ = s.occ[pos];
            let (m, u) = s.slot(pos);
            if m.id != model || !matches!(u, GpuUse::Idle | GpuUse::Mig { .. }) {
                return false;
            }
            let Some(p) = profile.placements.iter().copied().find(|p| occ.check(&table, &profile, *p).is_ok()) else {
                return false;
            };
            match u {
                GpuUse::Mig { instances, replicas } => {
                    instances.push((profile_id, p));
                    replicas.push(Some(rep));
                }
                other => *other = GpuUse::Mig { instances: vec![(profile_id, p)], replicas: vec![Some(rep)] },
            }
            s.occ[pos].add(&profile, p);
            true
        })
    }

    fn mps(&mut self, rep: (usize, u32), need: u64) -> bool {
        for k in 0..self.mps_open.len() {
            let pos = self.mps_open[k];
            if let GpuUse::Mps { slot_mib, slots, clients } = self.slot(pos).1 {
                if *slot_mib >= need && (clients.len() as u32) < *slots {
                    clients.push(rep);
                    return true;
                }
            }
        }
        let mut opened = None;
        let ok = self.scan((3, need, ""), |s, pos| {
            let (m, u) = s.slot(pos);
            if m.memory_mib < 2 * need || u.is_used() {
                return false;
            }
            let slots = crate::mps::settings::model_limits(m).0.min((m.memory_mib / need) as u32);
            *u = GpuUse::Mps { slot_mib: need, slots, clients: vec![rep] };
            opened = Some(pos);
            true
        });
        if let Some(pos) = opened {
            let at = self.mps_open.partition_point(|&p| p < pos);
            self.mps_open.insert(at, pos);
        }
        ok
    }
}
