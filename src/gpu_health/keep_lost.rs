//! A GPU backend that shows a GPU which fell off the bus as it was last seen: observing every GPU
//! succeeds while one is lost, so the agent's reconciles, its summary and the DRA plugin's
//! publications and Prepares go on for the other GPUs (the lost one is fenced by the watch, so
//! nothing is planned or prepared on it). Every change still goes to the GPU, and fails there.

use crate::backend::{BackendError, GpuBackend, ModeActivation};
use crate::mig::Placement;
use crate::observed::{ComputeMode, GpuState};
use std::sync::{Arc, Mutex};

/// Wraps a backend; see the module doc.
pub struct KeepingLost {
    inner: Arc<dyn GpuBackend>,
    seen: Mutex<Vec<Option<GpuState>>>,
}

impl KeepingLost {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn GpuBackend>) -> Self {
        Self { inner, seen: Mutex::default() }
    }
}

impl GpuBackend for KeepingLost {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn next_event(&self, timeout: std::time::Duration) -> Result<Option<crate::health::GpuEvent>, BackendError> {
        self.inner.next_event(timeout)
    }
    fn serves_events(&self) -> bool {
        self.inner.serves_events()
    }
    fn is_simulated(&self) -> bool {
        self.inner.is_simulated()
    }
    fn gpu_count(&self) -> Result<u32, BackendError> {
        self.inner.gpu_count()
    }
    fn driver_version(&self) -> Result<String, BackendError> {
        self.inner.driver_version()
    }
    /// The GPU now; as last seen while it is lost (the error when it never was seen).
    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let slot = gpu as usize;
        match self.inner.observe(gpu) {
            Ok(s) => {
                if seen.len() <= slot {
                    seen.resize(slot + 1, None);
                }
                seen[slot] = Some(s.clone());
                Ok(s)
            }
            Err(e) if e.is_gpu_lost() => seen.get(slot).cloned().flatten().ok_or(e),
            Err(e) => Err(e),
        }
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<ModeActivation, BackendError> {
        self.inner.set_mig_mode(gpu, enabled)
    }
    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        self.inner.reset_gpu(gpu)
    }
    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, placement: Placement) -> Result<u32, BackendError> {
        self.inner.create_gpu_instance(gpu, profile_id, placement)
    }
    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: u32,
        ci_profile_id: u32,
        placement: Placement,
    ) -> Result<u32, BackendError> {
        self.inner.create_compute_instance(gpu, gi, ci_profile_id, placement)
    }
    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.inner.destroy_compute_instance(gpu, gi, ci)
    }
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.inner.destroy_gpu_instance(gpu, gi)
    }
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        self.inner.set_compute_mode(gpu, mode)
    }
}
