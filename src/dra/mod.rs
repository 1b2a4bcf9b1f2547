//! `gpupart agent --dra` (docs/dra.md): the node agent as a DRA kubelet plugin. It publishes
//! every MIG placement and whole GPU this node can still give, in gpupart's order (the scheduler
//! hands devices out first-fit in that order), prepares a claim by creating exactly the allocated
//! placement, unprepares it when nothing uses it, and republishes whenever the occupancy
//! changes: on every Prepare and Unprepare and, with the claim watch, as soon as a claim is
//! allocated from this node's pool.

pub use gpupart_node::dra::{api_features, cdi, checkpoint, devices, driver, order, publish, slices};

pub mod api_check;
pub mod claims;
pub mod events;
pub mod metrics;
pub mod plugin;
pub mod publisher;
pub mod watch;

use crate::kubelet::dra_plugin::{RegistrationLog, Sockets};
use anyhow::Context;
use gpupart_node::backend::{GpuBackend, GpuOptions};
use gpupart_node::dra::driver::{Driver, DriverConfig};
use plugin::DraNode;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default `--driver-name`.
pub const DEFAULT_DRIVER: &str = "gpu.gpupart.io";
/// Default `--cdi-dir`.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// Default `--nvidia-caps-minors`.
pub const DEFAULT_MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";
/// Default `--dra-state-dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpupart/dra";

/// What the plugin is told (from `gpupart agent --dra`'s flags).
#[derive(Debug, Clone)]
pub struct DraOptions {
    /// The node (and pool) name.
    pub node_name: Option<String>,
    /// `--no-kube` was given (refused: the plugin needs the API).
    pub no_kube: bool,
    /// The DRA driver name.
    pub driver_name: String,
    /// The kubelet's plugin registry directory.
    pub kubelet_registry_dir: std::path::PathBuf,
    /// The kubelet's plugins directory.
    pub kubelet_plugins_dir: std::path::PathBuf,
    /// Where CDI specs go.
    pub cdi_dir: std::path::PathBuf,
    /// The MIG capability minors file.
    pub nvidia_caps_minors: std::path::PathBuf,
    /// Where the checkpoint lives.
    pub dra_state_dir: std::path::PathBuf,
    /// Watch ResourceClaims.
    pub watch_claims: bool,
    /// The node lock.
    pub lock_file: std::path::PathBuf,
    /// `/healthz`, `/readyz`, `/metrics`.
    pub metrics_addr: std::net::SocketAddr,
    /// HTTP connection limit.
    pub http_max_connections: u32,
    /// HTTP request timeout.
    pub http_timeout: Duration,
    /// Republish at least this often.
    pub resync_interval: Duration,
    /// Prefix of the node summary annotations.
    pub annotation_prefix: String,
    /// Shortest interval between two summary writes.
    pub annotation_min_interval: Duration,
    /// How MPS shares are asked for.
    pub mps_policy: gpupart_node::dra::publish::MpsPolicy,
    /// MIG-capable GPUs have an MPS device too.
    pub mps_on_mig: bool,
    /// Which XIDs are an application's (`--ignore-xids`).
    pub ignore_xids: gpupart_node::health::XidPolicy,
    /// The unhealthy taint's effect (`--health-taint-effect`).
    pub health_taint_effect: &'static str,
}

