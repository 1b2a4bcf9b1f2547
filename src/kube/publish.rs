//! Publishes agent state on the Node: the state label and `gpupart.io/` annotations through
//! server-side apply under one field manager (keys we stop sending are removed, other managers'
//! keys are never touched; the layout label is never written), and an Event per transition.
//! Unchanged states cause no API writes. Failed writes are retried with backoff, newest state first.

use super::keys::{FIELD_MANAGER, SIMULATED, STATE_LABEL, STATE_LAYOUT, STATE_REASON};
use super::summary::Summary;
use crate::agent::report::{Notice, Reporter};
use crate::agent::status::{AgentStatus, Phase};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the publisher task is told.
enum Update {
    Status(AgentStatus, Option<Notice>),
    Summary(Summary),
    /// A status and the summary of the GPUs it describes, applied together.
    StatusWithSummary(AgentStatus, Summary),
    /// An Event alone (the DRA plugin has no state label).
    Notice(Notice),
}

/// The [`Reporter`] for Kubernetes: hands statuses (and node summaries) to a background publisher
/// task, which applies everything the agent owns in one server-side apply.
#[derive(Clone)]
pub struct KubeReporter {
    tx: mpsc::UnboundedSender<Update>,
}

/// What identifies a published state: only a change of these writes anything. A success is the
/// layout alone: a resync that finds the layout applied keeps the reason of the change that
/// applied it (every change passes through `pending`, so a new success is always published).
type Key = (Phase, Option<String>, Option<String>);

fn key(s: &AgentStatus) -> Key {
    (s.state, s.layout.clone(), (s.state != Phase::Success).then(|| s.reason.clone()))
}

/// The node's labels and annotations as the publisher found them at start.
type Published = (BTreeMap<String, String>, BTreeMap<String, String>);

/// Reads what the node shows now (one GET; `None` when it cannot be read).
async fn published(api: &Api<Node>, node: &str) -> Option<Published> {
    match api.get_metadata(node).await {
        Ok(n) => Some((n.metadata.labels.unwrap_or_default(), n.metadata.annotations.unwrap_or_default())),
        Err(e) => {
            tracing::debug!(error = %e, "reading the published state failed; the first state is written");
            None
        }
    }
}

/// The state a previous agent published on the node, if any.
fn published_status((labels, annotations): &Published) -> Option<AgentStatus> {
    let phase = Phase::parse(labels.get(STATE_LABEL)?)?;
    let layout = annotations.get(STATE_LAYOUT).filter(|l| !l.is_empty()).cloned();
    Some(AgentStatus::new(phase, layout, annotations.get(STATE_REASON).cloned().unwrap_or_default()))
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl KubeReporter {
    /// Starts the publisher for `node`; summary keys get `prefix` (e.g. `gpupart.io/`) and are
    /// rewritten at most once per `min_interval`; with `simulated` (the simulator's GPUs) the node
    /// carries `gpupart.io/simulated=true`.
    pub fn spawn(
        client: Client,
        node: String,
        instance: String,
        prefix: String,
        min_interval: Duration,
        simulated: bool,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Update>();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(client.clone());
            let recorder = Events { api: Api::namespaced(client, "default"), instance, node: node.clone() };
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..Default::default()
            };
            let mut last: Option<Key> = None;
            let mut owned = Owned { simulated, ..Owned::default() };
            // A restarted agent that finds its own state on the node does not write it again.
            let mut on_node = published(&api, &node).await;
            if let Some(st) = on_node.as_ref().and_then(published_status) {
                last = Some(key(&st));
                owned.state = Some(st);
            }
            let mut last_summary_write: Option<tokio::time::Instant> = None;
            let mut deferred: Option<Summary> = None;
            loop {
                let wait = match (&deferred, last_summary_write) {
                    (Some(_), Some(t)) => (t + min_interval).saturating_duration_since(tokio::time::Instant::now()),
                    _ => Duration::from_secs(3600),
                };
                let update = tokio::select! {
                    u = rx.recv() => match u { Some(u) => Some(u), None => return },
                    _ = tokio::time::sleep(wait), if deferred.is_some() => None,
                };
                match update {
                    // In order, so every transition (pending → success/failed) is visible.
                    Some(Update::Status(status, notice))
                        if status.state != Phase::Idle && last.as_ref() != Some(&key(&status)) =>
                    {
                        owned.state = Some(status.clone());
                        apply(&api, &node, &owned, &prefix, &mut on_node).await;
                        match notice {
                            Some(n) => notify(&recorder, &reference, &n).await,
                            None => event(&recorder, &reference, &status).await,
                        }
                        last = Some(key(&status));
                    }
                    Some(Update::Status(_, Some(n))) => notify(&recorder, &reference, &n).await,
                    Some(Update::StatusWithSummary(status, summary)) => {
                        let new_state = status.state != Phase::Idle && last.as_ref() != Some(&key(&status));
                        let new_summary = owned.summary.as_ref() != Some(&summary);
                        if new_state {
                            owned.state = Some(status.clone());
                        }
                        if new_summary {
                            owned.summary = Some(summary);
                            deferred = None;
                            last_summary_write = Some(tokio::time::Instant::now());
                        }
                        if new_state || new_summary {
                            apply(&api, &node, &owned, &prefix, &mut on_node).await;
                        }
                        if new_state {
                            event(&recorder, &reference, &status).await;
                            last = Some(key(&status));
                        }
                    }
                    Some(Update::Summary(s)) => deferred = Some(s),
                    Some(Update::Notice(n)) => notify(&recorder, &reference, &n).await,
                    Some(Update::Status(_, None)) | None => {}
                }
                let due = last_summary_write.is_none_or(|t| t.elapsed() >= min_interval);
                let next = if due { deferred.take() } else { None };
                if let Some(s) = next.filter(|s| owned.summary.as_ref() != Some(s)) {
                    owned.summary = Some(s);
                    apply(&api, &node, &owned, &prefix, &mut on_node).await;
                    last_summary_write = Some(tokio::time::Instant::now());
                }
            }
        });
        Self { tx }
    }
}

