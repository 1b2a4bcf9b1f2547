//! mig-parted's checkpoint file (`checkpoint` / `restore`): the node's MIG state as JSON, in
//! mig-parted's own format so files move between the two tools, and the restore plan (pure): per
//! GPU the exact placements of the file, keeping every instance that already matches, never
//! destroying a busy one unless forced, and checked whole before anything changes.

use crate::layout::DesiredDevices;
use crate::mig::capacity::Occupancy;
use crate::mig::{Placement, ProfileTable};
use crate::observed::GpuState;
use crate::plan::search::Quality;
use crate::plan::{CreateGi, DestroyGi, KeepGi, Plan};
use crate::prepare::{Job, Target};
use serde::{Deserialize, Serialize};

/// The version mig-parted writes.
pub const VERSION: &str = "v1";

/// A checkpoint file: `{"Version":"v1","MigState":{"Devices":[…]}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Checkpoint {
    /// `v1`.
    pub version: String,
    /// The GPUs.
    pub mig_state: MigState,
}

/// Every GPU's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MigState {
    /// One entry per GPU (mig-parted writes `null` for none).
    #[serde(default, deserialize_with = "null_is_empty")]
    pub devices: Vec<DeviceState>,
}

/// One GPU, found again by its UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeviceState {
    /// `GPU-…`.
    #[serde(rename = "UUID")]
    pub uuid: String,
    /// 0 disabled, 1 enabled (mig-parted's `mig.Mode`).
    pub mig_mode: u32,
    /// Its GPU instances.
    #[serde(default, deserialize_with = "null_is_empty")]
    pub gpu_instances: Vec<GiCheckpoint>,
}

/// One GPU instance: NVML profile id, placement, compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GiCheckpoint {
    /// NVML GPU-instance profile id.
    #[serde(rename = "ProfileID")]
    pub profile_id: u32,
    /// Placement in memory slices.
    pub placement: PlacementJson,
    /// Its compute instances.
    #[serde(default, deserialize_with = "null_is_empty")]
    pub compute_instances: Vec<CiCheckpoint>,
}

/// NVML's placement as mig-parted writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PlacementJson {
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
}

/// One compute instance: NVML profile ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CiCheckpoint {
    /// NVML compute-instance profile id.
    #[serde(rename = "ProfileID")]
    pub profile_id: u32,
    /// NVML engine profile id (0: shared).
    #[serde(rename = "EngProfileID")]
    pub eng_profile_id: u32,
}

fn null_is_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// The checkpoint of `states`, instances in placement order.
pub fn of(states: &[GpuState]) -> Checkpoint {
    let devices = states
        .iter()
        .filter(|s| s.info.mig_capable)
        .map(|s| {
            let mut gis: Vec<_> = s.instances.iter().collect();
            gis.sort_by_key(|g| g.placement.start);
            DeviceState {
                uuid: s.info.uuid.clone(),
                mig_mode: u32::from(s.mig_mode.current),
                gpu_instances: gis
                    .iter()
                    .map(|g| GiCheckpoint {
                        profile_id: g.profile_id,
                        placement: PlacementJson { start: g.placement.start, size: g.placement.size },
                        compute_instances: g
                            .cis
                            .iter()
                            .map(|c| CiCheckpoint { profile_id: c.profile_id, eng_profile_id: 0 })
                            .collect(),
                    })
                    .collect(),
            }
        })
        .collect();
    Checkpoint { version: VERSION.into(), mig_state: MigState { devices } }
}

/// Parses a checkpoint file; the error names what is wrong.
pub fn parse(text: &str) -> Result<Checkpoint, String> {
    let c: Checkpoint = serde_json::from_str(text).map_err(|e| format!("not a mig-parted checkpoint: {e}"))?;
    if c.version != VERSION {
        return Err(format!("unknown checkpoint version '{}' (expected {VERSION})", c.version));
    }
    Ok(c)
}

/// A GPU instance's CI profile ids, sorted (what "the same instance" compares).
fn ci_profiles(cis: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = cis.collect();
    v.sort_unstable();
    v
}

