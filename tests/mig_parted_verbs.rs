//! mig-parted's remaining verbs through the real binary, on both backends: `generate-config`
//! (the layouts the discovered profiles allow, valid and appliable), `checkpoint` (mig-parted's
//! JSON) and `restore` (exact placements back, what already matches kept, busy instances safe).

#[macro_use]
mod support;

use support::{example_config, layout, Backend, Node};

on_both_backends!(
    generated_configs_validate_and_every_one_applies,
    checkpoint_then_restore_brings_placements_back_with_the_fewest_changes,
    restore_refuses_what_it_cannot_do_and_changes_nothing,
);

/// Config names of a v1 YAML config, in order.
fn config_names(text: &str) -> Vec<String> {
    let v: serde_json::Value = serde_saphyr::from_str(text).unwrap();
    v["mig-configs"].as_object().unwrap().keys().cloned().collect()
}

fn generated_configs_validate_and_every_one_applies(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    let text = node.run(&["generate-config"]).ok().stdout;
    let names = config_names(&text);
    for want in ["all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-1g.10gb.me", "all-7g.80gb"] {
        assert!(names.contains(&want.to_string()), "{want} missing from {names:?}");
    }
    assert!(text.contains("  all-balanced:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 2\n        \"2g.20gb\": 1\n        \"3g.40gb\": 1\n"), "{text}");
    assert!(!text.contains("device-filter"), "one GPU kind: no filter\n{text}");
    let f = node.config("generated.yaml", &text);
    let checked = node.run(&["validate", "-f", &f, "--strict", "--gpu", "A100-SXM4-80GB:2"]).ok();
    assert!(checked.stdout.contains(&format!("OK: {} config(s)", names.len())), "{}", checked.stdout);
    for name in &names {
        node.apply(&f, name);
        node.run(&["assert", "-f", &f, "-c", name]).ok();
    }
    // -f writes the file; -o json is the same content.
    let out = node.dir.path().join("out.json");
    node.run(&["generate-config", "-o", "json", "-f", out.to_str().unwrap()]).ok();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(json["mig-configs"]["all-1g.10gb"][0]["mig-devices"]["1g.10gb"], 7);
}

fn checkpoint_then_restore_brings_placements_back_with_the_fewest_changes(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2,A30-24GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-balanced");
    let saved = layout(&node.status());
    let file = node.dir.path().join("checkpoint.json");
    let r = node.run(&["checkpoint", "-f", file.to_str().unwrap()]).ok();
    assert!(r.stdout.contains("MIG configuration checkpointed successfully"), "{}", r.stdout);
    // mig-parted's own format.
    let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(c["Version"], "v1");
    let d0 = &c["MigState"]["Devices"][0];
    assert!(d0["UUID"].as_str().unwrap().starts_with("GPU-") && d0["MigMode"] == 1, "{c}");
    assert!(
        d0["GpuInstances"][0]["Placement"]["Size"].is_u64()
            && d0["GpuInstances"][0]["ComputeInstances"][0]["EngProfileID"] == 0
    );
    node.apply(&cfg, "mixed-3g-2g");
    assert_ne!(layout(&node.status()), saved);
    let r = node.run(&["restore", "-f", file.to_str().unwrap()]).ok();
    assert!(r.stdout.contains("MIG configuration restored successfully"), "{}", r.stdout);
    assert!(r.stdout.contains("  keep "), "instances that match stay:\n{}", r.stdout);
    assert_eq!(layout(&node.status()), saved, "the same profiles at the same placements");
    // A second restore changes nothing; a MIG-off checkpoint turns MIG off again.
    let again = node.run(&["restore", "-f", file.to_str().unwrap()]).ok();
    assert_eq!(again.stdout.matches("already applied").count(), 3, "{}", again.stdout);
    node.apply(&cfg, "all-disabled");
    let off = node.dir.path().join("off.json");
    node.run(&["checkpoint", "-f", off.to_str().unwrap()]).ok();
    node.apply(&cfg, "all-balanced");
    node.run(&["restore", "-f", off.to_str().unwrap()]).ok();
    assert!(node.status()["gpus"].as_array().unwrap().iter().all(|g| g["mig_mode"]["current"] == false));
}

