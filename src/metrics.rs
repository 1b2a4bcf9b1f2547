//! Prometheus metrics (OpenMetrics text via prometheus-client), following the proposal in
//! shared/reference/fragmentation-and-metrics.md §7 and Prometheus naming rules. Gauges are a
//! snapshot refreshed after every change and periodically — a scrape only renders memory, it never
//! waits on NVML — and series of instances or profiles that no longer exist disappear. Counters and
//! the duration histogram come from [`Instrumented`], a backend wrapper that times every change.

use crate::backend::{BackendError, GpuBackend, ModeActivation};
use crate::frag::{node_frag, node_gpu_frags, Workload};
use crate::mig::Placement;
use crate::mps::daemon::DaemonStatus;
use crate::observed::GpuState;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

type Labels = Vec<(String, String)>;
type G = Family<Labels, Gauge<f64, AtomicU64>>;

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Every metric family of the agent.
pub struct Metrics {
    registry: Registry,
    lock: Mutex<()>,
    gpu_info: G,
    partition_mode: G,
    mig_mode_pending: G,
    instance_info: G,
    memory_slices: G,
    compute_slices: G,
    creatable: G,
    largest_slices: G,
    largest_info: G,
    stranded: G,
    unusable: G,
    gpu_frag_ratio: G,
    workload: G,
    node: NodeGauges,
    collect: CollectGauges,
    agent: Option<AgentGauges>,
    mps_up: G,
    mps_clients: G,
    mps_slots: G,
    mps_thread_pct: G,
    mps_mem_limit: G,
    mps_restarts: Family<Labels, Counter>,
    pod_resources_up: Option<Gauge<f64, AtomicU64>>,
    reconfigurations: Family<Labels, Counter>,
    durations: Family<Labels, Histogram>,
    nvml_errors: Family<Labels, Counter>,
    dra: Option<crate::dra::metrics::DraMetrics>,
    health: crate::gpu_health::metrics::HealthMetrics,
}

/// Which process the families are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The label-driven agent; `pod_resources` in Kubernetes mode.
    Label { pod_resources: bool },
    /// `gpupart agent --dra`.
    Dra,
}

/// The node's fragmentation figures, one metric each (docs/metrics.md).
struct NodeGauges {
    unallocated: Gauge<f64, AtomicU64>,
    fragmented: Gauge<f64, AtomicU64>,
    ratio: Gauge<f64, AtomicU64>,
    whole_free: Gauge<f64, AtomicU64>,
    idle_without_mig: Gauge<f64, AtomicU64>,
}

/// The last metrics collection.
struct CollectGauges {
    success: Gauge<f64, AtomicU64>,
    duration: Gauge<f64, AtomicU64>,
    timestamp: Gauge<f64, AtomicU64>,
}

/// The agent's state machine: what "node stuck in failed" alerts read.
struct AgentGauges {
    state: G,
    attempts: Gauge<f64, AtomicU64>,
    failures: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
}

