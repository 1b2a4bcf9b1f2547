//! MPS daemons through the real binary: `apply` starts one control daemon per GPU (the test
//! double of `nvidia-cuda-mps-control`) with the per-GPU limits of the layout, adopts matching
//! daemons, restarts changed ones, keeps busy ones, stops them on a change, switches GPUs between
//! MIG and MPS; `status` shows them. Every scenario runs on both backends.

#[macro_use]
mod support;

use support::{Backend, Node};

on_both_backends!(
    start_with_per_gpu_limits_then_adopt,
    changed_limits_restart_and_busy_daemons_stay,
    stop_on_change_and_restart_after_kill,
    switch_between_mig_and_mps_both_ways,
    refusals_change_nothing,
    export_carries_the_daemons_and_assert_compares_them,
);

const MIXED: &str = r#"version: v1
mig-configs:
  mps:
    - devices: [0]
      mig-enabled: false
      mps: {replicas: 4, active-thread-percentage: 25, pinned-memory-limit: 7G}
    - devices: [1]
      mig-enabled: false
      mps: {replicas: 2}
    - devices: [2]
      mig-enabled: false
      mps: {replicas: 3, pinned-memory-limit: 4096M}
    - devices: [3]
      mig-enabled: false
      mps: {replicas: 8, active-thread-percentage: 20, pinned-memory-limit: 1G}
  mps-changed:
    - devices: [0]
      mig-enabled: false
      mps: {replicas: 2, active-thread-percentage: 50, pinned-memory-limit: 7G}
    - devices: [1]
      mig-enabled: false
      mps: {replicas: 2}
    - devices: [2, 3]
      mig-enabled: false
  none:
    - devices: all
      mig-enabled: false
"#;

