//! `generate-config` (pure): the layouts the GPUs' discovered profiles allow, in v1 format, as
//! mig-parted v0.14+ generates them: `all-disabled`, `all-enabled`, `all-balanced` (2 × 1g, 1 ×
//! 2g, 1 × 3g on 7-slice GPUs; 2 × 1g, 1 × 2g on 4-slice ones; per G the attribute-free profile
//! with the most instances) and one `all-<profile>` per GPU-instance profile at its instance
//! count (`+` becomes `.` in the name). `device-filter` appears only on a node with several MIG
//! GPU kinds.

use crate::mig::ProfileTable;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// One entry of a generated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `0xDEVICEVENDOR` ids, when the node has several MIG GPU kinds.
    pub filter: Vec<String>,
    /// MIG enabled.
    pub mig_enabled: bool,
    /// Profile name → count (`None`: no `mig-devices` key, as for `all-disabled`).
    pub devices: Option<BTreeMap<String, u32>>,
}

/// The generated configs by name, in name order.
pub type Generated = BTreeMap<String, Vec<Entry>>;

/// Why nothing can be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// A MIG-capable GPU lists no profile (older drivers while MIG is disabled).
    #[error("no MIG profiles could be discovered on GPU {0} (drivers before R550 list none while MIG mode is disabled: enable MIG or use a static config)")]
    NoProfiles(u32),
}

/// Generates the configs for the node's MIG-capable GPUs: (index, PCI `device<<16|vendor`,
/// profile table) each.
pub fn generate(gpus: &[(u32, u32, &ProfileTable)]) -> Result<Generated, GenerateError> {
    let mut kinds: BTreeMap<String, &ProfileTable> = BTreeMap::new();
    for (index, device_id, table) in gpus {
        if table.profiles.is_empty() {
            return Err(GenerateError::NoProfiles(*index));
        }
        kinds.entry(format!("0x{device_id:08X}")).or_insert(table);
    }
    let filtered = kinds.len() > 1;
    let filter = |ids: Vec<String>| if filtered { ids } else { Vec::new() };
    let mut out = Generated::new();
    out.insert("all-disabled".into(), vec![Entry { filter: Vec::new(), mig_enabled: false, devices: None }]);
    out.insert(
        "all-enabled".into(),
        vec![Entry { filter: Vec::new(), mig_enabled: true, devices: Some(BTreeMap::new()) }],
    );
    let balanced: Vec<Entry> = kinds
        .iter()
        .filter_map(|(id, table)| {
            balanced(table).map(|devices| Entry {
                filter: filter(vec![id.clone()]),
                mig_enabled: true,
                devices: Some(devices),
            })
        })
        .collect();
    if !balanced.is_empty() {
        out.insert("all-balanced".into(), balanced);
    }
    // Per profile name: one entry per instance count, each with the kinds that have it.
    let mut by_name: BTreeMap<String, BTreeMap<u32, Vec<String>>> = BTreeMap::new();
    for (id, table) in &kinds {
        for p in &table.profiles {
            by_name.entry(p.name.to_string()).or_default().entry(p.instance_count).or_default().push(id.clone());
        }
    }
    for (name, counts) in by_name {
        let entries = counts
            .into_iter()
            .map(|(count, ids)| Entry {
                filter: filter(ids),
                mig_enabled: true,
                devices: Some(BTreeMap::from([(name.clone(), count)])),
            })
            .collect();
        out.insert(format!("all-{}", name.replace('+', ".")), entries);
    }
    Ok(out)
}

/// `all-balanced` on one kind, when it has the profiles the formula needs.
fn balanced(table: &ProfileTable) -> Option<BTreeMap<String, u32>> {
    let base = || table.profiles.iter().filter(|p| p.name.suffix.is_empty());
    let total = base().map(|p| p.name.gi_slices).max()?;
    let formula: &[(u32, u32)] = match total {
        7 => &[(1, 2), (2, 1), (3, 1)],
        4 => &[(1, 2), (2, 1)],
        _ => return None,
    };
    formula
        .iter()
        .map(|&(g, count)| {
            // The attribute-free profile of this size with the most instances (the first of equals).
            let p =
                base().filter(|p| p.name.gi_slices == g).fold(None, |best: Option<&crate::mig::GiProfile>, p| {
                    match best {
                        Some(b) if b.instance_count >= p.instance_count => Some(b),
                        _ => Some(p),
                    }
                })?;
            Some((p.name.to_string(), count))
        })
        .collect()
}

