//! NVML-like operations on a [`SimState`], returning NVML return codes on failure.

use super::ids;
use super::state::{ComputeMode, MigModeState, SimCi, SimGi, SimGpu, SimState, STATE_VERSION};
use crate::capacity::Occupancy;
use crate::catalog::Model;
use crate::profile::ProfileTable;
use crate::Placement;
use std::fmt;

/// The NVML return codes the simulator produces (values from `nvml.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum NvmlCode {
    /// NVML_ERROR_INVALID_ARGUMENT
    InvalidArgument = 2,
    /// NVML_ERROR_NOT_SUPPORTED
    NotSupported = 3,
    /// NVML_ERROR_NOT_FOUND
    NotFound = 6,
    /// NVML_ERROR_GPU_IS_LOST
    GpuIsLost = 15,
    /// NVML_ERROR_RESET_REQUIRED
    ResetRequired = 16,
    /// NVML_ERROR_IN_USE
    InUse = 19,
    /// NVML_ERROR_INSUFFICIENT_RESOURCES
    InsufficientResources = 23,
    /// NVML_ERROR_UNKNOWN
    Unknown = 999,
}

impl NvmlCode {
    /// The `NVML_ERROR_*` name.
    pub fn name(self) -> &'static str {
        match self {
            NvmlCode::InvalidArgument => "NVML_ERROR_INVALID_ARGUMENT",
            NvmlCode::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
            NvmlCode::NotFound => "NVML_ERROR_NOT_FOUND",
            NvmlCode::GpuIsLost => "NVML_ERROR_GPU_IS_LOST",
            NvmlCode::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
            NvmlCode::InUse => "NVML_ERROR_IN_USE",
            NvmlCode::InsufficientResources => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            NvmlCode::Unknown => "NVML_ERROR_UNKNOWN",
        }
    }
}

/// A failed simulated call: the NVML code and what the simulator knows about why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SimError {
    /// The NVML return code.
    pub code: NvmlCode,
    /// Explanation.
    pub detail: String,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code.name(), self.code as u32, self.detail)
    }
}

fn err<T>(code: NvmlCode, detail: impl Into<String>) -> Result<T, SimError> {
    Err(SimError { code, detail: detail.into() })
}

/// Outcome of a MIG mode change request (`activationStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The mode is now in effect.
    Done,
    /// The mode is pending until the GPU is reset (Ampere).
    PendingReset,
    /// The device is not idle; nothing changed (NVML_ERROR_IN_USE).
    InUse,
    /// No GPU reset is exposed (pass-through): pending until the machine reboots
    /// (NVML_ERROR_RESET_REQUIRED).
    RebootRequired,
}

