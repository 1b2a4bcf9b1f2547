//! The agent keeps MPS daemons alive (bare metal, both backends): a killed daemon is restarted
//! with its limits, counted and reported; a hung one is restarted with backoff until it answers;
//! after an agent restart running daemons are adopted, not restarted.

#[macro_use]
mod support;

use std::time::{Duration, Instant};
use support::baremetal::{start_with, Agent};
use support::{promtool, Backend, Node};

on_both_backends!(
    killed_daemon_is_restarted_and_counted,
    hung_daemon_is_restarted_with_backoff,
    agent_restart_adopts_running_daemons
);

const CONFIG: &str = r#"version: v1
mig-configs:
  mps:
    - devices: [0]
      mig-enabled: false
      mps: {replicas: 4, active-thread-percentage: 25, pinned-memory-limit: 7G}
    - devices: [1]
      mig-enabled: false
      mps: {replicas: 2}
"#;

fn agent(node: &Node) -> Agent {
    let cfg = node.config("mps.yaml", CONFIG);
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "mps\n").unwrap();
    start_with(
        node,
        &cfg,
        &layout,
        &[
            "--poll-interval",
            "100ms",
            "--resync-interval",
            "1h",
            "--mps-health-interval",
            "100ms",
            "--mps-timeout",
            "500ms",
        ],
    )
}

fn uuid(node: &Node, gpu: usize) -> String {
    node.load().gpus[gpu].uuid.clone()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

fn killed_daemon_is_restarted_and_counted(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2");
    let agent = agent(&node);
    agent.wait_for("success", "mps");
    let u0 = uuid(&node, 0);
    let old = node.mps_pid(&u0).unwrap();
    let killed = Instant::now();
    std::process::Command::new("kill").args(["-9", &old.to_string()]).status().unwrap();
    wait_until("a new daemon", Duration::from_secs(10), || node.mps_pid(&u0).is_some_and(|p| p != old && alive(p)));
    let latency = killed.elapsed();
    println!("restart latency after kill -9: {} ms (health interval 100 ms)", latency.as_millis());
    wait_until("the restart in the status", Duration::from_secs(5), || {
        agent.status()["reason"].as_str().unwrap_or("").contains("MPS daemon restarted as pid")
    });
    let sent = node.mps_commands_since_start(&u0);
    assert_eq!(
        sent[..2],
        [
            "set_default_active_thread_percentage 25".to_string(),
            format!("set_default_device_pinned_mem_limit {u0} 7168M")
        ]
    );
    assert_eq!(agent.status()["state"], "success");
    // The counter moves at once; the gauges with the next snapshot, right after the restart.
    wait_until("the restart in /metrics", Duration::from_secs(5), || {
        let m = agent.get("/metrics");
        m.contains(&format!("gpupart_mps_daemon_restarts_total{{uuid=\"{u0}\",result=\"success\"}} 1"))
            && m.contains(&format!("gpupart_mps_daemon_up{{uuid=\"{u0}\"}} 1"))
    });
    let m = agent.get("/metrics");
    promtool(m.split_once("\r\n\r\n").map_or("", |(_, b)| b));
    assert!(m.contains(&format!("gpupart_mps_daemon_up{{uuid=\"{u0}\"}} 1")), "{m}");
    assert!(m.contains(&format!("gpupart_mps_slots{{uuid=\"{u0}\",state=\"total\"}} 4")), "{m}");
    assert!(m.contains(&format!("gpupart_mps_slot_active_thread_percentage{{uuid=\"{u0}\"}} 25")), "{m}");
    assert!(m.contains(&format!("gpupart_mps_slot_pinned_memory_limit_bytes{{uuid=\"{u0}\"}} 7516192768")), "{m}");
    assert!(m.contains(&format!("gpupart_gpu_partition_mode{{uuid=\"{u0}\",mode=\"mps\"}} 1")), "{m}");
}

fn hung_daemon_is_restarted_with_backoff(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2");
    let agent = agent(&node);
    agent.wait_for("success", "mps");
    let u1 = uuid(&node, 1);
    let old = node.mps_pid(&u1).unwrap();
    let hang = node.mps_dir(&u1).join("pipe/fake-hang");
    std::fs::write(&hang, "").unwrap();
    // It stops answering: killed and started again, but the new daemon hangs too, so the restart
    // fails, the state says so, and it is retried with backoff.
    let s = agent.wait_for("failed", "mps");
    assert!(s["reason"].as_str().unwrap().contains("restart failed"), "{s}");
    assert!(!alive(old), "the hung daemon was killed");
    std::fs::remove_file(&hang).unwrap();
    agent.wait_for("success", "mps");
    assert!(node.mps_pid(&u1).is_some_and(alive));
    wait_until("the failure in /metrics", Duration::from_secs(5), || {
        agent
            .get("/metrics")
            .contains(&format!("gpupart_mps_daemon_restarts_total{{uuid=\"{u1}\",result=\"failure\"}}"))
    });
}

fn agent_restart_adopts_running_daemons(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2");
    let first = agent(&node);
    first.wait_for("success", "mps");
    let uuids = [uuid(&node, 0), uuid(&node, 1)];
    let pids: Vec<_> = uuids.iter().map(|u| node.mps_pid(u).unwrap()).collect();
    drop(first); // SIGKILL: the daemons stay.
    assert!(pids.iter().all(|p| alive(*p)), "daemons outlive the agent");
    let _ = std::fs::remove_file(node.dir.path().join("status.json"));
    let second = agent(&node);
    second.wait_for("success", "mps");
    for (u, p) in uuids.iter().zip(&pids) {
        assert_eq!(node.mps_pid(u), Some(*p), "adopted, not restarted");
        assert_eq!(node.mps_commands(u).iter().filter(|c| c.starts_with("set_")).count(), 2);
    }
}
