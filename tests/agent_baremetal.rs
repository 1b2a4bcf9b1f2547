//! `gpupart agent --no-kube` end to end on both backends: layout-file changes, SIGHUP, bad input,
//! busy instances with retries, drift repair, health endpoints and the node lock.

#[macro_use]
mod support;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::baremetal::start;
use support::{example_config, Backend, Node};

on_both_backends!(
    follows_the_layout_file,
    retries_busy_and_repairs_drift,
    sighup_rereads_and_lock_refuses_a_second_agent
);

fn follows_the_layout_file(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms", "--resync-interval", "1h"]);
    agent.wait_for("success", "all-balanced");
    let cfg = example_config();
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();
    assert!(agent.get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(agent.get("/readyz").starts_with("HTTP/1.1 200"));
    let metrics = agent.get("/metrics");
    assert!(metrics.contains("gpupart_build_info"));
    // Bare metal reads no PodResources: no gauge that would say it is down.
    assert!(!metrics.contains("gpupart_pod_resources_up"), "{metrics}");
    assert!(metrics.contains("gpupart_agent_state{state=\"success\"} 1"), "{metrics}");

    std::fs::write(&layout, "mixed-3g-2g\n").unwrap();
    let s = agent.wait_for("success", "mixed-3g-2g");
    assert_eq!(
        (s["kept"].as_u64(), s["destroyed"].as_u64(), s["created"].as_u64()),
        (Some(4), Some(4), Some(2)),
        "{s}"
    );
    node.run(&["assert", "-f", &cfg, "-c", "mixed-3g-2g"]).ok();

    let before = node.load();
    std::fs::write(&layout, "bogus\n").unwrap();
    let s = agent.wait_for("failed", "bogus");
    assert!(s["reason"].as_str().unwrap().contains("unknown layout 'bogus'"), "{s}");
    assert_eq!(node.load(), before, "bad input touches no GPU");
}

fn retries_busy_and_repairs_drift(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-1g.10gb");
    let gi = node.load().gpus[0].gpu_instances.iter().find(|g| g.placement.start == 4).unwrap().id;
    node.attach(0, gi, 4242);
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms", "--resync-interval", "500ms"]);
    let s = agent.wait_for("failed", "all-balanced");
    assert!(s["reason"].as_str().unwrap().contains("used by pid 4242"), "{s}");
    // It keeps retrying with backoff instead of waiting for a label change.
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.status()["attempts"].as_u64().unwrap_or(0) < 3 {
        assert!(Instant::now() < deadline, "no retries: {}", agent.status());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The process ends: the next retry succeeds.
    let mut s = node.load();
    s.gpus[0].gpu_instances.iter_mut().for_each(|g| g.compute_instances.iter_mut().for_each(|c| c.processes.clear()));
    node.save(&s);
    agent.wait_for("success", "all-balanced");
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();
    // Drift: someone changes the GPU behind the agent's back; the periodic resync repairs it.
    node.apply(&cfg, "all-1g.10gb");
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).code != 0 {
        assert!(Instant::now() < deadline, "drift was not repaired");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sighup_rereads_and_lock_refuses_a_second_agent(b: Backend) {
    let node = Node::with(b, "H100-SXM5-80GB:1");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-1g.10gb\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "1h", "--resync-interval", "1h"]);
    agent.wait_for("success", "all-1g.10gb");
    let lock = node.dir.path().join("agent.lock");
    let cfg = example_config();
    let args = [
        "agent",
        "--no-kube",
        "-f",
        &cfg,
        "--layout",
        "all-balanced",
        "--lock-file",
        lock.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let mut second = node.command(&args, &[]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = second.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the second agent did not refuse to start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    second.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success() && err.contains("another gpupart agent"), "{err}");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent.status()["layout"], "all-1g.10gb", "no polling: nothing happens without SIGHUP");
    let pid = agent.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    agent.wait_for("success", "all-balanced");
}

/// A pass-through GPU (no reset): the MIG mode needs a reboot. Without --allow-reboot the state is
/// `failed` ("reboot required"); with it, `rebooting` and the reboot command runs once; if the mode
/// is still wrong after that reboot, `failed` instead of a reboot loop.
#[test]
fn reboot_only_when_allowed_and_only_once() {
    let node = Node::with(Backend::Sim, "A100-SXM4-80GB:1");
    let mut s = node.load();
    s.gpus[0].passthrough = true;
    node.save(&s);
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    {
        let agent = start(&node, &layout, &["--resync-interval", "1h"]);
        let st = agent.wait_for("failed", "all-balanced");
        assert!(st["reason"].as_str().unwrap().contains("reboot required"), "{st}");
    }
    let marker = node.dir.path().join("rebooted");
    let reboot = format!("touch {}", marker.display());
    {
        let agent = start(&node, &layout, &["--resync-interval", "1h", "--allow-reboot", "--reboot-command", &reboot]);
        agent.wait_for("rebooting", "all-balanced");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "the reboot command did not run");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // "After the reboot" the mode is still pending: the guard stops a reboot loop.
    std::fs::remove_file(&marker).unwrap();
    let agent = start(&node, &layout, &["--resync-interval", "1h", "--allow-reboot", "--reboot-command", &reboot]);
    let st = agent.wait_for("failed", "all-balanced");
    assert!(st["reason"].as_str().unwrap().contains("did not take effect after rebooting"), "{st}");
    assert!(!marker.exists(), "no second reboot");
}

#[test]
fn the_agent_runs_a_hooks_file_around_each_change() {
    let node = Node::new("A100-SXM4-80GB:1");
    let layout = node.dir.path().join("layout");
    let trace = node.dir.path().join("trace");
    let hook = |name: &str| {
        format!(
            "  {name}:\n  - command: /bin/sh\n    args: [\"-c\", \"echo {name} $MIG_PARTED_SELECTED_CONFIG >> {}\"]\n",
            trace.display()
        )
    };
    let hooks = node.config(
        "hooks.yaml",
        &format!(
            "version: v1\nhooks:\n{}{}{}{}",
            hook("apply-start"),
            hook("pre-apply-mode"),
            hook("pre-apply-config"),
            hook("apply-exit")
        ),
    );
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms", "--hooks", &hooks]);
    agent.wait_for("success", "all-balanced");
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        "apply-start all-balanced\npre-apply-mode all-balanced\npre-apply-config all-balanced\napply-exit all-balanced\n"
    );
    drop(agent);
    // A failing apply-start stops the change: nothing changes, the state says why, apply-exit runs.
    std::fs::remove_file(&trace).unwrap();
    let failing = node.config(
        "fail.yaml",
        &format!(
            "version: v1\nhooks:\n  apply-start:\n  - command: /bin/sh\n    args: [\"-c\", \"echo services would not stop >&2; exit 1\"]\n{}",
            hook("apply-exit")
        ),
    );
    let before = node.load();
    std::fs::write(&layout, "mixed-3g-2g\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms", "--hooks", &failing]);
    let st = agent.wait_for("failed", "mixed-3g-2g");
    assert_eq!(st["failure"], "hook", "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("hook apply-start[0] (/bin/sh) failed") && reason.contains("services would not stop"),
        "{reason}"
    );
    assert!(reason.ends_with("nothing was changed"), "{reason}");
    assert_eq!(node.load(), before);
    assert!(std::fs::read_to_string(&trace).unwrap().starts_with("apply-exit mixed-3g-2g\n"));
}
