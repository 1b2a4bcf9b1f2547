//! ResourceClaims as the plugin reads them: one claim by name for Prepare (its uid checked), and
//! what an allocated claim holds of this node's pool (for the watch). The conversion is pure.

use gpupart_node::dra::driver::{AllocatedDevice, ClaimToPrepare};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// Why a claim cannot be prepared as read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimProblem {
    /// The API could not be read.
    #[error("reading the claim from the API: {0}")]
    Api(String),
    /// The claim in the API is another object than the kubelet's.
    #[error("the claim in the API has uid {found}, the kubelet asked for {asked}")]
    Uid {
        /// The kubelet's uid.
        asked: String,
        /// The API's uid.
        found: String,
    },
    /// The claim is not allocated.
    #[error("the claim is not allocated")]
    NotAllocated,
    /// No result is this driver's.
    #[error("its allocation has no device of driver {0} (only {1})")]
    OtherDrivers(String, String),
    /// An opaque config for this driver that it does not understand.
    #[error("opaque config for driver {driver}: {detail}")]
    Config {
        /// The driver named.
        driver: String,
        /// What the config was.
        detail: String,
    },
}

impl ClaimProblem {
    /// The `reason` label of the failure metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Uid { .. } | Self::NotAllocated => "claim",
            Self::OtherDrivers(..) => "unknown_device",
            Self::Config { .. } => "config",
        }
    }
}

/// This driver's devices of an allocated claim, checked against the uid the kubelet gave.
pub fn to_prepare(claim: &ResourceClaim, asked_uid: &str, driver: &str) -> Result<ClaimToPrepare, ClaimProblem> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if uid != asked_uid {
        return Err(ClaimProblem::Uid { asked: asked_uid.to_string(), found: uid });
    }
    let alloc = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).ok_or(ClaimProblem::NotAllocated)?;
    let devices = alloc.devices.as_ref();
    let mut share_config = None;
    for c in devices.and_then(|d| d.config.as_ref()).into_iter().flatten() {
        if let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) {
            if share_config.is_some() {
                let detail = "more than one opaque config names this driver; give one".to_string();
                return Err(ClaimProblem::Config { driver: driver.to_string(), detail });
            }
            let parsed = gpupart_node::dra::share_config::parse(&o.parameters.0)
                .map_err(|e| ClaimProblem::Config { driver: driver.to_string(), detail: e.to_string() })?;
            share_config = Some(parsed);
        }
    }
    let results = devices.and_then(|d| d.results.as_ref()).cloned().unwrap_or_default();
    let mine: Vec<AllocatedDevice> = results
        .iter()
        .filter(|r| r.driver == driver)
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            consumed: r
                .consumed_capacity
                .iter()
                .flatten()
                .filter_map(|(k, q)| {
                    Some((k.clone(), gpupart_node::dra::slices::Quantity { value: q.0.clone() }.as_u64()?))
                })
                .collect(),
        })
        .collect();
    if mine.is_empty() {
        let mut others: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
        others.sort_unstable();
        others.dedup();
        return Err(ClaimProblem::OtherDrivers(
            driver.to_string(),
            if others.is_empty() { "none".into() } else { others.join(", ") },
        ));
    }
    Ok(ClaimToPrepare {
        uid,
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        devices: mine,
        share_config,
    })
}

/// The device names an allocated claim holds in `pool` of `driver` (empty when none).
pub fn held(claim: &ResourceClaim, driver: &str, pool: &str) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|rs| rs.iter().filter(|r| r.driver == driver && r.pool == pool).map(|r| r.device.clone()).collect())
        .unwrap_or_default()
}

/// Reads a claim from the API.
pub async fn read(client: &kube::Client, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimProblem> {
    let api: kube::Api<ResourceClaim> = kube::Api::namespaced(client.clone(), namespace);
    api.get(name).await.map_err(|e| ClaimProblem::Api(e.to_string()))
}
