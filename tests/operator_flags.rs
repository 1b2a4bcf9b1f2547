//! Flag values an operator plausibly types that would break the controller or the DRA plugin:
//! each is refused at start, naming the flag and the value, before anything runs.

use std::process::Command;

/// Runs `gpupart ARGS` with no kubeconfig and returns (exit code, stderr).
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpupart"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("gpupart runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn controller_durations_that_break_it_are_refused_naming_the_flag() {
    for (flag, value, why) in [
        ("--lease-duration", "0s", "at least 1s"),
        ("--lease-duration", "500ms", "at least 1s"),
        ("--resync-interval", "0s", "at least 100ms"),
        ("--batch-window", "0s", "at least 100ms"),
        ("--reclaim-after", "0s", "at least 1s"),
        ("--lease-duration", "-1", "invalid duration '-1'"),
        ("--cooldown", "-5s", "invalid duration '-5s'"),
        ("--resync-interval", "-1s", "invalid duration '-1s'"),
    ] {
        let (code, err) = run(&["controller", flag, value]);
        assert_eq!(code, Some(2), "{flag} {value}: {err}");
        assert!(err.contains(&format!("invalid value '{value}' for '{flag}")), "{flag} {value}: {err}");
        assert!(err.contains(why), "{flag} {value}: {err}");
    }
}

#[test]
fn a_dra_driver_name_the_api_server_refuses_is_refused_at_start() {
    let long = format!("{}.gpupart.io", "a".repeat(300));
    for bad in ["GPU_Driver", "", "foo/bar", "../../esc", "-gpu.io", "gpu..io", long.as_str(), "a".repeat(64).as_str()]
    {
        let (code, err) = run(&["agent", "--dra", "--node-name", "n", "--driver-name", bad]);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(err.contains("--driver-name") && err.contains("is not a DRA driver name"), "{bad:?}: {err}");
    }
    // Names the API server takes are accepted by the parser (the run then fails on other things).
    for good in ["gpu.gpupart.io", "gpu", "a-1.b-2.example.com"] {
        let (_, err) = run(&["agent", "--dra", "--node-name", "n", "--driver-name", good, "--help"]);
        assert!(!err.contains("is not a DRA driver name"), "{good}: {err}");
    }
}

#[test]
fn frag_help_points_its_json_at_the_fragmentation_doc() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpupart")).args(["frag", "--help"]).output().expect("gpupart runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let json = help.lines().find(|l| l.trim_start().starts_with("- json:")).unwrap_or_default();
    assert!(json.contains("docs/fragmentation.md"), "{help}");
}

#[test]
fn dra_mode_refuses_the_label_driven_agents_flags() {
    for (flags, named) in [
        (&["-f", "/etc/gpupart/config.yaml"][..], "-f/--config-file"),
        (&["--layout", "all-1g.10gb"], "--layout"),
        (&["--default-layout", "all-disabled"], "--default-layout"),
        (&["--pause-gpu-clients"], "--pause-gpu-clients"),
        (&["--allow-reboot"], "--allow-reboot"),
        (&["--config-map", "gpupart-system/gpupart-config"], "--config-map"),
    ] {
        let mut args = vec!["agent", "--dra", "--node-name", "n"];
        args.extend_from_slice(flags);
        let (code, err) = run(&args);
        assert_eq!(code, Some(1), "{flags:?}: {err}");
        assert!(err.contains(&format!("{named} is for the label-driven agent only: remove it")), "{flags:?}: {err}");
    }
    let (_, err) = run(&["agent", "--dra", "--node-name", "n", "--allow-reboot", "--layout", "x"]);
    assert!(err.contains("--layout, --allow-reboot are for the label-driven agent only: remove them"), "{err}");
}
