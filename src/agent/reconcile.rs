//! One reconcile: desired (layout name + config text) vs. observed (the GPU backend) → plan →
//! apply. Synchronous (NVML is blocking); the loop runs it on a blocking thread. Bad input never
//! touches a GPU; a change that is needed is announced through `on_pending` before it starts.

use super::status::{AgentStatus, Failure, Phase};
use crate::backend::GpuBackend;
use crate::exec::{ExecError, ExecOptions, Outcome};
use crate::kubelet::pod_resources::AllocationSource;
use crate::mps::supervise::Watch;
use crate::mps::{Action, Mps, Want};
use crate::reconfigure::{execute_node, plan_settled, PassError, Planned};
use std::time::Instant;

/// What the agent was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The layout (config name), or `None` when none is requested.
    pub layout: Option<String>,
    /// The config file's text, or why it could not be read.
    pub config: Result<String, String>,
    /// Why no layout is requested (when `layout` is `None`), e.g. a layout file that is missing.
    pub idle_reason: String,
}

/// Settings of a reconcile.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Destroy busy instances when no plan keeps them.
    pub force: bool,
    /// A reboot may be requested when only a reboot can apply a MIG mode.
    pub allow_reboot: bool,
    /// Execution options.
    pub exec: ExecOptions,
}

/// Why GPU clients were not paused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The Kubernetes API did not answer: wait and try the change again (nothing changed).
    #[error("the Kubernetes API does not answer: {0}")]
    Unreachable(String),
    /// The clients did not stop in time, or the API refused the pause.
    #[error("{0}")]
    NotStopped(String),
}

/// GPU clients to stop around a change (NVIDIA GPU Operator operands), restored afterwards.
pub trait Clients: Send + Sync {
    /// Pauses the clients and waits for them to stop; `Err` says why they did not (in time).
    fn pause(&self) -> Result<(), PauseError>;
    /// Restores what `pause` paused. Called after every `pause`, whatever happened.
    fn resume(&self);
}

/// Where MPS slots are advertised (the device plugin): slots of GPUs whose daemon is about to
/// stop or restart are marked unhealthy before it does.
pub trait SlotSink: Send + Sync {
    /// Marks every slot of these GPUs unhealthy.
    fn leaving(&self, gpu_uuids: &[String]);
}

/// The effects a reconcile reaches besides the GPUs: all optional.
#[derive(Default, Clone, Copy)]
pub struct Edges<'a> {
    /// GPU clients to pause around a change.
    pub clients: Option<&'a dyn Clients>,
    /// MPS daemons.
    pub mps: Option<&'a Mps>,
    /// Where MPS slots are advertised.
    pub slots: Option<&'a dyn SlotSink>,
    /// The kubelet's allocations (a second busy signal).
    pub allocations: Option<&'a dyn AllocationSource>,
    /// A mig-parted hooks file run around each change.
    pub hooks: Option<&'a AgentHooks>,
    /// Unhealthy GPUs: left as they are.
    pub fenced: Option<&'a crate::health::HealthBook>,
}

/// Leaves unhealthy GPUs as they are: their changes and MPS daemon changes are dropped. One line
/// per GPU whose change was dropped.
fn leave_unhealthy(
    jobs: &mut [crate::prepare::Job],
    mps_plans: &mut [crate::mps::node::GpuMps],
    book: &crate::health::HealthBook,
) -> Vec<String> {
    let mut left = Vec::new();
    for (gpu, u) in book.unhealthy() {
        let mut dropped = false;
        for j in jobs.iter_mut().filter(|j| j.state.info.index == *gpu && !j.is_noop()) {
            (j.mode_change, j.plan) = (None, None);
            dropped = true;
        }
        for p in mps_plans.iter_mut().filter(|p| p.gpu == *gpu && p.action.changes()) {
            p.action = Action::None;
            dropped = true;
        }
        if dropped {
            left.push(format!("{}, left as it is", crate::gpu_health::describe(*gpu, u)));
        }
    }
    // A faulty MIG device stays as it is and nothing is created over its slices: a change that
    // would do either leaves its GPU as it is.
    for j in jobs.iter_mut().filter(|j| !book.is_unhealthy(j.state.info.index)) {
        let gpu = j.state.info.index;
        let Some(m) = book.mig_faults(gpu).find(|m| touches(j, m.placement)) else { continue };
        (j.mode_change, j.plan) = (None, None);
        for p in mps_plans.iter_mut().filter(|p| p.gpu == gpu) {
            p.action = Action::None;
        }
        left.push(format!("{}, GPU {gpu} left as it is", crate::gpu_health::describe_mig(m)));
    }
    left
}

/// Whether `job` would change the GPU instance at `at` or create one over its slices.
fn touches(job: &crate::prepare::Job, at: crate::mig::Placement) -> bool {
    let Some(plan) = &job.plan else { return job.mode_change.is_some() };
    job.mode_change.is_some()
        || plan.destroy.iter().any(|d| d.placement == at)
        || plan.reshape.iter().any(|r| r.placement == at)
        || plan.create.iter().any(|c| c.placement.overlaps(at))
}

