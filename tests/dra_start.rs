//! What `gpupart agent --dra` checks before it serves the kubelet: the kubelet's directories
//! (they must exist and be directories), the plugin's own folder (one plugin per driver and
//! directories), and what it does when the kubelet's sockets cannot be served later (not ready,
//! nothing left behind at SIGTERM).

mod support;

use std::time::{Duration, Instant};
use support::dra_rig::DraRig;

/// A rig whose own plugin was stopped and whose slices were removed, for a plugin of a test's own.
fn stopped_rig() -> DraRig {
    DraRig::stopped("A100-SXM4-80GB:1", &[], |_| {})
}

#[test]
fn unusable_kubelet_directories_stop_the_plugin_at_start_naming_them() {
    let rig = stopped_rig();
    let file = rig.path("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let missing = rig.path("kubelet-elsewhere/plugins_registry");
    let (file, missing) = (file.to_str().unwrap().to_string(), missing.to_str().unwrap().to_string());
    for (flag, value, says) in [
        ("--kubelet-registry-dir", &file, format!("--kubelet-registry-dir {file}: not a directory")),
        ("--kubelet-plugins-dir", &file, format!("--kubelet-plugins-dir {file}: not a directory")),
        (
            "--kubelet-registry-dir",
            &missing,
            format!("--kubelet-registry-dir {missing}: no such directory; the kubelet makes it under its --root-dir"),
        ),
    ] {
        let (code, log) = rig.try_start(&[(flag, value)], 30);
        assert_eq!(code, Some(1), "{flag} {value}: {log}");
        assert!(log.contains(&says), "{flag} {value}: {log}");
        assert!(!std::path::Path::new(&missing).exists(), "a missing kubelet directory was made");
        assert!(rig.slices().is_empty(), "{flag} {value}: slices were published");
    }
    // Nothing of the plugin is left in the kubelet's directories.
    assert!(!rig.path("plugins/gpu.gpupart.io").exists(), "the plugin's folder left behind");
    assert!(!rig.path("plugins_registry/gpu.gpupart.io-reg.sock").exists());
    // The registration socket cannot be made (a directory is in its place) after the service
    // socket was: the service socket and the plugin's folder are removed again.
    std::fs::create_dir_all(rig.path("plugins_registry/gpu.gpupart.io-reg.sock/x")).unwrap();
    let (code, log) = rig.try_start(&[], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("--kubelet-registry-dir: cannot serve"), "{log}");
    assert!(!rig.path("plugins/gpu.gpupart.io").exists(), "the plugin's folder left behind");
    assert!(rig.slices().is_empty(), "slices were published");
}

#[test]
fn a_second_plugin_on_the_same_directories_is_refused_whatever_its_lock_file() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    let svc = rig.path("plugins/gpu.gpupart.io/dra.sock");
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&svc).unwrap());
    let other_lock = rig.path("other.lock");
    let (code, log) = rig.try_start(&[("--lock-file", other_lock.to_str().unwrap())], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("another DRA plugin (pid") && log.contains("serves driver gpu.gpupart.io"), "{log}");
    // The first plugin's sockets were not touched.
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&svc).unwrap()), inode);
}

#[test]
fn a_plugin_that_cannot_serve_the_kubelet_is_not_ready_and_leaves_nothing_behind() {
    let rig = DraRig::start_with("A100-SXM4-80GB:1", &[], &[("RUST_LOG", "info")]);
    rig.kubelet.wait_registered(1);
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", rig.stderr());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("ready", &|| rig.get("/readyz").starts_with("HTTP/1.1 200"));
    // The registry directory turns into a file (a hand, or a kubelet's root moved): the
    // registration socket cannot be served again.
    let registry = rig.path("plugins_registry");
    std::fs::remove_dir_all(&registry).unwrap();
    std::fs::write(&registry, "").unwrap();
    wait("not ready", &|| rig.get("/readyz").starts_with("HTTP/1.1 503"));
    let svc = rig.path("plugins/gpu.gpupart.io/dra.sock");
    wait("the service socket served again", &|| svc.exists());
    // It keeps retrying every half second, and says so once, not at every try.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(rig.stderr().matches("cannot listen for the kubelet").count(), 1, "{}", rig.stderr());
    // The registry back: served again, ready again, said once.
    std::fs::remove_file(&registry).unwrap();
    std::fs::create_dir(&registry).unwrap();
    wait("ready again", &|| rig.get("/readyz").starts_with("HTTP/1.1 200"));
    assert!(rig.stderr().contains("listening for the kubelet again"), "{}", rig.stderr());
    // SIGTERM after a second failure: the plugin stops and removes the service socket it still had.
    std::fs::remove_dir_all(&registry).unwrap();
    std::fs::write(&registry, "").unwrap();
    wait("not ready again", &|| rig.get("/readyz").starts_with("HTTP/1.1 503"));
    let pid = rig.agent.lock().unwrap().as_ref().map(|a| a.0.id()).unwrap();
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    wait("the service socket removed", &|| !svc.exists());
}

#[test]
fn a_missing_or_unreadable_mig_minors_file_stops_the_plugin_at_start_naming_it() {
    let rig = stopped_rig();
    let empty = rig.path("empty-minors");
    std::fs::write(&empty, "").unwrap();
    let garbage = rig.path("garbage-minors");
    std::fs::write(&garbage, "gpu0 access\nnot a minors file\n").unwrap();
    // GPUs seen through NVML (the fake libnvidia-ml), whose driver writes the file.
    let missing = rig.path("no-such-minors");
    for (file, says) in [
        (&missing, "No such file or directory"),
        (&empty, "no `gpu<N>/gi<M>/access <minor>` line for GPU minor 0"),
        (&garbage, "no `gpu<N>/gi<M>/access <minor>` line for GPU minor 0"),
    ] {
        let (code, log) = rig.try_start(&[("--nvidia-caps-minors", file.to_str().unwrap())], 30);
        assert_eq!(code, Some(1), "{}: {log}", file.display());
        assert!(log.contains(&format!("--nvidia-caps-minors {}", file.display())) && log.contains(says), "{log}");
        assert!(rig.slices().is_empty(), "slices were published");
    }
}

