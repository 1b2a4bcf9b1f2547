//! `gpupart controller`: the cluster-level half (docs/controller.md). It watches pending GPU pods
//! and the agents' node summaries, and changes node layouts (only through the layout label, pool
//! labels and taints, and the generated layouts in the agents' config) so the pods become
//! schedulable with the least disruption. The agents stay the only thing that touches GPUs.
//!
//! Here the effects: [`cluster`] (watches and writes), [`lease`] (leader election), [`metrics`]
//! and the loop ([`run`]). The decisions are pure and live in `gpupart_cluster::controller`,
//! re-exported below under their own names.

pub use gpupart_cluster::controller::{capacity, decide, fit, gpu_options, layouts, memo, nodes, patch, pods};

pub mod cluster;
pub mod defrag;
pub mod events;
pub mod evict;
pub mod lease;
pub mod metrics;
pub mod run;
