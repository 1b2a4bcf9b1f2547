//! The plugin's claim handling and publication loop: Prepare reads each claim from the API and
//! has the node driver create its devices; Unprepare has them destroyed; both wake the
//! publisher, which also runs on every claim-watch change and on the resync interval.

use super::claims;
use super::publisher::Publisher;
use super::watch::Held;
use crate::kubelet::dra::{Claim, Device, NodePrepareResourceResponse, NodeUnprepareResourceResponse};
use crate::kubelet::dra_plugin::ClaimHandler;
use crate::metrics::Metrics;
use gpupart_node::backend::GpuBackend;
use gpupart_node::dra::devices::DeviceRef;
use gpupart_node::dra::driver::Driver;
use gpupart_node::dra::order::order;
use gpupart_node::dra::reservation;
use gpupart_node::dra::unavailable::unavailable;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Everything the plugin's handlers and publisher share.
pub struct DraNode {
    /// The GPUs.
    pub backend: Arc<dyn GpuBackend>,
    /// The node side: checkpoint, Prepare, Unprepare.
    pub driver: Mutex<Driver>,
    /// The API.
    pub client: kube::Client,
    /// The DRA driver name.
    pub driver_name: String,
    /// The node (and pool) name.
    pub node: String,
    /// Devices allocated to claims (from the watch).
    pub held: Held,
    /// Whether the claim watch runs (then `held` is what the scheduler counts).
    pub watching: bool,
    /// Wakes the publisher.
    pub republish: Arc<Notify>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Events on claims that failed.
    pub events: super::events::ClaimEvents,
    /// The node summary annotations (as the label-driven agent writes them).
    pub summaries: crate::kube::KubeReporter,
    /// The node's labels and annotations (the controller's reservation for a waiting claim).
    pub node_view: crate::kube::NodeWatch,
    /// The last reservation annotation that could not be used, and why (logged once).
    pub bad_reservation: Mutex<Option<String>>,
    /// The record of unhealthy GPUs (their devices are tainted and not prepared).
    pub health: Arc<crate::gpu_health::GpuHealth>,
    /// The unhealthy taint's effect.
    pub taint_effect: &'static str,
}

impl DraNode {
    fn record(&self, op: &str, started: Instant, failed: Option<&str>) {
        if let Some(m) = self.metrics.dra() {
            m.operation(op, started.elapsed().as_secs_f64(), failed);
        }
    }

    async fn prepare_one(self: &Arc<Self>, c: &Claim) -> Result<Vec<Device>, (String, &'static str)> {
        let label = format!("{}/{}", c.namespace, c.name);
        let read = claims::read(&self.client, &c.namespace, &c.name).await;
        let wanted = read
            .and_then(|rc| claims::to_prepare(&rc, &c.uid, &self.driver_name))
            .map_err(|p| (format!("claim {label}: {p}"), p.reason()))?;
        let me = self.clone();
        let granted = tokio::task::spawn_blocking(move || {
            let mut d = me.driver.lock().unwrap_or_else(|e| e.into_inner());
            let book = me.health.snapshot();
            d.fence(book);
            d.prepare(me.backend.as_ref(), &wanted)
        })
        .await
        .map_err(|e| (format!("claim {label}: {e}"), "internal"))?
        .map_err(|e| (e.to_string(), e.reason.as_str()))?;
        Ok(granted
            .into_iter()
            .map(|g| Device {
                request_names: g.requests,
                pool_name: g.pool,
                device_name: g.device,
                cdi_device_ids: g.cdi_ids,
                share_id: g.share_id,
            })
            .collect())
    }
}

