//! The DRA plugin's node side (effects through the [`GpuBackend`] and files only): prepares a
//! claim's devices by creating exactly the allocated placements, unprepares them when nothing
//! uses them, keeps the checkpoint, writes the CDI specs, and at start reconciles the checkpoint
//! with the GPUs — adopting its instances, rolling back half-made ones, and never touching an
//! instance it did not make. An MPS share needs its GPU's MPS daemon: the first share starts it
//! (the same supervised daemon and directories as label mode), the last one stops it.

use super::cdi::{self, MigMinors};
use super::checkpoint::{Checkpoint, CheckpointError, ClaimEntry, ClaimState, MpsShare, PreparedDevice};
use super::devices::{DeviceKind, DeviceRef};
use super::order::GpuView;
use crate::backend::GpuBackend;
use crate::exec::{switch_mig_mode, ExecError};
use crate::mig::{Placement, ProfileTable};
use crate::observed::GpuState;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where the plugin keeps its files and which pool is its own.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The node's pool (the node's name).
    pub pool: String,
    /// Where CDI spec files go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The MIG capability minors file (`/proc/driver/nvidia-caps/mig-minors`).
    pub mig_minors: PathBuf,
    /// Where the checkpoint lives (`/var/lib/gpupart/dra`).
    pub state_dir: PathBuf,
}

/// One device a claim's allocation names for this driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The claim's request it serves.
    pub request: String,
    /// The pool it comes from.
    pub pool: String,
    /// The device's name.
    pub device: String,
    /// The allocation's `shareID` (a device several claims share).
    pub share_id: Option<String>,
    /// The allocation's `consumedCapacity`, by capacity name (integers).
    pub consumed: BTreeMap<String, u64>,
}

impl AllocatedDevice {
    /// A device allocated whole (no share).
    pub fn whole(request: &str, pool: &str, device: &str) -> Self {
        Self {
            request: request.into(),
            pool: pool.into(),
            device: device.into(),
            share_id: None,
            consumed: BTreeMap::new(),
        }
    }
}

/// A claim to prepare, as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimToPrepare {
    /// The claim's uid.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its devices for this driver.
    pub devices: Vec<AllocatedDevice>,
    /// Its opaque config for this driver (MPS shares), if it has one.
    pub share_config: Option<super::share_config::ShareConfig>,
}

/// A device handed to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The requests it serves.
    pub requests: Vec<String>,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// Fully qualified CDI ids.
    pub cdi_ids: Vec<String>,
    /// The share it is (a device several claims share).
    pub share_id: Option<String>,
}

/// Why a claim failed, as a label (metrics) and a message naming the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The allocation names a device this node does not publish.
    UnknownDevice,
    /// The allocated placement (or GPU) is taken.
    Occupied,
    /// A process uses the device.
    Busy,
    /// MIG mode could not follow the claim.
    MigMode,
    /// An NVML call failed.
    Nvml,
    /// A file (checkpoint, CDI spec, capability minors) could not be written or read.
    Files,
    /// The GPU's MPS daemon could not be started (or MPS is not set up).
    Mps,
    /// The device's GPU is unhealthy (an NVML event fenced it).
    Unhealthy,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownDevice => "unknown_device",
            Reason::Occupied => "occupied",
            Reason::Busy => "busy",
            Reason::MigMode => "mig_mode",
            Reason::Nvml => "nvml",
            Reason::Files => "files",
            Reason::Mps => "mps",
            Reason::Unhealthy => "unhealthy",
        }
    }
}

/// A claim could not be prepared or unprepared; nothing it would have made is left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim {claim}: {message}")]
pub struct ClaimError {
    /// `namespace/name` (or the uid when the name is unknown).
    pub claim: String,
    /// Why, for metrics.
    pub reason: Reason,
    /// What happened, naming the device, GPU and placement.
    pub message: String,
}

/// What the start-up reconciliation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartReport {
    /// Claims whose devices are all still there.
    pub adopted: usize,
    /// Devices forgotten because their instance vanished.
    pub forgotten: usize,
    /// Half-prepared claims rolled back.
    pub rolled_back: usize,
    /// Interrupted unprepares finished.
    pub finished: usize,
    /// MPS daemons started again for the shares they serve (found stopped).
    pub daemons_restarted: usize,
}

/// The plugin's state: its config, checkpoint and MPS edge.
pub struct Driver {
    cfg: DriverConfig,
    checkpoint: Checkpoint,
    mps: Option<crate::mps::Mps>,
    /// MIG-capable GPUs have an MPS device too (`--dra-mps-on-mig-gpus`).
    mps_on_mig: bool,
    /// The health record: devices it fences are not prepared.
    health: crate::health::HealthBook,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("cfg", &self.cfg).field("checkpoint", &self.checkpoint).finish()
    }
}

