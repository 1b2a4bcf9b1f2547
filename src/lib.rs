#![warn(missing_docs)]
//! gpupart, the binary's crate: the CLI ([`cli`], [`commands`]), the node agent's loop
//! ([`agent`]), the controller's loop ([`controller`]), Kubernetes I/O ([`kube`]), the kubelet's
//! gRPC APIs ([`kubelet`]), HTTP and metrics, logging — the only place effects are wired
//! together. The layers below are their own crates: `gpupart-mig` (the MIG domain),
//! `gpupart-node` (the node pipeline and GPU backends) and `gpupart-cluster` (the fleet planner
//! and the controller's decisions); their modules are re-exported here under their own names.

pub use gpupart_cluster::{defrag, fleet, keys, pools};
pub use gpupart_node::{
    allocations, backend, checkpoint, config, exec, frag, fsutil, health, hooks, layout, mig, mps, observed, plan,
    prepare, reconfigure, validate,
};

pub mod agent;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod controller;
pub mod dra;
pub mod fuzzing;
pub mod gpu_health;
pub mod http;
pub mod kube;
pub mod kubelet;
pub mod logging;
pub mod metrics;
pub mod picture;
