//! The node's one NVML event loop (a thread): waits for XID and ECC events through the backend
//! (nvml-wrapper's NVML on hardware, the simulator's injected events), records the faults, and
//! hands each change to the agent. A wait that fails is counted and retried (the backend
//! registers its GPUs again); a GPU that is lost is fenced, and healthy again once it answers.

use super::record::GpuHealth;
use crate::backend::GpuBackend;
use crate::health::{EventKind, GpuEvent, MigFault, Unhealthy};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// A change of the node's health, for the agent to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// GPU `gpu` became unhealthy.
    Fenced {
        /// NVML index.
        gpu: u32,
        /// Its record.
        record: Unhealthy,
    },
    /// A MIG device's memory slices are fenced (an event named it).
    MigFenced(MigFault),
    /// GPUs are healthy again, and why.
    Recovered {
        /// NVML indices.
        gpus: Vec<u32>,
        /// Who said so (`the operator's annotation`, `its reset was observed`).
        why: String,
    },
}

/// Acts on an operator's recovery request (`1,3` or `all`, the `gpupart.io/recover-gpus`
/// annotation): the change when it named unhealthy GPUs, `None` when it named none of them, the
/// error naming a value that does not read.
pub fn recover_request(value: &str, health: &GpuHealth) -> Result<Option<Change>, String> {
    let key = crate::kube::keys::RECOVER_GPUS;
    let gpus =
        crate::health::parse_gpus(value, &health.snapshot()).map_err(|e| format!("annotation {key}='{value}': {e}"))?;
    let back = health.recover(&gpus);
    Ok((!back.is_empty()).then(|| Change::Recovered { gpus: back, why: format!("the operator's annotation {key}") }))
}

/// What the loop works with.
pub struct Watcher {
    backend: Arc<dyn GpuBackend>,
    health: Arc<GpuHealth>,
    metrics: Arc<crate::metrics::Metrics>,
    lost: BTreeSet<u32>,
    failures: u32,
    /// The last wait said a GPU is lost (it returns at once while one is).
    waited_lost: bool,
}

impl Watcher {
    /// A watcher of `backend`'s GPUs into `health`.
    pub fn new(backend: Arc<dyn GpuBackend>, health: Arc<GpuHealth>, metrics: Arc<crate::metrics::Metrics>) -> Self {
        Self { backend, health, metrics, lost: BTreeSet::new(), failures: 0, waited_lost: false }
    }

    /// One wait of up to `timeout`: what changed. Failed waits are counted and logged; the caller
    /// waits [`Watcher::pause`] before the next.
    pub fn step(&mut self, timeout: Duration) -> Vec<Change> {
        let mut out = Vec::new();
        self.reread(&mut out);
        self.returned(&mut out);
        self.waited_lost = false;
        match self.backend.next_event(timeout) {
            Ok(None) => self.failures = 0,
            Ok(Some(e)) => {
                self.failures = 0;
                self.reread(&mut out);
                self.event(&e, &mut out);
            }
            Err(e) if e.is_gpu_lost() => {
                self.waited_lost = true;
                self.probe_lost(&mut out);
            }
            Err(e) => {
                self.failures += 1;
                self.metrics.health().watch_failed();
                tracing::warn!(error = %e, failures = self.failures, "waiting for NVML events failed; registering again");
            }
        }
        out
    }

    /// How long to wait after a step: nothing after a good wait, 500 ms while a GPU is lost (its
    /// wait returns at once), 1 s, 2 s, … up to 30 s after failed waits.
    pub fn pause(&self) -> Duration {
        match self.failures {
            0 if self.waited_lost => Duration::from_millis(500),
            0 => Duration::ZERO,
            n => Duration::from_secs(1u64 << (n - 1).min(5)).min(Duration::from_secs(30)),
        }
    }

    /// GPUs an operator recovered in the file.
    fn reread(&self, out: &mut Vec<Change>) {
        let gone = self.health.reread();
        if !gone.is_empty() {
            tracing::info!(gpus = ?gone, "GPUs recovered in the health record");
            out.push(Change::Recovered { gpus: gone, why: "the operator recovered it in the health record".into() });
        }
    }

