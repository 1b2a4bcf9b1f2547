//! `gpupart agent`: the long-running node agent. A controller-style loop: read the desired layout
//! and the config, reconcile against the GPUs, publish the state; reconcile again on every input
//! change, periodically to repair drift, and with capped exponential backoff after a failure.
//! Bare-metal mode (`--no-kube`) reads the layout from `--layout` or `--layout-file` (re-read on
//! SIGHUP and on change) and publishes to `--status-file`, logs and systemd.

pub mod backoff;
pub mod config_map;
pub mod fence;
pub mod lock;
pub mod notify;
pub mod reconcile;
pub mod report;
pub mod source;
pub mod status;

use crate::backend::GpuBackend;
use crate::cli::{AgentArgs, GpuOptions};
use crate::exec::ExecOptions;
use crate::gpu_health::watch::Change;
use crate::http::{router, Health, HttpState};
use crate::kube::{KubeReporter, NodeWatch};
use anyhow::{bail, Context};
use backoff::Backoff;
use reconcile::{reconcile, Settings};
use report::{Fanout, LogAndNotify, Reporter, StatusFile};
use source::{ConfigSource, LayoutSource};
use status::Phase;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Why the loop wakes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// An input changed (file content, SIGHUP).
    Changed,
    /// Stop.
    Shutdown,
}

/// How long a change under way may still run after SIGTERM before the agent exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Where the desired layout comes from.
enum Mode {
    /// Bare metal: a fixed name or a layout file.
    File(LayoutSource),
    /// Kubernetes: the own Node's layout label.
    Kube {
        watch: NodeWatch,
        client: ::kube::Client,
        node: String,
        clients: Option<Arc<crate::kube::pause::KubeClients>>,
    },
}

impl Mode {
    /// The watched config ConfigMap (`--config-map`).
    fn config_map(&self, config: &ConfigSource) -> Option<config_map::ConfigMapConfig> {
        match (self, config) {
            (Mode::Kube { .. }, ConfigSource::Map(m)) => Some(m.as_ref().clone()),
            _ => None,
        }
    }
}

