//! One reconfiguration pass: observe every GPU, plan against a config, execute. The CLI's
//! `apply`, the benches and (later) the agent's reconcile loop all go through here.

use crate::allocations::AllocationSource;
use crate::allocations::{attach, in_the_way};
use crate::backend::{BackendError, GpuBackend};
use crate::config::MigConfig;
use crate::exec::{execute, ExecOptions, GpuReport, Outcome};
use crate::mps::{GpuMps, Mps, MpsReport};
use crate::observed::PodUse;
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
    /// The kubelet kept allocating devices the change would take; nothing was changed.
    #[error("nothing was changed: {0}")]
    Allocations(String),
}

/// A node planned against a config: GPU jobs, MPS plans, and the kubelet allocations read
/// right before planning (attached to the jobs' states).
#[derive(Debug)]
pub struct Planned {
    /// Per-GPU jobs.
    pub jobs: Vec<Job>,
    /// Per-GPU MPS plans.
    pub mps_plans: Vec<GpuMps>,
    /// The allocations the plan respects.
    pub allocations: Vec<PodUse>,
}

/// How often a plan is made again when the kubelet allocates something in its way meanwhile.
pub const REPLANS: usize = 3;

/// Observes the GPUs, reads the kubelet's allocations (an unreadable source counts as none: the
/// processes NVML reports still protect instances), and plans every GPU and MPS daemon.
pub fn plan_node(
    backend: &dyn GpuBackend,
    config: &MigConfig,
    force: bool,
    mode_only: bool,
    mps: Option<&Mps>,
    allocations: Option<&dyn AllocationSource>,
) -> Result<Planned, PassError> {
    let mut states = backend.observe_all()?;
    let allocations = allocations.and_then(|a| a.read().ok()).unwrap_or_default();
    attach(&mut states, &allocations);
    let jobs = prepare(states, config, force, mode_only)?;
    let mps_plans = plan_mps(mps, &jobs, force)?;
    Ok(Planned { jobs, mps_plans, allocations })
}

/// Reads the allocations again right before the first destructive call: the ones the kubelet
/// made since planning that stand in the way (empty: go ahead; not forced only).
pub fn recheck(planned: &Planned, allocations: Option<&dyn AllocationSource>, force: bool) -> Vec<PodUse> {
    if force {
        return Vec::new();
    }
    match allocations.map(|a| a.read()) {
        Some(Ok(fresh)) => in_the_way(&planned.allocations, &fresh, &planned.jobs, &planned.mps_plans),
        _ => Vec::new(),
    }
}

/// Plans until no new allocation stands in the way (at most [`REPLANS`] times). Each plan is
/// first `adjust`ed (the agent drops the changes of unhealthy GPUs there), so what is announced
/// and checked is what will run.
pub fn plan_settled(
    backend: &dyn GpuBackend,
    config: &MigConfig,
    opts: Options,
    mps: Option<&Mps>,
    allocations: Option<&dyn AllocationSource>,
    adjust: &mut dyn FnMut(&mut Planned),
    before_recheck: &mut dyn FnMut(&Planned),
) -> Result<Planned, PassError> {
    let mut last = Vec::new();
    for attempt in 1..=REPLANS {
        let mut planned = plan_node(backend, config, opts.force, opts.mode_only, mps, allocations)?;
        adjust(&mut planned);
        if planned.jobs.iter().all(Job::is_noop) && planned.mps_plans.iter().all(|p| !p.action.changes()) {
            return Ok(planned);
        }
        before_recheck(&planned);
        last = recheck(&planned, allocations, opts.force);
        if last.is_empty() {
            return Ok(planned);
        }
        let names: Vec<String> = last.iter().map(ToString::to_string).collect();
        tracing::warn!(attempt, pods = %names.join(", "), "the kubelet allocated devices of the change while planning; planning again");
    }
    let names: Vec<String> = last.iter().map(ToString::to_string).collect();
    Err(PassError::Allocations(format!(
        "the kubelet allocated devices the change would take while it was planned, {REPLANS} times: {}",
        names.join(", ")
    )))
}

