//! Runs planned jobs through a backend: MIG mode first (with a per-GPU reset only where the
//! mode stays pending and the GPU is idle), then destroy CIs and GIs, then create GIs at their
//! placements and their CIs, then re-read the GPU and verify it. GPUs run concurrently, bounded
//! by `parallel`; the steps on one GPU stay in order. A failure stops that GPU only, after undoing
//! the GPU instance it was creating, and the report lists exactly what was changed.

use crate::backend::{BackendError, GpuBackend, ModeActivation};
use crate::layout::DesiredDevices;
use crate::mig::Placement;
use crate::prepare::{Job, Target};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One change made to a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// MIG mode requested.
    SetMigMode(bool),
    /// The GPU was reset to apply a pending MIG mode.
    Reset,
    /// A compute instance was destroyed.
    DestroyCi {
        /// GI id.
        gi: u32,
        /// CI id.
        ci: u32,
    },
    /// A GPU instance was destroyed.
    DestroyGi {
        /// GI id.
        gi: u32,
        /// Profile name.
        name: String,
        /// Placement.
        placement: Placement,
    },
    /// A GPU instance was created.
    CreateGi {
        /// GI id.
        gi: u32,
        /// Profile name.
        name: String,
        /// Placement.
        placement: Placement,
    },
    /// A compute instance was created.
    CreateCi {
        /// GI id.
        gi: u32,
        /// CI id.
        ci: u32,
        /// MIG device name.
        name: String,
    },
    /// A GPU instance created in the failed step was destroyed again.
    RolledBack {
        /// GI id.
        gi: u32,
        /// Profile name.
        name: String,
        /// Placement.
        placement: Placement,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::SetMigMode(on) => write!(f, "set MIG mode {}", if *on { "enabled" } else { "disabled" }),
            Step::Reset => write!(f, "reset the GPU"),
            Step::DestroyCi { gi, ci } => {
                write!(f, "destroyed compute instance {ci} of GPU instance {gi}")
            }
            Step::DestroyGi { gi, name, placement } => {
                write!(f, "destroyed {name}@{} (GPU instance {gi})", placement.start)
            }
            Step::CreateGi { gi, name, placement } => {
                write!(f, "created {name}@{} (GPU instance {gi})", placement.start)
            }
            Step::CreateCi { gi, ci, name } => write!(f, "created {name} (compute instance {ci} of GPU instance {gi})"),
            Step::RolledBack { gi, name, placement } => {
                write!(f, "rolled back {name}@{} (GPU instance {gi})", placement.start)
            }
        }
    }
}

/// Why a GPU's job failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// A backend call failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The MIG mode is pending and the GPU cannot be reset now.
    #[error("reset required: MIG mode {mode} is pending until GPU {gpu} is reset, and {reason}")]
    ResetRequired {
        /// GPU index.
        gpu: u32,
        /// `enabled` or `disabled`.
        mode: &'static str,
        /// Why the reset was not done.
        reason: String,
    },
    /// The platform exposes no GPU reset (pass-through): only a reboot applies the mode.
    #[error("reboot required: MIG mode {mode} on GPU {gpu} can only be applied by rebooting the node")]
    RebootRequired {
        /// GPU index.
        gpu: u32,
        /// `enabled` or `disabled`.
        mode: &'static str,
    },
    /// The driver refused the mode change because the GPU is in use.
    #[error("GPU {gpu}: MIG mode change refused, the GPU is in use ({detail})")]
    ModeInUse {
        /// GPU index.
        gpu: u32,
        /// Processes or instances in the way.
        detail: String,
    },
    /// Stopped on request before (or part-way through) this GPU's plan.
    #[error("GPU {gpu}: interrupted {}", if *started { "part-way: the changes listed were made, the rest of its plan was not" } else { "before its changes began: nothing was changed" })]
    Interrupted {
        /// GPU index.
        gpu: u32,
        /// Whether some of its changes were made.
        started: bool,
    },
    /// The GPU does not match the plan after applying it.
    #[error("GPU {gpu}: verification failed: {detail}")]
    Verify {
        /// GPU index.
        gpu: u32,
        /// The difference.
        detail: String,
    },
}