/// The agent's hooks file and the `MIG_PARTED_*` settings its commands see.
#[derive(Debug, Clone)]
pub struct AgentHooks {
    /// The parsed file.
    pub hooks: crate::hooks::Hooks,
    /// Its path (`MIG_PARTED_HOOKS_FILE`).
    pub file: String,
    /// The config's path or ConfigMap (`MIG_PARTED_CONFIG_FILE`).
    pub config: String,
    /// `-d` (`MIG_PARTED_DEBUG`; hooks' output shown).
    pub debug: bool,
}

impl AgentHooks {
    /// The environment of the hooks for a change to layout `name`, as `apply` gives it.
    fn settings(&self, name: &str) -> Vec<(String, String)> {
        crate::hooks::apply_env(&self.config, name, &self.file, false, false, self.debug)
    }

    /// Runs the hooks due before a change of `jobs`: apply-start, then those `apply` runs.
    fn before(&self, name: &str, jobs: &[crate::prepare::Job]) -> Result<(), crate::hooks::HookError> {
        let settings = self.settings(name);
        self.hooks.run("apply-start", &settings, self.debug)?;
        self.hooks.before_change(jobs, &settings, self.debug)
    }

    /// Runs apply-exit (after apply-start ran, whatever happened since).
    fn exit(&self, name: &str) -> Result<(), crate::hooks::HookError> {
        self.hooks.run("apply-exit", &self.settings(name), self.debug)
    }
}

/// GPU instances kept, destroyed and created over every plan.
fn counts(jobs: &[crate::prepare::Job]) -> (usize, usize, usize) {
    jobs.iter()
        .filter_map(|j| j.plan.as_ref())
        .fold((0, 0, 0), |(k, d, c), p| (k + p.keep.len() + p.reshape.len(), d + p.destroy.len(), c + p.create.len()))
}

/// The `pending` status announcing a planned change.
fn pending_status(layout: &Option<String>, name: &str, planned: &Planned) -> AgentStatus {
    let (kept, destroyed, created) = counts(&planned.jobs);
    let count = |f: fn(&Action) -> bool| planned.mps_plans.iter().filter(|p| f(&p.action)).count();
    let (starts, restarts, stops) = (
        count(|a| matches!(a, Action::Start)),
        count(|a| matches!(a, Action::Restart(_))),
        count(|a| matches!(a, Action::Stop)),
    );
    let mps_part = if starts + restarts + stops > 0 {
        format!("; start {starts}, restart {restarts}, stop {stops} MPS daemons")
    } else {
        String::new()
    };
    let mut st = AgentStatus::new(
        Phase::Pending,
        layout.clone(),
        format!("applying '{name}': keep {kept}, destroy {destroyed}, create {created} GPU instances{mps_part}"),
    );
    (st.kept, st.destroyed, st.created) = (kept, destroyed, created);
    st
}

/// How a reconcile ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The status to publish.
    pub status: AgentStatus,
    /// Whether retrying the same input may succeed (busy GPU, NVML error) as opposed to bad input.
    pub retry: bool,
    /// The GPUs that serve MPS after this reconcile (`None` when it ended before planning).
    pub serving: Option<Vec<Watch>>,
}

fn failed(layout: &Option<String>, kind: Failure, reason: String, retry: bool) -> Reconciled {
    Reconciled { status: AgentStatus::failed(layout.clone(), kind, reason), retry, serving: None }
}