/// Runs the agent until SIGTERM/SIGINT.
pub fn run(g: &GpuOptions, a: &AgentArgs) -> anyhow::Result<ExitCode> {
    if a.dra {
        let label_mode = a.label_mode_flags();
        if !label_mode.is_empty() {
            bail!(
                "--dra makes each device when a claim is prepared and never applies a layout; {} {} for the label-driven agent only: remove {}",
                label_mode.join(", "),
                if label_mode.len() == 1 { "is" } else { "are" },
                if label_mode.len() == 1 { "it" } else { "them" }
            );
        }
        return crate::dra::run(g, &a.dra_options());
    }
    let mut a = a.clone();
    if a.config_map.is_none() {
        a.config_file = Some(config_path(&a)?);
    } else if a.no_kube {
        bail!("--config-map reads the config through the Kubernetes API; with --no-kube use -f FILE");
    }
    let a = &a;
    let file_source = if a.no_kube {
        Some(match (&a.layout, &a.layout_file) {
            (Some(n), None) => LayoutSource::Fixed(n.clone()),
            (None, Some(f)) => LayoutSource::File(f.clone()),
            (None, None) if a.default_layout.is_some() => LayoutSource::External(None),
            _ => bail!("--no-kube needs exactly one of --layout NAME or --layout-file FILE (or --default-layout)"),
        })
    } else {
        if a.layout.is_some() || a.layout_file.is_some() {
            bail!(
                "--layout and --layout-file are for --no-kube; in Kubernetes the layout comes from the {} label",
                a.label_key
            );
        }
        None
    };
    let node = match (&file_source, &a.node_name) {
        (Some(_), _) => String::new(),
        (None, Some(n)) => n.clone(),
        (None, None) => bail!("Kubernetes mode needs the node name: --node-name or NODE_NAME (downward API)"),
    };
    let mut others: Vec<(&str, std::path::PathBuf)> =
        a.config_file.iter().map(|f| ("the config file", f.clone())).collect();
    if let Some(state) = &g.sim_state {
        others.push(("the simulator's state file (--sim-state)", state.clone()));
        others.push(("the simulator's lock on its state file", crate::mig::sim::store::lock_path(state)));
    }
    others.extend(a.status_file.iter().map(|f| ("the status file", f.clone())));
    others.extend(a.layout_file.iter().map(|f| ("the layout file", f.clone())));
    lock::check_distinct(&a.lock_file, &others).map_err(anyhow::Error::msg)?;
    let _lock = lock::NodeLock::acquire(&a.lock_file)?;
    let agent_hooks = match &a.hooks {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading hooks file {}", p.display()))?;
            let hooks = crate::hooks::parse(&text).with_context(|| format!("invalid hooks file {}", p.display()))?;
            let config = match &a.config_map {
                Some(cm) => cm.to_string(),
                None => config_of(a).display().to_string(),
            };
            Some(Arc::new(reconcile::AgentHooks { hooks, file: p.display().to_string(), config, debug: g.debug }))
        }
        None => None,
    };
    let raw: Arc<dyn GpuBackend> = Arc::from(crate::backend::open(g)?);
    let raw_simulated = raw.is_simulated();
    let metrics = Arc::new(crate::metrics::Metrics::for_agent(raw_simulated, !a.no_kube));
    let gpu_health = Arc::new(crate::gpu_health::GpuHealth::load(&g.health_file, a.ignore_xids.clone()));
    let mps = crate::mps::Mps::from_args(g);
    let watched: Arc<dyn GpuBackend> = Arc::new(crate::metrics::Instrumented::new(raw, metrics.clone()));
    // The event watch sees a lost GPU as lost; everything else sees it as it was last seen.
    let backend: Arc<dyn GpuBackend> = Arc::new(crate::gpu_health::keep_lost::KeepingLost::new(watched.clone()));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let ended = runtime.block_on(async move {
        let (tx, rx) = mpsc::channel::<Wake>(8);
        let mut config = ConfigSource::File(config_of(a).to_path_buf());
        let mut reporters: Vec<Box<dyn Reporter>> = vec![Box::new(LogAndNotify)];
        if let Some(p) = &a.status_file {
            reporters.push(Box::new(StatusFile { path: p.clone(), simulated: raw_simulated }));
        }
        let mut summaries: Option<KubeReporter> = None;
        let mut plugin = None;
        let mut pod_source = None;
        let mode = match file_source {
            Some(src) => Mode::File(src),
            None => {
                let (client, server) = crate::kube::client_and_server().await?;
                // A Node that does not exist is a wrong --node-name, not an outage to wait out;
                // an API server that does not answer yet is left to the watch's retries.
                let nodes: ::kube::Api<k8s_openapi::api::core::v1::Node> = ::kube::Api::all(client.clone());
                if let Ok(Ok(None)) = tokio::time::timeout(Duration::from_secs(5), nodes.get_opt(&node)).await {
                    bail!("{}", crate::kube::node::missing(&node, &server));
                }
                let (ctx, mut crx) = mpsc::channel::<()>(8);
                let keys = vec![
                    a.label_key.clone(),
                    crate::kube::keys::FORCE.to_string(),
                    crate::kube::keys::RECOVER_GPUS.to_string(),
                ];
                let watch = NodeWatch::spawn(client.clone(), &node, keys, ctx);
                let forward = tx.clone();
                tokio::spawn(async move {
                    while crx.recv().await.is_some() {
                        if forward.send(Wake::Changed).await.is_err() {
                            return;
                        }
                    }
                });
                let instance = std::env::var("POD_NAME").unwrap_or_else(|_| node.clone());
                let kube_reporter = KubeReporter::spawn(
                    client.clone(),
                    node.clone(),
                    instance,
                    a.annotation_prefix.clone(),
                    a.annotation_min_interval,
                    raw_simulated,
                );
                reporters.push(Box::new(kube_reporter.clone()));
                summaries = Some(kube_reporter);
                // Labels paused by an earlier run of this agent are restored before anything else.
                crate::kube::pause::restore(&client, &node).await;
                let clients = a.pause_gpu_clients.then(|| {
                    Arc::new(crate::kube::pause::KubeClients::new(
                        client.clone(),
                        node.clone(),
                        watch.clone(),
                        a.pause_timeout,
                        tokio::runtime::Handle::current(),
                    ))
                });
                let m = metrics.clone();
                let source = crate::kubelet::pod_resources::PodResources {
                    socket: g.pod_resources_socket.clone(),
                    timeout: Duration::from_secs(5),
                };
                pod_source = Some(Arc::new(crate::kubelet::pod_resources::Reported::new(
                    source,
                    Box::new(move |ok| m.pod_resources_readable(ok)),
                )));
                plugin = Some(crate::kubelet::device_plugin::DevicePluginHandle::spawn(
                    crate::kubelet::device_plugin::PluginConfig {
                        dir: a.device_plugin_dir.clone(),
                        resource: a.mps_resource.clone(),
                        retire_grace: a.slot_retire_grace,
                        poll: Duration::from_millis(500),
                    },
                ));
                if let Some(name) = &a.config_map {
                    let (ctx, mut crx) = mpsc::channel::<()>(8);
                    config = ConfigSource::Map(Box::new(config_map::ConfigMapConfig::spawn(
                        client.clone(),
                        name.clone(),
                        ctx,
                    )));
                    let forward = tx.clone();
                    tokio::spawn(async move {
                        while crx.recv().await.is_some() {
                            tracing::info!("the config ConfigMap changed");
                            if forward.send(Wake::Changed).await.is_err() {
                                return;
                            }
                        }
                    });
                }
                Mode::Kube { watch, client, node: node.clone(), clients }
            }
        };
        let outputs = Outputs {
            metrics,
            reporter: Arc::new(Fanout(reporters)),
            summaries,
            mps,
            plugin,
            pod_source,
            hooks: agent_hooks,
            health: gpu_health,
            watched,
        };
        async_main(a.clone(), mode, config, backend, outputs, tx, rx).await
    });
    // A blocking task still running (a change past its grace) must not hold the exit up.
    runtime.shutdown_background();
    ended
}

