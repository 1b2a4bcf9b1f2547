//! Helpers for the integration tests: run the real `gpupart` binary against a simulator state
//! file in a temporary directory, and read or edit that state.
#![allow(dead_code, unused_macros)]

pub mod allocator;
pub mod apiserver;
pub mod baremetal;
pub mod controller_rig;
pub mod disruption;
pub mod dra_cluster;
pub mod dra_kubelet;
pub mod dra_rig;
pub mod grpc_dial;
pub mod kube_agent;
pub mod kubelet;
pub mod pod_resources;
pub mod racing_scheduler;
pub mod rbac;
pub mod rng;
pub mod scheduler;
pub mod served;

/// Declares `sim::NAME` and `nvml::NAME` tests running scenario `NAME` on each backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sim {
            $(#[test] fn $name() { super::$name(super::Backend::Sim) })*
        }
        mod nvml {
            $(#[test] fn $name() { super::$name(super::Backend::Nvml) })*
        }
    };
}

use gpupart::mig::sim::{store, SimProcess, SimState};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Which code path a test drives: the in-process simulator, or NVML through nvml-wrapper
/// loading the fake libnvidia-ml (both over the same state-file format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `--simulate` / `--sim-state`.
    Sim,
    /// `--nvml-lib target/<profile>/libfake_nvml.so` with `FAKE_NVML_STATE`.
    Nvml,
}

/// One simulated node in a temporary directory.
pub struct Node {
    /// Keeps the directory alive.
    pub dir: tempfile::TempDir,
    /// The state file.
    pub state: PathBuf,
    /// How the binary reaches the GPUs.
    pub backend: Backend,
}

/// The build directory of this test binary (`target/<profile>`).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The fake NVML library and stand-in nvidia-smi, built by `cargo test --workspace` (which leaves
/// the cdylib in `deps/`) or `cargo build -p fake-nvml`; the newer library wins.
pub fn fake_nvml() -> (PathBuf, PathBuf) {
    let dir = build_dir();
    let lib = [dir.join("libfake_nvml.so"), dir.join("deps/libfake_nvml.so")]
        .into_iter()
        .filter_map(|p| std::fs::metadata(&p).and_then(|m| m.modified()).ok().map(|t| (t, p)))
        .max()
        .map(|(_, p)| p);
    let smi = dir.join("fake-nvidia-smi");
    match lib {
        Some(lib) if smi.exists() => (lib, smi),
        _ => panic!(
            "libfake_nvml.so / fake-nvidia-smi missing under {}: run the tests with `cargo test --workspace`",
            dir.display()
        ),
    }
}

/// The MPS control program's test double, built by `cargo test --workspace`.
pub fn fake_mps_control() -> PathBuf {
    let p = build_dir().join("fake-nvidia-cuda-mps-control");
    assert!(p.exists(), "{} missing: run the tests with `cargo test --workspace`", p.display());
    p
}

