//! Small things a new user runs into: the version names its commit, a LICENSE matches
//! Cargo.toml, a negative `--headroom` is a value (and refused as such), a duplicate YAML key is
//! named with its line and nothing else, a read-only simulator state stays read-only and
//! unchanged, and `-o` is offered by exactly the verbs README says.

mod support;

use std::os::unix::fs::PermissionsExt;
use support::{example_config, gpupart, Node};

#[test]
fn version_names_the_commit() {
    let out = gpupart(&["--version"], &[]).ok().stdout;
    let rest = out
        .trim()
        .strip_prefix(&format!("gpupart {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("{out}"));
    let commit = rest.strip_suffix(')').unwrap_or_else(|| panic!("{out}"));
    assert!(commit == "unknown" || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())), "{out}");
}

#[test]
fn the_license_file_is_the_one_cargo_toml_names() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"Apache-2.0\""), "Cargo.toml names another license");
    let text = std::fs::read_to_string(root.join("LICENSE")).expect("a LICENSE file");
    assert!(text.trim_start().starts_with("Apache License") && text.contains("Version 2.0, January 2004"));
}

#[test]
fn a_negative_headroom_is_refused_as_a_value() {
    let r = gpupart(&["plan", "-f", "examples/plan.yaml", "--headroom", "-5"], &[]).failed();
    assert!(r.stderr.contains("'-5'") && r.stderr.contains("--headroom"), "{}", r.stderr);
    assert!(!r.stderr.contains("unexpected argument"), "{}", r.stderr);
}

#[test]
fn a_duplicate_yaml_key_is_named_with_its_line() {
    let node = Node::new("A100-SXM4-80GB:1");
    let f = node.config(
        "dup.yaml",
        "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        1g.10gb: 1\n        1g.10gb: 2\n",
    );
    for args in [vec!["validate", "-f", &f], vec!["apply", "-f", &f, "-c", "a"]] {
        let r = node.run(&args).failed();
        assert!(r.stderr.contains("line 8") && r.stderr.contains("duplicate mapping key: 1g.10gb"), "{}", r.stderr);
        assert!(!r.stderr.contains("DuplicateKeyPolicy"), "{}", r.stderr);
    }
}

#[test]
fn a_read_only_sim_state_stays_read_only_and_unchanged() {
    let node = Node::new("A100-SXM4-80GB:1");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // A writable file keeps its own mode through a change.
    std::fs::set_permissions(&node.state, std::fs::Permissions::from_mode(0o640)).unwrap();
    node.apply(&example_config(), "all-1g.10gb");
    assert_eq!(mode(&node.state), 0o640);
    std::fs::set_permissions(&node.state, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&node.state).unwrap();
    let r = node.apply_result(&example_config(), "all-balanced").failed();
    assert!(r.all().contains("read-only"), "{}", r.all());
    assert_eq!(std::fs::read(&node.state).unwrap(), before, "nothing changed");
    assert_eq!(mode(&node.state), 0o444);
    node.run(&["status"]).ok();
}

#[test]
fn output_is_offered_by_the_verbs_readme_names() {
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let readme = readme.replace('\n', " ");
    let from = readme.find("Output is `-o/--output` on").expect("README says where -o is");
    let line = &readme[from..from + readme[from..].find(". ").unwrap_or(readme.len() - from)];
    for verb in [
        "apply",
        "assert",
        "export",
        "status",
        "frag",
        "plan",
        "validate",
        "agent",
        "controller",
        "generate-config",
        "checkpoint",
        "restore",
    ] {
        let help = gpupart(&[verb, "--help"], &[]).ok().stdout;
        let has = help.contains("-o, --output");
        assert_eq!(has, line.contains(&format!("`{verb}`")), "{verb}: -o {has}; README: {line}");
    }
}

