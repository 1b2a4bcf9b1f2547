//! The controller's loop: batch the changes, and while this replica leads and the off switch is
//! not set, decide ([`super::decide`]) and carry the decisions out — the generated layout into the
//! ConfigMap first, then one Node patch — with Events on the pods and nodes and a log line each.

use super::cluster::{node_ref, pod_ref, Cluster, Layouts, WriteError};
use super::decide::{decide_with, idle_clocks, Decision, Kind, Options, Outcome, World};
use super::events::Pushed;
use super::layouts::Generated;
use super::lease::{Elector, Leadership};
use super::metrics::ControllerMetrics;
use super::nodes::{GpuNode, Phase};
use super::pods::{self, GpuPod, NotServed};
use crate::cli::ControllerArgs;
use crate::config::ConfigFile;
use anyhow::Context;
use gpupart_cluster::pools::Pools;
use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Runs the controller until SIGTERM/SIGINT.
pub fn run(a: &ControllerArgs) -> anyhow::Result<ExitCode> {
    a.pools()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let code = runtime.block_on(main(a.clone()));
    runtime.shutdown_background();
    code
}

fn identity(a: &ControllerArgs) -> String {
    a.identity.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// What the loop remembers between batches (a new leader starts without it: everything it
/// needs to be safe is on the nodes).
#[derive(Default)]
struct Memory {
    /// Dedicated nodes: since when no pod is bound there.
    idle_since: BTreeMap<String, i64>,
    /// Per node changed: the layout requested and since when its pods waited.
    inflight: BTreeMap<String, (Option<String>, Vec<i64>)>,
    /// The kind of reason last told to each waiting pod (one Event per new kind of reason).
    told: BTreeMap<String, &'static str>,
    /// Whether the last batch found the controller paused.
    paused: bool,
    /// The defragmenter (`--defrag`).
    defrag: Option<super::defrag::Defrag>,
    /// With `--dry-run`: per node, the decision last reported (the same one is not told again).
    dry_told: BTreeMap<String, String>,
    /// Nodes running the DRA plugin, told as left alone.
    dra_nodes: BTreeSet<String>,
    /// Each node's best change for what waits there, as last judged (unchanged nodes are not
    /// judged again).
    memo: super::memo::Memo,
}

/// Whether the API server serves `resource.k8s.io/v1`, which `--defrag` watches for DRA claims;
/// where it does not (before Kubernetes 1.34), says so once and leaves claims unwatched.
async fn dra_served(client: &kube::Client) -> bool {
    match crate::kube::group_versions(client, "resource.k8s.io").await {
        Ok(v) if v.iter().any(|v| v == "v1") => true,
        Ok(v) => {
            tracing::warn!(
                served = %v.join(", "),
                "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34 and later): --defrag moves device-plugin pods only, DRA claims are not watched"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the API server's discovery: watching DRA claims as if resource.k8s.io/v1 were served");
            true
        }
    }
}

async fn main(a: ControllerArgs) -> anyhow::Result<ExitCode> {
    let client = crate::kube::client().await?;
    let metrics = Arc::new(ControllerMetrics::new());
    let health = Arc::new(crate::http::Health::default());
    health.beat();
    let listener = crate::http::listen(a.metrics_addr).await?;
    let state = crate::http::HttpState {
        health: health.clone(),
        max_silence_secs: a.resync_interval.as_secs().max(30) * 4,
        metrics: metrics.clone(),
    };
    let limits = crate::http::ServeLimits { max_connections: 32, timeout: Duration::from_secs(5) };
    tokio::spawn(async move { crate::http::serve(listener, crate::http::router(state), limits).await });

    let me = identity(&a);
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let dra = a.defrag.defrag && dra_served(&client).await;
    let cluster = Cluster::start(
        client.clone(),
        a.layouts_configmap.clone(),
        me.clone(),
        tx,
        a.mps_resource.clone(),
        dra,
        a.events_per_batch as usize,
    );
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        ok = cluster.ready() => if !ok { anyhow::bail!("the node and pod watches stopped before their first list") },
        _ = term.recv() => return Ok(ExitCode::SUCCESS),
        _ = int.recv() => return Ok(ExitCode::SUCCESS),
    }
    tracing::info!(
        nodes = cluster.nodes().len(),
        pods = cluster.pods().len(),
        dry_run = a.dry_run,
        "watching nodes and pods"
    );
    // The agents read their layouts from this ConfigMap (their --config-map): one that does not
    // exist is most often a mistyped --layouts-configmap, which the agents would never read.
    match cluster.layouts().await {
        Ok(l) if l.resource_version.is_none() => tracing::warn!(
            configmap = %a.layouts_configmap,
            "ConfigMap {} does not exist: the agents read their layouts from it (their --config-map); it is created with the controller's layouts at the first change; check --layouts-configmap",
            a.layouts_configmap
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, configmap = %a.layouts_configmap, "cannot read the layouts ConfigMap yet"),
    }
    health.set_ready();
    // The Lease is renewed on its own clock, whatever a batch or a write waits on.
    let (lead_tx, mut lead_rx) = mpsc::channel::<()>(1);
    let elector = Elector::new(client.clone(), &a.lease.namespace, &a.lease.name, &me, a.lease_duration);
    let leadership = Leadership::spawn(elector, lead_tx);
    let (events_client, events_identity) = (cluster.client(), cluster.identity().to_string());
    cluster.events().serve(leadership.clone(), metrics.clone(), move |e| {
        super::cluster::Cluster::post_event(events_client.clone(), events_identity.clone(), e)
    });
    let mut resync = tokio::time::interval(a.resync_interval.max(Duration::from_millis(100)));
    let mut memory = Memory::default();
    if a.defrag.defrag {
        let evictions = crate::kube::client_without_retries().await?;
        memory.defrag = Some(super::defrag::Defrag::new(evictions, &a.defrag, a.dry_run));
    }
    let opts = Options {
        max_concurrent_nodes: a.max_concurrent_nodes as usize,
        cooldown_secs: a.cooldown.as_secs() as i64,
        reclaim_after_secs: a.reclaim_after.as_secs() as i64,
        mps_replicas: a.mps_replicas,
        reserve_for_dedicated: a.reserve_for_dedicated,
        pools: a.pools()?,
        defrag: a.defrag.defrag.then(|| a.defrag.rules()),
        room_secs: a.defrag.defrag_confirm_timeout.as_secs() as i64,
    };
    let mut was_leader: Option<bool> = None;
    loop {
        let mut batch = false;
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            Some(()) = lead_rx.recv() => {}
            _ = resync.tick() => batch = true,
            Some(()) = rx.recv() => {
                collect_batch(&mut rx, a.batch_window).await;
                batch = true;
            }
        }
        health.beat();
        let leader = leadership.leads();
        if was_leader != Some(leader) && !leader {
            let holder = leadership.holder().unwrap_or_else(|| "nobody".to_string());
            tracing::info!(holder = %holder, "standing by: another replica leads");
        }
        // A replica that just took the lead decides at once on what its caches hold, rather
        // than at the next change or resync.
        let took_lead = leader && was_leader != Some(true);
        if took_lead {
            tracing::info!("leading: deciding on the pods and nodes as listed");
        }
        was_leader = Some(leader);
        metrics.standing(leader, memory.paused);
        if (batch || took_lead) && leader {
            if let Err(e) = one_batch(&a, &cluster, &leadership, &metrics, &opts, &mut memory).await {
                tracing::warn!(error = %format!("{e:#}"), "the batch failed; retrying at the next change or resync");
            }
        }
    }
    tracing::info!("shutting down");
    // A leader gives the Lease up, so the next replica leads at once rather than after the
    // lease duration.
    if leadership.stop() {
        let mut elector = Elector::new(client, &a.lease.namespace, &a.lease.name, &me, a.lease_duration);
        match tokio::time::timeout(Duration::from_secs(2), elector.release()).await {
            Ok(Ok(true)) => tracing::info!(lease = %a.lease, "released the Lease for the next replica"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not release the Lease; the next replica waits for it to expire")
            }
            Err(_) => tracing::warn!("releasing the Lease took too long; the next replica waits for it to expire"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits for more changes after the first one: at most `window`, cut short after a quiet
/// second (a fifth of the window when that is shorter).
async fn collect_batch(rx: &mut mpsc::Receiver<()>, window: Duration) {
    let deadline = tokio::time::Instant::now() + window;
    let quiet = (window / 5).min(Duration::from_secs(1));
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        let wait = quiet.min(deadline - now);
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(())) => continue,
            _ => return,
        }
    }
}

/// Reads the caches into the pure inputs; pods the controller cannot serve come back apart.
fn read_world(cluster: &Cluster, mps_resource: &str, pools: &Pools) -> (Vec<GpuNode>, Vec<GpuPod>, Vec<NotServed>) {
    let mut nodes = Vec::new();
    for n in cluster.nodes() {
        match GpuNode::read(&n) {
            Ok(Some(g)) => nodes.push(g),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "skipping a node whose GPU summary does not parse"),
        }
    }
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    // What the pods bound to each node request, as the scheduler counts it against allocatable.
    let all_pods = cluster.pods();
    let index: BTreeMap<String, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
    for p in &all_pods {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let Some(on) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        if matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        if let Some(n) = index.get(on).map(|&i| &mut nodes[i]) {
            let (cpu, mem) = super::fit::requests(p);
            n.room.cpu_requested += cpu;
            n.room.memory_requested += mem;
        }
    }
    let mut gpu_pods = Vec::new();
    let mut refused = Vec::new();
    for p in all_pods {
        match pods::read_with(&p, mps_resource, pools) {
            Ok(Some(g)) => {
                if let (Some(reason), None) = (&g.unserved, g.node()) {
                    refused.push(NotServed { key: g.key.clone(), reason: reason.clone(), kind: "unservable" });
                }
                gpu_pods.push(g);
            }
            Ok(None) => {}
            Err(n) => refused.push(n),
        }
    }
    gpu_pods.sort_by(|a, b| a.key.cmp(&b.key));
    (nodes, gpu_pods, refused)
}

