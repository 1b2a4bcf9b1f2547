#![warn(missing_docs)]
//! gpupart's cluster layer, pure: the fleet planner behind `gpupart plan` ([`fleet`]), the
//! controller's decision core with pods and nodes as data ([`controller`]), which running pods
//! may move to defragment ([`defrag`]), cluster-wide
//! fragmentation from the agents' annotations ([`frag`]), the label and annotation keys the
//! agents and the controller share ([`keys`]) and how pools are written on nodes ([`pools`]). No Kubernetes client, no async runtime: the
//! binary reads the cluster and hands it here as data.

// The node layer's modules under their own names, for the paths inside this crate.
use gpupart_node::{config, layout, mig, mps, observed, plan};

pub mod controller;
pub mod defrag;
pub mod fleet;
pub mod frag;
pub mod keys;
pub mod pools;
