//! End-to-end tests of the real binary. Each scenario runs twice: on the in-process simulator
//! (`--sim-state`) and through NVML (nvml-wrapper loading the fake libnvidia-ml, `--nvml-lib`).

#[macro_use]
mod support;

use support::{example_config, gpupart, layout, nvidia_config, Backend, Node};

on_both_backends!(
    apply_assert_export_round_trip,
    second_apply_changes_nothing,
    reconfiguration_keeps_what_can_stay,
    busy_instances_block_and_nothing_changes,
    infeasible_and_unknown_layouts_are_refused_before_anything_changes,
    mixed_node_with_gpus_without_mig,
    mig_mode_reset_only_where_needed,
    dry_run_plans_without_touching,
    injected_failure_reports_changes_and_rolls_back_the_half_created_instance,
);

fn apply_assert_export_round_trip(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:8");
    let cfg = example_config();
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).failed();
    // MIG disabled exports as mig-parted's own export does: an empty mapping, no placements.
    let disabled = node.run(&["export"]).ok().stdout;
    assert_eq!(
        disabled,
        "version: v1\nmig-configs:\n  current:\n    - devices: all\n      mig-enabled: false\n      mig-devices: {}\n"
    );
    let out = node.apply(&cfg, "all-balanced");
    assert!(out.stdout.contains("MIG configuration applied successfully"), "{}", out.stdout);
    let a = node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();
    assert!(a.stdout.contains("Selected MIG configuration currently applied"));
    let status = node.status();
    assert_eq!(status["gpus"].as_array().unwrap().len(), 8);
    let g0 = &status["gpus"][0];
    assert_eq!(g0["mig_mode"]["current"], true);
    assert_eq!(g0["instances"].as_array().unwrap().len(), 4);
    assert!(g0["instances"][0]["uuid"].as_str().unwrap().starts_with("MIG-"));

    // Export, then apply the export on a fresh node: the same layout, placements included.
    let exported = node.run(&["export"]).ok().stdout;
    assert!(exported.contains("# gpupart placements GPU 0:"), "{exported}");
    let fresh = Node::with(b, "A100-SXM4-80GB:8");
    let file = fresh.config("export.yaml", &exported);
    fresh.apply(&file, "current");
    fresh.run(&["assert", "-f", &file, "-c", "current"]).ok();
    node.run(&["assert", "-f", &file]).ok();
    assert_eq!(layout(&fresh.status()), layout(&status));
    // JSON export parses as a config too.
    let json = node.run(&["export", "-o", "json", "-l", "snap"]).ok().stdout;
    let jf = node.config("export.json", &json);
    node.run(&["assert", "-f", &jf, "-c", "snap"]).ok();
}

fn second_apply_changes_nothing(b: Backend) {
    let node = Node::with(b, "H100-SXM5-80GB:2");
    let cfg = example_config();
    node.apply(&cfg, "mixed-3g-2g");
    let before = std::fs::read(&node.state).unwrap();
    let again = node.apply(&cfg, "mixed-3g-2g");
    assert_eq!(again.stdout.matches("already applied").count(), 2, "{}", again.stdout);
    assert!(again.stdout.contains("destroyed 0, created 0"));
    assert_eq!(std::fs::read(&node.state).unwrap(), before, "state file untouched");
}

fn reconfiguration_keeps_what_can_stay(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-balanced");
    let before = node.status();
    let out = node.apply(&cfg, "mixed-3g-2g");
    assert!(out.stdout.contains("destroyed 2, created 1"), "{}", out.stdout);
    let after = node.status();
    let uuids = |s: &serde_json::Value| -> Vec<String> {
        s["gpus"][0]["instances"].as_array().unwrap().iter().map(|i| i["uuid"].as_str().unwrap().to_string()).collect()
    };
    let kept = uuids(&before).into_iter().filter(|u| uuids(&after).contains(u)).count();
    assert_eq!(kept, 2, "the 3g.40gb and 2g.20gb MIG devices survive with their UUIDs");
}

