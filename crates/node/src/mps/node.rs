//! MPS on a whole node: what each GPU's daemon should do for a planned layout change (pure
//! decision in [`decide`]), and the two execution phases around the MIG changes: daemons that must
//! go are stopped before (a GPU switching to MIG), daemons that must come are started after (a
//! GPU whose MIG mode was just disabled).

use super::control::{DaemonPaths, MpsControl};
use super::daemon::{self, DaemonStatus};
use super::settings::{is_volta_or_newer, MpsSettings};
use crate::backend::GpuBackend;
use crate::observed::ComputeMode;
use crate::prepare::{Job, Target};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default `--mps-root`.
pub const DEFAULT_ROOT: &str = "/run/gpupart/mps";

/// The node's MPS edge: the control program and where daemons live.
#[derive(Clone)]
pub struct Mps {
    /// Starts daemons and sends them commands.
    pub control: Arc<dyn MpsControl>,
    /// `--mps-root`: `<root>/<gpu-uuid>/{pipe,log,shm}`.
    pub root: PathBuf,
    /// Longest wait for a daemon to write its pid file or to quit.
    pub wait: Duration,
    /// Size of the tmpfs mounted as each GPU's shm directory (`None`: a plain directory).
    pub shm_bytes: Option<u64>,
}

/// What the layout wants of one GPU's daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The GPU is not selected: its daemon, if any, is left as it is.
    Leave,
    /// No daemon (MIG, or MIG disabled without an `mps` block).
    Off,
    /// A daemon with these settings.
    Serve(MpsSettings),
}

/// What will be done to one GPU's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing (no daemon wanted or left alone).
    None,
    /// The running daemon already serves the settings (adopted as it is).
    Keep,
    /// The running daemon serves the limits; only the recorded slot count changes.
    Record,
    /// Start a daemon.
    Start,
    /// Stop the daemon and start it again with other settings (the reason says why).
    Restart(String),
    /// Stop the daemon.
    Stop,
}

impl Action {
    /// Whether the action changes anything.
    pub fn changes(&self) -> bool {
        !matches!(self, Action::None | Action::Keep)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::None => f.write_str("none"),
            Action::Keep => f.write_str("keep the running daemon"),
            Action::Record => f.write_str("keep the running daemon, record the new slot count"),
            Action::Start => f.write_str("start the daemon"),
            Action::Restart(why) => write!(f, "restart the daemon ({why})"),
            Action::Stop => f.write_str("stop the daemon"),
        }
    }
}

/// One GPU's MPS plan.
#[derive(Debug, Clone)]
pub struct GpuMps {
    /// GPU index.
    pub gpu: u32,
    /// Model, for messages.
    pub model: String,
    /// Where its daemon lives.
    pub paths: DaemonPaths,
    /// What the layout wants.
    pub want: Want,
    /// The daemon as read when planning.
    pub status: DaemonStatus,
    /// The compute mode when planning.
    pub compute_mode: ComputeMode,
    /// What will be done.
    pub action: Action,
}

/// What became of one GPU's MPS action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsReport {
    /// GPU index.
    pub gpu: u32,
    /// The action.
    pub action: Action,
    /// Control commands and NVML calls made, in order.
    pub commands: Vec<String>,
    /// The daemon's pid afterwards.
    pub pid: Option<u32>,
    /// Why it failed.
    pub error: Option<String>,
}

/// What a job's target asks of the GPU's daemon.
pub fn want(job: &Job) -> Want {
    match &job.target {
        Target::Leave { .. } => Want::Leave,
        Target::MigDisabled { mps: Some(s) } => Want::Serve(*s),
        Target::MigDisabled { mps: None } | Target::MigEnabled { .. } => Want::Off,
    }
}