/// The config file: `-f`, else `MIG_PARTED_CONFIG_FILE`, else `CONFIG_FILE` (NVIDIA's MIG
/// manager's name for it).
fn config_path(a: &AgentArgs) -> anyhow::Result<std::path::PathBuf> {
    let env = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    a.config_file
        .clone()
        .or_else(|| env("MIG_PARTED_CONFIG_FILE"))
        .or_else(|| env("CONFIG_FILE"))
        .context("the agent needs its config file: -f/--config-file FILE (or MIG_PARTED_CONFIG_FILE)")
}

/// The config file (set by [`run`] before anything reads it).
fn config_of(a: &AgentArgs) -> &std::path::Path {
    a.config_file.as_deref().unwrap_or(std::path::Path::new(""))
}

/// Reads the desired state; `None` while the Node (or the config ConfigMap) has not been seen
/// yet. The flag says whether the force annotation asked for this change.
fn read_desired(mode: &Mode, a: &AgentArgs, config: &ConfigSource) -> Option<(reconcile::Desired, bool)> {
    let text = config.text()?;
    match mode {
        Mode::File(src) => Some((source::desired(src, a.default_layout.as_deref(), text), false)),
        Mode::Kube { watch, .. } => {
            let view = watch.view();
            if !view.seen {
                return None;
            }
            let label = view.labels.get(&a.label_key).cloned();
            let src = LayoutSource::External(label);
            let forced = view.annotations.get(crate::kube::keys::FORCE).is_some_and(|v| v == "true");
            let mut desired = source::desired(&src, a.default_layout.as_deref(), text);
            if desired.layout.is_none() {
                desired.idle_reason = format!("no layout requested: the node has no {} label", a.label_key);
            }
            Some((desired, forced))
        }
    }
}

/// Removes a request annotation (force, recovery) once acted on.
async fn clear_annotation(mode: &Mode, key: &str) {
    if let Mode::Kube { client, node, .. } = mode {
        crate::kube::node::remove_annotation(client, node, key).await;
    }
}