#[test]
fn a_prepare_that_finds_no_minor_for_its_instance_names_the_minors_file() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.kill();
    // GPU 0 is listed (the start's check passes), but not the instance a claim gets.
    let file = rig.path("mig-minors");
    std::fs::write(&file, "config 1\nmonitor 2\ngpu0/gi14/access 500\n").unwrap();
    rig.launch();
    rig.kubelet.wait_registered(2);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("a", "3g.40gb");
    rig.schedule("a").unwrap();
    let e = rig.prepare("a").expect_err("no minor for its instance");
    assert!(e.contains("no capability minor for the GPU instance"), "{e}");
    assert!(e.contains(&format!("in {} (--nvidia-caps-minors)", file.display())), "{e}");
}

#[test]
fn simulated_gpus_without_a_minors_file_get_simulated_minors_and_mig_claims_prepare() {
    let rig = DraRig::start_on(support::Backend::Sim, "A100-SXM4-80GB:1", &[], &[], |_| {});
    rig.kubelet.wait_registered(1);
    rig.kill();
    std::fs::remove_file(rig.path("mig-minors")).unwrap();
    rig.launch();
    rig.kubelet.wait_registered(2);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("a", "3g.40gb");
    rig.schedule("a").unwrap();
    let prepared = rig.prepare("a").expect("prepared with simulated minors");
    assert!(!prepared.is_empty());
    let cdi = std::fs::read_dir(rig.path("cdi")).unwrap().filter_map(Result::ok).next().expect("a CDI spec");
    let spec = std::fs::read_to_string(cdi.path()).unwrap();
    assert!(spec.contains("/dev/nvidia-caps/nvidia-cap"), "{spec}");
    assert!(rig.path("dra-state/simulated-mig-minors").exists());
}

#[test]
fn a_node_that_does_not_exist_stops_the_plugin_at_start_and_nothing_is_written() {
    let rig = stopped_rig();
    let before = rig.api.request_count();
    let (code, log) = rig.try_start(&[("--node-name", "ghost")], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("node ghost does not exist"), "{log}");
    assert_eq!(log.matches("node ghost does not exist").count(), 1, "said once: {log}");
    let writes = rig.api.writes_since(before);
    assert!(writes.is_empty(), "written for a node that does not exist: {writes:?}");
}

#[test]
fn an_api_server_that_does_not_answer_at_start_is_waited_for_naming_it() {
    let rig = stopped_rig();
    rig.api.go_down();
    let (code, log) = rig.try_start(&[], 5);
    assert_eq!(code, None, "it waits for the API server instead of exiting: {log}");
    assert!(log.contains("the Kubernetes API does not answer; retrying"), "{log}");
    assert!(log.contains("https://127.0.0.1:") || log.contains("http://127.0.0.1:"), "names the server: {log}");
}

#[test]
fn unusable_cdi_and_state_folders_stop_the_plugin_at_start_saying_so_once() {
    let rig = stopped_rig();
    let file = rig.path("a-file");
    std::fs::write(&file, "").unwrap();
    let f = file.to_str().unwrap();
    for flag in ["--cdi-dir", "--dra-state-dir"] {
        let (code, log) = rig.try_start(&[(flag, f)], 30);
        assert_eq!(code, Some(1), "{flag}: {log}");
        let error = log.lines().find(|l| l.starts_with("Error") || l.starts_with("error")).unwrap_or_default();
        assert!(error.contains(&format!("{flag} {f}")), "{flag}: {log}");
        // The OS's words once, not twice.
        let os = ["Not a directory", "File exists"].iter().map(|w| error.matches(w).count()).sum::<usize>();
        assert_eq!(os, 1, "{flag}: {error}");
        assert!(rig.slices().is_empty(), "slices were published");
    }
}

#[test]
fn the_plugin_exports_only_metrics_that_mean_something_in_dra_mode() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.wait_slices("the pool", |s| !s.is_empty());
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let m = rig.get("/metrics");
        if m.contains("gpupart_dra_published_devices") {
            break m;
        }
        assert!(Instant::now() < deadline, "{m}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The label agent's state machine and PodResources are not the plugin's: none of it.
    for absent in [
        "gpupart_agent_state",
        "gpupart_agent_attempts",
        "gpupart_agent_failures",
        "gpupart_agent_last_success",
        "gpupart_pod_resources_up",
    ] {
        assert!(!metrics.contains(absent), "{absent} exported in DRA mode:\n{metrics}");
    }
    for present in ["gpupart_build_info", "gpupart_gpu_info", "gpupart_node_unallocated_gpus", "gpupart_gpu_healthy"] {
        assert!(metrics.contains(present), "{present} missing:\n{metrics}");
    }
}

#[test]
fn a_plugin_not_allowed_to_read_its_node_says_so_at_start() {
    let rig = stopped_rig();
    rig.api.change(|s| s.fail.push(("GET".into(), "/api/v1/nodes/".into(), 403)));
    let (code, log) = rig.try_start(&[], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("refuses to let the plugin read Node") && log.contains("ClusterRole"), "{log}");
}
