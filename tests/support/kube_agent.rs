//! The Kubernetes-mode agent run by tests: the real binary against the API test server, with
//! a kubeconfig, lock and reboot guard in the node's directory; killed on drop. Plus waits on
//! what it publishes on the Node.

use super::apiserver::ApiServer;
use super::{example_config, Node};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub const NODE: &str = "gpu-node-1";
pub const LAYOUT: &str = "nvidia.com/mig.config";
pub const STATE: &str = "nvidia.com/mig.config.state";

/// A child process (an agent, a controller) killed on drop.
pub struct Agent(pub Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start(node: &Node, api: &ApiServer, extra: &[&str]) -> Agent {
    start_with(node, api, extra, &[])
}

/// Starts the agent against `api` with `extra` arguments and environment.
pub fn start_with(node: &Node, api: &ApiServer, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    start_config(node, api, &example_config(), extra, env)
}

/// Starts the agent against `api` with `extra` arguments, its log (stderr, level info) going to
/// `log`.
pub fn start_logging(node: &Node, api: &ApiServer, extra: &[&str], log: &std::path::Path) -> Agent {
    spawn(node, api, &example_config(), extra, &[("RUST_LOG", "info")], Some(log))
}

/// Starts the agent against `api` with config file `cfg`.
pub fn start_config(node: &Node, api: &ApiServer, cfg: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    spawn(node, api, cfg, extra, env, None)
}

fn spawn(
    node: &Node,
    api: &ApiServer,
    cfg: &str,
    extra: &[&str],
    env: &[(&str, &str)],
    log_to: Option<&std::path::Path>,
) -> Agent {
    let kubeconfig = api.kubeconfig(node.dir.path());
    let lock = node.dir.path().join("agent.lock");
    let guard = node.dir.path().join("guard");
    let plugins = node.dir.path().join("device-plugins");
    let mut args = vec![
        "agent",
        "--device-plugin-dir",
        plugins.to_str().unwrap(),
        "-f",
        cfg,
        "--node-name",
        NODE,
        "--lock-file",
        lock.to_str().unwrap(),
        "--reboot-guard",
        guard.to_str().unwrap(),
        "--retry-min",
        "100ms",
        "--retry-max",
        "500ms",
        "--poll-interval",
        "200ms",
    ];
    if !extra.contains(&"--metrics-addr") {
        args.extend_from_slice(&["--metrics-addr", "127.0.0.1:0"]);
    }
    args.extend_from_slice(extra);
    let mut env = env.to_vec();
    env.push(("KUBECONFIG", kubeconfig.to_str().unwrap()));
    let log = match log_to {
        Some(p) => Some(std::fs::File::create(p).unwrap()),
        None => std::env::var_os("GPUPART_TEST_AGENT_LOG").and_then(|p| std::fs::File::create(p).ok()),
    };
    let stderr = log.map_or_else(Stdio::null, Stdio::from);
    let child = node.command(&args, &env).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
    Agent(child)
}

/// Waits until the state label is `state` and the reported layout is `layout`.
pub fn wait_state(api: &ApiServer, state: &str, layout: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        {
            let s = api.state();
            if s.labels.get(STATE).map(String::as_str) == Some(state)
                && s.annotations.get("gpupart.io/state-layout").map(String::as_str) == Some(layout)
            {
                return;
            }
        }
        if Instant::now() >= deadline {
            let s = api.state();
            panic!("timed out waiting for {state}/{layout}: {:?} {:?}", s.labels, s.annotations);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn reason(api: &ApiServer) -> String {
    api.state().annotations.get("gpupart.io/state-reason").cloned().unwrap_or_default()
}

pub fn event_reasons(api: &ApiServer) -> Vec<String> {
    api.state().events.iter().map(|e| e["reason"].as_str().unwrap_or_default().to_string()).collect()
}

/// Waits for an Event with `reason` whose note contains `text` (Events follow the state label).
pub fn wait_event(api: &ApiServer, reason: &str, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = api
            .state()
            .events
            .iter()
            .filter(|e| e["reason"] == reason)
            .filter_map(|e| e["note"].as_str().map(str::to_string))
            .find(|n| n.contains(text));
        if let Some(n) = found {
            return n;
        }
        assert!(Instant::now() < deadline, "no {reason} event mentioning {text}: {:?}", event_reasons(api));
        std::thread::sleep(Duration::from_millis(20));
    }
}