/// YAML, as `export` writes configs (names in order).
pub fn yaml(g: &Generated) -> String {
    let mut out = String::from("version: v1\nmig-configs:\n");
    for (name, entries) in g {
        out.push_str(&format!("  {name}:\n"));
        for e in entries {
            let ids: Vec<String> = e.filter.iter().map(|f| format!("\"{f}\"")).collect();
            let lines = super::write::EntryLines {
                filter: (!ids.is_empty()).then(|| format!("[{}]", ids.join(", "))),
                devices: "all".into(),
                mig_enabled: e.mig_enabled,
                mig_devices: e.devices.as_ref(),
            };
            super::write::entry(&mut out, &lines);
        }
    }
    out
}

/// The same as JSON.
pub fn json(g: &Generated) -> Value {
    let configs: Map<String, Value> = g
        .iter()
        .map(|(name, entries)| {
            let specs: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut m = Map::new();
                    if !e.filter.is_empty() {
                        m.insert("device-filter".into(), json!(e.filter));
                    }
                    m.insert("devices".into(), json!("all"));
                    m.insert("mig-enabled".into(), json!(e.mig_enabled));
                    if let Some(d) = &e.devices {
                        m.insert("mig-devices".into(), json!(d));
                    }
                    Value::Object(m)
                })
                .collect();
            (name.clone(), Value::Array(specs))
        })
        .collect();
    json!({"version": "v1", "mig-configs": configs})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog;

    fn of(models: &[&str]) -> Generated {
        let tables: Vec<(u32, ProfileTable)> = models
            .iter()
            .map(|m| {
                let model = catalog::lookup(m).unwrap();
                (model.pci_device_id, model.profile_table())
            })
            .collect();
        let gpus: Vec<(u32, u32, &ProfileTable)> =
            tables.iter().enumerate().map(|(i, (id, t))| (i as u32, *id, t)).collect();
        generate(&gpus).unwrap()
    }

    #[test]
    fn a100_80gb_gets_nvidias_balanced_mix_and_one_config_per_profile_at_its_count() {
        let g = of(&["A100-SXM4-80GB", "A100-SXM4-80GB"]);
        let devices = |name: &str| g[name][0].devices.clone().unwrap();
        assert_eq!(
            devices("all-balanced"),
            BTreeMap::from([("1g.10gb".into(), 2), ("2g.20gb".into(), 1), ("3g.40gb".into(), 1)])
        );
        assert_eq!(devices("all-1g.10gb"), BTreeMap::from([("1g.10gb".into(), 7)]));
        assert_eq!(devices("all-1g.10gb.me"), BTreeMap::from([("1g.10gb+me".into(), 1)]));
        assert_eq!(devices("all-7g.80gb"), BTreeMap::from([("7g.80gb".into(), 1)]));
        assert!(g.values().flatten().all(|e| e.filter.is_empty()), "one kind: no device-filter");
        assert_eq!(g["all-disabled"][0].devices, None);
    }

    #[test]
    fn a30_balances_on_four_slices_and_a_mixed_node_filters_by_kind() {
        let g = of(&["A30-24GB"]);
        assert_eq!(
            g["all-balanced"][0].devices.clone().unwrap(),
            BTreeMap::from([("1g.6gb".into(), 2), ("2g.12gb".into(), 1)])
        );
        let g = of(&["A100-SXM4-80GB", "H100-SXM5-80GB"]);
        assert_eq!(g["all-balanced"].len(), 2);
        assert!(g["all-balanced"].iter().all(|e| e.filter.len() == 1));
        // Both kinds have 1g.10gb, 7 each: one entry naming both.
        assert_eq!(g["all-1g.10gb"].len(), 1);
        assert_eq!(g["all-1g.10gb"][0].filter.len(), 2);
    }

    #[test]
    fn a_gpu_without_profiles_is_named() {
        let empty = ProfileTable { profiles: Vec::new(), ..catalog::lookup("A100-SXM4-80GB").unwrap().profile_table() };
        assert_eq!(generate(&[(3, 0x20B210DE, &empty)]), Err(GenerateError::NoProfiles(3)));
    }
}
