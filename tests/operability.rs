//! What a new user meets (issue 14), each through the real binary as a user runs it: locks
//! that cannot share a file, SIGTERM honoured mid-change, `apply`/`validate` agreeing with
//! `assert`/`apply`, a closed stdout, a missing layout file, MIG-disabled GPUs without MIG
//! capacity, mig-parted's environment habits, one spelling per option, and JSON errors.

#[macro_use]
mod support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{example_config, gpupart, Node};

fn sim(dir: &std::path::Path, spec: &str) -> Vec<String> {
    let state = dir.join("node.json");
    vec!["--simulate".into(), spec.into(), "--sim-state".into(), state.display().to_string()]
}

fn run(base: &[String], args: &[&str], env: &[(&str, &str)]) -> support::Run {
    let mut all: Vec<&str> = base.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    gpupart(&all, env)
}

/// Runs an agent in its own process; stderr is kept for the assertions.
fn spawn_agent(base: &[String], args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpupart"));
    c.args(base).args(args).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

#[test]
fn an_agent_lock_on_the_simulators_lock_file_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("agent.json");
    let lock = dir.path().join("agent.lock");
    let layout = dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let cfg = example_config();
    let base: Vec<String> =
        ["--simulate", "A100-SXM4-80GB:4", "--sim-state", state.to_str().unwrap()].map(String::from).to_vec();
    let t = Instant::now();
    let out = run(
        &base,
        &[
            "agent",
            "--no-kube",
            "-f",
            &cfg,
            "--layout-file",
            layout.to_str().unwrap(),
            "--lock-file",
            lock.to_str().unwrap(),
        ],
        &[],
    )
    .failed();
    assert!(t.elapsed() < Duration::from_secs(5), "refused at start");
    assert!(out.stderr.contains("--lock-file") && out.stderr.contains("agent.lock"), "{}", out.stderr);
    assert!(out.stderr.contains("the simulator's lock"), "{}", out.stderr);
}

#[test]
fn sigterm_ends_the_agent_within_seconds_in_the_middle_of_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A100-SXM4-80GB:2");
    let layout = dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let lock = dir.path().join("a.lock");
    let cfg = example_config();
    let args = [
        "agent",
        "--no-kube",
        "-f",
        &cfg,
        "--layout-file",
        layout.to_str().unwrap(),
        "--lock-file",
        lock.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--parallel",
        "1",
    ];
    // Every GPU operation takes 5 s: a whole change takes over a minute.
    let mut agent = spawn_agent(&base, &args, &[("GPUPART_SIM_OP_DELAY_MS", "5000")]);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    let pid = agent.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "SIGTERM ignored for 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    let mut err = String::new();
    agent.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(took < Duration::from_secs(6), "took {took:?}\n{err}");
    assert!(err.contains("shutting down with a change under way"), "{err}");
}

#[test]
fn a_state_lock_held_elsewhere_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A30-24GB:1");
    run(&base, &["status"], &[]).ok();
    let lock = std::fs::File::create(dir.path().join("node.lock")).unwrap();
    lock.lock().unwrap();
    let t = Instant::now();
    let cfg = dir.path().join("a30.yaml");
    std::fs::write(&cfg, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.6gb\": 4}\n").unwrap();
    let out = run(&base, &["apply", "-f", cfg.to_str().unwrap(), "-c", "c"], &[]).failed();
    assert!(out.all().contains("node.lock") && out.all().contains("still locked"), "{}", out.all());
    assert!(t.elapsed() < Duration::from_secs(40), "bounded wait");
    drop(lock);
    run(&base, &["apply", "-f", cfg.to_str().unwrap(), "-c", "c"], &[]).ok();
}

#[test]
fn apply_refuses_a_config_that_selects_none_of_the_nodes_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A30-24GB:2");
    let before = run(&base, &["status", "-o", "json"], &[]).ok().stdout;
    let out = run(&base, &["apply", "-f", &example_config(), "-c", "all-1g.10gb"], &[]).failed();
    assert!(out.stderr.contains("has no entry for this node's GPUs (A30-24GB, A30-24GB)"), "{}", out.stderr);
    assert!(!out.all().contains("applied successfully"), "{}", out.all());
    run(&base, &["assert", "-f", &example_config(), "-c", "all-1g.10gb"], &[]).failed();
    assert_eq!(run(&base, &["status", "-o", "json"], &[]).ok().stdout, before, "nothing changed");
}

