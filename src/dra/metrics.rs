//! The DRA plugin's metrics (docs/metrics.md): prepared claims, Prepare and Unprepare latency,
//! failures by reason, published devices and republishes, and per GPU its MPS shares, the memory
//! they hold and whether their daemon runs.

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
    mps_shares: Family<Labels, Gauge<f64, AtomicU64>>,
    mps_memory: Family<Labels, Gauge<f64, AtomicU64>>,
    mps_daemon_up: Family<Labels, Gauge<f64, AtomicU64>>,
}

/// One GPU's MPS shares as the plugin last saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuShares {
    /// Shares prepared.
    pub shares: u32,
    /// Device memory their clients may pin, bytes.
    pub memory_bytes: u64,
    /// Whether the GPU's MPS daemon runs (its pid is alive, or it was just started again).
    pub daemon_up: bool,
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
        let gauges = |r: &mut Registry, name: &str, help: &str| {
            let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            r.register(name, help, f.clone());
            f
        };
        let mps_shares = gauges(r, "dra_mps_shares", "MPS shares prepared on each GPU");
        let mps_memory =
            gauges(r, "dra_mps_memory_bytes", "Device memory the MPS shares of each GPU may pin, in bytes");
        let mps_daemon_up = gauges(
            r,
            "dra_mps_daemon_up",
            "1 while the MPS daemon serving a GPU's shares runs, else 0 (it is started again)",
        );
        Self { prepared, published, republishes, latency, failures, mps_shares, mps_memory, mps_daemon_up }
    }

    /// Records each GPU's MPS shares (GPUs without shares read 0).
    pub fn shares(&self, gpus: &std::collections::BTreeMap<u32, GpuShares>) {
        self.mps_shares.clear();
        self.mps_memory.clear();
        self.mps_daemon_up.clear();
        for (gpu, s) in gpus {
            let l = vec![("gpu".to_string(), gpu.to_string())];
            self.mps_shares.get_or_create(&l).set(f64::from(s.shares));
            self.mps_memory.get_or_create(&l).set(s.memory_bytes as f64);
            self.mps_daemon_up.get_or_create(&l).set(if s.daemon_up { 1.0 } else { 0.0 });
        }
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
