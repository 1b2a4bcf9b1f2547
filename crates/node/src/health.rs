//! GPU health from NVML events (pure): which events fence a GPU, as NVIDIA's device plugin judges
//! them, and the node's record of unhealthy GPUs. Application XIDs (13 graphics engine exception,
//! 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
//! exception, 109 context switch timeout) say a program failed, not the GPU; every other XID, a
//! double-bit ECC error and a GPU that is lost fence it. A single-bit ECC error is corrected and
//! fences nothing. An event that names a MIG device fences that device's memory slices only
//! ([`MigFault`]). Health returns only when someone says so ([`HealthBook::recover`]).

use crate::mig::sim::state::{EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, EVENT_XID};
use std::collections::{BTreeMap, BTreeSet};

/// XIDs that report an application's fault, not the GPU's (NVIDIA's device plugin skips them).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// What NVML reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// An XID critical error with its number.
    Xid(u64),
    /// An uncorrectable (double-bit) ECC error.
    DoubleBitEcc,
    /// A corrected (single-bit) ECC error.
    SingleBitEcc,
    /// The GPU stopped answering NVML (`NVML_ERROR_GPU_IS_LOST`).
    GpuLost,
}

/// One event about a GPU (or one of its MIG instances).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuEvent {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// What happened.
    pub kind: EventKind,
    /// The (GPU instance, compute instance) it names, when it names one.
    pub instance: Option<(u32, u32)>,
    /// When it was seen (seconds since the epoch).
    pub at: i64,
}

/// Which XIDs are application errors (ignored): NVIDIA's list, changed by a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    ignored: BTreeSet<u64>,
}

impl Default for XidPolicy {
    fn default() -> Self {
        Self { ignored: APPLICATION_XIDS.into_iter().collect() }
    }
}

/// A flag value that does not read; names the offending item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{item}' is not an XID to ignore (`48`) or to fence on (`-43`)")]
pub struct XidListError {
    /// The item.
    pub item: String,
}

impl XidPolicy {
    /// NVIDIA's list changed by `flag`: comma-separated XIDs, `48` ignored as well, `-43` fenced
    /// on after all.
    pub fn parse(flag: &str) -> Result<Self, XidListError> {
        let mut p = Self::default();
        for item in flag.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (fence, number) = item.strip_prefix('-').map_or((false, item), |n| (true, n));
            let xid: u64 = number.parse().map_err(|_| XidListError { item: item.to_string() })?;
            if fence {
                p.ignored.remove(&xid);
            } else {
                p.ignored.insert(xid);
            }
        }
        Ok(p)
    }

    /// Whether `xid` is ignored.
    pub fn ignores(&self, xid: u64) -> bool {
        self.ignored.contains(&xid)
    }
}

/// The event NVML's `nvmlEventData_t` reports: its type bit and data (the XID), its instance ids
/// (`0xFFFFFFFF`: none); `None` for a type that is not XID or ECC.
pub fn from_nvml(gpu: u32, event_type: u64, data: u64, gi: u32, ci: u32, at: i64) -> Option<GpuEvent> {
    let kind = match event_type {
        EVENT_XID => EventKind::Xid(data),
        EVENT_DOUBLE_BIT_ECC => EventKind::DoubleBitEcc,
        EVENT_SINGLE_BIT_ECC => EventKind::SingleBitEcc,
        _ => return None,
    };
    let instance = (gi != u32::MAX).then_some((gi, ci));
    Some(GpuEvent { gpu, kind, instance, at })
}

/// The event types watched: XID critical errors and ECC errors.
pub const WATCHED_EVENT_TYPES: u64 = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC;

/// Why an event fences its GPU, or `None` when it does not.
pub fn fault(kind: EventKind, policy: &XidPolicy) -> Option<String> {
    match kind {
        EventKind::Xid(x) if policy.ignores(x) => None,
        EventKind::Xid(x) => Some(format!("XID {x}")),
        EventKind::DoubleBitEcc => Some("double-bit ECC error".into()),
        EventKind::SingleBitEcc => None,
        EventKind::GpuLost => Some("GPU is lost".into()),
    }
}

/// The record of event `e` when it is a fault of one of the `known` GPUs (one fault counted);
/// `None` for an event that fences nothing; the error for a GPU the node does not have.
fn judge(e: &GpuEvent, known: &[u32], policy: &XidPolicy) -> Result<Option<Unhealthy>, String> {
    if !known.contains(&e.gpu) {
        return Err(format!("an event for GPU {} that this node does not have", e.gpu));
    }
    let Some(reason) = fault(e.kind, policy) else { return Ok(None) };
    let xid = match e.kind {
        EventKind::Xid(x) => Some(x),
        _ => None,
    };
    Ok(Some(Unhealthy { reason, xid, instance: e.instance, since: e.at, faults: 1 }))
}

/// An unhealthy GPU: the first fault seen, when, and how many since.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unhealthy {
    /// The first fault (`XID 79`).
    pub reason: String,
    /// Its XID, when it was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u64>,
    /// The MIG instance the first fault named, when it named one: (GPU instance, compute
    /// instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<(u32, u32)>,
    /// When the first fault was seen.
    pub since: i64,
    /// Faults seen since (the first included).
    pub faults: u32,
}

