//! What a node publishes for each device (pure): NVIDIA-compatible attributes, the `memory`
//! capacity, and the counters it consumes from its GPU's counter set, so a claim written for
//! NVIDIA's driver ports by changing the driver name. A GPU without MIG is published twice: whole
//! (`sharing: none`) and as its MPS device (`sharing: mps`), which allows multiple allocations and
//! whose `memory` and `clients` each claim takes a share of. Both consume the GPU's whole counter
//! set, so the scheduler hands the GPU out either way, never both at once.

use super::devices::{consumption, gpu_counters, whole_counters, Capacities, DeviceKind, DeviceRef};
use super::slices::{
    layout, Attribute, Capacity, Consumption, CounterSet, Device, DeviceTaint, Quantity, RequestPolicy, Slice,
    ValidRange,
};
use crate::mig::{catalog, ProfileTable};
use crate::observed::{GpuInfo, GpuState};
use std::collections::{BTreeMap, HashMap};

/// One GPU as the publisher sees it.
#[derive(Debug, Clone)]
pub struct PublishedGpu {
    /// What NVML reports of it.
    pub info: GpuInfo,
    /// Its MIG profiles (empty without MIG).
    pub table: ProfileTable,
    /// Its counter set's values ([`super::devices::gpu_counters`]; without MIG,
    /// [`super::devices::whole_counters`]).
    pub counters: Capacities,
    /// The NVIDIA driver's version (`550.54.15`).
    pub driver_version: String,
    /// How MPS shares of it are asked for.
    pub mps: MpsPolicy,
    /// It has an MPS device (a GPU without MIG; a MIG-capable one with `--dra-mps-on-mig-gpus`).
    pub mps_device: bool,
}

/// How an MPS device's shares are asked for: the memory a claim that names none takes, the
/// granularity requests are rounded up to (`--dra-mps-default-memory`, `--dra-mps-memory-step`),
/// and how many clients the GPU's MPS server takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsPolicy {
    /// Bytes of memory a claim that names none takes.
    pub default_memory: u64,
    /// Memory requests are rounded up to a multiple of this (and at least this).
    pub memory_step: u64,
}

/// Default `--dra-mps-default-memory`: 1 GiB.
pub const DEFAULT_MPS_MEMORY: u64 = 1 << 30;
/// Default `--dra-mps-memory-step`: 256 MiB.
pub const DEFAULT_MPS_STEP: u64 = 256 << 20;

impl Default for MpsPolicy {
    fn default() -> Self {
        Self { default_memory: DEFAULT_MPS_MEMORY, memory_step: DEFAULT_MPS_STEP }
    }
}

/// The counter set of GPU `index`.
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}-counter-set")
}

/// The counter sets of the GPUs.
pub fn counter_sets(gpus: &[PublishedGpu]) -> Vec<CounterSet> {
    gpus.iter()
        .filter(|g| !g.counters.is_empty())
        .map(|g| CounterSet {
            name: counter_set_name(g.info.index),
            counters: g.counters.iter().map(|(k, v)| (k.clone(), Quantity::of(*v))).collect(),
        })
        .collect()
}

/// `major.minor.patch` from a dotted version with any number of parts (`535.104.05` →
/// `535.104.5`), as the API's version attributes need; `None` when it is not numeric.
pub fn semver(v: &str) -> Option<String> {
    let parts: Vec<u64> = v.trim().split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let at = |i: usize| parts.get(i).copied().unwrap_or(0);
    (!parts.is_empty()).then(|| format!("{}.{}.{}", at(0), at(1), at(2)))
}

