#![warn(missing_docs)]
//! A fake `libnvidia-ml.so.1`: the NVML C ABI over gpupart's MIG simulator.
//!
//! Build it (`cargo build -p fake-nvml`) and point an NVML consumer at
//! `target/<profile>/libfake_nvml.so` (or a `libnvidia-ml.so.1` symlink to it). Configuration is
//! by environment (see README.md): `FAKE_NVML_STATE`, `FAKE_NVML_GPUS`, `FAKE_NVML_OP_DELAY_MS`,
//! `FAKE_NVML_FAIL`. Tests and demos only; never install it on a GPU node.

pub mod abi;
pub mod handle;
pub mod ident;
pub mod runtime;