/// The restore of one GPU to `want`: keeps what matches exactly, destroys the rest, creates the
/// missing instances at their recorded placements.
fn plan_gpu(s: &GpuState, want: &DeviceState, force: bool) -> Result<Plan, Vec<String>> {
    let at = format!("GPU {} ({}, {})", s.info.index, s.info.model, s.info.uuid);
    let table: &ProfileTable = &s.profiles;
    let mut problems = Vec::new();
    // The recorded instances must be legal together on this GPU.
    let mut occ = Occupancy::empty();
    let mut shapes = Vec::new();
    for g in &want.gpu_instances {
        let placement = Placement { start: g.placement.start, size: g.placement.size };
        let Some(profile) = table.by_id(g.profile_id) else {
            problems.push(format!("{at}: the checkpoint's GPU-instance profile {} does not exist here", g.profile_id));
            continue;
        };
        if let Err(e) = occ.check(table, profile, placement) {
            problems.push(format!("{at}: the checkpoint's {}@{} cannot be placed: {e}", profile.name, placement.start));
            continue;
        }
        occ.add(profile, placement);
        let keys = g.compute_instances.iter().map(|c| (g.profile_id, c.profile_id));
        let devices = DesiredDevices::from_keys(keys);
        match crate::plan::pack::pack(table, &devices.counts) {
            Some(mut one) if one.len() == 1 => shapes.push((profile, placement, one.remove(0).cis)),
            _ => problems.push(format!(
                "{at}: the checkpoint's compute instances do not fit one {}@{}",
                profile.name, placement.start
            )),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    // Exact matches stay; every other instance goes; the rest is created.
    let mut taken = vec![false; shapes.len()];
    let mut plan = Plan {
        keep: Vec::new(),
        reshape: Vec::new(),
        destroy: Vec::new(),
        create: Vec::new(),
        quality: Quality::of(table, &occ),
    };
    for g in &s.instances {
        let have = ci_profiles(g.cis.iter().map(|c| c.profile_id));
        let matched = shapes.iter().enumerate().position(|(k, (p, pl, cis))| {
            !taken[k] && p.id == g.profile_id && *pl == g.placement && ci_profiles(cis.iter().map(|c| c.0)) == have
        });
        let name =
            table.by_id(g.profile_id).map_or_else(|| format!("profile {}", g.profile_id), |p| p.name.to_string());
        match matched {
            Some(k) => {
                taken[k] = true;
                plan.keep.push(KeepGi { gi_id: g.id, name, placement: g.placement });
            }
            None => {
                let busy = g.busy();
                if busy && !force {
                    let pids: Vec<String> = g.all_processes().map(|p| p.pid.to_string()).collect();
                    let users = if pids.is_empty() { "pods".to_string() } else { format!("pids {}", pids.join(", ")) };
                    problems.push(format!(
                        "{at}: {name}@{} is in use ({users}) and the checkpoint does not hold it; not destroyed without --force",
                        g.placement.start
                    ));
                }
                plan.destroy.push(DestroyGi {
                    gi_id: g.id,
                    profile_id: g.profile_id,
                    name,
                    placement: g.placement,
                    ci_ids: g.cis.iter().map(|c| c.id).collect(),
                    busy,
                });
            }
        }
    }
    for ((profile, placement, cis), _) in shapes.into_iter().zip(&taken).filter(|(_, t)| !**t) {
        let device_names = cis.iter().map(|(ci, _)| profile.device_name(*ci).to_string()).collect::<Vec<_>>();
        plan.create.push(CreateGi {
            profile_id: profile.id,
            name: profile.name.to_string(),
            placement,
            cis,
            device_names,
        });
    }
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(problems)
    }
}

/// The jobs that bring every GPU of the checkpoint back (GPUs it does not name are left alone);
/// with `mode_only`, only the MIG modes. Every problem of every GPU, or nothing.
pub fn restore_jobs(
    states: &[GpuState],
    c: &Checkpoint,
    mode_only: bool,
    force: bool,
) -> Result<Vec<Job>, Vec<String>> {
    let mut problems = Vec::new();
    for d in &c.mig_state.devices {
        if !states.iter().any(|s| s.info.uuid == d.uuid) {
            problems.push(format!("the checkpoint's GPU {} is not on this node", d.uuid));
        }
    }
    let mut jobs = Vec::new();
    for s in states {
        let Some(want) = c.mig_state.devices.iter().find(|d| d.uuid == s.info.uuid) else {
            let reason = "not in the checkpoint".to_string();
            jobs.push(Job { state: s.clone(), target: Target::Leave { reason }, mode_change: None, plan: None });
            continue;
        };
        let enabled = want.mig_mode == 1;
        if enabled && !s.info.mig_capable {
            problems.push(format!(
                "GPU {} ({}): the checkpoint enables MIG, which it does not support",
                s.info.index, s.info.model
            ));
            continue;
        }
        let mode_change = (s.mig_mode.current != enabled || s.mig_mode.pending != enabled).then_some(enabled);
        let wanted = if enabled { want.gpu_instances.clone() } else { Vec::new() };
        let target = if enabled {
            let keys = wanted.iter().flat_map(|g| g.compute_instances.iter().map(|c| (g.profile_id, c.profile_id)));
            Target::MigEnabled { devices: DesiredDevices::from_keys(keys) }
        } else {
            Target::MigDisabled { mps: None }
        };
        let plan = if mode_only || (!enabled && s.instances.is_empty()) {
            None
        } else {
            let want = DeviceState { gpu_instances: wanted, ..want.clone() };
            match plan_gpu(s, &want, force) {
                Ok(p) => Some(p),
                Err(p) => {
                    problems.extend(p);
                    continue;
                }
            }
        };
        jobs.push(Job { state: s.clone(), target, mode_change, plan });
    }
    if problems.is_empty() {
        Ok(jobs)
    } else {
        Err(problems)
    }
}
