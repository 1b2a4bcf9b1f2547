//! Dynamic Resource Allocation, the pure half of `gpupart agent --dra` (docs/dra.md): what a node
//! publishes and in which order. The scheduler hands devices out first-fit in publication order,
//! so the order is gpupart's placement decision ([`order`]); [`devices`] names the devices and
//! the counters they consume; [`publish`] gives each its attributes and its group; [`slices`] lays
//! them out in ResourceSlices within the API's limits; [`unavailable`] finds the devices only a
//! device taint can refuse, and [`reservation`] the room held for a waiting claim. [`driver`] prepares and unprepares claims through the
//! backend, with its [`checkpoint`] and [`cdi`] specs; [`share_config`] reads a claim's settings
//! for its MPS shares. [`api_features`] finds which optional fields the API server keeps, and
//! leaves out of the pool what needs one it drops.

pub mod api_features;
pub mod cdi;
pub mod checkpoint;
pub mod devices;
pub mod driver;
pub mod order;
pub mod publish;
pub mod reservation;
pub mod share_config;
pub mod slices;
pub mod unavailable;

#[cfg(test)]
mod tests;