fn restore_refuses_what_it_cannot_do_and_changes_nothing(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = example_config();
    node.apply(&cfg, "all-balanced");
    let file = node.dir.path().join("checkpoint.json");
    node.run(&["checkpoint", "-f", file.to_str().unwrap()]).ok();
    node.apply(&cfg, "mixed-3g-2g");
    // A process on an instance the checkpoint does not hold (mixed-3g-2g's 2g.20gb@2).
    let gi = node.load().gpus[0].gpu_instances.iter().find(|g| g.placement.start == 2).unwrap().id;
    node.attach(0, gi, 4242);
    let before = node.load();
    let r = node.run(&["restore", "-f", file.to_str().unwrap()]).failed();
    assert!(r.stderr.contains("is in use (pids 4242)") && r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert_eq!(node.load(), before);
    // A checkpoint of another node names the GPU it cannot find.
    let text = std::fs::read_to_string(&file).unwrap().replace("GPU-", "GPU-0000");
    let other = node.config("other.json", &text);
    let r = node.run(&["restore", "-f", &other]).failed();
    assert!(r.stderr.contains("is not on this node"), "{}", r.stderr);
    assert_eq!(node.load(), before);
    // Once the process ends, --force is not needed; mig-parted writes null for an empty list.
    let mut s = node.load();
    s.gpus[0].gpu_instances.iter_mut().for_each(|g| g.compute_instances.iter_mut().for_each(|c| c.processes.clear()));
    node.save(&s);
    let uuid = node.status()["gpus"][0]["uuid"].as_str().unwrap().to_string();
    let empty = node.config(
        "empty.json",
        &format!(
            r#"{{"Version":"v1","MigState":{{"Devices":[{{"UUID":"{uuid}","MigMode":1,"GpuInstances":null}}]}}}}"#
        ),
    );
    node.run(&["restore", "-f", &empty]).ok();
    assert!(node.load().gpus[0].gpu_instances.is_empty());
}

/// Runs gpupart through a symlink named `nvidia-mig-parted`, on `node`'s simulated GPUs given
/// by the environment (as the MIG manager passes only mig-parted's own arguments).
fn nvidia_mig_parted(node: &Node, args: &[&str]) -> support::Run {
    let link = node.dir.path().join("bin/nvidia-mig-parted");
    if !link.exists() {
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpupart"), &link).unwrap();
    }
    let out = std::process::Command::new(&link)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("GPUPART_SIM_STATE", &node.state)
        .env("GPUPART_MPS_ROOT", node.mps_root())
        .output()
        .unwrap();
    support::Run::from(out)
}

#[test]
fn as_nvidia_mig_parted_it_answers_the_mig_managers_calls() {
    let node = Node::new("A100-SXM4-80GB:2");
    let cfg = example_config();
    let (f, c) = (cfg.as_str(), "all-balanced");
    // The calls of NVIDIA's k8s-mig-manager (pkg/mig/reconfigure), in its order, and the exit
    // codes it branches on.
    let code = |args: &[&str]| nvidia_mig_parted(&node, args).code;
    assert_eq!(code(&["assert", "--valid-config", "-f", f, "-c", c]), 0);
    assert_eq!(code(&["assert", "--valid-config", "-f", f, "-c", "no-such-config"]), 1);
    assert_eq!(code(&["assert", "-f", f, "-c", c]), 1, "not applied yet");
    assert_eq!(code(&["assert", "--mode-only", "-f", f, "-c", c]), 1, "MIG mode must change");
    assert_eq!(code(&["-d", "apply", "--mode-only", "-f", f, "-c", c]), 0);
    assert_eq!(code(&["-d", "assert", "--mode-only", "-f", f, "-c", c]), 0);
    let applied = nvidia_mig_parted(&node, &["-d", "apply", "-f", f, "-c", c]).ok();
    assert!(applied.stdout.contains("MIG configuration applied successfully"), "{}", applied.stdout);
    assert_eq!(code(&["assert", "-f", f, "-c", c]), 0);
    // Its environment works as mig-parted's does.
    let r = std::process::Command::new(node.dir.path().join("bin/nvidia-mig-parted"))
        .arg("assert")
        .env("MIG_PARTED_CONFIG_FILE", f)
        .env("MIG_PARTED_SELECTED_CONFIG", c)
        .env("GPUPART_SIM_STATE", &node.state)
        .status()
        .unwrap();
    assert!(r.success());
    // The minimal diff: a change keeps what can stay.
    let changed = nvidia_mig_parted(&node, &["-d", "apply", "-f", f, "-c", "mixed-3g-2g"]).ok();
    assert!(changed.stdout.contains("  keep "), "{}", changed.stdout);
    // Usage and export speak as nvidia-mig-parted.
    let help = nvidia_mig_parted(&node, &["--help"]).ok().stdout;
    assert!(help.contains("Usage: nvidia-mig-parted"), "{help}");
    let exported = nvidia_mig_parted(&node, &["export"]).ok().stdout;
    assert!(exported.starts_with("version: v1\nmig-configs:\n  current:\n"), "{exported}");
    // A config that selects none of this node's GPUs: mig-parted succeeds doing nothing, gpupart
    // under its own name says why it refuses.
    let h100_only = node.config(
        "h100.yaml",
        "version: v1\nmig-configs:\n  h100:\n    - device-filter: \"0x233010DE\"\n      devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n",
    );
    let before = node.load();
    nvidia_mig_parted(&node, &["apply", "-f", &h100_only, "-c", "h100"]).ok();
    assert_eq!(node.load(), before);
    let r = node.run(&["apply", "-f", &h100_only, "-c", "h100"]).failed();
    assert!(r.stderr.contains("has no entry for this node's GPUs"), "{}", r.stderr);
}

/// One row of the exit-code table in docs/mig-parted.md: node, MIG mode now, config, then the
/// exit codes of `assert --valid-config`, `assert --mode-only`, `apply --mode-only`, `assert`, `apply`.
fn exit_code_table() -> Vec<(String, bool, String, [i32; 5])> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mig-parted.md")).unwrap();
    let start = doc.find("| node | MIG now | config |").expect("the exit-code table in docs/mig-parted.md");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            // A cell is gpupart's code, mig-parted's after it where the two differ: `1 (mig-parted: 0)`.
            let code = |k: usize| {
                let first = cells[k].split_whitespace().next().unwrap_or_default();
                first.parse::<i32>().unwrap_or_else(|_| panic!("{l}: cell {k}"))
            };
            (
                cells[0].to_string(),
                cells[1] == "on",
                cells[2].to_string(),
                [code(3), code(4), code(5), code(6), code(7)],
            )
        })
        .collect()
}

