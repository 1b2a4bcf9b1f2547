//! `gpupart apply`: plan every GPU, refuse before touching anything if any GPU cannot be planned,
//! then execute concurrently and report per GPU.

use super::io::read_config;
use super::mig_parted;
use crate::backend::open as open_backend;
use crate::cli::{ApplyArgs, GpuOptions};
use crate::exec::{ExecOptions, GpuReport, Outcome};
use crate::prepare::{Job, Target};
use crate::reconfigure::{self, Options, PassError};
use anyhow::Context;
use std::fmt::Write as _;
use std::process::ExitCode;

/// Runs `apply`.
pub fn run(g: &GpuOptions, a: &ApplyArgs) -> anyhow::Result<ExitCode> {
    let file = read_config(&a.config.config_file)?;
    let config = file.choose(a.config.selected_config.as_deref())?;
    let hooks = match &a.hooks_file {
        Some(p) if !a.dry_run => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading hooks file {}", p.display()))?;
            Some(crate::hooks::parse(&text).with_context(|| format!("invalid hooks file {}", p.display()))?)
        }
        _ => None,
    };
    let settings = hook_settings(a, &config.name, g.debug);
    if let Some(h) = &hooks {
        h.run("apply-start", &settings, g.debug)?;
    }
    let result = apply_with_hooks(g, a, config, hooks.as_ref(), &settings);
    if let Some(h) = &hooks {
        if let Err(e) = h.run("apply-exit", &settings, g.debug) {
            fail(g, &format!("running the apply-exit hook: {e}"));
            return Ok(ExitCode::FAILURE);
        }
    }
    result
}

/// The `MIG_PARTED_*` environment hooks see (mig-parted passes every flag that has an env source).
fn hook_settings(a: &ApplyArgs, config: &str, debug: bool) -> Vec<(String, String)> {
    let path = |p: &std::path::Path| p.display().to_string();
    let hooks_file = a.hooks_file.as_deref().map(path).unwrap_or_default();
    crate::hooks::apply_env(&path(&a.config.config_file), config, &hooks_file, a.skip_reset, a.mode_only, debug)
}

