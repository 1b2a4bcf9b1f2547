//! Watches the own Node (metadata only, field selector on its name) and keeps the latest labels
//! and annotations. A 410 (resourceVersion gone, e.g. after an API-server restart) re-lists at
//! once; other errors retry within a second, logged once per outage; the stream continues, so a
//! flaky API server never stops NVML work or `/healthz`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

use super::outage::Outage;

/// The latest metadata of the own Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Whether the Node has been seen at all.
    pub seen: bool,
}

/// Shared, continuously updated view of the Node.
#[derive(Debug, Clone, Default)]
pub struct NodeWatch {
    view: Arc<Mutex<NodeView>>,
}

impl NodeWatch {
    /// The latest view.
    pub fn view(&self) -> NodeView {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts watching `node`; `changed` receives a message whenever any of `keys` (labels or
    /// annotations) changes value — not on every update, since the agent's own writes come back.
    pub fn spawn(client: Client, node: &str, keys: Vec<String>, changed: mpsc::Sender<()>) -> Self {
        let this = Self::default();
        let view = this.view.clone();
        let api: Api<PartialObjectMeta<Node>> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        tokio::spawn(async move {
            // No stream backoff: a 410 (the resourceVersion is gone, e.g. after an API-server
            // restart) re-lists at once; other errors wait at most a second (`Outage`).
            let mut stream = watcher::watcher(api, config).boxed();
            let mut outage = Outage::new("watching the node");
            while let Some(ev) = stream.next().await {
                let obj = match ev {
                    Ok(Event::Apply(o) | Event::InitApply(o)) => {
                        outage.ok();
                        o
                    }
                    Ok(Event::Delete(_) | Event::Init | Event::InitDone) => {
                        outage.ok();
                        continue;
                    }
                    Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                        tracing::debug!(message = %status.message, "node watch expired; re-listing now");
                        continue;
                    }
                    Err(e) => {
                        tokio::time::sleep(outage.failed(&e)).await;
                        continue;
                    }
                };
                let next = NodeView {
                    labels: obj.metadata.labels.unwrap_or_default(),
                    annotations: obj.metadata.annotations.unwrap_or_default(),
                    seen: true,
                };
                let relevant = |v: &NodeView| -> Vec<Option<String>> {
                    keys.iter().map(|k| v.labels.get(k).or_else(|| v.annotations.get(k)).cloned()).collect()
                };
                let fire = {
                    let mut cur = view.lock().unwrap_or_else(|e| e.into_inner());
                    let fire = !cur.seen || relevant(&cur) != relevant(&next);
                    *cur = next;
                    fire
                };
                if fire && changed.send(()).await.is_err() {
                    return;
                }
            }
        });
        this
    }
}

/// Removes a request annotation from Node `node` once it was acted on (logged when it fails).
pub async fn remove_annotation(client: &kube::Client, node: &str, key: &str) {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { key: null } } });
    let pp = crate::kube::keys::merge_params();
    if let Err(e) = api.patch_metadata(node, &pp, &kube::api::Patch::Merge(&patch)).await {
        tracing::warn!(error = %e, annotation = key, "removing the annotation failed");
    }
}

/// What a start says when this node's Node does not exist (a wrong `--node-name`).
pub fn missing(node: &str, server: &str) -> String {
    format!("node {node} does not exist at {server}: --node-name (or NODE_NAME) must name this node's Node")
}
