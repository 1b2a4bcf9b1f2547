//! Plain data describing GPUs as a backend observes them. Shared by the backends (which fill it),
//! the planner (which reads it) and the status output.

pub use crate::mig::sim::ComputeMode;
use crate::mig::{Placement, ProfileTable};
use serde::Serialize;

/// Static facts about a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// The device's minor number: its node is `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Catalog model id when known, else the NVML name.
    pub model: String,
    /// NVML device name.
    pub name: String,
    /// `(device << 16) | vendor`.
    pub pci_device_id: u32,
    /// Subsystem id in the same form, when known.
    pub pci_subsystem_id: Option<u32>,
    /// PCI bus id.
    pub bus_id: String,
    /// Total memory in bytes.
    pub memory_total_bytes: u64,
    /// Whether the GPU supports MIG.
    pub mig_capable: bool,
    /// Whether a MIG mode change needs a GPU reset to take effect (Ampere).
    pub mode_change_needs_reset: bool,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// MIG mode as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MigMode {
    /// Mode in effect.
    pub current: bool,
    /// Mode after the next activation.
    pub pending: bool,
}

/// A process using a GPU or MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Process name, when known.
    pub name: String,
    /// GPU memory used, MiB.
    pub used_memory_mib: u64,
}

/// A container the kubelet has allocated a device to (from PodResources): the device is in use
/// even while no process runs on it (a restarting container, a model server still starting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodUse {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// The extended resource (`nvidia.com/mig-1g.10gb`, `nvidia.com/gpu`, `gpupart.io/mps`).
    pub resource: String,
    /// The allocated device id (`MIG-…`, `GPU-…`, `<gpu-uuid>::<n>`).
    pub device_id: String,
}

impl std::fmt::Display for PodUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{} ({})", self.namespace, self.pod, self.container, self.resource)
    }
}

/// An existing compute instance (one MIG device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CiState {
    /// CI id within its GI.
    pub id: u32,
    /// CI profile id.
    pub profile_id: u32,
    /// Placement in compute slices within the GI.
    pub placement: Placement,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// Processes on this MIG device.
    pub processes: Vec<Process>,
    /// Containers the kubelet allocated this MIG device to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodUse>,
}

/// An existing GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiState {
    /// GI id (opaque).
    pub id: u32,
    /// Device-unique GI profile id.
    pub profile_id: u32,
    /// Memory-slice placement.
    pub placement: Placement,
    /// Its compute instances.
    pub cis: Vec<CiState>,
    /// Processes attached to the GI outside any CI.
    pub processes: Vec<Process>,
}

impl GiState {
    /// An idle GPU instance of `profile_id` at `placement` holding its one full-size compute
    /// instance (CI id 0, UUID `MIG-<id>`), as fixtures and benches build them; `None` for a
    /// profile the table lacks.
    pub fn with_full_ci(table: &ProfileTable, id: u32, profile_id: u32, placement: Placement) -> Option<Self> {
        let ci = table.by_id(profile_id)?.full_ci()?;
        Some(GiState {
            id,
            profile_id,
            placement,
            cis: vec![CiState {
                id: 0,
                profile_id: ci.id,
                placement: Placement::new(0, ci.slices),
                uuid: format!("MIG-{id}"),
                processes: Vec::new(),
                pods: Vec::new(),
            }],
            processes: Vec::new(),
        })
    }

    /// Whether any process uses this GI or its CIs, or the kubelet allocated one of its MIG
    /// devices to a container.
    pub fn busy(&self) -> bool {
        !self.processes.is_empty() || self.cis.iter().any(|c| !c.processes.is_empty() || !c.pods.is_empty())
    }

    /// Every container allocated one of its MIG devices.
    pub fn all_pods(&self) -> impl Iterator<Item = &PodUse> {
        self.cis.iter().flat_map(|c| c.pods.iter())
    }

    /// Every process on the GI and its CIs.
    pub fn all_processes(&self) -> impl Iterator<Item = &Process> {
        self.processes.iter().chain(self.cis.iter().flat_map(|c| c.processes.iter()))
    }
}

/// Everything observed about one GPU at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuState {
    /// Static facts.
    pub info: GpuInfo,
    /// MIG mode (both false without MIG).
    pub mig_mode: MigMode,
    /// Profile table (empty without MIG).
    pub profiles: ProfileTable,
    /// GPU instances.
    pub instances: Vec<GiState>,
    /// Processes on the whole GPU, outside MIG instances.
    pub processes: Vec<Process>,
    /// Compute mode (EXCLUSIVE_PROCESS while an MPS daemon serves the GPU).
    pub compute_mode: ComputeMode,
    /// Containers the kubelet allocated the whole GPU (`nvidia.com/gpu`) or one of its MPS slots to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodUse>,
}

impl GpuState {
    /// Every process on the GPU, including those in MIG instances.
    pub fn all_processes(&self) -> impl Iterator<Item = &Process> {
        self.processes.iter().chain(self.instances.iter().flat_map(GiState::all_processes))
    }

    /// The profile name of a GI, or `profile <id>` when unknown.
    pub fn gi_name(&self, gi: &GiState) -> String {
        self.profiles.by_id(gi.profile_id).map_or_else(|| format!("profile {}", gi.profile_id), |p| p.name.to_string())
    }

    /// MIG device names present, one per compute instance.
    pub fn device_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for gi in &self.instances {
            for ci in &gi.cis {
                out.push(match self.profiles.by_id(gi.profile_id) {
                    Some(p) => p.device_name(ci.profile_id).to_string(),
                    None => format!("profile {}/{}", gi.profile_id, ci.profile_id),
                });
            }
        }
        out
    }
}