/// Makes `dir` if missing and checks a file can be written there; the error names `flag`.
fn writable_folder(flag: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let fail = |e: std::io::Error| anyhow::anyhow!("{flag} {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(".gpupart-write-check");
    std::fs::write(&probe, b"").map_err(fail)?;
    std::fs::remove_file(&probe).map_err(fail)
}

/// The MIG capability minors file Prepare reads, checked when a GPU is MIG-capable: it must list
/// an access minor for each such GPU. Simulated GPUs have no NVIDIA driver: when the file is
/// missing they get a simulated one in the state folder.
fn mig_minors_file(
    a: &DraOptions,
    states: &[gpupart_node::observed::GpuState],
    simulated: bool,
) -> anyhow::Result<std::path::PathBuf> {
    let mig: Vec<u32> = states.iter().filter(|s| s.info.mig_capable).map(|s| s.info.minor).collect();
    let path = &a.nvidia_caps_minors;
    if mig.is_empty() {
        return Ok(path.clone());
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if simulated && e.kind() == std::io::ErrorKind::NotFound => {
            let sim = a.dra_state_dir.join("simulated-mig-minors");
            std::fs::create_dir_all(&a.dra_state_dir)
                .with_context(|| format!("--dra-state-dir {}", a.dra_state_dir.display()))?;
            gpupart_node::fsutil::write_atomic(&sim, cdi::MigMinors::simulated(&mig).as_bytes())
                .with_context(|| format!("writing the simulated MIG capability minors {}", sim.display()))?;
            tracing::info!(
                missing = %path.display(),
                file = %sim.display(),
                "simulated GPUs have no NVIDIA driver: MIG devices get simulated capability minors"
            );
            return Ok(sim);
        }
        Err(e) => anyhow::bail!(
            "--nvidia-caps-minors {}: {e}; MIG devices are prepared with the access minors the NVIDIA driver lists there",
            path.display()
        ),
    };
    let minors = cdi::MigMinors::parse(&text);
    let lacking: Vec<String> = mig.iter().filter(|m| !minors.covers(**m)).map(u32::to_string).collect();
    if !lacking.is_empty() {
        anyhow::bail!(
            "--nvidia-caps-minors {}: no `gpu<N>/gi<M>/access <minor>` line for GPU minor {}; is it the NVIDIA driver's {DEFAULT_MIG_MINORS}?",
            path.display(),
            lacking.join(", ")
        );
    }
    Ok(path.clone())
}

/// The Node's uid, waiting while the API server does not answer (one line per outage, naming
/// the server); a Node that does not exist is an error.
async fn node_uid(client: &kube::Client, node: &str, server: &str) -> anyhow::Result<String> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let mut outage = crate::kube::outage::Outage::new("reading this node's Node");
    loop {
        match nodes.get_opt(node).await {
            Ok(Some(n)) => {
                outage.ok();
                return n.metadata.uid.with_context(|| format!("the Node {node} has no uid"));
            }
            Ok(None) => anyhow::bail!("{}", crate::kube::node::missing(node, server)),
            // The server answered: not allowed is a setup to fix, not an outage to wait out.
            Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => anyhow::bail!(
                "{server} refuses to let the plugin read Node {node} ({}): grant it the ClusterRole in deploy/dra/daemonset.yaml",
                e.message
            ),
            Err(e) => {
                let e = format!("{server}: {e}");
                tokio::time::sleep(outage.failed(&e)).await;
            }
        }
    }
}