/// Least `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` a share gets from its memory share.
pub const MIN_THREAD_PERCENTAGE: u32 = 10;

/// The thread percentage of a share holding `memory` of the GPU's `total`: proportional, rounded
/// up, at least [`MIN_THREAD_PERCENTAGE`].
pub fn thread_percentage(memory: u64, total: u64) -> u32 {
    if total == 0 {
        return 100;
    }
    let pct = (u128::from(memory) * 100).div_ceil(u128::from(total)).min(100) as u32;
    pct.max(MIN_THREAD_PERCENTAGE)
}

fn describe(kind: DeviceKind, table: &ProfileTable) -> String {
    match kind {
        DeviceKind::Gpu => "the whole GPU".to_string(),
        DeviceKind::Mps => "an MPS share".to_string(),
        DeviceKind::Mig { profile_id, placement } => {
            let p = table.by_id(profile_id).map_or_else(|| format!("profile {profile_id}"), |p| p.name.to_string());
            format!("{p} at placement {}..{}", placement.start, placement.end())
        }
    }
}

impl Driver {
    /// Loads the checkpoint from the state directory.
    pub fn open(cfg: DriverConfig) -> Result<Self, CheckpointError> {
        let checkpoint = Checkpoint::load(&cfg.state_dir.join("checkpoint.json"))?;
        Ok(Self { cfg, checkpoint, mps: None, mps_on_mig: false, health: Default::default() })
    }

    /// Gives MIG-capable GPUs an MPS device too: shared while idle with MIG off, the first share
    /// turns MIG off, the last turns it on again (`--dra-mps-on-mig-gpus`).
    pub fn sharing_mig_gpus(mut self, on: bool) -> Self {
        self.mps_on_mig = on;
        self
    }

    /// Whether GPU `s` has an MPS device.
    pub fn has_mps_device(&self, s: &GpuState) -> bool {
        super::devices::has_mps_device(&s.info, &s.profiles, self.mps_on_mig)
    }

    /// The health record now: Prepare refuses the devices of unhealthy GPUs and those over a
    /// faulty MIG device's slices ([`super::publish::fence_of`]).
    pub fn fence(&mut self, health: crate::health::HealthBook) {
        self.health = health;
    }

    /// Serves MPS shares through `mps` (without it, a share's Prepare fails saying so).
    pub fn with_mps(mut self, mps: crate::mps::Mps) -> Self {
        self.mps = Some(mps);
        self
    }

    /// The MPS shares prepared on GPU `gpu` (by claim uid), leaving out claim `except`.
    fn shares_on(&self, gpu: u32, except: &str) -> usize {
        self.checkpoint.devices().filter(|(u, d)| *u != except && d.gpu == gpu && d.kind == DeviceKind::Mps).count()
    }

