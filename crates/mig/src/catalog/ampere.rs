//! Ampere models: A100 (40 GB and 80 GB, SXM4 and PCIe) and A30. Sources: mig-hardware.md §3.1–3.3.

use super::{eng, Arch, GiSpec, MigSpec, Model};

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const HALVES: &[u32] = &[0, 2, 4, 6];

/// A100 40 GB: MIG User Guide `-lgip`/`-lgipp` transcript; MiB from the go-nvml dgxa100 mock.
const A100_40GB: &[GiSpec] = &[
    GiSpec { index: 0, id: 19, slices: 1, memory_slices: 1, memory_mib: 4864, instance_count: 7, multiprocessors: 14, engines: eng(0, 0, 1, 0, 0), placements: ALL_1G },
    GiSpec { index: 1, id: 14, slices: 2, memory_slices: 2, memory_mib: 9856, instance_count: 3, multiprocessors: 28, engines: eng(1, 0, 2, 0, 0), placements: &[0, 2, 4] },
    GiSpec { index: 2, id: 9, slices: 3, memory_slices: 4, memory_mib: 19968, instance_count: 2, multiprocessors: 42, engines: eng(2, 0, 3, 0, 0), placements: &[0, 4] },
    GiSpec { index: 3, id: 5, slices: 4, memory_slices: 4, memory_mib: 19968, instance_count: 1, multiprocessors: 56, engines: eng(2, 0, 4, 0, 0), placements: &[0] },
    GiSpec { index: 4, id: 0, slices: 7, memory_slices: 8, memory_mib: 40192, instance_count: 1, multiprocessors: 98, engines: eng(5, 0, 7, 1, 1), placements: &[0] },
    GiSpec { index: 7, id: 20, slices: 1, memory_slices: 1, memory_mib: 4864, instance_count: 1, multiprocessors: 14, engines: eng(1, 0, 1, 1, 1), placements: ALL_1G },
    GiSpec { index: 9, id: 15, slices: 1, memory_slices: 2, memory_mib: 9856, instance_count: 4, multiprocessors: 14, engines: eng(1, 0, 1, 0, 0), placements: HALVES },
];

/// A100 80 GB: A100 80GB PCIe transcript (driver 515). Placements are UNV (assumed equal to the
/// 40 GB part); the `1g.20gb` row (memory, SMs, engines) is UNV, modelled on the 40 GB REV2 row
/// with the 2g memory size. The SXM4 part is assumed identical to the PCIe part (UNV).
const A100_80GB: &[GiSpec] = &[
    GiSpec { index: 0, id: 19, slices: 1, memory_slices: 1, memory_mib: 9728, instance_count: 7, multiprocessors: 14, engines: eng(0, 0, 1, 0, 0), placements: ALL_1G },
    GiSpec { index: 1, id: 14, slices: 2, memory_slices: 2, memory_mib: 19968, instance_count: 3, multiprocessors: 28, engines: eng(1, 0, 2, 0, 0), placements: &[0, 2, 4] },
    GiSpec { index: 2, id: 9, slices: 3, memory_slices: 4, memory_mib: 40192, instance_count: 2, multiprocessors: 42, engines: eng(2, 0, 3, 0, 0), placements: &[0, 4] },
    GiSpec { index: 3, id: 5, slices: 4, memory_slices: 4, memory_mib: 40192, instance_count: 1, multiprocessors: 56, engines: eng(2, 0, 4, 0, 0), placements: &[0] },
    GiSpec { index: 4, id: 0, slices: 7, memory_slices: 8, memory_mib: 80896, instance_count: 1, multiprocessors: 98, engines: eng(5, 0, 7, 1, 1), placements: &[0] },
    GiSpec { index: 7, id: 20, slices: 1, memory_slices: 1, memory_mib: 9728, instance_count: 1, multiprocessors: 14, engines: eng(1, 0, 1, 1, 1), placements: ALL_1G },
    // UNV: absent from the 515 transcript.
    GiSpec { index: 9, id: 15, slices: 1, memory_slices: 2, memory_mib: 19968, instance_count: 4, multiprocessors: 14, engines: eng(1, 0, 1, 0, 0), placements: HALVES },
];

