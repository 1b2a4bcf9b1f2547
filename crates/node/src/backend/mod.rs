//! The GPU backend: the one trait through which gpupart observes and changes GPUs. Implemented by
//! the in-process simulator ([`sim::SimBackend`]) and, on hardware, by NVML.

mod factory;
pub mod nvml;
mod nvml_ffi;
mod options;
pub mod sim;

use crate::mig::sim::fault::code_name;
use crate::mig::Placement;
use crate::observed::{ComputeMode, GpuState};
pub use factory::open;
pub use options::GpuOptions;

/// A failed backend operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// An NVML (or simulated NVML) call failed.
    #[error("GPU {gpu}: {function} failed with {name} ({code}): {detail}")]
    Call {
        /// GPU index.
        gpu: u32,
        /// The NVML function.
        function: &'static str,
        /// The NVML return code.
        code: u32,
        /// Its `NVML_ERROR_*` name.
        name: &'static str,
        /// What else is known.
        detail: String,
    },
    /// The backend cannot be used at all (library missing, state file unreadable, …).
    #[error("{0}")]
    Unavailable(String),
    /// Saving the state after a change failed; the change was not made.
    #[error("{0}")]
    Persist(String),
}

/// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus or is otherwise inaccessible.
pub const GPU_IS_LOST: u32 = crate::mig::sim::NvmlCode::GpuIsLost as u32;

impl BackendError {
    /// Whether the call failed because its GPU is lost ([`GPU_IS_LOST`]).
    pub fn is_gpu_lost(&self) -> bool {
        matches!(self, BackendError::Call { code: GPU_IS_LOST, .. })
    }

    /// A failed call with the name looked up from the code.
    pub fn call(gpu: u32, function: &'static str, code: u32, detail: impl Into<String>) -> Self {
        Self::Call { gpu, function, code, name: code_name(code), detail: detail.into() }
    }

    /// The NVML return code, when the error came from a call.
    pub fn code(&self) -> Option<u32> {
        match self {
            Self::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Result of a MIG mode change request (`activationStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeActivation {
    /// The mode is in effect.
    Done,
    /// The mode is pending until this GPU is reset (Ampere).
    PendingReset,
    /// The GPU is not idle; nothing changed.
    InUse,
    /// Only a reboot can apply the mode (pass-through, no reset exposed).
    RebootRequired,
}

/// Observes and changes the GPUs of one node. Calls on different GPUs may run concurrently.
pub trait GpuBackend: Send + Sync {
    /// One line saying what this backend is (`simulator: 8 GPUs, state in /tmp/x.json`).
    fn describe(&self) -> String;

    /// Waits up to `timeout` for the next XID or ECC event of the node's GPUs; `Ok(None)` when
    /// none came. The GPUs are registered at the first call (earlier events are not seen).
    fn next_event(&self, timeout: std::time::Duration) -> Result<Option<crate::health::GpuEvent>, BackendError> {
        let _ = timeout;
        Err(BackendError::Unavailable(format!("{} serves no NVML events", self.describe())))
    }
    /// Whether [`GpuBackend::next_event`] serves events.
    fn serves_events(&self) -> bool {
        false
    }
    /// True when the GPUs are simulated: nothing real is read or changed.
    fn is_simulated(&self) -> bool {
        false
    }
    /// Number of GPUs.
    fn gpu_count(&self) -> Result<u32, BackendError>;
    /// The NVIDIA driver's version (`nvmlSystemGetDriverVersion`).
    fn driver_version(&self) -> Result<String, BackendError>;
    /// Everything about one GPU now.
    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError>;
    /// Requests MIG mode on or off.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<ModeActivation, BackendError>;
    /// Resets one GPU (applies a pending MIG mode); fails while processes use it.
    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError>;
    /// Creates a GPU instance at an explicit placement; returns its id.
    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, placement: Placement) -> Result<u32, BackendError>;
    /// Creates a compute instance at an explicit placement inside a GI; returns its id.
    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: u32,
        ci_profile_id: u32,
        placement: Placement,
    ) -> Result<u32, BackendError>;
    /// Destroys a compute instance.
    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError>;
    /// Destroys a GPU instance (its CIs must be gone).
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError>;
    /// Sets the compute mode (`nvmlDeviceSetComputeMode`; EXCLUSIVE_PROCESS for MPS).
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError>;

    /// Observes every GPU.
    fn observe_all(&self) -> Result<Vec<GpuState>, BackendError> {
        (0..self.gpu_count()?).map(|i| self.observe(i)).collect()
    }
}

/// An event as NVML's `nvmlEventData_t` gives it, stamped with the time it was read (the event
/// sources of both backends).
pub(crate) fn stamped(gpu: u32, event_type: u64, data: u64, gi: u32, ci: u32) -> Option<crate::health::GpuEvent> {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_secs() as i64);
    crate::health::from_nvml(gpu, event_type, data, gi, ci, at)
}
