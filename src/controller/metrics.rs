//! The controller's Prometheus metrics: decisions by kind, pods unblocked, pending GPU pods by
//! resource, time from Pending to the layout applied, reclaimed nodes, cluster fragmentation and
//! leadership.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

type Labels = Vec<(String, String)>;
type F64 = Gauge<f64, AtomicU64>;

/// Every family of the controller.
pub struct ControllerMetrics {
    registry: Registry,
    lock: Mutex<()>,
    decisions: Family<Labels, Counter>,
    unblocked: Counter,
    pending: Family<Labels, F64>,
    not_served: F64,
    to_applied: Histogram,
    reclaimed: Counter,
    fragmentation: F64,
    leader: F64,
    last_batch: F64,
    paused: F64,
    defrag_evictions: Family<Labels, Counter>,
    defrag_plans: Family<Labels, Counter>,
    defrag_served: Counter,
    events_posted: Family<Labels, Counter>,
    events_dropped: Counter,
    batches: Counter,
    defrag_wait: Histogram,
}

/// Outcomes of an eviction (`gpupart_controller_defrag_evictions_total`).
pub const EVICTION_OUTCOMES: &[&str] = &["evicted", "gone", "blocked", "refused", "error"];
/// Outcomes of a defragmentation plan (`gpupart_controller_defrag_plans_total`).
pub const PLAN_OUTCOMES: &[&str] =
    &["started", "dry_run", "served", "served_elsewhere", "expired", "blocked", "refused", "abandoned", "no_plan"];

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Registers every family (`gpupart_controller_…`).
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("gpupart_controller");
        let decisions = Family::<Labels, Counter>::default();
        r.register(
            "decisions",
            "Node changes decided, by kind (repartition, dedicate, reclaim, reserve) and mode",
            decisions.clone(),
        );
        for kind in ["repartition", "dedicate", "reclaim", "reserve"] {
            for mode in ["applied", "dry_run"] {
                let _ = decisions.get_or_create(&vec![("kind".into(), kind.into()), ("mode".into(), mode.into())]);
            }
        }
        let unblocked = Counter::default();
        r.register("pods_unblocked", "Pending GPU pods a decision made schedulable", unblocked.clone());
        let pending = Family::<Labels, F64>::default();
        r.register("pending_gpu_pods", "Unschedulable GPU pods by resource", pending.clone());
        let not_served = F64::default();
        r.register(
            "unserved_gpu_pods",
            "Unschedulable GPU pods no change serves in the last batch",
            not_served.clone(),
        );
        let to_applied = Histogram::new([1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]);
        r.register(
            "pending_to_applied_seconds",
            "From a pod becoming unschedulable to the layout that serves it being applied",
            to_applied.clone(),
        );
        let reclaimed = Counter::default();
        r.register("reclaimed_nodes", "Dedicated nodes returned to the shared pool", reclaimed.clone());
        let fragmentation = F64::default();
        r.register(
            "cluster_fragmentation_ratio",
            "Σ fragmented / Σ unallocated GPU-equivalents over the agents' nodes",
            fragmentation.clone(),
        );
        let leader = F64::default();
        r.register("leader", "1 while this replica holds the Lease and acts", leader.clone());
        let last_batch = F64::default();
        r.register("last_batch_timestamp_seconds", "Unix time of the last decision batch", last_batch.clone());
        let paused = F64::default();
        r.register("paused", "1 while the off switch on the layouts ConfigMap is set", paused.clone());
        let defrag_evictions = Family::<Labels, Counter>::default();
        r.register(
            "defrag_evictions",
            "Evictions asked to make room for a waiting pod, by outcome (evicted, gone, blocked by a budget, refused, error)",
            defrag_evictions.clone(),
        );
        for o in EVICTION_OUTCOMES {
            let _ = defrag_evictions.get_or_create(&vec![("outcome".into(), (*o).into())]);
        }
        let defrag_plans = Family::<Labels, Counter>::default();
        r.register(
            "defrag_plans",
            "Defragmentation plans by outcome (started, dry_run, served, served_elsewhere, expired, blocked, refused, abandoned, no_plan)",
            defrag_plans.clone(),
        );
        for o in PLAN_OUTCOMES {
            let _ = defrag_plans.get_or_create(&vec![("outcome".into(), (*o).into())]);
        }
        let defrag_served = Counter::default();
        r.register("defrag_pods_served", "Waiting pods bound into the room a plan made", defrag_served.clone());
        let defrag_wait = Histogram::new([10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]);
        r.register(
            "defrag_wait_seconds",
            "From a pod becoming unschedulable to its being bound into the room a plan made",
            defrag_wait.clone(),
        );
        let events_posted = Family::<Labels, Counter>::default();
        r.register("events_posted", "Events posted, by outcome (ok, error)", events_posted.clone());
        for o in ["ok", "error"] {
            let _ = events_posted.get_or_create(&vec![("outcome".into(), o.into())]);
        }
        let events_dropped = Counter::default();
        r.register(
            "events_dropped",
            "Events not posted: over the per-batch cap or the queue's capacity, or queued when the replica stopped leading (each object and reason once until it is queued)",
            events_dropped.clone(),
        );
        let batches = Counter::default();
        r.register("batches", "Decision batches this replica ran while leading", batches.clone());
        Self {
            registry: r,
            lock: Mutex::new(()),
            decisions,
            unblocked,
            pending,
            not_served,
            to_applied,
            reclaimed,
            fragmentation,
            leader,
            last_batch,
            paused,
            defrag_evictions,
            defrag_plans,
            defrag_served,
            defrag_wait,
            events_posted,
            events_dropped,
            batches,
        }
    }

    /// Counts an Event posted (or whose post failed).
    pub fn event_posted(&self, ok: bool) {
        let _g = self.guard();
        let outcome = if ok { "ok" } else { "error" };
        self.events_posted.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
    }

    /// Counts Events dropped.
    pub fn events_dropped(&self, n: u64) {
        let _g = self.guard();
        self.events_dropped.inc_by(n);
    }

    /// Counts an eviction's outcome.
    pub fn eviction(&self, outcome: &str) {
        let _g = self.guard();
        self.defrag_evictions.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
    }

    /// Counts a plan's outcome; a served one also records how long its pod waited.
    pub fn plan(&self, outcome: &str, waited: Option<f64>) {
        let _g = self.guard();
        self.defrag_plans.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
        if let Some(w) = waited {
            self.defrag_served.inc();
            self.defrag_wait.observe(w);
        }
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a decision carried out (or reported, in dry-run) and the pods it unblocks.
    pub fn decided(&self, kind: &str, dry_run: bool, unblocked: usize) {
        let _g = self.guard();
        let mode = if dry_run { "dry_run" } else { "applied" };
        self.decisions.get_or_create(&vec![("kind".into(), kind.into()), ("mode".into(), mode.into())]).inc();
        if !dry_run {
            self.unblocked.inc_by(unblocked as u64);
            if kind == "reclaim" {
                self.reclaimed.inc();
            }
        }
    }

    /// The batch's figures: pending pods by resource name, unserved pods, fragmentation.
    pub fn batch(&self, pending: &BTreeMap<String, u32>, not_served: usize, fragmentation: Option<f64>, now: f64) {
        let _g = self.guard();
        self.batches.inc();
        self.pending.clear();
        for (r, n) in pending {
            self.pending.get_or_create(&vec![("resource".into(), r.clone())]).set(f64::from(*n));
        }
        self.not_served.set(not_served as f64);
        if let Some(f) = fragmentation {
            self.fragmentation.set(f);
        }
        self.last_batch.set(now);
    }

    /// Records the wait of a pod whose layout is now applied.
    pub fn applied_after(&self, seconds: f64) {
        let _g = self.guard();
        self.to_applied.observe(seconds);
    }

    /// Leadership and the off switch.
    pub fn standing(&self, leader: bool, paused: bool) {
        let _g = self.guard();
        self.leader.set(if leader { 1.0 } else { 0.0 });
        self.paused.set(if paused { 1.0 } else { 0.0 });
    }
}

impl crate::http::Exposition for ControllerMetrics {
    fn render(&self) -> String {
        let _g = self.guard();
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out = "# EOF\n".into();
        }
        out
    }
}
