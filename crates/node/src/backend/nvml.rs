//! The NVML backend: real GPUs through nvml-wrapper, with raw calls (in [`super::nvml_ffi`]) for
//! the instance lifecycle. Profiles and placements are read from NVML at run time, never from the
//! catalog, and names are derived exactly as mig-parted derives them. GPU resets go through
//! `nvidia-smi --gpu-reset -i <bus id>`.

use super::nvml_ffi::{handle, Raw, RawError};
use super::{BackendError, GpuBackend, ModeActivation};
use crate::mig::catalog::{self, ci_profiles};
use crate::mig::profile::derive_gi_name;
use crate::mig::{Engines, GiProfile, Placement, ProfileTable};
use crate::observed::{CiState, ComputeMode, GiState, GpuInfo, GpuState, MigMode, Process};
use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` (NVML 13).
const GI_PROFILE_COUNT: u32 = 0x12;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const CI_PROFILE_COUNT: u32 = 0x9;

/// GPUs through NVML.
pub struct NvmlBackend {
    nvml: Nvml,
    library: String,
    nvidia_smi: PathBuf,
    /// The event set of [`GpuBackend::next_event`], made at its first call.
    events: std::sync::Mutex<Option<EventSet>>,
}

/// A raw NVML event set, owned by the backend (freed when it goes).
struct EventSet(nvml_wrapper_sys::bindings::nvmlEventSet_t);

// SAFETY: an NVML event set handle may be used from any thread (NVML is thread-safe); it is only
// used under the backend's mutex.
unsafe impl Send for EventSet {}

fn wrap(gpu: u32, function: &'static str, e: NvmlError) -> BackendError {
    let detail = e.to_string();
    let code: u32 = match e {
        NvmlError::UnexpectedVariant(c) => c,
        NvmlError::FailedToLoadSymbol(_) => 13,
        other => nvml_wrapper_sys::bindings::nvmlReturn_t::from(other),
    };
    BackendError::call(gpu, function, code, detail)
}

impl NvmlBackend {
    /// Loads NVML from `library` (default `libnvidia-ml.so.1`); `nvidia_smi` defaults to
    /// `nvidia-smi` on PATH.
    pub fn open(library: Option<&Path>, nvidia_smi: Option<&Path>) -> Result<Self, BackendError> {
        let name = library.map_or_else(|| "libnvidia-ml.so.1".to_string(), |p| p.display().to_string());
        let nvml = match library {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| BackendError::Unavailable(format!("cannot load NVML from {name}: {e}")))?;
        Ok(Self {
            nvml,
            library: name,
            nvidia_smi: nvidia_smi.map_or_else(|| PathBuf::from("nvidia-smi"), Path::to_path_buf),
            events: std::sync::Mutex::new(None),
        })
    }

    fn device(&self, gpu: u32) -> Result<Device<'_>, BackendError> {
        self.nvml.device_by_index(gpu).map_err(|e| wrap(gpu, "nvmlDeviceGetHandleByIndex_v2", e))
    }

    fn raw(&self) -> Raw<'_> {
        Raw::new(self.nvml.lib())
    }

    fn err(&self, gpu: u32, e: RawError) -> BackendError {
        BackendError::call(gpu, e.function, e.code, self.raw().error_string(e.code))
    }

    /// Reads the GI profile table from NVML (names from memory sizes, as mig-parted does).
    fn profiles(&self, gpu: u32, dev: &Device<'_>, total_bytes: u64) -> Result<ProfileTable, BackendError> {
        let raw = self.raw();
        let h = handle(dev);
        let mut profiles = Vec::new();
        for index in 0..GI_PROFILE_COUNT {
            let info = match raw.gi_profile_info(h, index) {
                Ok(i) => i,
                Err(e) if e.code == 3 => continue,
                Err(e) if e.code == 2 => break,
                Err(e) => return Err(self.err(gpu, e)),
            };
            let Some(name) = derive_gi_name(index, info.memorySizeMB, total_bytes) else { continue };
            let placements = raw
                .possible_placements(h, info.id)
                .map_err(|e| self.err(gpu, e))?
                .into_iter()
                .map(|(start, size)| Placement::new(start, size))
                .collect::<Vec<_>>();
            profiles.push(GiProfile {
                index,
                id: info.id,
                name,
                slices: info.sliceCount,
                memory_slices: placements.first().map_or(0, |p| p.size),
                memory_mib: info.memorySizeMB,
                instance_count: info.instanceCount,
                multiprocessors: info.multiprocessorCount,
                engines: Engines {
                    decoders: info.decoderCount,
                    encoders: info.encoderCount,
                    copy_engines: info.copyEngineCount,
                    jpeg: info.jpegCount,
                    ofa: info.ofaCount,
                },
                placements,
                // CI profiles can only be queried from an existing GI; the standard table is used.
                ci_profiles: ci_profiles(info.sliceCount, info.multiprocessorCount),
            });
        }
        let compute_slices = profiles.iter().map(|p| p.slices).max().unwrap_or(0);
        let memory_slices = profiles.iter().flat_map(|p| p.placements.iter().map(|pl| pl.end())).max().unwrap_or(0);
        Ok(ProfileTable { compute_slices, memory_slices, profiles })
    }

    fn instances(&self, gpu: u32, dev: &Device<'_>, table: &ProfileTable) -> Result<Vec<GiState>, BackendError> {
        let raw = self.raw();
        let h = handle(dev);
        let mut out = Vec::new();
        for p in &table.profiles {
            for gi in raw.gpu_instances(h, p.id, p.instance_count).map_err(|e| self.err(gpu, e))? {
                let (id, profile_id, start, size) = raw.gi_info(gi).map_err(|e| self.err(gpu, e))?;
                let mut cis = Vec::new();
                for ci_profile in 0..CI_PROFILE_COUNT {
                    let list = match raw.compute_instances(gi, ci_profile, 8) {
                        Ok(l) => l,
                        Err(e) if e.code == 2 || e.code == 3 => continue,
                        Err(e) => return Err(self.err(gpu, e)),
                    };
                    for ci in list {
                        let (cid, cprofile, cstart, csize) = raw.ci_info(ci).map_err(|e| self.err(gpu, e))?;
                        cis.push(CiState {
                            id: cid,
                            profile_id: cprofile,
                            placement: Placement::new(cstart, csize),
                            uuid: String::new(),
                            processes: Vec::new(),
                            pods: Vec::new(),
                        });
                    }
                }
                cis.sort_by_key(|c| c.id);
                out.push(GiState {
                    id,
                    profile_id,
                    placement: Placement::new(start, size),
                    cis,
                    processes: Vec::new(),
                });
            }
        }
        out.sort_by_key(|g| g.placement.start);
        // MIG device handles give each CI its UUID and processes.
        let max = dev.mig_device_count().map_err(|e| wrap(gpu, "nvmlDeviceGetMaxMigDeviceCount", e))?;
        for index in 0..max {
            let mig = match dev.mig_device_by_index(index) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(wrap(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", e)),
            };
            let (gi_id, ci_id) = raw.mig_ids(handle(&mig)).map_err(|e| self.err(gpu, e))?;
            let uuid = mig.uuid().map_err(|e| wrap(gpu, "nvmlDeviceGetUUID", e))?;
            let procs = processes(gpu, &mig)?.into_iter().map(|p| p.0).collect();
            if let Some(ci) =
                out.iter_mut().find(|g| g.id == gi_id).and_then(|g| g.cis.iter_mut().find(|c| c.id == ci_id))
            {
                ci.uuid = uuid;
                ci.processes = procs;
            }
        }
        // Processes on a GPU instance outside its compute instances show only on the parent.
        for p in processes(gpu, dev)? {
            let (Some(gi_id), None) = (p.1, p.2) else { continue };
            if let Some(gi) = out.iter_mut().find(|g| g.id == gi_id) {
                gi.processes.push(p.0);
            }
        }
        Ok(out)
    }
}

fn from_nvml_mode(m: NvmlComputeMode) -> ComputeMode {
    match m {
        NvmlComputeMode::Default => ComputeMode::Default,
        NvmlComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
        NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
        NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    }
}

fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// A running process and, with MIG on, the GI and CI it runs in.
type Placed = (Process, Option<u32>, Option<u32>);

/// Running compute processes of a device handle, with their GI and CI ids when MIG is on.
fn processes(gpu: u32, dev: &Device<'_>) -> Result<Vec<Placed>, BackendError> {
    let list = dev.running_compute_processes().map_err(|e| wrap(gpu, "nvmlDeviceGetComputeRunningProcesses_v3", e))?;
    Ok(list
        .into_iter()
        .map(|p| {
            let proc = Process {
                pid: p.pid,
                name: process_name(p.pid),
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b / (1024 * 1024),
                    UsedGpuMemory::Unavailable => 0,
                },
            };
            (proc, p.gpu_instance_id, p.compute_instance_id)
        })
        .collect())
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        if let Some(set) = self.events.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = self.raw().event_set_free(set.0);
        }
    }
}

impl GpuBackend for NvmlBackend {
    fn next_event(&self, timeout: std::time::Duration) -> Result<Option<crate::health::GpuEvent>, BackendError> {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let raw = self.raw();
        if events.is_none() {
            let set = raw.event_set_create().map_err(|e| self.err(0, e))?;
            let registered = (0..self.gpu_count()?).try_for_each(|gpu| {
                let dev = self.device(gpu)?;
                raw.register_events(handle(&dev), crate::health::WATCHED_EVENT_TYPES, set)
                    .map(|_| ())
                    .map_err(|e| self.err(gpu, e))
            });
            if let Err(e) = registered {
                // A GPU that cannot be registered (lost): the set goes, the next call tries again.
                let _ = raw.event_set_free(set);
                return Err(e);
            }
            *events = Some(EventSet(set));
        }
        let Some(set) = events.as_ref() else { return Ok(None) };
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match raw.event_wait(set.0, ms) {
            Ok((d, gpu)) => Ok(super::stamped(gpu, d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId)),
            // NVML_ERROR_TIMEOUT: nothing came.
            Err(e) if e.code == 10 => Ok(None),
            Err(e) => {
                // The set is made again (every GPU registered again) at the next call.
                if let Some(set) = events.take() {
                    let _ = raw.event_set_free(set.0);
                }
                Err(self.err(0, e))
            }
        }
    }

    fn serves_events(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("NVML from {}", self.library)
    }

    fn driver_version(&self) -> Result<String, BackendError> {
        self.nvml.sys_driver_version().map_err(|e| wrap(0, "nvmlSystemGetDriverVersion", e))
    }

    fn gpu_count(&self) -> Result<u32, BackendError> {
        self.nvml.device_count().map_err(|e| wrap(0, "nvmlDeviceGetCount_v2", e))
    }

    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError> {
        let dev = self.device(gpu)?;
        let pci = dev.pci_info().map_err(|e| wrap(gpu, "nvmlDeviceGetPciInfo_v3", e))?;
        let name = dev.name().map_err(|e| wrap(gpu, "nvmlDeviceGetName", e))?;
        let total = dev.memory_info().map_err(|e| wrap(gpu, "nvmlDeviceGetMemoryInfo_v2", e))?.total;
        let arch = dev.architecture().map_err(|e| wrap(gpu, "nvmlDeviceGetArchitecture", e))?;
        let mode = match dev.mig_mode() {
            Ok(m) => Some(MigMode { current: m.current == 1, pending: m.pending == 1 }),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(wrap(gpu, "nvmlDeviceGetMigMode", e)),
        };
        let cc = dev.cuda_compute_capability().map_err(|e| wrap(gpu, "nvmlDeviceGetCudaComputeCapability", e))?;
        let compute_mode = match dev.compute_mode() {
            Ok(m) => from_nvml_mode(m),
            Err(NvmlError::NotSupported) => ComputeMode::Default,
            Err(e) => return Err(wrap(gpu, "nvmlDeviceGetComputeMode", e)),
        };
        let info = GpuInfo {
            index: gpu,
            minor: dev.minor_number().map_err(|e| wrap(gpu, "nvmlDeviceGetMinorNumber", e))?,
            uuid: dev.uuid().map_err(|e| wrap(gpu, "nvmlDeviceGetUUID", e))?,
            model: catalog::by_pci_device_id(pci.pci_device_id).map_or_else(|| name.clone(), |m| m.id.to_string()),
            name,
            pci_device_id: pci.pci_device_id,
            pci_subsystem_id: pci.pci_sub_system_id,
            bus_id: pci.bus_id,
            memory_total_bytes: total,
            mig_capable: mode.is_some(),
            mode_change_needs_reset: matches!(arch, DeviceArchitecture::Ampere),
            compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
        };
        let profiles = match mode {
            Some(_) => self.profiles(gpu, &dev, total)?,
            None => ProfileTable::empty(),
        };
        let mig_on = mode.is_some_and(|m| m.current);
        let instances = if mig_on { self.instances(gpu, &dev, &profiles)? } else { Vec::new() };
        let gpu_processes = if mig_on { Vec::new() } else { processes(gpu, &dev)?.into_iter().map(|p| p.0).collect() };
        Ok(GpuState {
            info,
            mig_mode: mode.unwrap_or_default(),
            profiles,
            instances,
            processes: gpu_processes,
            compute_mode,
            pods: Vec::new(),
        })
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<ModeActivation, BackendError> {
        let dev = self.device(gpu)?;
        let status = dev.set_mig_mode(enabled).map_err(|e| wrap(gpu, "nvmlDeviceSetMigMode", e))?;
        match status {
            0 => {
                let m = dev.mig_mode().map_err(|e| wrap(gpu, "nvmlDeviceGetMigMode", e))?;
                Ok(if (m.current == 1) == enabled { ModeActivation::Done } else { ModeActivation::PendingReset })
            }
            19 => Ok(ModeActivation::InUse),
            16 => Ok(ModeActivation::RebootRequired),
            code => Err(BackendError::call(gpu, "nvmlDeviceSetMigMode", code, "activation failed")),
        }
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        let bus_id = self.observe(gpu)?.info.bus_id;
        let out = Command::new(&self.nvidia_smi)
            .args(["--gpu-reset", "-i", &bus_id])
            .output()
            .map_err(|e| BackendError::Unavailable(format!("GPU {gpu}: running {}: {e}", self.nvidia_smi.display())))?;
        if out.status.success() {
            return Ok(());
        }
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Err(BackendError::Unavailable(format!(
            "GPU {gpu}: {} --gpu-reset -i {bus_id} failed ({}): {}",
            self.nvidia_smi.display(),
            out.status,
            text.trim()
        )))
    }

    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, placement: Placement) -> Result<u32, BackendError> {
        let dev = self.device(gpu)?;
        self.raw().create_gi(handle(&dev), profile_id, placement.start, placement.size).map_err(|e| self.err(gpu, e))
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: u32,
        ci_profile_id: u32,
        placement: Placement,
    ) -> Result<u32, BackendError> {
        let dev = self.device(gpu)?;
        let raw = self.raw();
        let gi_h = raw.gi_by_id(handle(&dev), gi).map_err(|e| self.err(gpu, e))?;
        raw.create_ci(gi_h, ci_profile_id, placement.start, placement.size).map_err(|e| self.err(gpu, e))
    }

    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        let dev = self.device(gpu)?;
        let raw = self.raw();
        let gi_h = raw.gi_by_id(handle(&dev), gi).map_err(|e| self.err(gpu, e))?;
        let ci_h = raw.ci_by_id(gi_h, ci).map_err(|e| self.err(gpu, e))?;
        raw.destroy_ci(ci_h).map_err(|e| self.err(gpu, e))
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        let dev = self.device(gpu)?;
        let raw = self.raw();
        let gi_h = raw.gi_by_id(handle(&dev), gi).map_err(|e| self.err(gpu, e))?;
        raw.destroy_gi(gi_h).map_err(|e| self.err(gpu, e))
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        let mut dev = self.device(gpu)?;
        let m = match mode {
            ComputeMode::Default => NvmlComputeMode::Default,
            ComputeMode::ExclusiveThread => NvmlComputeMode::ExclusiveThread,
            ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
            ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
        };
        dev.set_compute_mode(m).map_err(|e| wrap(gpu, "nvmlDeviceSetComputeMode", e))
    }
}