#[tonic::async_trait]
impl ClaimHandler for Arc<DraNode> {
    async fn prepare(&self, claims: Vec<Claim>) -> HashMap<String, NodePrepareResourceResponse> {
        let mut out = HashMap::new();
        for c in claims {
            let started = Instant::now();
            let answer = match self.prepare_one(&c).await {
                Ok(devices) => {
                    self.record("prepare", started, None);
                    self.events.forget(&c.uid);
                    NodePrepareResourceResponse { devices, error: String::new() }
                }
                Err((error, reason)) => {
                    tracing::warn!(%error, "prepare failed");
                    self.record("prepare", started, Some(reason));
                    self.events.prepare_failed(&c.namespace, &c.name, &c.uid, &error);
                    NodePrepareResourceResponse { devices: Vec::new(), error }
                }
            };
            out.insert(c.uid, answer);
        }
        self.republish.notify_one();
        out
    }

    async fn unprepare(&self, claims: Vec<Claim>) -> HashMap<String, NodeUnprepareResourceResponse> {
        let mut out = HashMap::new();
        for c in claims {
            let started = Instant::now();
            let me = self.clone();
            let uid = c.uid.clone();
            let done = tokio::task::spawn_blocking(move || {
                let mut d = me.driver.lock().unwrap_or_else(|e| e.into_inner());
                d.unprepare(me.backend.as_ref(), &uid)
            })
            .await;
            let error = match done {
                Ok(Ok(())) => {
                    self.record("unprepare", started, None);
                    String::new()
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "unprepare failed");
                    self.record("unprepare", started, Some(e.reason.as_str()));
                    e.to_string()
                }
                Err(e) => format!("claim {}/{}: {e}", c.namespace, c.name),
            };
            out.insert(c.uid, NodeUnprepareResourceResponse { error });
        }
        self.republish.notify_one();
        out
    }
}

