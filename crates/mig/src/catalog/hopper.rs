//! Hopper models: H100 (SXM5, PCIe, NVL, 96 GB), H800, H20, H200 (SXM, NVL) and GH200.
//! Sources: mig-hardware.md §1 and §3.4–3.7.

use super::model::{eng, gi, mig_model, Arch, GiSpec, Model};

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

/// GH200 144G HBM3e: 1g/2g rows HW (`NVIDIA/mig-parted#139`); 3g/4g/7g DER from `3g.72gb`,
/// `4g.72gb`, `7g.144gb` in NVIDIA's default config (sizes UNV).
const GH200_144GB: &[GiSpec] = &[
    gi(0, 19, 1, 1, 17920, 7, 16, eng(1, 0, 1, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 36096, 3, 32, eng(2, 0, 2, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 72704, 2, 60, eng(3, 0, 3, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 72704, 1, 64, eng(4, 0, 4, 4, 0), &[0]),
    gi(4, 0, 7, 8, 145408, 1, 132, eng(7, 0, 8, 7, 1), &[0]),
    gi(7, 20, 1, 1, 17920, 1, 16, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 36096, 4, 26, eng(1, 0, 1, 1, 0), HALVES),
];

/// H100 96 GB, GH200 96 GB, PG506-96GB and H20: DER from mig-parted's group (`1g.12gb`,
/// `2g.24gb`, `3g.48gb`, `4g.48gb`, `7g.96gb`); no transcript, sizes UNV, H100 engines and SMs.
pub(super) const H100_96GB: &[GiSpec] = &[
    gi(0, 19, 1, 1, 11776, 7, 16, eng(1, 0, 1, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 23808, 3, 32, eng(2, 0, 2, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 48128, 2, 60, eng(3, 0, 3, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 48128, 1, 64, eng(4, 0, 4, 4, 0), &[0]),
    gi(4, 0, 7, 8, 96768, 1, 132, eng(7, 0, 8, 7, 1), &[0]),
    gi(7, 20, 1, 1, 11776, 1, 16, eng(1, 0, 1, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 23808, 4, 26, eng(1, 0, 1, 1, 0), HALVES),
];

/// The Hopper models. Rows after H200-SXM-141GB reuse a sibling's table (UNV: no transcript of
/// their own); total memory for the 96/144 GB parts is UNV.
pub(super) static MODELS: [Model; 12] = [
    mig_model("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x2330_10DE, 81559, HOPPER, 132, (7, 8), H100_80GB),
    // UNV: PCIe memory and MIG tables assumed equal to SXM5.
    mig_model("H100-PCIE-80GB", "NVIDIA H100 PCIe", 0x2331_10DE, 81559, HOPPER, 114, (7, 8), H100_80GB),
    mig_model("H100-NVL-94GB", "NVIDIA H100 NVL", 0x2321_10DE, 95830, HOPPER, 132, (7, 8), H100_NVL),
    mig_model("H200-SXM-141GB", "NVIDIA H200", 0x2335_10DE, 143771, HOPPER, 132, (7, 8), H200),
    mig_model("H200-NVL-141GB", "NVIDIA H200 NVL", 0x233B_10DE, 143771, HOPPER, 132, (7, 8), H200),
    mig_model("H800-80GB", "NVIDIA H800", 0x2324_10DE, 81559, HOPPER, 132, (7, 8), H100_80GB),
    mig_model("H800-PCIE-80GB", "NVIDIA H800 PCIe", 0x2322_10DE, 81559, HOPPER, 114, (7, 8), H100_80GB),
    mig_model("H800-NVL-94GB", "NVIDIA H800 NVL", 0x233A_10DE, 95830, HOPPER, 132, (7, 8), H100_NVL),
    mig_model("GH200-144GB", "NVIDIA GH200 144G HBM3e", 0x2348_10DE, 146880, HOPPER, 132, (7, 8), GH200_144GB),
    mig_model("GH200-96GB", "NVIDIA GH200 480GB", 0x2342_10DE, 97871, HOPPER, 132, (7, 8), H100_96GB),
    mig_model("H100-96GB", "NVIDIA H100 96GB", 0x233D_10DE, 97871, HOPPER, 132, (7, 8), H100_96GB),
    mig_model("H20-96GB", "NVIDIA H20", 0x2329_10DE, 97871, HOPPER, 78, (7, 8), H100_96GB),
];
