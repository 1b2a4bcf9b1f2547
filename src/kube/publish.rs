//! Publishes agent state on the Node: the state label and `gpupart.io/` annotations through
//! server-side apply under one field manager (keys we stop sending are removed, other managers'
//! keys are never touched; the layout label is never written), and an Event per transition.
//! Unchanged states cause no API writes. Failed writes are retried with backoff, newest state first.

use super::keys::{FIELD_MANAGER, STATE_LABEL, STATE_LAYOUT, STATE_REASON};
use crate::agent::report::Reporter;
use crate::agent::status::{AgentStatus, Phase};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;

/// The [`Reporter`] for Kubernetes: hands statuses to a background publisher task.
pub struct KubeReporter {
    tx: mpsc::UnboundedSender<AgentStatus>,
}

/// What identifies a published state: only a change of these writes anything.
fn key(s: &AgentStatus) -> (Phase, Option<String>, String) {
    (s.state, s.layout.clone(), s.reason.clone())
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
    /// Starts the publisher for `node`.
    pub fn spawn(client: Client, node: String, instance: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<AgentStatus>();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(client.clone());
            let recorder = Events { api: Api::namespaced(client, "default"), instance, node: node.clone() };
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..Default::default()
            };
            let mut last: Option<(Phase, Option<String>, String)> = None;
            // In order, so every transition (pending → success/failed) is visible.
            while let Some(status) = rx.recv().await {
                publish(&api, &recorder, &reference, &node, &status, &mut last).await;
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
        self.api.create(&PostParams::default(), &ev).await.map(|_| ())
    }
}

async fn publish(
    api: &Api<Node>,
    recorder: &Events,
    reference: &ObjectReference,
    node: &str,
    status: &AgentStatus,
    last: &mut Option<(Phase, Option<String>, String)>,
) {
    if status.state == Phase::Idle || last.as_ref() == Some(&key(status)) {
        return;
    }
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": { STATE_LABEL: status.state.as_str() },
            "annotations": {
                STATE_REASON: truncate(&status.reason, 4000),
                STATE_LAYOUT: status.layout.clone().unwrap_or_default(),
            },
        },
    });
    let mut delay = Duration::from_millis(200);
    loop {
        match api.patch_metadata(node, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
            Ok(_) => break,
            Err(e) => {
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "publishing the node state failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
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
    *last = Some(key(status));
}

impl Reporter for KubeReporter {
    fn publish(&self, status: &AgentStatus) {
        let _ = self.tx.send(status.clone());
    }
}
