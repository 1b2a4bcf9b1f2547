//! The DRA plugin's checkpoint: what was prepared for which claim, so Unprepare works when the
//! claim is gone from the API, a repeated Prepare answers the same, and a restart adopts its
//! instances (and only its instances). Written atomically before every answer.

use super::devices::DeviceKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// Devices are being created; a restart rolls back what was made.
    Preparing,
    /// Devices exist and were handed to the kubelet.
    Prepared,
    /// Devices are being destroyed; a restart finishes.
    Unpreparing,
}

/// One device prepared (or being prepared) for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests it serves.
    pub requests: Vec<String>,
    /// The pool it was allocated from.
    pub pool: String,
    /// Its published name.
    pub device: String,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The GPU's UUID (guards against a renumbered node).
    pub gpu_uuid: String,
    /// What of the GPU.
    pub kind: DeviceKind,
    /// The GPU instance made for it (MIG devices, once created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi: Option<u32>,
    /// The compute instance made for it (MIG devices, once created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<u32>,
    /// The device's UUID as containers see it: `MIG-…`, or `GPU-…` for a whole GPU or an MPS
    /// share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// For an MPS share: which share and what it holds its client to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<MpsShare>,
}

/// One claim's share of a GPU's MPS daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsShare {
    /// The allocation's `shareID`.
    pub id: String,
    /// Device memory the client may pin (`consumedCapacity.memory`), bytes.
    pub memory_bytes: u64,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of the client.
    pub thread_percentage: u32,
}

/// One claim's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimEntry {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Where it stands.
    pub state: ClaimState,
    /// Its devices.
    pub devices: Vec<PreparedDevice>,
}

/// The whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version (1).
    pub version: u32,
    /// Claim uid → entry.
    pub claims: BTreeMap<String, ClaimEntry>,
}

/// The checkpoint file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a checkpoint this version understands.
    #[error("{path}: not a gpupart DRA checkpoint: {source}")]
    Format {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
}

impl Checkpoint {
    /// Reads the checkpoint at `path`; a missing file is an empty checkpoint.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self { version: 1, ..Self::default() }),
            Err(source) => return Err(CheckpointError::Io { path: path.display().to_string(), source }),
        };
        serde_json::from_str(&text)
            .map_err(|source| CheckpointError::Format { path: path.display().to_string(), source })
    }

    /// Writes the checkpoint atomically (owner-only).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io { path: path.display().to_string(), source };
        let text = serde_json::to_string_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        crate::fsutil::write_atomic(path, text.as_bytes()).map_err(io)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)
    }

    /// Every device of every claim, with the claim's uid.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &PreparedDevice)> {
        self.claims.iter().flat_map(|(uid, c)| c.devices.iter().map(move |d| (uid.as_str(), d)))
    }
}
