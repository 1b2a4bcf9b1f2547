//! Helpers for the integration tests: run the real `gpupart` binary against a simulator state
//! file in a temporary directory, and read or edit that state.
#![allow(dead_code)]

use gpupart::mig::sim::{store, SimProcess, SimState};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// One simulated node in a temporary directory.
pub struct Node {
    /// Keeps the directory alive.
    pub dir: tempfile::TempDir,
    /// The state file.
    pub state: PathBuf,
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
    fn from(o: Output) -> Self {
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

/// Runs the binary with `args` (no simulator options added).
pub fn gpupart(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpupart"));
    c.args(args).env_remove("RUST_LOG").env("RUST_LOG", "warn");
    for k in [
        "GPUPART_SIMULATE",
        "GPUPART_SIM_STATE",
        "MIG_PARTED_CONFIG_FILE",
        "MIG_PARTED_SELECTED_CONFIG",
        "GPUPART_SIM_FAIL",
        "GPUPART_SIM_OP_DELAY_MS",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    Run::from(c.output().expect("run gpupart"))
}

impl Node {
    /// A fresh simulated node from `MODEL:COUNT[,…]`.
    pub fn new(spec: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let n = Self { dir, state };
        n.run(&["--simulate", spec, "status"]).ok();
        n
    }

    /// Runs the binary on this node.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// Runs the binary on this node with extra environment.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut all = vec!["--sim-state", self.state.to_str().unwrap()];
        all.extend_from_slice(args);
        gpupart(&all, env)
    }

    /// Writes a config file into the node's directory and returns its path.
    pub fn config(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// Applies `config` from `file` and expects success.
    pub fn apply(&self, file: &str, config: &str) -> Run {
        self.run(&["apply", "-f", file, "-c", config]).ok()
    }

    /// The simulator state.
    pub fn load(&self) -> SimState {
        store::load(&self.state).unwrap()
    }

    /// Replaces the simulator state.
    pub fn save(&self, s: &SimState) {
        store::save(&self.state, s).unwrap();
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
