//! The simulator can never stand in for real GPUs by accident: NVML and the simulator asked for
//! at once is an error naming both (flags or leftover environment), and every simulated run says
//! so (stderr, `apply`'s summary, `"simulated": true` in JSON, the agent's metrics and state).

#[macro_use]
mod support;

use support::baremetal::start;
use support::{example_config, fake_nvml, gpupart, http_get, Backend, Node};

#[test]
fn a_leftover_sim_state_variable_with_nvml_is_refused_naming_both() {
    let node = Node::new("A100-SXM4-80GB:2");
    let (lib, _) = fake_nvml();
    let state = node.state.to_str().unwrap();
    let r = gpupart(&["--nvml-lib", lib.to_str().unwrap(), "status"], &[("GPUPART_SIM_STATE", state)]).failed();
    assert!(r.stderr.contains("--nvml-lib"), "{}", r.stderr);
    assert!(r.stderr.contains(&format!("GPUPART_SIM_STATE={state}")), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "nothing read: {}", r.stdout);
}

#[test]
fn simulate_with_a_missing_nvml_library_is_refused_naming_both() {
    let r = gpupart(&["--simulate", "A100-SXM4-80GB:2", "--nvml-lib", "/nonexistent.so", "status"], &[]).failed();
    assert!(r.stderr.contains("--nvml-lib") && r.stderr.contains("--simulate"), "{}", r.stderr);
    // After the verb too, and for apply.
    let cfg = example_config();
    let r = gpupart(
        &["apply", "-f", &cfg, "-c", "all-balanced", "--simulate", "A100-SXM4-80GB:2", "--nvidia-smi", "/x"],
        &[],
    )
    .failed();
    assert!(r.stderr.contains("--nvidia-smi") && r.stderr.contains("--simulate"), "{}", r.stderr);
    assert!(!r.stdout.contains("applied successfully"), "{}", r.stdout);
}

#[test]
fn every_simulated_run_says_so_and_a_real_one_does_not() {
    for b in [Backend::Sim, Backend::Nvml] {
        let node = Node::with(b, "A100-SXM4-80GB:1");
        let simulated = b == Backend::Sim;
        let applied = node.apply(&example_config(), "all-balanced");
        assert_eq!(applied.stdout.contains("simulated GPUs, no real GPU changed"), simulated, "{}", applied.stdout);
        assert_eq!(applied.stderr.contains("simulated GPUs"), simulated, "{b:?}: {}", applied.stderr);
        assert_eq!(node.status()["simulated"], simulated, "{b:?}");
        let frag: serde_json::Value = serde_json::from_str(&node.run(&["frag", "-o", "json"]).ok().stdout).unwrap();
        assert_eq!(frag["simulated"], simulated, "{b:?}");
    }
}

#[test]
fn the_agent_marks_its_metrics_and_state_when_simulated() {
    let node = Node::new("A100-SXM4-80GB:1");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms"]);
    let st = agent.wait_for("success", "all-balanced");
    assert_eq!(st["simulated"], true, "{st}");
    let m = http_get(agent.port, "/metrics");
    assert!(m.contains(r#"gpupart_build_info{version="0.1.0",simulated="true"} 1"#), "{m}");
}

#[test]
fn status_and_apply_on_a_node_without_gpus_say_so() {
    let node = Node::new("A100-SXM4-80GB:1");
    let mut s = node.load();
    s.gpus.clear();
    node.save(&s);
    let r = node.run(&["status"]).ok();
    assert!(r.stdout.contains("no GPUs found"), "{}", r.stdout);
    let r = node.apply_result(&example_config(), "all-balanced").failed();
    assert!(r.all().contains("no GPUs"), "{}", r.all());
}