/// Runs one reconcile.
pub fn reconcile(
    backend: &dyn GpuBackend,
    desired: &Desired,
    s: Settings,
    edges: &Edges<'_>,
    on_pending: &mut dyn FnMut(&AgentStatus),
) -> Reconciled {
    let Some(name) = &desired.layout else {
        return Reconciled {
            status: AgentStatus::new(Phase::Idle, None, desired.idle_reason.clone()),
            retry: false,
            serving: None,
        };
    };
    let layout = &desired.layout;
    let text = match &desired.config {
        Ok(t) => t,
        Err(e) => return failed(layout, Failure::Config, format!("cannot read the config file: {e}"), false),
    };
    let file = match crate::config::parse(text) {
        Ok(f) => f,
        Err(e) => return failed(layout, Failure::Config, format!("invalid config file: {e}"), false),
    };
    let Some(config) = file.get(name) else {
        return failed(
            layout,
            Failure::Config,
            format!("unknown layout '{name}'; the config file has: {}", file.names().join(", ")),
            false,
        );
    };
    // Plans, announces the change, and reads the kubelet's allocations again right before it:
    // a pod admitted since planning must not lose its device (then it plans again).
    let opts = crate::reconfigure::Options { force: s.force, mode_only: false, exec: s.exec };
    // Unhealthy GPUs are left as they are before the change is announced.
    let mut left = Vec::new();
    let mut adjust = |p: &mut Planned| {
        left = edges.fenced.map(|b| leave_unhealthy(&mut p.jobs, &mut p.mps_plans, b)).unwrap_or_default();
    };
    let planned = plan_settled(backend, config, opts, edges.mps, edges.allocations, &mut adjust, &mut |p| {
        on_pending(&pending_status(layout, name, p))
    });
    let Planned { jobs, mps_plans, .. } = match planned {
        Ok(p) => p,
        Err(PassError::Observe(e)) => return failed(layout, Failure::Gpu, format!("reading the GPUs: {e}"), true),
        Err(PassError::Prepare(e)) => {
            let kind = if e.blocked { Failure::Busy } else { Failure::Config };
            return failed(layout, kind, e.problems.join("; "), e.blocked);
        }
        Err(e) => return failed(layout, Failure::Gpu, e.to_string(), true),
    };
    let serving: Vec<Watch> = jobs
        .iter()
        .filter_map(|j| match crate::mps::node::want(j) {
            Want::Serve(settings) => Some(Watch {
                gpu: j.state.info.index,
                uuid: j.state.info.uuid.clone(),
                model: j.state.info.model.clone(),
                settings,
                limits: crate::mps::settings::is_volta_or_newer(&j.state.info),
            }),
            _ => None,
        })
        .collect();
    let (kept, destroyed, created) = counts(&jobs);
    let with_counts = |mut st: AgentStatus, ms: u64| {
        (st.kept, st.destroyed, st.created, st.duration_ms) = (kept, destroyed, created, ms);
        for l in &left {
            st.reason = format!("{}; {l}", st.reason);
        }
        st
    };
    let done = |status: AgentStatus, retry: bool| Reconciled { status, retry, serving: Some(serving.clone()) };
    if jobs.iter().all(|j| j.is_noop()) && mps_plans.iter().all(|p| !p.action.changes()) {
        let st = AgentStatus::new(Phase::Success, layout.clone(), format!("layout '{name}' is applied"));
        return done(with_counts(st, 0), false);
    }
    let leaving: Vec<String> = mps_plans
        .iter()
        .filter(|p| matches!(p.action, Action::Stop | Action::Restart(_)))
        .map(|p| p.paths.gpu_uuid.clone())
        .collect();
    if let (Some(sink), false) = (edges.slots, leaving.is_empty()) {
        sink.leaving(&leaving);
    }
    let start = Instant::now();
    if let Some(h) = edges.hooks {
        if let Err(e) = h.before(name, &jobs) {
            let exit = h.exit(name).err().map(|x| format!("; then {x}")).unwrap_or_default();
            return failed(layout, Failure::Hook, format!("{e}{exit}; nothing was changed"), true);
        }
    }
    if let Some(c) = edges.clients {
        match c.pause() {
            Ok(()) => {}
            // An API outage is not a failed change: the GPUs are untouched and the change waits.
            Err(PauseError::Unreachable(why)) => {
                c.resume();
                if let Some(h) = edges.hooks {
                    let _ = h.exit(name);
                }
                let reason = format!("waiting for the Kubernetes API to pause GPU clients, nothing changed yet: {why}");
                return Reconciled {
                    status: AgentStatus::new(Phase::Pending, layout.clone(), reason),
                    retry: true,
                    serving: None,
                };
            }
            Err(PauseError::NotStopped(why)) => {
                c.resume();
                if let Some(h) = edges.hooks {
                    let _ = h.exit(name);
                }
                return failed(
                    layout,
                    Failure::Clients,
                    format!("GPU clients did not stop, nothing was changed: {why}"),
                    true,
                );
            }
        }
    }
    let (reports, mps_reports) = execute_node(backend, &jobs, edges.mps.map(|m| (m, mps_plans.as_slice())), s.exec);
    if let Some(c) = edges.clients {
        c.resume();
    }
    let exit_failed = edges.hooks.and_then(|h| h.exit(name).err());
    let ms = start.elapsed().as_millis() as u64;
    let errors: Vec<&ExecError> = reports
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Failed(e) => Some(e),
            _ => None,
        })
        .collect();
    let mps_errors: Vec<String> = mps_reports
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("GPU {}: MPS daemon: {e}", r.gpu)))
        .collect();
    if errors.is_empty() && mps_errors.is_empty() {
        if let Some(e) = exit_failed {
            let st = AgentStatus::failed(layout.clone(), Failure::Hook, format!("applied '{name}', then {e}"));
            return done(with_counts(st, ms), true);
        }
        let st = AgentStatus::new(Phase::Success, layout.clone(), format!("applied '{name}' in {ms} ms"));
        return done(with_counts(st, ms), false);
    }
    let reason =
        errors.iter().map(ToString::to_string).chain(mps_errors.iter().cloned()).collect::<Vec<_>>().join("; ");
    if errors.iter().any(|e| matches!(e, ExecError::RebootRequired { .. })) {
        if s.allow_reboot {
            let st = AgentStatus::new(Phase::Rebooting, layout.clone(), reason);
            return done(with_counts(st, ms), false);
        }
        return done(with_counts(AgentStatus::failed(layout.clone(), Failure::Reboot, reason), ms), false);
    }
    let kind = if errors.is_empty() { Failure::Mps } else { Failure::Gpu };
    done(with_counts(AgentStatus::failed(layout.clone(), kind, reason), ms), true)
}