/// Decides one GPU (pure). A daemon with connected clients is not stopped or restarted unless
/// `force`; the error names its clients.
pub fn decide(want: Want, st: &DaemonStatus, pods: &[crate::observed::PodUse], force: bool) -> Result<Action, String> {
    let busy = |what: &str| -> Result<Action, String> {
        if (st.clients.is_empty() && pods.is_empty()) || force {
            return Ok(if what == "stop" { Action::Stop } else { Action::Restart(what.to_string()) });
        }
        let mut users = Vec::new();
        if !st.clients.is_empty() {
            let pids: Vec<String> = st.clients.iter().map(ToString::to_string).collect();
            users.push(format!("connected clients (pids {})", pids.join(", ")));
        }
        if !pods.is_empty() {
            let names: Vec<String> = pods.iter().map(ToString::to_string).collect();
            users.push(format!("slots allocated to pod {}", names.join(", ")));
        }
        Err(format!(
            "the MPS daemon (pid {}) has {}; it is not {} without --force",
            st.pid.unwrap_or_default(),
            users.join(" and "),
            if what == "stop" { "stopped".to_string() } else { format!("restarted ({what})") }
        ))
    };
    match want {
        Want::Leave => Ok(Action::None),
        Want::Off if st.running() => busy("stop"),
        Want::Off if st.settings.is_some() => Ok(Action::Stop),
        Want::Off => Ok(Action::None),
        Want::Serve(_) if !st.running() => Ok(Action::Start),
        Want::Serve(_) if !st.up => Ok(Action::Restart("it does not answer".into())),
        Want::Serve(s) => match daemon::difference(st, &s) {
            Some(diff) => busy(&diff),
            None if st.settings != Some(s) => Ok(Action::Record),
            None => Ok(Action::Keep),
        },
    }
}

impl Mps {
    /// The real control program (or its test double) at `program`, daemons under `root`.
    pub fn program(program: &std::path::Path, root: &std::path::Path, timeout: Duration) -> Self {
        let control = super::ControlProgram { program: program.to_path_buf(), timeout };
        Self { control: Arc::new(control), root: root.to_path_buf(), wait: timeout, shm_bytes: None }
    }

    /// The MPS edge the global options ask for.
    pub fn from_args(g: &crate::backend::GpuOptions) -> Self {
        let mut m = Self::program(&g.mps_control, &g.mps_root, g.mps_timeout);
        m.shm_bytes = super::shm::parse_size(&g.mps_shm_size).unwrap_or(None);
        m
    }

    /// The paths of a GPU's daemon.
    pub fn paths(&self, gpu_uuid: &str) -> DaemonPaths {
        DaemonPaths::new(&self.root, gpu_uuid)
    }

    /// Reads a GPU's daemon.
    pub fn probe(&self, job_state: &crate::observed::GpuState) -> DaemonStatus {
        daemon::probe(self.control.as_ref(), &self.paths(&job_state.info.uuid), is_volta_or_newer(&job_state.info))
    }

    /// A GPU's daemon for reports: `None` when none runs and gpupart configured none there.
    pub fn observe(&self, state: &crate::observed::GpuState) -> Option<DaemonStatus> {
        let paths = self.paths(&state.info.uuid);
        let known = paths.pid_file().exists() || paths.dir.join(daemon::SETTINGS_FILE).exists();
        known.then(|| self.probe(state))
    }

    /// The settings a GPU's running MPS daemon serves, when gpupart started it (it recorded the
    /// slot count): the recorded settings while the daemon's limits match them, else the limits
    /// the daemon reads back. `None` when no such daemon runs there.
    pub fn serving(&self, state: &crate::observed::GpuState) -> Option<MpsSettings> {
        let st = self.observe(state)?;
        let recorded = st.settings?;
        if !st.running() {
            return None;
        }
        if daemon::difference(&st, &recorded).is_none() {
            return Some(recorded);
        }
        let pct = st.active_thread_percentage.as_deref().and_then(|p| p.trim().parse::<f64>().ok());
        let pinned = st.pinned_memory_limit.as_deref().and_then(super::settings::parse_readback);
        Some(MpsSettings {
            replicas: recorded.replicas,
            active_thread_percentage: pct.map(|p| p.round() as u32).or(recorded.active_thread_percentage),
            pinned_memory_limit_mib: pinned.or(recorded.pinned_memory_limit_mib),
        })
    }

