//! One reconfiguration pass: observe every GPU, plan against a config, execute. The CLI's
//! `apply`, the benches and (later) the agent's reconcile loop all go through here.

use crate::backend::{BackendError, GpuBackend};
use crate::config::MigConfig;
use crate::exec::{execute, ExecOptions, GpuReport, Outcome};
use crate::prepare::{prepare, Job, PrepareError};

/// Options of one pass.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Destroy busy instances when no plan can keep them.
    pub force: bool,
    /// Only change MIG modes.
    pub mode_only: bool,
    /// Execution options.
    pub exec: ExecOptions,
}

/// Why a pass did not run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// Reading the GPUs failed.
    #[error("reading the GPUs: {0}")]
    Observe(#[from] BackendError),
    /// The config cannot be applied; nothing was changed.
    #[error("nothing was changed: {0}")]
    Prepare(#[from] PrepareError),
    /// A hook run before the changes failed; nothing was changed.
    #[error("nothing was changed: {0}")]
    Hook(String),
}

/// The jobs planned and what became of each.
#[derive(Debug)]
pub struct Pass {
    /// Per-GPU jobs, in GPU order.
    pub jobs: Vec<Job>,
    /// Per-GPU reports, in the same order.
    pub reports: Vec<GpuReport>,
}

impl Pass {
    /// GPUs whose job failed.
    pub fn failed(&self) -> usize {
        self.reports.iter().filter(|r| matches!(r.outcome, Outcome::Failed(_))).count()
    }

    /// GPU instances (kept, destroyed, created) over all plans.
    pub fn instance_counts(&self) -> (usize, usize, usize) {
        self.jobs
            .iter()
            .filter_map(|j| j.plan.as_ref())
            .fold((0, 0, 0), |(k, d, c), p| (k + p.keep.len(), d + p.destroy.len(), c + p.create.len()))
    }
}

/// Observes, plans and executes `config` on every GPU of `backend`.
pub fn run(backend: &dyn GpuBackend, config: &MigConfig, opts: Options) -> Result<Pass, PassError> {
    run_with(backend, config, opts, &mut |_| Ok(()))
}

/// Like [`run`], calling `before_execute` with the planned jobs just before anything changes (the
/// place for mig-parted's `pre-apply-mode` / `pre-apply-config` hooks); its error aborts the pass.
pub fn run_with(
    backend: &dyn GpuBackend,
    config: &MigConfig,
    opts: Options,
    before_execute: &mut dyn FnMut(&[Job]) -> Result<(), String>,
) -> Result<Pass, PassError> {
    let states = backend.observe_all()?;
    let jobs = prepare(states, config, opts.force, opts.mode_only)?;
    before_execute(&jobs).map_err(PassError::Hook)?;
    let reports = execute(backend, &jobs, opts.exec);
    Ok(Pass { jobs, reports })
}