/// Registers one unlabelled gauge.
fn gauge(r: &mut Registry, name: &str, help: &str) -> Gauge<f64, AtomicU64> {
    let g = Gauge::<f64, AtomicU64>::default();
    r.register(name, help, g.clone());
    g
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl crate::http::Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

impl Metrics {
    /// Registers every family of the label-driven agent in Kubernetes mode, for real GPUs.
    pub fn new() -> Self {
        Self::for_agent(false, true)
    }

    /// Registers the label-driven agent's families; `gpupart_build_info` carries
    /// `simulated="true"` when the GPUs are the simulator's; `pod_resources`: the agent reads the
    /// kubelet's PodResources (Kubernetes mode), so `gpupart_pod_resources_up` is exported.
    pub fn for_agent(simulated: bool, pod_resources: bool) -> Self {
        Self::build(simulated, Mode::Label { pod_resources })
    }

    /// Registers the DRA plugin's families (`gpupart agent --dra`): the GPU, fragmentation,
    /// health and DRA ones; not the label agent's state machine nor PodResources, which it has not.
    pub fn for_dra(simulated: bool) -> Self {
        Self::build(simulated, Mode::Dra)
    }

    fn build(simulated: bool, mode: Mode) -> Self {
        let dra = mode == Mode::Dra;
        let mut r = Registry::with_prefix("gpupart");
        let info = Info::new(vec![
            ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("simulated".to_string(), simulated.to_string()),
        ]);
        r.register("build", "gpupart build information", info);
        let g = |r: &mut Registry, name: &str, help: &str| {
            let f = G::default();
            r.register(name, help, f.clone());
            f
        };
        let gpu_info = g(&mut r, "gpu_info", "GPU inventory; UUID duplicates uuid for dcgm-exporter joins (value 1)");
        let partition_mode = g(&mut r, "gpu_partition_mode", "Current partition mode of each GPU (value 1)");
        let mig_mode_pending =
            g(&mut r, "mig_mode_pending", "1 when the pending MIG mode differs from the current one");
        let instance_info = g(&mut r, "mig_instance_info", "One series per MIG device with its placement (value 1)");
        let memory_slices = g(&mut r, "mig_memory_slices", "MIG memory slices by state; the sum is the capacity");
        let compute_slices = g(&mut r, "mig_compute_slices", "MIG compute slices by state; the sum is the capacity");
        let creatable = g(&mut r, "mig_profile_creatable", "Instances of a profile that can be created now");
        let largest_slices =
            g(&mut r, "mig_largest_creatable_slices", "Memory slices of the largest creatable profile");
        let largest_info =
            g(&mut r, "mig_largest_creatable_profile_info", "Name of the largest creatable profile (value 1)");
        let stranded = g(&mut r, "mig_stranded_slices", "Free memory slices a profile cannot use");
        let unusable =
            g(&mut r, "mig_unusable_free_ratio", "Stranded / free memory slices per profile (1 when none is free)");
        let gpu_frag_ratio = g(
            &mut r,
            "gpu_fragmentation_ratio",
            "Expected fragmentation / free memory slices against the workload mix",
        );
        let workload =
            g(&mut r, "target_workload_weight", "Weight of each profile in the workload mix used for fragmentation");
        let node = NodeGauges {
            unallocated: gauge(&mut r, "node_unallocated_gpus", "Free memory slices of the node, in GPUs"),
            fragmented: gauge(
                &mut r,
                "node_fragmented_gpus",
                "Free memory slices expected unusable against the workload mix, in GPUs",
            ),
            ratio: gauge(
                &mut r,
                "node_fragmentation_ratio",
                "node_fragmented_gpus / node_unallocated_gpus (0 when none is free)",
            ),
            whole_free: gauge(&mut r, "node_whole_free_gpus", "GPUs with nothing on them"),
            idle_without_mig: gauge(&mut r, "node_idle_without_mig_gpus", "GPUs without MIG that no process uses"),
        };
        let collect = CollectGauges {
            success: gauge(&mut r, "last_collect_success", "1 when the last metrics collection read every GPU, else 0"),
            duration: gauge(&mut r, "last_collect_duration_seconds", "Duration of the last metrics collection"),
            timestamp: gauge(&mut r, "last_collect_timestamp_seconds", "Unix time of the last successful collection"),
        };
        let agent = matches!(mode, Mode::Label { .. }).then(|| AgentGauges {
            state: g(&mut r, "agent_state", "The agent's state (one series per state, 1 for the current one)"),
            attempts: gauge(
                &mut r,
                "agent_attempts",
                "Consecutive failed attempts at the requested layout (0 after success)",
            ),
            failures: Family::<Labels, Counter>::default(),
            last_success: gauge(
                &mut r,
                "agent_last_success_timestamp_seconds",
                "Unix time the requested layout was last found applied (0 before the first success)",
            ),
        });
        if let Some(agent) = &agent {
            r.register("agent_failures", "Failed reconciles by reason category", agent.failures.clone());
            for f in crate::agent::status::Failure::ALL {
                let _ = agent.failures.get_or_create(&l(&[("reason", f.as_str())]));
            }
        }
        let mps_up = g(&mut r, "mps_daemon_up", "1 while the GPU's MPS control daemon answers its health round trip");
        let mps_clients = g(&mut r, "mps_clients", "Clients connected to the GPU's MPS server");
        let mps_slots = g(&mut r, "mps_slots", "MPS client slots by state (total; in_use = connected clients)");
        let mps_thread_pct =
            g(&mut r, "mps_slot_active_thread_percentage", "Default active thread percentage of each MPS client");
        let mps_mem_limit =
            g(&mut r, "mps_slot_pinned_memory_limit_bytes", "Default pinned device memory limit of each MPS client");
        let mps_restarts = Family::<Labels, Counter>::default();
        r.register(
            "mps_daemon_restarts",
            "MPS daemons restarted after they died or hung, by result",
            mps_restarts.clone(),
        );
        let pod_resources_up = matches!(mode, Mode::Label { pod_resources: true }).then(|| {
            let g = Gauge::<f64, AtomicU64>::default();
            r.register(
                "pod_resources_up",
                "1 while the kubelet's PodResources socket answers (allocations count as busy), 0 when it does not",
                g.clone(),
            );
            g
        });
        let reconfigurations = Family::<Labels, Counter>::default();
        r.register("reconfigurations", "GPU changes by kind and result", reconfigurations.clone());
        let durations = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
        });
        r.register("reconfiguration_duration_seconds", "Duration of GPU changes by kind and result", durations.clone());
        let nvml_errors = Family::<Labels, Counter>::default();
        r.register(
            "nvml_errors",
            "Failed NVML calls by function and return code (its NVML_ERROR_* name)",
            nvml_errors.clone(),
        );
        let dra = dra.then(|| crate::dra::metrics::DraMetrics::register(&mut r));
        let health = crate::gpu_health::metrics::HealthMetrics::register(&mut r);
        Self {
            registry: r,
            lock: Mutex::new(()),
            gpu_info,
            partition_mode,
            mig_mode_pending,
            instance_info,
            memory_slices,
            compute_slices,
            creatable,
            largest_slices,
            largest_info,
            stranded,
            unusable,
            gpu_frag_ratio,
            workload,
            node,
            collect,
            agent,
            mps_up,
            mps_clients,
            mps_slots,
            mps_thread_pct,
            mps_mem_limit,
            mps_restarts,
            pod_resources_up,
            reconfigurations,
            durations,
            nvml_errors,
            dra,
            health,
        }
    }

    /// The GPU health families.
    pub fn health(&self) -> &crate::gpu_health::metrics::HealthMetrics {
        &self.health
    }

    /// The DRA plugin's families (registered by [`Metrics::for_dra`] only).
    pub fn dra(&self) -> Option<&crate::dra::metrics::DraMetrics> {
        self.dra.as_ref()
    }

    /// Renders the OpenMetrics text (a consistent view: never half of an update).
    pub fn render(&self) -> String {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out = "# EOF\n".into();
        }
        out
    }

    /// Renders the classic Prometheus text format (0.0.4): see [`to_text`].
    pub fn render_text(&self) -> String {
        crate::http::to_text(&self.render())
    }

    /// Records a failed collection (the last snapshot stays).
    pub fn collect_failed(&self, duration: f64) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.collect.success.set(0.0);
        self.collect.duration.set(duration);
    }

    /// Records the agent's state as published: the state series, the attempts, a failure by its
    /// category, and the time of a success.
    pub fn agent_status(&self, st: &crate::agent::status::AgentStatus) {
        use crate::agent::status::Phase;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let Some(agent) = &self.agent else { return };
        for p in [Phase::Idle, Phase::Pending, Phase::Rebooting, Phase::Success, Phase::Failed] {
            let on = if p == st.state { 1.0 } else { 0.0 };
            agent.state.get_or_create(&l(&[("state", p.as_str())])).set(on);
        }
        agent.attempts.set(f64::from(st.attempts));
        match st.state {
            Phase::Failed => {
                let reason = st.failure.map_or("other", |f| f.as_str());
                agent.failures.get_or_create(&l(&[("reason", reason)])).inc();
            }
            Phase::Success => {
                agent.last_success.set(unix_now());
            }
            _ => {}
        }
    }

    /// Whether the last PodResources read succeeded.
    pub fn pod_resources_readable(&self, ok: bool) {
        if let Some(g) = &self.pod_resources_up {
            g.set(if ok { 1.0 } else { 0.0 });
        }
    }

    /// Counts one restart of an MPS daemon.
    pub fn mps_restarted(&self, uuid: &str, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.mps_restarts.get_or_create(&l(&[("uuid", uuid), ("result", result)])).inc();
    }

    /// Replaces every gauge with the figures of `states` (no MPS daemons).
    pub fn update(&self, states: &[GpuState], workload: Option<&Workload>, duration: f64) {
        self.update_with_mps(states, &[], workload, duration);
    }

    /// Replaces every gauge with the figures of `states` and their MPS daemons (`daemons` in
    /// `states` order, `None` where none runs).
    pub fn update_with_mps(
        &self,
        states: &[GpuState],
        daemons: &[Option<DaemonStatus>],
        workload: Option<&Workload>,
        duration: f64,
    ) {
        let frags = node_gpu_frags(states, daemons, workload);
        let node = node_frag(&frags);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        for f in [
            &self.gpu_info,
            &self.partition_mode,
            &self.mig_mode_pending,
            &self.instance_info,
            &self.memory_slices,
            &self.compute_slices,
            &self.creatable,
            &self.largest_slices,
            &self.largest_info,
            &self.stranded,
            &self.unusable,
            &self.gpu_frag_ratio,
            &self.workload,
            &self.mps_up,
            &self.mps_clients,
            &self.mps_slots,
            &self.mps_thread_pct,
            &self.mps_mem_limit,
        ] {
            f.clear();
        }
        for (s, d) in states.iter().zip(daemons) {
            if let Some(d) = d {
                self.set_mps(s, d);
            }
        }
        for (s, f) in states.iter().zip(&frags) {
            let uuid = s.info.uuid.as_str();
            let index = s.info.index.to_string();
            self.gpu_info
                .get_or_create(&l(&[
                    ("uuid", uuid),
                    ("gpu", &index),
                    ("model", &s.info.model),
                    ("name", &s.info.name),
                    ("UUID", uuid),
                ]))
                .set(1.0);
            let mode = f.partition_mode();
            self.partition_mode.get_or_create(&l(&[("uuid", uuid), ("mode", mode)])).set(1.0);
            if !s.info.mig_capable {
                continue;
            }
            let pending = s.mig_mode.current != s.mig_mode.pending;
            self.mig_mode_pending.get_or_create(&l(&[("uuid", uuid)])).set(if pending { 1.0 } else { 0.0 });
            if !f.mig_enabled {
                continue;
            }
            for gi in &s.instances {
                let table = &s.profiles;
                for ci in &gi.cis {
                    let profile = table
                        .by_id(gi.profile_id)
                        .map_or_else(String::new, |p| p.device_name(ci.profile_id).to_string());
                    let Placement { start, size } = gi.placement;
                    self.instance_info
                        .get_or_create(&l(&[
                            ("uuid", uuid),
                            ("mig_uuid", &ci.uuid),
                            ("gpu_instance_id", &gi.id.to_string()),
                            ("compute_instance_id", &ci.id.to_string()),
                            ("profile", &profile),
                            ("placement_start", &start.to_string()),
                            ("placement_size", &size.to_string()),
                        ]))
                        .set(1.0);
                }
            }
            let used_mem = f.memory_slices - f.free_memory_slices;
            let used_cmp = f.compute_slices - f.free_compute_slices;
            for (fam, used, free) in [
                (&self.memory_slices, used_mem, f.free_memory_slices),
                (&self.compute_slices, used_cmp, f.free_compute_slices),
            ] {
                fam.get_or_create(&l(&[("uuid", uuid), ("state", "used")])).set(f64::from(used));
                fam.get_or_create(&l(&[("uuid", uuid), ("state", "free")])).set(f64::from(free));
            }
            for p in &f.profiles {
                let labels = l(&[("uuid", uuid), ("profile", &p.profile)]);
                self.creatable.get_or_create(&labels).set(f64::from(p.creatable));
                self.stranded.get_or_create(&labels).set(f64::from(p.stranded_slices));
                self.unusable.get_or_create(&labels).set(p.unusable_ratio);
            }
            self.largest_slices.get_or_create(&l(&[("uuid", uuid)])).set(f64::from(f.largest_creatable_slices));
            let largest = f.largest_creatable.as_deref().unwrap_or("none");
            self.largest_info.get_or_create(&l(&[("uuid", uuid), ("profile", largest)])).set(1.0);
            self.gpu_frag_ratio.get_or_create(&l(&[("uuid", uuid)])).set(f.expected_fragmentation_ratio);
            for (p, w) in &f.workload {
                self.workload.get_or_create(&l(&[("uuid", uuid), ("profile", p)])).set(*w);
            }
        }
        self.node.unallocated.set(node.unallocated_gpus);
        self.node.fragmented.set(node.fragmented_gpus);
        self.node.ratio.set(node.fragmentation_ratio);
        self.node.whole_free.set(node.whole_free_gpus as f64);
        self.node.idle_without_mig.set(node.idle_without_mig_gpus as f64);
        self.collect.success.set(1.0);
        self.collect.duration.set(duration);
        self.collect.timestamp.set(unix_now());
    }

    /// One GPU's MPS gauges (under the update lock).
    fn set_mps(&self, s: &GpuState, d: &DaemonStatus) {
        let uuid = s.info.uuid.as_str();
        let up = if d.up { 1.0 } else { 0.0 };
        self.mps_up.get_or_create(&l(&[("uuid", uuid)])).set(up);
        self.mps_clients.get_or_create(&l(&[("uuid", uuid)])).set(d.clients.len() as f64);
        let allocated = crate::frag::allocated_slots(s);
        let Some(s) = d.settings else { return };
        let in_use = d.clients.len().min(s.replicas as usize) as f64;
        self.mps_slots.get_or_create(&l(&[("uuid", uuid), ("state", "total")])).set(f64::from(s.replicas));
        self.mps_slots.get_or_create(&l(&[("uuid", uuid), ("state", "in_use")])).set(in_use);
        self.mps_slots.get_or_create(&l(&[("uuid", uuid), ("state", "allocated")])).set(f64::from(allocated));
        if let Some(p) = s.active_thread_percentage {
            self.mps_thread_pct.get_or_create(&l(&[("uuid", uuid)])).set(f64::from(p));
        }
        if let Some(m) = s.pinned_memory_limit_mib {
            self.mps_mem_limit.get_or_create(&l(&[("uuid", uuid)])).set((m * 1024 * 1024) as f64);
        }
    }

    fn record(&self, kind: &str, started: Instant, result: &Result<(), &BackendError>) {
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.reconfigurations.get_or_create(&l(&[("kind", kind), ("result", outcome)])).inc();
        self.durations
            .get_or_create(&l(&[("kind", kind), ("result", outcome)]))
            .observe(started.elapsed().as_secs_f64());
        if let Err(BackendError::Call { function, name, .. }) = result {
            self.nvml_errors.get_or_create(&l(&[("function", function), ("code", name)])).inc();
        }
    }
}