    /// Plans every GPU; the problems are the GPUs whose busy daemon is in the way.
    pub fn plan(&self, jobs: &[Job], force: bool) -> Result<Vec<GpuMps>, Vec<String>> {
        let mut out = Vec::new();
        let mut problems = Vec::new();
        for job in jobs {
            let info = &job.state.info;
            let want = want(job);
            let status = if want == Want::Leave { DaemonStatus::default() } else { self.probe(&job.state) };
            match decide(want, &status, &job.state.pods, force) {
                Ok(action) => out.push(GpuMps {
                    gpu: info.index,
                    model: info.model.clone(),
                    paths: self.paths(&info.uuid),
                    want,
                    status,
                    compute_mode: job.state.compute_mode,
                    action,
                }),
                Err(e) => problems.push(format!("GPU {} ({}): {e}", info.index, info.model)),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    /// Stops the daemons that must stop or restart (before any MIG change), restoring compute
    /// mode DEFAULT where no daemon follows.
    pub fn stop_phase(&self, backend: &dyn GpuBackend, plans: &[GpuMps]) -> Vec<MpsReport> {
        let mut out = Vec::new();
        for p in plans {
            let mut r =
                MpsReport { gpu: p.gpu, action: p.action.clone(), commands: Vec::new(), pid: None, error: None };
            match &p.action {
                Action::Stop => {
                    r.commands = daemon::stop(self.control.as_ref(), &p.paths, self.wait);
                    if let Err(e) = backend.set_compute_mode(p.gpu, ComputeMode::Default) {
                        r.error = Some(e.to_string());
                    } else {
                        r.commands.push("nvmlDeviceSetComputeMode DEFAULT".into());
                    }
                    tracing::info!(gpu = p.gpu, "stopped the MPS daemon");
                }
                Action::Restart(why) => {
                    tracing::info!(gpu = p.gpu, reason = %why, "restarting the MPS daemon");
                    if p.status.up {
                        r.commands = daemon::stop(self.control.as_ref(), &p.paths, self.wait);
                    } else {
                        daemon::kill_hung(&p.paths, self.wait);
                        r.commands.push("SIGKILL (hung daemon)".into());
                    }
                }
                _ => continue,
            }
            out.push(r);
        }
        out
    }

    /// Starts the daemons that must start or restart (after the MIG changes), skipping GPUs in
    /// `failed`; kept daemons get their compute mode repaired and their slot count recorded.
    pub fn start_phase(
        &self,
        backend: &dyn GpuBackend,
        plans: &[GpuMps],
        failed: &[u32],
        stopped: &mut Vec<MpsReport>,
    ) -> Vec<MpsReport> {
        let mut out = Vec::new();
        for p in plans {
            let Want::Serve(settings) = p.want else { continue };
            let prior = stopped.iter().position(|r| r.gpu == p.gpu).map(|i| stopped.remove(i));
            let mut r = prior.unwrap_or(MpsReport {
                gpu: p.gpu,
                action: p.action.clone(),
                commands: Vec::new(),
                pid: p.status.pid,
                error: None,
            });
            if failed.contains(&p.gpu) {
                r.error = Some("not started: the GPU's MIG change failed".into());
                out.push(r);
                continue;
            }
            if p.compute_mode != ComputeMode::ExclusiveProcess || matches!(p.action, Action::Start | Action::Restart(_))
            {
                match backend.set_compute_mode(p.gpu, ComputeMode::ExclusiveProcess) {
                    Ok(()) => r.commands.push("nvmlDeviceSetComputeMode EXCLUSIVE_PROCESS".into()),
                    Err(e) => {
                        r.error = Some(e.to_string());
                        out.push(r);
                        continue;
                    }
                }
            }
            match &p.action {
                Action::Start | Action::Restart(_) => {
                    match daemon::start(self.control.as_ref(), &p.paths, &settings, self.wait, self.shm_bytes) {
                        Ok((pid, sent)) => {
                            tracing::info!(gpu = p.gpu, pid, replicas = settings.replicas, "MPS daemon started");
                            r.pid = Some(pid);
                            r.commands.extend(sent);
                        }
                        Err(e) => {
                            // No daemon serves the GPU: give it back its compute mode.
                            daemon::kill_hung(&p.paths, self.wait);
                            if backend.set_compute_mode(p.gpu, ComputeMode::Default).is_ok() {
                                r.commands.push("nvmlDeviceSetComputeMode DEFAULT".into());
                            }
                            r.error = Some(e);
                        }
                    }
                }
                Action::Record => {
                    if let Err(e) = daemon::record_settings(&p.paths, &settings) {
                        r.error = Some(format!("recording the MPS settings: {e}"));
                    }
                }
                _ => {}
            }
            out.push(r);
        }
        out.append(stopped);
        out.sort_by_key(|r| r.gpu);
        out
    }
}

#[cfg(test)]
mod tests;
