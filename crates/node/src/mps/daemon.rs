//! One GPU's MPS control daemon: read its state (health round trip, limits, servers and
//! clients), start it with its limits, stop it. Built on [`MpsControl`]; no policy here.

use super::control::{ControlError, DaemonPaths, MpsControl};
use super::process;
use super::settings::{limit_arg, MpsSettings};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The command whose round trip says the daemon is healthy (as NVIDIA's device plugin does).
pub const HEALTH_COMMAND: &str = "get_default_active_thread_percentage";
/// What gpupart records next to a daemon it started (`<root>/<uuid>/gpupart-mps.json`).
pub const SETTINGS_FILE: &str = "gpupart-mps.json";

/// A daemon as read now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DaemonStatus {
    /// The daemon's pid while that process lives.
    pub pid: Option<u32>,
    /// Whether it answered the health round trip.
    pub up: bool,
    /// `get_default_active_thread_percentage` as printed.
    pub active_thread_percentage: Option<String>,
    /// `get_default_device_pinned_mem_limit <uuid>` as printed.
    pub pinned_memory_limit: Option<String>,
    /// MPS server pids (`get_server_list`).
    pub servers: Vec<u32>,
    /// Client pids of those servers (`get_client_list`).
    pub clients: Vec<u32>,
    /// The settings gpupart started it with, when it did (reported as `replicas` by `status`).
    #[serde(skip)]
    pub settings: Option<MpsSettings>,
    /// Why it is not up, when it is not.
    pub error: Option<String>,
}

impl DaemonStatus {
    /// Whether a daemon process exists (answering or not).
    pub fn running(&self) -> bool {
        self.pid.is_some()
    }
}

/// The settings file's content.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Recorded {
    replicas: u32,
    active_thread_percentage: Option<u32>,
    pinned_memory_limit_mib: Option<u64>,
}

fn read_settings(paths: &DaemonPaths) -> Option<MpsSettings> {
    let text = std::fs::read_to_string(paths.dir.join(SETTINGS_FILE)).ok()?;
    let r: Recorded = serde_json::from_str(&text).ok()?;
    Some(MpsSettings {
        replicas: r.replicas,
        active_thread_percentage: r.active_thread_percentage,
        pinned_memory_limit_mib: r.pinned_memory_limit_mib,
    })
}

