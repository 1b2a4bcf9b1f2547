//! `gpupart agent --dra` shares GPUs without MIG through MPS: one published MPS device per GPU
//! that several claims are allocated (consumable capacity), each holding its client to its memory
//! share; the scheduler hands a GPU out whole or as shares, never both. The real binary on fake
//! NVML, the fake MPS control program, the DRA kubelet stand-in (real gRPC over unix sockets), the
//! allocator stand-in with the published allocator's consumable-capacity rules, and the shipped
//! DeviceClasses.

mod support;

use std::path::PathBuf;
use support::dra_rig::DraRig;

/// The environment the CDI spec of claim `uid` gives its container.
fn cdi_env(rig: &DraRig, uid: &str) -> Vec<String> {
    let path = rig.path("cdi").join(gpupart::dra::cdi::file_name(uid));
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// The pid file of the MPS daemon of the rig's first GPU.
fn daemon_pid_file(rig: &DraRig) -> PathBuf {
    let uuid = rig.node.load().gpus[0].uuid.clone();
    rig.node.mps_root().join(uuid).join("pipe").join("nvidia-cuda-mps-control.pid")
}

/// Daemons running under the node's MPS root.
fn daemons(rig: &DraRig) -> usize {
    let Ok(dirs) = std::fs::read_dir(rig.node.mps_root()) else { return 0 };
    dirs.filter_map(Result::ok).filter(|d| d.path().join("pipe").join("nvidia-cuda-mps-control.pid").exists()).count()
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("timed out waiting until {what}");
}

#[test]
fn four_4gib_shares_of_a_16gib_gpu_run_on_one_daemon_and_a_fifth_or_a_whole_gpu_is_refused() {
    let rig = DraRig::start("V100-SXM2-16GB:1");
    rig.kubelet.wait_registered(1);
    let slices = rig.wait_slices("the GPU published whole and as MPS shares", |s| {
        s.iter().flat_map(|(_, s)| &s.devices).any(|d| d.name == "gpu-0-mps")
    });
    let mps = slices.iter().flat_map(|(_, s)| &s.devices).find(|d| d.name == "gpu-0-mps").unwrap().clone();
    assert_eq!(mps.allow_multiple_allocations, Some(true));
    assert_eq!(mps.attributes["sharing"].text().as_deref(), Some("mps"));
    assert_eq!(mps.capacity["memory"].as_u64(), Some(16384 << 20));
    assert_eq!(mps.capacity["clients"].as_u64(), Some(48), "Volta: 48 clients per MPS server");
    let whole = slices.iter().flat_map(|(_, s)| &s.devices).find(|d| d.name == "gpu-0").unwrap().clone();
    assert_eq!(whole.attributes["sharing"].text().as_deref(), Some("none"));
    assert_eq!(whole.consumes_counters, mps.consumes_counters, "both take the GPU's whole counter set");

    let uuid = rig.node.load().gpus[0].uuid.clone();
    let mut shares = Vec::new();
    for i in 0..4 {
        let name = format!("share-{i}");
        let uid = rig.mps_claim(&name, "4Gi");
        let got = rig.schedule(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got[0].device, "gpu-0-mps");
        assert_eq!(got[0].consumed["memory"], 4 << 30);
        assert_eq!(got[0].consumed["clients"], 1);
        shares.push(got[0].share_id.clone().expect("a share id"));
        let prepared = rig.prepare(&name).unwrap_or_else(|e| panic!("{name}: {e}\n{}", rig.stderr()));
        assert_eq!(prepared[0].0, "gpu-0-mps");
        let env = cdi_env(&rig, &uid);
        let pipe = rig.node.mps_root().join(&uuid).join("pipe");
        for want in [
            format!("NVIDIA_VISIBLE_DEVICES={uuid}"),
            format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()),
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=4096M"),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string(),
        ] {
            assert!(env.contains(&want), "{want} not in {env:?}");
        }
        assert_eq!(daemons(&rig), 1, "one daemon for the GPU's shares");
    }
    shares.sort();
    shares.dedup();
    assert_eq!(shares.len(), 4, "each share has its own id");
    // The GPU's memory is spoken for: the scheduler refuses a fifth share and the whole GPU.
    rig.mps_claim("share-4", "4Gi");
    assert!(rig.schedule("share-4").is_err(), "a fifth 4 GiB share does not fit 16 GiB");
    rig.claim("whole", &[("gpu", "gpu.gpupart.io", "", 1)]);
    assert!(rig.schedule("whole").is_err(), "the GPU is shared: not handed out whole");
    // The last share gone, the daemon stops and the GPU goes whole.
    for i in 0..4 {
        let name = format!("share-{i}");
        assert_eq!(rig.unprepare(&name), "", "{name}");
        rig.delete_claim(&name);
        if i < 3 {
            assert!(daemon_pid_file(&rig).exists(), "the daemon stays while shares remain");
        }
    }
    wait("the daemon stopped", || daemons(&rig) == 0);
    rig.delete_claim("share-4");
    let got = rig.schedule("whole").expect("the whole GPU once its shares are gone");
    assert_eq!(got[0].device, "gpu-0");
    assert!(got[0].share_id.is_none());
    rig.prepare("whole").expect("prepared whole");
    rig.mps_claim("late", "1Gi");
    assert!(rig.schedule("late").is_err(), "no share beside a whole claim");
}

