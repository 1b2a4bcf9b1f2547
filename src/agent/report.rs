//! Where the agent publishes its state: a small trait with a status-file implementation (bare
//! metal), logs, and systemd notifications. The Kubernetes reporter implements the same trait.

use super::status::{AgentStatus, Phase};
use std::path::PathBuf;

/// An event about something other than a reconfiguration (an MPS daemon restarted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// CamelCase reason (`MpsDaemonRestarted`).
    pub reason: &'static str,
    /// One line for people.
    pub note: String,
}

/// Publishes agent state; called from the reconcile thread, so implementations must not block long.
pub trait Reporter: Send + Sync {
    /// Publishes a new status.
    fn publish(&self, status: &AgentStatus);
    /// Publishes a status together with a notice that replaces the transition's own Event.
    fn publish_notice(&self, status: &AgentStatus, notice: &Notice) {
        let _ = notice;
        self.publish(status);
    }
}

/// Writes the status as JSON to a file, atomically (temporary file + rename).
pub struct StatusFile {
    /// Target path.
    pub path: PathBuf,
    /// The GPUs are the simulator's (`"simulated": true` in the file).
    pub simulated: bool,
}

impl Reporter for StatusFile {
    fn publish(&self, status: &AgentStatus) {
        let write = || -> std::io::Result<()> {
            let status = AgentStatus { simulated: self.simulated, ..status.clone() };
            let mut text = serde_json::to_string_pretty(&status).map_err(std::io::Error::other)?;
            text.push('\n');
            crate::fsutil::write_atomic(&self.path, text.as_bytes())
        };
        if let Err(e) = write() {
            tracing::error!(path = %self.path.display(), error = %e, "cannot write the status file");
        }
    }
}

/// Logs every status, and tells systemd (READY after the first result, STATUS always).
pub struct LogAndNotify;

impl Reporter for LogAndNotify {
    fn publish_notice(&self, status: &AgentStatus, n: &Notice) {
        match n.type_ {
            "Warning" => tracing::warn!(reason = n.reason, note = %n.note, "event"),
            _ => tracing::info!(reason = n.reason, note = %n.note, "event"),
        }
        self.publish(status);
    }

    fn publish(&self, s: &AgentStatus) {
        let layout = s.layout.as_deref().unwrap_or("-");
        match s.state {
            Phase::Failed => tracing::error!(state = s.state.as_str(), layout, reason = %s.reason, "reconcile failed"),
            _ => tracing::info!(state = s.state.as_str(), layout, reason = %s.reason, "state"),
        }
        let ready = if s.state == Phase::Pending { "" } else { "READY=1\n" };
        super::notify::notify(&format!("{ready}STATUS={}: {}", s.state.as_str(), s.reason));
    }
}

/// Publishes to several reporters in order.
pub struct Fanout(pub Vec<Box<dyn Reporter>>);

impl Reporter for Fanout {
    fn publish(&self, status: &AgentStatus) {
        for r in &self.0 {
            r.publish(status);
        }
    }

    fn publish_notice(&self, status: &AgentStatus, notice: &Notice) {
        for r in &self.0 {
            r.publish_notice(status, notice);
        }
    }
}