async fn one_batch(
    a: &ControllerArgs,
    cluster: &Cluster,
    leadership: &Leadership,
    metrics: &ControllerMetrics,
    opts: &Options,
    memory: &mut Memory,
) -> anyhow::Result<()> {
    let now = crate::clock::now_secs();
    cluster.events().new_batch();
    let layouts = cluster.layouts().await.with_context(|| format!("reading ConfigMap {}", a.layouts_configmap))?;
    if layouts.paused != memory.paused {
        tracing::info!(paused = layouts.paused, configmap = %a.layouts_configmap, "the controller's off switch changed");
    }
    memory.paused = layouts.paused;
    let (nodes, gpu_pods, refused) = read_world(cluster, &a.mps_resource, &opts.pools);
    let config: Option<ConfigFile> = match crate::config::parse(&layouts.text) {
        Ok(c) => Some(c),
        Err(_) if layouts.text.trim().is_empty() => None,
        Err(e) => anyhow::bail!("ConfigMap {}, key {}: {e}", a.layouts_configmap, super::cluster::CONFIG_KEY),
    };
    track(memory, &nodes, &gpu_pods, now, metrics, &opts.pools);
    let mut pending: BTreeMap<String, u32> = BTreeMap::new();
    for p in gpu_pods.iter().filter(|p| p.is_unschedulable()) {
        *pending.entry(p.resource.name(&a.mps_resource)).or_default() += 1;
    }
    let frag = cluster_fragmentation(&nodes);
    if layouts.paused {
        metrics.batch(&pending, 0, frag, now as f64);
        metrics.standing(true, true);
        return Ok(());
    }
    let world = World { nodes: &nodes, pods: &gpu_pods, config: config.as_ref(), now, idle_since: &memory.idle_since };
    let started = std::time::Instant::now();
    // The decision is CPU work: the runtime's other tasks (the Lease's renewal, the Events,
    // the watches) move to another worker meanwhile.
    let outcome = tokio::task::block_in_place(|| decide_with(&world, opts, &mut memory.memo));
    tracing::debug!(
        ms = started.elapsed().as_millis() as u64,
        decisions = outcome.decisions.len(),
        unserved = outcome.not_served.len(),
        placeable = outcome.placeable,
        remembered = memory.memo.hits(),
        judged = memory.memo.misses(),
        "decided a batch"
    );
    for (node, why) in &outcome.held {
        // A node running the DRA plugin is never the controller's to change: said once.
        if why.starts_with(super::decide::DRA_HELD) {
            if memory.dra_nodes.insert(node.clone()) {
                tracing::info!("leaving node {node} alone: it {why}");
            }
            continue;
        }
        tracing::debug!(node = %node, reason = %why, "left alone");
    }
    metrics.batch(&pending, outcome.not_served.len() + refused.len(), frag, now as f64);
    if !outcome.decisions.is_empty() {
        let unblocked: usize = outcome.decisions.iter().map(Decision::unblocks).sum();
        tracing::info!(
            decisions = outcome.decisions.len(),
            unblocked,
            unserved = outcome.not_served.len(),
            ms = started.elapsed().as_millis() as u64,
            "batch decided"
        );
    }
    let made =
        carry_out(a, cluster, leadership, metrics, memory, &nodes, &gpu_pods, &layouts, &outcome, now, &opts.pools)
            .await;
    let by_key: BTreeMap<&str, &GpuPod> = gpu_pods.iter().map(|p| (p.key.as_str(), p)).collect();
    let mut still: BTreeSet<String> = BTreeSet::new();
    for n in outcome.not_served.iter().chain(&refused) {
        still.insert(n.key.clone());
        if memory.told.get(&n.key) == Some(&n.kind) {
            tracing::debug!(pod = %n.key, reason = %n.reason, "still not served");
            continue;
        }
        let (ns, name) = n.key.split_once('/').unwrap_or(("default", &n.key));
        let uid = by_key.get(n.key.as_str()).map_or("", |p| p.uid.as_str());
        // Over the batch's cap, the pod is told at a later batch.
        if cluster.event(&pod_ref(ns, name, uid), true, "NotServed", "Repartition", &n.reason) != Pushed::Dropped {
            memory.told.insert(n.key.clone(), n.kind);
            tracing::info!(pod = %n.key, reason = %n.reason, "not served");
        }
    }
    memory.told.retain(|k, _| still.contains(k));
    if let Some(d) = memory.defrag.as_mut() {
        d.step(cluster, leadership, metrics, &outcome.drains, &made, now).await;
    }
    Ok(())
}