/// Publishes now and whenever woken (or every `resync`); marks the plugin ready after the first
/// publication.
pub async fn publish_loop(
    node: Arc<DraNode>,
    mut publisher: Publisher,
    health: Arc<crate::http::Health>,
    resync: Duration,
) {
    let mut outage = crate::kube::outage::Outage::new("publishing ResourceSlices");
    loop {
        let me = node.clone();
        let computed = tokio::task::spawn_blocking(move || {
            // The GPUs are read under the driver's lock, so what they hold and what the
            // checkpoint says the claims hold are of one moment (a Prepare or Unprepare half seen
            // would make an instance look like no claim's and taint what it blocks).
            let d = me.driver.lock().unwrap_or_else(|e| e.into_inner());
            // Shares keep their daemon: one that died is started again (its clients' limits are
            // in their own environment).
            let mut shares = std::collections::BTreeMap::new();
            for (gpu, (n, memory_bytes)) in d.shares() {
                let daemon_up = match d.revive_daemon(me.backend.as_ref(), gpu) {
                    Ok(true) => {
                        tracing::warn!(gpu, "the MPS daemon of prepared shares was gone; started again");
                        true
                    }
                    Ok(false) => true,
                    Err(e) => {
                        tracing::error!(gpu, error = %e, "the MPS daemon of prepared shares cannot start");
                        false
                    }
                };
                shares.insert(gpu, super::metrics::GpuShares { shares: n, memory_bytes, daemon_up });
            }
            let states = me.backend.observe_all()?;
            let tables = |g: u32| states.iter().find(|s| s.info.index == g).map(|s| &s.profiles);
            let held = me.held.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let pending: Vec<DeviceRef> = held
                .iter()
                .filter(|(uid, _)| !d.is_prepared(uid))
                .flat_map(|(_, names)| names.iter().filter_map(|n| DeviceRef::parse(n, tables)))
                .collect();
            let views = d.views(&states, &pending);
            let offered = order(&views);
            // What the scheduler's counters account: every device of the claims allocated from
            // the pool (the watch's view); without the watch, what the checkpoint holds. An
            // instance of a claim that is gone but still in use is then no claim's, and the
            // devices it blocks are tainted.
            let claimed: Vec<DeviceRef> = if me.watching {
                held.values().flatten().filter_map(|n| DeviceRef::parse(n, tables)).collect()
            } else {
                d.prepared_devices().into_iter().chain(pending.iter().copied()).collect()
            };
            let mut unavailable = unavailable(&views, &d.claimed_views(&states, &claimed));
            // Room the controller reserved for a waiting claim: what it cannot use is tainted.
            let (reserved, problem) =
                reservation::reserved(&me.node_view.view().annotations, crate::clock::now_secs(), tables);
            for (d, why) in reserved {
                unavailable.entry(d).or_insert(why);
            }
            let problem = problem.map(|e| e.to_string());
            let mut last = me.bad_reservation.lock().unwrap_or_else(|e| e.into_inner());
            if problem != *last {
                if let Some(p) = &problem {
                    tracing::warn!(error = %p, "ignoring the reservation");
                }
                *last = problem;
            }
            drop(last);
            let prepared = d.checkpoint().claims.len();
            let foreign = gpupart_node::dra::devices::foreign(&states, &claimed);
            Ok::<_, gpupart_node::backend::BackendError>((states, offered, unavailable, prepared, shares, foreign))
        })
        .await;
        match computed {
            Ok(Ok((states, offered, unavailable, prepared, shares, foreign))) => {
                let gpus = publisher.catalog.gpus(&states, &publisher.driver_version);
                let book = node.health.snapshot();
                let fenced: std::collections::BTreeMap<DeviceRef, _> =
                    gpupart_node::dra::publish::fenced_devices(&gpus, &book)
                        .into_iter()
                        .map(|(d, f)| {
                            let value = gpupart_node::health::taint_value(&f.fault);
                            (
                                d,
                                gpupart_node::dra::publish::unhealthy_taint(
                                    &node.driver_name,
                                    &value,
                                    node.taint_effect,
                                ),
                            )
                        })
                        .collect();
                node.metrics.health().show(&book, states.len() as u32);
                match publisher.publish(&gpus, &offered, &unavailable, &fenced).await {
                    Ok(p) => {
                        outage.ok();
                        health.beat();
                        health.set_ready();
                        if let Some(m) = node.metrics.dra() {
                            m.published(p.devices, prepared);
                            m.shares(&shares);
                        }
                        node.metrics.update(&states, None, 0.0);
                        let mut frags = gpupart_node::frag::node_gpu_frags(&states, &[], None);
                        // MPS shares count as label mode's slots: the server's clients, one a share.
                        for (f, s) in frags.iter_mut().zip(&states) {
                            if let Some(g) = shares.get(&s.info.index) {
                                let clients = gpupart_node::mps::settings::max_clients(&s.info);
                                gpupart_node::frag::count_mps_slots(f, clients, g.shares.min(clients));
                            }
                        }
                        let mut summary = crate::kube::summary::summarize(&states, frags, false, &book, &foreign);
                        // Tells the controller (and anyone reading the node) that devices are
                        // made per claim here, never by layout.
                        summary
                            .annotations
                            .insert(crate::kube::keys::DRA_DRIVER_SUFFIX.into(), node.driver_name.clone());
                        node.summaries.publish_summary(summary);
                        tracing::debug!(
                            devices = p.devices,
                            written = p.written,
                            deleted = p.deleted,
                            generation = p.generation,
                            "published"
                        );
                    }
                    Err(e) => {
                        let wait = outage.failed(&format!("{e:#}"));
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "reading the GPUs for publication failed"),
            Err(e) => tracing::error!(error = %e, "the publication task failed"),
        }
        // A reservation in force is lifted when it expires, not at the next resync.
        let expires = reservation::expires_in(&node.node_view.view().annotations, crate::clock::now_secs())
            .map(|left| Duration::from_secs(left as u64 + 1));
        tokio::select! {
            _ = node.republish.notified() => {}
            _ = tokio::time::sleep(expires.map_or(resync, |e| e.min(resync))) => {}
        }
    }
}