fn uuids(node: &Node) -> Vec<String> {
    node.status()["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].as_str().unwrap().to_string()).collect()
}

fn start_with_per_gpu_limits_then_adopt(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2,T4-16GB:2");
    let cfg = node.config("mps.yaml", MIXED);
    let out = node.apply(&cfg, "mps");
    assert!(
        out.stdout.contains("4 client slots, 25% threads, 7168M pinned memory per client: start the daemon"),
        "{}",
        out.stdout
    );
    let u = uuids(&node);
    let expected = [
        vec![
            "set_default_active_thread_percentage 25".to_string(),
            format!("set_default_device_pinned_mem_limit {} 7168M", u[0]),
        ],
        vec![
            "set_default_active_thread_percentage 50".to_string(),
            format!("set_default_device_pinned_mem_limit {} 16384M", u[1]),
        ],
        vec![
            "set_default_active_thread_percentage 33".to_string(),
            format!("set_default_device_pinned_mem_limit {} 4096M", u[2]),
        ],
        vec![
            "set_default_active_thread_percentage 20".to_string(),
            format!("set_default_device_pinned_mem_limit {} 1024M", u[3]),
        ],
    ];
    for (i, want) in expected.iter().enumerate() {
        let sent = node.mps_commands(&u[i]);
        assert_eq!(&sent[..2], &want[..], "GPU {i}: {sent:?}");
        println!("GPU {i} ({}): nvidia-cuda-mps-control -d, then {:?}", u[i], want);
    }
    let status = node.status();
    for (i, g) in status["gpus"].as_array().unwrap().iter().enumerate() {
        assert_eq!(g["compute_mode"], "exclusive_process", "GPU {i}");
        let m = &g["mps"];
        assert_eq!(m["up"], true, "GPU {i}: {m}");
        assert_eq!(m["pid"].as_u64().map(|p| p as u32), node.mps_pid(&u[i]));
        assert!(m["pipe_directory"].as_str().unwrap().ends_with(&format!("{}/pipe", u[i])));
    }
    assert_eq!(status["gpus"][0]["mps"]["replicas"], 4);
    assert_eq!(status["gpus"][0]["mps"]["active_thread_percentage"], "25.0");
    assert_eq!(status["gpus"][0]["mps"]["pinned_memory_limit"], "7G");
    assert_eq!(status["gpus"][3]["mps"]["replicas"], 8);
    let table = node.run(&["status"]).ok().stdout;
    assert!(table.contains("mps: up (pid") && table.contains("4 slots, threads 25.0%, pinned memory 7G"), "{table}");

    // Fragmentation counts an MPS GPU by its slots: one connected client uses one of four.
    std::fs::write(node.mps_dir(&u[0]).join("pipe/fake-clients"), "111\n").unwrap();
    let f = node.status()["gpus"][0]["fragmentation"].clone();
    assert_eq!((f["mps_slots"].as_u64(), f["mps_slots_used"].as_u64()), (Some(4), Some(1)), "{f}");
    assert_eq!(f["unallocated_gpus"], 0.75);
    let frag: serde_json::Value = serde_json::from_str(&node.run(&["frag", "-o", "json"]).ok().stdout).unwrap();
    assert_eq!(frag["node"]["unallocated_gpus"], 3.75);
    assert_eq!(frag["node"]["whole_free_gpus"], 0);
    std::fs::remove_file(node.mps_dir(&u[0]).join("pipe/fake-clients")).unwrap();

    // Applying again adopts every daemon: same pids, no new set_* commands.
    let pids: Vec<_> = u.iter().map(|x| node.mps_pid(x)).collect();
    let again = node.apply(&cfg, "mps");
    assert_eq!(again.stdout.matches("keep the running daemon").count(), 4, "{}", again.stdout);
    for (i, x) in u.iter().enumerate() {
        assert_eq!(node.mps_pid(x), pids[i]);
        assert_eq!(node.mps_commands(x).iter().filter(|c| c.starts_with("set_")).count(), 2, "GPU {i}");
    }
}

fn changed_limits_restart_and_busy_daemons_stay(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2,T4-16GB:2");
    let cfg = node.config("mps.yaml", MIXED);
    node.apply(&cfg, "mps");
    let u = uuids(&node);
    let before: Vec<_> = u.iter().map(|x| node.mps_pid(x)).collect();
    // GPU 2's daemon has clients: the change to no MPS there must not stop it.
    std::fs::write(node.mps_dir(&u[2]).join("pipe/fake-clients"), "4242\n4243\n").unwrap();
    let blocked = node.apply_result(&cfg, "mps-changed").failed();
    assert!(blocked.all().contains("GPU 2 (T4-16GB): the MPS daemon"), "{}", blocked.all());
    assert!(blocked.all().contains("connected clients (pids 4242, 4243)"), "{}", blocked.all());
    assert!(blocked.all().contains("nothing was changed"), "{}", blocked.all());
    let after: Vec<_> = u.iter().map(|x| node.mps_pid(x)).collect();
    assert_eq!(after, before, "no daemon was touched");
    // The clients go: GPU 0 restarts with the new percentage, GPU 1 is kept, 2 and 3 stop.
    std::fs::remove_file(node.mps_dir(&u[2]).join("pipe/fake-clients")).unwrap();
    let out = node.apply(&cfg, "mps-changed");
    assert!(
        out.stdout.contains("restart the daemon (active thread percentage is 25.0, configured 50)"),
        "{}",
        out.stdout
    );
    assert_ne!(node.mps_pid(&u[0]), before[0]);
    assert_eq!(node.mps_pid(&u[1]), before[1]);
    let c0 = node.mps_commands(&u[0]);
    let new_limits = [
        "set_default_active_thread_percentage 50".to_string(),
        format!("set_default_device_pinned_mem_limit {} 7168M", u[0]),
    ];
    assert!(c0.contains(&"quit".to_string()) && c0.ends_with(&new_limits), "{c0:?}");
    let status = node.status();
    assert_eq!(status["gpus"][0]["mps"]["replicas"], 2);
    assert!(status["gpus"][2]["mps"].is_null() && status["gpus"][3]["mps"].is_null(), "{}", status["gpus"][2]);
    assert_eq!(status["gpus"][2]["compute_mode"], "default");
    // --force restarts a busy daemon.
    node.apply(&cfg, "mps");
    std::fs::write(node.mps_dir(&u[0]).join("pipe/fake-clients"), "77\n").unwrap();
    let pid = node.mps_pid(&u[0]);
    node.run(&["apply", "-f", &cfg, "-c", "mps-changed", "--force"]).ok();
    assert_ne!(node.mps_pid(&u[0]), pid);
}

fn stop_on_change_and_restart_after_kill(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2,T4-16GB:2");
    let cfg = node.config("mps.yaml", MIXED);
    node.apply(&cfg, "mps");
    let u = uuids(&node);
    // A killed daemon is started again by the next apply, with its limits.
    let pid = node.mps_pid(&u[1]).unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let out = node.apply(&cfg, "mps");
    assert!(
        out.stdout.contains("2 client slots, 50% threads, 16384M pinned memory per client: start the daemon"),
        "{}",
        out.stdout
    );
    assert_ne!(node.mps_pid(&u[1]), Some(pid));
    assert_eq!(node.status()["gpus"][1]["mps"]["up"], true);
    // A change to no MPS quits every daemon and restores compute mode DEFAULT.
    node.apply(&cfg, "none");
    for (i, x) in u.iter().enumerate() {
        assert_eq!(node.mps_pid(x), None, "GPU {i}");
        assert_eq!(node.mps_commands(x).last().map(String::as_str), Some("quit"), "GPU {i}");
    }
    let status = node.status();
    assert!(status["gpus"].as_array().unwrap().iter().all(|g| g["compute_mode"] == "default" && g["mps"].is_null()));
}

const SWITCH: &str = r#"version: v1
mig-configs:
  mig:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
  mps:
    - devices: all
      mig-enabled: false
      mps: {replicas: 7}
"#;

fn switch_between_mig_and_mps_both_ways(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let cfg = node.config("switch.yaml", SWITCH);
    node.apply(&cfg, "mig");
    let u = uuids(&node);
    node.apply(&cfg, "mps");
    let s = node.status();
    for g in s["gpus"].as_array().unwrap() {
        assert_eq!(g["mig_mode"]["current"], false);
        assert!(g["instances"].as_array().unwrap().is_empty());
        assert_eq!(g["compute_mode"], "exclusive_process");
        assert_eq!(g["mps"]["up"], true);
        assert_eq!(g["mps"]["replicas"], 7);
    }
    assert_eq!(
        node.mps_commands(&u[0])[..2],
        [
            "set_default_active_thread_percentage 14".to_string(),
            format!("set_default_device_pinned_mem_limit {} 11702M", u[0])
        ]
    );
    node.apply(&cfg, "mig");
    let s = node.status();
    for (i, g) in s["gpus"].as_array().unwrap().iter().enumerate() {
        assert_eq!(g["mig_mode"]["current"], true);
        assert_eq!(g["instances"].as_array().unwrap().len(), 2);
        assert_eq!(g["compute_mode"], "default");
        assert!(g["mps"].is_null());
        assert_eq!(node.mps_pid(&u[i]), None);
    }
}

fn refusals_change_nothing(b: Backend) {
    let node = Node::with(b, "P100-PCIE-16GB:1,T4-16GB:1");
    let cases = [
        (
            "mps: {replicas: 20}",
            "GPU 0 (P100-PCIE-16GB): config 'c', entry 0, key 'mps.replicas': 20 replicas exceed the 16 clients",
        ),
        (
            "mps: {replicas: 4, active-thread-percentage: 25}",
            "key 'mps.active-thread-percentage': P100-PCIE-16GB (compute capability 6.0) is older than Volta",
        ),
    ];
    for (block, want) in cases {
        let text =
            format!("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n      {block}\n");
        let cfg = node.config("bad.yaml", &text);
        let out = node.apply_result(&cfg, "c").failed();
        assert!(out.all().contains(want), "{block}: {}", out.all());
        node.run(&["validate", "-f", &cfg, "--gpu", "P100-PCIE-16GB"]).failed();
        assert!(node.status()["gpus"].as_array().unwrap().iter().all(|g| g["mps"].is_null()), "no daemon started");
    }
    let big = "version: v1\nmig-configs:\n  c:\n    - devices: [1]\n      mig-enabled: false\n      mps: {replicas: 2, pinned-memory-limit: 16G}\n";
    let cfg = node.config("big.yaml", big);
    let out = node.apply_result(&cfg, "c").failed();
    assert!(
        out.all().contains("key 'mps.pinned-memory-limit': 16384M exceeds the 15360M of memory of T4-16GB"),
        "{}",
        out.all()
    );
    let on_mig = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n      mps: {replicas: 2}\n";
    let cfg = node.config("mig.yaml", on_mig);
    let out = node.run(&["validate", "-f", &cfg]).failed();
    assert!(
        out.all().contains("config 'c', entry 0, key 'mps': MPS is configured on an entry with 'mig-enabled: true'"),
        "{}",
        out.all()
    );
    // A pre-Volta GPU runs a daemon without limits.
    let plain =
        "version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: false\n      mps: {replicas: 16}\n";
    let cfg = node.config("plain.yaml", plain);
    node.apply(&cfg, "c");
    let u = uuids(&node);
    assert!(node.mps_commands(&u[0]).iter().all(|c| !c.starts_with("set_")), "{:?}", node.mps_commands(&u[0]));
    assert_eq!(node.status()["gpus"][0]["mps"]["replicas"], 16);
}

/// The clients' /dev/shm is a tmpfs of `--mps-shm-size`, mounted at start and unmounted at stop
/// (where this process may not mount, the agent says so and uses a plain directory).
#[test]
fn shm_is_a_sized_tmpfs_while_the_daemon_runs() {
    let node = Node::new("T4-16GB:1");
    let text = "version: v1\nmig-configs:\n  on:\n    - devices: all\n      mig-enabled: false\n      mps: {replicas: 2}\n  off:\n    - devices: all\n      mig-enabled: false\n";
    let cfg2 = node.config("t4.yaml", text);
    let out = node.run_env(&["apply", "-f", &cfg2, "-c", "on"], &[("GPUPART_MPS_SHM_SIZE", "64M")]).ok();
    let shm = node.mps_dir(&uuids(&node)[0]).join("shm");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts.lines().find(|l| l.split_whitespace().nth(1) == Some(shm.to_str().unwrap()));
    match line {
        Some(l) => assert!(l.starts_with("tmpfs ") && l.contains("size=65536k"), "{l}"),
        None => assert!(out.stderr.contains("clients get a plain directory as /dev/shm"), "{}", out.stderr),
    }
    node.apply(&cfg2, "off");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(shm.to_str().unwrap()), "unmounted after the daemon stopped");
}

