//! Blackwell models: B200, GB200, B300, GB300 and the RTX PRO 6000 Blackwell Server Edition.
//! Sources: mig-hardware.md §1, §2, §3.8, §3.9. Only the first rows of B200/GB200 were seen on
//! hardware; everything else is DER from the profile names in NVIDIA's default config (a name's
//! `<GB>` fixes the memory fraction, see name.rs) and is UNV: memory sizes are chosen inside the
//! band that yields the published names, SM counts and engines follow the guide's fractions.

use super::model::{eng, gi, mig_model, Arch, GiSpec, Model};

const BLACKWELL: ((u32, u32), Arch) = ((10, 0), Arch::Blackwell);
const BLACKWELL_ULTRA: ((u32, u32), Arch) = ((10, 3), Arch::Blackwell);
const RTX_BLACKWELL: ((u32, u32), Arch) = ((12, 0), Arch::Blackwell);

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const HALVES: &[u32] = &[0, 2, 4, 6];

/// B200: 1g rows HW (`NVIDIA/mig-parted#166`, Jan 2025 sizes), 3g/4g/7g DER (names `3g.90gb`,
/// `4g.90gb`, `7g.180gb`; memory, SMs UNV), copy engines from the guide.
const B200: &[GiSpec] = &[
    gi(0, 19, 1, 1, 22528, 7, 18, eng(1, 0, 2, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 45312, 3, 36, eng(2, 0, 4, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 90368, 2, 54, eng(3, 0, 6, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 90368, 1, 72, eng(4, 0, 8, 4, 0), &[0]),
    gi(4, 0, 7, 8, 182272, 1, 148, eng(7, 0, 16, 7, 1), &[0]),
    gi(7, 20, 1, 1, 22528, 1, 18, eng(1, 0, 2, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 45312, 4, 30, eng(1, 0, 2, 1, 0), HALVES),
];

/// GB200 with the August 2025 driver (`NVIDIA/mig-parted#227`: `1g.23gb` at 22.00 GiB, 45.50 GiB
/// for 1g.47gb/2g.47gb); 3g/4g/7g DER from `3g.93gb`, `4g.93gb`, `7g.186gb` (UNV sizes).
const GB200: &[GiSpec] = &[
    gi(0, 19, 1, 1, 22528, 7, 18, eng(1, 0, 2, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 46592, 3, 38, eng(2, 0, 4, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 93184, 2, 56, eng(3, 0, 6, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 93184, 1, 76, eng(4, 0, 8, 4, 0), &[0]),
    gi(4, 0, 7, 8, 188928, 1, 152, eng(7, 0, 16, 7, 1), &[0]),
    gi(7, 20, 1, 1, 22528, 1, 18, eng(1, 0, 2, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 46592, 4, 32, eng(1, 0, 2, 1, 0), HALVES),
];

/// GB200 with the March 2025 driver (`NVIDIA/gpu-operator#1303`: `1g.24gb` at 20.00 GiB, 45.50
/// GiB for the 2-slice rows): a 189 GB total, which names the untied `3g.95gb`, `4g.95gb` and
/// `7g.189gb` of NVIDIA's default config (DER; sizes UNV).
const GB200_R570: &[GiSpec] = &[
    gi(0, 19, 1, 1, 20480, 7, 18, eng(1, 0, 2, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 46592, 3, 38, eng(2, 0, 4, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 94208, 2, 56, eng(3, 0, 6, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 94208, 1, 76, eng(4, 0, 8, 4, 0), &[0]),
    gi(4, 0, 7, 8, 191488, 1, 152, eng(7, 0, 16, 7, 1), &[0]),
    gi(7, 20, 1, 1, 20480, 1, 18, eng(1, 0, 2, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 46592, 4, 32, eng(1, 0, 2, 1, 0), HALVES),
];

/// B300: DER from NVIDIA's default config (`1g.34gb` ×7, `1g.67gb` ×4, `2g.67gb` ×3, `3g.135gb`
/// ×2, `4g.135gb`, `7g.269gb`); sizes and SMs UNV.
const B300: &[GiSpec] = &[
    gi(0, 19, 1, 1, 33792, 7, 18, eng(1, 0, 2, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 68096, 3, 36, eng(2, 0, 4, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 136448, 2, 54, eng(3, 0, 6, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 136448, 1, 72, eng(4, 0, 8, 4, 0), &[0]),
    gi(4, 0, 7, 8, 273408, 1, 148, eng(7, 0, 16, 7, 1), &[0]),
    gi(7, 20, 1, 1, 33792, 1, 18, eng(1, 0, 2, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 68096, 4, 30, eng(1, 0, 2, 1, 0), HALVES),
];

/// GB300: DER from NVIDIA's default config (`1g.35gb` ×7, `1g.70gb` ×4, `2g.70gb` ×3,
/// `3g.139gb` ×2, `4g.139gb`, `7g.278gb`); sizes and SMs UNV.
const GB300: &[GiSpec] = &[
    gi(0, 19, 1, 1, 34816, 7, 18, eng(1, 0, 2, 1, 0), ALL_1G),
    gi(1, 14, 2, 2, 70400, 3, 38, eng(2, 0, 4, 2, 0), &[0, 2, 4]),
    gi(2, 9, 3, 4, 140800, 2, 56, eng(3, 0, 6, 3, 0), &[0, 4]),
    gi(3, 5, 4, 4, 140800, 1, 76, eng(4, 0, 8, 4, 0), &[0]),
    gi(4, 0, 7, 8, 282624, 1, 152, eng(7, 0, 16, 7, 1), &[0]),
    gi(7, 20, 1, 1, 34816, 1, 18, eng(1, 0, 2, 1, 1), ALL_1G),
    gi(9, 15, 1, 2, 70400, 4, 32, eng(1, 0, 2, 1, 0), HALVES),
];

const QUARTERS: &[u32] = &[0, 1, 2, 3];

/// RTX PRO 6000 Blackwell Server Edition: 4 compute and 4 memory slices; profile ids HW
/// (`bigstack-oss/cubecos#312`), counts from NVIDIA's default config, sizes/SMs/engines UNV.
/// `+me.all` holds every media engine, so only `-me` profiles fit beside it (the header's rule);
/// `-me` profiles hold none.
const RTX_PRO_6000: &[GiSpec] = &[
    gi(0x0, 14, 1, 1, 24064, 4, 46, eng(1, 1, 1, 1, 0), QUARTERS),
    gi(0x1, 5, 2, 2, 48384, 2, 94, eng(2, 2, 2, 2, 0), &[0, 2]),
    gi(0x3, 0, 4, 4, 96768, 1, 188, eng(4, 4, 4, 4, 1), &[0]),
    gi(0x7, 21, 1, 1, 24064, 1, 46, eng(1, 1, 1, 1, 1), QUARTERS),
    gi(0xA, 47, 1, 1, 24064, 4, 46, eng(1, 1, 1, 1, 0), QUARTERS),
    gi(0xB, 35, 2, 2, 48384, 2, 94, eng(2, 2, 2, 2, 0), &[0, 2]),
    gi(0xC, 32, 4, 4, 96768, 1, 188, eng(4, 4, 4, 4, 1), &[0]),
    gi(0xD, 67, 1, 1, 24064, 4, 46, eng(0, 0, 1, 0, 0), QUARTERS),
    gi(0xE, 66, 2, 2, 48384, 2, 94, eng(0, 0, 2, 0, 0), &[0, 2]),
    gi(0xF, 65, 1, 1, 24064, 1, 46, eng(4, 4, 1, 4, 1), QUARTERS),
    gi(0x10, 64, 2, 2, 48384, 1, 94, eng(4, 4, 2, 4, 1), &[0, 2]),
];

/// The Blackwell models. Total memory is UNV for all (chosen so the names derive as published).
pub(super) static MODELS: [Model; 5] = [
    mig_model("B200-180GB", "NVIDIA B200", 0x2901_10DE, 183359, BLACKWELL, 148, (7, 8), B200),
    mig_model("GB200-186GB", "NVIDIA GB200", 0x2941_10DE, 189471, BLACKWELL, 152, (7, 8), GB200),
    mig_model("B300-269GB", "NVIDIA B300 SXM6 AC", 0x3182_10DE, 275040, BLACKWELL_ULTRA, 148, (7, 8), B300),
    mig_model("GB300-278GB", "NVIDIA GB300", 0x31C2_10DE, 284208, BLACKWELL_ULTRA, 152, (7, 8), GB300),
    mig_model(
        "RTX-PRO-6000-96GB",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        0x2BB5_10DE,
        97887,
        RTX_BLACKWELL,
        188,
        (4, 4),
        RTX_PRO_6000,
    ),
];

/// Driver variants: the same PCI device as a model above with the profile sizes an older driver
/// reported. Found by id (`--simulate GB200-186GB-R570:4`), never by PCI id.
pub(super) static VARIANTS: [Model; 1] =
    [mig_model("GB200-186GB-R570", "NVIDIA GB200", 0x2941_10DE, 193314, BLACKWELL, 152, (7, 8), GB200_R570)];