/// How one GPU's job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing needed doing.
    Unchanged,
    /// Changes were made and verified.
    Applied,
    /// Dry run: nothing was done.
    DryRun,
    /// Failed; `steps` lists what was changed before.
    Failed(ExecError),
}

/// The result for one GPU.
#[derive(Debug, Clone)]
pub struct GpuReport {
    /// GPU index.
    pub gpu: u32,
    /// Changes made, in order.
    pub steps: Vec<Step>,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall time spent on this GPU.
    pub elapsed: Duration,
}

/// Options for [`execute`].
#[derive(Debug, Clone, Copy)]
pub struct ExecOptions {
    /// Plan only.
    pub dry_run: bool,
    /// GPUs changed at once.
    pub parallel: usize,
    /// Never reset GPUs; a pending mode is then reported as "reset required".
    pub skip_reset: bool,
    /// Set (by a signal) to stop: the change under way finishes (a GPU instance with its compute
    /// instances is one change), no further one starts, and GPUs not begun are left alone.
    pub stop: Option<&'static AtomicBool>,
}

/// Runs all jobs, up to `parallel` GPUs at a time; reports come back in job order.
pub fn execute(backend: &dyn GpuBackend, jobs: &[Job], opts: ExecOptions) -> Vec<GpuReport> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<GpuReport>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let workers = opts.parallel.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(job) = jobs.get(i) else { break };
                let gpu = job.state.info.index;
                let span = tracing::info_span!("gpu", index = gpu);
                let report = span.in_scope(|| {
                    let report = if opts.stop.is_some_and(|s| s.load(Ordering::SeqCst)) && !job.is_noop() {
                        let outcome = Outcome::Failed(ExecError::Interrupted { gpu, started: false });
                        GpuReport { gpu, steps: Vec::new(), outcome, elapsed: Duration::ZERO }
                    } else {
                        run_job(backend, job, opts)
                    };
                    // Progress: each GPU's end, with how many of the node's are done.
                    let finished = done.fetch_add(1, Ordering::SeqCst) + 1;
                    let (changes, of) = (report.steps.len(), jobs.len());
                    match &report.outcome {
                        Outcome::Failed(e @ ExecError::Interrupted { .. }) => {
                            tracing::warn!(error = %e, changes, finished, of, "stopped")
                        }
                        Outcome::Failed(e) => tracing::error!(error = %e, changes, finished, of, "failed"),
                        Outcome::Applied => {
                            let ms = report.elapsed.as_millis() as u64;
                            tracing::info!(changes, ms, finished, of, "done");
                        }
                        _ => {}
                    }
                    report
                });
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
            });
        }
    });
    slots
        .into_iter()
        .zip(jobs)
        .map(|(slot, job)| {
            slot.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(|| GpuReport {
                gpu: job.state.info.index,
                steps: Vec::new(),
                outcome: Outcome::Failed(ExecError::Verify {
                    gpu: job.state.info.index,
                    detail: "worker ended without a report".into(),
                }),
                elapsed: Duration::ZERO,
            })
        })
        .collect()
}

struct Run<'a> {
    backend: &'a dyn GpuBackend,
    gpu: u32,
    steps: Vec<Step>,
    skip_reset: bool,
    stop: Option<&'static AtomicBool>,
}

fn run_job(backend: &dyn GpuBackend, job: &Job, opts: ExecOptions) -> GpuReport {
    let start = Instant::now();
    let gpu = job.state.info.index;
    let outcome = if job.is_noop() {
        Outcome::Unchanged
    } else if opts.dry_run {
        Outcome::DryRun
    } else {
        tracing::info!(model = %job.state.info.model, "reconfiguring");
        let mut run = Run { backend, gpu, steps: Vec::new(), skip_reset: opts.skip_reset, stop: opts.stop };
        let result = run.apply(job);
        let steps = std::mem::take(&mut run.steps);
        return GpuReport {
            gpu,
            steps,
            outcome: match result {
                Ok(()) => Outcome::Applied,
                Err(e) => Outcome::Failed(e),
            },
            elapsed: start.elapsed(),
        };
    };
    GpuReport { gpu, steps: Vec::new(), outcome, elapsed: start.elapsed() }
}