/// A MIG device an event named, where its GPU instance was when the event came: its memory
/// slices stay fenced (nothing is created over them), the rest of the GPU serves on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigFault {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The GPU instance profile (`1g.10gb`).
    pub profile: String,
    /// Its placement (memory slices).
    pub placement: crate::mig::Placement,
    /// The fault (its `instance` the GPU and compute instance ids the event named).
    pub fault: Unhealthy,
}

impl MigFault {
    /// `1g.10gb@4`.
    pub fn device(&self) -> String {
        format!("{}@{}", self.profile, self.placement.start)
    }
}

/// The node's unhealthy GPUs and MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthBook {
    gpus: BTreeMap<u32, Unhealthy>,
    mig: Vec<MigFault>,
}

impl HealthBook {
    /// Records an event of a GPU among `known`; returns the GPU's record when the event made it
    /// unhealthy now (not when it already was, nor for an event that fences nothing).
    pub fn record(&mut self, e: &GpuEvent, known: &[u32], policy: &XidPolicy) -> Result<Option<&Unhealthy>, String> {
        let Some(first) = judge(e, known, policy)? else { return Ok(None) };
        let fresh = !self.gpus.contains_key(&e.gpu);
        let entry = self.gpus.entry(e.gpu).or_insert(Unhealthy { faults: 0, ..first });
        entry.faults += 1;
        Ok(if fresh { Some(entry) } else { None })
    }

    /// Records a fault an event reported for the MIG device at `profile`/`placement` of one of
    /// the `known` GPUs; returns the fault when it is new (not when the GPU is already unhealthy
    /// or that device already faulted: then it is counted there).
    pub fn record_mig(
        &mut self,
        e: &GpuEvent,
        profile: &str,
        placement: crate::mig::Placement,
        known: &[u32],
        policy: &XidPolicy,
    ) -> Result<Option<&MigFault>, String> {
        let Some(fault) = judge(e, known, policy)? else { return Ok(None) };
        if let Some(g) = self.gpus.get_mut(&e.gpu) {
            g.faults += 1;
            return Ok(None);
        }
        if let Some(m) = self.mig.iter_mut().find(|m| m.gpu == e.gpu && m.placement == placement) {
            m.fault.faults += 1;
            return Ok(None);
        }
        self.mig.push(MigFault { gpu: e.gpu, profile: profile.to_string(), placement, fault });
        Ok(self.mig.last())
    }

    /// GPU `gpu` and its MIG devices are healthy again (an operator said so, or its reset was
    /// observed); whether anything of it was unhealthy.
    pub fn recover(&mut self, gpu: u32) -> bool {
        let before = self.mig.len();
        self.mig.retain(|m| m.gpu != gpu);
        self.gpus.remove(&gpu).is_some() || self.mig.len() != before
    }

    /// The faulty MIG devices of GPU `gpu`.
    pub fn mig_faults(&self, gpu: u32) -> impl Iterator<Item = &MigFault> {
        self.mig.iter().filter(move |m| m.gpu == gpu)
    }

    /// The GPUs with anything unhealthy (the GPU or one of its MIG devices).
    pub fn affected(&self) -> BTreeSet<u32> {
        self.gpus.keys().copied().chain(self.mig.iter().map(|m| m.gpu)).collect()
    }

    /// Whether GPU `gpu` is unhealthy.
    pub fn is_unhealthy(&self, gpu: u32) -> bool {
        self.gpus.contains_key(&gpu)
    }

    /// The unhealthy GPUs.
    pub fn unhealthy(&self) -> &BTreeMap<u32, Unhealthy> {
        &self.gpus
    }

    /// The record file's text (docs/health.md): `{"version": 1, "unhealthy": {"1": {...}}}`.
    pub fn to_file(&self) -> String {
        let doc = RecordFile { version: RECORD_VERSION, unhealthy: self.gpus.clone(), mig: self.mig.clone() };
        let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Reads a record file's text; the error says what is wrong with it.
    pub fn from_file(text: &str) -> Result<Self, String> {
        let doc: RecordFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if doc.version != RECORD_VERSION {
            return Err(format!("version {} (this gpupart reads version {RECORD_VERSION})", doc.version));
        }
        Ok(Self { gpus: doc.unhealthy, mig: doc.mig })
    }
}

/// The fault as a device taint's value (a label value: `xid-79`, `ecc-double-bit`, `gpu-lost`).
pub fn taint_value(u: &Unhealthy) -> String {
    match (u.xid, u.reason.as_str()) {
        (Some(x), _) => format!("xid-{x}"),
        (None, r) if r.contains("ECC") => "ecc-double-bit".into(),
        (None, r) if r.contains("lost") => "gpu-lost".into(),
        _ => "fault".into(),
    }
}

/// The record file's format version.
pub const RECORD_VERSION: u32 = 1;

/// The record file: unhealthy GPUs by NVML index.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    version: u32,
    #[serde(default)]
    unhealthy: BTreeMap<u32, Unhealthy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mig: Vec<MigFault>,
}

/// Which GPUs an operator names: `1,3` or `all` (of the unhealthy ones in `book`); the error
/// names the item that is not a GPU index.
pub fn parse_gpus(text: &str, book: &HealthBook) -> Result<Vec<u32>, String> {
    if text.trim() == "all" {
        return Ok(book.affected().into_iter().collect());
    }
    let mut out: Vec<u32> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        out.push(item.parse().map_err(|_| format!("'{item}' is not a GPU index (use `1,3` or `all`)"))?);
    }
    if out.is_empty() {
        return Err("no GPU named (use `1,3` or `all`)".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests;