/// NVIDIA's architecture names (`Ampere`, `Hopper`, …).
fn architecture(info: &GpuInfo) -> String {
    let arch = catalog::lookup(&info.model).map(|m| m.arch.as_str().to_string()).unwrap_or_else(|| {
        match info.compute_capability {
            (7, 0) | (7, 2) => "volta",
            (7, 5) => "turing",
            (8, 9) => "ada-lovelace",
            (8, _) => "ampere",
            (9, _) => "hopper",
            (10, _) | (12, _) => "blackwell",
            _ => "unknown",
        }
        .to_string()
    });
    arch.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The published form of device `d` of `gpu`.
pub fn device(gpu: &PublishedGpu, d: DeviceRef) -> Device {
    let info = &gpu.info;
    let mut attributes = BTreeMap::new();
    let mut attr = |k: &str, v: Attribute| {
        attributes.insert(k.to_string(), v);
    };
    let (cc_major, cc_minor) = info.compute_capability;
    attr("productName", Attribute::string(&info.name));
    attr("architecture", Attribute::string(architecture(info)));
    attr("cudaComputeCapability", Attribute::version(format!("{cc_major}.{cc_minor}.0")));
    if let Some(v) = semver(&gpu.driver_version) {
        attr("driverVersion", Attribute::version(v));
    }
    attr("index", Attribute::int(i64::from(info.index)));
    let memory = match d.kind {
        DeviceKind::Gpu | DeviceKind::Mps => {
            attr("type", Attribute::string("gpu"));
            attr("uuid", Attribute::string(&info.uuid));
            attr("sharing", Attribute::string(if d.kind == DeviceKind::Mps { "mps" } else { "none" }));
            info.memory_total_bytes
        }
        DeviceKind::Mig { profile_id, placement } => {
            attr("type", Attribute::string("mig"));
            attr("parentUUID", Attribute::string(&info.uuid));
            let p = gpu.table.by_id(profile_id);
            attr("profile", Attribute::string(p.map_or_else(String::new, |p| p.name.to_string())));
            attr("placementStart", Attribute::int(i64::from(placement.start)));
            attr("placementSize", Attribute::int(i64::from(placement.size)));
            p.map_or(0, |p| p.memory_mib * 1024 * 1024)
        }
    };
    let consumes_counters = if gpu.counters.is_empty() {
        Vec::new()
    } else {
        let c = consumption(d.kind, &gpu.table, &gpu.counters);
        vec![Consumption {
            counter_set: counter_set_name(info.index),
            counters: c.into_iter().map(|(k, v)| (k, Quantity::of(v))).collect(),
        }]
    };
    let mut capacity: std::collections::BTreeMap<String, Capacity> =
        [("memory".to_string(), Capacity::of(memory))].into_iter().collect();
    let mut allow_multiple_allocations = None;
    if d.kind == DeviceKind::Mps {
        let step = gpu.mps.memory_step.max(1);
        let memory_policy = RequestPolicy {
            default: Some(round_up(gpu.mps.default_memory, step).to_string()),
            valid_range: Some(ValidRange { min: step.to_string(), max: None, step: Some(step.to_string()) }),
            valid_values: Vec::new(),
        };
        capacity.insert("memory".into(), Capacity { value: memory.to_string(), request_policy: Some(memory_policy) });
        let one_client = RequestPolicy { default: Some("1".into()), valid_range: None, valid_values: vec!["1".into()] };
        capacity.insert(
            "clients".into(),
            Capacity { value: crate::mps::settings::max_clients(info).to_string(), request_policy: Some(one_client) },
        );
        allow_multiple_allocations = Some(true);
    }
    Device {
        name: d.name(&gpu.table),
        attributes,
        capacity,
        allow_multiple_allocations,
        consumes_counters,
        taints: Vec::new(),
    }
}

/// `v` rounded up to a multiple of `step` (at least `step`).
pub fn round_up(v: u64, step: u64) -> u64 {
    let step = step.max(1);
    v.div_ceil(step).max(1) * step
}

/// The GPUs as published: static facts and counter sets, computed once per model.
#[derive(Default)]
pub struct Catalog {
    counters: HashMap<String, Capacities>,
    /// How MPS shares are asked for.
    pub mps: MpsPolicy,
    /// MIG-capable GPUs have an MPS device too (`--dra-mps-on-mig-gpus`).
    pub mps_on_mig: bool,
}

impl Catalog {
    /// The published form of the observed GPUs.
    pub fn gpus(&mut self, states: &[GpuState], driver_version: &str) -> Vec<PublishedGpu> {
        states
            .iter()
            .map(|s| {
                let counters = if s.info.mig_capable && !s.profiles.profiles.is_empty() {
                    self.counters.entry(s.info.model.clone()).or_insert_with(|| gpu_counters(&s.profiles)).clone()
                } else {
                    whole_counters(s.info.memory_total_bytes)
                };
                PublishedGpu {
                    info: s.info.clone(),
                    table: if s.info.mig_capable { s.profiles.clone() } else { ProfileTable::empty() },
                    counters,
                    driver_version: driver_version.to_string(),
                    mps: self.mps,
                    mps_device: super::devices::has_mps_device(&s.info, &s.profiles, self.mps_on_mig),
                }
            })
            .collect()
    }
}

/// The device groups of the pool, each listed in its own device slice(s) for good, in the order
/// the scheduler visits them: one per MIG profile (by name: smallest first, a media-extended
/// profile after its plain twin), holding that profile's every placement on every GPU that has
/// it, then the whole GPUs, then the MPS devices. Each group's devices are in canonical order
/// (GPU, placement).
pub fn groups(gpus: &[PublishedGpu]) -> Vec<(String, Vec<DeviceRef>)> {
    // (memory slices, compute slices, media-extended, name) → devices.
    type Key = (u32, u32, bool, String);
    let mut by_profile: BTreeMap<Key, Vec<DeviceRef>> = BTreeMap::new();
    for g in gpus {
        for p in &g.table.profiles {
            let name = p.name.to_string();
            let key = (p.memory_slices, p.slices, name.contains('+'), name);
            let devices = by_profile.entry(key).or_default();
            for &placement in &p.placements {
                devices.push(DeviceRef { gpu: g.info.index, kind: DeviceKind::Mig { profile_id: p.id, placement } });
            }
        }
    }
    let mut out: Vec<(String, Vec<DeviceRef>)> = by_profile
        .into_iter()
        .map(|((_, _, _, name), mut devices)| {
            devices.sort();
            (label(&name), devices)
        })
        .collect();
    out.push(("gpu".into(), gpus.iter().map(|g| DeviceRef { gpu: g.info.index, kind: DeviceKind::Gpu }).collect()));
    let mps: Vec<DeviceRef> =
        gpus.iter().filter(|g| g.mps_device).map(|g| DeviceRef { gpu: g.info.index, kind: DeviceKind::Mps }).collect();
    if !mps.is_empty() {
        out.push(("mps".into(), mps));
    }
    out
}

/// The published names of `devices`.
pub fn names(gpus: &[PublishedGpu], devices: &[DeviceRef]) -> std::collections::BTreeSet<String> {
    devices.iter().filter_map(|d| gpus.iter().find(|g| g.info.index == d.gpu).map(|g| d.name(&g.table))).collect()
}

/// `1g.10gb+me` as a slice name part: `mig-1g-10gb-me`.
fn label(profile: &str) -> String {
    let part: String =
        profile.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    format!("mig-{part}")
}

/// The taint of a device that cannot be created now for a reason its counters do not express.
pub fn unavailable_taint(driver: &str, why: &str) -> DeviceTaint {
    DeviceTaint {
        key: format!("{driver}/unavailable"),
        value: Some(why.to_string()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// The taint every device of an unhealthy GPU carries: `<driver>/unhealthy`, the fault in its
/// value (`xid-79`), `NoSchedule` (no new allocation) or `NoExecute` (pods using it are evicted).
pub fn unhealthy_taint(driver: &str, value: &str, effect: &str) -> DeviceTaint {
    DeviceTaint {
        key: format!("{driver}/unhealthy"),
        value: Some(value.to_string()),
        effect: effect.into(),
        time_added: None,
    }
}

/// A device a health record fences: the fault, and why in words (for Prepare's refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The fault.
    pub fault: crate::health::Unhealthy,
    /// `is on GPU 1, which is unhealthy (XID 79)`.
    pub why: String,
}

/// Every device a health record fences: all devices of an unhealthy GPU; of a GPU with a faulty
/// MIG device, every MIG placement overlapping its slices and the whole-GPU and MPS devices
/// (they would hold those slices too).
pub fn fenced_devices(gpus: &[PublishedGpu], book: &crate::health::HealthBook) -> BTreeMap<DeviceRef, Fenced> {
    groups(gpus).into_iter().flat_map(|(_, devices)| devices).filter_map(|d| Some((d, fence_of(d, book)?))).collect()
}

/// Whether (and why) the health record fences device `d` ([`fenced_devices`]).
pub fn fence_of(d: DeviceRef, book: &crate::health::HealthBook) -> Option<Fenced> {
    if let Some(u) = book.unhealthy().get(&d.gpu) {
        let why = format!("is on GPU {}, which is unhealthy ({})", d.gpu, u.reason);
        return Some(Fenced { fault: u.clone(), why });
    }
    let on_its_slices = |m: &&crate::health::MigFault| match d.kind {
        DeviceKind::Gpu | DeviceKind::Mps => true,
        DeviceKind::Mig { placement, .. } => placement.overlaps(m.placement),
    };
    let m = book.mig_faults(d.gpu).find(on_its_slices)?;
    let why = format!("holds the slices of GPU {}'s faulty MIG device {} ({})", d.gpu, m.device(), m.fault.reason);
    Some(Fenced { fault: m.fault.clone(), why })
}

/// The slices of a pool. Every device the GPUs could ever have is listed, each in its group's
/// slice for good ([`groups`]), so no device the scheduler may be allocating right now ever
/// leaves the pool or moves: within a group, the `offered` devices (those that can be created
/// now) come first in their given order, then the rest in canonical order; the counters refuse
/// what allocated devices block, and a device in `unavailable` (blocked by what the counters do
/// not count: another tool's instance, processes) carries a `NoSchedule` taint saying why, and
/// every device in `fenced` its taint ([`unhealthy_taint`]).
pub fn content(
    driver: &str,
    node: &str,
    generation: i64,
    gpus: &[PublishedGpu],
    offered: &[DeviceRef],
    unavailable: &BTreeMap<DeviceRef, String>,
    fenced: &BTreeMap<DeviceRef, DeviceTaint>,
) -> Vec<Slice> {
    let rank: HashMap<DeviceRef, usize> = offered.iter().enumerate().map(|(i, d)| (*d, i)).collect();
    let publish = |d: DeviceRef| {
        let g = gpus.iter().find(|g| g.info.index == d.gpu)?;
        let mut dev = device(g, d);
        if let Some(why) = unavailable.get(&d) {
            dev.taints.push(unavailable_taint(driver, why));
        }
        if let Some(t) = fenced.get(&d) {
            dev.taints.push(t.clone());
        }
        Some(dev)
    };
    let groups = groups(gpus)
        .into_iter()
        .map(|(label, mut devices)| {
            // Offered first in their rank, then the rest as they are (canonical).
            devices.sort_by_key(|d| rank.get(d).map_or((1, 0), |r| (0, *r)));
            (label, devices.into_iter().filter_map(publish).collect())
        })
        .collect();
    layout(driver, node, generation, counter_sets(gpus), groups)
}
