//! The record of unhealthy GPUs: its file (read, written atomically) and the agent's shared copy.

use crate::health::{GpuEvent, HealthBook, MigFault, Unhealthy, XidPolicy};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where the record lives unless `--health-file` says otherwise.
pub const DEFAULT_FILE: &str = "/var/lib/gpupart/health.json";

/// Reads a record file: a missing file is an empty record; the error names the file.
pub fn read_file(file: &Path) -> Result<HealthBook, String> {
    match std::fs::read_to_string(file) {
        Ok(text) => HealthBook::from_file(&text).map_err(|e| format!("health record {}: {e}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HealthBook::default()),
        Err(e) => Err(format!("cannot read the health record {}: {e}", file.display())),
    }
}

/// Reads a record file for a report: one that does not read is logged and counts as empty.
pub fn read_or_warn(file: &Path) -> HealthBook {
    read_file(file).unwrap_or_else(|e| {
        tracing::warn!("{e}");
        HealthBook::default()
    })
}

/// Writes a record file atomically; the error names the file.
pub fn write_file(file: &Path, book: &HealthBook) -> Result<(), String> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    crate::fsutil::write_atomic(file, book.to_file().as_bytes())
        .map_err(|e| format!("cannot write the health record {}: {e}", file.display()))
}

/// The agent's record of unhealthy GPUs, shared by its event watch, its reconciles and what it
/// publishes; kept in its file.
pub struct GpuHealth {
    book: Mutex<HealthBook>,
    file: PathBuf,
    /// Which XIDs are an application's.
    pub policy: XidPolicy,
}

impl GpuHealth {
    /// Loads the record from `file`. An unreadable record is logged and starts empty (it is
    /// written again at the next fault), so a damaged file never keeps the agent down.
    pub fn load(file: &Path, policy: XidPolicy) -> Self {
        let book = read_file(file).unwrap_or_else(|e| {
            tracing::error!(error = %e, "starting with no unhealthy GPUs");
            HealthBook::default()
        });
        for (gpu, u) in book.unhealthy() {
            tracing::warn!(gpu, reason = %u.reason, since = u.since, "GPU recorded unhealthy");
        }
        Self { book: Mutex::new(book), file: file.to_path_buf(), policy }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, book: &HealthBook) {
        if let Err(e) = write_file(&self.file, book) {
            tracing::error!(error = %e, "the health record is kept in memory only");
        }
    }

    /// The record now.
    pub fn snapshot(&self) -> HealthBook {
        self.lock().clone()
    }

    /// Whether GPU `gpu` is unhealthy.
    pub fn is_unhealthy(&self, gpu: u32) -> bool {
        self.lock().is_unhealthy(gpu)
    }

    /// Records an event of one of the `known` GPUs; the GPU's record when it made it unhealthy
    /// now (saved), the error when the event names a GPU this node does not have.
    pub fn record(&self, e: &GpuEvent, known: &[u32]) -> Result<Option<Unhealthy>, String> {
        let mut book = self.lock();
        let fresh = book.record(e, known, &self.policy)?.cloned();
        // A fault is saved (a new record, or one more count); an ignored event writes nothing.
        if crate::health::fault(e.kind, &self.policy).is_some() {
            self.save(&book);
        }
        Ok(fresh)
    }

    /// Records a fault of the MIG device at `profile`/`placement` (an event named it); the fault
    /// when it is new (saved).
    pub fn record_mig(
        &self,
        e: &GpuEvent,
        profile: &str,
        placement: crate::mig::Placement,
        known: &[u32],
    ) -> Result<Option<MigFault>, String> {
        let mut book = self.lock();
        let fresh = book.record_mig(e, profile, placement, known, &self.policy)?.cloned();
        if crate::health::fault(e.kind, &self.policy).is_some() {
            self.save(&book);
        }
        Ok(fresh)
    }

    /// Marks `gpus` healthy again (saved); those that were unhealthy.
    pub fn recover(&self, gpus: &[u32]) -> Vec<u32> {
        let mut book = self.lock();
        let back: Vec<u32> = gpus.iter().copied().filter(|g| book.recover(*g)).collect();
        if !back.is_empty() {
            self.save(&book);
        }
        back
    }

    /// Reads the file again: GPUs an operator removed from it (`gpupart health --recover`) are
    /// healthy again; returns them.
    pub fn reread(&self) -> Vec<u32> {
        let Ok(on_disk) = read_file(&self.file) else { return Vec::new() };
        let mut book = self.lock();
        let still = on_disk.affected();
        let gone: Vec<u32> = book.affected().into_iter().filter(|g| !still.contains(g)).collect();
        for g in &gone {
            book.recover(*g);
        }
        gone
    }
}

/// One line about a faulty MIG device: `GPU 1's MIG device 1g.10gb@4 (GPU instance 3, compute
/// instance 0) is unhealthy (XID 94)`.
pub fn describe_mig(m: &MigFault) -> String {
    let ids =
        m.fault.instance.map(|(gi, ci)| format!(" (GPU instance {gi}, compute instance {ci})")).unwrap_or_default();
    let more = if m.fault.faults > 1 { format!(", {} faults", m.fault.faults) } else { String::new() };
    format!("GPU {}'s MIG device {}{ids} is unhealthy ({}{more})", m.gpu, m.device(), m.fault.reason)
}

/// One line about an unhealthy GPU for status reasons, Events and explanations:
/// `GPU 1 is unhealthy (XID 79 on MIG instance 3/0, 2 faults)`.
pub fn describe(gpu: u32, u: &Unhealthy) -> String {
    let at = u.instance.map(|(gi, ci)| format!(" on MIG instance {gi}/{ci}")).unwrap_or_default();
    let more = if u.faults > 1 { format!(", {} faults", u.faults) } else { String::new() };
    format!("GPU {gpu} is unhealthy ({}{at}{more})", u.reason)
}
