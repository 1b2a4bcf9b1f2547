//! Ampere models: A100 (40 GB and 80 GB, SXM4 and PCIe), A800, PG506 and A30. Sources:
//! mig-hardware.md §1 and §3.1–3.3.

use super::model::{eng, gi, mig_model, Arch, GiSpec, Model};

const AMPERE: ((u32, u32), Arch) = ((8, 0), Arch::Ampere);

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const HALVES: &[u32] = &[0, 2, 4, 6];

/// A100 40 GB: MIG User Guide `-lgip`/`-lgipp` transcript; MiB from the go-nvml dgxa100 mock.
const A100_40GB: &[GiSpec] = &[
    gi(0, 19, 1, 1, 4864, 7, 14, eng(0, 0, 1, 0, 0), ALL_1G),
    gi(1, 14, 2, 2, 9856, 3, 28, eng(1, 0, 2, 0, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 19968, 2, 42, eng(2, 0, 3, 0, 0), &[0, 4]),
    gi(3, 5, 4, 4, 19968, 1, 56, eng(2, 0, 4, 0, 0), &[0]),
    gi(4, 0, 7, 8, 40192, 1, 98, eng(5, 0, 7, 1, 1), &[0]),
    gi(7, 20, 1, 1, 4864, 1, 14, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 9856, 4, 14, eng(1, 0, 1, 0, 0), HALVES),
];

/// A100 80 GB: A100 80GB PCIe transcript (driver 515). Placements are UNV (assumed equal to the
/// 40 GB part); the `1g.20gb` row (memory, SMs, engines) is UNV, modelled on the 40 GB REV2 row
/// with the 2g memory size. The SXM4 part is assumed identical to the PCIe part (UNV).
const A100_80GB: &[GiSpec] = &[
    gi(0, 19, 1, 1, 9728, 7, 14, eng(0, 0, 1, 0, 0), ALL_1G),
    gi(1, 14, 2, 2, 19968, 3, 28, eng(1, 0, 2, 0, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 40192, 2, 42, eng(2, 0, 3, 0, 0), &[0, 4]),
    gi(3, 5, 4, 4, 40192, 1, 56, eng(2, 0, 4, 0, 0), &[0]),
    gi(4, 0, 7, 8, 80896, 1, 98, eng(5, 0, 7, 1, 1), &[0]),
    gi(7, 20, 1, 1, 9728, 1, 14, eng(1, 0, 1, 1, 1), ALL_1G),
    // UNV: absent from the 515 transcript.
    gi(9, 15, 1, 2, 19968, 4, 14, eng(1, 0, 1, 0, 0), HALVES),
];

/// A30: user transcript, driver 535.183.01. The engine totals make the two `+me` profiles
/// mutually exclusive (one JPEG/OFA), which is DER/UNV on hardware.
const A30: &[GiSpec] = &[
    gi(0, 14, 1, 1, 5952, 4, 14, eng(1, 0, 1, 0, 0), &[0, 1, 2, 3]),
    gi(1, 5, 2, 2, 11968, 2, 28, eng(2, 0, 2, 0, 0), &[0, 2]),
    gi(3, 0, 4, 4, 24000, 1, 56, eng(4, 0, 4, 1, 1), &[0]),
    gi(7, 21, 1, 1, 5952, 1, 14, eng(1, 0, 1, 1, 1), &[0, 1, 2, 3]),
    gi(8, 6, 2, 2, 11968, 1, 28, eng(2, 0, 2, 1, 1), &[0, 2]),
];

/// The Ampere models.
pub(super) static MODELS: [Model; 9] = [
    mig_model("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 0x20B0_10DE, 40537, AMPERE, 108, (7, 8), A100_40GB),
    // UNV: total memory assumed equal to the SXM4 part.
    mig_model("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 0x20F1_10DE, 40537, AMPERE, 108, (7, 8), A100_40GB),
    // UNV: total memory assumed equal to the PCIe part (81920 MiB seen there).
    mig_model("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 0x20B2_10DE, 81920, AMPERE, 108, (7, 8), A100_80GB),
    mig_model("A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", 0x20B5_10DE, 81920, AMPERE, 108, (7, 8), A100_80GB),
    mig_model("A30-24GB", "NVIDIA A30", 0x20B7_10DE, 24576, AMPERE, 56, (4, 4), A30),
    // UNV: the A800 parts reuse the A100 tables of their memory size (mig-parted groups them so).
    mig_model("A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", 0x20F3_10DE, 81920, AMPERE, 108, (7, 8), A100_80GB),
    mig_model("A800-PCIE-80GB", "NVIDIA A800 80GB PCIe", 0x20F5_10DE, 81920, AMPERE, 108, (7, 8), A100_80GB),
    mig_model("A800-PCIE-40GB", "NVIDIA A800 40GB PCIe", 0x20F6_10DE, 40537, AMPERE, 108, (7, 8), A100_40GB),
    // UNV: mig-parted groups the PG506 (GA100) with the 96 GB Hopper parts; their table is used.
    mig_model("PG506-96GB", "NVIDIA PG506-232", 0x20B6_10DE, 97871, AMPERE, 108, (7, 8), super::hopper::H100_96GB),
];
