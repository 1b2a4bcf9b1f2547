#![warn(missing_docs)]
//! Pure MIG domain model shared by the `gpupart` agent and the fake NVML library.
//!
//! Nothing here performs I/O except [`sim::store`], which loads and atomically saves the
//! simulator's state file.

pub mod capacity;
pub mod catalog;
pub mod name;
pub mod placement;
pub mod profile;
pub mod sim;

pub use catalog::{Arch, Model};
pub use name::ProfileName;
pub use placement::Placement;
pub use profile::{CiProfile, Engines, GiProfile, ProfileTable};
