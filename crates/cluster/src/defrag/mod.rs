//! Defragmentation by moving pods (pure): which running pods may be moved to make room for a pod
//! that waits ([`movable`]); on nodes that publish DRA devices, what the controller reads of them
//! ([`dra_world`]) and where the room appears and where the moved pods go ([`room`]); on
//! label-driven nodes, the moves that empty a node for a tensor-parallel pod ([`empty_node`]) and
//! the GPU on which moving pods makes room for a MIG profile ([`gpu_room`], carried out by the
//! controller's decision as a [`crate::controller::decide::Kind::MakeRoom`]).
//! The controller's binary side reserves the room and evicts through the Eviction API.

pub mod dra_world;
pub mod empty_node;
pub mod gpu_room;
pub mod movable;
pub mod room;
