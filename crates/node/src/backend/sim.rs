//! The in-process simulator backend (`--simulate`, `--sim-state`): the `gpupart-mig` simulator
//! behind a mutex, saved atomically to the state file after every change. The per-operation delay
//! is slept outside the lock, so different GPUs progress concurrently as on real hardware.

use super::{BackendError, GpuBackend, ModeActivation};
use crate::mig::sim::fault::Faults;
use crate::mig::sim::ops::Activation;
use crate::mig::sim::store::{self, SharedFile, UpdateError};
use crate::mig::sim::{SimError, SimGpu, SimProcess, SimState};
use crate::mig::Placement;
use crate::observed::{CiState, ComputeMode, GiState, GpuInfo, GpuState, MigMode, Process};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Simulated GPUs, optionally persisted to a state file shared with other processes.
pub struct SimBackend {
    inner: Mutex<Inner>,
    path: Option<PathBuf>,
    op_delay: Duration,
    faults: Mutex<Faults>,
    /// The last event [`GpuBackend::next_event`] returned (or the last before its first call).
    event_cursor: Mutex<Option<u64>>,
}

struct Inner {
    state: SimState,
    file: Option<SharedFile>,
}

fn to_process(p: &SimProcess) -> Process {
    Process { pid: p.pid, name: p.name.clone(), used_memory_mib: p.used_memory_mib }
}

/// An existing state file is reused as it is; a `--simulate` that describes other GPUs is
/// refused rather than silently ignored.
fn check_spec_matches(spec: &str, state: &SimState, path: &Path) -> Result<(), BackendError> {
    let parsed = crate::mig::sim::parse_spec(spec).map_err(|e| BackendError::Unavailable(e.to_string()))?;
    let asked: Vec<&str> = parsed.iter().flat_map(|(m, n)| std::iter::repeat_n(m.id, *n as usize)).collect();
    let held: Vec<&str> = state.gpus.iter().map(|g| g.model.as_str()).collect();
    if asked == held {
        return Ok(());
    }
    let mut runs: Vec<(&str, u32)> = Vec::new();
    for m in &held {
        match runs.last_mut() {
            Some((last, n)) if last == m => *n += 1,
            _ => runs.push((m, 1)),
        }
    }
    let holds: Vec<String> = runs.iter().map(|(m, n)| format!("{m}:{n}")).collect();
    Err(BackendError::Unavailable(format!(
        "--simulate {spec} does not match the existing state file {}, which holds {}: leave --simulate out to \
         use the file, or remove the file to start from --simulate",
        path.display(),
        holds.join(",")
    )))
}

impl SimBackend {
    /// A backend over `state`, saved to `path` after each change when given.
    pub fn new(state: SimState, path: Option<PathBuf>) -> Self {
        let file = path.as_deref().map(SharedFile::new);
        Self {
            inner: Mutex::new(Inner { state, file }),
            path,
            op_delay: Duration::ZERO,
            faults: Mutex::new(Faults::default()),
            event_cursor: Mutex::new(None),
        }
    }

    /// Opens the simulator the CLI way: the state file when it exists, else a new node from
    /// `spec` (saved to the file when one is named).
    pub fn open(spec: Option<&str>, path: Option<&Path>) -> Result<Self, BackendError> {
        let state = match path {
            Some(p) if p.exists() => {
                let state = store::load(p).map_err(|e| BackendError::Unavailable(e.to_string()))?;
                if let Some(spec) = spec {
                    check_spec_matches(spec, &state, p)?;
                }
                state
            }
            _ => {
                let spec = spec.ok_or_else(|| {
                    BackendError::Unavailable(format!(
                        "state file {} does not exist; pass --simulate MODEL:COUNT to create it",
                        path.map_or_else(String::new, |p| p.display().to_string())
                    ))
                })?;
                let parsed = crate::mig::sim::parse_spec(spec).map_err(|e| BackendError::Unavailable(e.to_string()))?;
                let state = SimState::new(&parsed);
                if let Some(p) = path {
                    store::save(p, &state).map_err(|e| BackendError::Unavailable(e.to_string()))?;
                }
                state
            }
        };
        Ok(Self::new(state, path.map(Path::to_path_buf)))
    }

    /// Sleeps this long in every mutating call (outside the lock).
    pub fn with_op_delay(mut self, delay: Duration) -> Self {
        self.op_delay = delay;
        self
    }

