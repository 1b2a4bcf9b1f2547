//! Kubernetes side of the agent: watch the own Node's metadata for the layout label, publish the
//! state label, `gpupart.io/` annotations (server-side apply, one field manager) and Events.

pub mod cluster;
pub mod keys;
pub mod node;
pub mod pause;
pub mod publish;
pub mod summary;

pub use node::{NodeView, NodeWatch};
pub use publish::KubeReporter;
