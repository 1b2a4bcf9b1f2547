//! The simulator's whole state: one serde struct, stored as JSON (see docs/sim-state.md).

use crate::catalog::{self, Model};
use crate::Placement;
use serde::{Deserialize, Serialize};

/// Current state-file format version.
pub const STATE_VERSION: u32 = 1;

/// A simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimState {
    /// Format version, currently 1.
    pub version: u32,
    /// Counter mixed into every new MIG UUID so recreated instances get new UUIDs.
    #[serde(default)]
    pub serial: u64,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<SimGpu>,
    /// Events injected for NVML's event API (`nvmlEventSetWait`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<SimEvent>,
}

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;

/// One NVML event, as `nvmlEventSetWait` hands it out (`nvmlEventData_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimEvent {
    /// Injection order: a waiter returns the events after the last it returned.
    pub seq: u64,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The event type bit (`EVENT_XID`, `EVENT_DOUBLE_BIT_ECC`, `EVENT_SINGLE_BIT_ECC`).
    pub event_type: u64,
    /// `eventData`: the XID number of an XID event.
    #[serde(default)]
    pub data: u64,
    /// The GPU instance the event is about (MIG), else none (`0xFFFFFFFF` in the ABI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// The compute instance it is about (MIG), else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
}

impl SimState {
    /// Appends an event for GPU `gpu` (optionally one MIG instance); returns its `seq`.
    pub fn inject_event(&mut self, gpu: u32, event_type: u64, data: u64, instance: Option<(u32, u32)>) -> u64 {
        let seq = self.events.last().map_or(1, |e| e.seq + 1);
        self.events.push(SimEvent {
            seq,
            gpu,
            event_type,
            data,
            gpu_instance_id: instance.map(|i| i.0),
            compute_instance_id: instance.map(|i| i.1),
        });
        seq
    }
}

/// MIG mode as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigModeState {
    /// Mode in effect.
    pub current: bool,
    /// Mode after the next activation (reset on Ampere).
    pub pending: bool,
}

/// Compute mode (`nvmlComputeMode_t`), as `nvidia-smi -c` sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// `NVML_COMPUTEMODE_DEFAULT` (0): any number of processes.
    #[default]
    Default,
    /// `NVML_COMPUTEMODE_EXCLUSIVE_THREAD` (1): removed from current drivers.
    ExclusiveThread,
    /// `NVML_COMPUTEMODE_PROHIBITED` (2): no compute contexts.
    Prohibited,
    /// `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS` (3): one process (the MPS server) at a time.
    ExclusiveProcess,
}

impl ComputeMode {
    /// The `nvmlComputeMode_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            ComputeMode::Default => 0,
            ComputeMode::ExclusiveThread => 1,
            ComputeMode::Prohibited => 2,
            ComputeMode::ExclusiveProcess => 3,
        }
    }

    /// The mode of an `nvmlComputeMode_t` value.
    pub fn from_nvml(v: u32) -> Option<Self> {
        [ComputeMode::Default, ComputeMode::ExclusiveThread, ComputeMode::Prohibited, ComputeMode::ExclusiveProcess]
            .into_iter()
            .find(|m| m.nvml_value() == v)
    }

    /// nvidia-smi's name (`Default`, `Exclusive_Process`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "Default",
            ComputeMode::ExclusiveThread => "Exclusive_Thread",
            ComputeMode::Prohibited => "Prohibited",
            ComputeMode::ExclusiveProcess => "Exclusive_Process",
        }
    }

    fn is_default(&self) -> bool {
        *self == ComputeMode::Default
    }
}

/// A process using a GPU, GPU instance or compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimProcess {
    /// Process id.
    pub pid: u32,
    /// Process name.
    #[serde(default)]
    pub name: String,
    /// GPU memory used, MiB.
    #[serde(default)]
    pub used_memory_mib: u64,
}

/// A simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpu {
    /// NVML index.
    pub index: u32,
    /// Catalog model id.
    pub model: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// PCI bus id (`00000000:07:00.0`).
    pub bus_id: String,
    /// MIG mode (both false on GPUs without MIG).
    #[serde(default)]
    pub mig_mode: MigModeState,
    /// GPU reset is not exposed (pass-through VM): a MIG mode change needs a reboot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough: bool,
    /// The GPU fell off the bus: every NVML call on it, and a wait for events of it, returns
    /// `NVML_ERROR_GPU_IS_LOST` until this is cleared (its reset).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// Compute mode (`default` when absent).
    #[serde(default, skip_serializing_if = "ComputeMode::is_default")]
    pub compute_mode: ComputeMode,
    /// Processes on the whole GPU (outside any MIG instance).
    #[serde(default)]
    pub processes: Vec<SimProcess>,
    /// GPU instances.
    #[serde(default)]
    pub gpu_instances: Vec<SimGi>,
}

/// A simulated GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGi {
    /// GI id (opaque, unique per GPU).
    pub id: u32,
    /// Device-unique GI profile id.
    pub profile_id: u32,
    /// Memory-slice placement.
    pub placement: Placement,
    /// Processes attached to the GI itself.
    #[serde(default)]
    pub processes: Vec<SimProcess>,
    /// Compute instances.
    #[serde(default)]
    pub compute_instances: Vec<SimCi>,
}

/// A simulated compute instance (one MIG device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimCi {
    /// CI id, unique within its GI.
    pub id: u32,
    /// CI profile id (`NVML_COMPUTE_INSTANCE_PROFILE_*`).
    pub profile_id: u32,
    /// Placement in compute slices inside the GI.
    pub placement: Placement,
    /// `MIG-…` UUID of the MIG device.
    pub uuid: String,
    /// Processes running on this MIG device.
    #[serde(default)]
    pub processes: Vec<SimProcess>,
}

impl SimGpu {
    /// The catalog model of this GPU.
    pub fn catalog_model(&self) -> Option<&'static Model> {
        catalog::lookup(&self.model)
    }

    /// Every process on the GPU, including those inside MIG instances.
    pub fn all_processes(&self) -> impl Iterator<Item = &SimProcess> {
        self.processes.iter().chain(self.gpu_instances.iter().flat_map(SimGi::all_processes))
    }

    /// GI by id.
    pub fn gi(&self, id: u32) -> Option<&SimGi> {
        self.gpu_instances.iter().find(|g| g.id == id)
    }
}

impl SimGi {
    /// Processes on the GI and on its compute instances.
    pub fn all_processes(&self) -> impl Iterator<Item = &SimProcess> {
        self.processes.iter().chain(self.compute_instances.iter().flat_map(|c| c.processes.iter()))
    }
}
