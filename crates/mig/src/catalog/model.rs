//! What the catalog says of one model: architecture, MIG geometry and GI rows (with the
//! shorthands the model tables are written in), compute-instance profiles, and the profile
//! table derived from them.

use crate::profile::{derive_gi_name, CiProfile, Engines, GiProfile, ProfileTable};
use crate::Placement;
use std::fmt;

/// GPU architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Pascal (P100): before Volta, so MPS has no per-client limits and at most 16 clients.
    Pascal,
    /// Volta (V100).
    Volta,
    /// Turing (T4).
    Turing,
    /// Ampere (A100, A30, A10).
    Ampere,
    /// Ada Lovelace (L4, L40S).
    Ada,
    /// Hopper (H100, H200).
    Hopper,
    /// Blackwell (B200, GB200, B300, GB300, RTX PRO 6000).
    Blackwell,
}

impl Arch {
    /// Whether a MIG mode change stays pending until the GPU is reset (Ampere) rather than
    /// taking effect immediately (Hopper and later).
    pub fn mig_mode_needs_reset(self) -> bool {
        matches!(self, Arch::Ampere)
    }

    /// Lower-case name (`ampere`, `hopper`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Pascal => "pascal",
            Arch::Volta => "volta",
            Arch::Turing => "turing",
            Arch::Ampere => "ampere",
            Arch::Ada => "ada-lovelace",
            Arch::Hopper => "hopper",
            Arch::Blackwell => "blackwell",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of a GPU-instance profile table as stored in the catalog.
#[derive(Debug, Clone, Copy)]
pub struct GiSpec {
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum index.
    pub index: u32,
    /// Device-unique profile id.
    pub id: u32,
    /// Compute slices.
    pub slices: u32,
    /// Memory slices (placement size).
    pub memory_slices: u32,
    /// `memorySizeMB` in MiB.
    pub memory_mib: u64,
    /// `instanceCount`.
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Engine counts.
    pub engines: Engines,
    /// Legal start slices.
    pub placements: &'static [u32],
}

/// MIG geometry of a MIG-capable model.
#[derive(Debug, Clone, Copy)]
pub struct MigSpec {
    /// Compute slices of the whole GPU.
    pub compute_slices: u32,
    /// Memory slices of the whole GPU.
    pub memory_slices: u32,
    /// GPU-instance profiles, in enum-index order.
    pub profiles: &'static [GiSpec],
}

/// A GPU model of the catalog.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// gpupart's model id (`A100-SXM4-80GB`), matched case-insensitively.
    pub id: &'static str,
    /// What `nvmlDeviceGetName` returns.
    pub nvml_name: &'static str,
    /// `nvmlPciInfo_t.pciDeviceId`: `(device << 16) | 0x10DE`.
    pub pci_device_id: u32,
    /// Total memory in MiB as `nvmlDeviceGetMemoryInfo` reports it.
    pub memory_mib: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Architecture.
    pub arch: Arch,
    /// Streaming multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// MIG geometry, `None` for GPUs without MIG.
    pub mig: Option<MigSpec>,
}

/// Shorthand for an [`Engines`] value in the tables: decoders, encoders, copy engines, JPEG, OFA.
pub(crate) const fn eng(decoders: u32, encoders: u32, copy_engines: u32, jpeg: u32, ofa: u32) -> Engines {
    Engines { decoders, encoders, copy_engines, jpeg, ofa }
}

/// Shorthand for a [`GiSpec`] row: enum index, profile id, compute slices, memory slices, MiB,
/// instanceCount, SMs, engines, legal start slices.
#[allow(clippy::too_many_arguments)]
pub(crate) const fn gi(
    index: u32,
    id: u32,
    slices: u32,
    memory_slices: u32,
    memory_mib: u64,
    instance_count: u32,
    multiprocessors: u32,
    engines: Engines,
    placements: &'static [u32],
) -> GiSpec {
    GiSpec { index, id, slices, memory_slices, memory_mib, instance_count, multiprocessors, engines, placements }
}

/// A MIG-capable model: `(compute capability, arch)` and `(compute slices, memory slices)`.
#[allow(clippy::too_many_arguments)]
pub(crate) const fn mig_model(
    id: &'static str,
    nvml_name: &'static str,
    pci_device_id: u32,
    memory_mib: u64,
    (compute_capability, arch): ((u32, u32), Arch),
    multiprocessors: u32,
    (compute_slices, memory_slices): (u32, u32),
    profiles: &'static [GiSpec],
) -> Model {
    Model {
        id,
        nvml_name,
        pci_device_id,
        memory_mib,
        compute_capability,
        arch,
        multiprocessors,
        mig: Some(MigSpec { compute_slices, memory_slices, profiles }),
    }
}

/// Compute-instance profiles of a GI with `gi_slices` compute slices and `gi_sm` SMs.
///
/// From the go-nvml A100 mock and `nvidia-smi mig -lcip` transcripts (mig-hardware.md §5.2);
/// the 4g and 7g CI tables are UNV on hardware. CI REV1 (id 7) is not modelled.
pub fn ci_profiles(gi_slices: u32, gi_sm: u32) -> Vec<CiProfile> {
    let rows: &[(u32, u32, u32, &[u32])] = match gi_slices {
        1 => &[(0, 1, 1, &[0])],
        2 => &[(0, 1, 2, &[0, 1]), (1, 2, 1, &[0])],
        3 => &[(0, 1, 3, &[0, 1, 2]), (1, 2, 1, &[0]), (2, 3, 1, &[0])],
        4 => &[(0, 1, 4, &[0, 1, 2, 3]), (1, 2, 2, &[0, 2]), (3, 4, 1, &[0])],
        7 => &[
            (0, 1, 7, &[0, 1, 2, 3, 4, 5, 6]),
            (1, 2, 3, &[0, 2, 4]),
            (2, 3, 2, &[0, 4]),
            (3, 4, 1, &[0]),
            (4, 7, 1, &[0]),
        ],
        _ => &[],
    };
    rows.iter()
        .map(|&(id, slices, instance_count, placements)| CiProfile {
            id,
            slices,
            instance_count,
            multiprocessors: gi_sm * slices / gi_slices,
            placements: placements.to_vec(),
        })
        .collect()
}

impl Model {
    /// Whether the model supports MIG.
    pub fn mig_capable(&self) -> bool {
        self.mig.is_some()
    }

    /// Total memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }

    /// The model's profile table, with names derived from memory sizes as NVIDIA's tools do.
    pub fn profile_table(&self) -> ProfileTable {
        let Some(mig) = self.mig else {
            return ProfileTable::empty();
        };
        let total = self.memory_bytes();
        let profiles = mig
            .profiles
            .iter()
            .filter_map(|s| {
                Some(GiProfile {
                    index: s.index,
                    id: s.id,
                    name: derive_gi_name(s.index, s.memory_mib, total)?,
                    slices: s.slices,
                    memory_slices: s.memory_slices,
                    memory_mib: s.memory_mib,
                    instance_count: s.instance_count,
                    multiprocessors: s.multiprocessors,
                    engines: s.engines,
                    placements: s.placements.iter().map(|&start| Placement::new(start, s.memory_slices)).collect(),
                    ci_profiles: ci_profiles(s.slices, s.multiprocessors),
                })
            })
            .collect();
        ProfileTable { compute_slices: mig.compute_slices, memory_slices: mig.memory_slices, profiles }
    }
}