fn busy_instances_block_and_nothing_changes(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let cfg = example_config();
    node.apply(&cfg, "all-1g.10gb");
    let gi = node.load().gpus[1].gpu_instances.iter().find(|g| g.placement.start == 4).unwrap().id;
    node.attach(1, gi, 31337);
    let before = node.load();
    let r = node.run(&["apply", "-f", &cfg, "-c", "all-balanced"]).failed();
    let text = r.all();
    assert!(text.contains("nothing was changed"), "{text}");
    assert!(text.contains("GPU 1") && text.contains("used by pid 31337"), "{text}");
    assert!(text.contains("--force"), "{text}");
    assert_eq!(node.load(), before, "no GPU was touched, not even the idle one");
    // A layout that keeps the busy instance where it is goes through.
    let keep = node.config(
        "keep.yaml",
        "version: v1\nmig-configs:\n  k:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 5, \"2g.20gb\": 1}\n",
    );
    let out = node.apply(&keep, "k");
    assert!(out.stdout.contains("destroyed 4, created 2"), "{}", out.stdout);
    assert!(node.load().gpus[1].gpu_instances.iter().any(|g| g.id == gi));
    // --force gets past the planner, but the driver still refuses to destroy a busy instance.
    let r = node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "--force"]).failed();
    assert!(r.all().contains("NVML_ERROR_IN_USE"), "{}", r.all());
}

fn infeasible_and_unknown_layouts_are_refused_before_anything_changes(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let bad = node.config(
        "bad.yaml",
        "version: v1\nmig-configs:\n  three:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 3}\n  \
         unknown:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 1}\n  \
         range:\n    - devices: [5]\n      mig-enabled: false\n",
    );
    let before = std::fs::read(&node.state).unwrap();
    let r = node.run(&["apply", "-f", &bad, "-c", "three"]).failed();
    assert!(r.all().contains("needs 3 GPU instances of 3g.40gb but the GPU allows 2"), "{}", r.all());
    let r = node.run(&["apply", "-f", &bad, "-c", "unknown"]).failed();
    assert!(r.all().contains("unsupported MIG device specified 3g.20gb, expected one of 1g.10gb"), "{}", r.all());
    let r = node.run(&["apply", "-f", &bad, "-c", "range"]).failed();
    assert!(r.all().contains("device index 5 is out of range (the node has 2 GPUs)"), "{}", r.all());
    let r = node.run(&["apply", "-f", &bad]).failed();
    assert!(r.all().contains("choose one with -c"), "{}", r.all());
    let r = node.run(&["apply", "-f", &bad, "-c", "nope"]).failed();
    assert!(r.all().contains("unknown config 'nope'"), "{}", r.all());
    assert_eq!(std::fs::read(&node.state).unwrap(), before);
}

fn mixed_node_with_gpus_without_mig(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2,V100-SXM2-16GB:2");
    let cfg = example_config();
    let out = node.apply(&cfg, "all-balanced");
    assert!(out.stdout.contains("GPU 2 V100-SXM2-16GB") && out.stdout.contains("left alone"), "{}", out.stdout);
    // mig-parted semantics: V100s not covered by a filter do not count against assert.
    node.run(&["assert", "-f", &cfg, "-c", "all-balanced"]).ok();
    let s = node.status();
    assert_eq!(s["gpus"][3]["mig_capable"], false);
    assert!(s["gpus"][3]["free"].is_null());
    // Export uses device filters on a mixed node and re-applies cleanly.
    let exported = node.run(&["export"]).ok().stdout;
    assert!(exported.contains("device-filter: \"0x1DB110DE\""), "{exported}");
    let f = node.config("e.yaml", &exported);
    node.run(&["assert", "-f", &f]).ok();
    // Disabling MIG on an Ampere GPU needs its own reset only.
    node.apply(&cfg, "all-disabled");
    let st = node.load();
    assert!(st.gpus.iter().all(|g| !g.mig_mode.current && g.gpu_instances.is_empty()));
}

