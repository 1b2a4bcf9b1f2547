//! Which entry of a config applies to which GPU of a node (mig-parted semantics: entries are
//! walked in order and the last one that selects a GPU wins).

use super::{Devices, MigConfig, MpsSpec};
use gpupart_mig::ProfileName;

/// What selection needs to know about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIdent {
    /// NVML index.
    pub index: u32,
    /// `(device << 16) | vendor`.
    pub device_id: u32,
    /// Subsystem id in the same form, when known.
    pub subsystem_id: Option<u32>,
    /// Whether the GPU supports MIG.
    pub mig_capable: bool,
    /// Model, for messages.
    pub model: String,
}

/// What a config asks of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// No entry selects the GPU: it is left alone.
    Unselected,
    /// `mig-enabled: true` with `devices: all` on a GPU without MIG: skipped, as mig-parted does.
    SkippedNoMig {
        /// The selecting entry.
        entry: usize,
    },
    /// MIG disabled.
    Disabled {
        /// The selecting entry.
        entry: usize,
        /// The entry's `mps` block, when it has one.
        mps: Option<MpsSpec>,
    },
    /// MIG enabled with these MIG devices (name → count).
    Enabled {
        /// The selecting entry.
        entry: usize,
        /// The wanted MIG devices.
        devices: Vec<(ProfileName, u32)>,
    },
}

/// A config that cannot be applied to this node at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// An index in `devices` does not exist.
    #[error("config '{config}', entry {entry}, key 'devices': device index {index} is out of range (the node has {count} GPUs)")]
    IndexOutOfRange {
        /// Config name.
        config: String,
        /// Entry index.
        entry: usize,
        /// The index.
        index: u32,
        /// GPUs on the node.
        count: usize,
    },
    /// MIG requested explicitly on a GPU without MIG.
    #[error("config '{config}', entry {entry}, key 'mig-enabled': GPU {index} ({model}) does not support MIG")]
    NotMigCapable {
        /// Config name.
        config: String,
        /// Entry index.
        entry: usize,
        /// GPU index.
        index: u32,
        /// GPU model.
        model: String,
    },
}

/// Resolves which entry applies to each GPU; the result is in `gpus` order. The first problem
/// is the error ([`select_all`] finds every one).
pub fn select(config: &MigConfig, gpus: &[GpuIdent]) -> Result<Vec<Selection>, SelectError> {
    let (out, mut errors) = select_all(config, gpus);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.remove(0))
    }
}

/// Why nothing of `config` applies to a node whose GPUs all lack MIG although an entry asks for
/// MIG on them; `None` when some GPU is selected for a change or no entry was skipped so.
pub fn no_mig_reason(config: &MigConfig, gpus: &[GpuIdent], selections: &[Selection]) -> Option<String> {
    let skipped: Vec<(usize, &GpuIdent)> = gpus
        .iter()
        .zip(selections)
        .filter_map(|(g, s)| match s {
            Selection::SkippedNoMig { entry } => Some((*entry, g)),
            _ => None,
        })
        .collect();
    let anything = selections.iter().any(|s| matches!(s, Selection::Enabled { .. } | Selection::Disabled { .. }));
    if skipped.is_empty() || anything {
        return None;
    }
    let mut entries: Vec<usize> = skipped.iter().map(|(e, _)| *e).collect();
    entries.dedup();
    let gpus: Vec<String> = skipped.iter().map(|(_, g)| format!("GPU {} ({})", g.index, g.model)).collect();
    let entries: Vec<String> = entries.iter().map(ToString::to_string).collect();
    Some(format!(
        "config '{}', entry {} asks for MIG, but {} {} no MIG: no entry of the config applies to this node",
        config.name,
        entries.join(", "),
        gpus.join(", "),
        if gpus.len() == 1 { "has" } else { "have" }
    ))
}

/// Resolves which entry applies to each GPU, going on past problems: the selections (a GPU an
/// erroneous entry names is left as the other entries make it) and every problem found.
pub fn select_all(config: &MigConfig, gpus: &[GpuIdent]) -> (Vec<Selection>, Vec<SelectError>) {
    let mut out = vec![Selection::Unselected; gpus.len()];
    let mut errors = Vec::new();
    for (entry, spec) in config.specs.iter().enumerate() {
        let filter_ok =
            |g: &GpuIdent| spec.filter.is_empty() || spec.filter.iter().any(|f| f.matches(g.device_id, g.subsystem_id));
        let (targets, explicit): (Vec<&GpuIdent>, bool) = match &spec.devices {
            Devices::All => (gpus.iter().filter(|g| filter_ok(g)).collect(), false),
            Devices::Indices(list) => {
                let mut t = Vec::new();
                for &index in list {
                    let Some(g) = gpus.iter().find(|g| g.index == index) else {
                        errors.push(SelectError::IndexOutOfRange {
                            config: config.name.clone(),
                            entry,
                            index,
                            count: gpus.len(),
                        });
                        continue;
                    };
                    if filter_ok(g) {
                        t.push(g);
                    }
                }
                (t, true)
            }
        };
        for g in targets {
            let pos = gpus.iter().position(|x| x.index == g.index).unwrap_or(0);
            out[pos] = if !spec.mig_enabled {
                Selection::Disabled { entry, mps: spec.mps }
            } else if !g.mig_capable {
                if explicit {
                    errors.push(SelectError::NotMigCapable {
                        config: config.name.clone(),
                        entry,
                        index: g.index,
                        model: g.model.clone(),
                    });
                    continue;
                }
                Selection::SkippedNoMig { entry }
            } else {
                Selection::Enabled { entry, devices: spec.mig_devices.clone() }
            };
        }
    }
    (out, errors)
}