/// Runs scripts/fuzz for one target with stand-ins for `cargo` (which "builds" a fuzz binary
/// whose body is `fuzzer`) under `CARGO_TARGET_DIR`; returns (exit code, stderr).
fn fuzz_with_stand_in(fuzzer: &str) -> (i32, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let target_dir = dir.path().join("elsewhere");
    let cargo = format!(
        "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --target ] && t=$2; shift; done\n\
         mkdir -p \"$CARGO_TARGET_DIR/$t/release\"\ncat > \"$CARGO_TARGET_DIR/$t/release/gpupart-fuzz\" <<'EOF'\n{fuzzer}\nEOF\n\
         chmod +x \"$CARGO_TARGET_DIR/$t/release/gpupart-fuzz\"\n"
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("cargo"), cargo).unwrap();
    std::fs::set_permissions(bin.join("cargo"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    // The target name is a throwaway so the real corpora and artifacts are not touched.
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fuzz"))
        .args(["1", "stand-in-target"])
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &target_dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(root.join("fuzz/corpus/stand-in-target"));
    let _ = std::fs::remove_dir_all(root.join("fuzz/artifacts/stand-in-target"));
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn the_fuzz_script_finds_its_binary_under_cargo_target_dir_and_reports_only_real_crashes() {
    let (code, out) =
        fuzz_with_stand_in("#!/bin/sh\necho 'stat::number_of_executed_units: 7'\necho 'cov: 3 ft: 1'\nexit 0");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("fuzz: stand-in-target: 7 executions"), "{out}");
    // A fuzzer that fails without saving an input is not a crash.
    let (code, out) = fuzz_with_stand_in("#!/bin/sh\necho 'cannot start' >&2\nexit 1");
    assert_ne!(code, 0);
    assert!(out.contains("did not run") && !out.contains("found a crash"), "{out}");
}

#[test]
fn plan_errors_mention_todays_layouts_only_when_given() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.yaml");
    // Valid input the planner refuses: 9 GPUs per replica on nodes of 8.
    std::fs::write(
        &f,
        "fleet:\n  - {name: a, count: 2, gpu: A100-SXM4-80GB, gpus: 8}\ndemand:\n  - {name: tp, gpus: 9}\n",
    )
    .unwrap();
    let r = gpupart(&["plan", "-f", f.to_str().unwrap()], &[]).failed();
    assert!(r.stderr.contains("needs 9 GPUs on one node"), "{}", r.stderr);
    assert!(!r.stderr.contains("today's layouts"), "{}", r.stderr);
    let today = dir.path().join("today.json");
    std::fs::write(&today, "{}").unwrap();
    let r = gpupart(&["plan", "-f", f.to_str().unwrap(), "--current", today.to_str().unwrap()], &[]).failed();
    assert!(r.stderr.contains("for today's layouts"), "{}", r.stderr);
}

#[test]
fn user_docs_describe_the_product_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    // The prose pages (pictures live in docs/pictures/).
    files.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap().to_lowercase();
        for phrase in ["the issue", "closing note", "sitting", "issue #"] {
            assert!(!text.contains(phrase), "{} speaks of `{phrase}`", f.display());
        }
    }
}

#[test]
fn a_large_plan_says_what_it_is_doing() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.yaml");
    std::fs::write(&f, "fleet:\n  - {name: a, count: 1000, gpu: A100-SXM4-80GB, gpus: 8}\ndemand:\n  - {name: e, profile: 1g.10gb, replicas: 5000}\n").unwrap();
    let r = gpupart(&["plan", "-f", f.to_str().unwrap()], &[("RUST_LOG", "info")]).ok();
    for phase in ["choosing pools", "packing MIG instances", "assigning pools to nodes", "writing the report"] {
        assert!(r.stderr.contains(phase), "no progress line for `{phase}`:\n{}", r.stderr);
    }
}

#[test]
fn the_changelog_and_docs_speak_of_this_version() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).expect("a CHANGELOG.md");
    assert!(changelog.contains(&format!("## {} ", env!("CARGO_PKG_VERSION"))), "no entry for this version");
    let metrics = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    assert!(!metrics.contains("in 0.2"), "docs/metrics.md names a version after this one");
}
