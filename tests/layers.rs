//! The crates' layering holds: the node and cluster libraries pull in no Kubernetes client, RPC,
//! HTTP server or CLI crate, and no module imports its way back to itself
//! (`scripts/import-cycles`, which this test also shows finding a cycle).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crates `cargo tree -e normal -p <package>` lists (names only).
fn normal_dependencies(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-e", "normal", "--prefix", "none", "-p", package])
        .current_dir(root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

const EFFECTS: &[&str] = &["kube", "kube-client", "kube-runtime", "tonic", "axum", "hyper", "clap", "tokio"];

#[test]
fn the_node_library_has_no_kubernetes_rpc_http_cli_or_runtime() {
    let deps = normal_dependencies("gpupart-node");
    assert!(deps.contains(&"nvml-wrapper".to_string()), "the listing is real: {deps:?}");
    for e in EFFECTS.iter().chain(&["k8s-openapi", "gpupart-cluster"]) {
        assert!(!deps.iter().any(|d| d == e), "gpupart-node depends on {e}: {deps:?}");
    }
}

#[test]
fn the_cluster_library_has_no_kubernetes_client_rpc_http_cli_or_runtime() {
    let deps = normal_dependencies("gpupart-cluster");
    assert!(deps.contains(&"gpupart-node".to_string()), "the listing is real: {deps:?}");
    for e in EFFECTS {
        assert!(!deps.iter().any(|d| d == e), "gpupart-cluster depends on {e}: {deps:?}");
    }
}

fn import_cycles(crate_dir: &Path) -> (bool, String) {
    let out = Command::new("python3")
        .arg(root().join("scripts/import-cycles"))
        .arg(crate_dir)
        .output()
        .expect("python3 runs scripts/import-cycles");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn no_module_of_any_crate_imports_its_way_back() {
    let (ok, report) = import_cycles(&root());
    assert!(ok, "{report}");
    for c in ["crates/mig", "crates/node", "crates/cluster", "crates/fake-nvml", "crates/fake-mps"] {
        let (ok, report) = import_cycles(&root().join(c));
        assert!(ok, "{c}: {report}");
    }
}

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

#[test]
fn the_cycle_check_finds_cycles_between_siblings_and_through_a_parent() {
    let dir = tempfile::tempdir().unwrap();
    // Two siblings importing each other, one through a `use` tree, one inline.
    write(
        dir.path(),
        &[
            ("src/lib.rs", "mod report;\nmod render;\n"),
            ("src/report.rs", "use crate::{render::{self, Text}};\npub struct Doc;\n"),
            ("src/render.rs", "pub struct Text;\nfn f(_: crate::report::Doc) {}\n"),
        ],
    );
    let (ok, report) = import_cycles(dir.path());
    assert!(!ok && report.contains("crate::render <-> crate::report"), "{report}");

    // A parent whose code calls a child that uses the parent's items is a cycle; a parent that
    // only declares and re-exports its children, a test module using `super::*`, and paths in
    // comments and strings are not.
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            ("src/lib.rs", "pub mod backend;\n"),
            (
                "src/backend/mod.rs",
                "mod sim;\npub use sim::Sim;\npub trait Gpu {}\npub fn open() -> sim::Sim { sim::Sim }\n",
            ),
            ("src/backend/sim.rs", "pub struct Sim;\nimpl super::Gpu for Sim {}\n"),
        ],
    );
    let (ok, report) = import_cycles(dir.path());
    assert!(!ok && report.contains("crate::backend <-> crate::backend::sim"), "{report}");
    write(
        dir.path(),
        &[
            ("src/backend/mod.rs", "mod sim;\npub use sim::Sim;\npub trait Gpu {}\n// sim::Sim is made in open.rs\nconst S: &str = \"sim::Sim\";\n"),
            ("src/backend/sim.rs", "pub struct Sim;\nimpl super::Gpu for Sim {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"),
        ],
    );
    let (ok, report) = import_cycles(dir.path());
    assert!(ok, "{report}");
}
