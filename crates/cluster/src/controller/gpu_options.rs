//! The ways one GPU can be set to serve wanted resources (pure): its current setting, every MIG
//! layout that keeps its busy instances and adds a wanted profile (costed by the node planner the
//! agent runs, so "destroyed" is what the agent will destroy), MIG off for a whole GPU, and an MPS
//! daemon. A GPU in use without MIG keeps its setting.

use super::pods::Resource;
use crate::fleet::current::CurrentGpu;
use crate::fleet::report::GpuSpec;
use crate::layout::DesiredDevices;
use crate::mig::capacity::Occupancy;
use crate::mig::catalog::Model;
use crate::mig::{Placement, ProfileName, ProfileTable};
use crate::observed::{GiState, Process};
use gpupart_node::frag::expected_fragmentation;
use std::collections::{BTreeMap, BTreeSet};

/// Units of each resource.
pub type Counts = BTreeMap<Resource, u32>;

/// One way to set a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuOption {
    /// What the config says for it.
    pub spec: GpuSpec,
    /// What it offers once applied.
    pub offers: Counts,
    /// GPU instances (or an MPS daemon) torn down.
    pub destroyed: u32,
    /// GPU instances created.
    pub created: u32,
    /// Expected fragmentation of its free MIG space afterwards, in memory slices.
    pub frag: f64,
    /// The change in words (`+2 1g.10gb`, `-1 3g.40gb`, `MIG off`); empty for the current setting.
    pub change: Vec<String>,
}

/// What the GPU offers as it is (nothing while it is unhealthy).
pub fn current_offers(gpu: &CurrentGpu) -> Counts {
    let mut c = Counts::new();
    if gpu.unhealthy.is_some() {
        return c;
    }
    if gpu.mig {
        for i in &gpu.instances {
            *c.entry(Resource::Mig(i.profile.clone())).or_default() += 1;
        }
    } else if let Some(s) = gpu.mps_slots {
        c.insert(Resource::Mps, s);
    } else {
        c.insert(Resource::Gpu, 1);
    }
    c
}

/// The GPU's current setting as a config spec (from what the agent reports).
pub fn observed_spec(gpu: &CurrentGpu) -> GpuSpec {
    if gpu.mig {
        GpuSpec::Mig(mig_counts(gpu.instances.iter().map(|i| &i.profile)))
    } else if let Some(slots) = gpu.mps_slots {
        GpuSpec::Mps { slots, limit_mib: None }
    } else {
        GpuSpec::Off
    }
}

fn mig_counts<'a>(names: impl Iterator<Item = &'a ProfileName>) -> Vec<(String, u32)> {
    let mut m: BTreeMap<String, u32> = BTreeMap::new();
    for n in names {
        *m.entry(n.to_string()).or_default() += 1;
    }
    m.into_iter().collect()
}

/// Today's GPU instances as the node planner takes them (busy ones hold a process).
fn gi_states(table: &ProfileTable, gpu: &CurrentGpu) -> Result<Vec<GiState>, String> {
    gpu.instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let p = table.profiles.iter().find(|p| p.name == i.profile).ok_or_else(|| {
                format!("GPU {}: {} is not a GPU-instance profile of its model", gpu.index, i.profile)
            })?;
            let placement = p
                .placements
                .iter()
                .copied()
                .find(|pl| pl.start == i.start)
                .unwrap_or(Placement::new(i.start, p.memory_slices));
            let mut g = GiState::with_full_ci(table, k as u32 + 1, p.id, placement)
                .ok_or_else(|| format!("GPU {}: {} has no full compute instance", gpu.index, i.profile))?;
            if i.busy {
                g.processes.push(Process { pid: 0, name: "in use".into(), used_memory_mib: 0 });
            }
            Ok(g)
        })
        .collect()
}

fn words(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) -> Vec<String> {
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let mut plus = Vec::new();
    let mut minus = Vec::new();
    for n in names {
        let (b, a) = (before.get(n).copied().unwrap_or(0), after.get(n).copied().unwrap_or(0));
        if a > b {
            plus.push(format!("+{} {n}", a - b));
        } else if b > a {
            minus.push(format!("-{} {n}", b - a));
        }
    }
    plus.extend(minus);
    plus
}

