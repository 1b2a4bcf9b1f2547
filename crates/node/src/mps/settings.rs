//! MPS settings of one GPU (pure): the config's `mps` block resolved against the GPU it lands
//! on, with the per-architecture client limit and the defaults NVIDIA's device plugin uses.

use crate::config::MpsSpec;
use crate::observed::GpuInfo;
use serde::Serialize;

/// Client contexts an MPS server serves per device before Volta (compute capability < 7.0).
pub const PRE_VOLTA_MAX_CLIENTS: u32 = 16;
/// Client contexts an MPS server serves per device from Volta on.
pub const VOLTA_MAX_CLIENTS: u32 = 48;

/// What one GPU's MPS daemon is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MpsSettings {
    /// Client slots (advertised as `<gpu-uuid>::<n>`).
    pub replicas: u32,
    /// Default active thread percentage per client; `None` before Volta (not supported there).
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit per client in MiB; `None` before Volta.
    pub pinned_memory_limit_mib: Option<u64>,
}

/// Whether the GPU is Volta or newer (MPS limits and 48 clients).
pub fn is_volta_or_newer(info: &GpuInfo) -> bool {
    info.compute_capability >= (7, 0)
}

/// Client limit of one MPS server on this GPU (V100 is Volta: 48, unlike NVIDIA's plugin's 16).
pub fn max_clients(info: &GpuInfo) -> u32 {
    if is_volta_or_newer(info) {
        VOLTA_MAX_CLIENTS
    } else {
        PRE_VOLTA_MAX_CLIENTS
    }
}

/// [`max_clients`] of a catalog model; `true` in the pair when it takes per-client limits (Volta+).
pub fn model_limits(model: &crate::mig::catalog::Model) -> (u32, bool) {
    if model.compute_capability >= (7, 0) {
        (VOLTA_MAX_CLIENTS, true)
    } else {
        (PRE_VOLTA_MAX_CLIENTS, false)
    }
}

/// A config `mps` block that this GPU cannot serve; `key` is the offending key under `mps.`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key 'mps.{key}': {message}")]
pub struct SettingsError {
    /// `replicas`, `active-thread-percentage` or `pinned-memory-limit`.
    pub key: &'static str,
    /// What is wrong, naming the GPU's model and the limit.
    pub message: String,
}

/// Resolves `spec` on a GPU: checks the architecture's limits and fills the defaults
/// (`100 / replicas` percent, `total memory / replicas` MiB).
pub fn resolve(spec: &MpsSpec, info: &GpuInfo) -> Result<MpsSettings, SettingsError> {
    resolve_for(spec, &info.model, info.compute_capability, info.memory_total_bytes)
}

/// [`resolve`] on a catalog model (offline validation).
pub fn resolve_on_model(spec: &MpsSpec, model: &crate::mig::catalog::Model) -> Result<MpsSettings, SettingsError> {
    resolve_for(spec, model.id, model.compute_capability, model.memory_bytes())
}

fn resolve_for(
    spec: &MpsSpec,
    model: &str,
    (major, minor): (u32, u32),
    memory_total_bytes: u64,
) -> Result<MpsSettings, SettingsError> {
    let volta = (major, minor) >= (7, 0);
    let max = if volta { VOLTA_MAX_CLIENTS } else { PRE_VOLTA_MAX_CLIENTS };
    if spec.replicas > max {
        return Err(SettingsError {
            key: "replicas",
            message: format!(
                "{} replicas exceed the {max} clients an MPS server serves on {} (compute capability {major}.{minor})",
                spec.replicas, model
            ),
        });
    }
    let total_mib = memory_total_bytes / (1024 * 1024);
    if !volta {
        let asked = [
            ("active-thread-percentage", spec.active_thread_percentage.is_some()),
            ("pinned-memory-limit", spec.pinned_memory_limit_mib.is_some()),
        ];
        if let Some((key, _)) = asked.into_iter().find(|(_, set)| *set) {
            return Err(SettingsError {
                key,
                message: format!(
                    "{model} (compute capability {major}.{minor}) is older than Volta; MPS supports no per-client limits there"
                ),
            });
        }
        return Ok(MpsSettings {
            replicas: spec.replicas,
            active_thread_percentage: None,
            pinned_memory_limit_mib: None,
        });
    }
    if let Some(limit) = spec.pinned_memory_limit_mib {
        if limit > total_mib {
            return Err(SettingsError {
                key: "pinned-memory-limit",
                message: format!("{} exceeds the {total_mib}M of memory of {model}", limit_arg(limit)),
            });
        }
    }
    Ok(MpsSettings {
        replicas: spec.replicas,
        active_thread_percentage: Some(spec.active_thread_percentage.unwrap_or(100 / spec.replicas)),
        pinned_memory_limit_mib: Some(spec.pinned_memory_limit_mib.unwrap_or(total_mib / u64::from(spec.replicas))),
    })
}

