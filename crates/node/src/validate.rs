//! Offline validation of a config file against the catalog: unknown profiles for the models an
//! entry selects, counts over instanceCount, infeasible layouts, device indices out of range.
//! Pure: the caller supplies the node (or none, meaning "every catalog model").

use crate::config::{no_mig_reason, select_all, ConfigFile, DeviceSpec, Devices, GpuIdent, MigConfig, Selection};
use crate::layout::DesiredDevices;
use crate::mig::catalog::{self, Model};
use crate::plan::plan;

/// Checks one entry's MIG devices on one model; `None` when they fit.
fn check_on_model(model: &Model, spec: &DeviceSpec) -> Option<String> {
    let table = model.profile_table();
    let desired = match DesiredDevices::resolve(&table, &spec.mig_devices) {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    plan(&table, &[], &desired, false).err().map(|e| e.to_string())
}

/// What validation found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Errors: the config cannot work on a model it selects.
    pub problems: Vec<String>,
    /// Things that could not be checked (models the catalog does not know).
    pub warnings: Vec<String>,
}

/// Checks an entry's `mps` block on the models it may land on: the filtered ones are problems;
/// without a filter a model that cannot serve it is a warning, and every model failing a problem.
fn check_mps_offline(at: &str, spec: &DeviceSpec, filtered: &[&'static Model], found: &mut Findings) {
    let Some(mps) = &spec.mps else { return };
    let models: Vec<&'static Model> =
        if spec.filter.is_empty() { catalog::models().collect() } else { filtered.to_vec() };
    let failures: Vec<String> = models
        .iter()
        .filter_map(|m| crate::mps::settings::resolve_on_model(mps, m).err().map(|e| format!("{at}, {e}")))
        .collect();
    if !spec.filter.is_empty() || failures.len() == models.len() {
        found.problems.extend(failures);
    } else {
        found.warnings.extend(failures);
    }
}

fn check_entry_offline(config: &MigConfig, entry: usize, spec: &DeviceSpec, found: &mut Findings) {
    let at = format!("config '{}', entry {entry}", config.name);
    let filtered: Vec<&'static Model> =
        catalog::models().filter(|m| spec.filter.iter().any(|f| f.device_id == m.pci_device_id)).collect();
    if !spec.mig_enabled {
        check_mps_offline(&at, spec, &filtered, found);
        return;
    }
    if !spec.filter.is_empty() {
        if filtered.is_empty() {
            let ids: Vec<String> = spec.filter.iter().map(ToString::to_string).collect();
            found
                .warnings
                .push(format!("{at}, key 'device-filter': not checked, no catalog model has {}", ids.join(", ")));
        }
        if matches!(spec.devices, Devices::Indices(_)) {
            if let Some(m) = filtered.iter().find(|m| !m.mig_capable()) {
                found.problems.push(format!("{at}, key 'mig-enabled': {} does not support MIG", m.id));
            }
        }
        for m in filtered.iter().filter(|m| m.mig_capable()) {
            if let Some(p) = check_on_model(m, spec) {
                found.problems.push(format!("{at}, key 'mig-devices': on {}: {p}", m.id));
            }
        }
        return;
    }
    if spec.mig_devices.is_empty() {
        return;
    }
    // No filter: the entry is meant for whichever models know its profile names.
    let mut fits_somewhere = false;
    let mut infeasible = Vec::new();
    for m in catalog::all_models().filter(|m| m.mig_capable()) {
        let table = m.profile_table();
        if DesiredDevices::resolve(&table, &spec.mig_devices).is_err() {
            continue;
        }
        match check_on_model(m, spec) {
            None => fits_somewhere = true,
            Some(p) => infeasible.push(format!("{at}, key 'mig-devices': on {}: {p}", m.id)),
        }
    }
    if !fits_somewhere && infeasible.is_empty() {
        let names: Vec<String> = spec.mig_devices.iter().map(|(n, _)| n.to_string()).collect();
        found.problems.push(format!(
            "{at}, key 'mig-devices': no known GPU has {} (add a device-filter naming the GPU it is for)",
            names.join(", ")
        ));
    }
    found.problems.extend(infeasible);
}

fn check_on_node(config: &MigConfig, node: &[(&'static Model, GpuIdent)], problems: &mut Vec<String>) {
    let idents: Vec<GpuIdent> = node.iter().map(|(_, i)| i.clone()).collect();
    // Every problem: a bad index does not hide what the other entries would do.
    let (selections, errors) = select_all(config, &idents);
    problems.extend(errors.iter().map(ToString::to_string));
    problems.extend(no_mig_reason(config, &idents, &selections));
    let mut seen = Vec::new();
    for ((model, ident), sel) in node.iter().zip(selections) {
        if let Selection::Disabled { entry, mps: Some(mps) } = &sel {
            if let Err(e) = crate::mps::settings::resolve_on_model(mps, model) {
                problems.push(format!("config '{}', entry {entry}, {e} (GPU {})", config.name, ident.index));
            }
        }
        if let Selection::Enabled { entry, .. } = sel {
            if seen.contains(&(entry, model.id)) {
                continue;
            }
            seen.push((entry, model.id));
            if let Some(p) = check_on_model(model, &config.specs[entry]) {
                problems.push(format!(
                    "config '{}', entry {entry}, key 'mig-devices': on GPU {} ({}): {p}",
                    config.name, ident.index, model.id
                ));
            }
        }
    }
}

/// Validates `file` (or only config `only`); `node` is the GPUs to check against, in index
/// order, or `None` for every catalog model. Returns every problem found.
pub fn validate(file: &ConfigFile, only: Option<&str>, node: Option<&[&'static Model]>) -> Result<Findings, String> {
    let configs: Vec<&MigConfig> = match only {
        Some(name) => vec![file.choose(Some(name)).map_err(|e| e.to_string())?],
        None => file.configs.iter().collect(),
    };
    let node: Option<Vec<(&'static Model, GpuIdent)>> = node.map(|models| {
        models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let ident = GpuIdent {
                    index: i as u32,
                    device_id: m.pci_device_id,
                    subsystem_id: None,
                    mig_capable: m.mig_capable(),
                    model: m.id.to_string(),
                };
                (*m, ident)
            })
            .collect()
    });
    let mut found = Findings::default();
    for config in configs {
        match &node {
            Some(n) => check_on_node(config, n, &mut found.problems),
            None => {
                for (entry, spec) in config.specs.iter().enumerate() {
                    check_entry_offline(config, entry, spec, &mut found);
                }
            }
        }
    }
    for (name, _) in &file.workload {
        let known = catalog::all_models().any(|m| m.mig_capable() && m.profile_table().resolve(name).is_ok());
        if !known {
            found
                .warnings
                .push(format!("key 'gpupart.workload': no known GPU has {name}; it is left out of every mix"));
        }
    }
    Ok(found)
}