    /// Lost GPUs that answer NVML again: their reset was observed.
    fn returned(&mut self, out: &mut Vec<Change>) {
        for gpu in self.lost.clone() {
            if self.backend.observe(gpu).is_err() {
                continue;
            }
            self.lost.remove(&gpu);
            let back = self.health.recover(&[gpu]);
            if !back.is_empty() {
                tracing::info!(gpu, "the lost GPU answers again: its reset was observed");
                out.push(Change::Recovered {
                    gpus: back,
                    why: "it answers again after it was lost (reset observed)".into(),
                });
            }
        }
    }

    /// The wait says a GPU is lost: each GPU that says so too is fenced.
    fn probe_lost(&mut self, out: &mut Vec<Change>) {
        let count = self.backend.gpu_count().unwrap_or(0);
        for gpu in 0..count {
            if self.backend.observe(gpu).is_err_and(|e| e.is_gpu_lost()) {
                self.lost.insert(gpu);
                let e = GpuEvent { gpu, kind: EventKind::GpuLost, instance: None, at: crate::clock::now_secs() };
                self.event(&e, out);
            }
        }
    }

    /// Where the GPU instance `gi` of GPU `gpu` is now: its profile and placement.
    fn locate(&self, gpu: u32, gi: u32) -> Option<(String, crate::mig::Placement)> {
        let s = self.backend.observe(gpu).ok()?;
        s.instances.iter().find(|g| g.id == gi).map(|g| (s.gi_name(g).to_string(), g.placement))
    }

    fn event(&mut self, e: &GpuEvent, out: &mut Vec<Change>) {
        self.metrics.health().event(e.gpu, e.kind);
        let known: Vec<u32> = (0..self.backend.gpu_count().unwrap_or(0)).collect();
        let instance = e.instance.map(|(gi, ci)| format!("{gi}/{ci}"));
        // An event that names a MIG device that exists fences that device's slices only; one
        // whose instance is gone fences the GPU.
        let device = e.instance.filter(|_| crate::health::fault(e.kind, &self.health.policy).is_some());
        if let Some((profile, placement)) = device.and_then(|(gi, _)| self.locate(e.gpu, gi)) {
            match self.health.record_mig(e, &profile, placement, &known) {
                Ok(Some(m)) => {
                    tracing::warn!(gpu = e.gpu, device = %m.device(), reason = %m.fault.reason, instance, "MIG device fenced: nothing is created over its slices");
                    out.push(Change::MigFenced(m));
                }
                Ok(None) => {
                    tracing::warn!(gpu = e.gpu, event = ?e.kind, instance, "another fault where one was recorded")
                }
                Err(why) => tracing::warn!(event = ?e.kind, "{why}: ignored"),
            }
            return;
        }
        match self.health.record(e, &known) {
            Ok(Some(record)) => {
                tracing::warn!(gpu = e.gpu, reason = %record.reason, instance, "GPU fenced: no new work is placed on it");
                out.push(Change::Fenced { gpu: e.gpu, record });
            }
            Ok(None) if self.health.is_unhealthy(e.gpu) => {
                tracing::warn!(gpu = e.gpu, event = ?e.kind, instance, "another fault on an unhealthy GPU");
            }
            Ok(None) => {
                tracing::info!(gpu = e.gpu, event = ?e.kind, instance, "not a fault of the GPU (an application's XID or a corrected error): ignored");
            }
            Err(why) => tracing::warn!(event = ?e.kind, "{why}: ignored"),
        }
    }
}

/// Runs `w` on its own thread until `tx` is closed, handing every change to `tx`. A backend that
/// serves no events is logged once and not watched.
pub fn spawn(mut w: Watcher, tx: tokio::sync::mpsc::Sender<Change>) {
    if !w.backend.serves_events() {
        tracing::warn!(backend = %w.backend.describe(), "this backend serves no NVML events: GPU health is not watched");
        return;
    }
    let spawned = std::thread::Builder::new().name("gpu-health".into()).spawn(move || loop {
        for c in w.step(Duration::from_millis(500)) {
            if tx.blocking_send(c).is_err() {
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        std::thread::sleep(w.pause());
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the GPU health watch");
    }
}
