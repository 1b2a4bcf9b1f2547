//! Kubernetes side of the agent: watch the own Node's metadata for the layout label, publish the
//! state label, `gpupart.io/` annotations (server-side apply, one field manager) and Events.

pub mod cluster;
pub mod keys;
pub mod node;
pub mod outage;
pub mod pause;
pub mod publish;
pub mod summary;

pub use node::{NodeView, NodeWatch};
pub use publish::KubeReporter;

/// `User-Agent` of every request: `gpupart/<version>`.
pub const USER_AGENT: &str = concat!("gpupart/", env!("CARGO_PKG_VERSION"));

/// A client from the kubeconfig or the in-cluster service account whose every request names
/// gpupart in its `User-Agent`, so an operator can tell its writes in audit logs.
pub async fn client() -> anyhow::Result<::kube::Client> {
    Ok(client_with(true).await?.0)
}

/// The same client without kube's retries of `429 Too Many Requests`: for evictions, where a 429
/// is a PodDisruptionBudget's answer that the caller must see at once (kube would otherwise retry
/// it for minutes, blind to whether the plan still holds).
pub async fn client_without_retries() -> anyhow::Result<::kube::Client> {
    Ok(client_with(false).await?.0)
}

/// The versions the API server serves of API `group`, preferred first (empty: not served).
pub async fn group_versions(client: &::kube::Client, group: &str) -> Result<Vec<String>, ::kube::Error> {
    let groups = client.list_api_groups().await?;
    Ok(groups
        .groups
        .iter()
        .filter(|g| g.name == group)
        .flat_map(|g| g.versions.iter().map(|v| v.version.clone()))
        .collect())
}

/// A client as [`client`] gives, and the API server's URL it talks to (for messages).
pub async fn client_and_server() -> anyhow::Result<(::kube::Client, String)> {
    client_with(true).await
}

async fn client_with(retries: bool) -> anyhow::Result<(::kube::Client, String)> {
    use anyhow::Context;
    let config = ::kube::Config::infer().await.context("reading the Kubernetes client configuration")?;
    let server = config.cluster_url.to_string();
    Ok((client_from(config, retries)?, server))
}

/// A client from `config`, naming gpupart in its `User-Agent`, with or without kube's retries of
/// 429, 503 and 504.
pub fn client_from(mut config: ::kube::Config, retries: bool) -> anyhow::Result<::kube::Client> {
    use anyhow::Context;
    let value = http::HeaderValue::from_static(USER_AGENT);
    config.headers.push((http::header::USER_AGENT, value));
    config.default_retry = retries;
    ::kube::Client::try_from(config).context("connecting to the Kubernetes API")
}