/// Dedicated nodes' idle clocks and the Pending → applied times of changed nodes.
fn track(
    memory: &mut Memory,
    nodes: &[GpuNode],
    pods: &[GpuPod],
    now: i64,
    metrics: &ControllerMetrics,
    pools: &Pools,
) {
    idle_clocks(&mut memory.idle_since, nodes, pods, now, pools);
    for n in nodes {
        let done = memory
            .inflight
            .get(&n.name)
            .is_some_and(|(layout, _)| n.layout() == layout.as_deref() && n.phase() == Phase::Settled);
        if done {
            if let Some((_, since)) = memory.inflight.remove(&n.name) {
                for s in since {
                    metrics.applied_after((now - s).max(0) as f64);
                }
            }
        }
    }
}

fn cluster_fragmentation(nodes: &[GpuNode]) -> Option<f64> {
    let entries: Vec<(String, Option<String>)> =
        nodes.iter().map(|n| (n.name.clone(), n.annotations.get("gpupart.io/fragmentation").cloned())).collect();
    gpupart_cluster::frag::cluster(&entries).ok().map(|c| c.fragmentation_ratio)
}

fn verb(kind: &Kind, dry_run: bool) -> (&'static str, &'static str) {
    match (kind, dry_run) {
        (Kind::Repartition, true) => ("WillRepartition", "will repartition"),
        (Kind::Repartition, false) => ("Repartitioning", "repartitioning"),
        (Kind::Dedicate, true) => ("WillDedicate", "will dedicate"),
        (Kind::Dedicate, false) => ("Dedicating", "dedicating"),
        (Kind::Reclaim, true) => ("WillReclaim", "will return to the shared pool"),
        (Kind::Reclaim, false) => ("Reclaiming", "returning to the shared pool"),
        (Kind::Reserve, true) => ("WillReserve", "will reserve"),
        (Kind::Reserve, false) => ("Reserving", "reserving"),
        (Kind::MakeRoom, true) => ("WillMakeRoom", "will make room on"),
        (Kind::MakeRoom, false) => ("MakingRoom", "making room on"),
    }
}