/// A backend wrapper that counts and times every change into [`Metrics`].
pub struct Instrumented {
    inner: Arc<dyn GpuBackend>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn GpuBackend>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn timed<T>(&self, kind: &str, f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
        let t = Instant::now();
        let r = f();
        self.metrics.record(kind, t, &r.as_ref().map(|_| ()));
        r
    }
}

impl GpuBackend for Instrumented {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn next_event(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Option<gpupart_node::health::GpuEvent>, gpupart_node::backend::BackendError> {
        self.inner.next_event(timeout)
    }
    fn serves_events(&self) -> bool {
        self.inner.serves_events()
    }
    fn is_simulated(&self) -> bool {
        self.inner.is_simulated()
    }
    fn gpu_count(&self) -> Result<u32, BackendError> {
        self.inner.gpu_count()
    }
    fn driver_version(&self) -> Result<String, BackendError> {
        self.inner.driver_version()
    }
    fn observe(&self, gpu: u32) -> Result<GpuState, BackendError> {
        self.inner.observe(gpu)
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<ModeActivation, BackendError> {
        self.timed("mig_mode", || self.inner.set_mig_mode(gpu, enabled))
    }
    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        self.timed("gpu_reset", || self.inner.reset_gpu(gpu))
    }
    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, placement: Placement) -> Result<u32, BackendError> {
        self.timed("gi_create", || self.inner.create_gpu_instance(gpu, profile_id, placement))
    }
    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: u32,
        ci_profile_id: u32,
        placement: Placement,
    ) -> Result<u32, BackendError> {
        self.timed("ci_create", || self.inner.create_compute_instance(gpu, gi, ci_profile_id, placement))
    }
    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.timed("ci_destroy", || self.inner.destroy_compute_instance(gpu, gi, ci))
    }
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.timed("gi_destroy", || self.inner.destroy_gpu_instance(gpu, gi))
    }
    fn set_compute_mode(&self, gpu: u32, mode: crate::observed::ComputeMode) -> Result<(), BackendError> {
        self.timed("compute_mode", || self.inner.set_compute_mode(gpu, mode))
    }
}