/// Captured result of one binary run.
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Captures a finished process.
    pub fn from(o: Output) -> Self {
        Self {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Panics with both streams unless the run exited 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    /// Panics unless the run failed.
    pub fn failed(self) -> Self {
        assert_ne!(self.code, 0, "expected failure\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    /// Both streams.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Environment that must not leak from the developer's shell into a test run.
const CLEARED_ENV: &[&str] = &[
    "GPUPART_MPS_SHM_SIZE",
    "GPUPART_MPS_ROOT",
    "GPUPART_MPS_CONTROL",
    "GPUPART_POD_RESOURCES_SOCKET",
    "GPUPART_HEALTH_FILE",
    "GPUPART_IGNORE_XIDS",
    "GPUPART_SIMULATE",
    "GPUPART_SIM_STATE",
    "MIG_PARTED_CONFIG_FILE",
    "MIG_PARTED_SELECTED_CONFIG",
    "MIG_PARTED_DEBUG",
    "MIG_PARTED_SKIP_RESET",
    "MIG_PARTED_MODE_CHANGE_ONLY",
    "CONFIG_FILE",
    "GPUPART_SIM_FAIL",
    "GPUPART_SIM_OP_DELAY_MS",
    "FAKE_NVML_FAIL",
    "FAKE_NVML_OP_DELAY_MS",
    "FAKE_NVML_GPUS",
    "FAKE_NVML_STATE",
];

/// Runs the binary with `args` (no simulator options added).
pub fn gpupart(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpupart"));
    c.args(args).env_remove("RUST_LOG").env("RUST_LOG", "warn");
    for k in CLEARED_ENV {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    Run::from(c.output().expect("run gpupart"))
}

impl Node {
    /// A fresh simulated node from `MODEL:COUNT[,…]`, reached through the simulator backend.
    pub fn new(spec: &str) -> Self {
        Self::with(Backend::Sim, spec)
    }

    /// A fresh simulated node reached through `backend`.
    pub fn with(backend: Backend, spec: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        store::save(&state, &SimState::new(&gpupart::mig::sim::parse_spec(spec).unwrap())).unwrap();
        Self { dir, state, backend }
    }

    /// The environment variable and value that inject `spec` (`FUNCTION:NTH:CODE`) for this backend.
    pub fn fail_env(&self, spec: &str) -> [(&'static str, String); 1] {
        match self.backend {
            Backend::Sim => [("GPUPART_SIM_FAIL", spec.to_string())],
            Backend::Nvml => [("FAKE_NVML_FAIL", spec.to_string())],
        }
    }

    /// The environment variable that sets the per-operation delay for this backend.
    pub fn delay_var(&self) -> &'static str {
        match self.backend {
            Backend::Sim => "GPUPART_SIM_OP_DELAY_MS",
            Backend::Nvml => "FAKE_NVML_OP_DELAY_MS",
        }
    }

    /// The command that runs the binary on this node (for tests that manage the process).
    pub fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpupart"));
        for k in CLEARED_ENV {
            c.env_remove(k);
        }
        c.env("RUST_LOG", "warn").env("GPUPART_MPS_SHM_SIZE", "0");
        c.env("GPUPART_MPS_ROOT", self.mps_root()).env("GPUPART_MPS_CONTROL", fake_mps_control());
        c.env("GPUPART_POD_RESOURCES_SOCKET", self.pod_resources_socket());
        c.env("GPUPART_HEALTH_FILE", self.health_file());
        match self.backend {
            Backend::Sim => {
                c.args(["--sim-state", self.state.to_str().unwrap()]);
            }
            Backend::Nvml => {
                let (lib, smi) = fake_nvml();
                c.arg("--nvml-lib").arg(lib).arg("--nvidia-smi").arg(smi).env("FAKE_NVML_STATE", &self.state);
            }
        }
        c.args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// The node's record of unhealthy GPUs (`--health-file`).
    pub fn health_file(&self) -> PathBuf {
        self.dir.path().join("health.json")
    }

    /// The node's PodResources socket (absent unless a test serves it).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.path().join("pod-resources/kubelet.sock")
    }

    /// The node's `--mps-root` (inside its directory, so daemons exit when the test ends).
    pub fn mps_root(&self) -> PathBuf {
        self.dir.path().join("mps")
    }

    /// The directory of GPU `uuid`'s MPS daemon.
    pub fn mps_dir(&self, uuid: &str) -> PathBuf {
        self.mps_root().join(uuid)
    }

    /// The commands GPU `uuid`'s daemon received, from its control.log, in order.
    pub fn mps_commands(&self, uuid: &str) -> Vec<String> {
        let log = std::fs::read_to_string(self.mps_dir(uuid).join("log/control.log")).unwrap_or_default();
        log.lines().filter_map(|l| l.split_once("Cmd:").map(|(_, c)| c.to_string())).collect()
    }

    /// The commands the current daemon of GPU `uuid` received since it started.
    pub fn mps_commands_since_start(&self, uuid: &str) -> Vec<String> {
        let log = std::fs::read_to_string(self.mps_dir(uuid).join("log/control.log")).unwrap_or_default();
        let from = log.rfind("Starting control daemon").unwrap_or(0);
        log[from..].lines().filter_map(|l| l.split_once("Cmd:").map(|(_, c)| c.to_string())).collect()
    }

    /// The pid in GPU `uuid`'s daemon pid file.
    pub fn mps_pid(&self, uuid: &str) -> Option<u32> {
        std::fs::read_to_string(self.mps_dir(uuid).join("pipe/nvidia-cuda-mps-control.pid")).ok()?.trim().parse().ok()
    }

    /// Runs the binary on this node.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// Runs the binary on this node with extra environment.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        Run::from(self.command(args, env).output().expect("run gpupart"))
    }

    /// Writes a config file into the node's directory and returns its path.
    pub fn config(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// Applies `config` from `file` and expects success.
    pub fn apply(&self, file: &str, config: &str) -> Run {
        self.apply_result(file, config).ok()
    }

    /// Applies `config` from `file`, successful or not.
    pub fn apply_result(&self, file: &str, config: &str) -> Run {
        self.run(&["apply", "-f", file, "-c", config])
    }

    /// The simulator state.
    pub fn load(&self) -> SimState {
        store::load(&self.state).unwrap()
    }

    /// Replaces the simulator state.
    pub fn save(&self, s: &SimState) {
        store::save(&self.state, s).unwrap();
    }

    /// Changes the state file under its lock, as the agent and the fake library do, so a change
    /// made while they write is never lost.
    pub fn change(&self, f: impl FnOnce(&mut SimState)) {
        let mut file = store::SharedFile::new(&self.state);
        let mut s = self.load();
        file.update(&mut s, |s| {
            f(s);
            Ok::<(), ()>(())
        })
        .unwrap();
    }

    /// Appends an NVML event for GPU `gpu` (one MIG instance when given: GPU and compute
    /// instance ids); when it was appended.
    pub fn inject_event(
        &self,
        gpu: u32,
        event_type: u64,
        data: u64,
        instance: Option<(u32, u32)>,
    ) -> std::time::Instant {
        self.change(|s| {
            s.inject_event(gpu, event_type, data, instance);
        });
        std::time::Instant::now()
    }

    /// An XID critical error on GPU `gpu` (or one of its MIG instances); when it was appended.
    pub fn inject_xid(&self, gpu: u32, xid: u64, instance: Option<(u32, u32)>) -> std::time::Instant {
        self.inject_event(gpu, gpupart::mig::sim::state::EVENT_XID, xid, instance)
    }

    /// GPU `gpu` falls off the bus (`lost`), or answers again after its reset.
    pub fn set_lost(&self, gpu: usize, lost: bool) {
        self.change(|s| s.gpus[gpu].lost = lost);
    }

    /// Attaches a process to the first MIG device of GI `gi` on GPU `gpu`.
    pub fn attach(&self, gpu: usize, gi: u32, pid: u32) {
        let mut s = self.load();
        let g = s.gpus[gpu].gpu_instances.iter_mut().find(|g| g.id == gi).unwrap();
        g.compute_instances[0].processes.push(SimProcess { pid, name: "vllm".into(), used_memory_mib: 4096 });
        self.save(&s);
    }

    /// `status -o json` as a value.
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.run(&["status", "-o", "json"]).ok().stdout).unwrap()
    }
}

/// `(profile, placement start)` of every MIG device per GPU, from a status document.
pub fn layout(status: &serde_json::Value) -> Vec<Vec<(String, u64)>> {
    status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let mut v: Vec<(String, u64)> = g["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| (i["profile"].as_str().unwrap().to_string(), i["placement"]["start"].as_u64().unwrap()))
                .collect();
            v.sort();
            v
        })
        .collect()
}

/// NVIDIA's reference configs beside the repository (shared/reference/nvidia-configs).
pub fn nvidia_config(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/nvidia-configs").join(name);
    assert!(p.exists(), "{} is missing: shared/ must sit beside the repository", p.display());
    p
}

/// The repository's example config.
pub fn example_config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/config.yaml").to_str().unwrap().to_string()
}