#[test]
fn the_mps_example_validates_and_applies() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mps.yaml");
    let node = Node::new("A100-SXM4-80GB:2,V100-SXM2-32GB:2");
    node.run(&["validate", "-f", path, "--gpu", "A100-SXM4-80GB:2,V100-SXM2-32GB:2", "--strict"]).ok();
    for layout in ["mixed-mig-mps", "all-mps-8", "all-whole"] {
        node.apply(path, layout);
    }
    assert!(node.status()["gpus"].as_array().unwrap().iter().all(|g| g["mps"].is_null()));
}

/// A control program that cannot run fails the GPU clearly and leaves its compute mode DEFAULT.
#[test]
fn missing_control_program_fails_clearly_and_restores_compute_mode() {
    let node = Node::new("T4-16GB:1");
    let text =
        "version: v1\nmig-configs:\n  on:\n    - devices: all\n      mig-enabled: false\n      mps: {replicas: 2}\n";
    let cfg = node.config("t4.yaml", text);
    let mut c =
        node.command(&["--mps-control", "/nonexistent/nvidia-cuda-mps-control", "apply", "-f", &cfg, "-c", "on"], &[]);
    let out = support::Run::from(c.output().unwrap()).failed();
    assert!(out.all().contains("MPS FAILED: cannot run /nonexistent/nvidia-cuda-mps-control"), "{}", out.all());
    assert_eq!(node.status()["gpus"][0]["compute_mode"], "default");
}

