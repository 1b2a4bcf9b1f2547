//! Where the daemon and its clients meet: the pipe and log directories from the environment,
//! and the socket and pid file inside the pipe directory.

use std::path::PathBuf;

/// The socket the daemon listens on, inside the pipe directory.
pub const SOCKET: &str = "control";
/// The pid file, inside the pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`).
pub fn pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from)
}

/// `CUDA_MPS_LOG_DIRECTORY` (default `/var/log/nvidia-mps`).
pub fn log_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_LOG_DIRECTORY").map_or_else(|| PathBuf::from("/var/log/nvidia-mps"), PathBuf::from)
}