/// Records the settings a daemon serves (replicas are not readable from the daemon).
pub fn record_settings(paths: &DaemonPaths, s: &MpsSettings) -> std::io::Result<()> {
    let r = Recorded {
        replicas: s.replicas,
        active_thread_percentage: s.active_thread_percentage,
        pinned_memory_limit_mib: s.pinned_memory_limit_mib,
    };
    let tmp = paths.dir.join(format!("{SETTINGS_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&r).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, paths.dir.join(SETTINGS_FILE))
}

fn pids(text: &str) -> Vec<u32> {
    text.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

/// Reads one daemon: pid, health, limits (`limits`: Volta and later), servers and clients.
pub fn probe(ctl: &dyn MpsControl, paths: &DaemonPaths, limits: bool) -> DaemonStatus {
    let mut st = check(ctl, paths, limits);
    if !st.up {
        return st;
    }
    let result = (|| -> Result<(), ControlError> {
        st.servers = pids(&ctl.send(paths, "get_server_list")?);
        for server in st.servers.clone() {
            st.clients.extend(pids(&ctl.send(paths, &format!("get_client_list {server}"))?));
        }
        Ok(())
    })();
    if let Err(e) = result {
        st.error = Some(e.to_string());
    }
    st
}

/// The health check alone: pid, the health round trip and the limits read back (no server or
/// client lists), what supervision needs every interval.
pub fn check(ctl: &dyn MpsControl, paths: &DaemonPaths, limits: bool) -> DaemonStatus {
    let mut st = DaemonStatus { settings: read_settings(paths), ..DaemonStatus::default() };
    st.pid = paths.read_pid().filter(|p| process::alive(*p));
    if st.pid.is_none() {
        st.error = Some("no MPS control daemon is running".into());
        return st;
    }
    let result = (|| -> Result<(), ControlError> {
        st.active_thread_percentage = Some(ctl.send(paths, HEALTH_COMMAND)?.trim().to_string());
        st.up = true;
        if limits {
            let cmd = format!("get_default_device_pinned_mem_limit {}", paths.gpu_uuid);
            st.pinned_memory_limit = Some(ctl.send(paths, &cmd)?.trim().to_string());
        }
        Ok(())
    })();
    if let Err(e) = result {
        // A daemon that fails half-way does not answer; one that is gone meanwhile died.
        st.up = false;
        st.pid = st.pid.filter(|p| process::alive(*p));
        st.error = Some(e.to_string());
    }
    st
}

/// Why a running daemon does not serve `want`, or `None` when it does (the read-back quirk of
/// whole-G limits is allowed for).
pub fn difference(st: &DaemonStatus, want: &MpsSettings) -> Option<String> {
    if !st.up {
        return Some(st.error.clone().unwrap_or_else(|| "the daemon does not answer".into()));
    }
    if let Some(pct) = want.active_thread_percentage {
        let have = st.active_thread_percentage.as_deref().unwrap_or("");
        if !super::settings::percentage_matches(pct, have) {
            return Some(format!("active thread percentage is {have}, configured {pct}"));
        }
    }
    if let Some(mib) = want.pinned_memory_limit_mib {
        let have = st.pinned_memory_limit.as_deref().unwrap_or("");
        if !super::settings::limit_matches(mib, have) {
            return Some(format!("pinned memory limit is {have}, configured {}", limit_arg(mib)));
        }
    }
    None
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts the daemon and sets its defaults; returns its pid and the commands sent, in order.
pub fn start(
    ctl: &dyn MpsControl,
    paths: &DaemonPaths,
    want: &MpsSettings,
    wait: Duration,
    shm_bytes: Option<u64>,
) -> Result<(u32, Vec<String>), String> {
    for dir in [paths.pipe(), paths.log(), paths.shm()] {
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    if let Some(bytes) = shm_bytes {
        if let Err(e) = super::shm::mount(&paths.shm(), bytes) {
            tracing::warn!(error = %e, "clients get a plain directory as /dev/shm");
        }
    }
    let _ = std::fs::remove_file(paths.pid_file());
    let mut sent = vec!["nvidia-cuda-mps-control -d".to_string()];
    ctl.start(paths).map_err(|e| e.to_string())?;
    let mut pid = None;
    if !wait_until(wait, || {
        pid = paths.read_pid().filter(|p| process::alive(*p));
        pid.is_some()
    }) {
        return Err(format!("the MPS daemon of {} wrote no pid file within {} ms", paths.gpu_uuid, wait.as_millis()));
    }
    let pid = pid.unwrap_or_default();
    let mut commands = Vec::new();
    if let Some(pct) = want.active_thread_percentage {
        commands.push(format!("set_default_active_thread_percentage {pct}"));
    }
    if let Some(mib) = want.pinned_memory_limit_mib {
        commands.push(format!("set_default_device_pinned_mem_limit {} {}", paths.gpu_uuid, limit_arg(mib)));
    }
    for c in commands {
        ctl.send(paths, &c).map_err(|e| e.to_string())?;
        sent.push(c);
    }
    record_settings(paths, want).map_err(|e| format!("recording the MPS settings of {}: {e}", paths.gpu_uuid))?;
    Ok((pid, sent))
}

/// Stops the daemon (`quit`, then SIGKILL if it is still there after `wait`), unmounts its shm
/// and forgets its settings. Returns the commands sent.
pub fn stop(ctl: &dyn MpsControl, paths: &DaemonPaths, wait: Duration) -> Vec<String> {
    let sent = quit(ctl, paths, wait);
    super::shm::unmount(&paths.shm());
    sent
}

fn quit(ctl: &dyn MpsControl, paths: &DaemonPaths, wait: Duration) -> Vec<String> {
    let mut sent = Vec::new();
    let Some(pid) = paths.read_pid().filter(|p| process::alive(*p)) else {
        let _ = std::fs::remove_file(paths.pid_file());
        let _ = std::fs::remove_file(paths.dir.join(SETTINGS_FILE));
        return sent;
    };
    match ctl.send(paths, "quit") {
        Ok(_) => sent.push("quit".to_string()),
        Err(e) => tracing::warn!(gpu = %paths.gpu_uuid, error = %e, "quit failed"),
    }
    if !wait_until(wait, || !process::alive(pid)) {
        tracing::warn!(gpu = %paths.gpu_uuid, pid, "the MPS daemon did not quit; killing it");
        process::kill(pid);
        sent.push(format!("SIGKILL {pid}"));
        wait_until(wait, || !process::alive(pid));
    }
    let _ = std::fs::remove_file(paths.pid_file());
    let _ = std::fs::remove_file(paths.dir.join(SETTINGS_FILE));
    sent
}

/// Kills a daemon that does not answer (before restarting it).
pub fn kill_hung(paths: &DaemonPaths, wait: Duration) {
    if let Some(pid) = paths.read_pid().filter(|p| process::alive(*p)) {
        process::kill(pid);
        wait_until(wait, || !process::alive(pid));
    }
    let _ = std::fs::remove_file(paths.pid_file());
}
