use super::watch::{Change, Watcher};
use super::*;
use crate::backend::{BackendError, GpuBackend, ModeActivation};
use crate::health::EventKind;
use crate::health::{GpuEvent, XidPolicy};
use crate::observed::{ComputeMode, GpuState};
use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// Two simulated GPUs whose events and losses a test scripts; nothing is changed.
struct Scripted {
    events: Mutex<VecDeque<Result<Option<GpuEvent>, BackendError>>>,
    lost: Mutex<BTreeSet<u32>>,
    sim: crate::backend::sim::SimBackend,
}

impl Default for Scripted {
    fn default() -> Self {
        let sim = crate::backend::sim::SimBackend::open(Some("A100-SXM4-80GB:2"), None).unwrap();
        Self { events: Mutex::default(), lost: Mutex::default(), sim }
    }
}

fn refused<T>() -> Result<T, BackendError> {
    Err(BackendError::Unavailable("not served by this stub".into()))
}

fn lost(gpu: u32) -> BackendError {
    BackendError::call(gpu, "nvmlEventSetWait_v2", crate::backend::GPU_IS_LOST, "")
}

impl GpuBackend for Scripted {
    fn describe(&self) -> String {
        "scripted".into()
    }
    fn serves_events(&self) -> bool {
        true
    }
    fn next_event(&self, _: Duration) -> Result<Option<GpuEvent>, BackendError> {
        self.events.lock().unwrap().pop_front().unwrap_or(Ok(None))
    }
    fn gpu_count(&self) -> Result<u32, BackendError> {
        Ok(2)
    }
    fn driver_version(&self) -> Result<String, BackendError> {
        refused()
    }
    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError> {
        if self.lost.lock().unwrap().contains(&gpu) {
            return Err(BackendError::call(gpu, "nvmlDeviceGetPciInfo_v3", crate::backend::GPU_IS_LOST, ""));
        }
        self.sim.observe(gpu)
    }
    fn set_mig_mode(&self, _: u32, _: bool) -> Result<ModeActivation, BackendError> {
        refused()
    }
    fn reset_gpu(&self, _: u32) -> Result<(), BackendError> {
        refused()
    }
    fn create_gpu_instance(&self, _: u32, _: u32, _: crate::mig::Placement) -> Result<u32, BackendError> {
        refused()
    }
    fn create_compute_instance(&self, _: u32, _: u32, _: u32, _: crate::mig::Placement) -> Result<u32, BackendError> {
        refused()
    }
    fn destroy_compute_instance(&self, _: u32, _: u32, _: u32) -> Result<(), BackendError> {
        refused()
    }
    fn destroy_gpu_instance(&self, _: u32, _: u32) -> Result<(), BackendError> {
        refused()
    }
    fn set_compute_mode(&self, _: u32, _: ComputeMode) -> Result<(), BackendError> {
        refused()
    }
}

fn xid(gpu: u32, x: u64) -> Result<Option<GpuEvent>, BackendError> {
    Ok(Some(GpuEvent { gpu, kind: EventKind::Xid(x), instance: None, at: 5 }))
}

struct Rig {
    backend: Arc<Scripted>,
    health: Arc<GpuHealth>,
    metrics: Arc<crate::metrics::Metrics>,
    watcher: Watcher,
    _dir: tempfile::TempDir,
    file: PathBuf,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state/health.json");
    let backend = Arc::new(Scripted::default());
    let health = Arc::new(GpuHealth::load(&file, XidPolicy::default()));
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let watcher = Watcher::new(backend.clone(), health.clone(), metrics.clone());
    Rig { backend, health, metrics, watcher, _dir: dir, file }
}

fn step(r: &mut Rig) -> Vec<Change> {
    r.watcher.step(Duration::ZERO)
}

#[test]
fn a_device_xid_fences_its_gpu_in_the_file_and_an_application_xid_or_an_unknown_gpu_does_not() {
    let mut r = rig();
    r.backend.events.lock().unwrap().extend([xid(1, 43), xid(7, 79), xid(1, 79), xid(1, 48)]);
    assert_eq!(step(&mut r), vec![], "XID 43 is an application's");
    assert_eq!(step(&mut r), vec![], "GPU 7 is not on this node");
    assert!(!r.file.exists(), "nothing fenced, nothing written");
    let fenced = step(&mut r);
    assert!(matches!(&fenced[..], [Change::Fenced { gpu: 1, record }] if record.reason == "XID 79"), "{fenced:?}");
    assert_eq!(step(&mut r), vec![], "a second fault is no new change");
    let on_disk = read_file(&r.file).unwrap();
    assert_eq!(on_disk.unhealthy()[&1].faults, 2);
    // Another agent start reads the fence back.
    assert!(GpuHealth::load(&r.file, XidPolicy::default()).is_unhealthy(1));
    let text = r.metrics.render();
    assert!(text.contains("gpupart_gpu_xid_errors_total{gpu=\"1\",xid=\"79\"} 1"), "{text}");
    assert!(text.contains("gpupart_gpu_xid_errors_total{gpu=\"1\",xid=\"43\"} 1"), "{text}");
    r.metrics.health().show(&r.health.snapshot(), 2);
    let text = r.metrics.render();
    assert!(text.contains("gpupart_gpu_healthy{gpu=\"1\"} 0") && text.contains("gpupart_gpu_healthy{gpu=\"0\"} 1"));
}