/// Runs the DRA plugin until SIGTERM or SIGINT.
pub fn run(g: &GpuOptions, a: &DraOptions) -> anyhow::Result<ExitCode> {
    let node = a.node_name.clone().context("--dra needs the node name: --node-name or NODE_NAME (downward API)")?;
    if a.no_kube {
        anyhow::bail!("--dra publishes ResourceSlices and reads ResourceClaims through the Kubernetes API; it cannot run with --no-kube");
    }
    let _lock = crate::agent::lock::NodeLock::acquire(&a.lock_file)?;
    let raw: Arc<dyn GpuBackend> = Arc::from(gpupart_node::backend::open(g)?);
    let simulated = raw.is_simulated();
    let metrics = Arc::new(crate::metrics::Metrics::for_dra(simulated));
    let watched: Arc<dyn GpuBackend> = Arc::new(crate::metrics::Instrumented::new(raw, metrics.clone()));
    // The event watch sees a lost GPU as lost; publication and Prepare see it as last seen.
    let backend: Arc<dyn GpuBackend> = Arc::new(crate::gpu_health::keep_lost::KeepingLost::new(watched.clone()));
    let gpu_health = Arc::new(crate::gpu_health::GpuHealth::load(&g.health_file, a.ignore_xids.clone()));
    // The folders Prepare writes to, checked now rather than at the first claim.
    writable_folder("--cdi-dir", &a.cdi_dir)?;
    writable_folder("--dra-state-dir", &a.dra_state_dir)?;
    let states = backend.observe_all().map_err(|e| anyhow::anyhow!("reading the GPUs: {e}"))?;
    let cfg = DriverConfig {
        pool: node.clone(),
        cdi_dir: a.cdi_dir.clone(),
        mig_minors: mig_minors_file(a, &states, simulated)?,
        state_dir: a.dra_state_dir.clone(),
    };
    let mut driver = Driver::open(cfg)
        .context("reading the DRA checkpoint")?
        .with_mps(gpupart_node::mps::Mps::from_args(g))
        .sharing_mig_gpus(a.mps_on_mig);
    let report = driver.start(backend.as_ref()).map_err(anyhow::Error::msg)?;
    tracing::info!(
        adopted = report.adopted,
        forgotten = report.forgotten,
        rolled_back = report.rolled_back,
        finished = report.finished,
        daemons_restarted = report.daemons_restarted,
        "checkpoint reconciled with the GPUs"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let ended = runtime.block_on(async move {
        // The kubelet's sockets first: nothing is published by a plugin the kubelet cannot reach.
        let sockets = Sockets {
            driver: a.driver_name.clone(),
            registry_dir: a.kubelet_registry_dir.clone(),
            plugins_dir: a.kubelet_plugins_dir.clone(),
            poll: Duration::from_millis(500),
        };
        let (_folder, bound) = sockets.open().map_err(anyhow::Error::msg)?;
        let (client, server) = crate::kube::client_and_server().await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // The Node first: its uid owns the slices, and a node that does not exist stops the
        // plugin before anything is written.
        let uid = tokio::select! {
            uid = node_uid(&client, &node, &server) => uid?,
            _ = term.recv() => return anyhow::Ok(ExitCode::SUCCESS),
            _ = tokio::signal::ctrl_c() => return anyhow::Ok(ExitCode::SUCCESS),
        };
        // What the API server keeps of the pool, before any of it is written.
        let api = tokio::select! {
            api = api_check::check(&client, &server, &a.driver_name, &node) => api?,
            _ = term.recv() => return anyhow::Ok(ExitCode::SUCCESS),
            _ = tokio::signal::ctrl_c() => return anyhow::Ok(ExitCode::SUCCESS),
        };
        let health = Arc::new(crate::http::Health::default());
        health.beat();
        let listener = crate::http::listen(a.metrics_addr).await?;
        let http_state =
            crate::http::HttpState { health: health.clone(), max_silence_secs: 600, metrics: metrics.clone() };
        let limits =
            crate::http::ServeLimits { max_connections: a.http_max_connections as usize, timeout: a.http_timeout };
        tokio::spawn(async move { crate::http::serve(listener, crate::http::router(http_state), limits).await });
        let mut publisher =
            publisher::Publisher::start(client.clone(), &a.driver_name, &node, uid, backend.as_ref()).await?;
        publisher.catalog.mps = a.mps_policy;
        publisher.catalog.mps_on_mig = a.mps_on_mig;
        publisher.kept = api.kept;
        let (node_changed, mut node_changes) = tokio::sync::mpsc::channel::<()>(8);
        let keys =
            vec![gpupart_node::dra::reservation::ANNOTATION.to_string(), crate::kube::keys::RECOVER_GPUS.to_string()];
        let node_view = crate::kube::NodeWatch::spawn(client.clone(), &node, keys, node_changed);
        let dra = Arc::new(DraNode {
            backend: backend.clone(),
            driver: Mutex::new(driver),
            client: client.clone(),
            driver_name: a.driver_name.clone(),
            node: node.clone(),
            held: Arc::default(),
            watching: a.watch_claims,
            republish: Arc::default(),
            metrics: metrics.clone(),
            events: events::ClaimEvents::new(client.clone(), &node),
            summaries: crate::kube::KubeReporter::spawn(
                client.clone(),
                node.clone(),
                std::env::var("POD_NAME").unwrap_or_else(|_| node.clone()),
                a.annotation_prefix.clone(),
                a.annotation_min_interval,
                simulated,
            ),
            node_view,
            bad_reservation: Mutex::default(),
            health: gpu_health.clone(),
            taint_effect: a.health_taint_effect,
        });
        // A reservation written or removed on the node republishes at once; so does an operator's
        // recovery of unhealthy GPUs (the annotation is removed once read).
        let me = dra.clone();
        tokio::spawn(async move {
            while node_changes.recv().await.is_some() {
                let request = me.node_view.view().annotations.get(crate::kube::keys::RECOVER_GPUS).cloned();
                if let Some(value) = request {
                    match crate::gpu_health::watch::recover_request(&value, &me.health) {
                        Ok(Some(c)) => me.summaries.notice(crate::agent::fence::notice(&c)),
                        Ok(None) => tracing::info!(value, "the recovery annotation names no unhealthy GPU"),
                        Err(e) => {
                            tracing::warn!("{e}");
                            let refused = crate::agent::report::Notice {
                                type_: "Warning",
                                reason: "GpuRecoveryRefused",
                                note: e,
                            };
                            me.summaries.notice(refused);
                        }
                    }
                    crate::kube::node::remove_annotation(&me.client, &me.node, crate::kube::keys::RECOVER_GPUS).await;
                }
                me.republish.notify_one();
            }
        });
        // Every change of the GPUs' health republishes at once.
        let (htx, mut hrx) = tokio::sync::mpsc::channel(16);
        crate::gpu_health::watch::spawn(
            crate::gpu_health::watch::Watcher::new(watched, gpu_health.clone(), metrics.clone()),
            htx,
        );
        let me = dra.clone();
        tokio::spawn(async move {
            while let Some(change) = hrx.recv().await {
                me.summaries.notice(crate::agent::fence::notice(&change));
                me.republish.notify_one();
            }
        });
        if a.watch_claims {
            watch::spawn(client.clone(), a.driver_name.clone(), node.clone(), dra.held.clone(), dra.republish.clone());
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let up = health.clone();
        let served = tokio::spawn(crate::kubelet::dra_plugin::serve(
            sockets,
            bound,
            Arc::new(dra.clone()),
            Arc::new(RegistrationLog::default()),
            move |serving| up.set_serving(serving),
            stop_rx,
        ));
        let publishing = tokio::spawn(plugin::publish_loop(dra.clone(), publisher, health, a.resync_interval));
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: stopping"),
        }
        let _ = stop_tx.send(true);
        let _ = served.await;
        publishing.abort();
        anyhow::Ok(ExitCode::SUCCESS)
    });
    runtime.shutdown_background();
    ended
}
