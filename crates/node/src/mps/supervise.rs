//! Keeps the daemons the layout wants alive between reconciles: a health round trip per daemon
//! on every check; a daemon that died or stopped answering is restarted with its settings, with
//! per-GPU exponential backoff when the restart fails. The agent reports every restart.

use super::control::DaemonPaths;
use super::daemon::{self, DaemonStatus};
use super::node::Mps;
use super::settings::MpsSettings;
use crate::backend::GpuBackend;
use crate::observed::ComputeMode;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// First retry delay after a failed restart; doubles up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// Longest delay between restart attempts of one daemon.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A daemon to keep alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    /// GPU index.
    pub gpu: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Model, for messages.
    pub model: String,
    /// Its settings.
    pub settings: MpsSettings,
    /// Whether the GPU takes MPS limits (Volta and later).
    pub limits: bool,
}

#[derive(Debug)]
struct Watched {
    watch: Watch,
    failures: u32,
    next_attempt: Option<Instant>,
    last: DaemonStatus,
    probed: bool,
}

/// What one check did about one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// GPU index.
    pub gpu: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Model.
    pub model: String,
    /// What was wrong (`it died`, `it does not answer: …`).
    pub why: String,
    /// The new pid, or why the restart failed.
    pub result: Result<u32, String>,
    /// From noticing to the daemon answering with its limits set.
    pub took: Duration,
    /// Consecutive failed restarts (0 after a success).
    pub failures: u32,
}

/// The daemons under watch.
#[derive(Debug, Default)]
pub struct Supervisor {
    watched: BTreeMap<String, Watched>,
}

impl Supervisor {
    /// Replaces the set of daemons to keep alive (after each reconcile); backoff state of a GPU
    /// whose settings did not change is kept.
    pub fn watch(&mut self, daemons: Vec<Watch>) {
        let mut next = BTreeMap::new();
        for w in daemons {
            let entry = match self.watched.remove(&w.uuid) {
                Some(old) if old.watch == w => old,
                _ => Watched {
                    watch: w.clone(),
                    failures: 0,
                    next_attempt: None,
                    last: DaemonStatus::default(),
                    probed: false,
                },
            };
            next.insert(w.uuid, entry);
        }
        self.watched = next;
    }

    /// GPUs under watch.
    pub fn watched(&self) -> impl Iterator<Item = &Watch> {
        self.watched.values().map(|w| &w.watch)
    }

    /// Every daemon under watch and whether it is healthy (answering with its limits; a daemon
    /// not checked yet counts as healthy: the reconcile that configured it just verified it).
    pub fn health(&self) -> Vec<(Watch, bool)> {
        self.watched.values().map(|w| (w.watch.clone(), w.failures == 0 && (!w.probed || w.last.up))).collect()
    }

    /// GPUs whose daemon is down and could not be restarted, with the last error.
    pub fn failing(&self) -> Vec<(u32, String)> {
        self.watched
            .values()
            .filter(|w| w.failures > 0)
            .map(|w| (w.watch.gpu, w.last.error.clone().unwrap_or_else(|| "down".into())))
            .collect()
    }

    /// Checks every daemon once; restarts those that died or hang (when their backoff allows).
    pub fn check(&mut self, mps: &Mps, backend: &dyn GpuBackend, now: Instant) -> Vec<Restart> {
        let mut out = Vec::new();
        for w in self.watched.values_mut() {
            let paths = mps.paths(&w.watch.uuid);
            let mut st = daemon::check(mps.control.as_ref(), &paths, w.watch.limits);
            // A daemon whose limits are not what was configured (a restart that failed half-way)
            // is restarted too: its clients would run without their limits.
            let wrong = if st.up { daemon::difference(&st, &w.watch.settings) } else { None };
            // A daemon that dies while it is read answers oddly: call that what it is.
            if wrong.is_some() {
                st.pid = st.pid.filter(|p| crate::mps::process::alive(*p));
                st.up &= st.pid.is_some();
            }
            let wrong = wrong.filter(|_| st.up);
            let healthy = st.up && wrong.is_none();
            let why = match (&st.pid, st.up, wrong) {
                (_, true, None) => String::new(),
                (_, true, Some(diff)) => format!("its {diff}"),
                (None, _, _) => "it died".to_string(),
                (Some(_), false, _) => format!("it does not answer: {}", st.error.clone().unwrap_or_default()),
            };
            w.last = st;
            w.probed = true;
            if healthy {
                w.failures = 0;
                w.next_attempt = None;
                continue;
            }
            if w.next_attempt.is_some_and(|t| now < t) {
                continue;
            }
            let started = Instant::now();
            tracing::warn!(gpu = w.watch.gpu, reason = %why, "restarting the MPS daemon");
            let result = restart(mps, backend, &paths, &w.watch);
            match &result {
                Ok(_) => {
                    w.failures = 0;
                    w.next_attempt = None;
                }
                Err(e) => {
                    w.failures += 1;
                    let delay = MIN_BACKOFF.saturating_mul(1 << w.failures.min(6)).min(MAX_BACKOFF);
                    w.next_attempt = Some(now + delay);
                    w.last.error = Some(e.clone());
                    tracing::error!(gpu = w.watch.gpu, error = %e, retry_ms = delay.as_millis() as u64, "MPS daemon restart failed");
                }
            }
            out.push(Restart {
                gpu: w.watch.gpu,
                uuid: w.watch.uuid.clone(),
                model: w.watch.model.clone(),
                why,
                result,
                took: started.elapsed(),
                failures: w.failures,
            });
        }
        out
    }
}

fn restart(mps: &Mps, backend: &dyn GpuBackend, paths: &DaemonPaths, w: &Watch) -> Result<u32, String> {
    daemon::kill_hung(paths, mps.wait);
    backend.set_compute_mode(w.gpu, ComputeMode::ExclusiveProcess).map_err(|e| e.to_string())?;
    daemon::start(mps.control.as_ref(), paths, &w.settings, mps.wait, mps.shm_bytes).map(|(pid, _)| pid)
}
