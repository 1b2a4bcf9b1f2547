//! A planned node layout (pure data) and the mig-parted v1 config it is written as, shared by
//! the report (which builds them) and the renderings (which print them).

use std::fmt::Write as _;

/// One named node layout of the config: the per-GPU specs of one GPU model.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Name in the config (`gpupart-shared-2`).
    pub name: String,
    /// The pool of the nodes using it.
    pub pool: String,
    /// Their GPU model (the entries' `device-filter`).
    pub model: &'static crate::mig::catalog::Model,
    /// Per GPU index.
    pub specs: Vec<GpuSpec>,
}

/// What the config says for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuSpec {
    /// MIG enabled with these devices (name, count), sorted.
    Mig(Vec<(String, u32)>),
    /// MIG disabled, no sharing.
    Off,
    /// MIG disabled, an MPS daemon with `slots` clients and a per-client memory limit.
    Mps {
        /// Client slots.
        slots: u32,
        /// Pinned memory per client (MiB), on GPUs that take limits.
        limit_mib: Option<u64>,
    },
}

/// Device indices as mig-parted writes them: `all` when the entry covers every GPU.
fn devices(indices: &[usize], total: usize) -> String {
    if indices.len() == total {
        return "all".into();
    }
    let list: Vec<String> = indices.iter().map(ToString::to_string).collect();
    format!("[{}]", list.join(", "))
}

/// The mig-parted v1 config with one named layout per distinct node layout.
pub fn config_yaml(layouts: &[Layout]) -> String {
    let mut out = String::from("version: v1\nmig-configs:\n");
    for Layout { name, model, specs, .. } in layouts {
        let _ = writeln!(out, "  {name}:");
        // One entry per distinct GPU spec, with the indices that have it.
        let mut groups: Vec<(&GpuSpec, Vec<usize>)> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            match groups.iter_mut().find(|(g, _)| *g == s) {
                Some((_, v)) => v.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        for (spec, idx) in groups {
            if matches!(spec, GpuSpec::Mig(devs) if devs.is_empty()) {
                out.push_str(
                    "    # idle in the shared pool: MIG stays on, so instances can be added later without a reset\n",
                );
            }
            let _ = writeln!(out, "    - device-filter: \"0x{:08X}\"", model.pci_device_id);
            let _ = writeln!(out, "      devices: {}", devices(&idx, specs.len()));
            match spec {
                GpuSpec::Mig(devs) if devs.is_empty() => {
                    out.push_str("      mig-enabled: true\n      mig-devices: {}\n")
                }
                GpuSpec::Mig(devs) => {
                    out.push_str("      mig-enabled: true\n      mig-devices:\n");
                    for (n, c) in devs {
                        let _ = writeln!(out, "        \"{n}\": {c}");
                    }
                }
                GpuSpec::Off => out.push_str("      mig-enabled: false\n"),
                GpuSpec::Mps { slots, limit_mib } => {
                    let _ = writeln!(out, "      mig-enabled: false\n      mps:\n        replicas: {slots}");
                    if let Some(l) = limit_mib {
                        let _ = writeln!(out, "        pinned-memory-limit: {}", crate::mps::settings::limit_arg(*l));
                    }
                }
            }
        }
    }
    out
}