fn apply_with_hooks(
    g: &GpuOptions,
    a: &ApplyArgs,
    config: &crate::config::MigConfig,
    hooks: Option<&crate::hooks::Hooks>,
    settings: &[(String, String)],
) -> anyhow::Result<ExitCode> {
    let backend = open_backend(g)?;
    if !a.dry_run {
        super::interrupt::install();
    }
    if backend.gpu_count().context("counting the GPUs")? == 0 {
        anyhow::bail!("no GPUs found ({}): nothing to apply config '{}' to", backend.describe(), config.name);
    }
    let opts = Options {
        force: a.force,
        mode_only: a.mode_only,
        exec: ExecOptions {
            dry_run: a.dry_run,
            parallel: a.parallel as usize,
            skip_reset: a.skip_reset,
            stop: Some(&super::interrupt::STOP),
        },
    };
    let mut before = |jobs: &[Job]| -> Result<(), String> {
        let Some(h) = hooks else { return Ok(()) };
        h.before_change(jobs, settings, g.debug).map_err(|e| e.to_string())
    };
    let mps = crate::mps::Mps::from_args(g);
    let pods = crate::kubelet::pod_resources::PodResources::from_args(g);
    // Off Kubernetes there is no socket: nothing to say. A socket that fails is worth a warning.
    let source = pods.socket.exists().then(|| crate::kubelet::pod_resources::Reported::new(pods, Box::new(|_| {})));
    let allocations = source.as_ref().map(|s| s as &dyn crate::kubelet::pod_resources::AllocationSource);
    let pass = match reconfigure::run_with(backend.as_ref(), config, opts, Some(&mps), allocations, &mut before) {
        Ok(p) => p,
        Err(PassError::Prepare(e)) if e.selects_nothing && g.as_mig_parted => {
            // mig-parted walks no GPU and succeeds.
            tracing::warn!("{}", e.problems.join("; "));
            outln!("{}", mig_parted::APPLIED);
            return Ok(ExitCode::SUCCESS);
        }
        Err(PassError::Prepare(e)) if g.as_mig_parted => {
            fail(g, &format!("nothing was changed: {}", e.problems.join("; ")));
            return Ok(ExitCode::FAILURE);
        }
        Err(PassError::Prepare(e)) => {
            eprintln!("error: nothing was changed; config '{}' cannot be applied:", config.name);
            for p in &e.problems {
                eprintln!("  {p}");
            }
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = String::new();
    for (job, report) in pass.jobs.iter().zip(&pass.reports) {
        let plan = pass.mps_plans.iter().find(|p| p.gpu == report.gpu);
        render(&mut out, job, report, plan.is_some_and(|p| p.action.changes()));
        let done = pass.mps.iter().find(|r| r.gpu == report.gpu);
        render_mps(&mut out, plan, done, a.dry_run);
    }
    out!("{out}");
    let failed = pass.failed();
    let changed = pass
        .reports
        .iter()
        .filter(|r| {
            matches!(r.outcome, Outcome::Applied | Outcome::DryRun)
                || pass.mps_plans.iter().any(|p| p.gpu == r.gpu && p.action.changes())
        })
        .count();
    let (kept, destroyed, created) = pass.instance_counts();
    let reports = &pass.reports;
    let simulated = if backend.is_simulated() { "; simulated GPUs, no real GPU changed" } else { "" };
    let totals = format!(
        "{changed} GPU(s) to change, {} unchanged; GPU instances kept {kept}, destroyed {destroyed}, created {created}{simulated}",
        reports.len() - changed - failed
    );
    if let Some((signal, code)) = super::interrupt::received() {
        let stopped = |started: bool| {
            reports
                .iter()
                .filter(|r| {
                    matches!(&r.outcome, Outcome::Failed(crate::exec::ExecError::Interrupted { started: s, .. }) if *s == started)
                })
                .count()
        };
        let (part, not_started) = (stopped(true), stopped(false));
        let finished = reports.iter().filter(|r| matches!(r.outcome, Outcome::Applied)).count();
        eprintln!(
            "interrupted by {signal}: {finished} GPU(s) finished, {part} stopped part-way (the changes listed above \
             were made), {not_started} not started; apply again to finish"
        );
        return Ok(ExitCode::from(code));
    }
    if failed > 0 {
        fail(g, &format!("{failed} GPU(s) failed; see above for what was changed on each"));
        return Ok(ExitCode::FAILURE);
    }
    if a.dry_run {
        outln!("dry run, nothing was changed: {totals}");
    } else if g.as_mig_parted {
        outln!("{totals}");
        outln!("{}", mig_parted::APPLIED);
    } else {
        outln!("MIG configuration applied successfully ({totals})");
    }
    Ok(ExitCode::SUCCESS)
}

/// Says why `apply` fails: in mig-parted's words and log format when invoked as it, else `error: …`.
fn fail(g: &GpuOptions, why: &str) {
    if g.as_mig_parted {
        mig_parted::fatal(&format!("error applying MIG configuration with hooks: {why}"));
    } else {
        eprintln!("error: {why}");
    }
}

/// One GPU's MPS lines: the daemon's action, then (after a run) the commands sent or the failure.
fn render_mps(
    out: &mut String,
    plan: Option<&crate::mps::GpuMps>,
    done: Option<&crate::mps::MpsReport>,
    dry_run: bool,
) {
    let Some(p) = plan else { return };
    if let crate::mps::Want::Serve(s) = p.want {
        let pct = s.active_thread_percentage.map_or_else(|| "no thread limit".to_string(), |v| format!("{v}% threads"));
        let mem =
            s.pinned_memory_limit_mib.map_or_else(|| "no memory limit".to_string(), |v| format!("{v}M pinned memory"));
        let _ = writeln!(out, "  mps      {} client slots, {pct}, {mem} per client: {}", s.replicas, p.action);
    } else if p.action.changes() {
        let _ = writeln!(out, "  mps      {}", p.action);
    }
    let Some(r) = done.filter(|_| !dry_run) else { return };
    if let Some(e) = &r.error {
        let _ = writeln!(out, "  MPS FAILED: {e}");
    }
    if let Some(pid) = r.pid.filter(|_| r.action.changes()) {
        let _ = writeln!(out, "  mps daemon pid {pid}");
    }
}

fn mode_word(on: bool) -> &'static str {
    if on {
        "enabled"
    } else {
        "disabled"
    }
}

pub(super) fn render(out: &mut String, job: &Job, report: &GpuReport, mps_changes: bool) {
    let s = &job.state;
    let _ = write!(out, "GPU {} {} ({})", s.info.index, s.info.model, s.info.uuid);
    if let Target::Leave { reason } = &job.target {
        let _ = writeln!(out, ": left alone, {reason}");
        return;
    }
    match job.mode_change {
        Some(on) => {
            let _ = writeln!(out, ": MIG mode {} -> {}", mode_word(s.mig_mode.current), mode_word(on));
        }
        None => {
            let _ = writeln!(out, ": MIG mode {}", mode_word(s.mig_mode.current));
        }
    }
    if let Some(plan) = &job.plan {
        for k in &plan.keep {
            let _ = writeln!(out, "  keep     {}@{} (GPU instance {})", k.name, k.placement.start, k.gi_id);
        }
        for r in &plan.reshape {
            let _ = writeln!(
                out,
                "  reshape  {}@{} (GPU instance {}): compute instances [{}]",
                r.name,
                r.placement.start,
                r.gi_id,
                r.device_names.join(", ")
            );
        }
        for d in &plan.destroy {
            let busy = if d.busy { ", busy" } else { "" };
            let _ = writeln!(out, "  destroy  {}@{} (GPU instance {}{busy})", d.name, d.placement.start, d.gi_id);
        }
        for c in &plan.create {
            let _ = writeln!(out, "  create   {}@{} [{}]", c.name, c.placement.start, c.device_names.join(", "));
        }
    }
    match &report.outcome {
        Outcome::Unchanged if mps_changes => {}
        Outcome::Unchanged => {
            let _ = writeln!(out, "  already applied");
        }
        Outcome::DryRun => {
            let _ = writeln!(out, "  (dry run)");
        }
        Outcome::Applied => {
            let _ = writeln!(out, "  applied: {} change(s) in {} ms", report.steps.len(), report.elapsed.as_millis());
        }
        Outcome::Failed(e) => {
            let _ = writeln!(out, "  FAILED: {e}");
            if report.steps.is_empty() {
                let _ = writeln!(out, "  nothing was changed on this GPU");
            } else {
                let _ = writeln!(out, "  changed before the failure:");
                for st in &report.steps {
                    let _ = writeln!(out, "    {st}");
                }
            }
        }
    }
}
