//! A claim's opaque configuration for an MPS share (pure): gpupart's own shape, or NVIDIA's
//! `GpuConfig` with MPS sharing, so a claim written for NVIDIA's DRA driver ports by changing the
//! driver name. Every field is checked; an error names the offending one.
//!
//! gpupart's: `{"apiVersion": "gpu.gpupart.io/v1alpha1", "kind": "MpsShareConfig",
//! "activeThreadPercentage": 50, "pinnedMemoryLimit": "2Gi"}`.
//!
//! NVIDIA's (`resource.nvidia.com/v1beta1`): `{"kind": "GpuConfig", "sharing": {"strategy": "MPS",
//! "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "2Gi"}}}`
//! (`defaultPerDevicePinnedMemoryLimit` is refused: a share is one device, give the default).

use super::slices::Quantity;
use serde_json::{Map, Value};

/// `apiVersion` of gpupart's shape.
pub const API_VERSION: &str = "gpu.gpupart.io/v1alpha1";
/// `kind` of gpupart's shape.
pub const KIND: &str = "MpsShareConfig";
/// `apiVersion` of NVIDIA's shape.
pub const NVIDIA_API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// What a claim sets for its MPS shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareConfig {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (1–100); else proportional to the memory share.
    pub active_thread_percentage: Option<u32>,
    /// Pinned device memory limit in bytes, at most the share's consumed memory; else that.
    pub pinned_memory_limit: Option<u64>,
}

/// A config that cannot be used; `field` is its path (`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("opaque config field '{field}': {message}")]
pub struct ConfigError {
    /// The offending field.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { field: field.to_string(), message: message.into() }
}

/// Refuses any key of `obj` not in `known` (at `prefix`).
fn only(obj: &Map<String, Value>, known: &[&str], prefix: &str) -> Result<(), ConfigError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(err(&format!("{prefix}{k}"), format!("unknown field; known: {}", known.join(", ")))),
        None => Ok(()),
    }
}

fn percentage(v: &Value, field: &str) -> Result<u32, ConfigError> {
    match v.as_u64() {
        Some(p @ 1..=100) => Ok(p as u32),
        _ => Err(err(field, format!("{v} is not a whole percentage from 1 to 100"))),
    }
}

fn bytes(v: &Value, field: &str) -> Result<u64, ConfigError> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err(err(field, format!("{v} is not a quantity (e.g. 2Gi)"))),
    };
    match (Quantity { value: text.clone() }).as_u64() {
        Some(0) | None => Err(err(field, format!("'{text}' is not a positive byte quantity (e.g. 2Gi)"))),
        Some(n) => Ok(n),
    }
}

/// Reads one opaque config's `parameters`.
pub fn parse(parameters: &Value) -> Result<ShareConfig, ConfigError> {
    let obj = parameters.as_object().ok_or_else(|| err("parameters", "not an object"))?;
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    match (api_version, kind) {
        (API_VERSION, KIND) => {
            only(obj, &["apiVersion", "kind", "activeThreadPercentage", "pinnedMemoryLimit"], "")?;
            Ok(ShareConfig {
                active_thread_percentage: obj
                    .get("activeThreadPercentage")
                    .map(|v| percentage(v, "activeThreadPercentage"))
                    .transpose()?,
                pinned_memory_limit: obj.get("pinnedMemoryLimit").map(|v| bytes(v, "pinnedMemoryLimit")).transpose()?,
            })
        }
        (NVIDIA_API_VERSION, "GpuConfig") => nvidia(obj),
        _ => Err(err(
            "kind",
            format!(
                "'{api_version}' '{kind}' is not understood; use {API_VERSION} {KIND}, or {NVIDIA_API_VERSION} GpuConfig with MPS sharing"
            ),
        )),
    }
}

fn nvidia(obj: &Map<String, Value>) -> Result<ShareConfig, ConfigError> {
    only(obj, &["apiVersion", "kind", "sharing"], "")?;
    let Some(sharing) = obj.get("sharing") else { return Ok(ShareConfig::default()) };
    let sharing = sharing.as_object().ok_or_else(|| err("sharing", "not an object"))?;
    only(sharing, &["strategy", "mpsConfig"], "sharing.")?;
    match sharing.get("strategy").and_then(Value::as_str) {
        Some("MPS") => {}
        other => {
            return Err(err(
                "sharing.strategy",
                format!("{} is not served: gpupart shares GPUs through MPS only", other.unwrap_or("none")),
            ))
        }
    }
    let Some(mps) = sharing.get("mpsConfig") else { return Ok(ShareConfig::default()) };
    let mps = mps.as_object().ok_or_else(|| err("sharing.mpsConfig", "not an object"))?;
    only(mps, &["defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"], "sharing.mpsConfig.")?;
    Ok(ShareConfig {
        active_thread_percentage: mps
            .get("defaultActiveThreadPercentage")
            .map(|v| percentage(v, "sharing.mpsConfig.defaultActiveThreadPercentage"))
            .transpose()?,
        pinned_memory_limit: mps
            .get("defaultPinnedDeviceMemoryLimit")
            .map(|v| bytes(v, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests;