/// The value argument of `set_default_device_pinned_mem_limit` (`7168M`).
pub fn limit_arg(mib: u64) -> String {
    format!("{mib}M")
}

/// Parses a limit as the control program prints it (`512M`, `7G`, `7168M`, `0`) into MiB.
pub fn parse_readback(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "0" {
        return Some(0);
    }
    crate::config::parse_mem_limit(s)
}

/// Whether a read-back limit matches the configured one. Drivers may print a limit of 1 GiB or
/// more in whole G, rounded down (`7500M` reads back as `7G`), so that form matches too.
pub fn limit_matches(configured_mib: u64, readback: &str) -> bool {
    let r = readback.trim();
    let Some(mib) = parse_readback(r) else { return false };
    mib == configured_mib || (r.ends_with(['G', 'g']) && configured_mib >= 1024 && mib == configured_mib / 1024 * 1024)
}

/// Whether a read-back thread percentage (`25`, `25.0`) matches the configured one.
pub fn percentage_matches(configured: u32, readback: &str) -> bool {
    readback.trim().parse::<f64>().is_ok_and(|v| (v - f64::from(configured)).abs() < 0.01)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::GpuBackend;

    fn info(model: &str) -> GpuInfo {
        SimBackend::open(Some(&format!("{model}:1")), None).unwrap().observe(0).unwrap().info
    }

    fn spec(replicas: u32, pct: Option<u32>, mem: Option<u64>) -> MpsSpec {
        MpsSpec { replicas, active_thread_percentage: pct, pinned_memory_limit_mib: mem }
    }

    #[test]
    fn defaults_split_the_gpu_evenly() {
        let s = resolve(&spec(4, None, None), &info("V100-SXM2-32GB")).unwrap();
        assert_eq!(
            s,
            MpsSettings { replicas: 4, active_thread_percentage: Some(25), pinned_memory_limit_mib: Some(8192) }
        );
        let s = resolve(&spec(3, None, None), &info("T4-16GB")).unwrap();
        assert_eq!((s.active_thread_percentage, s.pinned_memory_limit_mib), (Some(33), Some(5120)));
    }

    #[test]
    fn v100_is_volta_and_takes_48_clients() {
        assert!(resolve(&spec(48, None, None), &info("V100-SXM2-16GB")).is_ok());
        let e = resolve(&spec(17, None, None), &info("P100-PCIE-16GB")).unwrap_err();
        assert_eq!(e.key, "replicas");
        assert!(
            e.to_string().contains("17 replicas exceed the 16 clients an MPS server serves on P100-PCIE-16GB"),
            "{e}"
        );
    }

    #[test]
    fn pre_volta_refuses_limits_and_runs_without() {
        let p100 = info("P100-PCIE-16GB");
        let e = resolve(&spec(4, Some(25), None), &p100).unwrap_err();
        assert_eq!(e.key, "active-thread-percentage");
        assert!(e.message.contains("older than Volta"), "{e}");
        assert_eq!(resolve(&spec(4, None, Some(1024)), &p100).unwrap_err().key, "pinned-memory-limit");
        let s = resolve(&spec(4, None, None), &p100).unwrap();
        assert_eq!((s.active_thread_percentage, s.pinned_memory_limit_mib), (None, None));
    }

    #[test]
    fn memory_limit_above_the_gpu_is_refused() {
        let e = resolve(&spec(2, None, Some(20 * 1024)), &info("T4-16GB")).unwrap_err();
        assert_eq!(e.key, "pinned-memory-limit");
        assert!(e.message.contains("20480M exceeds the 15360M of memory of T4-16GB"), "{e}");
    }

    #[test]
    fn readback_quirk_whole_gigabytes() {
        assert!(limit_matches(7168, "7168M"));
        assert!(limit_matches(7168, "7G"));
        assert!(limit_matches(7500, "7G"));
        assert!(!limit_matches(7500, "7500"));
        assert!(!limit_matches(512, "0G"));
        assert!(limit_matches(512, "512M"));
        assert!(!limit_matches(8192, "7G"));
        assert!(percentage_matches(25, "25.0") && percentage_matches(25, "25") && !percentage_matches(25, "33.0"));
    }
}
