//! `gpupart checkpoint` and `gpupart restore`: the node's MIG state to and from a mig-parted
//! checkpoint file. Restore runs the hooks as `apply` does and changes nothing unless every GPU
//! of the file can be brought back.

use super::apply::render;
use crate::backend::open as open_backend;
use crate::checkpoint;
use crate::cli::{CheckpointArgs, GpuOptions, RestoreArgs};
use crate::exec::{ExecOptions, Outcome};
use anyhow::Context;
use std::process::ExitCode;

/// Runs `checkpoint`.
pub fn save(g: &GpuOptions, a: &CheckpointArgs) -> anyhow::Result<ExitCode> {
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let c = checkpoint::of(&states);
    let text = serde_json::to_string(&c)?;
    let path = &a.checkpoint_file;
    crate::fsutil::write_atomic(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    outln!("MIG configuration checkpointed successfully ({} GPU(s) in {})", c.mig_state.devices.len(), path.display());
    Ok(ExitCode::SUCCESS)
}

/// The `MIG_PARTED_*` environment restore's hooks see.
fn hook_settings(a: &RestoreArgs, debug: bool) -> Vec<(String, String)> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec![
        ("MIG_PARTED_CHECKPOINT_FILE".into(), path(&a.checkpoint_file)),
        ("MIG_PARTED_HOOKS_FILE".into(), a.hooks_file.as_deref().map(path).unwrap_or_default()),
        ("MIG_PARTED_MODE_CHANGE_ONLY".into(), a.mode_only.to_string()),
        ("MIG_PARTED_DEBUG".into(), debug.to_string()),
    ]
}

/// Runs `restore`.
pub fn restore(g: &GpuOptions, a: &RestoreArgs) -> anyhow::Result<ExitCode> {
    let (text, name) = super::io::read_input(&a.checkpoint_file, "checkpoint file")?;
    let wanted = checkpoint::parse(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("invalid checkpoint file {name}"))?;
    let hooks = match &a.hooks_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading hooks file {}", p.display()))?;
            Some(crate::hooks::parse(&text).with_context(|| format!("invalid hooks file {}", p.display()))?)
        }
        None => None,
    };
    let settings = hook_settings(a, g.debug);
    if let Some(h) = &hooks {
        h.run("apply-start", &settings, g.debug)?;
    }
    let result = restore_between_hooks(g, a, &wanted, hooks.as_ref(), &settings);
    if let Some(h) = &hooks {
        if let Err(e) = h.run("apply-exit", &settings, g.debug) {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    }
    result
}

fn restore_between_hooks(
    g: &GpuOptions,
    a: &RestoreArgs,
    wanted: &checkpoint::Checkpoint,
    hooks: Option<&crate::hooks::Hooks>,
    settings: &[(String, String)],
) -> anyhow::Result<ExitCode> {
    let backend = open_backend(g)?;
    let mut states = backend.observe_all().context("reading the GPUs")?;
    // Devices the kubelet allocated to pods are busy too.
    let pods = crate::kubelet::pod_resources::PodResources::from_args(g);
    if pods.socket.exists() {
        let (uses, _) = pods.probe();
        crate::kubelet::allocations::attach(&mut states, &uses.unwrap_or_default());
    }
    let jobs = match checkpoint::restore_jobs(&states, wanted, a.mode_only, a.force) {
        Ok(j) => j,
        Err(problems) => {
            eprintln!("error: nothing was changed; the checkpoint cannot be restored:");
            for p in &problems {
                eprintln!("  {p}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Some(h) = hooks {
        h.before_change(&jobs, settings, g.debug)?;
    }
    super::interrupt::install();
    let opts = ExecOptions { dry_run: false, parallel: 8, skip_reset: false, stop: Some(&super::interrupt::STOP) };
    let reports = crate::exec::execute(backend.as_ref(), &jobs, opts);
    let mut out = String::new();
    for (job, report) in jobs.iter().zip(&reports) {
        render(&mut out, job, report, false);
    }
    out!("{out}");
    let failed = reports.iter().filter(|r| matches!(r.outcome, Outcome::Failed(_))).count();
    if let Some((signal, code)) = super::interrupt::received() {
        eprintln!("interrupted by {signal}: the changes listed above were made; restore again to finish");
        return Ok(ExitCode::from(code));
    }
    if failed > 0 {
        eprintln!("error: {failed} GPU(s) failed; see above for what was changed on each");
        return Ok(ExitCode::FAILURE);
    }
    outln!("MIG configuration restored successfully");
    Ok(ExitCode::SUCCESS)
}
