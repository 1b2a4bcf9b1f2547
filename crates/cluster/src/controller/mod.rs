//! The controller's decision core (pure; the loop around it is `gpupart controller` in the
//! binary, docs/controller.md): [`pods`] (what a pod asks), [`fit`] (whether a pod may land on a
//! node at all), [`affinity`] (required inter-pod affinity and anti-affinity), [`nodes`] (what a node offers and whether it is settled), [`capacity`] (the
//! scheduler's view), [`gpu_options`] (the ways one GPU can be set), [`decide`] (one batch's
//! decisions), [`memo`] (what decisions remember across batches), [`layouts`] (generated layout names and the config merge) and [`patch`] (the one
//! node patch a decision becomes).

pub mod affinity;
pub mod capacity;
pub mod decide;
pub mod fit;
pub mod gpu_options;
pub mod layouts;
pub mod memo;
pub mod nodes;
pub mod patch;
pub mod pods;

#[cfg(test)]
mod tests;