#[test]
fn validate_refuses_a_profile_no_known_gpu_has_unless_filtered_to_unknown_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"8g.80gb\": 1}\n").unwrap();
    let out = gpupart(&["validate", "-f", bad.to_str().unwrap()], &[]).failed();
    assert!(out.all().contains("no known GPU has 8g.80gb"), "{}", out.all());
    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(&unknown, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      device-filter: \"0xFFFF10DE\"\n      mig-enabled: true\n      mig-devices: {\"8g.80gb\": 1}\n").unwrap();
    let out = gpupart(&["validate", "-f", unknown.to_str().unwrap()], &[]).ok();
    assert!(out.stdout.contains("1 warning(s)"), "{}", out.stdout);
    // The warning for a workload profile no GPU has.
    let wl = dir.path().join("wl.yaml");
    std::fs::write(&wl, "version: v1\ngpupart:\n  workload: {\"9g.99gb\": 1}\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n").unwrap();
    let out = gpupart(&["validate", "-f", wl.to_str().unwrap()], &[]).ok();
    assert!(out.stdout.contains("key 'gpupart.workload': no known GPU has 9g.99gb"), "{}", out.stdout);
}

/// `… | head -1` on every verb that prints: a quiet end, never a panic.
#[test]
fn a_closed_stdout_ends_every_verb_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A100-SXM4-80GB:64");
    run(&base, &["apply", "-f", &example_config(), "-c", "all-balanced"], &[]).ok();
    let plan = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plan.yaml");
    let verbs: Vec<Vec<&str>> = vec![
        vec!["status", "-o", "json"],
        vec!["status"],
        vec!["frag", "-o", "json"],
        vec!["frag"],
        vec!["export"],
        vec!["export", "-o", "json"],
        vec!["apply", "-f", "EXAMPLE", "-c", "all-balanced", "--dry-run"],
        vec!["validate", "-f", "EXAMPLE"],
        vec!["plan", "-f", plan, "-o", "yaml"],
    ];
    let cfg = example_config();
    for verb in verbs {
        let verb: Vec<&str> = verb.into_iter().map(|a| if a == "EXAMPLE" { cfg.as_str() } else { a }).collect();
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpupart"));
        if verb[0] != "plan" && verb[0] != "validate" {
            c.args(&base);
        }
        let mut child = c.args(&verb).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Read one byte, then hang up, as `head -c1` does.
        let mut out = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        out.read_exact(&mut one).unwrap();
        drop(out);
        let done = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.code() == Some(0), "{verb:?}: {:?} {err}", done.status);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{verb:?}: {err}");
    }
}

#[test]
fn a_missing_or_empty_layout_file_is_named_in_the_idle_reason() {
    let node = Node::new("A30-24GB:1");
    let layout = node.dir.path().join("layout");
    let agent = support::baremetal::start(&node, &layout, &["--poll-interval", "100ms"]);
    let path = layout.display().to_string();
    wait_reason(&agent, &format!("no layout requested: layout file {path} does not exist"));
    std::fs::write(&layout, "# nothing yet\n\n").unwrap();
    wait_reason(&agent, &format!("no layout requested: layout file {path} holds no layout name"));
    assert_eq!(agent.status()["state"], "idle");
}

fn wait_reason(agent: &support::baremetal::Agent, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = agent.status();
        if st["reason"].as_str().is_some_and(|r| r.contains(want)) {
            assert_eq!(st["state"], "idle", "{st}");
            return;
        }
        assert!(Instant::now() < deadline, "waiting for {want}: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn gpus_with_mig_disabled_show_no_mig_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A100-SXM4-80GB:1");
    let doc: serde_json::Value = serde_json::from_str(&run(&base, &["status", "-o", "json"], &[]).ok().stdout).unwrap();
    let g = &doc["gpus"][0];
    assert_eq!(g["mig_mode"]["current"], false);
    assert!(g["free"].is_null(), "{g}");
    assert!(g["fragmentation"]["largest_creatable"].is_null(), "{g}");
    let table = run(&base, &["status"], &[]).ok().stdout;
    assert!(table.contains("MIG disabled") && !table.contains("largest creatable"), "{table}");
}

