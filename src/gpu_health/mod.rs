//! The node's GPU health, in both agent modes: the record of unhealthy GPUs (a file, so a fence
//! outlives an agent restart and `status`, `export` and `health` can read it), the watch of NVML
//! events that fills it ([`watch`]) and its metrics ([`metrics`]). Which events fence a GPU is
//! the pure [`crate::health`]; a GPU comes back only when an operator says so or when a lost GPU
//! answers again (its reset observed), never on a timer.

pub mod keep_lost;
pub mod metrics;
pub mod record;
pub mod watch;

pub use record::{describe, describe_mig, read_file, read_or_warn, write_file, GpuHealth, DEFAULT_FILE};

#[cfg(test)]
mod tests;