/// The recovery annotation's value, when the Node has one.
fn recovery_request(mode: &Mode) -> Option<String> {
    let Mode::Kube { watch, .. } = mode else { return None };
    watch.view().annotations.get(crate::kube::keys::RECOVER_GPUS).cloned()
}

/// Where the agent publishes: metrics, state reporters, and (in Kubernetes) the node summary.
struct Outputs {
    metrics: Arc<crate::metrics::Metrics>,
    reporter: Arc<dyn Reporter>,
    summaries: Option<KubeReporter>,
    mps: crate::mps::Mps,
    plugin: Option<crate::kubelet::device_plugin::DevicePluginHandle>,
    pod_source: Option<Arc<crate::kubelet::pod_resources::Reported>>,
    hooks: Option<Arc<reconcile::AgentHooks>>,
    health: Arc<crate::gpu_health::GpuHealth>,
    /// The GPUs as the event watch sees them (a lost GPU is lost).
    watched: Arc<dyn GpuBackend>,
}

async fn async_main(
    a: AgentArgs,
    mode: Mode,
    config: ConfigSource,
    backend: Arc<dyn GpuBackend>,
    outputs: Outputs,
    tx: mpsc::Sender<Wake>,
    mut rx: mpsc::Receiver<Wake>,
) -> anyhow::Result<ExitCode> {
    let Outputs {
        metrics,
        reporter,
        summaries,
        mps,
        plugin,
        pod_source,
        hooks: agent_hooks,
        health: gpu_health,
        watched,
    } = outputs;
    let (htx, mut hrx) = mpsc::channel::<Change>(16);
    let watcher = crate::gpu_health::watch::Watcher::new(watched, gpu_health.clone(), metrics.clone());
    crate::gpu_health::watch::spawn(watcher, htx);
    let health = Arc::new(Health::default());
    health.beat();
    let listener = crate::http::listen(a.metrics_addr).await?;
    let http_state = HttpState {
        health: health.clone(),
        max_silence_secs: (a.resync_interval.as_secs() * 2).max(60) + 600,
        metrics: metrics.clone(),
    };
    let collect_now = Arc::new(tokio::sync::Notify::new());
    let http_limits =
        crate::http::ServeLimits { max_connections: a.http_max_connections as usize, timeout: a.http_timeout };
    let requested = Arc::new(std::sync::Mutex::new(None));
    let collector = Collector {
        backend: backend.clone(),
        metrics: metrics.clone(),
        mps: mps.clone(),
        pods: pod_source.clone(),
        summaries,
        config: config.clone(),
        health: gpu_health.clone(),
        requested: requested.clone(),
    };
    spawn_collector(collector.clone(), collect_now.clone(), a.metrics_interval);
    tokio::spawn(async move {
        crate::http::serve(listener, router(http_state), http_limits).await;
    });

    spawn_signals(tx.clone())?;
    let watched = match &mode {
        Mode::File(src) => src.clone(),
        Mode::Kube { .. } => LayoutSource::External(None),
    };
    spawn_file_watch(tx, watched, config.path().map(std::path::Path::to_path_buf), a.poll_interval);

    let settings = Settings {
        force: a.force,
        allow_reboot: a.allow_reboot,
        exec: ExecOptions { dry_run: false, parallel: a.parallel as usize, skip_reset: false, stop: None },
    };
    let seed = u64::from(std::process::id()) ^ 0x9E37_79B9;
    let mut backoff = Backoff::new(a.retry_min, a.retry_max, seed);
    let mut deadline = tokio::time::Instant::now();
    let supervisor = Arc::new(std::sync::Mutex::new(crate::mps::supervise::Supervisor::default()));
    let mut health_tick = tokio::time::interval(a.mps_health_interval.max(Duration::from_millis(50)));
    health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status: Option<status::AgentStatus> = None;
    let mut degraded = false;
    let supervision = Supervision {
        supervisor: supervisor.clone(),
        mps: mps.clone(),
        backend: backend.clone(),
        metrics: metrics.clone(),
        reporter: reporter.clone(),
        collect_now: collect_now.clone(),
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            wake = rx.recv() => {
                if matches!(wake, Some(Wake::Shutdown) | None) {
                    // MPS daemons stay: their clients keep their server across agent restarts.
                    tracing::info!("shutting down");
                    return Ok(ExitCode::SUCCESS);
                }
            }
            _ = health_tick.tick() => {
                degraded = supervise(&supervision, last_status.as_ref(), degraded).await;
                advertise(plugin.as_ref(), &supervisor, &mps, &gpu_health);
                continue;
            }
            Some(change) = hrx.recv() => {
                let recovered = matches!(change, Change::Recovered { .. });
                announce(&change, last_status.as_ref(), &reporter);
                advertise(plugin.as_ref(), &supervisor, &mps, &gpu_health);
                collect_now.notify_one();
                // A GPU that is back gets the layout; a fenced one needs no reconcile.
                if !recovered {
                    continue;
                }
            }
        }
        if let Some(value) = recovery_request(&mode) {
            match crate::gpu_health::watch::recover_request(&value, &gpu_health) {
                Ok(Some(change)) => {
                    announce(&change, last_status.as_ref(), &reporter);
                    advertise(plugin.as_ref(), &supervisor, &mps, &gpu_health);
                    collect_now.notify_one();
                }
                Ok(None) => tracing::info!(value, "the recovery annotation names no unhealthy GPU"),
                Err(e) => {
                    let refused = report::Notice { type_: "Warning", reason: "GpuRecoveryRefused", note: e };
                    announce_notice(&refused, last_status.as_ref(), &reporter);
                }
            }
            clear_annotation(&mode, crate::kube::keys::RECOVER_GPUS).await;
        }
        health.beat();
        let Some((mut desired, mut forced)) = read_desired(&mode, &a, &config) else {
            tracing::info!("waiting for the node (and the config ConfigMap) to be seen");
            deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            continue;
        };
        if let (Some(cm), Some(layout)) = (mode.config_map(&config), desired.layout.as_deref()) {
            // The label may arrive before the ConfigMap's watch event: read it once more first.
            if !layout_in(&desired.config, layout) {
                cm.refresh().await;
                if let Some(again) = read_desired(&mode, &a, &config) {
                    (desired, forced) = again;
                }
            }
        }
        *requested.lock().unwrap_or_else(|e| e.into_inner()) = desired.layout.clone();
        let (b, r) = (backend.clone(), reporter.clone());
        let clients = match &mode {
            Mode::Kube { clients: Some(c), .. } => Some(c.clone()),
            _ => None,
        };
        let mut run_settings = settings;
        run_settings.force |= forced;
        let (m, p, pods, hooks) = (mps.clone(), plugin.clone(), pod_source.clone(), agent_hooks.clone());
        let fenced = gpu_health.snapshot();
        let mut task = tokio::task::spawn_blocking(move || {
            let edges = reconcile::Edges {
                clients: clients.as_deref().map(|c| c as &dyn reconcile::Clients),
                mps: Some(&m),
                slots: p.as_ref().map(|p| p as &dyn reconcile::SlotSink),
                allocations: pods.as_deref().map(|s| s as &dyn crate::kubelet::pod_resources::AllocationSource),
                hooks: hooks.as_deref(),
                fenced: Some(&fenced),
            };
            reconcile(b.as_ref(), &desired, run_settings, &edges, &mut |pending| r.publish(pending))
        });
        // SIGTERM is honoured while a reconcile runs, whatever it waits on: the change gets a
        // short grace to finish, then the agent exits (the next start resumes from the GPUs).
        let mut changed_meanwhile = false;
        let result = loop {
            tokio::select! {
                done = &mut task => break done.context("the reconcile task panicked")?,
                wake = rx.recv() => match wake {
                    Some(Wake::Changed) => changed_meanwhile = true,
                    Some(Wake::Shutdown) | None => {
                        if tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await.is_err() {
                            tracing::warn!(
                                grace_secs = SHUTDOWN_GRACE.as_secs(),
                                "shutting down with a change under way; the next start picks it up"
                            );
                        } else {
                            tracing::info!("shutting down");
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                },
            }
        };
        if let Some(serving) = &result.serving {
            supervisor.lock().unwrap_or_else(|e| e.into_inner()).watch(serving.clone());
        } else if result.status.state == Phase::Idle {
            supervisor.lock().unwrap_or_else(|e| e.into_inner()).watch(Vec::new());
        }
        advertise(plugin.as_ref(), &supervisor, &mps, &gpu_health);
        if forced && result.status.state != Phase::Idle {
            clear_annotation(&mode, crate::kube::keys::FORCE).await;
        }
        let mut status = result.status;
        let wait = if status.state == Phase::Pending && result.retry {
            // Waiting on the Kubernetes API (not a failure): try again soon, without counting it.
            a.retry_min
        } else if status.state == Phase::Failed && result.retry {
            let d = backoff.next_delay();
            status.attempts = backoff.attempts();
            status.next_retry_secs = Some(d.as_secs().max(1));
            d
        } else {
            if status.state == Phase::Failed {
                status.attempts = backoff.attempts() + 1;
            } else {
                backoff.reset();
            }
            a.resync_interval
        };
        let reboot_now = status.state == Phase::Rebooting && !guard_tripped(&a.reboot_guard, &mut status);
        if status.state == Phase::Success {
            let _ = std::fs::remove_file(&a.reboot_guard);
        }
        deadline = tokio::time::Instant::now() + if changed_meanwhile { Duration::ZERO } else { wait };
        // The state and the summary of the GPUs as they are now go out in one write, so nobody
        // reads `success` next to the previous layout's free GPUs.
        if let Some(kube) = collector.summaries.clone() {
            let c = collector.clone();
            if let Ok(Some(summary)) = tokio::task::spawn_blocking(move || c.collect()).await {
                kube.publish_with_summary(&status, summary);
            }
        }
        reporter.publish(&status);
        metrics.agent_status(&status);
        last_status = Some(status.clone());
        degraded = false;
        if collector.summaries.is_none() {
            collect_now.notify_one();
        }
        health.set_ready();
        health.beat();
        if reboot_now {
            reboot(&a.reboot_command);
        }
    }
}

/// Publishes a change of the GPUs' health as an Event (with the last status; only logged before
/// the first reconcile).
fn announce(change: &Change, last: Option<&status::AgentStatus>, reporter: &Arc<dyn Reporter>) {
    announce_notice(&fence::notice(change), last, reporter);
}

fn announce_notice(notice: &report::Notice, last: Option<&status::AgentStatus>, reporter: &Arc<dyn Reporter>) {
    match last {
        Some(st) => reporter.publish_notice(st, notice),
        None => tracing::warn!(reason = notice.reason, note = %notice.note, "event"),
    }
}

/// Hands the device plugin the slots of every daemon under watch, with their health: a slot is
/// healthy while its daemon answers and its GPU is not fenced.
fn advertise(
    plugin: Option<&crate::kubelet::device_plugin::DevicePluginHandle>,
    supervisor: &std::sync::Mutex<crate::mps::supervise::Supervisor>,
    mps: &crate::mps::Mps,
    gpus: &crate::gpu_health::GpuHealth,
) {
    let Some(plugin) = plugin else { return };
    let fenced = gpus.snapshot();
    let health = supervisor.lock().unwrap_or_else(|e| e.into_inner()).health();
    let gpus = health
        .into_iter()
        .map(|(w, healthy)| {
            let paths = mps.paths(&w.uuid);
            crate::kubelet::slots::SlotGpu {
                uuid: w.uuid,
                settings: w.settings,
                pipe_dir: paths.pipe().display().to_string(),
                shm_dir: paths.shm().display().to_string(),
                healthy: healthy && !fenced.is_unhealthy(w.gpu),
            }
        })
        .collect();
    plugin.update(gpus);
}

/// What the MPS health check works with.
struct Supervision {
    supervisor: Arc<std::sync::Mutex<crate::mps::supervise::Supervisor>>,
    mps: crate::mps::Mps,
    backend: Arc<dyn GpuBackend>,
    metrics: Arc<crate::metrics::Metrics>,
    reporter: Arc<dyn Reporter>,
    collect_now: Arc<tokio::sync::Notify>,
}

/// One health check of the MPS daemons under watch (on a blocking thread): restarts are
/// counted and announced as Events; while a daemon cannot be restarted the state is `failed`
/// (its reason says why), and once every daemon is back it returns to the last reconcile's
/// status. Returns whether the node is degraded now.
async fn supervise(ctx: &Supervision, base: Option<&status::AgentStatus>, degraded: bool) -> bool {
    let Supervision { supervisor, mps, backend, metrics, reporter, collect_now } = ctx;
    let (sv, m, b) = (supervisor.clone(), mps.clone(), backend.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let mut sv = sv.lock().unwrap_or_else(|e| e.into_inner());
        if sv.watched().next().is_none() {
            return (Vec::new(), Vec::new());
        }
        let restarts = sv.check(&m, b.as_ref(), std::time::Instant::now());
        (restarts, sv.failing())
    })
    .await;
    let Ok((restarts, failing)) = checked else { return degraded };
    for r in &restarts {
        metrics.mps_restarted(&r.uuid, r.result.is_ok());
    }
    if !restarts.is_empty() {
        collect_now.notify_one();
    }
    // Only a node whose last reconcile succeeded is reported from here; a failed reconcile's
    // status (and its retries) stays as it is.
    let Some(base) = base.filter(|s| s.state == Phase::Success) else { return degraded };
    let now_degraded = !failing.is_empty();
    for r in &restarts {
        let head = format!("GPU {} ({}, {})", r.gpu, r.model, r.uuid);
        let mut st = base.clone();
        let notice = match &r.result {
            Ok(pid) => {
                let note =
                    format!("{head}: MPS daemon restarted as pid {pid} in {} ms ({})", r.took.as_millis(), r.why);
                st.reason = format!("{}; {note}", base.reason);
                report::Notice { type_: "Normal", reason: "MpsDaemonRestarted", note }
            }
            Err(e) => {
                let note = format!("{head}: MPS daemon down ({}); restart failed: {e}", r.why);
                st.reason = note.clone();
                report::Notice { type_: "Warning", reason: "MpsDaemonRestartFailed", note }
            }
        };
        if now_degraded {
            st.state = Phase::Failed;
            st.failure = Some(status::Failure::Mps);
        }
        metrics.agent_status(&st);
        reporter.publish_notice(&st, &notice);
    }
    if restarts.is_empty() && degraded && !now_degraded {
        reporter.publish(base);
        metrics.agent_status(base);
    }
    now_degraded
}

