//! A desired per-GPU layout: MIG device names from the config resolved to (GI profile, CI profile)
//! ids on one device, and the comparison of a GPU's devices with it.

use crate::mig::profile::ResolveError;
use crate::mig::{ProfileName, ProfileTable};
use std::collections::BTreeMap;

/// A MIG device kind on one device: (GI profile id, CI profile id).
pub type DeviceKey = (u32, u32);

/// Desired MIG devices on one GPU: how many of each kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredDevices {
    /// Count per (GI profile id, CI profile id); zero counts are absent.
    pub counts: BTreeMap<DeviceKey, u32>,
}

impl DesiredDevices {
    /// Resolves config names on a device's profile table (mig-parted's error on unknown names).
    pub fn resolve(table: &ProfileTable, devices: &[(ProfileName, u32)]) -> Result<Self, ResolveError> {
        let mut counts = BTreeMap::new();
        for (name, n) in devices {
            let (gi, ci) = table.resolve(name)?;
            if *n > 0 {
                *counts.entry((gi.id, ci)).or_insert(0) += n;
            }
        }
        Ok(Self { counts })
    }

    /// Total number of MIG devices.
    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }

    /// Counts a set of existing devices the same way.
    pub fn from_keys(keys: impl IntoIterator<Item = DeviceKey>) -> Self {
        let mut counts = BTreeMap::new();
        for k in keys {
            *counts.entry(k).or_insert(0) += 1;
        }
        Self { counts }
    }

    /// Human-readable `name×count` list (`3g.40gb×1, 1g.10gb×2`).
    pub fn describe(&self, table: &ProfileTable) -> String {
        if self.counts.is_empty() {
            return "no MIG devices".into();
        }
        self.counts
            .iter()
            .map(|((gi, ci), n)| {
                let name =
                    table.by_id(*gi).map_or_else(|| format!("profile {gi}/{ci}"), |p| p.device_name(*ci).to_string());
                format!("{name}×{n}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