/// Lints a classic-text scrape with `promtool check metrics`; panics with its findings.
pub fn promtool(text: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is not installed (apt-get install prometheus; scripts/test does)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `/metrics` body of the process whose log is `log` (its port from the "serving" line).
pub fn metrics_in_log(log: &str) -> String {
    let port: u16 = log
        .lines()
        .find_map(|l| l.split("addr=127.0.0.1:").nth(1))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    let response = http_get(port, "/metrics");
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(response)
}

/// `GET path` on a loopback port; the whole response.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The A100-80GB / H100-80GB group shares one profile-name family in NVIDIA's file.
pub const EIGHTY_GB: [&str; 10] = [
    "all-disabled",
    "all-enabled",
    "all-1g.10gb",
    "all-1g.10gb.me",
    "all-1g.20gb",
    "all-2g.20gb",
    "all-3g.40gb",
    "all-4g.40gb",
    "all-7g.80gb",
    "all-balanced",
];

/// A pip-installed tool: on PATH, or in the Python scripts directory when PATH lacks it.
pub fn resolve_tool(name: &str) -> String {
    if Command::new(name).arg("--version").output().is_ok() {
        return name.to_string();
    }
    let out = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .output()
        .expect("python3");
    format!("{}/{name}", String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs a pip-installed checker (kubernetes-validate, hadolint): success and both streams.
#[allow(dead_code)]
pub fn tool(name: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(resolve_tool(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} is not installed ({e}); scripts/test installs it with pip"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
