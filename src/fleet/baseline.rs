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

/// First-fit; with `whole`, every replica takes whole GPUs.
pub fn first_fit(input: &Input, choices: &[Choice], whole: bool) -> Baseline {
    let mut nodes = empty(input);
    let mut unplaced = Vec::new();
    for (di, (d, c)) in input.demand.iter().zip(choices).enumerate() {
        for r in 0..d.replicas {
            let rep = (di, r);
            let placed = match &c.target {
                Target::Dedicated { gpus } => dedicated(input, &mut nodes, rep, *gpus),
                _ if whole => whole_gpu(input, &mut nodes, rep, need_mib(c, input, di)),
                Target::Whole { need_mib } => whole_gpu(input, &mut nodes, rep, *need_mib),
                Target::Mig { model, profile_id, .. } => mig(input, &mut nodes, rep, model.id, *profile_id),
                Target::Mps { slot_mib } => mps(input, &mut nodes, rep, *slot_mib),
            };
            if !placed {
                miss(&mut unplaced, di);
            }
        }
    }
    Baseline { nodes, unplaced }
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

fn dedicated(input: &Input, nodes: &mut [PlannedNode], rep: (usize, u32), tp: u32) -> bool {
    let mem = input.demand[rep.0].memory_mib;
    for pn in nodes.iter_mut() {
        let n = &input.nodes[pn.node];
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

fn whole_gpu(input: &Input, nodes: &mut [PlannedNode], rep: (usize, u32), need: u64) -> bool {
    for pn in nodes.iter_mut() {
        if input.nodes[pn.node].model.memory_mib < need {
            continue;
        }
        if let Some(u) = pn.gpus.iter_mut().find(|u| !u.is_used()) {
            *u = GpuUse::Whole(rep);
            return true;
        }
    }
    false
}

fn mig(input: &Input, nodes: &mut [PlannedNode], rep: (usize, u32), model: &str, profile_id: u32) -> bool {
    for pn in nodes.iter_mut() {
        let m = input.nodes[pn.node].model;
        if m.id != model {
            continue;
        }
        let table = m.profile_table();
        let Some(profile) = table.by_id(profile_id) else { return false };
        for u in pn.gpus.iter_mut() {
            let (placed, reps) = match u {
                GpuUse::Idle => (Vec::new(), Vec::new()),
                GpuUse::Mig { instances, replicas } => (instances.clone(), replicas.clone()),
                _ => continue,
            };
            let occ = Occupancy::of(&table, placed.iter().copied());
            let spot = profile.placements.iter().copied().find(|p| occ.check(&table, profile, *p).is_ok());
            if let Some(p) = spot {
                let (mut instances, mut replicas) = (placed, reps);
                instances.push((profile_id, p));
                replicas.push(rep);
                *u = GpuUse::Mig { instances, replicas };
                return true;
            }
        }
    }
    false
}

fn mps(input: &Input, nodes: &mut [PlannedNode], rep: (usize, u32), need: u64) -> bool {
    for pn in nodes.iter_mut() {
        for u in pn.gpus.iter_mut() {
            if let GpuUse::Mps { slot_mib, slots, clients } = u {
                if *slot_mib >= need && (clients.len() as u32) < *slots {
                    clients.push(rep);
                    return true;
                }
            }
        }
    }
    for pn in nodes.iter_mut() {
        let m = input.nodes[pn.node].model;
        if m.memory_mib < 2 * need {
            continue;
        }
        if let Some(u) = pn.gpus.iter_mut().find(|u| !u.is_used()) {
            let slots = crate::mps::settings::model_limits(m).0.min((m.memory_mib / need) as u32);
            *u = GpuUse::Mps { slot_mib: need, slots, clients: vec![rep] };
            return true;
        }
    }
    false
}
