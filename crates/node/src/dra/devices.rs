//! The devices of a node as DRA sees them: every MIG profile × legal placement of a MIG-capable
//! GPU, every whole GPU, and on a GPU without MIG its MPS device (shared by several claims);
//! their names (`gpu-<index>`, `gpu-<index>-mps` and
//! `gpu-<index>-mig-<profile>-<profile id>-<start>`, DNS labels) and the counters they consume
//! from their GPU's counter set (`memory-slice-<i>` = 1 each, plus the capacities; on a GPU
//! without MIG, its `memory`).

use crate::mig::capacity::Occupancy;
use crate::mig::{GiProfile, Placement, ProfileTable};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One device: a whole GPU or a MIG placement on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum DeviceKind {
    /// The whole GPU (MIG mode off).
    Gpu,
    /// A share of the GPU through its MPS daemon: one published device that several claims are
    /// allocated, each taking part of its capacity.
    Mps,
    /// A GPU instance of `profile_id` at `placement` (with one compute instance filling it).
    Mig {
        /// GI profile id.
        profile_id: u32,
        /// Memory-slice placement.
        placement: Placement,
    },
}

/// A device of the node: which GPU (NVML index) and what of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceRef {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// What of the GPU.
    pub kind: DeviceKind,
}

/// `1g.10gb+me` as a DNS label part: `1g-10gb-me`.
fn label_part(profile: &str) -> String {
    profile.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

impl DeviceRef {
    /// The device's name in the ResourceSlice (needs the GPU's profile table for MIG devices).
    pub fn name(&self, table: &ProfileTable) -> String {
        match self.kind {
            DeviceKind::Gpu => format!("gpu-{}", self.gpu),
            DeviceKind::Mps => format!("gpu-{}-mps", self.gpu),
            DeviceKind::Mig { profile_id, placement } => {
                let profile = table.by_id(profile_id).map_or_else(|| format!("p{profile_id}"), |p| p.name.to_string());
                format!("gpu-{}-mig-{}-{profile_id}-{}", self.gpu, label_part(&profile), placement.start)
            }
        }
    }

    /// Reads a device name back; a MIG device's size comes from the GPU's profile table.
    pub fn parse<'a>(name: &str, table_of: impl Fn(u32) -> Option<&'a ProfileTable>) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        let (gpu, rest) = rest.split_once('-').map_or((rest, None), |(g, r)| (g, Some(r)));
        let gpu: u32 = gpu.parse().ok()?;
        let Some(rest) = rest else { return Some(Self { gpu, kind: DeviceKind::Gpu }) };
        if rest == "mps" {
            return Some(Self { gpu, kind: DeviceKind::Mps });
        }
        let rest = rest.strip_prefix("mig-")?;
        let mut parts = rest.rsplitn(3, '-');
        let start: u32 = parts.next()?.parse().ok()?;
        let profile_id: u32 = parts.next()?.parse().ok()?;
        let label = parts.next()?;
        let table = table_of(gpu)?;
        let profile = table.by_id(profile_id)?;
        let placement = Placement::new(start, profile.memory_slices);
        let legal = label_part(&profile.name.to_string()) == label && profile.placements.contains(&placement);
        legal.then_some(Self { gpu, kind: DeviceKind::Mig { profile_id, placement } })
    }
}

/// Every device GPU `gpu` could have: each placement of each profile of `table`, then the whole
/// GPU, then (a GPU without MIG profiles) its MPS device.
pub fn every_device(gpu: u32, table: &ProfileTable) -> Vec<DeviceRef> {
    let mut out: Vec<DeviceRef> = table
        .profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(move |&placement| DeviceKind::Mig { profile_id: p.id, placement }))
        .map(|kind| DeviceRef { gpu, kind })
        .collect();
    out.push(DeviceRef { gpu, kind: DeviceKind::Gpu });
    if table.profiles.is_empty() {
        out.push(DeviceRef { gpu, kind: DeviceKind::Mps });
    }
    out
}

/// Whether a GPU has an MPS device: one without MIG profiles always, a MIG-capable one when
/// `on_mig_gpus` (`--dra-mps-on-mig-gpus`).
pub fn has_mps_device(info: &crate::observed::GpuInfo, table: &ProfileTable, on_mig_gpus: bool) -> bool {
    !info.mig_capable || table.profiles.is_empty() || on_mig_gpus
}

