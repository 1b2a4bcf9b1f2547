//! Pool choice per model (pure): dedicated whole nodes for tensor-parallel models, the smallest
//! fitting MIG profile for small ones, MPS slots where asked or where no GPU has MIG, whole GPUs
//! for what no profile holds. Every choice carries its reason.

use super::input::{Demand, Input, InputError, Node, Sharing};
use crate::mig::catalog::Model;
use crate::mig::ProfileName;

/// The node pools of a plan (the `gpu-pool` label's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// Whole nodes for one tensor-parallel model, tainted.
    Dedicated,
    /// Whole GPUs, one per replica.
    Standard,
    /// MIG instances.
    Shared,
    /// MPS client slots on GPUs without MIG.
    Mps,
}

impl Pool {
    /// The `gpu-pool` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Dedicated => crate::pools::DEFAULT_DEDICATED_POOL,
            Pool::Standard => "standard",
            Pool::Shared => crate::pools::DEFAULT_SHARED_POOL,
            Pool::Mps => "mps",
        }
    }
}

/// Where one model's replicas go.
#[derive(Debug, Clone)]
pub enum Target {
    /// `gpus` whole GPUs per replica, all on one dedicated node.
    Dedicated {
        /// GPUs per replica.
        gpus: u32,
    },
    /// One whole GPU per replica with at least `need_mib` memory.
    Whole {
        /// Memory a replica needs (0 when not given).
        need_mib: u64,
    },
    /// One MIG instance per replica.
    Mig {
        /// The GPU model the instances go on.
        model: &'static Model,
        /// GI profile id on that model.
        profile_id: u32,
        /// Its name.
        profile: ProfileName,
    },
    /// One MPS client slot per replica.
    Mps {
        /// The slot's pinned memory in MiB.
        slot_mib: u64,
    },
}

/// A model's pool, target and reason.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The pool.
    pub pool: Pool,
    /// What one replica takes.
    pub target: Target,
    /// Why, in one sentence.
    pub reason: String,
}

/// `39.25 GiB`.
pub fn gib(mib: u64) -> String {
    let g = mib as f64 / 1024.0;
    if (g - g.round()).abs() < 1e-9 {
        format!("{g:.0} GiB")
    } else {
        format!("{g:.2} GiB")
    }
}

/// Distinct GPU models of the fleet, in first-seen order, with their GPU counts.
pub fn fleet_models(nodes: &[Node]) -> Vec<(&'static Model, u32)> {
    let mut out: Vec<(&'static Model, u32)> = Vec::new();
    for n in nodes {
        match out.iter_mut().find(|(m, _)| m.id == n.model.id) {
            Some((_, c)) => *c += n.gpus,
            None => out.push((n.model, n.gpus)),
        }
    }
    out
}

/// Chooses every model's pool; `headroom_pct` is added to a memory need before a MIG profile is
/// picked.
pub fn choose(input: &Input, headroom_pct: u32) -> Result<Vec<Choice>, InputError> {
    let models = fleet_models(&input.nodes);
    if models.is_empty() {
        return Err(error("key 'fleet'", "", "has no nodes".into()));
    }
    input
        .demand
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let at = format!("demand[{i}] '{}'", d.name);
            choose_one(&at, d, &input.nodes, &models, headroom_pct)
        })
        .collect()
}

fn error(at: &str, key: &str, message: String) -> InputError {
    InputError { at: if key.is_empty() { at.to_string() } else { format!("{at}, key '{key}'") }, message }
}

