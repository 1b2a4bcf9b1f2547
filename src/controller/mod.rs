//! `gpupart controller`: the cluster-level half (docs/controller.md). It watches pending GPU pods
//! and the agents' node summaries, and changes node layouts (only through the layout label, pool
//! labels and taints, and the generated layouts in the agents' config) so the pods become
//! schedulable with the least disruption. The agents stay the only thing that touches GPUs.
//!
//! Pure parts: [`pods`] (what a pod asks), [`nodes`] (what a node offers and whether it is
//! settled), [`capacity`] (the scheduler's view), [`gpu_options`] (the ways one GPU can be set),
//! [`decide`] (one batch's decisions) and [`layouts`] (generated layout names and the config merge).

pub mod capacity;
pub mod cluster;
pub mod decide;
pub mod fit;
pub mod gpu_options;
pub mod layouts;
pub mod lease;
pub mod metrics;
pub mod nodes;
pub mod patch;
pub mod pods;
pub mod run;

#[cfg(test)]
mod tests;