/// Carries the batch's decisions out; returns the nodes whose patches landed.
#[allow(clippy::too_many_arguments)]
async fn carry_out(
    a: &ControllerArgs,
    cluster: &Cluster,
    leadership: &Leadership,
    metrics: &ControllerMetrics,
    memory: &mut Memory,
    nodes: &[GpuNode],
    pods: &[GpuPod],
    layouts: &Layouts,
    outcome: &Outcome,
    now: i64,
    pools: &Pools,
) -> BTreeSet<String> {
    let mut made = BTreeSet::new();
    let by_key: BTreeMap<&str, &GpuPod> = pods.iter().map(|p| (p.key.as_str(), p)).collect();
    let mut planned: Vec<(&Decision, &GpuNode, Target)> = Vec::new();
    for d in &outcome.decisions {
        let Some(node) = nodes.iter().find(|n| n.name == d.node) else { continue };
        // A room the defragmenter refuses now (its pod's last plan failed) is not made.
        let drain = outcome.drains.iter().find(|x| x.node == d.node && x.room.is_some());
        if let (Some(defrag), Some(drain)) = (memory.defrag.as_mut(), drain) {
            if let Some(why) = defrag.refuses(drain, now) {
                if defrag.tell(&drain.for_pod, &why) {
                    tracing::info!(pod = %drain.for_pod, node = %d.node, reason = %why, "no room made for this pod now");
                }
                continue;
            }
        }
        match target_layout(d) {
            Ok(l) => planned.push((d, node, l)),
            Err(e) => tracing::warn!(node = %d.node, error = %e, "cannot render the layout; skipped"),
        }
    }
    if !a.dry_run && !planned.is_empty() {
        if !leadership.leads() {
            tracing::warn!("lost the Lease; the decisions are left to the next leader");
            return made;
        }
        let generated: Vec<Generated> = planned
            .iter()
            .filter_map(|(_, _, t)| if let Target::Generated(g) = t { Some(g.clone()) } else { None })
            .collect();
        let requested: BTreeSet<String> = planned.iter().filter_map(|(_, _, t)| t.name().map(str::to_string)).collect();
        if let Err(e) = write_layouts(cluster, nodes, requested, &generated, layouts).await {
            tracing::warn!(error = %format!("{e:#}"), "writing the layouts failed; the next batch decides again");
            return made;
        }
    }
    for (d, node, layout) in planned {
        if !a.dry_run && !leadership.leads() {
            tracing::warn!("lost the Lease; the remaining decisions are left to the next leader");
            return made;
        }
        let (reason, words) = verb(&d.kind, a.dry_run);
        let shown = layout.name().unwrap_or("none").to_string();
        let note = format!("{words} node {}: {} (layout {shown})", d.node, d.change);
        // A dry run changes nothing, so the next batches decide the same again: told once.
        if a.dry_run && memory.dry_told.insert(d.node.clone(), note.clone()).as_ref() == Some(&note) {
            continue;
        }
        if !a.dry_run {
            if let Err(e) = patch_node(cluster, node, d, layout.name(), now, pools).await {
                tracing::warn!(node = %d.node, error = %format!("{e:#}"), "not done, the node patch was refused ({note}); the next batch decides again");
                continue;
            }
            made.insert(d.node.clone());
        }
        // Logged once it is done (or, in a dry run, decided).
        tracing::info!(
            node = %d.node,
            kind = d.kind.as_str(),
            layout = %shown,
            pods = d.pods.len(),
            destroyed = d.destroyed,
            created = d.created,
            fragmentation_slices = (d.frag * 1000.0).round() / 1000.0,
            dry_run = a.dry_run,
            "{note}"
        );
        if !a.dry_run {
            let since: Vec<i64> = d
                .pods
                .iter()
                .filter_map(|k| by_key.get(k.as_str()))
                .map(|p| match p.standing {
                    pods::Standing::Unschedulable { since: Some(s) } => s,
                    _ => p.created.unwrap_or(now),
                })
                .collect();
            if !matches!(d.kind, Kind::Reserve | Kind::MakeRoom) {
                memory.inflight.insert(d.node.clone(), (layout.name().map(str::to_string), since));
            }
        }
        metrics.decided(d.kind.as_str(), a.dry_run, d.unblocks());
        let uid = node_uid(cluster, &d.node);
        let node_note = if d.pods.is_empty() { note.clone() } else { format!("{note}; for {}", d.pods.join(", ")) };
        cluster.event(&node_ref(&d.node, uid.as_deref()), false, reason, d.kind.as_str(), &node_note);
        for k in &d.pods {
            let Some(p) = by_key.get(k.as_str()) else { continue };
            memory.told.remove(k);
            cluster.event(&pod_ref(&p.namespace, &p.name, &p.uid), false, reason, d.kind.as_str(), &note);
        }
    }
    made
}