impl SimState {
    /// A fresh node: GPUs numbered in spec order, MIG disabled, no processes.
    pub fn new(spec: &[(&'static Model, u32)]) -> Self {
        let mut gpus = Vec::new();
        for (model, count) in spec {
            for _ in 0..*count {
                let index = gpus.len() as u32;
                gpus.push(SimGpu {
                    index,
                    model: model.id.to_string(),
                    uuid: ids::gpu_uuid(model.id, index),
                    bus_id: ids::bus_id(index),
                    mig_mode: MigModeState::default(),
                    passthrough: false,
                    lost: false,
                    compute_mode: ComputeMode::Default,
                    processes: Vec::new(),
                    gpu_instances: Vec::new(),
                });
            }
        }
        Self { version: STATE_VERSION, serial: 0, gpus, events: Vec::new() }
    }

    /// Checks the invariants a loaded state file must satisfy (known models, indices in order,
    /// legal and disjoint placements, known CI profiles).
    pub fn validate(&self) -> Result<(), String> {
        if self.version != STATE_VERSION {
            return Err(format!("unsupported state version {} (expected {STATE_VERSION})", self.version));
        }
        for (i, gpu) in self.gpus.iter().enumerate() {
            let at = format!("gpus[{i}]");
            if gpu.index as usize != i {
                return Err(format!("{at}: index {} is out of order", gpu.index));
            }
            let model = gpu.catalog_model().ok_or_else(|| format!("{at}: unknown model '{}'", gpu.model))?;
            if !model.mig_capable() && (gpu.mig_mode.current || gpu.mig_mode.pending || !gpu.gpu_instances.is_empty()) {
                return Err(format!("{at}: {} does not support MIG", model.id));
            }
            if !gpu.mig_mode.current && !gpu.gpu_instances.is_empty() {
                return Err(format!("{at}: GPU instances exist while MIG mode is disabled"));
            }
            let table = model.profile_table();
            let mut occ = Occupancy::empty();
            for gi in &gpu.gpu_instances {
                let profile = table
                    .by_id(gi.profile_id)
                    .ok_or_else(|| format!("{at}: GI {} has unknown profile id {}", gi.id, gi.profile_id))?;
                occ.check(&table, profile, gi.placement).map_err(|e| format!("{at}: GI {}: {e}", gi.id))?;
                occ.add(profile, gi.placement);
                if gpu.gpu_instances.iter().filter(|g| g.id == gi.id).count() > 1 {
                    return Err(format!("{at}: duplicate GI id {}", gi.id));
                }
                let mut ci_mask = 0u32;
                for ci in &gi.compute_instances {
                    let cp = profile.ci(ci.profile_id).ok_or_else(|| {
                        format!("{at}: GI {} CI {} has unknown CI profile {}", gi.id, ci.id, ci.profile_id)
                    })?;
                    if !cp.placements.contains(&ci.placement.start)
                        || ci.placement.size != cp.slices
                        || ci_mask & ci.placement.mask() != 0
                    {
                        return Err(format!(
                            "{at}: GI {} CI {} has an illegal placement {}",
                            gi.id, ci.id, ci.placement
                        ));
                    }
                    ci_mask |= ci.placement.mask();
                }
            }
        }
        Ok(())
    }

    /// The GPU at `index`.
    pub fn gpu(&self, index: u32) -> Result<&SimGpu, SimError> {
        match self.gpus.get(index as usize) {
            Some(g) if g.lost => err(NvmlCode::GpuIsLost, format!("GPU {index} has fallen off the bus")),
            Some(g) => Ok(g),
            None => err(NvmlCode::InvalidArgument, format!("no GPU with index {index}")),
        }
    }

    fn gpu_mut(&mut self, index: u32) -> Result<&mut SimGpu, SimError> {
        match self.gpus.get_mut(index as usize) {
            Some(g) if g.lost => err(NvmlCode::GpuIsLost, format!("GPU {index} has fallen off the bus")),
            Some(g) => Ok(g),
            None => err(NvmlCode::InvalidArgument, format!("no GPU with index {index}")),
        }
    }

    /// The catalog model of GPU `index`.
    pub fn model(&self, index: u32) -> Result<&'static Model, SimError> {
        let gpu = self.gpu(index)?;
        match gpu.catalog_model() {
            Some(m) => Ok(m),
            None => err(NvmlCode::Unknown, format!("unknown model '{}'", gpu.model)),
        }
    }

    /// The profile table of GPU `index` (empty without MIG).
    pub fn profile_table(&self, index: u32) -> Result<ProfileTable, SimError> {
        Ok(self.model(index)?.profile_table())
    }

    fn require_mig(&self, index: u32) -> Result<(&'static Model, ProfileTable), SimError> {
        let model = self.model(index)?;
        if !model.mig_capable() {
            return err(NvmlCode::NotSupported, format!("{} does not support MIG", model.id));
        }
        if !self.gpu(index)?.mig_mode.current {
            return err(NvmlCode::NotSupported, "MIG mode is not enabled");
        }
        Ok((model, model.profile_table()))
    }

    /// `nvmlDeviceSetMigMode`: Ampere leaves the mode pending until reset, Hopper applies it at
    /// once; a busy GPU (or, when disabling, one with GPU instances) reports `InUse`.
    pub fn set_mig_mode(&mut self, index: u32, enabled: bool) -> Result<Activation, SimError> {
        let model = self.model(index)?;
        if !model.mig_capable() {
            return err(NvmlCode::NotSupported, format!("{} does not support MIG", model.id));
        }
        let gpu = self.gpu_mut(index)?;
        if gpu.mig_mode.current == enabled && gpu.mig_mode.pending == enabled {
            return Ok(Activation::Done);
        }
        if !enabled && !gpu.gpu_instances.is_empty() {
            return Ok(Activation::InUse);
        }
        if gpu.passthrough {
            gpu.mig_mode.pending = enabled;
            return Ok(Activation::RebootRequired);
        }
        if model.arch.mig_mode_needs_reset() {
            gpu.mig_mode.pending = enabled;
            if gpu.mig_mode.current == enabled {
                return Ok(Activation::Done);
            }
            return Ok(Activation::PendingReset);
        }
        if gpu.all_processes().next().is_some() {
            return Ok(Activation::InUse);
        }
        gpu.mig_mode = MigModeState { current: enabled, pending: enabled };
        Ok(Activation::Done)
    }

    /// `nvmlDeviceSetComputeMode`: EXCLUSIVE_THREAD was removed from current drivers
    /// (`NOT_SUPPORTED`); every other mode is taken on any GPU.
    pub fn set_compute_mode(&mut self, index: u32, mode: ComputeMode) -> Result<(), SimError> {
        let gpu = self.gpu_mut(index)?;
        if mode == ComputeMode::ExclusiveThread {
            return err(NvmlCode::NotSupported, "EXCLUSIVE_THREAD compute mode is no longer supported");
        }
        gpu.compute_mode = mode;
        Ok(())
    }

    /// GPU reset (`nvidia-smi --gpu-reset`): refused while processes run; applies the pending MIG
    /// mode and destroys every GPU instance.
    pub fn reset(&mut self, index: u32) -> Result<(), SimError> {
        let gpu = self.gpu_mut(index)?;
        if gpu.passthrough {
            return err(NvmlCode::NotSupported, format!("GPU {index}: reset is not available (pass-through)"));
        }
        if let Some(p) = gpu.all_processes().next() {
            return err(NvmlCode::InUse, format!("GPU {index} is in use by process {}", p.pid));
        }
        gpu.mig_mode.current = gpu.mig_mode.pending;
        gpu.gpu_instances.clear();
        Ok(())
    }

    /// `nvmlDeviceCreateGpuInstance[WithPlacement]`; without a placement the simulator picks the
    /// highest free legal placement, as drivers tend to.
    pub fn create_gpu_instance(
        &mut self,
        index: u32,
        profile_id: u32,
        placement: Option<Placement>,
    ) -> Result<u32, SimError> {
        let (_, table) = self.require_mig(index)?;
        let Some(profile) = table.by_id(profile_id) else {
            return err(NvmlCode::InvalidArgument, format!("unknown GPU instance profile id {profile_id}"));
        };
        let gpu = self.gpu(index)?;
        let occ = Occupancy::of(&table, gpu.gpu_instances.iter().map(|g| (g.profile_id, g.placement)));
        let placement = match placement {
            Some(p) if !profile.placements.contains(&p) => {
                return err(NvmlCode::InvalidArgument, format!("{p} is not a legal placement of {}", profile.name));
            }
            Some(p) => p,
            None => match profile.placements.iter().rev().find(|p| occ.check(&table, profile, **p).is_ok()) {
                Some(p) => *p,
                None => return err(NvmlCode::InsufficientResources, format!("no free placement for {}", profile.name)),
            },
        };
        if let Err(conflict) = occ.check(&table, profile, placement) {
            return err(NvmlCode::InsufficientResources, conflict.to_string());
        }
        let id = (1..).find(|id| gpu.gi(*id).is_none()).unwrap_or(u32::MAX);
        self.gpu_mut(index)?.gpu_instances.push(SimGi {
            id,
            profile_id,
            placement,
            processes: Vec::new(),
            compute_instances: Vec::new(),
        });
        Ok(id)
    }

    /// `nvmlGpuInstanceCreateComputeInstance[WithPlacement]`; without a start slice the lowest
    /// free legal one is used.
    pub fn create_compute_instance(
        &mut self,
        index: u32,
        gi_id: u32,
        ci_profile_id: u32,
        start: Option<u32>,
    ) -> Result<u32, SimError> {
        let (_, table) = self.require_mig(index)?;
        let gpu = self.gpu(index)?;
        let gpu_uuid = gpu.uuid.clone();
        let Some(gi) = gpu.gi(gi_id) else {
            return err(NvmlCode::NotFound, format!("no GPU instance {gi_id}"));
        };
        let Some(cp) = table.by_id(gi.profile_id).and_then(|p| p.ci(ci_profile_id)) else {
            return err(NvmlCode::NotSupported, format!("CI profile {ci_profile_id} is not supported in GI {gi_id}"));
        };
        let used = gi.compute_instances.iter().fold(0u32, |m, c| m | c.placement.mask());
        let count = gi.compute_instances.iter().filter(|c| c.profile_id == ci_profile_id).count() as u32;
        let free = |s: &u32| Placement::new(*s, cp.slices).mask() & used == 0;
        let start = match start {
            Some(s) if !cp.placements.contains(&s) => {
                return err(NvmlCode::InvalidArgument, format!("{s} is not a legal CI placement"));
            }
            Some(s) => s,
            None => match cp.placements.iter().find(|s| free(s)) {
                Some(s) => *s,
                None => return err(NvmlCode::InsufficientResources, "no free compute slices in the GPU instance"),
            },
        };
        if count >= cp.instance_count || !free(&start) {
            return err(NvmlCode::InsufficientResources, "no free compute slices in the GPU instance");
        }
        let id = (0..).find(|id| gi.compute_instances.iter().all(|c| c.id != *id)).unwrap_or(u32::MAX);
        self.serial += 1;
        let uuid = ids::mig_uuid(&gpu_uuid, self.serial);
        let gi = self
            .gpu_mut(index)?
            .gpu_instances
            .iter_mut()
            .find(|g| g.id == gi_id)
            .ok_or(SimError { code: NvmlCode::NotFound, detail: format!("no GPU instance {gi_id}") })?;
        gi.compute_instances.push(SimCi {
            id,
            profile_id: ci_profile_id,
            placement: Placement::new(start, cp.slices),
            uuid,
            processes: Vec::new(),
        });
        Ok(id)
    }

    /// `nvmlComputeInstanceDestroy`: `InUse` while processes run on it.
    pub fn destroy_compute_instance(&mut self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), SimError> {
        self.require_mig(index)?;
        let gpu = self.gpu_mut(index)?;
        let Some(gi) = gpu.gpu_instances.iter_mut().find(|g| g.id == gi_id) else {
            return err(NvmlCode::NotFound, format!("no GPU instance {gi_id}"));
        };
        let Some(pos) = gi.compute_instances.iter().position(|c| c.id == ci_id) else {
            return err(NvmlCode::NotFound, format!("no compute instance {ci_id} in GPU instance {gi_id}"));
        };
        if let Some(p) = gi.compute_instances[pos].processes.first() {
            return err(NvmlCode::InUse, format!("process {} runs on compute instance {ci_id}", p.pid));
        }
        gi.compute_instances.remove(pos);
        Ok(())
    }

    /// `nvmlGpuInstanceDestroy`: `InUse` while it has compute instances or processes.
    pub fn destroy_gpu_instance(&mut self, index: u32, gi_id: u32) -> Result<(), SimError> {
        self.require_mig(index)?;
        let gpu = self.gpu_mut(index)?;
        let Some(pos) = gpu.gpu_instances.iter().position(|g| g.id == gi_id) else {
            return err(NvmlCode::NotFound, format!("no GPU instance {gi_id}"));
        };
        let gi = &gpu.gpu_instances[pos];
        if let Some(p) = gi.all_processes().next() {
            return err(NvmlCode::InUse, format!("process {} runs on GPU instance {gi_id}", p.pid));
        }
        if !gi.compute_instances.is_empty() {
            return err(NvmlCode::InUse, format!("GPU instance {gi_id} still has compute instances"));
        }
        gpu.gpu_instances.remove(pos);
        Ok(())
    }
}