/// The counter set of a GPU without MIG: its memory, which the whole GPU and its MPS device each
/// consume entirely, so the scheduler hands the GPU out whole or as MPS shares, never both.
pub fn whole_counters(memory_bytes: u64) -> Capacities {
    [("memory".to_string(), memory_bytes)].into_iter().collect()
}

/// The capacities a device consumes and a GPU's counter set holds, by counter name (NVIDIA's
/// names: `memory` in bytes, `multiprocessors`, `copy-engines`, `decoders`, `encoders`,
/// `jpeg-engines`, `ofa-engines`).
pub type Capacities = BTreeMap<String, u64>;

const MIB: u64 = 1024 * 1024;

/// What one instance of `p` consumes, memory slices aside.
pub fn profile_capacities(p: &GiProfile) -> Capacities {
    let e = p.engines;
    [
        ("memory", p.memory_mib * MIB),
        ("multiprocessors", u64::from(p.multiprocessors)),
        ("copy-engines", u64::from(e.copy_engines)),
        ("decoders", u64::from(e.decoders)),
        ("encoders", u64::from(e.encoders)),
        ("jpeg-engines", u64::from(e.jpeg)),
        ("ofa-engines", u64::from(e.ofa)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The name of memory slice `i`'s counter.
pub fn memory_slice(i: u32) -> String {
    format!("memory-slice-{i}")
}

/// A MIG GPU's counter set: one counter per memory slice and, per capacity, the most any set of
/// instances the GPU can hold at once consumes (so the counters never refuse what the GPU could
/// create, and refuse what exceeds its compute slices or media engines).
pub fn gpu_counters(table: &ProfileTable) -> Capacities {
    let options: Vec<(&GiProfile, Placement)> =
        table.profiles.iter().flat_map(|p| p.placements.iter().map(move |&pl| (p, pl))).collect();
    let mut best = Capacities::new();
    let mut sum = Capacities::new();
    most(table, &options, &mut Occupancy::empty(), 0, &mut sum, &mut best);
    for i in 0..table.memory_slices {
        best.insert(memory_slice(i), 1);
    }
    best
}

/// Raises `best` to `sum` and to every feasible extension of the current set by `options[from..]`.
fn most(
    table: &ProfileTable,
    options: &[(&GiProfile, Placement)],
    occ: &mut Occupancy,
    from: usize,
    sum: &mut Capacities,
    best: &mut Capacities,
) {
    for (k, v) in sum.iter() {
        let e = best.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
    for (i, &(p, pl)) in options.iter().enumerate().skip(from) {
        if occ.can_add(table, p, pl) {
            let saved = *occ;
            occ.add(p, pl);
            let caps = profile_capacities(p);
            for (k, v) in &caps {
                *sum.entry(k.clone()).or_default() += v;
            }
            most(table, options, occ, i + 1, sum, best);
            for (k, v) in &caps {
                *sum.entry(k.clone()).or_default() -= v;
            }
            *occ = saved;
        }
    }
}

/// What a device consumes from its GPU's counter set (`counters`: [`gpu_counters`] of the GPU;
/// a whole GPU and an MPS device consume all of it: the scheduler counts an MPS device's
/// counters once, while any share of it is allocated).
pub fn consumption(kind: DeviceKind, table: &ProfileTable, counters: &Capacities) -> Capacities {
    match kind {
        DeviceKind::Gpu | DeviceKind::Mps => counters.clone(),
        DeviceKind::Mig { profile_id, placement } => {
            let mut c = table.by_id(profile_id).map(profile_capacities).unwrap_or_default();
            for i in placement.start..placement.end() {
                c.insert(memory_slice(i), 1);
            }
            c
        }
    }
}

/// The GPU instances no claim holds, by GPU index (their placement starts): made by hand or by
/// another tool, never touched by the driver and never offered.
pub fn foreign(states: &[crate::observed::GpuState], claimed: &[DeviceRef]) -> BTreeMap<u32, Vec<u32>> {
    let held = |gpu: u32, at: Placement| {
        claimed.iter().any(|d| d.gpu == gpu && matches!(d.kind, DeviceKind::Mig { placement, .. } if placement == at))
    };
    states
        .iter()
        .filter_map(|s| {
            let starts: Vec<u32> =
                s.instances.iter().filter(|g| !held(s.info.index, g.placement)).map(|g| g.placement.start).collect();
            (!starts.is_empty()).then_some((s.info.index, starts))
        })
        .collect()
}