#[test]
fn a_t4_takes_three_4gib_shares_and_a_claim_naming_no_memory_takes_the_default() {
    let rig = DraRig::start("T4-16GB:1");
    rig.kubelet.wait_registered(1);
    for i in 0..3 {
        let name = format!("s{i}");
        rig.mps_claim(&name, "4Gi");
        rig.schedule(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // NVML shows a T4 with 15360 MiB: a fourth 4 GiB share does not fit, a default one (1 GiB) does.
    rig.mps_claim("s3", "4Gi");
    assert!(rig.schedule("s3").is_err());
    let uid = rig.mps_claim("small", "");
    let got = rig.schedule("small").expect("the default share fits");
    assert_eq!(got[0].consumed["memory"], 1 << 30);
    rig.prepare("small").unwrap_or_else(|e| panic!("{e}\n{}", rig.stderr()));
    let env = cdi_env(&rig, &uid);
    assert!(env.iter().any(|e| e.ends_with("=1024M") && e.starts_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=")), "{env:?}");
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10".to_string()),
        "1 GiB of 15 GiB: the 10 % floor; {env:?}"
    );
    // A request is rounded up to the 256 MiB step.
    rig.mps_claim("odd", "1000Mi");
    let got = rig.schedule("odd").expect("fits");
    assert_eq!(got[0].consumed["memory"], 1 << 30, "1000 MiB rounded up to 1024 MiB");
}

#[test]
fn a_share_is_held_to_its_config_in_either_shape_and_a_bad_config_names_its_field() {
    let rig = DraRig::start("V100-SXM2-16GB:1");
    rig.kubelet.wait_registered(1);
    // Bad configs first: each refused, naming the field, and no daemon is started.
    for (name, params, field) in [
        (
            "bad-pct",
            serde_json::json!({"apiVersion": "gpu.gpupart.io/v1alpha1", "kind": "MpsShareConfig", "activeThreadPercentage": 150}),
            "activeThreadPercentage",
        ),
        (
            "bad-limit",
            serde_json::json!({"apiVersion": "gpu.gpupart.io/v1alpha1", "kind": "MpsShareConfig", "pinnedMemoryLimit": "8Gi"}),
            "exceeds",
        ),
        (
            "bad-strategy",
            serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}),
            "sharing.strategy",
        ),
    ] {
        rig.mps_claim(name, "4Gi");
        rig.configure(name, params);
        rig.schedule(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = rig.prepare(name).expect_err(name);
        assert!(e.contains(field) && e.contains(name), "{name}: {e}");
        assert_eq!(daemons(&rig), 0, "{name}: nothing started");
        rig.delete_claim(name);
    }
    let uuid = rig.node.load().gpus[0].uuid.clone();
    let ours = rig.mps_claim("ours", "4Gi");
    rig.configure(
        "ours",
        serde_json::json!({"apiVersion": "gpu.gpupart.io/v1alpha1", "kind": "MpsShareConfig",
                           "activeThreadPercentage": 40, "pinnedMemoryLimit": "2Gi"}),
    );
    rig.schedule("ours").unwrap();
    rig.prepare("ours").unwrap_or_else(|e| panic!("{e}\n{}", rig.stderr()));
    let env = cdi_env(&rig, &ours);
    assert!(env.contains(&format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=2048M")), "{env:?}");
    assert!(env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40".to_string()), "{env:?}");
    let nvidia = rig.mps_claim("nvidia", "8Gi");
    rig.configure(
        "nvidia",
        serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 70}}}),
    );
    rig.schedule("nvidia").unwrap();
    rig.prepare("nvidia").unwrap();
    let env = cdi_env(&rig, &nvidia);
    assert!(env.contains(&format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=8192M")), "{env:?}");
    assert!(env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70".to_string()), "{env:?}");
}

#[test]
fn the_last_share_waits_for_its_clients_and_a_restart_or_a_dead_daemon_loses_no_share() {
    let rig = DraRig::start_with(
        "V100-SXM2-16GB:1",
        &["--resync-interval", "300ms", "--annotation-min-interval", "100ms"],
        &[("RUST_LOG", "gpupart=info")],
    );
    rig.kubelet.wait_registered(1);
    for name in ["a", "b"] {
        rig.mps_claim(name, "2Gi");
        rig.schedule(name).unwrap();
        rig.prepare(name).unwrap_or_else(|e| panic!("{e}\n{}", rig.stderr()));
    }
    // Counted as label mode counts MPS slots (the server's 48 clients, one a share), and in metrics.
    wait("the summary counts the shares", || {
        rig.api.state().annotations.get("gpupart.io/gpus").is_some_and(|g| g.contains(r#""slotsUsed":2"#))
    });
    wait("the metrics count the shares", || {
        let m = support::metrics_in_log(&rig.stderr());
        m.contains(r#"gpupart_dra_mps_shares{gpu="0"} 2"#)
            && m.contains(r#"gpupart_dra_mps_memory_bytes{gpu="0"} 4294967296"#)
            && m.contains(r#"gpupart_dra_mps_daemon_up{gpu="0"} 1"#)
    });
    let pid = || std::fs::read_to_string(daemon_pid_file(&rig)).ok().and_then(|t| t.trim().parse::<u32>().ok());
    let first = pid().expect("the daemon runs");
    // SIGKILL, then a new agent: the daemon is adopted (same pid), the shares are still there.
    rig.kill();
    rig.launch();
    rig.kubelet.wait_registered(2);
    assert_eq!(pid(), Some(first), "the running daemon is adopted, not restarted");
    let again = rig.prepare("a").expect("a repeated Prepare answers as before");
    assert_eq!(again[0].0, "gpu-0-mps");
    // The daemon dies: the agent starts it again for its shares.
    std::process::Command::new("kill").args(["-9", &first.to_string()]).status().unwrap();
    wait("a new daemon", || pid().is_some_and(|p| p != first && std::path::Path::new(&format!("/proc/{p}")).exists()));
    // A client of the GPU's daemon keeps the last share in place; another share goes at once.
    let clients = rig.node.mps_root().join(rig.node.load().gpus[0].uuid.clone()).join("pipe").join("fake-clients");
    std::fs::write(&clients, "4242\n").unwrap();
    assert_eq!(rig.unprepare("a"), "", "not the last share: it goes");
    let refused = rig.unprepare("b");
    assert!(refused.contains("4242") && refused.contains("in use"), "{refused}");
    assert!(pid().is_some(), "the daemon stays while its client runs");
    std::fs::remove_file(&clients).unwrap();
    assert_eq!(rig.unprepare("b"), "");
    wait("the daemon stopped", || daemons(&rig) == 0);
}

#[test]
fn a_mig_gpu_is_shared_through_mps_only_when_asked_and_only_while_no_mig_device_is_allocated() {
    // Without the flag: MIG-capable GPUs have no MPS device.
    let plain = DraRig::start("A100-SXM4-80GB:1");
    plain.kubelet.wait_registered(1);
    let slices = plain.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    assert!(!slices.iter().flat_map(|(_, s)| &s.devices).any(|d| d.name == "gpu-0-mps"));
    drop(plain);

    let rig = DraRig::start_with("A100-SXM4-80GB:1", &["--dra-mps-on-mig-gpus"], &[]);
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the MPS device", |s| s.iter().flat_map(|(_, x)| &x.devices).any(|d| d.name == "gpu-0-mps"));
    assert!(rig.node.load().gpus[0].mig_mode.current, "MIG mode on while idle");
    rig.mps_claim("share", "8Gi");
    rig.schedule("share").expect("an idle MIG GPU takes a share");
    rig.prepare("share").unwrap_or_else(|e| panic!("{e}\n{}", rig.stderr()));
    assert!(!rig.node.load().gpus[0].mig_mode.current, "the first share turned MIG mode off");
    assert_eq!(daemons(&rig), 1);
    // While shared, the counters refuse every MIG device of the GPU.
    rig.mig_claim("small", "1g.10gb");
    assert!(rig.schedule("small").is_err(), "no MIG device beside MPS shares");
    assert_eq!(rig.unprepare("share"), "");
    rig.delete_claim("share");
    wait("the daemon stopped", || daemons(&rig) == 0);
    assert!(rig.node.load().gpus[0].mig_mode.current, "the last share turned MIG mode on again");
    rig.schedule("small").expect("MIG devices again once the shares are gone");
    rig.prepare("small").expect("prepared");
    rig.mps_claim("late", "1Gi");
    assert!(rig.schedule("late").is_err(), "no share beside a MIG device");
}

#[test]
fn a_share_that_fails_after_its_daemon_started_leaves_no_daemon_and_prepares_later() {
    let rig = DraRig::start("T4-16GB:1");
    rig.kubelet.wait_registered(1);
    rig.mps_claim("first", "2Gi");
    rig.schedule("first").unwrap();
    // The CDI directory cannot take the claim's spec: the daemon the share started goes again.
    let cdi = rig.path("cdi");
    let _ = std::fs::remove_dir_all(&cdi);
    std::fs::write(&cdi, "not a directory").unwrap();
    let e = rig.prepare("first").expect_err("the spec cannot be written");
    assert!(e.contains("CDI spec") && e.contains("ml/first"), "{e}");
    assert_eq!(daemons(&rig), 0, "rolled back: no daemon left");
    std::fs::remove_file(&cdi).unwrap();
    std::fs::create_dir_all(&cdi).unwrap();
    rig.prepare("first").unwrap_or_else(|e| panic!("{e}\n{}", rig.stderr()));
    assert_eq!(daemons(&rig), 1);
}
