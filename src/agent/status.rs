//! What the agent reports: the state machine's phase and the facts around it. Published to the
//! status file (bare metal) or the node's labels, annotations and Events (Kubernetes).

use serde::Serialize;

/// `nvidia.com/mig.config.state` values, plus `idle` when no layout is requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// No layout requested; nothing to do.
    Idle,
    /// A change is under way.
    Pending,
    /// The node is rebooting to apply a MIG mode.
    Rebooting,
    /// The requested layout is applied.
    Success,
    /// The requested layout could not be applied (see `reason`).
    Failed,
}

impl Phase {
    /// The phase a label value names (`pending`, `success`, …).
    pub fn parse(value: &str) -> Option<Self> {
        [Phase::Idle, Phase::Pending, Phase::Rebooting, Phase::Success, Phase::Failed]
            .into_iter()
            .find(|p| p.as_str() == value)
    }

    /// The label value (`pending`, `success`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Pending => "pending",
            Phase::Rebooting => "rebooting",
            Phase::Success => "success",
            Phase::Failed => "failed",
        }
    }
}

/// What kind of trouble a `failed` state is, for alerts (`gpupart_agent_failures_total{reason}`)
/// and the status file's `failure` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The config file is unreadable or invalid, the layout unknown, or it cannot apply here.
    Config,
    /// Busy instances are in the way (`--force` would destroy them).
    Busy,
    /// NVML (or the simulator) failed.
    Gpu,
    /// The GPU Operator's clients did not stop (or the API could not be asked).
    Clients,
    /// A MIG mode needs a reboot, and rebooting is not allowed or did not help.
    Reboot,
    /// An MPS daemon could not be started, changed or restarted.
    Mps,
    /// A hook of the agent's hooks file failed (nothing was changed when it ran before the change).
    Hook,
}

impl Failure {
    /// Every kind, in documentation order.
    pub const ALL: [Failure; 7] =
        [Failure::Config, Failure::Busy, Failure::Gpu, Failure::Clients, Failure::Reboot, Failure::Mps, Failure::Hook];

    /// The label value (`config`, `busy`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Config => "config",
            Failure::Busy => "busy",
            Failure::Gpu => "gpu",
            Failure::Clients => "clients",
            Failure::Reboot => "reboot",
            Failure::Mps => "mps",
            Failure::Hook => "hook",
        }
    }
}

/// The agent's published state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentStatus {
    /// Phase.
    pub state: Phase,
    /// The layout (config name) being applied, if any.
    pub layout: Option<String>,
    /// One line saying why (for `failed`) or what happened.
    pub reason: String,
    /// GPU instances kept, destroyed and created by the last pass.
    pub kept: usize,
    /// See `kept`.
    pub destroyed: usize,
    /// See `kept`.
    pub created: usize,
    /// Wall time of the last pass in milliseconds.
    pub duration_ms: u64,
    /// Consecutive failed attempts.
    pub attempts: u32,
    /// The kind of failure (only with `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Seconds until the next retry, after a failure.
    pub next_retry_secs: Option<u64>,
    /// Unix time of this status.
    pub updated_unix: u64,
    /// True when the GPUs are the simulator's: nothing real was changed (set by the status file).
    pub simulated: bool,
}

impl AgentStatus {
    /// A `failed` status of this kind.
    pub fn failed(layout: Option<String>, failure: Failure, reason: impl Into<String>) -> Self {
        let mut st = Self::new(Phase::Failed, layout, reason);
        st.failure = Some(failure);
        st
    }

    /// A status with the given phase, layout and reason; counters zero.
    pub fn new(state: Phase, layout: Option<String>, reason: impl Into<String>) -> Self {
        Self {
            state,
            layout,
            reason: reason.into(),
            kept: 0,
            destroyed: 0,
            created: 0,
            duration_ms: 0,
            attempts: 0,
            failure: None,
            next_retry_secs: None,
            updated_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            simulated: false,
        }
    }
}