#[test]
fn mig_parted_boolean_environment_values_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A100-SXM4-80GB:1");
    let cfg = example_config();
    for (var, value) in [("MIG_PARTED_DEBUG", "1"), ("MIG_PARTED_SKIP_RESET", "1"), ("MIG_PARTED_DEBUG", "TRUE")] {
        run(&base, &["apply", "-f", &cfg, "-c", "all-disabled"], &[(var, value)]).ok();
    }
    let out = run(&base, &["apply", "-f", &cfg, "-c", "all-disabled"], &[("MIG_PARTED_DEBUG", "maybe")]).failed();
    assert!(out.stderr.contains("maybe"), "{}", out.stderr);
}

#[test]
fn one_spelling_per_option_and_the_simulate_state_contradiction_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A30-24GB:1");
    // `-o/--output` on every verb; export also takes mig-parted's `--output-format`.
    for verb in ["status", "frag", "export"] {
        run(&base, &[verb, "--output", "json"], &[]).ok();
    }
    run(&base, &["export", "--output-format", "json"], &[]).ok();
    // GPU options after the verb work too, and are not offered on offline verbs.
    let state = dir.path().join("node.json");
    gpupart(&["status", "--sim-state", state.to_str().unwrap()], &[]).ok();
    let out = gpupart(&["validate", "-f", &example_config(), "--nvidia-smi", "/x"], &[]).failed();
    assert!(out.stderr.contains("--nvidia-smi"), "{}", out.stderr);
    let help = gpupart(&["apply", "--help"], &[]).ok().stdout;
    assert!(help.contains("Global options:") && help.contains("GPU options:"), "{help}");
    let help = gpupart(&["validate", "--help"], &[]).ok().stdout;
    assert!(!help.contains("--nvidia-smi") && !help.contains("--mps-root"), "{help}");
    // The agent reads MIG_PARTED_CONFIG_FILE as apply does (CONFIG_FILE still works).
    let out = gpupart(&["agent", "--no-kube", "--layout", "x", "--lock-file", "/nonexistent/dir/x"], &[]).failed();
    assert!(out.stderr.contains("MIG_PARTED_CONFIG_FILE"), "{}", out.stderr);
    // A state file that holds other GPUs than --simulate asks for.
    let out =
        gpupart(&["--simulate", "A100-SXM4-80GB:8", "--sim-state", state.to_str().unwrap(), "status"], &[]).failed();
    assert!(
        out.stderr.contains("does not match the existing state file") && out.stderr.contains("A30-24GB:1"),
        "{}",
        out.stderr
    );
}

#[test]
fn apply_logs_steps_at_debug_and_json_errors_stay_json() {
    let dir = tempfile::tempdir().unwrap();
    let base = sim(dir.path(), "A100-SXM4-80GB:8");
    let out = run(&base, &["apply", "-f", &example_config(), "-c", "all-balanced"], &[("RUST_LOG", "info")]).ok();
    let info_lines = out.stderr.lines().count();
    // Two lines per GPU, and first the warning that the GPUs are simulated.
    assert!(out.stderr.lines().next().is_some_and(|l| l.contains("WARN simulated GPUs")), "{}", out.stderr);
    assert!(info_lines <= 17, "{info_lines} lines at INFO:\n{}", out.stderr);
    assert!(!out.stderr.contains("created GPU instance"), "{}", out.stderr);
    let out = run(&base, &["--log-format", "json", "apply", "-f", "/nonexistent.yaml"], &[]).failed();
    let last = out.stderr.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    assert_eq!(v["level"], "ERROR");
    assert!(v["fields"]["error"].as_str().unwrap().contains("/nonexistent.yaml"), "{v}");
}
