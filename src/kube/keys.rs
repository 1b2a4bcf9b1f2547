//! Label and annotation keys ([`gpupart_cluster::keys`], re-exported) and the parameters of the
//! agent's writes.

pub use gpupart_cluster::keys::*;

/// Parameters of a merge patch, named by the agent's field manager (never `unknown` in
/// managedFields).
pub fn merge_params() -> kube::api::PatchParams {
    kube::api::PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
}