/// Patches the node with the decision. A patch refused because the node changed since it was
/// read (409) is tried again on the fresh node while the decision still holds there (only the
/// agent's status or summary timing changed), a few times, since the agent may write again.
async fn patch_node(
    cluster: &Cluster,
    node: &GpuNode,
    d: &Decision,
    layout: Option<&str>,
    now: i64,
    pools: &Pools,
) -> anyhow::Result<()> {
    let mut current = node.clone();
    for attempt in 1..=PATCH_ATTEMPTS {
        let patch = super::patch::node_patch(&current, d, layout, now, pools);
        match cluster.patch_node(&node.name, &patch).await {
            Err(WriteError::Conflict(what)) => {
                let fresh =
                    cluster.get_node(&node.name).await.with_context(|| format!("re-reading node {}", node.name))?;
                match GpuNode::read(&fresh) {
                    Ok(Some(f)) if super::patch::still_holds(node, &f, pools) && attempt < PATCH_ATTEMPTS => {
                        tracing::debug!(node = %node.name, attempt, "the node changed meanwhile, the decision still holds: patching again");
                        current = f;
                    }
                    Ok(Some(_)) if attempt < PATCH_ATTEMPTS => {
                        anyhow::bail!("{what}: the node's layout, pool or GPUs changed since the decision")
                    }
                    _ => return Err(WriteError::Conflict(what).into()),
                }
            }
            r => return Ok(r?),
        }
    }
    anyhow::bail!("node {} kept changing: {PATCH_ATTEMPTS} patches refused", node.name)
}

