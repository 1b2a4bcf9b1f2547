//! GPU-client pausing, compatible with NVIDIA's GPU Operator: every `nvidia.com/gpu.deploy.<x>`
//! label that is `true` becomes `paused-for-mig-change` (one patch, which also records the paused
//! keys in an annotation), the agent waits (bounded) for the pods on this node that select on
//! those labels to go, and afterwards always restores the labels — also after its own restart.

use super::keys::PAUSED_CLIENTS;
use super::node::NodeWatch;
use crate::agent::reconcile::{Clients, PauseError};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch};
use kube::{Api, Client};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// Prefix of the GPU Operator's operand labels.
pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
/// The value that makes operand DaemonSets leave a node.
pub const PAUSED: &str = "paused-for-mig-change";

/// Pauses and restores the GPU Operator's clients on one node.
pub struct KubeClients {
    client: Client,
    node: String,
    watch: NodeWatch,
    timeout: Duration,
    handle: tokio::runtime::Handle,
}

impl KubeClients {
    /// Pausing for `node`; `handle` runs the API calls from the reconcile thread.
    pub fn new(
        client: Client,
        node: String,
        watch: NodeWatch,
        timeout: Duration,
        handle: tokio::runtime::Handle,
    ) -> Self {
        Self { client, node, watch, timeout, handle }
    }
}

async fn merge_patch(
    client: &Client,
    node: &str,
    labels: Map<String, Value>,
    annotation: Value,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({ "metadata": { "labels": labels, "annotations": { PAUSED_CLIENTS: annotation } } });
    api.patch_metadata(node, &super::keys::merge_params(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// Restores labels this agent paused (listed in the annotation), retrying on API errors.
pub async fn restore(client: &Client, node: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let mut outage = super::outage::Outage::new("restoring GPU client labels");
    for _ in 0..200 {
        let result = async {
            let n = api.get_metadata(node).await?;
            let Some(list) = n.metadata.annotations.as_ref().and_then(|a| a.get(PAUSED_CLIENTS)).cloned() else {
                return Ok(());
            };
            let labels = n.metadata.labels.unwrap_or_default();
            let restore: Map<String, Value> =
                to_restore(&list, &labels).into_iter().map(|k| (k, json!("true"))).collect();
            tracing::info!(labels = ?restore.keys().collect::<Vec<_>>(), "restoring paused GPU clients");
            merge_patch(client, node, restore, Value::Null).await
        }
        .await;
        match result {
            Ok(()) => return outage.ok(),
            Err(e) => tokio::time::sleep(outage.failed(&e)).await,
        }
    }
    tracing::error!("could not restore GPU client labels; they are restored at the next start");
}

impl KubeClients {
    async fn pause_async(&self) -> Result<(), PauseError> {
        let view = self.watch.view();
        let keys: Vec<String> = view
            .labels
            .iter()
            .filter(|(k, v)| k.starts_with(DEPLOY_PREFIX) && *v == "true")
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let labels: Map<String, Value> = keys.iter().map(|k| (k.clone(), json!(PAUSED))).collect();
        merge_patch(&self.client, &self.node, labels, json!(keys.join(","))).await.map_err(|e| {
            let why = format!("pausing {}: {e}", keys.join(", "));
            if unreachable(&e) {
                PauseError::Unreachable(why)
            } else {
                PauseError::NotStopped(why)
            }
        })?;
        tracing::info!(labels = ?keys, "paused GPU clients; waiting for their pods to stop");
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let deadline = Instant::now() + self.timeout;
        loop {
            let remaining: Vec<String> = match pods.list(&lp).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|p| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_selector.as_ref())
                            .is_some_and(|sel| keys.iter().any(|k| sel.contains_key(k)))
                    })
                    .map(|p| {
                        format!(
                            "{}/{}",
                            p.metadata.namespace.as_deref().unwrap_or(""),
                            p.metadata.name.as_deref().unwrap_or("")
                        )
                    })
                    .collect(),
                Err(e) if unreachable(&e) => return Err(PauseError::Unreachable(format!("listing pods: {e}"))),
                Err(e) => vec![format!("(cannot list pods: {e})")],
            };
            if remaining.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let why = format!("timed out after {:?} waiting for {} to stop", self.timeout, remaining.join(", "));
                return Err(PauseError::NotStopped(why));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Clients for KubeClients {
    fn pause(&self) -> Result<(), PauseError> {
        self.handle.block_on(self.pause_async())
    }

    fn resume(&self) {
        self.handle.block_on(restore(&self.client, &self.node));
    }
}

/// Whether an error means the API was not reached (as opposed to an answer refusing the request).
fn unreachable(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(_))
}

/// The labels to set back to `true`: those named in the paused-clients annotation (read back
/// from the Node, so any text) that still hold the paused value.
pub fn to_restore(annotation: &str, labels: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    annotation
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty() && labels.get(*k).map(String::as_str) == Some(PAUSED))
        .map(str::to_string)
        .collect()
}
