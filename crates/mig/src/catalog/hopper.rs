//! Hopper models: H100 (SXM5, PCIe, NVL) and H200. Sources: mig-hardware.md §3.4–3.6.

use super::{eng, gi, mig_model, Arch, GiSpec, Model};

const HOPPER: ((u32, u32), Arch) = ((9, 0), Arch::Hopper);

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const HALVES: &[u32] = &[0, 2, 4, 6];

/// H100 80 GB: two real transcripts (driver 580 sizes). Placements identical to A100 (seen).
/// The PCIe part is assumed identical (UNV).
const H100_80GB: &[GiSpec] = &[
    gi(0, 19, 1, 1, 9984, 7, 16, eng(1, 0, 1, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 20096, 3, 32, eng(2, 0, 2, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 40448, 2, 60, eng(3, 0, 3, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 40448, 1, 64, eng(4, 0, 4, 4, 0), &[0]),
    gi(4, 0, 7, 8, 81152, 1, 132, eng(7, 0, 8, 7, 1), &[0]),
    gi(7, 20, 1, 1, 9984, 1, 16, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 20096, 4, 26, eng(1, 0, 1, 1, 0), HALVES),
];

/// H100 NVL 94 GB: Azure transcript, driver 560.35.03. Encoder counts not given (0 here, UNV).
const H100_NVL: &[GiSpec] = &[
    gi(0, 19, 1, 1, 11008, 7, 16, eng(1, 0, 1, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 22144, 3, 32, eng(2, 0, 2, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 47488, 2, 60, eng(3, 0, 3, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 47488, 1, 64, eng(4, 0, 4, 4, 0), &[0]),
    gi(4, 0, 7, 8, 95360, 1, 132, eng(7, 0, 8, 7, 1), &[0]),
    gi(7, 20, 1, 1, 11008, 1, 16, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 22144, 4, 26, eng(1, 0, 1, 1, 0), HALVES),
];

/// H200 SXM 141 GB: `NVIDIA/mig-parted#120` `-lgip`. Placements DER from the guide's memory
/// fractions (UNV: no `-lgipp` transcript); total memory 143771 MiB is UNV.
const H200: &[GiSpec] = &[
    gi(0, 19, 1, 1, 16384, 7, 16, eng(1, 0, 1, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 33024, 3, 32, eng(2, 0, 2, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 71168, 2, 60, eng(3, 0, 3, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 71168, 1, 64, eng(4, 0, 4, 4, 0), &[0]),
    gi(4, 0, 7, 8, 143104, 1, 132, eng(7, 0, 8, 7, 1), &[0]),
    gi(7, 20, 1, 1, 16384, 1, 16, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 33024, 4, 26, eng(1, 0, 1, 1, 0), HALVES),
];

/// The Hopper models.
pub(super) static MODELS: [Model; 4] = [
    mig_model("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x2330_10DE, 81559, HOPPER, 132, (7, 8), H100_80GB),
    // UNV: PCIe memory and MIG tables assumed equal to SXM5.
    mig_model("H100-PCIE-80GB", "NVIDIA H100 PCIe", 0x2331_10DE, 81559, HOPPER, 114, (7, 8), H100_80GB),
    mig_model("H100-NVL-94GB", "NVIDIA H100 NVL", 0x2321_10DE, 95830, HOPPER, 132, (7, 8), H100_NVL),
    mig_model("H200-SXM-141GB", "NVIDIA H200", 0x2335_10DE, 143771, HOPPER, 132, (7, 8), H200),
];
