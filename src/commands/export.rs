//! `gpupart export`: the current layout as a mig-parted v1 config. Identical GPUs are merged,
//! `devices: all` is used when every GPU of a kind is alike, device filters appear only on mixed
//! nodes, and (in YAML) each GPU's placements are kept as comments mig-parted ignores. A GPU
//! whose MPS daemon gpupart started and still runs exports its `mps` block with the settings the
//! daemon serves, so export-then-apply keeps it.

use crate::backend::open as open_backend;
use crate::cli::{ExportArgs, ExportFormat, GpuOptions};
use crate::config::write::EntryLines;
use crate::mps::settings::{limit_arg, MpsSettings};
use crate::observed::GpuState;
use anyhow::Context;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::process::ExitCode;

/// One exported entry: which GPUs, and what they have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Device filter, when the node has several GPU kinds.
    pub filter: Option<u32>,
    /// GPU indices, or `None` for `all`.
    pub devices: Option<Vec<u32>>,
    /// MIG enabled.
    pub mig_enabled: bool,
    /// MIG device name → count, in name order.
    pub mig_devices: BTreeMap<String, u32>,
    /// `GPU n: profile@start …` comment lines.
    pub placements: Vec<String>,
    /// The settings the GPUs' MPS daemons serve (MIG disabled only).
    pub mps: Option<MpsSettings>,
}

/// The entries describing `states`; `mps[i]` is what GPU `states[i]`'s running MPS daemon
/// serves, when gpupart started one there (missing entries mean none).
pub fn entries(states: &[GpuState], mps: &[Option<MpsSettings>]) -> Vec<Entry> {
    let kinds: Vec<u32> = {
        let mut k: Vec<u32> = states.iter().map(|s| s.info.pci_device_id).collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    // Group GPUs of one kind with the same mode and devices; `filter` holds the kind for now.
    let mut groups: Vec<Entry> = Vec::new();
    for (i, s) in states.iter().enumerate() {
        let served = mps.get(i).copied().flatten().filter(|_| !s.mig_mode.current);
        let mut counts = BTreeMap::new();
        for n in s.device_names() {
            *counts.entry(n).or_insert(0) += 1;
        }
        let enabled = s.mig_mode.current;
        let mut gis: Vec<_> = s.instances.iter().collect();
        gis.sort_by_key(|g| g.placement.start);
        let mut line = format!("GPU {}:", s.info.index);
        for gi in gis {
            line.push_str(&format!(" {}@{}", s.gi_name(gi), gi.placement.start));
        }
        // A GPU without instances has no placement comment.
        let placed = (!s.instances.is_empty()).then_some(line);
        let kind = Some(s.info.pci_device_id);
        match groups
            .iter_mut()
            .find(|g| g.filter == kind && g.mig_enabled == enabled && g.mig_devices == counts && g.mps == served)
        {
            Some(g) => {
                g.devices.get_or_insert_with(Vec::new).push(s.info.index);
                g.placements.extend(placed);
            }
            None => groups.push(Entry {
                filter: kind,
                devices: Some(vec![s.info.index]),
                mig_enabled: enabled,
                mig_devices: counts,
                placements: placed.into_iter().collect(),
                mps: served,
            }),
        }
    }
    for g in &mut groups {
        let kind = g.filter.unwrap_or_default();
        let members = g.devices.as_ref().map_or(0, Vec::len);
        if states.iter().filter(|s| s.info.pci_device_id == kind).count() == members {
            g.devices = None;
        }
        if kinds.len() == 1 {
            g.filter = None;
        }
        if !g.mig_enabled {
            g.placements.clear();
        }
    }
    groups
}

fn yaml(label: &str, entries: &[Entry]) -> String {
    let mut out = format!("version: v1\nmig-configs:\n  {label}:\n");
    for e in entries {
        for p in &e.placements {
            out.push_str(&format!("    # gpupart placements {p}\n"));
        }
        let devices = match &e.devices {
            None => "all".into(),
            Some(d) => format!("[{}]", d.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
        };
        // As mig-parted exports it: an empty mapping for disabled GPUs too.
        let lines = EntryLines {
            filter: e.filter.map(|f| format!("\"0x{f:08X}\"")),
            devices,
            mig_enabled: e.mig_enabled,
            mig_devices: Some(&e.mig_devices),
        };
        crate::config::write::entry(&mut out, &lines);
        if let Some(m) = &e.mps {
            out.push_str("      mps:\n");
            for (key, value) in mps_fields(m) {
                let value = value.as_str().map_or_else(|| value.to_string(), str::to_string);
                out.push_str(&format!("        {key}: {value}\n"));
            }
        }
    }
    out
}

/// The `mps` block's fields as written in a config.
fn mps_fields(m: &MpsSettings) -> Vec<(&'static str, Value)> {
    let mut fields = vec![("replicas", json!(m.replicas))];
    if let Some(p) = m.active_thread_percentage {
        fields.push(("active-thread-percentage", json!(p)));
    }
    if let Some(mib) = m.pinned_memory_limit_mib {
        fields.push(("pinned-memory-limit", json!(limit_arg(mib))));
    }
    fields
}

fn json_doc(label: &str, entries: &[Entry]) -> Value {
    let specs: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            if let Some(f) = e.filter {
                m.insert("device-filter".into(), json!(format!("0x{f:08X}")));
            }
            m.insert("devices".into(), e.devices.as_ref().map_or(json!("all"), |d| json!(d)));
            m.insert("mig-enabled".into(), json!(e.mig_enabled));
            m.insert("mig-devices".into(), json!(e.mig_devices));
            if let Some(s) = &e.mps {
                m.insert("mps".into(), Value::Object(mps_fields(s).into_iter().map(|(k, v)| (k.into(), v)).collect()));
            }
            Value::Object(m)
        })
        .collect();
    json!({"version": "v1", "mig-configs": {label: specs}})
}

/// Runs `export`.
pub fn run(g: &GpuOptions, a: &ExportArgs) -> anyhow::Result<ExitCode> {
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let mps = crate::mps::Mps::from_args(g);
    let served: Vec<Option<MpsSettings>> = states.iter().map(|s| mps.serving(s)).collect();
    let entries = entries(&states, &served);
    match a.output {
        ExportFormat::Yaml => {
            let book = crate::gpu_health::read_or_warn(&g.health_file);
            // mig-parted ignores comments: the config stays the same.
            for (gpu, u) in book.unhealthy() {
                out!("# gpupart: {}\n", crate::gpu_health::describe(*gpu, u));
            }
            for gpu in book.affected() {
                for m in book.mig_faults(gpu) {
                    out!("# gpupart: {}\n", crate::gpu_health::describe_mig(m));
                }
            }
            out!("{}", yaml(&a.label, &entries))
        }
        ExportFormat::Json => outln!("{}", serde_json::to_string_pretty(&json_doc(&a.label, &entries))?),
    }
    Ok(ExitCode::SUCCESS)
}
