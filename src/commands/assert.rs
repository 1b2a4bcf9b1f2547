//! `gpupart assert`: exit 0 iff the selected config is applied, else the first difference.

use super::io::read_config;
use super::mig_parted;
use crate::backend::open as open_backend;
use crate::cli::{AssertArgs, GpuOptions};
use crate::layout::DesiredDevices;
use crate::mps::daemon::DaemonStatus;
use crate::mps::settings::MpsSettings;
use crate::observed::GpuState;
use crate::prepare::{mode_targets, targets, Target};
use anyhow::Context;
use std::process::ExitCode;

/// The first difference between the GPUs and what the config wants, if any. `daemons[i]` is
/// GPU `states[i]`'s MPS daemon as read (`None`: none runs and gpupart configured none).
pub fn first_difference(
    states: &[GpuState],
    targets: &[Target],
    daemons: &[Option<DaemonStatus>],
    mode_only: bool,
) -> Option<String> {
    for (i, (s, t)) in states.iter().zip(targets).enumerate() {
        let at = format!("GPU {} ({})", s.info.index, s.info.model);
        let mode = |on: bool| if on { "enabled" } else { "disabled" };
        let daemon = daemons.get(i).and_then(Option::as_ref).filter(|d| d.running());
        match t {
            // Mode only: the GPUs the config does not select are not judged (as mig-parted walks them).
            Target::Leave { .. } if mode_only => {}
            Target::Leave { reason } if s.info.mig_capable => return Some(format!("{at}: {reason}")),
            Target::Leave { .. } => {}
            Target::MigDisabled { mps } => {
                if s.mig_mode.current || s.mig_mode.pending {
                    return Some(format!(
                        "{at}: MIG mode is {} (pending {}), want disabled",
                        mode(s.mig_mode.current),
                        mode(s.mig_mode.pending)
                    ));
                }
                if mode_only {
                    continue;
                }
                if let Some(d) = mps_difference(mps.as_ref(), daemon) {
                    return Some(format!("{at}: {d}"));
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
                if let Some(d) = daemon {
                    return Some(format!("{at}: an MPS daemon (pid {}) runs, want none", d.pid.unwrap_or_default()));
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

/// How a GPU's MPS daemon (running, or `None`) differs from what the entry wants.
fn mps_difference(want: Option<&MpsSettings>, daemon: Option<&DaemonStatus>) -> Option<String> {
    match (want, daemon) {
        (None, None) => None,
        (None, Some(d)) => Some(format!("an MPS daemon (pid {}) runs, want none", d.pid.unwrap_or_default())),
        (Some(w), None) => Some(format!("no MPS daemon runs, want one with {} slots", w.replicas)),
        (Some(w), Some(d)) => {
            if let Some(why) = crate::mps::daemon::difference(d, w) {
                return Some(format!("the MPS daemon (pid {}): {why}", d.pid.unwrap_or_default()));
            }
            match d.settings {
                Some(s) if s.replicas == w.replicas => None,
                Some(s) => Some(format!("the MPS daemon serves {} slots, want {}", s.replicas, w.replicas)),
                None => Some(format!("the MPS daemon was not started by gpupart, want one with {} slots", w.replicas)),
            }
        }
    }
}

/// Runs `assert`.
pub fn run(g: &GpuOptions, a: &AssertArgs) -> anyhow::Result<ExitCode> {
    let file = read_config(&a.config.config_file)?;
    let config = file.choose(a.config.selected_config.as_deref())?;
    if a.valid_config {
        if g.as_mig_parted {
            outln!("{}", mig_parted::CONFIG_VALID);
        } else {
            outln!("Selected MIG configuration '{}' is valid", config.name);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let mps = crate::mps::Mps::from_args(g);
    let daemons: Vec<Option<DaemonStatus>> = states.iter().map(|s| mps.observe(s)).collect();
    let wanted = if a.mode_only {
        // Mode only means mode only: what the entries ask of the devices is not judged.
        mode_targets(&states, config).map(|(t, let_pass)| {
            for note in let_pass {
                tracing::warn!("mode only, not judged: {note}");
            }
            t
        })
    } else {
        targets(&states, config)
    };
    let diff = match wanted {
        Ok(t) => first_difference(&states, &t, &daemons, a.mode_only),
        Err(e) => Some(e.to_string()),
    };
    match (diff, g.as_mig_parted) {
        (None, true) => outln!("{}", if a.mode_only { mig_parted::MODE_APPLIED } else { mig_parted::CONFIG_APPLIED }),
        (None, false) if a.mode_only => {
            outln!("Selected MIG mode settings of config '{}' currently applied", config.name)
        }
        (None, false) => outln!("Selected MIG configuration currently applied"),
        (Some(d), true) => {
            mig_parted::debug(g.debug, &d);
            mig_parted::fatal(mig_parted::NOT_APPLIED);
            return Ok(ExitCode::FAILURE);
        }
        (Some(d), false) => {
            eprintln!("assertion failure: selected configuration not currently applied: {d}");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
