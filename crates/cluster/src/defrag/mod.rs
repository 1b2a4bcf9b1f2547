//! Defragmentation by moving pods (pure): which running pods may be moved to make room for a pod
//! that waits ([`movable`]), and, on nodes that publish DRA devices, where the room appears and
//! where the moved pods go ([`room`]). The controller's binary side evicts through the Eviction
//! API.

pub mod dra_world;
pub mod movable;
pub mod room;
