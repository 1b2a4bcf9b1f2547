//! The DRA plugin's metrics (docs/metrics.md): prepared claims, Prepare and Unprepare latency,
//! failures by reason, published devices and republishes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;

/// The families, registered under the agent's `gpupart_` prefix.
pub struct DraMetrics {
    prepared: Gauge<f64, AtomicU64>,
    published: Gauge<f64, AtomicU64>,
    republishes: Counter,
    latency: Family<Labels, Histogram>,
    failures: Family<Labels, Counter>,
}

impl DraMetrics {
    /// Registers the families.
    pub fn register(r: &mut Registry) -> Self {
        let prepared = Gauge::<f64, AtomicU64>::default();
        r.register("dra_prepared_claims", "ResourceClaims prepared on this node", prepared.clone());
        let published = Gauge::<f64, AtomicU64>::default();
        r.register("dra_published_devices", "Devices in this node's ResourceSlices", published.clone());
        let republishes = Counter::default();
        r.register("dra_republishes", "Times this node's ResourceSlices were written", republishes.clone());
        let latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
        });
        r.register(
            "dra_operation_duration_seconds",
            "Prepare and Unprepare latency per claim, by operation",
            latency.clone(),
        );
        let failures = Family::<Labels, Counter>::default();
        r.register(
            "dra_failures",
            "Claims that failed to prepare or unprepare, by operation and reason",
            failures.clone(),
        );
        Self { prepared, published, republishes, latency, failures }
    }

    /// Records one claim's operation (`prepare` | `unprepare`) and, when it failed, its reason.
    pub fn operation(&self, op: &str, seconds: f64, failed: Option<&str>) {
        self.latency.get_or_create(&vec![("operation".into(), op.into())]).observe(seconds);
        if let Some(reason) = failed {
            self.failures.get_or_create(&vec![("operation".into(), op.into()), ("reason".into(), reason.into())]).inc();
        }
    }

    /// Records a publication.
    pub fn published(&self, devices: usize, prepared: usize) {
        self.published.set(devices as f64);
        self.prepared.set(prepared as f64);
        self.republishes.inc();
    }
}
