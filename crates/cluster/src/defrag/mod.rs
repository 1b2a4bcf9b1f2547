//! Defragmentation by moving pods (pure): which running pods may be moved to make room for a pod
//! that waits ([`movable`]). The controller's binary side evicts through the Eviction API.

pub mod movable;
