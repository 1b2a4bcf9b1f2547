//! GPU-instance and compute-instance profile tables, as read from NVML or built from the catalog.

use crate::name::{memory_gb, ProfileName};
use crate::placement::Placement;
use serde::{Deserialize, Serialize};

/// Engine counts of a GPU-instance profile (`nvmlGpuInstanceProfileInfo_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engines {
    /// NVDEC count.
    pub decoders: u32,
    /// NVENC count.
    pub encoders: u32,
    /// Copy-engine count.
    pub copy_engines: u32,
    /// NVJPG count.
    pub jpeg: u32,
    /// Optical-flow accelerator count.
    pub ofa: u32,
}

/// A compute-instance profile inside a GPU-instance profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiProfile {
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*` value, which is also the CI profile id.
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub slices: u32,
    /// Maximum number of such CIs in one GI (`instanceCount`).
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Legal start slices inside the GI (placement size = `slices`).
    pub placements: Vec<u32>,
}

/// A GPU-instance profile of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum index.
    pub index: u32,
    /// Device-unique profile id (`info.id`), used by every other GI call.
    pub id: u32,
    /// Name derived from the memory size (e.g. `1g.10gb+me`).
    pub name: ProfileName,
    /// Compute slices (`sliceCount`).
    pub slices: u32,
    /// Memory slices (placement size).
    pub memory_slices: u32,
    /// Memory in MiB (`memorySizeMB`).
    pub memory_mib: u64,
    /// Maximum number of such GIs (`instanceCount`).
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Engine counts.
    pub engines: Engines,
    /// Legal placements, in memory slices.
    pub placements: Vec<Placement>,
    /// Compute-instance profiles available inside this GI profile.
    pub ci_profiles: Vec<CiProfile>,
}

impl GiProfile {
    /// The compute-instance profile with `slices` compute slices (the lowest id when several).
    pub fn ci_with_slices(&self, slices: u32) -> Option<&CiProfile> {
        self.ci_profiles.iter().filter(|c| c.slices == slices).min_by_key(|c| c.id)
    }

    /// The CI profile spanning the whole GI (the default CI).
    pub fn full_ci(&self) -> Option<&CiProfile> {
        self.ci_with_slices(self.slices)
    }

    /// CI profile by id.
    pub fn ci(&self, id: u32) -> Option<&CiProfile> {
        self.ci_profiles.iter().find(|c| c.id == id)
    }

    /// The MIG device name of a CI profile inside this GI (`1c.2g.20gb`).
    pub fn device_name(&self, ci_profile_id: u32) -> ProfileName {
        let slices = self.ci(ci_profile_id).map_or(self.slices, |c| c.slices);
        self.name.with_ci(slices)
    }
}

/// All GPU-instance profiles of one device plus its slice geometry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileTable {
    /// Compute slices of the whole GPU.
    pub compute_slices: u32,
    /// Memory slices of the whole GPU.
    pub memory_slices: u32,
    /// The GI profiles, in enum-index order.
    pub profiles: Vec<GiProfile>,
}

/// Why a profile name does not resolve on a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported MIG device specified {name}, expected one of {expected}")]
pub struct ResolveError {
    /// The requested name.
    pub name: String,
    /// The names this device supports, comma-separated.
    pub expected: String,
}

impl ProfileTable {
    /// An empty table (a GPU without MIG).
    pub fn empty() -> Self {
        Self { compute_slices: 0, memory_slices: 0, profiles: Vec::new() }
    }

    /// GI profile by device-unique id.
    pub fn by_id(&self, id: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// Resolves a MIG device name to (GI profile, CI profile id) on this device.
    pub fn resolve(&self, name: &ProfileName) -> Result<(&GiProfile, u32), ResolveError> {
        let gi_name = name.gi_name();
        self.profiles
            .iter()
            .filter(|p| p.name == gi_name)
            .find_map(|p| p.ci_with_slices(name.compute_slices()).map(|c| (p, c.id)))
            .ok_or_else(|| ResolveError { name: name.to_string(), expected: self.device_names().join(", ") })
    }

    /// Every MIG device name this device supports (GI names first, then CI names).
    pub fn device_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.profiles.iter().map(|p| p.name.to_string()).collect();
        for p in &self.profiles {
            for c in &p.ci_profiles {
                if c.slices != p.slices {
                    let n = p.name.with_ci(c.slices).to_string();
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
        names
    }

    /// Total media engines of the device (those of the full-GPU profile).
    pub fn engine_totals(&self) -> Engines {
        self.profiles.iter().max_by_key(|p| (p.memory_slices, p.slices)).map(|p| p.engines).unwrap_or_default()
    }
}

/// GPU-instance compute slices implied by an `NVML_GPU_INSTANCE_PROFILE_*` index.
pub fn gi_slices_for_index(index: u32) -> Option<u32> {
    Some(match index {
        0x0 | 0x7 | 0x9 | 0xA | 0xD | 0xF => 1,
        0x1 | 0x8 | 0xB | 0xE | 0x10 => 2,
        0x2 | 0x11 => 3,
        0x3 | 0xC => 4,
        0x4 => 7,
        0x5 => 8,
        0x6 => 6,
        _ => return None,
    })
}

/// Name suffix implied by an `NVML_GPU_INSTANCE_PROFILE_*` index (`+me`, `+gfx`, …).
pub fn suffix_for_index(index: u32) -> &'static str {
    match index {
        0x7 | 0x8 => "+me",
        0xA | 0xB | 0xC | 0x11 => "+gfx",
        0xD | 0xE => "-me",
        0xF | 0x10 => "+me.all",
        _ => "",
    }
}

/// Compute slices implied by an `NVML_COMPUTE_INSTANCE_PROFILE_*` index.
pub fn ci_slices_for_index(index: u32) -> Option<u32> {
    Some(match index {
        0x0 | 0x7 => 1,
        0x1 => 2,
        0x2 => 3,
        0x3 => 4,
        0x4 | 0x8 => 7,
        0x5 => 8,
        0x6 => 6,
        _ => return None,
    })
}

/// Derives a GI profile's name from its enum index, memory size and the device's total memory.
pub fn derive_gi_name(index: u32, memory_mib: u64, total_bytes: u64) -> Option<ProfileName> {
    Some(ProfileName::gi(gi_slices_for_index(index)?, memory_gb(memory_mib, total_bytes), suffix_for_index(index)))
}

impl Serialize for ProfileName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ProfileName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
