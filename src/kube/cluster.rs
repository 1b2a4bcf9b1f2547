//! Reading the whole cluster's node summaries (for `plan --from-cluster` and `frag --cluster`):
//! one metadata-only list of the Nodes, so the kubelets' status never crosses the wire.

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// Every node's name with the value of annotation `key` (`None` where the node lacks it).
pub async fn node_annotations(client: kube::Client, key: &str) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let api: Api<Node> = Api::all(client);
    let list = api.list_metadata(&ListParams::default()).await.context("listing the cluster's nodes")?;
    Ok(list
        .items
        .into_iter()
        .map(|n| {
            let value = n.metadata.annotations.as_ref().and_then(|a| a.get(key)).cloned();
            (n.metadata.name.unwrap_or_default(), value)
        })
        .collect())
}

/// [`node_annotations`] from a blocking command: connects with the default kubeconfig (or the
/// in-cluster service account) on a small runtime of its own.
pub fn read_node_annotations(key: &str) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    rt.block_on(async {
        let client = super::client().await?;
        node_annotations(client, key).await
    })
}