/// A30: user transcript, driver 535.183.01. The engine totals make the two `+me` profiles
/// mutually exclusive (one JPEG/OFA), which is DER/UNV on hardware.
const A30: &[GiSpec] = &[
    GiSpec { index: 0, id: 14, slices: 1, memory_slices: 1, memory_mib: 5952, instance_count: 4, multiprocessors: 14, engines: eng(1, 0, 1, 0, 0), placements: &[0, 1, 2, 3] },
    GiSpec { index: 1, id: 5, slices: 2, memory_slices: 2, memory_mib: 11968, instance_count: 2, multiprocessors: 28, engines: eng(2, 0, 2, 0, 0), placements: &[0, 2] },
    GiSpec { index: 3, id: 0, slices: 4, memory_slices: 4, memory_mib: 24000, instance_count: 1, multiprocessors: 56, engines: eng(4, 0, 4, 1, 1), placements: &[0] },
    GiSpec { index: 7, id: 21, slices: 1, memory_slices: 1, memory_mib: 5952, instance_count: 1, multiprocessors: 14, engines: eng(1, 0, 1, 1, 1), placements: &[0, 1, 2, 3] },
    GiSpec { index: 8, id: 6, slices: 2, memory_slices: 2, memory_mib: 11968, instance_count: 1, multiprocessors: 28, engines: eng(2, 0, 2, 1, 1), placements: &[0, 2] },
];

/// The Ampere models.
pub(super) static MODELS: [Model; 5] = [
    Model {
        id: "A100-SXM4-40GB",
        nvml_name: "NVIDIA A100-SXM4-40GB",
        pci_device_id: 0x20B0_10DE,
        memory_mib: 40537,
        compute_capability: (8, 0),
        arch: Arch::Ampere,
        multiprocessors: 108,
        mig: Some(MigSpec { compute_slices: 7, memory_slices: 8, profiles: A100_40GB }),
    },
    // UNV: total memory assumed equal to the SXM4 part.
    Model {
        id: "A100-PCIE-40GB",
        nvml_name: "NVIDIA A100-PCIE-40GB",
        pci_device_id: 0x20F1_10DE,
        memory_mib: 40537,
        compute_capability: (8, 0),
        arch: Arch::Ampere,
        multiprocessors: 108,
        mig: Some(MigSpec { compute_slices: 7, memory_slices: 8, profiles: A100_40GB }),
    },
    // UNV: total memory assumed equal to the PCIe part (81920 MiB seen there).
    Model {
        id: "A100-SXM4-80GB",
        nvml_name: "NVIDIA A100-SXM4-80GB",
        pci_device_id: 0x20B2_10DE,
        memory_mib: 81920,
        compute_capability: (8, 0),
        arch: Arch::Ampere,
        multiprocessors: 108,
        mig: Some(MigSpec { compute_slices: 7, memory_slices: 8, profiles: A100_80GB }),
    },
    Model {
        id: "A100-PCIE-80GB",
        nvml_name: "NVIDIA A100 80GB PCIe",
        pci_device_id: 0x20B5_10DE,
        memory_mib: 81920,
        compute_capability: (8, 0),
        arch: Arch::Ampere,
        multiprocessors: 108,
        mig: Some(MigSpec { compute_slices: 7, memory_slices: 8, profiles: A100_80GB }),
    },
    Model {
        id: "A30-24GB",
        nvml_name: "NVIDIA A30",
        pci_device_id: 0x20B7_10DE,
        memory_mib: 24576,
        compute_capability: (8, 0),
        arch: Arch::Ampere,
        multiprocessors: 56,
        mig: Some(MigSpec { compute_slices: 4, memory_slices: 4, profiles: A30 }),
    },
];