/// Every multiset of `profiles` with counts in `lo..=hi` whose memory fits the GPU.
fn multisets(table: &ProfileTable, profiles: &[(u32, u32, u32, u32)]) -> Vec<Vec<u32>> {
    fn walk(
        t: &ProfileTable,
        ps: &[(u32, u32, u32, u32)],
        k: usize,
        used: u32,
        cur: &mut Vec<u32>,
        out: &mut Vec<Vec<u32>>,
    ) {
        if k == ps.len() {
            out.push(cur.clone());
            return;
        }
        let (_, slices, lo, hi) = ps[k];
        for n in lo..=hi {
            let u = used + n * slices;
            if u > t.memory_slices {
                break;
            }
            cur.push(n);
            walk(t, ps, k + 1, u, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    walk(table, profiles, 0, 0, &mut Vec::new(), &mut out);
    out
}

/// The GPU's options for the `wanted` resources: first its current setting, then each change.
/// `mps_replicas`: slots of an MPS daemon the controller starts.
pub fn options(
    model: &Model,
    gpu: &CurrentGpu,
    current: GpuSpec,
    wanted: &BTreeSet<Resource>,
    mps_replicas: u32,
) -> Result<Vec<GpuOption>, String> {
    let table = model.profile_table();
    let today = current_offers(gpu);
    let frag_of = |occ: &Occupancy| expected_fragmentation(&table, occ, None);
    let instances = if gpu.mig { gi_states(&table, gpu)? } else { Vec::new() };
    let occ_today = Occupancy::of(&table, instances.iter().map(|g| (g.profile_id, g.placement)));
    let mut out = vec![GpuOption {
        spec: current,
        offers: today.clone(),
        destroyed: 0,
        created: 0,
        frag: if gpu.mig { frag_of(&occ_today) } else { 0.0 },
        change: Vec::new(),
    }];
    // An unhealthy GPU stays as it is; a GPU in use without MIG keeps its setting.
    if gpu.unhealthy.is_some() || (gpu.any_busy() && !gpu.mig) {
        return Ok(out);
    }
    let before: BTreeMap<String, u32> = mig_counts(gpu.instances.iter().map(|i| &i.profile)).into_iter().collect();
    let teardown = if gpu.mig { gpu.instances.len() as u32 } else { u32::from(gpu.mps_slots.is_some()) };
    let wholly_idle = !gpu.any_busy();
    if wholly_idle && wanted.contains(&Resource::Gpu) && (gpu.mig || gpu.mps_slots.is_some()) {
        let mut change = vec!["MIG off".to_string()];
        if !gpu.mig {
            change = vec!["MPS off".into()];
        }
        out.push(GpuOption {
            spec: GpuSpec::Off,
            offers: Counts::from([(Resource::Gpu, 1)]),
            destroyed: teardown,
            created: 0,
            frag: 0.0,
            change,
        });
    }
    if wholly_idle && wanted.contains(&Resource::Mps) && gpu.mps_slots.is_none() && mps_replicas >= 2 {
        out.push(GpuOption {
            spec: GpuSpec::Mps { slots: mps_replicas, limit_mib: None },
            offers: Counts::from([(Resource::Mps, mps_replicas)]),
            destroyed: teardown,
            created: 0,
            frag: 0.0,
            change: vec![format!("MPS with {mps_replicas} slots")],
        });
    }
    let want_mig: BTreeSet<&ProfileName> =
        wanted.iter().filter_map(|r| if let Resource::Mig(p) = r { Some(p) } else { None }).collect();
    if !model.mig_capable() || (!gpu.mig && !wholly_idle) || want_mig.is_empty() {
        return Ok(out);
    }
    // Axes: profiles present today (up to today's count) and wanted ones this model has.
    let mut axes: Vec<(u32, u32, u32, u32)> = Vec::new();
    let mut names: Vec<ProfileName> = Vec::new();
    for p in &table.profiles {
        let present = gpu.instances.iter().filter(|i| i.profile == p.name).count() as u32;
        let busy = gpu.instances.iter().filter(|i| i.profile == p.name && i.busy).count() as u32;
        let wanted_here = want_mig.contains(&p.name);
        if present == 0 && !wanted_here {
            continue;
        }
        let hi = if wanted_here { p.instance_count.max(present) } else { present };
        axes.push((p.id, p.memory_slices, busy, hi));
        names.push(p.name.clone());
    }
    for counts in multisets(&table, &axes) {
        let after: BTreeMap<String, u32> =
            names.iter().zip(&counts).filter(|(_, n)| **n > 0).map(|(p, n)| (p.to_string(), *n)).collect();
        let adds_wanted = names
            .iter()
            .zip(&counts)
            .any(|(p, n)| want_mig.contains(p) && *n > before.get(&p.to_string()).copied().unwrap_or(0));
        if !adds_wanted || (gpu.mig && after == before) {
            continue;
        }
        let devices: Vec<(ProfileName, u32)> = names.iter().cloned().zip(counts.iter().copied()).collect();
        let Ok(desired) = DesiredDevices::resolve(&table, &devices) else { continue };
        let Ok(plan) = crate::plan::plan(&table, &instances, &desired, false) else { continue };
        let placed = plan
            .keep
            .iter()
            .map(|k| (k.name.clone(), k.placement))
            .chain(plan.reshape.iter().map(|r| (r.name.clone(), r.placement)))
            .chain(plan.create.iter().map(|c| (c.name.clone(), c.placement)));
        let ids =
            placed.filter_map(|(n, pl)| table.profiles.iter().find(|p| p.name.to_string() == n).map(|p| (p.id, pl)));
        let occ = Occupancy::of(&table, ids);
        let mut offers = Counts::new();
        for (p, n) in names.iter().zip(&counts).filter(|(_, n)| **n > 0) {
            offers.insert(Resource::Mig(p.clone()), *n);
        }
        let mut change = words(&before, &after);
        if !gpu.mig {
            change.insert(0, "MIG on".into());
        }
        out.push(GpuOption {
            spec: GpuSpec::Mig(after.into_iter().collect()),
            offers,
            destroyed: plan.destroy.len() as u32 + u32::from(gpu.mps_slots.is_some()),
            created: plan.create.len() as u32,
            frag: frag_of(&occ),
            change,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::current::from_annotation;

    fn gpu(item: &str) -> CurrentGpu {
        from_annotation("n", &format!("[{item}]")).unwrap().remove(0)
    }

    fn a100() -> &'static Model {
        crate::mig::catalog::lookup("A100-SXM4-80GB").unwrap()
    }

    fn wanted(p: &str) -> BTreeSet<Resource> {
        BTreeSet::from([Resource::Mig(p.parse().unwrap())])
    }

    #[test]
    fn busy_instances_stay_and_destroyed_counts_what_the_agent_destroys() {
        let g = gpu(r#"{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["3g.40gb@0*","3g.40gb@4"]}"#);
        let opts = options(a100(), &g, observed_spec(&g), &wanted("1g.10gb"), 4).unwrap();
        assert_eq!(opts[0].change, Vec::<String>::new());
        // Every change keeps the busy 3g.40gb at 0.
        assert!(opts[1..].iter().all(|o| o.offers.get(&Resource::Mig("3g.40gb".parse().unwrap())) >= Some(&1)));
        let one_g = Resource::Mig("1g.10gb".parse().unwrap());
        let most = opts.iter().filter_map(|o| o.offers.get(&one_g)).max().copied();
        assert_eq!(most, Some(3), "slices 4..6 take 1g.10gb, slice 7 does not");
        let best = opts.iter().filter(|o| o.offers.get(&one_g) == Some(&3)).min_by_key(|o| o.destroyed).unwrap();
        assert_eq!(best.destroyed, 1, "{best:?}");
        assert_eq!(best.change, vec!["+3 1g.10gb", "-1 3g.40gb"]);
        // Nothing that tears the busy one down is offered, nor MIG off.
        assert!(opts.iter().all(|o| o.spec != GpuSpec::Off));
        // Adding into free space destroys nothing.
        let g = gpu(r#"{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["3g.40gb@0*"]}"#);
        let opts = options(a100(), &g, observed_spec(&g), &wanted("1g.10gb"), 4).unwrap();
        assert!(opts.iter().any(|o| o.destroyed == 0 && o.change == vec!["+3 1g.10gb"]), "{opts:#?}");
    }

    #[test]
    fn whole_gpu_and_mps_options_need_a_wholly_idle_gpu() {
        let idle = gpu(r#"{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["3g.40gb@0","3g.40gb@4"]}"#);
        let want = BTreeSet::from([Resource::Gpu, Resource::Mps]);
        let opts = options(a100(), &idle, observed_spec(&idle), &want, 4).unwrap();
        let off = opts.iter().find(|o| o.spec == GpuSpec::Off).unwrap();
        assert_eq!((off.destroyed, off.offers.get(&Resource::Gpu)), (2, Some(&1)));
        assert!(opts.iter().any(|o| matches!(o.spec, GpuSpec::Mps { slots: 4, .. })));
        let busy = gpu(r#"{"i":0,"model":"L4-24GB","mode":"none","busy":true}"#);
        let l4 = crate::mig::catalog::lookup("L4-24GB").unwrap();
        assert_eq!(options(l4, &busy, observed_spec(&busy), &want, 4).unwrap().len(), 1);
        let free = gpu(r#"{"i":0,"model":"A100-SXM4-80GB","mode":"none","busy":false}"#);
        let opts = options(a100(), &free, observed_spec(&free), &wanted("3g.40gb"), 4).unwrap();
        assert!(opts.iter().any(|o| o.change == vec!["MIG on", "+2 3g.40gb"] && o.destroyed == 0), "{opts:#?}");
    }
}
