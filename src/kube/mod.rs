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
    use anyhow::Context;
    let mut config = ::kube::Config::infer().await.context("reading the Kubernetes client configuration")?;
    let value = http::HeaderValue::from_static(USER_AGENT);
    config.headers.push((http::header::USER_AGENT, value));
    ::kube::Client::try_from(config).context("connecting to the Kubernetes API")
}