/// Tries of one node patch that conflicts while the decision still holds.
const PATCH_ATTEMPTS: u32 = 3;

fn node_uid(cluster: &Cluster, name: &str) -> Option<String> {
    cluster.nodes().iter().find(|n| n.metadata.name.as_deref() == Some(name)).and_then(|n| n.metadata.uid.clone())
}

/// The layout a decision requests.
enum Target {
    /// A generated layout, written into the ConfigMap first.
    Generated(Generated),
    /// A layout already in the config: the one a reclaimed node returns to, or a reserved
    /// node's own (kept while it drains).
    Restore(String),
    /// No layout (a reclaimed node that had none).
    Unset,
}

impl Target {
    fn name(&self) -> Option<&str> {
        match self {
            Target::Generated(g) => Some(&g.name),
            Target::Restore(n) => Some(n),
            Target::Unset => None,
        }
    }
}

fn target_layout(d: &Decision) -> Result<Target, String> {
    match (&d.kind, &d.restore) {
        (Kind::Reclaim | Kind::Reserve, Some(l)) => Ok(Target::Restore(l.clone())),
        (Kind::Reclaim | Kind::Reserve, None) => Ok(Target::Unset),
        _ => super::layouts::generate(d.model, &d.specs).map(Target::Generated),
    }
}

/// Writes the batch's generated layouts into the ConfigMap in one update (generated layouts no
/// node requests are dropped), before any node asks for them.
async fn write_layouts(
    cluster: &Cluster,
    nodes: &[GpuNode],
    requested: BTreeSet<String>,
    generated: &[Generated],
    read: &Layouts,
) -> anyhow::Result<()> {
    // Layouts nodes request now stay too (a node whose patch fails keeps asking for its own);
    // the next write drops them once no node does.
    let mut in_use: BTreeSet<String> = nodes.iter().filter_map(|n| n.layout().map(str::to_string)).collect();
    in_use.extend(requested);
    let mut fresh: Option<Layouts> = None;
    for attempt in 0..3 {
        let current = fresh.as_ref().unwrap_or(read);
        let Some(text) = super::layouts::merge(&current.text, generated, &in_use)? else { return Ok(()) };
        match cluster.write_layouts(current, &text).await {
            Ok(()) => break,
            Err(WriteError::Conflict(_)) if attempt < 2 => {
                fresh = Some(cluster.layouts().await.context("re-reading the layouts ConfigMap")?);
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The agents watch the ConfigMap: give the new layouts a moment to reach them first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
