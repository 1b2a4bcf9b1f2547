//! The GPU options in effect for a verb, resolved from the command line and the environment:
//! which backend (NVML or the simulator), the MPS control program, the kubelet's PodResources
//! socket. The CLI resolves them; the backends, MPS and the kubelet edge read them.

use std::path::PathBuf;

/// The GPU options in effect: the verb's, else those before the verb, else the environment,
/// else the defaults.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// `--simulate`.
    pub simulate: Option<String>,
    /// `--sim-state`.
    pub sim_state: Option<PathBuf>,
    /// `--nvml-lib`.
    pub nvml_lib: Option<PathBuf>,
    /// `--nvidia-smi`.
    pub nvidia_smi: Option<PathBuf>,
    /// `--mps-control`.
    pub mps_control: PathBuf,
    /// `--mps-root`.
    pub mps_root: PathBuf,
    /// `--mps-timeout`.
    pub mps_timeout: std::time::Duration,
    /// `--mps-shm-size`.
    pub mps_shm_size: String,
    /// `--pod-resources-socket`.
    pub pod_resources_socket: PathBuf,
    /// `--health-file`: the record of unhealthy GPUs.
    pub health_file: PathBuf,
    /// `-d`: debug logs (also passed to hooks).
    pub debug: bool,
    /// Invoked as `nvidia-mig-parted`: mig-parted's answers where the two differ.
    pub as_mig_parted: bool,
}
