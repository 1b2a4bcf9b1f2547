#![warn(missing_docs)]
//! gpupart: partitions NVIDIA GPUs (MIG, later MPS) with minimal-diff reconfiguration.
//!
//! Pure logic lives in [`config`], [`layout`] and [`plan`] (and the `gpupart-mig` crate, re-exported
//! as [`mig`]); effects sit behind [`backend::GpuBackend`]; [`exec`] composes them.

pub use gpupart_mig as mig;

pub mod agent;
pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod controller;
pub mod exec;
pub mod fleet;
pub mod frag;
pub mod fsutil;
pub mod fuzzing;
pub mod hooks;
pub mod http;
pub mod kube;
pub mod kubelet;
pub mod layout;
pub mod logging;
pub mod metrics;
pub mod mps;
pub mod observed;
pub mod plan;
pub mod prepare;
pub mod reconfigure;
pub mod validate;