/// Where MPS slots of `mem` MiB go, for the reason: GPUs without MIG that hold two slots, or
/// MIG-capable GPUs with MIG turned off when none does.
fn mps_gpus(models: &[(&'static Model, u32)], mem: u64) -> String {
    let names = |mig: bool| -> Vec<&str> {
        models.iter().filter(|(m, _)| m.mig_capable() == mig && m.memory_mib >= 2 * mem).map(|(m, _)| m.id).collect()
    };
    let plain = names(false);
    if !plain.is_empty() {
        let spill = if names(true).is_empty() { "" } else { "; MIG GPUs with MIG off only once those are full" };
        return format!("on GPUs without MIG ({}){spill}", plain.join(", "));
    }
    let mig = names(true);
    if mig.is_empty() {
        return String::new();
    }
    let without: Vec<&str> = models.iter().filter(|(m, _)| !m.mig_capable()).map(|(m, _)| m.id).collect();
    let why = if without.is_empty() {
        "the fleet has no GPU without MIG".to_string()
    } else {
        format!("no GPU without MIG holds two of them ({})", without.join(", "))
    };
    format!("on {} with MIG turned off: {why}", mig.join(", "))
}

/// The fleet's GPU model with the most memory (`models` is never empty here).
fn largest_gpu(models: &[(&'static Model, u32)]) -> Option<&'static Model> {
    models.iter().map(|(m, _)| *m).max_by_key(|m| m.memory_mib)
}

fn choose_one(
    at: &str,
    d: &Demand,
    nodes: &[Node],
    models: &[(&'static Model, u32)],
    headroom: u32,
) -> Result<Choice, InputError> {
    if d.gpus > 1 {
        return dedicated(at, d, nodes);
    }
    if let Some(profile) = &d.profile {
        return explicit_profile(at, d, profile, models);
    }
    let Some(largest) = largest_gpu(models) else {
        return Err(error(at, "", "the fleet has no nodes".into()));
    };
    if d.sharing == Some(Sharing::Whole) || d.memory_mib.is_none() {
        return whole(at, d, largest, "asked for whole GPUs".into());
    }
    let mem = d.memory_mib.unwrap_or(0);
    if d.sharing == Some(Sharing::Mps) {
        let on = mps_gpus(models, mem);
        return mps(at, mem, largest, format!("asked for MPS: slots of {} {on}", gib(mem)));
    }
    let need = mem + (mem * u64::from(headroom)).div_ceil(100);
    let mig: Vec<&'static Model> = models.iter().map(|(m, _)| *m).filter(|m| m.mig_capable()).collect();
    if mig.is_empty() {
        if d.sharing == Some(Sharing::Mig) {
            return Err(error(at, "sharing", "asked for MIG but no GPU of the fleet has MIG".into()));
        }
        return mps(at, mem, largest, format!("no MIG GPU in the fleet: MPS slots of {}", gib(mem)));
    }
    let count = |m: &Model| models.iter().find(|(x, _)| x.id == m.id).map_or(0, |(_, c)| *c);
    let best = mig
        .iter()
        .filter_map(|m| {
            let t = m.profile_table();
            let p = t
                .profiles
                .iter()
                .filter(|p| p.name.suffix.is_empty() && p.memory_mib >= need)
                .min_by_key(|p| (p.memory_mib, p.slices, p.memory_slices))?;
            Some((*m, p.id, p.name.clone(), p.memory_mib))
        })
        .min_by_key(|(m, _, _, mib)| (*mib, std::cmp::Reverse(count(m))));
    match best {
        Some((model, profile_id, profile, mib)) => Ok(Choice {
            pool: Pool::Shared,
            reason: format!(
                "needs {} (+{headroom}% headroom = {}): {profile} ({}) is the smallest MIG profile that holds it on {}",
                gib(mem),
                gib(need),
                gib(mib),
                model.id
            ),
            target: Target::Mig { model, profile_id, profile },
        }),
        None if d.sharing == Some(Sharing::Mig) => {
            Err(error(at, "memory", format!("needs {} with headroom; no MIG profile of the fleet holds it", gib(need))))
        }
        None => {
            let biggest = mig.iter().flat_map(|m| m.profile_table().profiles).max_by_key(|p| p.memory_mib);
            let what = biggest.map_or_else(String::new, |p| format!(" ({}, {})", p.name, gib(p.memory_mib)));
            whole(at, d, largest, format!("needs {}: more than the largest MIG profile{what}: a whole GPU", gib(need)))
        }
    }
}

fn dedicated(at: &str, d: &Demand, nodes: &[Node]) -> Result<Choice, InputError> {
    let fits = |n: &Node| n.gpus >= d.gpus && d.memory_mib.is_none_or(|m| n.model.memory_mib * u64::from(d.gpus) >= m);
    if !nodes.iter().any(fits) {
        let most = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
        let mem = d.memory_mib.map_or_else(String::new, |m| format!(" holding {}", gib(m)));
        return Err(error(
            at,
            "gpus",
            format!("needs {} GPUs on one node{mem}; no node of the fleet has them (the largest has {most})", d.gpus),
        ));
    }
    Ok(Choice {
        pool: Pool::Dedicated,
        target: Target::Dedicated { gpus: d.gpus },
        reason: format!("needs {} GPUs per replica (tensor parallel): whole GPUs on a dedicated node", d.gpus),
    })
}

fn whole(at: &str, d: &Demand, largest: &'static Model, reason: String) -> Result<Choice, InputError> {
    let need = d.memory_mib.unwrap_or(0);
    if need > largest.memory_mib {
        return Err(error(
            at,
            "memory",
            format!(
                "no GPU of the fleet holds {} (the largest, {}, has {})",
                gib(need),
                largest.id,
                gib(largest.memory_mib)
            ),
        ));
    }
    Ok(Choice { pool: Pool::Standard, target: Target::Whole { need_mib: need }, reason })
}

fn mps(at: &str, mem: u64, largest: &'static Model, reason: String) -> Result<Choice, InputError> {
    if mem > largest.memory_mib {
        return Err(error(
            at,
            "memory",
            format!(
                "no GPU of the fleet holds {} (the largest, {}, has {})",
                gib(mem),
                largest.id,
                gib(largest.memory_mib)
            ),
        ));
    }
    if 2 * mem > largest.memory_mib {
        return Ok(Choice {
            pool: Pool::Standard,
            target: Target::Whole { need_mib: mem },
            reason: format!("an MPS slot of {} needs more than half of every GPU: a whole GPU instead", gib(mem)),
        });
    }
    Ok(Choice { pool: Pool::Mps, target: Target::Mps { slot_mib: mem }, reason })
}

fn explicit_profile(
    at: &str,
    d: &Demand,
    profile: &ProfileName,
    models: &[(&'static Model, u32)],
) -> Result<Choice, InputError> {
    let candidates: Vec<(&'static Model, u32, u32, u64)> = models
        .iter()
        .filter_map(|(m, count)| {
            let t = m.profile_table();
            let p = t.profiles.iter().find(|p| &p.name == profile)?;
            Some((*m, *count, p.id, p.memory_mib))
        })
        .collect();
    let Some(&(model, _, profile_id, mib)) = candidates.iter().max_by_key(|(_, c, _, _)| *c) else {
        let known: Vec<String> = models
            .iter()
            .filter(|(m, _)| m.mig_capable())
            .map(|(m, _)| format!("{}: {}", m.id, m.profile_table().device_names().join(" ")))
            .collect();
        let known = if known.is_empty() { "no GPU of the fleet has MIG".to_string() } else { known.join("; ") };
        return Err(error(at, "profile", format!("no GPU of the fleet has profile {profile} ({known})")));
    };
    if let Some(mem) = d.memory_mib.filter(|m| *m > mib) {
        return Err(error(at, "memory", format!("{} does not fit {profile} ({})", gib(mem), gib(mib))));
    }
    Ok(Choice {
        pool: Pool::Shared,
        target: Target::Mig { model, profile_id, profile: profile.clone() },
        reason: format!("asked for {profile} ({} on {})", gib(mib), model.id),
    })
}
