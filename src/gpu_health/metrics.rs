//! GPU health metrics (docs/metrics.md): whether each GPU is healthy, the XID and ECC events
//! seen by GPU, and failures of the event watch.

use crate::health::{EventKind, HealthBook};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;

/// The families, registered under the agent's `gpupart_` prefix.
pub struct HealthMetrics {
    healthy: Family<Labels, Gauge<f64, AtomicU64>>,
    xids: Family<Labels, Counter>,
    ecc: Family<Labels, Counter>,
    watch_errors: Counter,
}

fn gpu(g: u32) -> (String, String) {
    ("gpu".to_string(), g.to_string())
}

impl HealthMetrics {
    /// Registers the families.
    pub fn register(r: &mut Registry) -> Self {
        let healthy = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        r.register("gpu_healthy", "1 while the GPU is healthy, 0 once an NVML event fenced it", healthy.clone());
        let xids = Family::<Labels, Counter>::default();
        r.register("gpu_xid_errors", "XID critical errors NVML reported, by GPU and XID", xids.clone());
        let ecc = Family::<Labels, Counter>::default();
        r.register("gpu_ecc_errors", "ECC error events NVML reported, by GPU and type", ecc.clone());
        let watch_errors = Counter::default();
        r.register(
            "gpu_event_watch_errors",
            "Failed waits for NVML events (the watch registers again)",
            watch_errors.clone(),
        );
        Self { healthy, xids, ecc, watch_errors }
    }

    /// Sets `gpupart_gpu_healthy` for GPUs `0..count` from the record.
    pub fn show(&self, book: &HealthBook, count: u32) {
        for g in 0..count {
            self.healthy.get_or_create(&vec![gpu(g)]).set(if book.is_unhealthy(g) { 0.0 } else { 1.0 });
        }
    }

    /// Counts one event.
    pub fn event(&self, g: u32, kind: EventKind) {
        match kind {
            EventKind::Xid(x) => self.xids.get_or_create(&vec![gpu(g), ("xid".into(), x.to_string())]).inc(),
            EventKind::DoubleBitEcc => {
                self.ecc.get_or_create(&vec![gpu(g), ("type".into(), "double_bit".into())]).inc()
            }
            EventKind::SingleBitEcc => {
                self.ecc.get_or_create(&vec![gpu(g), ("type".into(), "single_bit".into())]).inc()
            }
            EventKind::GpuLost => 0,
        };
    }

    /// Counts one failed wait.
    pub fn watch_failed(&self) {
        self.watch_errors.inc();
    }
}
