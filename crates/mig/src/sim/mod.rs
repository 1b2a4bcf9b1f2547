//! A simulated node of GPUs that follows the driver's MIG rules, used by `--simulate` and by
//! the fake NVML library. [`state`] is the documented JSON format, [`ops`] the NVML-like calls,
//! [`store`] the atomic state file.

/// The driver version simulated GPUs report (`nvmlSystemGetDriverVersion`).
pub const DRIVER_VERSION: &str = "580.65.06";

pub mod fault;
pub mod ids;
pub mod ops;
pub mod spec;
pub mod state;
pub mod store;

pub use ops::{NvmlCode, SimError};
pub use spec::{parse_spec, SpecError};
pub use state::{ComputeMode, MigModeState, SimCi, SimEvent, SimGi, SimGpu, SimProcess, SimState};

#[cfg(test)]
mod tests;
