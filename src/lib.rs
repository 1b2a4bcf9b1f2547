//! gpupart: partitions NVIDIA GPUs (MIG, later MPS) with minimal-diff reconfiguration.
//!
//! Pure logic lives in [`config`], [`layout`] and [`plan`] (and the `gpupart-mig` crate, re-exported
//! as [`mig`]); effects sit behind [`backend::GpuBackend`]; [`exec`] composes them.

pub use gpupart_mig as mig;

pub mod config;
pub mod layout;
pub mod observed;
pub mod plan;
pub mod backend;
pub mod exec;
pub mod prepare;
pub mod cli;
pub mod commands;
pub mod logging;
pub mod validate;
