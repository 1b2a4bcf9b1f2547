//! The mig-parted v1 config format: parsing and validation with mig-parted's rules and error
//! texts, each error naming the config, the entry index, the key and the offending value.

pub mod generate;
mod parse;
pub mod write;
pub mod yaml;
pub(crate) use parse::parse_mem_limit;
mod select;

pub use parse::{parse, parse_all};
pub use select::{no_mig_reason, select, select_all, GpuIdent, SelectError, Selection};

use gpupart_mig::ProfileName;
use std::fmt;

/// A parsed config file: named configs in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    /// `mig-configs`, in file order.
    pub configs: Vec<MigConfig>,
    /// gpupart extension `gpupart.workload`: the target workload mix for fragmentation figures
    /// and for placing new instances for the next change (profile name → weight). mig-parted
    /// rejects files that carry the `gpupart` block.
    pub workload: Vec<(ProfileName, f64)>,
}

/// One named config: a list of device specs applied in order (the last matching spec wins).
#[derive(Debug, Clone, PartialEq)]
pub struct MigConfig {
    /// The config name (`all-balanced`).
    pub name: String,
    /// Its entries.
    pub specs: Vec<DeviceSpec>,
    /// The file's workload mix (see [`ConfigFile::workload`]): the planner places new instances
    /// for the next change under it.
    pub workload: Vec<(ProfileName, f64)>,
}

/// One entry of a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// `device-filter`; empty matches every GPU.
    pub filter: Vec<DeviceFilter>,
    /// `devices`.
    pub devices: Devices,
    /// `mig-enabled`.
    pub mig_enabled: bool,
    /// `mig-devices`: MIG device name → count, in file order, zero counts dropped.
    pub mig_devices: Vec<(ProfileName, u32)>,
    /// gpupart extension `mps` (only with `mig-enabled: false`): one MPS daemon per GPU.
    pub mps: Option<MpsSpec>,
}

/// The `mps` block of an entry, as written (limits that depend on the GPU are checked per GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsSpec {
    /// `replicas`: client slots on each GPU of the entry (>= 2).
    pub replicas: u32,
    /// `active-thread-percentage` per client (1..=100); default 100 / replicas.
    pub active_thread_percentage: Option<u32>,
    /// `pinned-memory-limit` per client in MiB; default total memory / replicas.
    pub pinned_memory_limit_mib: Option<u64>,
}

/// A `device-filter` item: `0xDEVICEVENDOR[:0xSUBDEVICESUBVENDOR]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFilter {
    /// `(device << 16) | vendor`.
    pub device_id: u32,
    /// Subsystem id in the same form, when given.
    pub subsystem_id: Option<u32>,
}

impl DeviceFilter {
    /// Whether a GPU with these ids matches.
    pub fn matches(&self, device_id: u32, subsystem_id: Option<u32>) -> bool {
        self.device_id == device_id && self.subsystem_id.is_none_or(|want| subsystem_id == Some(want))
    }
}

impl fmt::Display for DeviceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08X}", self.device_id)?;
        if let Some(s) = self.subsystem_id {
            write!(f, ":0x{s:08X}")?;
        }
        Ok(())
    }
}

/// `devices`: every GPU, or explicit indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// `all`.
    All,
    /// A list of GPU indices.
    Indices(Vec<u32>),
}

/// A config-file error with where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The config name, when inside one.
    pub config: Option<String>,
    /// The 0-based entry index, when inside one.
    pub entry: Option<usize>,
    /// The key, when the error is about one.
    pub key: Option<String>,
    /// The message (mig-parted's text where it has one).
    pub message: String,
}

impl ConfigError {
    fn top(message: impl Into<String>) -> Self {
        Self { config: None, entry: None, key: None, message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(c) = &self.config {
            parts.push(format!("config '{c}'"));
        }
        if let Some(e) = self.entry {
            parts.push(format!("entry {e}"));
        }
        if let Some(k) = &self.key {
            parts.push(format!("key '{k}'"));
        }
        if parts.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", parts.join(", "), self.message)
        }
    }
}

impl ConfigFile {
    /// The config called `name`.
    pub fn get(&self, name: &str) -> Option<&MigConfig> {
        self.configs.iter().find(|c| c.name == name)
    }

    /// Picks the config to use: `name` when given, else the only one in the file.
    pub fn choose(&self, name: Option<&str>) -> Result<&MigConfig, ConfigError> {
        match name {
            Some(n) => self.get(n).ok_or_else(|| {
                ConfigError::top(format!("unknown config '{n}'; the file has: {}", self.names().join(", ")))
            }),
            None if self.configs.len() == 1 => Ok(&self.configs[0]),
            None => Err(ConfigError::top(format!(
                "the file has {} configs; choose one with -c ({})",
                self.configs.len(),
                self.names().join(", ")
            ))),
        }
    }

    /// Config names in file order.
    pub fn names(&self) -> Vec<&str> {
        self.configs.iter().map(|c| c.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests;
