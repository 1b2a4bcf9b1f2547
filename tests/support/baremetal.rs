//! A bare-metal agent (`gpupart agent --no-kube`) run by tests: started on a free loopback port
//! with a layout file, status file and node lock in the node's directory; killed on drop.

use super::{example_config, Node};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running agent; killed on drop.
pub struct Agent {
    /// The agent process.
    pub child: Child,
    /// Its status file.
    pub status: PathBuf,
    /// Its HTTP port.
    pub port: u16,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts an agent on `node` following `layout`, with `extra` arguments.
pub fn start(node: &Node, layout: &Path, extra: &[&str]) -> Agent {
    start_with(node, &example_config(), layout, extra)
}

/// Starts an agent on `node` with config file `cfg`, following `layout`.
pub fn start_with(node: &Node, cfg: &str, layout: &Path, extra: &[&str]) -> Agent {
    let port = free_port();
    let status = node.dir.path().join("status.json");
    let lock = node.dir.path().join("agent.lock");
    let guard = node.dir.path().join("reboot-guard");
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec![
        "agent",
        "--no-kube",
        "-f",
        cfg,
        "--layout-file",
        layout.to_str().unwrap(),
        "--status-file",
        status.to_str().unwrap(),
        "--lock-file",
        lock.to_str().unwrap(),
        "--reboot-guard",
        guard.to_str().unwrap(),
        "--metrics-addr",
        &addr,
        "--retry-min",
        "100ms",
        "--retry-max",
        "400ms",
    ];
    args.extend_from_slice(extra);
    let child = node.command(&args, &[]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    Agent { child, status, port }
}

impl Agent {
    /// The status file's content (null while absent).
    pub fn status(&self) -> serde_json::Value {
        std::fs::read_to_string(&self.status).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    }

    /// Waits until the status file says `state` for `layout`, and returns it.
    pub fn wait_for(&self, state: &str, layout: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status();
            if s["state"] == state && s["layout"] == layout {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {state}/{layout}; last status: {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET path` on the agent's HTTP port; the whole response.
    pub fn get(&self, path: &str) -> String {
        super::http_get(self.port, path)
    }
}
