#![warn(missing_docs)]
//! gpupart's node layer: everything one GPU node needs to go from a mig-parted config to GPU and
//! compute instances, with no Kubernetes, CLI or RPC in it.
//!
//! The pipeline, one module per step: [`config`] (mig-parted v1) → [`layout`] (desired devices)
//! and [`observed`] (what the GPUs hold) → [`prepare`] → [`plan`] (the minimal-diff placement
//! planner, pure) → [`exec`] (through a [`backend::GpuBackend`]: NVML or the simulator) →
//! [`reconfigure`] (a whole node, rechecking the kubelet's [`allocations`]). Beside it: [`mps`]
//! (MPS daemons on GPUs without MIG), [`hooks`], per-GPU fragmentation ([`frag`]), GPU health from
//! NVML events ([`health`]),
//! [`checkpoint`], [`validate`], and the pure MIG domain re-exported as [`mig`].

pub use gpupart_mig as mig;

pub mod allocations;
pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod dra;
pub mod exec;
pub mod frag;
pub mod fsutil;
pub mod health;
pub mod hooks;
pub mod layout;
pub mod mps;
pub mod observed;
pub mod plan;
pub mod prepare;
pub mod reconfigure;
pub mod validate;
