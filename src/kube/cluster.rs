//! Reading the whole cluster's node summaries (for `plan --from-cluster` and `frag --cluster`):
//! one metadata-only list of the Nodes, so the kubelets' status never crosses the wire.

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;

/// One Node's name, labels and annotations, as listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMeta {
    /// Node name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Every Node's metadata (one metadata-only list).
pub async fn nodes_metadata(client: kube::Client) -> anyhow::Result<Vec<NodeMeta>> {
    let api: Api<Node> = Api::all(client);
    let list = api.list_metadata(&ListParams::default()).await.context("listing the cluster's nodes")?;
    Ok(list
        .items
        .into_iter()
        .map(|n| NodeMeta {
            name: n.metadata.name.unwrap_or_default(),
            labels: n.metadata.labels.unwrap_or_default(),
            annotations: n.metadata.annotations.unwrap_or_default(),
        })
        .collect())
}

/// [`nodes_metadata`] from a blocking command: connects with the default kubeconfig (or the
/// in-cluster service account) on a small runtime of its own.
pub fn read_nodes() -> anyhow::Result<Vec<NodeMeta>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    rt.block_on(async {
        let client = super::client().await?;
        nodes_metadata(client).await
    })
}

/// Every node's name with the value of annotation `key` (`None` where the node lacks it), from
/// a blocking command.
pub fn read_node_annotations(key: &str) -> anyhow::Result<Vec<(String, Option<String>)>> {
    Ok(read_nodes()?.into_iter().map(|mut n| (n.name, n.annotations.remove(key))).collect())
}