fn mig_mode_reset_only_where_needed(b: Backend) {
    let node = Node::with(b, "A100-SXM4-40GB:1,H100-SXM5-80GB:1");
    let cfg = node.config(
        "on.yaml",
        "version: v1\nmig-configs:\n  on:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n",
    );
    // A process on the Ampere GPU: its pending mode cannot be applied by a reset.
    let mut s = node.load();
    s.gpus[0].processes.push(gpupart::mig::sim::SimProcess { pid: 4000, name: "dcgm".into(), used_memory_mib: 10 });
    node.save(&s);
    let r = node.run(&["apply", "-f", &cfg]).failed();
    assert!(r.all().contains("reset required: MIG mode enabled is pending until GPU 0 is reset, and it has running processes (pids 4000)"), "{}", r.all());
    let st = node.load();
    assert!(st.gpus[0].mig_mode.pending && !st.gpus[0].mig_mode.current);
    assert!(st.gpus[1].mig_mode.current, "Hopper switched immediately, without a reset");
    // Once the process is gone the rerun converges.
    let mut s = node.load();
    s.gpus[0].processes.clear();
    node.save(&s);
    node.run(&["apply", "-f", &cfg]).ok();
    node.run(&["assert", "-f", &cfg]).ok();
    // --skip-reset leaves a pending mode as "reset required".
    let node = Node::with(b, "A30-24GB:1");
    let r = node.run(&["apply", "-f", &cfg, "--skip-reset"]).failed();
    assert!(r.all().contains("--skip-reset was given"), "{}", r.all());
}

fn dry_run_plans_without_touching(b: Backend) {
    let node = Node::with(b, "H200-SXM-141GB:2");
    let cfg = node.config(
        "h200.yaml",
        "version: v1\nmig-configs:\n  b:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 2, \"2g.35gb\": 1, \"3g.71gb\": 1}\n",
    );
    let before = std::fs::read(&node.state).unwrap();
    let out = node.run(&["apply", "-f", &cfg, "--dry-run"]).ok();
    assert!(out.stdout.contains("create   3g.71gb@4"), "{}", out.stdout);
    assert!(out.stdout.contains("dry run, nothing was changed"));
    assert_eq!(std::fs::read(&node.state).unwrap(), before);
}

fn injected_failure_reports_changes_and_rolls_back_the_half_created_instance(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-1g.10gb");
    // The 2nd CI creation fails: the 2g.20gb GI created for it is destroyed again.
    let [(var, spec)] = node.fail_env("nvmlGpuInstanceCreateComputeInstanceWithPlacement:2:NVML_ERROR_UNKNOWN");
    let r = node.run_env(&["apply", "-f", &cfg, "-c", "mixed-3g-2g"], &[(var, &spec)]).failed();
    let text = r.all();
    assert!(text.contains("NVML_ERROR_UNKNOWN (999)"), "{text}");
    assert!(text.contains("changed before the failure:") && text.contains("rolled back"), "{text}");
    let st = node.load();
    assert!(st.gpus[0].gpu_instances.iter().all(|g| !g.compute_instances.is_empty()), "no half-created instance left");
    node.apply(&cfg, "mixed-3g-2g");
    node.run(&["assert", "-f", &cfg, "-c", "mixed-3g-2g"]).ok();
}