#[test]
fn the_operator_recovers_a_gpu_in_the_file_and_the_watch_sees_it() {
    let mut r = rig();
    r.backend.events.lock().unwrap().extend([xid(0, 79), xid(1, 79)]);
    step(&mut r);
    step(&mut r);
    let mut book = read_file(&r.file).unwrap();
    book.recover(0);
    write_file(&r.file, &book).unwrap();
    let back = step(&mut r);
    assert!(matches!(&back[..], [Change::Recovered { gpus, .. }] if gpus == &[0]), "{back:?}");
    assert!(!r.health.is_unhealthy(0) && r.health.is_unhealthy(1));
    assert_eq!(r.health.recover(&[0, 1]), vec![1], "only what was unhealthy");
    assert!(read_file(&r.file).unwrap().unhealthy().is_empty());
}

#[test]
fn a_lost_gpu_is_fenced_and_comes_back_when_it_answers_again() {
    let mut r = rig();
    r.backend.lost.lock().unwrap().insert(1);
    r.backend.events.lock().unwrap().push_back(Err(lost(0)));
    let fenced = step(&mut r);
    assert!(matches!(&fenced[..], [Change::Fenced { gpu: 1, record }] if record.reason == "GPU is lost"), "{fenced:?}");
    assert_eq!(step(&mut r), vec![], "still lost");
    r.backend.lost.lock().unwrap().clear();
    let back = step(&mut r);
    assert!(
        matches!(&back[..], [Change::Recovered { gpus, why }] if gpus == &[1] && why.contains("reset")),
        "{back:?}"
    );
}

#[test]
fn a_failed_wait_is_counted_and_backs_off_until_a_wait_succeeds() {
    let mut r = rig();
    let other = || Err(BackendError::call(0, "nvmlEventSetWait_v2", 999, ""));
    r.backend.events.lock().unwrap().extend([other(), other(), xid(0, 79)]);
    assert_eq!(step(&mut r), vec![]);
    assert_eq!(r.watcher.pause(), Duration::from_secs(1));
    step(&mut r);
    assert_eq!(r.watcher.pause(), Duration::from_secs(2));
    assert_eq!(step(&mut r).len(), 1, "the watch goes on after failures");
    assert_eq!(r.watcher.pause(), Duration::ZERO);
    assert!(r.metrics.render().contains("gpupart_gpu_event_watch_errors_total 2"));
}

#[test]
fn a_damaged_record_starts_empty_and_is_written_again_at_the_next_fault() {
    let mut r = rig();
    std::fs::create_dir_all(r.file.parent().unwrap()).unwrap();
    std::fs::write(&r.file, "{not json").unwrap();
    assert!(read_file(&r.file).unwrap_err().contains(&r.file.display().to_string()));
    r.health = Arc::new(GpuHealth::load(&r.file, XidPolicy::default()));
    r.watcher = Watcher::new(r.backend.clone(), r.health.clone(), r.metrics.clone());
    assert!(r.health.snapshot().unhealthy().is_empty());
    r.backend.events.lock().unwrap().push_back(xid(0, 79));
    step(&mut r);
    assert!(read_file(&r.file).unwrap().is_unhealthy(0));
}

#[test]
fn a_lost_gpu_is_observed_as_last_seen_and_one_never_seen_is_the_error() {
    let inner = Arc::new(Scripted::default());
    let keeping = super::keep_lost::KeepingLost::new(inner.clone());
    let before = keeping.observe_all().unwrap();
    inner.lost.lock().unwrap().insert(1);
    assert_eq!(keeping.observe_all().unwrap(), before, "GPU 1 as last seen");
    assert!(inner.observe(1).is_err(), "the inner backend says it is lost");
    let fresh = super::keep_lost::KeepingLost::new(inner.clone());
    let e = fresh.observe(1).unwrap_err();
    assert!(e.to_string().contains("NVML_ERROR_GPU_IS_LOST"), "{e}");
    assert!(fresh.observe(0).is_ok());
}
