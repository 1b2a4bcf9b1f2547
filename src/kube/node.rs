//! Watches the own Node (metadata only, field selector on its name) and keeps the latest labels
//! and annotations. The watcher re-lists after errors and 410 Gone on its own; errors are logged
//! and the stream continues, so a flaky API server never stops NVML work or `/healthz`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

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
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let obj = match ev {
                    Ok(Event::Apply(o) | Event::InitApply(o)) => o,
                    Ok(Event::Delete(_) | Event::Init | Event::InitDone) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "node watch error; re-listing with backoff");
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
