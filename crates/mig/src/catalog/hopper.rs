//! Hopper models: H100 (SXM5, PCIe, NVL) and H200. Sources: mig-hardware.md §3.4–3.6.

use super::{eng, Arch, GiSpec, MigSpec, Model};

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const HALVES: &[u32] = &[0, 2, 4, 6];

/// H100 80 GB: two real transcripts (driver 580 sizes). Placements identical to A100 (seen).
/// The PCIe part is assumed identical (UNV).
const H100_80GB: &[GiSpec] = &[
    GiSpec { index: 0, id: 19, slices: 1, memory_slices: 1, memory_mib: 9984, instance_count: 7, multiprocessors: 16, engines: eng(1, 0, 1, 1, 0), placements: ALL_1G },
    GiSpec { index: 1, id: 14, slices: 2, memory_slices: 2, memory_mib: 20096, instance_count: 3, multiprocessors: 32, engines: eng(2, 0, 2, 2, 0), placements: &[0, 2, 4] },
    GiSpec { index: 2, id: 9, slices: 3, memory_slices: 4, memory_mib: 40448, instance_count: 2, multiprocessors: 60, engines: eng(3, 0, 3, 3, 0), placements: &[0, 4] },
    GiSpec { index: 3, id: 5, slices: 4, memory_slices: 4, memory_mib: 40448, instance_count: 1, multiprocessors: 64, engines: eng(4, 0, 4, 4, 0), placements: &[0] },
    GiSpec { index: 4, id: 0, slices: 7, memory_slices: 8, memory_mib: 81152, instance_count: 1, multiprocessors: 132, engines: eng(7, 0, 8, 7, 1), placements: &[0] },
    GiSpec { index: 7, id: 20, slices: 1, memory_slices: 1, memory_mib: 9984, instance_count: 1, multiprocessors: 16, engines: eng(1, 0, 1, 1, 1), placements: ALL_1G },
    GiSpec { index: 9, id: 15, slices: 1, memory_slices: 2, memory_mib: 20096, instance_count: 4, multiprocessors: 26, engines: eng(1, 0, 1, 1, 0), placements: HALVES },
];

/// H100 NVL 94 GB: Azure transcript, driver 560.35.03. Encoder counts not given (0 here, UNV).
const H100_NVL: &[GiSpec] = &[
    GiSpec { index: 0, id: 19, slices: 1, memory_slices: 1, memory_mib: 11008, instance_count: 7, multiprocessors: 16, engines: eng(1, 0, 1, 1, 0), placements: ALL_1G },
    GiSpec { index: 1, id: 14, slices: 2, memory_slices: 2, memory_mib: 22144, instance_count: 3, multiprocessors: 32, engines: eng(2, 0, 2, 2, 0), placements: &[0, 2, 4] },
    GiSpec { index: 2, id: 9, slices: 3, memory_slices: 4, memory_mib: 47488, instance_count: 2, multiprocessors: 60, engines: eng(3, 0, 3, 3, 0), placements: &[0, 4] },
    GiSpec { index: 3, id: 5, slices: 4, memory_slices: 4, memory_mib: 47488, instance_count: 1, multiprocessors: 64, engines: eng(4, 0, 4, 4, 0), placements: &[0] },
    GiSpec { index: 4, id: 0, slices: 7, memory_slices: 8, memory_mib: 95360, instance_count: 1, multiprocessors: 132, engines: eng(7, 0, 8, 7, 1), placements: &[0] },
    GiSpec { index: 7, id: 20, slices: 1, memory_slices: 1, memory_mib: 11008, instance_count: 1, multiprocessors: 16, engines: eng(1, 0, 1, 1, 1), placements: ALL_1G },
    GiSpec { index: 9, id: 15, slices: 1, memory_slices: 2, memory_mib: 22144, instance_count: 4, multiprocessors: 26, engines: eng(1, 0, 1, 1, 0), placements: HALVES },
];

/// H200 SXM 141 GB: `NVIDIA/mig-parted#120` `-lgip`. Placements DER from the guide's memory
/// fractions (UNV: no `-lgipp` transcript); total memory 143771 MiB is UNV.
const H200: &[GiSpec] = &[
    GiSpec { index: 0, id: 19, slices: 1, memory_slices: 1, memory_mib: 16384, instance_count: 7, multiprocessors: 16, engines: eng(1, 0, 1, 1, 0), placements: ALL_1G },
    GiSpec { index: 1, id: 14, slices: 2, memory_slices: 2, memory_mib: 33024, instance_count: 3, multiprocessors: 32, engines: eng(2, 0, 2, 2, 0), placements: &[0, 2, 4] },
    GiSpec { index: 2, id: 9, slices: 3, memory_slices: 4, memory_mib: 71168, instance_count: 2, multiprocessors: 60, engines: eng(3, 0, 3, 3, 0), placements: &[0, 4] },
    GiSpec { index: 3, id: 5, slices: 4, memory_slices: 4, memory_mib: 71168, instance_count: 1, multiprocessors: 64, engines: eng(4, 0, 4, 4, 0), placements: &[0] },
    GiSpec { index: 4, id: 0, slices: 7, memory_slices: 8, memory_mib: 143104, instance_count: 1, multiprocessors: 132, engines: eng(7, 0, 8, 7, 1), placements: &[0] },
    GiSpec { index: 7, id: 20, slices: 1, memory_slices: 1, memory_mib: 16384, instance_count: 1, multiprocessors: 16, engines: eng(1, 0, 1, 1, 1), placements: ALL_1G },
    GiSpec { index: 9, id: 15, slices: 1, memory_slices: 2, memory_mib: 33024, instance_count: 4, multiprocessors: 26, engines: eng(1, 0, 1, 1, 0), placements: HALVES },
];

const fn hopper(
    id: &'static str,
    nvml_name: &'static str,
    pci_device_id: u32,
    memory_mib: u64,
    multiprocessors: u32,
    profiles: &'static [GiSpec],
) -> Model {
    Model {
        id,
        nvml_name,
        pci_device_id,
        memory_mib,
        compute_capability: (9, 0),
        arch: Arch::Hopper,
        multiprocessors,
        mig: Some(MigSpec {
            compute_slices: 7,
            memory_slices: 8,
            profiles,
        }),
    }
}

/// The Hopper models.
pub(super) static MODELS: [Model; 4] = [
    hopper("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x2330_10DE, 81559, 132, H100_80GB),
    // UNV: PCIe memory and MIG tables assumed equal to SXM5.
    hopper("H100-PCIE-80GB", "NVIDIA H100 PCIe", 0x2331_10DE, 81559, 114, H100_80GB),
    hopper("H100-NVL-94GB", "NVIDIA H100 NVL", 0x2321_10DE, 95830, 132, H100_NVL),
    hopper("H200-SXM-141GB", "NVIDIA H200", 0x2335_10DE, 143771, 132, H200),
];
