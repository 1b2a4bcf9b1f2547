//! Failure paths on both backends: an injected NVML error at each mutating call site, and a
//! SIGKILL at many points of a slow apply. Each failure must give a clear message and a non-zero
//! exit, leave a consistent device state, and a rerun without the fault must converge.

#[macro_use]
mod support;

use std::time::{Duration, Instant};
use support::{example_config, Backend, Node};

on_both_backends!(
    each_mutating_call_site_fails_cleanly_and_reruns_converge,
    sigkill_mid_apply_then_rerun_converges,
    ctrl_c_mid_apply_finishes_the_change_under_way_and_says_what_was_done,
);

/// Checks the state file loads (it is validated on load) and has no GPU instance without CIs.
fn consistent(node: &Node) -> usize {
    let s = node.load();
    s.gpus.iter().flat_map(|g| &g.gpu_instances).filter(|gi| gi.compute_instances.is_empty()).count()
}

fn each_mutating_call_site_fails_cleanly_and_reruns_converge(b: Backend) {
    let cfg = example_config();
    // MIG mode change on a fresh node.
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let [(var, spec)] = node.fail_env("nvmlDeviceSetMigMode:2:NVML_ERROR_UNKNOWN");
    let r = node.run_env(&["apply", "-f", &cfg, "-c", "all-balanced"], &[(var, &spec)]).failed();
    assert!(r.all().contains("nvmlDeviceSetMigMode failed with NVML_ERROR_UNKNOWN (999)"), "{}", r.all());
    node.apply(&cfg, "all-balanced");
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();

    // Every instance operation of a reconfiguration that destroys and creates.
    for (function, code, name) in [
        ("nvmlComputeInstanceDestroy", "19", "NVML_ERROR_IN_USE"),
        ("nvmlGpuInstanceDestroy", "NVML_ERROR_IN_USE", "NVML_ERROR_IN_USE"),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", "23", "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        ("nvmlGpuInstanceCreateComputeInstanceWithPlacement", "NVML_ERROR_UNKNOWN", "NVML_ERROR_UNKNOWN"),
    ] {
        let node = Node::with(b, "A100-SXM4-80GB:2");
        node.apply(&cfg, "all-1g.10gb");
        let [(var, spec)] = node.fail_env(&format!("{function}:1:{code}"));
        let r = node.run_env(&["apply", "-f", &cfg, "-c", "mixed-3g-2g"], &[(var, &spec)]).failed();
        let text = r.all();
        assert!(text.contains(&format!("{function} failed with {name}")), "{function}: {text}");
        assert!(text.contains("FAILED"), "{function}: {text}");
        if function.contains("Create") {
            assert_eq!(consistent(&node), 0, "{function}: a half-created GPU instance was left");
        } else if function == "nvmlGpuInstanceDestroy" {
            // Its CI is already gone; the report says so and the rerun removes the empty GI.
            assert!(text.contains("destroyed compute instance 0 of GPU instance"), "{text}");
        }
        node.apply(&cfg, "mixed-3g-2g");
        node.run(&["assert", "-f", &cfg, "-c", "mixed-3g-2g"]).ok();
        assert_eq!(consistent(&node), 0);
    }
}

fn sigkill_mid_apply_then_rerun_converges(b: Backend) {
    let cfg = example_config();
    // Timing of a full, slow apply (50 ms per NVML change, one GPU at a time).
    let probe = Node::with(b, "A100-SXM4-80GB:2");
    probe.apply(&cfg, "all-1g.10gb");
    let t = Instant::now();
    probe.run_env(&["apply", "-f", &cfg, "-c", "mixed-3g-2g", "--parallel", "1"], &[(probe.delay_var(), "50")]).ok();
    let total = t.elapsed();
    let points = 8;
    let mut converged = 0;
    let mut intermediate = 0;
    for k in 1..=points {
        let node = Node::with(b, "A100-SXM4-80GB:2");
        node.apply(&cfg, "all-1g.10gb");
        let mut child = node
            .command(&["apply", "-f", &cfg, "-c", "mixed-3g-2g", "--parallel", "1"], &[(node.delay_var(), "50")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(total.mul_f64(k as f64 / (points + 1) as f64));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let after_kill = node.load(); // the state file is whole and valid
        let shape: Vec<usize> = after_kill.gpus.iter().map(|g| g.gpu_instances.len()).collect();
        if shape != [7, 7] && shape != [3, 3] {
            intermediate += 1;
        }
        node.apply(&cfg, "mixed-3g-2g");
        node.run(&["assert", "-f", &cfg, "-c", "mixed-3g-2g"]).ok();
        let s = node.load();
        for g in &s.gpus {
            assert_eq!(g.gpu_instances.len(), 3, "kill point {k}: leaked or missing instances: {:?}", g.gpu_instances);
            assert!(g.gpu_instances.iter().all(|gi| gi.compute_instances.len() == 1), "kill point {k}");
        }
        converged += 1;
    }
    assert_eq!(converged, points);
    println!("{b:?}: {points} kill points over {total:?}, {intermediate} left the node mid-change, all converged");
    assert!(intermediate * 2 >= points, "only {intermediate} of {points} kills landed mid-apply");
    assert!(total > Duration::from_millis(500), "the slow apply took {total:?}");
}

fn ctrl_c_mid_apply_finishes_the_change_under_way_and_says_what_was_done(b: Backend) {
    let cfg = example_config();
    let node = Node::with(b, "A100-SXM4-80GB:4");
    let delay = node.delay_var();
    // 16 changes of 50 ms per GPU, two GPUs at a time: about 1.6 s in all.
    let child = node
        .command(&["apply", "-f", &cfg, "-c", "all-1g.10gb", "--parallel", "2"], &[(delay, "50")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let killed = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted by SIGINT: "), "{stderr}");
    // A progress line as each GPU ends.
    assert!(stderr.contains("finished=1 of=4"), "{stderr}");
    assert!(stdout.contains("interrupted part-way: the changes listed were made"), "{stdout}");
    assert!(stdout.contains("interrupted before its changes began: nothing was changed"), "{stdout}");
    // The change under way finished: no GPU instance without its compute instance.
    assert_eq!(consistent(&node), 0);
    let untouched = node.load().gpus.iter().filter(|g| g.gpu_instances.is_empty()).count();
    assert!(untouched >= 1, "a GPU not begun stays as it was");
    node.apply(&cfg, "all-1g.10gb");
    node.run(&["assert", "-f", &cfg, "-c", "all-1g.10gb"]).ok();
}