/// What the metrics collector reads and where it publishes.
#[derive(Clone)]
struct Collector {
    backend: Arc<dyn GpuBackend>,
    metrics: Arc<crate::metrics::Metrics>,
    mps: crate::mps::Mps,
    pods: Option<Arc<crate::kubelet::pod_resources::Reported>>,
    summaries: Option<KubeReporter>,
    config: ConfigSource,
    health: Arc<crate::gpu_health::GpuHealth>,
    /// The layout the node asks for (its instances outside it are reported foreign).
    requested: Arc<std::sync::Mutex<Option<String>>>,
}

/// Whether the config text names `layout`.
fn layout_in(config: &Result<String, String>, layout: &str) -> bool {
    config
        .as_ref()
        .ok()
        .and_then(|t| crate::config::parse(t).ok())
        .is_some_and(|f| f.configs.iter().any(|c| c.name == layout))
}

/// Refreshes the metrics snapshot after every reconcile and every `every`; a scrape only renders it.
impl Collector {
    /// Reads the GPUs (with allocations and MPS daemons), refreshes the metrics snapshot and
    /// returns the node summary (Kubernetes mode). Blocking.
    fn collect(&self) -> Option<crate::kube::summary::Summary> {
        let t = std::time::Instant::now();
        let file = self.config.text().and_then(Result::ok).and_then(|text| crate::config::parse(&text).ok());
        let workload = file.as_ref().map(|f| crate::frag::Workload { weights: f.workload.clone() });
        let mut states = match self.backend.observe_all() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics collection failed");
                self.metrics.collect_failed(t.elapsed().as_secs_f64());
                return None;
            }
        };
        if let Some(uses) =
            self.pods.as_ref().and_then(|p| crate::kubelet::pod_resources::AllocationSource::read(p.as_ref()).ok())
        {
            crate::kubelet::allocations::attach(&mut states, &uses);
        }
        let daemons: Vec<_> = states.iter().map(|s| self.mps.observe(s)).collect();
        self.metrics.update_with_mps(&states, &daemons, workload.as_ref(), t.elapsed().as_secs_f64());
        let fenced = self.health.snapshot();
        self.metrics.health().show(&fenced, states.len() as u32);
        self.summaries.as_ref()?;
        let frags = crate::frag::node_gpu_frags(&states, &daemons, workload.as_ref());
        let configured = workload.as_ref().is_some_and(|w| !w.weights.is_empty());
        let requested = self.requested.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let layout = file.as_ref().zip(requested).and_then(|(f, name)| f.get(&name).cloned());
        let foreign = layout.map(|c| gpupart_node::prepare::foreign(&states, &c)).unwrap_or_default();
        Some(crate::kube::summary::summarize(&states, frags, configured, &fenced, &foreign))
    }
}