#[test]
fn as_nvidia_mig_parted_every_call_of_the_mig_manager_exits_as_mig_parted_does() {
    let cfg = support::nvidia_config("default-mig-parted-config.yaml");
    let f = cfg.to_str().unwrap();
    let rows = exit_code_table();
    assert_eq!(rows.len(), 36, "3 models × MIG off and on × 6 configs");
    let calls: [&[&str]; 5] =
        [&["assert", "--valid-config"], &["assert", "--mode-only"], &["apply", "--mode-only"], &["assert"], &["apply"]];
    for (spec, on, config, codes) in &rows {
        for debug in [false, true] {
            for (call, want) in calls.iter().zip(codes) {
                // Each call on a node of its own in the row's state, as the manager meets it.
                let node = Node::new(spec);
                if *on {
                    node.run(&["apply", "-f", f, "-c", "all-enabled"]).ok();
                }
                let mut args: Vec<&str> = if debug { vec!["-d"] } else { vec![] };
                args.extend(call.iter());
                args.extend(["-f", f, "-c", config]);
                let r = nvidia_mig_parted(&node, &args);
                let row = format!("{spec}, MIG {}, {config}: {}", if *on { "on" } else { "off" }, args.join(" "));
                assert_eq!(r.code, *want, "{row}\nstdout: {}\nstderr: {}", r.stdout, r.stderr);
                // The words scripts and people look for.
                let last = r.stdout.lines().last().unwrap_or_default();
                let words = match (call, r.code) {
                    (["assert", "--valid-config"], 0) => "Selected MIG configuration is valid",
                    (["assert", "--mode-only"], 0) => "Selected MIG mode settings from configuration currently applied",
                    (["assert"], 0) => "Selected MIG configuration currently applied",
                    (_, 0) => "MIG configuration applied successfully",
                    _ => "",
                };
                assert_eq!(last, words, "{row}");
                if r.code != 0 {
                    let fatal = r.stderr.lines().last().unwrap_or_default();
                    assert!(
                        fatal.starts_with("time=\"") && fatal.contains(" level=fatal msg=\""),
                        "{row}: {}",
                        r.stderr
                    );
                }
                if call == &["assert"] && r.code != 0 {
                    assert!(r
                        .stderr
                        .contains("msg=\"Assertion failure: selected configuration not currently applied\""));
                    assert_eq!(r.stderr.contains("level=debug"), debug, "{row}: the reason only with -d");
                }
                // After a mode-only apply the manager asserts the mode again: it must hold.
                if call == &["apply", "--mode-only"] && r.code == 0 {
                    let again = nvidia_mig_parted(&node, &["assert", "--mode-only", "-f", f, "-c", config]);
                    assert_eq!(again.code, 0, "{row}, then assert --mode-only: {}", again.stderr);
                }
            }
        }
    }
}