/// The jobs planned and what became of each.
#[derive(Debug)]
pub struct Pass {
    /// Per-GPU jobs, in GPU order.
    pub jobs: Vec<Job>,
    /// Per-GPU reports, in the same order.
    pub reports: Vec<GpuReport>,
    /// Per-GPU MPS plans (GPUs the config selects).
    pub mps_plans: Vec<GpuMps>,
    /// What became of the MPS actions that ran.
    pub mps: Vec<MpsReport>,
}

impl Pass {
    /// GPUs whose job failed (MIG changes or MPS daemons).
    pub fn failed(&self) -> usize {
        let mut gpus: Vec<u32> = self
            .reports
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .map(|r| r.gpu)
            .chain(self.mps.iter().filter(|r| r.error.is_some()).map(|r| r.gpu))
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus.len()
    }

    /// GPU instances (kept, destroyed, created) over all plans.
    pub fn instance_counts(&self) -> (usize, usize, usize) {
        self.jobs.iter().filter_map(|j| j.plan.as_ref()).fold((0, 0, 0), |(k, d, c), p| {
            (k + p.keep.len() + p.reshape.len(), d + p.destroy.len(), c + p.create.len())
        })
    }
}

/// Observes, plans and executes `config` on every GPU of `backend` (without MPS daemons).
pub fn run(backend: &dyn GpuBackend, config: &MigConfig, opts: Options) -> Result<Pass, PassError> {
    run_with(backend, config, opts, None, None, &mut |_| Ok(()))
}

/// Plans the MPS daemons for `jobs`; a busy daemon in the way is a (blocked) prepare error.
pub fn plan_mps(mps: Option<&Mps>, jobs: &[Job], force: bool) -> Result<Vec<GpuMps>, PrepareError> {
    match mps {
        None => Ok(Vec::new()),
        Some(m) => {
            m.plan(jobs, force).map_err(|problems| PrepareError { problems, blocked: true, selects_nothing: false })
        }
    }
}

/// Executes planned jobs with their MPS plans: daemons that must go stop first, then the MIG
/// changes run, then daemons that must come start (not on GPUs whose MIG change failed).
pub fn execute_node(
    backend: &dyn GpuBackend,
    jobs: &[Job],
    mps: Option<(&Mps, &[GpuMps])>,
    exec: ExecOptions,
) -> (Vec<GpuReport>, Vec<MpsReport>) {
    let Some((mps, plans)) = mps.filter(|_| !exec.dry_run) else {
        return (execute(backend, jobs, exec), Vec::new());
    };
    let mut stopped = mps.stop_phase(backend, plans);
    let reports = execute(backend, jobs, exec);
    let failed: Vec<u32> = reports.iter().filter(|r| matches!(r.outcome, Outcome::Failed(_))).map(|r| r.gpu).collect();
    let started = mps.start_phase(backend, plans, &failed, &mut stopped);
    (reports, started)
}

/// Like [`run`], calling `before_execute` with the planned jobs just before anything changes (the
/// place for mig-parted's `pre-apply-mode` / `pre-apply-config` hooks); its error aborts the pass.
pub fn run_with(
    backend: &dyn GpuBackend,
    config: &MigConfig,
    opts: Options,
    mps: Option<&Mps>,
    allocations: Option<&dyn AllocationSource>,
    before_execute: &mut dyn FnMut(&[Job]) -> Result<(), String>,
) -> Result<Pass, PassError> {
    let Planned { jobs, mps_plans, .. } =
        plan_settled(backend, config, opts, mps, allocations, &mut |_| {}, &mut |_| {})?;
    before_execute(&jobs).map_err(PassError::Hook)?;
    let (reports, mps_reports) = execute_node(backend, &jobs, mps.map(|m| (m, mps_plans.as_slice())), opts.exec);
    Ok(Pass { jobs, reports, mps_plans, mps: mps_reports })
}
