//! `gpupart assert`: exit 0 iff the selected config is applied, else the first difference.

use super::{open_backend, read_config};
use crate::cli::{AssertArgs, GpuOptions};
use crate::layout::DesiredDevices;
use crate::observed::GpuState;
use crate::prepare::{targets, Target};
use anyhow::Context;
use std::process::ExitCode;

/// The first difference between the GPUs and what the config wants, if any.
pub fn first_difference(states: &[GpuState], targets: &[Target], mode_only: bool) -> Option<String> {
    for (s, t) in states.iter().zip(targets) {
        let at = format!("GPU {} ({})", s.info.index, s.info.model);
        let mode = |on: bool| if on { "enabled" } else { "disabled" };
        match t {
            Target::Leave { reason } if s.info.mig_capable => return Some(format!("{at}: {reason}")),
            Target::Leave { .. } => {}
            Target::MigDisabled { .. } => {
                if s.mig_mode.current || s.mig_mode.pending {
                    return Some(format!(
                        "{at}: MIG mode is {} (pending {}), want disabled",
                        mode(s.mig_mode.current),
                        mode(s.mig_mode.pending)
                    ));
                }
            }
            Target::MigEnabled { devices } => {
                if !s.mig_mode.current || !s.mig_mode.pending {
                    return Some(format!(
                        "{at}: MIG mode is {} (pending {}), want enabled",
                        mode(s.mig_mode.current),
                        mode(s.mig_mode.pending)
                    ));
                }
                if mode_only {
                    continue;
                }
                let have = DesiredDevices::from_keys(
                    s.instances.iter().flat_map(|g| g.cis.iter().map(|c| (g.profile_id, c.profile_id))),
                );
                if have != *devices {
                    return Some(format!(
                        "{at}: has {}, want {}",
                        have.describe(&s.profiles),
                        devices.describe(&s.profiles)
                    ));
                }
            }
        }
    }
    None
}

/// Runs `assert`.
pub fn run(g: &GpuOptions, a: &AssertArgs) -> anyhow::Result<ExitCode> {
    let file = read_config(&a.config.config_file)?;
    let config = file.choose(a.config.selected_config.as_deref())?;
    if a.valid_config {
        outln!("Selected MIG configuration '{}' is valid", config.name);
        return Ok(ExitCode::SUCCESS);
    }
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let diff = match targets(&states, config) {
        Ok(t) => first_difference(&states, &t, a.mode_only),
        Err(e) => Some(e.to_string()),
    };
    match diff {
        None => {
            outln!("Selected MIG configuration currently applied");
            Ok(ExitCode::SUCCESS)
        }
        Some(d) => {
            eprintln!("assertion failure: selected configuration not currently applied: {d}");
            Ok(ExitCode::FAILURE)
        }
    }
}