#[test]
fn validate_lists_every_problem() {
    let node = Node::new("A100-SXM4-80GB:1");
    let bad = node.config(
        "bad.yaml",
        r#"version: v1
mig-configs:
  unknown-profile:
    - device-filter: "0x20B210DE"
      devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 1}
  too-many:
    - device-filter: ["0x20B210DE", "0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"2g.20gb": 4}
  too-big:
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices: {"2g.12gb": 2, "1g.6gb": 1}
  out-of-range:
    - devices: [0, 9]
      mig-enabled: false
"#,
    );
    let r = gpupart(&["validate", "-f", &bad], &[]).failed();
    let t = r.all();
    assert!(t.contains("config 'unknown-profile', entry 0, key 'mig-devices': on A100-SXM4-80GB: unsupported MIG device specified 3g.20gb"), "{t}");
    assert!(t.contains("config 'too-many', entry 0, key 'mig-devices': on A100-SXM4-80GB: layout cannot fit: needs 4 GPU instances of 2g.20gb but the GPU allows 3"), "{t}");
    assert!(t.contains("on H100-SXM5-80GB"), "{t}");
    assert!(
        t.contains(
            "config 'too-big', entry 0, key 'mig-devices': on A30-24GB: layout cannot fit: needs 5 of 4 memory slices"
        ),
        "{t}"
    );
    assert!(t.contains("4 problem(s)"), "{t}");
    let r = gpupart(&["validate", "-f", &bad, "-c", "out-of-range", "--gpu", "A100-SXM4-80GB:8"], &[]).failed();
    assert!(r.all().contains("device index 9 is out of range (the node has 8 GPUs)"), "{}", r.all());
    let ok = gpupart(&["validate", "-f", nvidia_config("default-mig-parted-config.yaml").to_str().unwrap()], &[]).ok();
    assert!(ok.stdout.contains("OK: 81 config(s)"), "{}", ok.stdout);
    let r = gpupart(&["validate", "-f", "/nonexistent.yaml"], &[]).failed();
    assert!(r.stderr.contains("reading config file /nonexistent.yaml"), "{}", r.stderr);
    let r = gpupart(
        &[
            "validate",
            "-f",
            &node.config("x.yaml", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      bogus: 1\n"),
        ],
        &[],
    )
    .failed();
    assert!(r.all().contains("config 'a', entry 0, key 'bogus': unexpected field: bogus"), "{}", r.all());
}

#[test]
fn validate_finds_everything_apply_would_refuse() {
    let node = Node::new("T4-16GB:2");
    let f = node.config(
        "v.yaml",
        "version: v1\nmig-configs:\n  bad:\n    - devices: [0, 9]\n      mig-enabled: true\n      mig-devices: {3g.20gb: 1}\n\
         \x20   - devices: [1]\n      mig-enabled: true\n      mig-devices: {5g.10gb: 1}\n\
         \x20   - devices: [2]\n      mig-enabled: true\n      mig-devices: {4g.40gb: 2}\n\
         \x20 broken:\n    - devices: all\n      mig-enabled: true\n\
         \x20 also-broken:\n    - devices: 7\n      mig-enabled: false\n\
         \x20 mig:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 1}\n",
    );
    // An out-of-range index hides neither the other entries nor the other configs, and a config
    // that does not parse hides none of the others.
    let r = gpupart(&["validate", "-f", &f, "--gpu", "A100-SXM4-40GB:4"], &[]).failed();
    for want in [
        "config 'bad', entry 0, key 'devices': device index 9 is out of range",
        "config 'bad', entry 1, key 'mig-devices': on GPU 1 (A100-SXM4-40GB): unsupported MIG device specified 5g.10gb",
        "config 'bad', entry 2, key 'mig-devices': on GPU 2 (A100-SXM4-40GB): unsupported MIG device specified 4g.40gb",
        "config 'broken', entry 0, key 'mig-devices': missing required field",
        "config 'also-broken', entry 0, key 'devices'",
    ] {
        assert!(r.stdout.contains(want), "missing `{want}`:\n{}", r.stdout);
    }
    assert!(r.stderr.contains("5 problem(s) in 4 config(s)"), "{}", r.stderr);
    // A MIG entry on GPUs without MIG: validate and apply give the same, real reason.
    let reason = "config 'mig', entry 0 asks for MIG, but GPU 0 (T4-16GB), GPU 1 (T4-16GB) have no MIG";
    let r = gpupart(&["validate", "-f", &f, "-c", "mig", "--gpu", "T4-16GB:2"], &[]).failed();
    assert!(r.stdout.contains(reason), "{}", r.all());
    let good = node.config("mig.yaml", "version: v1\nmig-configs:\n  mig:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 1}\n");
    let r = node.apply_result(&good, "mig").failed();
    assert!(r.stderr.contains(reason), "{}", r.stderr);
    // An unfiltered MPS entry some catalog models cannot serve warns for each of them.
    let mps = node.config("mps.yaml", "version: v1\nmig-configs:\n  m:\n    - devices: all\n      mig-enabled: false\n      mps: {replicas: 2, pinned-memory-limit: 20G}\n");
    let r = gpupart(&["validate", "-f", &mps], &[]).ok();
    assert!(r.stdout.contains("warning: config 'm', entry 0, key 'mps.pinned-memory-limit': 20480M exceeds the 15360M of memory of T4-16GB"), "{}", r.stdout);
}

#[test]
fn commands_without_a_backend_fail_clearly() {
    let r = gpupart(&["--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "status"], &[]).failed();
    assert!(r.stderr.contains("cannot load NVML from /nonexistent/libnvidia-ml.so.1"), "{}", r.stderr);
    assert!(r.stderr.contains("--simulate"), "{}", r.stderr);
    let r = gpupart(&["--simulate", "B200:8", "status"], &[]).failed();
    assert!(r.stderr.contains("unknown GPU model 'B200'"), "{}", r.stderr);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("s.json");
    std::fs::write(&bad, "{not json").unwrap();
    let r = gpupart(&["--sim-state", bad.to_str().unwrap(), "status"], &[]).failed();
    assert!(r.stderr.contains("invalid simulator state"), "{}", r.stderr);
}

#[test]
fn config_from_stdin() {
    use std::io::Write;
    let node = Node::new("A30-24GB:1");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpupart"))
        .args(["--sim-state", node.state.to_str().unwrap(), "apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.6gb\": 2, \"2g.12gb\": 1}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(node.status()["gpus"][0]["instances"].as_array().unwrap().len(), 3);
}

#[test]
fn frag_reports_the_reference_example_and_honours_the_workload_block() {
    let node = Node::new("H100-SXM5-80GB:1,V100-SXM2-16GB:1");
    let three = node.config(
        "three.yaml",
        "version: v1\ngpupart:\n  workload: {\"3g.40gb\": 1}\nmig-configs:\n  x:\n    - device-filter: \"0x233010DE\"\n      devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 3}\n",
    );
    node.apply(&three, "x");
    // Move the three 1g instances to slots 0, 1 and 5 (the reference's fragmented layout).
    let mut s = node.load();
    for (gi, start) in s.gpus[0].gpu_instances.iter_mut().zip([0, 1, 5]) {
        gi.placement.start = start;
    }
    node.save(&s);
    let doc: serde_json::Value =
        serde_json::from_str(&node.run(&["frag", "-o", "json", "-f", &three]).ok().stdout).unwrap();
    let g = &doc["gpus"][0];
    assert_eq!((g["free_memory_slices"].as_u64(), g["free_compute_slices"].as_u64()), (Some(5), Some(4)));
    assert_eq!(g["largest_creatable"], "2g.20gb");
    assert_eq!(g["workload"], serde_json::json!([["3g.40gb", 1.0]]));
    assert_eq!(g["expected_fragmentation_slices"], 5.0, "no 3g fits anywhere: all 5 free slices are fragmented");
    let three_g = g["profiles"].as_array().unwrap().iter().find(|p| p["profile"] == "3g.40gb").unwrap();
    assert_eq!((three_g["creatable"].as_u64(), three_g["unusable_ratio"].as_f64()), (Some(0), Some(1.0)));
    assert_eq!(doc["node"]["idle_without_mig_gpus"], 1);
    assert_eq!(doc["node"]["whole_free_gpus"], 1);
    assert!((doc["node"]["unallocated_gpus"].as_f64().unwrap() - 1.625).abs() < 1e-9);
    let table = node.run(&["frag"]).ok().stdout;
    assert!(table.contains("largest creatable 2g.20gb") && table.contains("node: 2 GPUs"), "{table}");
    let status = node.status();
    assert_eq!(status["gpus"][0]["fragmentation"]["largest_creatable"], "2g.20gb");
}

#[test]
fn mig_parted_hooks_run_in_order_with_their_environment() {
    let node = Node::new("A100-SXM4-80GB:1");
    let cfg = example_config();
    let trace = node.dir.path().join("trace");
    let hook = |name: &str| {
        format!("  {name}:\n  - command: /bin/sh\n    args: [\"-c\", \"echo {name} $MIG_PARTED_SELECTED_CONFIG $HOME >> {}\"]\n", trace.display())
    };
    let hooks = format!(
        "version: v1\nhooks:\n{}{}{}{}",
        hook("apply-start"),
        hook("pre-apply-mode"),
        hook("pre-apply-config"),
        hook("apply-exit")
    );
    let hooks = node.config("hooks.yaml", &hooks);
    node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "-k", &hooks]).ok();
    let lines = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(
        lines,
        "apply-start all-balanced\npre-apply-mode all-balanced\npre-apply-config all-balanced\napply-exit all-balanced\n",
        "hooks in order, MIG_PARTED_* set, the caller's HOME not inherited"
    );
    std::fs::remove_file(&trace).unwrap();
    node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "-k", &hooks]).ok();
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        "apply-start all-balanced\napply-exit all-balanced\n",
        "nothing to change"
    );

    // A failing pre-apply-config hook stops the apply before any change; apply-exit still runs.
    std::fs::remove_file(&trace).unwrap();
    let failing = node.config(
        "fail.yaml",
        &format!("version: v1\nhooks:\n  pre-apply-config:\n  - command: /bin/false\n{}", hook("apply-exit")),
    );
    let before = node.load();
    let r = node.run(&["apply", "-f", &cfg, "-c", "mixed-3g-2g", "-k", &failing]).failed();
    assert!(r.all().contains("hook pre-apply-config[0] (/bin/false) failed"), "{}", r.all());
    assert_eq!(node.load(), before);
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), "apply-exit mixed-3g-2g\n");
    let r = node
        .run(&[
            "apply",
            "-f",
            &cfg,
            "-c",
            "all-balanced",
            "-k",
            &node.config("bad.yaml", "version: v1\nhooks:\n  after: []\n"),
        ])
        .failed();
    assert!(r.all().contains("unknown hook 'after'"), "{}", r.all());
}