/// Refreshes the metrics snapshot (and the rate-limited node summary) every `every` and when
/// asked; a scrape only renders it.
fn spawn_collector(collector: Collector, now: Arc<tokio::sync::Notify>, every: Duration) {
    tokio::spawn(async move {
        loop {
            let c = collector.clone();
            if let Ok(Some(summary)) = tokio::task::spawn_blocking(move || c.collect()).await {
                if let Some(sink) = &collector.summaries {
                    sink.publish_summary(summary);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = now.notified() => {}
            }
        }
    });
}

fn spawn_signals(tx: mpsc::Sender<Wake>) -> anyhow::Result<()> {
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        loop {
            let wake = tokio::select! {
                _ = hup.recv() => { tracing::info!("SIGHUP: re-reading the layout and config"); Wake::Changed }
                _ = term.recv() => Wake::Shutdown,
                _ = int.recv() => Wake::Shutdown,
            };
            if tx.send(wake).await.is_err() || wake == Wake::Shutdown {
                return;
            }
        }
    });
    Ok(())
}

fn spawn_file_watch(tx: mpsc::Sender<Wake>, source: LayoutSource, config: Option<std::path::PathBuf>, every: Duration) {
    tokio::spawn(async move {
        let mut last = source::fingerprint(&source, config.as_deref());
        loop {
            tokio::time::sleep(every).await;
            let now = source::fingerprint(&source, config.as_deref());
            if now != last {
                last = now;
                tracing::info!("the layout or config file changed");
                if tx.send(Wake::Changed).await.is_err() {
                    return;
                }
            }
        }
    });
}

/// Reboots at most once per change: if the guard file exists (we already rebooted and the mode
/// is still wrong) the status becomes `failed` instead; otherwise the guard is written.
fn guard_tripped(guard: &std::path::Path, status: &mut status::AgentStatus) -> bool {
    if guard.exists() {
        status.state = Phase::Failed;
        status.failure = Some(crate::agent::status::Failure::Reboot);
        status.reason = format!("MIG mode change did not take effect after rebooting ({})", status.reason);
        return true;
    }
    let written = guard
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(guard, status.layout.as_deref().unwrap_or_default()));
    if let Err(e) = written {
        status.state = Phase::Failed;
        status.failure = Some(crate::agent::status::Failure::Reboot);
        status.reason = format!("{}; not rebooting: cannot write {}: {e}", status.reason, guard.display());
        return true;
    }
    false
}

fn reboot(command: &str) {
    tracing::warn!(command, "rebooting the node to apply a MIG mode");
    let mut parts = command.split_whitespace();
    let Some(program) = parts.next() else { return };
    match std::process::Command::new(program).args(parts).status() {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::error!(status = %s, "the reboot command failed"),
        Err(e) => tracing::error!(error = %e, "cannot run the reboot command"),
    }
}