    /// Injects faults (`FUNCTION:NTH:CODE[,…]`, NVML function names).
    pub fn with_faults(self, faults: Faults) -> Self {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
        self
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> SimState {
        self.lock().state.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current state, re-read first if another process changed the file.
    fn current(&self) -> Result<MutexGuard<'_, Inner>, BackendError> {
        let mut g = self.lock();
        let Inner { state, file } = &mut *g;
        if let Some(f) = file {
            f.refresh(state).map_err(|e| BackendError::Unavailable(e.to_string()))?;
        }
        Ok(g)
    }

    /// Runs one mutating simulator call: delay, injected fault, change a copy, save, commit.
    fn mutate<T>(
        &self,
        gpu: u32,
        function: &'static str,
        op: impl FnOnce(&mut SimState) -> Result<T, SimError>,
    ) -> Result<T, BackendError> {
        if !self.op_delay.is_zero() {
            std::thread::sleep(self.op_delay);
        }
        if let Some(code) = self.faults.lock().unwrap_or_else(|e| e.into_inner()).hit(function) {
            return Err(BackendError::call(gpu, function, code, "injected fault"));
        }
        let mut guard = self.lock();
        let Inner { state, file } = &mut *guard;
        let call = |e: SimError| BackendError::call(gpu, function, e.code as u32, e.detail);
        match file {
            Some(f) => f.update(state, op).map_err(|e| match e {
                UpdateError::Change(e) => call(e),
                UpdateError::Store(e) => BackendError::Persist(e.to_string()),
            }),
            None => {
                let mut next = state.clone();
                let out = op(&mut next).map_err(call)?;
                *state = next;
                Ok(out)
            }
        }
    }
}

fn observe_gpu(g: &SimGpu) -> Result<GpuState, BackendError> {
    let model = g
        .catalog_model()
        .ok_or_else(|| BackendError::Unavailable(format!("GPU {}: unknown model {}", g.index, g.model)))?;
    let instances = g
        .gpu_instances
        .iter()
        .map(|gi| GiState {
            id: gi.id,
            profile_id: gi.profile_id,
            placement: gi.placement,
            processes: gi.processes.iter().map(to_process).collect(),
            cis: gi
                .compute_instances
                .iter()
                .map(|c| CiState {
                    id: c.id,
                    profile_id: c.profile_id,
                    placement: c.placement,
                    uuid: c.uuid.clone(),
                    processes: c.processes.iter().map(to_process).collect(),
                    pods: Vec::new(),
                })
                .collect(),
        })
        .collect();
    Ok(GpuState {
        info: GpuInfo {
            index: g.index,
            minor: g.index,
            uuid: g.uuid.clone(),
            model: model.id.to_string(),
            name: model.nvml_name.to_string(),
            pci_device_id: model.pci_device_id,
            pci_subsystem_id: None,
            bus_id: g.bus_id.clone(),
            memory_total_bytes: model.memory_bytes(),
            mig_capable: model.mig_capable(),
            mode_change_needs_reset: model.arch.mig_mode_needs_reset(),
            compute_capability: model.compute_capability,
        },
        mig_mode: MigMode { current: g.mig_mode.current, pending: g.mig_mode.pending },
        profiles: model.profile_table(),
        instances,
        processes: g.processes.iter().map(to_process).collect(),
        compute_mode: g.compute_mode,
        pods: Vec::new(),
    })
}

impl GpuBackend for SimBackend {
    fn next_event(&self, timeout: Duration) -> Result<Option<crate::health::GpuEvent>, BackendError> {
        let until = std::time::Instant::now() + timeout;
        let mut cursor = self.event_cursor.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let next = {
                let g = self.current()?;
                // A GPU that fell off the bus ends every wait, as the driver does.
                if let Some(lost) = g.state.gpus.iter().find(|x| x.lost) {
                    let why = format!("GPU {} has fallen off the bus", lost.index);
                    return Err(BackendError::call(lost.index, "nvmlEventSetWait_v2", super::GPU_IS_LOST, why));
                }
                let after = *cursor.get_or_insert_with(|| g.state.events.last().map_or(0, |e| e.seq));
                g.state.events.iter().find(|e| e.seq > after).cloned()
            };
            if let Some(e) = next {
                *cursor = Some(e.seq);
                let (gi, ci) = (e.gpu_instance_id.unwrap_or(u32::MAX), e.compute_instance_id.unwrap_or(u32::MAX));
                if let Some(ev) = super::stamped(e.gpu, e.event_type, e.data, gi, ci) {
                    return Ok(Some(ev));
                }
                continue;
            }
            if std::time::Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(
                Duration::from_millis(5).min(until.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }

    fn serves_events(&self) -> bool {
        true
    }
    fn is_simulated(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let n = self.lock().state.gpus.len();
        match &self.path {
            Some(p) => format!("simulator: {n} GPUs, state in {}", p.display()),
            None => format!("simulator: {n} GPUs, in memory"),
        }
    }

    fn driver_version(&self) -> Result<String, BackendError> {
        Ok(crate::mig::sim::DRIVER_VERSION.to_string())
    }

    fn gpu_count(&self) -> Result<u32, BackendError> {
        Ok(self.current()?.state.gpus.len() as u32)
    }

    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError> {
        let inner = self.current()?;
        let g = inner
            .state
            .gpu(gpu)
            .map_err(|e| BackendError::call(gpu, "nvmlDeviceGetHandleByIndex_v2", e.code as u32, e.detail))?;
        observe_gpu(g)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<ModeActivation, BackendError> {
        let a = self.mutate(gpu, "nvmlDeviceSetMigMode", |s| s.set_mig_mode(gpu, enabled))?;
        Ok(match a {
            Activation::Done => ModeActivation::Done,
            Activation::PendingReset => ModeActivation::PendingReset,
            Activation::InUse => ModeActivation::InUse,
            Activation::RebootRequired => ModeActivation::RebootRequired,
        })
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        self.mutate(gpu, "nvidia-smi --gpu-reset", |s| s.reset(gpu))
    }

    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, placement: Placement) -> Result<u32, BackendError> {
        self.mutate(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement", |s| {
            s.create_gpu_instance(gpu, profile_id, Some(placement))
        })
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: u32,
        ci_profile_id: u32,
        placement: Placement,
    ) -> Result<u32, BackendError> {
        self.mutate(gpu, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", |s| {
            s.create_compute_instance(gpu, gi, ci_profile_id, Some(placement.start))
        })
    }

    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.mutate(gpu, "nvmlComputeInstanceDestroy", |s| s.destroy_compute_instance(gpu, gi, ci))
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.mutate(gpu, "nvmlGpuInstanceDestroy", |s| s.destroy_gpu_instance(gpu, gi))
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        self.mutate(gpu, "nvmlDeviceSetComputeMode", |s| s.set_compute_mode(gpu, mode))
    }
}
