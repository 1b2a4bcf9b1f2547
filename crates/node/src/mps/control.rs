//! The effect edge of MPS: `nvidia-cuda-mps-control`, driven the way the real program takes it.
//! `-d` starts a daemon; without `-d` one command is read from stdin and the daemon's reply is
//! printed. Every daemon gets its own pipe and log directory and sees one GPU.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Name of the pid file the daemon writes into its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// Where one GPU's daemon lives: `<root>/<gpu-uuid>/{pipe,log}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPaths {
    /// The GPU the daemon serves (`CUDA_VISIBLE_DEVICES`).
    pub gpu_uuid: String,
    /// `<root>/<gpu-uuid>`.
    pub dir: PathBuf,
}

impl DaemonPaths {
    /// The paths of `gpu_uuid`'s daemon under `root`.
    pub fn new(root: &Path, gpu_uuid: &str) -> Self {
        Self { gpu_uuid: gpu_uuid.to_string(), dir: root.join(gpu_uuid) }
    }

    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub fn pipe(&self) -> PathBuf {
        self.dir.join("pipe")
    }

    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// The shared-memory directory mounted as clients' `/dev/shm`.
    pub fn shm(&self) -> PathBuf {
        self.dir.join("shm")
    }

    /// `<pipe>/nvidia-cuda-mps-control.pid`.
    pub fn pid_file(&self) -> PathBuf {
        self.pipe().join(PID_FILE)
    }

    /// The environment the daemon and every command to it run with.
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            ("CUDA_MPS_PIPE_DIRECTORY", self.pipe().display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY", self.log().display().to_string()),
            ("CUDA_VISIBLE_DEVICES", self.gpu_uuid.clone()),
        ]
    }

    /// The daemon's pid from its pid file, when the file holds one.
    pub fn read_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file()).ok()?.trim().parse().ok()
    }
}

/// A failed interaction with the control program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The program could not be run at all.
    #[error("cannot run {program}: {detail}")]
    Spawn {
        /// The control program.
        program: String,
        /// The OS error.
        detail: String,
    },
    /// It did not finish in time (a hung daemon).
    #[error("'{command}' to the MPS daemon of {gpu} got no answer within {} ms", timeout.as_millis())]
    Timeout {
        /// The GPU.
        gpu: String,
        /// The command.
        command: String,
        /// The limit.
        timeout: Duration,
    },
    /// It exited with a failure (no daemon, refused command).
    #[error("'{command}' to the MPS daemon of {gpu} failed ({status}): {output}")]
    Failed {
        /// The GPU.
        gpu: String,
        /// The command.
        command: String,
        /// Exit status.
        status: String,
        /// What it printed.
        output: String,
    },
}

/// Starts MPS control daemons and sends them commands.
pub trait MpsControl: Send + Sync {
    /// Runs `nvidia-cuda-mps-control -d` for one GPU; returns once the program has daemonized.
    fn start(&self, paths: &DaemonPaths) -> Result<(), ControlError>;
    /// Sends one command (`get_server_list`) and returns what the program printed.
    fn send(&self, paths: &DaemonPaths, command: &str) -> Result<String, ControlError>;
}

/// The real program (or its test double), run as a child process with a time limit.
#[derive(Debug, Clone)]
pub struct ControlProgram {
    /// `nvidia-cuda-mps-control`, or a path.
    pub program: PathBuf,
    /// Longest wait for one invocation.
    pub timeout: Duration,
}

impl ControlProgram {
    /// Runs the program once. With `capture` its output is read from a file instead of a pipe,
    /// because a daemon forked by `-d` may keep inherited pipes open for its whole life.
    fn run(
        &self,
        paths: &DaemonPaths,
        args: &[&str],
        stdin: Option<&str>,
        capture: Option<&Path>,
    ) -> Result<String, ControlError> {
        let label = stdin.map_or_else(|| args.join(" "), |c| c.to_string());
        let spawn_err = |e: std::io::Error| ControlError::Spawn {
            program: self.program.display().to_string(),
            detail: e.to_string(),
        };
        let mut cmd = Command::new(&self.program);
        cmd.args(args).envs(paths.env());
        match capture {
            Some(file) => {
                let out = std::fs::File::create(file).map_err(spawn_err)?;
                let err = out.try_clone().map_err(spawn_err)?;
                cmd.stdout(out).stderr(err);
            }
            None => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A daemon that hangs may never read: a failed write shows up as the exit status.
            let _ = pipe.write_all(format!("{text}\n").as_bytes());
        }
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ControlError::Timeout {
                        gpu: paths.gpu_uuid.clone(),
                        command: label,
                        timeout: self.timeout,
                    });
                }
            }
        };
        let mut out = capture.and_then(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        if status.success() {
            Ok(out)
        } else {
            Err(ControlError::Failed {
                gpu: paths.gpu_uuid.clone(),
                command: label,
                status: status.to_string(),
                output: out.trim().to_string(),
            })
        }
    }
}

impl MpsControl for ControlProgram {
    fn start(&self, paths: &DaemonPaths) -> Result<(), ControlError> {
        let capture = paths.log().join("gpupart-start.out");
        self.run(paths, &["-d"], None, Some(&capture)).map(|_| ())
    }

    fn send(&self, paths: &DaemonPaths, command: &str) -> Result<String, ControlError> {
        self.run(paths, &[], Some(command), None)
    }
}