#[test]
fn hooks_say_why_they_cannot_run_and_show_a_failures_output() {
    let node = Node::new("A100-SXM4-80GB:1");
    let cfg = example_config();
    // NVIDIA's own minimal systemd hooks: the real problem is the missing working directory.
    let minimal = nvidia_config("mig-parted-systemd-hooks-minimal.yaml");
    let r = node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "-k", minimal.to_str().unwrap()]).failed();
    assert!(
        r.stderr.contains(
            "hook apply-start[0] (/bin/bash) cannot run: its working directory /etc/nvidia-mig-manager does not exist"
        ),
        "{}",
        r.stderr
    );
    let missing = node.config("missing.yaml", "version: v1\nhooks:\n  apply-start:\n  - command: /no/such/tool\n");
    let r = node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "-k", &missing]).failed();
    assert!(r.stderr.contains("cannot run: the program /no/such/tool does not exist"), "{}", r.stderr);
    // A failing hook's own words are shown without -d.
    let loud = node.config(
        "loud.yaml",
        "version: v1\nhooks:\n  apply-start:\n  - command: /bin/sh\n    args: [\"-c\", \"echo step one; echo systemctl: unit k8s.service not found >&2; exit 3\"]\n",
    );
    let r = node.run(&["apply", "-f", &cfg, "-c", "all-balanced", "-k", &loud]).failed();
    assert!(r.stderr.contains("hook apply-start[0] (/bin/sh) failed: exit status: 3"), "{}", r.stderr);
    assert!(r.stderr.contains("systemctl: unit k8s.service not found"), "{}", r.stderr);
}