impl Run<'_> {
    /// Stops before the next change when a stop was requested.
    fn check(&self) -> Result<(), ExecError> {
        match self.stop {
            Some(s) if s.load(Ordering::SeqCst) => {
                Err(ExecError::Interrupted { gpu: self.gpu, started: !self.steps.is_empty() })
            }
            _ => Ok(()),
        }
    }

    fn apply(&mut self, job: &Job) -> Result<(), ExecError> {
        self.check()?;
        if job.mode_change == Some(true) {
            self.set_mode(true)?;
        }
        if let Some(plan) = &job.plan {
            for d in &plan.destroy {
                self.check()?;
                for &ci in &d.ci_ids {
                    self.backend.destroy_compute_instance(self.gpu, d.gi_id, ci)?;
                    self.steps.push(Step::DestroyCi { gi: d.gi_id, ci });
                }
                self.backend.destroy_gpu_instance(self.gpu, d.gi_id)?;
                tracing::debug!(gi = d.gi_id, profile = %d.name, start = d.placement.start, "destroyed GPU instance");
                self.steps.push(Step::DestroyGi { gi: d.gi_id, name: d.name.clone(), placement: d.placement });
            }
            for r in &plan.reshape {
                self.check()?;
                for &ci in &r.ci_ids {
                    self.backend.destroy_compute_instance(self.gpu, r.gi_id, ci)?;
                    self.steps.push(Step::DestroyCi { gi: r.gi_id, ci });
                }
                for ((ci_profile, placement), name) in r.cis.iter().zip(&r.device_names) {
                    let ci = self.backend.create_compute_instance(self.gpu, r.gi_id, *ci_profile, *placement)?;
                    self.steps.push(Step::CreateCi { gi: r.gi_id, ci, name: name.clone() });
                }
                tracing::debug!(gi = r.gi_id, profile = %r.name, start = r.placement.start, cis = ?r.device_names, "redid the compute instances of a kept GPU instance");
            }
            for c in &plan.create {
                self.check()?;
                self.create(c)?;
            }
        }
        if job.mode_change == Some(false) {
            self.check()?;
            self.set_mode(false)?;
        }
        self.verify(job)
    }

    fn set_mode(&mut self, enabled: bool) -> Result<(), ExecError> {
        switch_mig_mode(self.backend, self.gpu, enabled, self.skip_reset, &mut self.steps)
    }

    fn create(&mut self, c: &crate::plan::CreateGi) -> Result<(), ExecError> {
        let gi = self.backend.create_gpu_instance(self.gpu, c.profile_id, c.placement)?;
        tracing::debug!(gi, profile = %c.name, start = c.placement.start, "created GPU instance");
        self.steps.push(Step::CreateGi { gi, name: c.name.clone(), placement: c.placement });
        let mut made = Vec::new();
        for ((ci_profile, placement), name) in c.cis.iter().zip(&c.device_names) {
            match self.backend.create_compute_instance(self.gpu, gi, *ci_profile, *placement) {
                Ok(ci) => {
                    made.push(ci);
                    self.steps.push(Step::CreateCi { gi, ci, name: name.clone() });
                }
                Err(e) => {
                    self.roll_back(gi, &made, c);
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Undoes a half-created GPU instance; failures are logged, the original error is kept.
    fn roll_back(&mut self, gi: u32, cis: &[u32], c: &crate::plan::CreateGi) {
        for &ci in cis.iter().rev() {
            match self.backend.destroy_compute_instance(self.gpu, gi, ci) {
                Ok(()) => self.steps.push(Step::DestroyCi { gi, ci }),
                Err(e) => tracing::error!(error = %e, gi, ci, "rollback failed"),
            }
        }
        match self.backend.destroy_gpu_instance(self.gpu, gi) {
            Ok(()) => self.steps.push(Step::RolledBack { gi, name: c.name.clone(), placement: c.placement }),
            Err(e) => tracing::error!(error = %e, gi, "rollback failed"),
        }
    }

    fn verify(&self, job: &Job) -> Result<(), ExecError> {
        let state = self.backend.observe(self.gpu)?;
        let fail = |detail: String| Err(ExecError::Verify { gpu: self.gpu, detail });
        let (want_mode, want_devices) = match &job.target {
            Target::Leave { .. } => return Ok(()),
            Target::MigDisabled { .. } => (false, DesiredDevices::default()),
            Target::MigEnabled { devices } => (true, devices.clone()),
        };
        if state.info.mig_capable && state.mig_mode.current != want_mode {
            return fail(format!(
                "MIG mode is {} after applying",
                if state.mig_mode.current { "enabled" } else { "disabled" }
            ));
        }
        if job.plan.is_none() {
            return Ok(());
        }
        let have = DesiredDevices::from_keys(
            state.instances.iter().flat_map(|g| g.cis.iter().map(|c| (g.profile_id, c.profile_id))),
        );
        if have != want_devices {
            return fail(format!(
                "has {}, expected {}",
                have.describe(&state.profiles),
                want_devices.describe(&state.profiles)
            ));
        }
        for c in job.plan.iter().flat_map(|p| &p.create) {
            if !state.instances.iter().any(|g| g.profile_id == c.profile_id && g.placement == c.placement) {
                return fail(format!("{}@{} is missing", c.name, c.placement.start));
            }
        }
        if state.instances.iter().any(|g| g.cis.is_empty()) {
            return fail("a GPU instance without compute instances is present".into());
        }
        Ok(())
    }
}

/// Switches a GPU's MIG mode, resetting the GPU where the model needs it (only when no process
/// runs on it, and not with `skip_reset`); the calls made are appended to `steps`.
pub fn switch_mig_mode(
    backend: &dyn GpuBackend,
    gpu: u32,
    enabled: bool,
    skip_reset: bool,
    steps: &mut Vec<Step>,
) -> Result<(), ExecError> {
    let mode = if enabled { "enabled" } else { "disabled" };
    let activation = backend.set_mig_mode(gpu, enabled)?;
    steps.push(Step::SetMigMode(enabled));
    tracing::debug!(mode, ?activation, "MIG mode requested");
    match activation {
        ModeActivation::Done => Ok(()),
        ModeActivation::InUse => {
            let state = backend.observe(gpu)?;
            let pids: Vec<String> = state.all_processes().map(|p| p.pid.to_string()).collect();
            Err(ExecError::ModeInUse {
                gpu,
                detail: if pids.is_empty() {
                    "the driver reports the device busy".into()
                } else {
                    format!("pids {}", pids.join(", "))
                },
            })
        }
        ModeActivation::RebootRequired => Err(ExecError::RebootRequired { gpu, mode }),
        ModeActivation::PendingReset => {
            if skip_reset {
                return Err(ExecError::ResetRequired { gpu, mode, reason: "--skip-reset was given".into() });
            }
            let state = backend.observe(gpu)?;
            let pids: Vec<String> = state.all_processes().map(|p| p.pid.to_string()).collect();
            if !pids.is_empty() {
                return Err(ExecError::ResetRequired {
                    gpu,
                    mode,
                    reason: format!("it has running processes (pids {})", pids.join(", ")),
                });
            }
            backend.reset_gpu(gpu)?;
            steps.push(Step::Reset);
            tracing::debug!("GPU reset");
            let after = backend.observe(gpu)?;
            if after.mig_mode.current != enabled {
                return Err(ExecError::ResetRequired { gpu, mode, reason: "the reset did not apply it".into() });
            }
            Ok(())
        }
    }
}