fn export_carries_the_daemons_and_assert_compares_them(b: Backend) {
    let node = Node::with(b, "V100-SXM2-32GB:2,T4-16GB:2");
    let cfg = node.config("mps.yaml", MIXED);
    node.apply(&cfg, "mps");
    node.run(&["assert", "-f", &cfg, "-c", "mps"]).ok();
    // A layout without the daemons (or with other settings) is not "currently applied".
    let r = node.run(&["assert", "-f", &cfg, "-c", "none"]).failed();
    assert!(r.stderr.contains("GPU 0 (V100-SXM2-32GB): an MPS daemon (pid"), "{}", r.stderr);
    let r = node.run(&["assert", "-f", &cfg, "-c", "mps-changed"]).failed();
    assert!(r.stderr.contains("GPU 0 (V100-SXM2-32GB): the MPS daemon (pid"), "{}", r.stderr);
    // Export writes each daemon's settings; applying the export keeps every daemon.
    let pids: Vec<_> = uuids(&node).iter().map(|u| node.mps_pid(u)).collect();
    let exported = node.run(&["export"]).ok().stdout;
    assert!(exported.contains("      mps:\n        replicas: 4\n        active-thread-percentage: 25\n        pinned-memory-limit: 7168M\n"), "{exported}");
    assert_eq!(exported.matches("mps:").count(), 4, "{exported}");
    let back = node.config("exported.yaml", &exported);
    node.run(&["assert", "-f", &back, "-c", "current"]).ok();
    let again = node.apply(&back, "current");
    assert!(!again.stdout.contains("stop the daemon") && !again.stdout.contains("restart"), "{}", again.stdout);
    let after: Vec<_> = uuids(&node).iter().map(|u| node.mps_pid(u)).collect();
    assert_eq!(after, pids, "export-then-apply kept every daemon");
    let json: serde_json::Value = serde_json::from_str(&node.run(&["export", "-o", "json"]).ok().stdout).unwrap();
    assert_eq!(json["mig-configs"]["current"][0]["mps"]["replicas"], 4, "{json}");
    // Once the daemons are stopped, export and assert see none.
    node.apply(&cfg, "none");
    assert!(!node.run(&["export"]).ok().stdout.contains("mps:"));
    node.run(&["assert", "-f", &cfg, "-c", "none"]).ok();
    let r = node.run(&["assert", "-f", &cfg, "-c", "mps"]).failed();
    assert!(r.stderr.contains("no MPS daemon runs, want one with 4 slots"), "{}", r.stderr);
}
