//! The hardware catalog: every GPU model gpupart knows, with its MIG geometry and profile tables.
//!
//! Values come from `shared/reference/mig-hardware.md`. Values tagged `[UNV]` there are kept and
//! marked `UNV` in comments. On real hardware the product reads profiles from NVML; the catalog
//! feeds the simulator, the fake NVML library and offline validation only.

mod ampere;
mod blackwell;
mod hopper;
mod model;
mod nomig;

pub use model::{ci_profiles, Arch, GiSpec, MigSpec, Model};

/// All catalog models, one per PCI device id.
pub fn models() -> impl Iterator<Item = &'static Model> {
    ampere::MODELS.iter().chain(hopper::MODELS.iter()).chain(blackwell::MODELS.iter()).chain(nomig::MODELS.iter())
}

/// Driver variants: a model's PCI device with the profile sizes (hence names) an older driver
/// reported. Looked up by id; never chosen by PCI id.
pub fn driver_variants() -> impl Iterator<Item = &'static Model> {
    blackwell::VARIANTS.iter()
}

/// Every model and driver variant.
pub fn all_models() -> impl Iterator<Item = &'static Model> {
    models().chain(driver_variants())
}

/// Looks a model (or driver variant) up by id, case-insensitively.
pub fn lookup(id: &str) -> Option<&'static Model> {
    all_models().find(|m| m.id.eq_ignore_ascii_case(id.trim()))
}

/// Looks a model up by its 32-bit PCI device id (`0x20B210DE`).
pub fn by_pci_device_id(pci_device_id: u32) -> Option<&'static Model> {
    models().find(|m| m.pci_device_id == pci_device_id)
}

/// Comma-separated list of every model id, for error messages.
pub fn model_ids() -> String {
    all_models().map(|m| m.id).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
