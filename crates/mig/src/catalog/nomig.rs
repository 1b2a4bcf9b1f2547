//! GPUs without MIG (Pascal, Volta, Turing, Ampere GA102, Ada). MPS is their sharing mechanism.
//! Total memory values are UNV (typical `nvidia-smi` figures).

use super::model::{Arch, Model};

const fn plain(
    id: &'static str,
    nvml_name: &'static str,
    pci_device_id: u32,
    memory_mib: u64,
    compute_capability: (u32, u32),
    arch: Arch,
    multiprocessors: u32,
) -> Model {
    Model { id, nvml_name, pci_device_id, memory_mib, compute_capability, arch, multiprocessors, mig: None }
}

/// The models without MIG.
pub(super) static MODELS: [Model; 7] = [
    plain("P100-PCIE-16GB", "Tesla P100-PCIE-16GB", 0x15F8_10DE, 16280, (6, 0), Arch::Pascal, 56),
    plain("V100-SXM2-16GB", "Tesla V100-SXM2-16GB", 0x1DB1_10DE, 16384, (7, 0), Arch::Volta, 80),
    plain("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 0x1DB5_10DE, 32768, (7, 0), Arch::Volta, 80),
    plain("T4-16GB", "Tesla T4", 0x1EB8_10DE, 15360, (7, 5), Arch::Turing, 40),
    plain("A10-24GB", "NVIDIA A10", 0x2236_10DE, 23028, (8, 6), Arch::Ampere, 72),
    plain("L4-24GB", "NVIDIA L4", 0x27B8_10DE, 23034, (8, 9), Arch::Ada, 58),
    plain("L40S-48GB", "NVIDIA L40S", 0x26B9_10DE, 46068, (8, 9), Arch::Ada, 142),
];