#[test]
fn gpuparts_own_mode_only_verbs_judge_the_mode_and_say_what_they_let_pass() {
    let cfg = support::nvidia_config("default-mig-parted-config.yaml");
    let f = cfg.to_str().unwrap();
    let node = Node::new("A100-SXM4-80GB:2");
    // all-1g.5gb names a profile an A100-80GB lacks: the mode is still judged and set.
    let r = node.run(&["assert", "--mode-only", "-f", f, "-c", "all-1g.5gb"]).failed();
    assert!(r.stderr.contains("MIG mode is disabled"), "{}", r.stderr);
    let applied = node.run(&["apply", "--mode-only", "-f", f, "-c", "all-1g.5gb"]).ok();
    assert!(
        applied.stderr.contains("mode only, not judged") && applied.stderr.contains("1g.5gb"),
        "{}",
        applied.stderr
    );
    assert!(node.load().gpus.iter().all(|g| g.mig_mode.current && g.gpu_instances.is_empty()));
    let ok = node.run(&["assert", "--mode-only", "-f", f, "-c", "all-1g.5gb"]).ok();
    assert!(ok.stdout.contains("Selected MIG mode settings of config 'all-1g.5gb' currently applied"), "{}", ok.stdout);
    // A config for H200 only selects none of these GPUs: nothing to judge, it passes; in full, it
    // and the missing profile fail, saying why.
    let none = node.run(&["assert", "--mode-only", "-f", f, "-c", "all-1g.35gb"]).ok();
    assert!(none.stderr.contains("has no entry for this node's GPUs"), "{}", none.stderr);
    let full = node.run(&["assert", "-f", f, "-c", "all-1g.5gb"]).failed();
    assert!(full.stderr.contains("1g.5gb"), "{}", full.stderr);
    node.run(&["apply", "-f", f, "-c", "all-1g.35gb"]).failed();
}