    /// What is prepared.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    fn save(&self) -> Result<(), CheckpointError> {
        self.checkpoint.save(&self.cfg.state_dir.join("checkpoint.json"))
    }

    fn cdi_path(&self, uid: &str) -> PathBuf {
        self.cfg.cdi_dir.join(cdi::file_name(uid))
    }

    /// The devices allocated to prepared claims (published after the offered ones, so the
    /// scheduler keeps accounting their counters).
    pub fn prepared_devices(&self) -> Vec<DeviceRef> {
        self.checkpoint.devices().map(|(_, d)| DeviceRef { gpu: d.gpu, kind: d.kind }).collect()
    }

    /// Whether a claim is prepared.
    pub fn is_prepared(&self, uid: &str) -> bool {
        self.checkpoint.claims.get(uid).is_some_and(|c| c.state == ClaimState::Prepared)
    }

    /// The policy's view of the GPUs: every GPU instance and every `pending` device (allocated
    /// to a claim, not yet prepared) occupies its placement; a GPU is taken whole when a claim
    /// holds it or processes run on it outside MIG.
    pub fn views(&self, states: &[GpuState], pending: &[DeviceRef]) -> Vec<GpuView> {
        let held: Vec<DeviceRef> = self.prepared_devices().into_iter().chain(pending.iter().copied()).collect();
        self.views_of(states, &held, true)
    }

    /// The GPUs with only the `claimed` devices on them (what the scheduler's counters account:
    /// the devices of the claims allocated from the pool): no other instance, no processes
    /// outside MIG.
    pub fn claimed_views(&self, states: &[GpuState], claimed: &[DeviceRef]) -> Vec<GpuView> {
        self.views_of(states, claimed, false)
    }

    /// The GPUs with `held` devices occupying their placements, and (`everything`) every
    /// instance and the processes outside MIG too.
    fn views_of(&self, states: &[GpuState], held: &[DeviceRef], everything: bool) -> Vec<GpuView> {
        states
            .iter()
            .map(|s| {
                let index = s.info.index;
                let mut occupied: Vec<(u32, Placement)> = if everything {
                    s.instances.iter().map(|i| (i.profile_id, i.placement)).collect()
                } else {
                    Vec::new()
                };
                for d in held.iter().filter(|d| d.gpu == index) {
                    if let DeviceKind::Mig { profile_id, placement } = d.kind {
                        if !occupied.iter().any(|(_, p)| *p == placement) {
                            occupied.push((profile_id, placement));
                        }
                    }
                }
                let whole = held.iter().any(|d| d.gpu == index && d.kind == DeviceKind::Gpu);
                let shares = held.iter().filter(|d| d.gpu == index && d.kind == DeviceKind::Mps).count() as u32;
                // With shares, the processes are their clients.
                let outside_mig = everything && !s.mig_mode.current && !s.processes.is_empty() && shares == 0;
                let table = if s.info.mig_capable { s.profiles.clone() } else { ProfileTable::empty() };
                GpuView {
                    index,
                    mps_device: self.has_mps_device(s),
                    table,
                    mig_enabled: s.mig_mode.current,
                    occupied,
                    whole_taken: whole || outside_mig,
                    mps_shares: shares,
                }
            })
            .collect()
    }

    /// Prepares a claim: creates exactly its allocated devices (switching MIG mode where the
    /// claim needs it and the GPU is idle), writes its CDI spec and records it. A repeated call
    /// answers the same and creates nothing; a failure leaves nothing of the claim behind.
    pub fn prepare(&mut self, backend: &dyn GpuBackend, claim: &ClaimToPrepare) -> Result<Vec<Granted>, ClaimError> {
        let label = format!("{}/{}", claim.namespace, claim.name);
        let fail = |reason, message: String| ClaimError { claim: label.clone(), reason, message };
        if let Some(e) = self.checkpoint.claims.get(&claim.uid).filter(|e| e.state == ClaimState::Prepared) {
            return Ok(granted(&claim.uid, e));
        }
        let states = backend.observe_all().map_err(|e| fail(Reason::Nvml, format!("reading the GPUs: {e}")))?;
        let devices = self.validate(claim, &states).map_err(|(r, m)| fail(r, m))?;
        let fenced = |d: &PreparedDevice| {
            super::publish::fence_of(super::devices::DeviceRef { gpu: d.gpu, kind: d.kind }, &self.health)
        };
        if let Some((d, f)) = devices.iter().find_map(|d| fenced(d).map(|f| (d, f))) {
            return Err(fail(Reason::Unhealthy, format!("device {} {}", d.device, f.why)));
        }
        let entry = ClaimEntry {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: ClaimState::Preparing,
            devices,
        };
        self.checkpoint.claims.insert(claim.uid.clone(), entry);
        self.save().map_err(|e| fail(Reason::Files, e.to_string()))?;
        match self.create_all(backend, &claim.uid, &states) {
            Ok(()) => {}
            Err((reason, message)) => {
                self.roll_back(backend, &claim.uid);
                return Err(fail(reason, message));
            }
        }
        let minors = MigMinors::read(&self.cfg.mig_minors);
        let Some(entry) = self.checkpoint.claims.get(&claim.uid).cloned() else {
            return Err(fail(Reason::Files, "the checkpoint lost the claim while preparing it".into()));
        };
        let minor_of = |gpu: u32| states.iter().find(|s| s.info.index == gpu).map_or(gpu, |s| s.info.minor);
        let mps_root = self.mps.as_ref().map(|m| m.root.clone());
        let spec = cdi::spec(&claim.uid, &entry.devices, minor_of, &minors, mps_root.as_deref());
        let written = spec.and_then(|spec| {
            let text = serde_json::to_string_pretty(&spec).map_err(|e| e.to_string())?;
            crate::fsutil::write_atomic(&self.cdi_path(&claim.uid), text.as_bytes())
                .map_err(|e| format!("writing the CDI spec {}: {e}", self.cdi_path(&claim.uid).display()))
        });
        if let Err(m) = written {
            self.roll_back(backend, &claim.uid);
            return Err(fail(Reason::Files, m));
        }
        if let Some(e) = self.checkpoint.claims.get_mut(&claim.uid) {
            e.state = ClaimState::Prepared;
        }
        if let Err(e) = self.save() {
            self.roll_back(backend, &claim.uid);
            return Err(fail(Reason::Files, e.to_string()));
        }
        tracing::info!(claim = %label, devices = entry.devices.len(), "prepared");
        Ok(granted(&claim.uid, &entry))
    }

    /// Checks a claim's allocation against the GPUs; returns the devices to make.
    fn validate(&self, claim: &ClaimToPrepare, states: &[GpuState]) -> Result<Vec<PreparedDevice>, (Reason, String)> {
        if claim.devices.is_empty() {
            return Err((Reason::UnknownDevice, "its allocation names no device of this driver".into()));
        }
        let table_of = |g: u32| states.iter().find(|s| s.info.index == g).map(|s| &s.profiles);
        let mut by_device: BTreeMap<(String, Option<String>), PreparedDevice> = BTreeMap::new();
        for a in &claim.devices {
            if a.pool != self.cfg.pool {
                return Err((
                    Reason::UnknownDevice,
                    format!("device {} is in pool {}, not this node's ({})", a.device, a.pool, self.cfg.pool),
                ));
            }
            let key = (a.device.clone(), a.share_id.clone());
            if let Some(d) = by_device.get_mut(&key) {
                d.requests.push(a.request.clone());
                continue;
            }
            let Some(r) = DeviceRef::parse(&a.device, table_of) else {
                return Err((Reason::UnknownDevice, format!("device {} is not published by this node", a.device)));
            };
            let s = states
                .iter()
                .find(|s| s.info.index == r.gpu)
                .ok_or((Reason::UnknownDevice, format!("device {}: no GPU {}", a.device, r.gpu)))?;
            self.check_free(s, r).map_err(|m| {
                (
                    Reason::Occupied,
                    format!("device {} (GPU {}, {}): {m}", a.device, r.gpu, describe(r.kind, &s.profiles)),
                )
            })?;
            let share = match r.kind {
                DeviceKind::Mps => Some(share_of(a, s, claim.share_config.unwrap_or_default())?),
                _ => None,
            };
            by_device.insert(
                key,
                PreparedDevice {
                    requests: vec![a.request.clone()],
                    pool: a.pool.clone(),
                    device: a.device.clone(),
                    gpu: r.gpu,
                    gpu_uuid: s.info.uuid.clone(),
                    kind: r.kind,
                    gi: None,
                    ci: None,
                    uuid: None,
                    share,
                },
            );
        }
        // Two devices of one claim may not overlap either.
        let list: Vec<PreparedDevice> = by_device.into_values().collect();
        if claim.share_config.is_some() && !list.iter().any(|d| d.kind == DeviceKind::Mps) {
            return Err((
                Reason::UnknownDevice,
                "its opaque config sets MPS share limits, but it holds no MPS share".into(),
            ));
        }
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.gpu == b.gpu && overlaps(a.kind, b.kind) {
                    return Err((Reason::Occupied, format!("devices {} and {} overlap", a.device, b.device)));
                }
            }
        }
        Ok(list)
    }

    /// Why `r` cannot be made on `s` now, if it cannot.
    fn check_free(&self, s: &GpuState, r: DeviceRef) -> Result<(), String> {
        let index = s.info.index;
        let holder = self
            .checkpoint
            .claims
            .values()
            .find_map(|c| c.devices.iter().find(|d| d.gpu == index && overlaps(d.kind, r.kind)).map(|d| (c, d)));
        if let Some((c, d)) = holder {
            return Err(format!("taken by claim {}/{} ({})", c.namespace, c.name, d.device));
        }
        match r.kind {
            DeviceKind::Mig { placement, .. } => {
                if !s.info.mig_capable {
                    return Err("the GPU has no MIG".into());
                }
                if let Some(gi) = s.instances.iter().find(|i| i.placement.overlaps(placement)) {
                    return Err(format!("GPU instance {} ({}) is there", gi.id, s.gi_name(gi)));
                }
                if !s.mig_mode.current && s.all_processes().next().is_some() {
                    return Err("MIG mode is off and processes use the GPU".into());
                }
            }
            DeviceKind::Gpu => {
                if !s.instances.is_empty() {
                    return Err(format!("the GPU holds {} MIG instance(s)", s.instances.len()));
                }
            }
            DeviceKind::Mps => {
                if !self.has_mps_device(s) {
                    return Err("the GPU is shared through MIG here (no --dra-mps-on-mig-gpus)".into());
                }
                if !s.instances.is_empty() {
                    return Err(format!("the GPU holds {} MIG instance(s)", s.instances.len()));
                }
            }
        }
        Ok(())
    }

    /// Starts GPU `s`'s MPS daemon unless it runs and answers; returns whether it started it.
    fn ensure_daemon(&self, s: &GpuState) -> Result<bool, String> {
        let mps = self.mps.as_ref().ok_or("MPS is not set up on this node (no MPS control program)")?;
        let paths = mps.paths(&s.info.uuid);
        let volta = crate::mps::settings::is_volta_or_newer(&s.info);
        let st = crate::mps::daemon::check(mps.control.as_ref(), &paths, volta);
        if st.up {
            return Ok(false);
        }
        if st.pid.is_some() {
            crate::mps::daemon::kill_hung(&paths, mps.wait);
        }
        // Per-client limits come from each share's environment; the daemon keeps its defaults.
        let settings = crate::mps::MpsSettings {
            replicas: crate::mps::settings::max_clients(&s.info),
            active_thread_percentage: None,
            pinned_memory_limit_mib: None,
        };
        crate::mps::daemon::start(mps.control.as_ref(), &paths, &settings, mps.wait, mps.shm_bytes).map(|(pid, _)| {
            tracing::info!(gpu = s.info.index, pid, "started the GPU's MPS daemon for its shares");
            true
        })
    }

    /// Stops GPU `s`'s MPS daemon (its last share is gone).
    fn stop_daemon(&self, s: &GpuState) {
        if let Some(mps) = &self.mps {
            let paths = mps.paths(&s.info.uuid);
            crate::mps::daemon::stop(mps.control.as_ref(), &paths, mps.wait);
            tracing::info!(gpu = s.info.index, "stopped the GPU's MPS daemon: its last share is gone");
        }
    }

    /// The MPS client pids of GPU `s`'s daemon, and the processes NVML sees on it.
    fn mps_users(&self, s: &GpuState) -> Vec<u32> {
        let mut pids: Vec<u32> = s.all_processes().map(|p| p.pid).collect();
        if let Some(mps) = &self.mps {
            let volta = crate::mps::settings::is_volta_or_newer(&s.info);
            let st = crate::mps::daemon::probe(mps.control.as_ref(), &mps.paths(&s.info.uuid), volta);
            pids.extend(st.clients);
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Creates every device of a recorded claim, recording each step.
    fn create_all(&mut self, backend: &dyn GpuBackend, uid: &str, states: &[GpuState]) -> Result<(), (Reason, String)> {
        let devices = self.checkpoint.claims.get(uid).map(|c| c.devices.clone()).unwrap_or_default();
        for (i, d) in devices.into_iter().enumerate() {
            let Some(s) = states.iter().find(|s| s.info.index == d.gpu) else {
                return Err((Reason::UnknownDevice, format!("device {}: no GPU {}", d.device, d.gpu)));
            };
            let what = format!("device {} (GPU {}, {})", d.device, d.gpu, describe(d.kind, &s.profiles));
            let mode = |on: bool| {
                let mut steps = Vec::new();
                switch_mig_mode(backend, d.gpu, on, false, &mut steps).map_err(|e| {
                    let reason = if matches!(e, ExecError::Backend(_)) { Reason::Nvml } else { Reason::MigMode };
                    (reason, format!("{what}: switching MIG mode {}: {e}", if on { "on" } else { "off" }))
                })
            };
            let current = backend.observe(d.gpu).map_err(|e| (Reason::Nvml, format!("{what}: {e}")))?;
            match d.kind {
                DeviceKind::Gpu => {
                    if s.info.mig_capable && current.mig_mode.current {
                        mode(false)?;
                    }
                    self.record(uid, i, |p| p.uuid = Some(s.info.uuid.clone()));
                }
                DeviceKind::Mig { profile_id, placement } => {
                    if !current.mig_mode.current {
                        mode(true)?;
                    }
                    let p = s
                        .profiles
                        .by_id(profile_id)
                        .ok_or((Reason::UnknownDevice, format!("{what}: unknown profile")))?;
                    let ci_profile = p
                        .ci_with_slices(p.slices)
                        .map(|c| c.id)
                        .ok_or((Reason::UnknownDevice, format!("{what}: no full compute instance profile")))?;
                    let gi = backend
                        .create_gpu_instance(d.gpu, profile_id, placement)
                        .map_err(|e| (Reason::Nvml, format!("{what}: creating the GPU instance: {e}")))?;
                    self.record(uid, i, |p| p.gi = Some(gi));
                    self.save().map_err(|e| (Reason::Files, e.to_string()))?;
                    let ci = backend
                        .create_compute_instance(d.gpu, gi, ci_profile, Placement::new(0, p.slices))
                        .map_err(|e| (Reason::Nvml, format!("{what}: creating the compute instance: {e}")))?;
                    self.record(uid, i, |p| p.ci = Some(ci));
                    let after = backend.observe(d.gpu).map_err(|e| (Reason::Nvml, format!("{what}: {e}")))?;
                    let uuid = after
                        .instances
                        .iter()
                        .find(|x| x.id == gi)
                        .and_then(|x| x.cis.iter().find(|c| c.id == ci))
                        .map(|c| c.uuid.clone());
                    self.record(uid, i, |p| p.uuid = uuid);
                }
                DeviceKind::Mps => {
                    // Beside other shares the daemon was checked when they were prepared and is
                    // watched since: a live pid is enough; the first share checks it answers.
                    if s.info.mig_capable && current.mig_mode.current {
                        mode(false)?;
                    }
                    if !(self.shares_on(d.gpu, uid) > 0 && self.daemon_alive(&s.info.uuid)) {
                        self.ensure_daemon(&current).map_err(|m| (Reason::Mps, format!("{what}: {m}")))?;
                    }
                    self.record(uid, i, |p| p.uuid = Some(s.info.uuid.clone()));
                }
            }
            self.save().map_err(|e| (Reason::Files, e.to_string()))?;
        }
        Ok(())
    }

    fn record(&mut self, uid: &str, i: usize, f: impl FnOnce(&mut PreparedDevice)) {
        if let Some(d) = self.checkpoint.claims.get_mut(uid).and_then(|c| c.devices.get_mut(i)) {
            f(d);
        }
    }

    /// Undoes whatever a claim made (its recorded instances, and an unrecorded instance at
    /// exactly a placement it was allocated), returns whole GPUs to MIG mode when idle, removes
    /// its CDI spec and its entry. Failures are logged; the rest still goes.
    fn roll_back(&mut self, backend: &dyn GpuBackend, uid: &str) {
        let Some(entry) = self.checkpoint.claims.get(uid).cloned() else { return };
        for d in entry.devices.iter().rev() {
            let Ok(s) = backend.observe(d.gpu) else { continue };
            match d.kind {
                DeviceKind::Mig { profile_id, placement } => {
                    let others = self.checkpoint.devices().any(|(u, o)| u != uid && o.gpu == d.gpu && o.kind == d.kind);
                    let gi = d.gi.or_else(|| {
                        (!others)
                            .then(|| {
                                s.instances
                                    .iter()
                                    .find(|i| i.placement == placement && i.profile_id == profile_id)
                                    .map(|i| i.id)
                            })
                            .flatten()
                    });
                    if let Some(gi) = gi {
                        destroy(backend, &s, gi, placement, profile_id);
                    }
                }
                DeviceKind::Gpu => return_to_mig(backend, &s),
                DeviceKind::Mps => {
                    if self.shares_on(d.gpu, uid) == 0 {
                        self.stop_daemon(&s);
                        return_to_mig(backend, &s);
                    }
                }
            }
        }
        let _ = std::fs::remove_file(self.cdi_path(uid));
        self.checkpoint.claims.remove(uid);
        if let Err(e) = self.save() {
            tracing::error!(error = %e, "saving the DRA checkpoint after a rollback");
        }
    }

    /// Unprepares a claim: refused while a process uses one of its devices; else destroys its
    /// instances, returns whole GPUs to MIG mode, removes its CDI spec and entry. A claim not
    /// prepared here is done already.
    pub fn unprepare(&mut self, backend: &dyn GpuBackend, uid: &str) -> Result<(), ClaimError> {
        let Some(entry) = self.checkpoint.claims.get(uid).cloned() else { return Ok(()) };
        let label = format!("{}/{}", entry.namespace, entry.name);
        let fail = |reason, message: String| ClaimError { claim: label.clone(), reason, message };
        let states = backend.observe_all().map_err(|e| fail(Reason::Nvml, format!("reading the GPUs: {e}")))?;
        for d in &entry.devices {
            let Some(s) = states.iter().find(|s| s.info.index == d.gpu) else { continue };
            let pids: Vec<String> = match d.kind {
                DeviceKind::Gpu => s.all_processes().map(|p| p.pid.to_string()).collect(),
                DeviceKind::Mig { .. } => s
                    .instances
                    .iter()
                    .filter(|i| Some(i.id) == d.gi)
                    .flat_map(|i| i.all_processes())
                    .map(|p| p.pid.to_string())
                    .collect(),
                // A client cannot be told apart from another share's: the daemon's clients
                // keep the last share (and so the daemon) in place.
                DeviceKind::Mps if self.shares_on(d.gpu, uid) == 0 => {
                    self.mps_users(s).iter().map(u32::to_string).collect()
                }
                DeviceKind::Mps => Vec::new(),
            };
            if !pids.is_empty() {
                return Err(fail(
                    Reason::Busy,
                    format!("device {} (GPU {}) is in use by pids {}; not destroyed", d.device, d.gpu, pids.join(", ")),
                ));
            }
        }
        if let Some(e) = self.checkpoint.claims.get_mut(uid) {
            e.state = ClaimState::Unpreparing;
        }
        self.save().map_err(|e| fail(Reason::Files, e.to_string()))?;
        for d in entry.devices.iter().rev() {
            let Some(s) = states.iter().find(|s| s.info.index == d.gpu) else { continue };
            match d.kind {
                DeviceKind::Mig { profile_id, placement } => {
                    if let Some(gi) = d.gi {
                        if let Err(m) = destroy_checked(backend, s, gi, placement, profile_id) {
                            return Err(fail(Reason::Nvml, format!("device {} (GPU {}): {m}", d.device, d.gpu)));
                        }
                    }
                }
                DeviceKind::Gpu => return_to_mig(backend, s),
                DeviceKind::Mps => {
                    if self.shares_on(d.gpu, uid) == 0 {
                        self.stop_daemon(s);
                        // Read again: the daemon's processes are gone now.
                        if let Ok(fresh) = backend.observe(s.info.index) {
                            return_to_mig(backend, &fresh);
                        }
                    }
                }
            }
        }
        match std::fs::remove_file(self.cdi_path(uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(fail(Reason::Files, format!("removing {}: {e}", self.cdi_path(uid).display())));
            }
            _ => {}
        }
        self.checkpoint.claims.remove(uid);
        self.save().map_err(|e| fail(Reason::Files, e.to_string()))?;
        tracing::info!(claim = %label, "unprepared");
        Ok(())
    }

    /// Reconciles the checkpoint with the GPUs after a start: half-prepared claims are rolled
    /// back (the kubelet prepares them again), interrupted unprepares finished, prepared claims
    /// adopted, and devices whose instance vanished forgotten. Nothing else is touched.
    pub fn start(&mut self, backend: &dyn GpuBackend) -> Result<StartReport, ClaimError> {
        let mut report = StartReport::default();
        let uids: Vec<String> = self.checkpoint.claims.keys().cloned().collect();
        for uid in uids {
            let Some(entry) = self.checkpoint.claims.get(&uid).cloned() else { continue };
            match entry.state {
                ClaimState::Preparing => {
                    self.roll_back(backend, &uid);
                    report.rolled_back += 1;
                }
                ClaimState::Unpreparing => match self.unprepare(backend, &uid) {
                    Ok(()) => report.finished += 1,
                    Err(e) => tracing::warn!(error = %e, "an interrupted unprepare cannot finish yet"),
                },
                ClaimState::Prepared => {
                    let states = backend.observe_all().map_err(|e| ClaimError {
                        claim: uid.clone(),
                        reason: Reason::Nvml,
                        message: format!("reading the GPUs: {e}"),
                    })?;
                    let before = entry.devices.len();
                    let kept: Vec<PreparedDevice> = entry
                        .devices
                        .into_iter()
                        .filter(|d| {
                            let Some(s) = states.iter().find(|s| s.info.index == d.gpu && s.info.uuid == d.gpu_uuid)
                            else {
                                return false;
                            };
                            match d.kind {
                                DeviceKind::Gpu | DeviceKind::Mps => true,
                                DeviceKind::Mig { profile_id, placement } => s.instances.iter().any(|i| {
                                    Some(i.id) == d.gi && i.placement == placement && i.profile_id == profile_id
                                }),
                            }
                        })
                        .collect();
                    report.forgotten += before - kept.len();
                    if kept.is_empty() {
                        let _ = std::fs::remove_file(self.cdi_path(&uid));
                        self.checkpoint.claims.remove(&uid);
                    } else {
                        report.adopted += 1;
                        if let Some(e) = self.checkpoint.claims.get_mut(&uid) {
                            e.devices = kept;
                        }
                    }
                }
            }
        }
        self.save().map_err(|e| ClaimError {
            claim: "checkpoint".into(),
            reason: Reason::Files,
            message: e.to_string(),
        })?;
        // The daemons of the shares kept: adopted when they answer, started again when not.
        let shared: std::collections::BTreeSet<u32> =
            self.checkpoint.devices().filter(|(_, d)| d.kind == DeviceKind::Mps).map(|(_, d)| d.gpu).collect();
        if !shared.is_empty() {
            let states = backend.observe_all().map_err(|e| ClaimError {
                claim: "checkpoint".into(),
                reason: Reason::Nvml,
                message: format!("reading the GPUs: {e}"),
            })?;
            for s in states.iter().filter(|s| shared.contains(&s.info.index)) {
                match self.ensure_daemon(s) {
                    Ok(true) => report.daemons_restarted += 1,
                    Ok(false) => {}
                    Err(m) => {
                        tracing::error!(gpu = s.info.index, error = %m, "the MPS daemon of prepared shares cannot start")
                    }
                }
            }
        }
        Ok(report)
    }

    /// Per GPU with MPS shares prepared: how many, and the device memory their clients may pin.
    pub fn shares(&self) -> BTreeMap<u32, (u32, u64)> {
        let mut out: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
        for (_, d) in self.checkpoint.devices().filter(|(_, d)| d.kind == DeviceKind::Mps) {
            let e = out.entry(d.gpu).or_default();
            e.0 += 1;
            e.1 += d.share.as_ref().map_or(0, |s| s.memory_bytes);
        }
        out
    }

    /// Whether the MPS daemon of the GPU `uuid` has a live pid.
    fn daemon_alive(&self, uuid: &str) -> bool {
        self.mps.as_ref().is_some_and(|m| m.paths(uuid).read_pid().is_some_and(crate::mps::process::alive))
    }

    /// GPU `gpu`'s MPS daemon again, if shares are prepared there and its pid is gone; whether it
    /// started one (supervision, every publication: a pid check, the full check only to start).
    pub fn revive_daemon(&self, backend: &dyn GpuBackend, gpu: u32) -> Result<bool, String> {
        if self.shares_on(gpu, "") == 0 {
            return Ok(false);
        }
        let uuid = self.checkpoint.devices().find(|(_, d)| d.gpu == gpu).map(|(_, d)| d.gpu_uuid.clone());
        if uuid.is_some_and(|u| self.daemon_alive(&u)) {
            return Ok(false);
        }
        let s = backend.observe(gpu).map_err(|e| e.to_string())?;
        self.ensure_daemon(&s)
    }
}

/// The share an allocation names on GPU `s`: its id, the memory its client may pin (what it
/// consumed, or less by its config) and its thread percentage (by its config, else proportional).
fn share_of(
    a: &AllocatedDevice,
    s: &GpuState,
    cfg: super::share_config::ShareConfig,
) -> Result<MpsShare, (Reason, String)> {
    let id = a.share_id.clone().ok_or((
        Reason::UnknownDevice,
        format!(
            "device {} is shared but its allocation has no shareID (is the scheduler's DRAConsumableCapacity feature on?)",
            a.device
        ),
    ))?;
    let memory = *a.consumed.get("memory").ok_or((
        Reason::UnknownDevice,
        format!("device {}: the allocation's consumedCapacity has no memory", a.device),
    ))?;
    if memory == 0 || memory > s.info.memory_total_bytes {
        return Err((
            Reason::UnknownDevice,
            format!(
                "device {}: consumed memory {memory} bytes is outside the GPU's {} bytes",
                a.device, s.info.memory_total_bytes
            ),
        ));
    }
    let limit = match cfg.pinned_memory_limit {
        Some(l) if l > memory => {
            return Err((
                Reason::UnknownDevice,
                format!(
                    "device {}: opaque config pinned memory limit {l} bytes exceeds the {memory} bytes the share was allocated",
                    a.device
                ),
            ))
        }
        Some(l) => l,
        None => memory,
    };
    let pct = cfg.active_thread_percentage.unwrap_or_else(|| thread_percentage(memory, s.info.memory_total_bytes));
    Ok(MpsShare { id, memory_bytes: limit, thread_percentage: pct })
}

fn overlaps(a: DeviceKind, b: DeviceKind) -> bool {
    match (a, b) {
        (DeviceKind::Mig { placement: x, .. }, DeviceKind::Mig { placement: y, .. }) => x.overlaps(y),
        // Shares of one MPS daemon go together.
        (DeviceKind::Mps, DeviceKind::Mps) => false,
        _ => true,
    }
}

fn granted(uid: &str, e: &ClaimEntry) -> Vec<Granted> {
    e.devices
        .iter()
        .map(|d| Granted {
            requests: d.requests.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
            cdi_ids: vec![cdi::device_id(uid, &d.device)],
            share_id: d.share.as_ref().map(|s| s.id.clone()),
        })
        .collect()
}

/// Destroys GPU instance `gi` (and its compute instances) only if it is still the instance at
/// `placement` of `profile_id`; an instance already gone is fine.
fn destroy_checked(
    backend: &dyn GpuBackend,
    s: &GpuState,
    gi: u32,
    placement: Placement,
    profile_id: u32,
) -> Result<(), String> {
    let Some(inst) = s.instances.iter().find(|i| i.id == gi) else { return Ok(()) };
    if inst.placement != placement || inst.profile_id != profile_id {
        return Ok(());
    }
    for c in inst.cis.iter().rev() {
        backend
            .destroy_compute_instance(s.info.index, gi, c.id)
            .map_err(|e| format!("destroying compute instance {}: {e}", c.id))?;
    }
    backend.destroy_gpu_instance(s.info.index, gi).map_err(|e| format!("destroying GPU instance {gi}: {e}"))
}

fn destroy(backend: &dyn GpuBackend, s: &GpuState, gi: u32, placement: Placement, profile_id: u32) {
    if let Err(m) = destroy_checked(backend, s, gi, placement, profile_id) {
        tracing::error!(gpu = s.info.index, gi, error = %m, "rollback failed");
    }
}

/// Switches an idle MIG-capable GPU whose MIG mode is off back on, so its placements are offered
/// again.
fn return_to_mig(backend: &dyn GpuBackend, s: &GpuState) {
    if s.info.mig_capable && !s.mig_mode.current && s.all_processes().next().is_none() {
        let mut steps = Vec::new();
        if let Err(e) = switch_mig_mode(backend, s.info.index, true, false, &mut steps) {
            tracing::warn!(gpu = s.info.index, error = %e, "the idle GPU stays out of MIG mode");
        }
    }
}