/// Creates one events.k8s.io/v1 Event per transition (each with its own note; no series merging).
struct Events {
    api: Api<Event>,
    instance: String,
    node: String,
}

impl Events {
    async fn publish(
        &self,
        type_: &str,
        reason: &str,
        note: String,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", self.node, now.as_nanosecond())),
                namespace: Some("default".into()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some("Reconfigure".into()),
            reason: Some(reason.into()),
            note: Some(note),
            type_: Some(type_.into()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some("gpupart.io/agent".into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        self.api.create(&pp, &ev).await.map(|_| ())
    }
}

/// Everything the agent owns on the Node; every apply sends all of it (keys left out would be
/// removed by server-side apply).
#[derive(Default)]
struct Owned {
    state: Option<AgentStatus>,
    summary: Option<Summary>,
    /// The GPUs are the simulator's: `gpupart.io/simulated=true` on every write.
    simulated: bool,
}

/// Applies everything owned; the first apply is skipped when the node already shows all of it
/// (`on_node`, what the node held at start).
async fn apply(api: &Api<Node>, node: &str, owned: &Owned, prefix: &str, on_node: &mut Option<Published>) {
    let mut labels = serde_json::Map::new();
    let mut annotations = serde_json::Map::new();
    if let Some(status) = &owned.state {
        labels.insert(STATE_LABEL.into(), json!(status.state.as_str()));
        annotations.insert(STATE_REASON.into(), json!(truncate(&status.reason, 4000)));
        annotations.insert(STATE_LAYOUT.into(), json!(status.layout.clone().unwrap_or_default()));
    }
    if owned.simulated {
        labels.insert(SIMULATED.into(), json!("true"));
    }
    if let Some(s) = &owned.summary {
        for (k, v) in &s.labels {
            labels.insert(format!("{prefix}{k}"), json!(v));
        }
        for (k, v) in &s.annotations {
            annotations.insert(format!("{prefix}{k}"), json!(v));
        }
    }
    if let Some((have_labels, have_annotations)) = on_node.take() {
        let shown = |want: &serde_json::Map<String, serde_json::Value>, have: &BTreeMap<String, String>| {
            want.iter().all(|(k, v)| v.as_str().is_some_and(|v| have.get(k).map(String::as_str) == Some(v)))
        };
        if shown(&labels, &have_labels) && shown(&annotations, &have_annotations) {
            tracing::debug!("the node already shows this state and summary; nothing written");
            return;
        }
    }
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node, "labels": labels, "annotations": annotations },
    });
    let mut outage = super::outage::Outage::new("publishing the node state");
    loop {
        match api.patch_metadata(node, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
            Ok(_) => return outage.ok(),
            Err(e) => tokio::time::sleep(outage.failed(&e)).await,
        }
    }
}

async fn event(recorder: &Events, reference: &ObjectReference, status: &AgentStatus) {
    let layout = status.layout.as_deref().unwrap_or("-");
    let (type_, reason) = match status.state {
        Phase::Pending => ("Normal", "ReconfigureStarted"),
        Phase::Success => ("Normal", "Reconfigured"),
        Phase::Rebooting => ("Warning", "Rebooting"),
        Phase::Failed => ("Warning", "ReconfigureFailed"),
        Phase::Idle => return,
    };
    let note = match status.state {
        Phase::Success | Phase::Failed => format!(
            "{layout}: {} (kept {}, destroyed {}, created {} GPU instances, {} ms)",
            status.reason, status.kept, status.destroyed, status.created, status.duration_ms
        ),
        _ => format!("{layout}: {}", status.reason),
    };
    if let Err(e) = recorder.publish(type_, reason, truncate(&note, 1000), reference).await {
        tracing::warn!(error = %e, "recording the event failed");
    }
}

async fn notify(recorder: &Events, reference: &ObjectReference, n: &Notice) {
    if let Err(e) = recorder.publish(n.type_, n.reason, truncate(&n.note, 1000), reference).await {
        tracing::warn!(error = %e, "recording the event failed");
    }
}

impl KubeReporter {
    /// Publishes a status and the node summary of the GPUs it describes in one write (the summary
    /// is not rate-limited here: it belongs to the state).
    pub fn publish_with_summary(&self, status: &AgentStatus, summary: Summary) {
        let _ = self.tx.send(Update::StatusWithSummary(status.clone(), summary));
    }

    /// Publishes a node summary (applied only when it differs from the last one, rate-limited).
    pub fn publish_summary(&self, summary: Summary) {
        let _ = self.tx.send(Update::Summary(summary));
    }

    /// Records an Event on the node, with no state.
    pub fn notice(&self, notice: Notice) {
        let _ = self.tx.send(Update::Notice(notice));
    }
}

impl Reporter for KubeReporter {
    fn publish(&self, status: &AgentStatus) {
        let _ = self.tx.send(Update::Status(status.clone(), None));
    }

    fn publish_notice(&self, status: &AgentStatus, notice: &Notice) {
        let _ = self.tx.send(Update::Status(status.clone(), Some(notice.clone())));
    }
}
