//! The container image: the Dockerfile's build stage compiles from exactly what its COPY lines
//! bring into the build context (so a new source directory cannot be left out), and every place
//! that names the image names the same one.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The build stage's `COPY SRC… DEST` lines (those without `--from`), as (sources, destination).
fn build_stage_copies(dockerfile: &str) -> Vec<(Vec<String>, String)> {
    dockerfile
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|rest| !rest.trim_start().starts_with("--"))
        .map(|rest| {
            let mut words: Vec<String> = rest.split_whitespace().map(String::from).collect();
            let dest = words.pop().expect("COPY with a destination");
            (words, dest)
        })
        .collect()
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

#[test]
fn the_dockerfile_copy_set_builds_on_its_own() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let copies = build_stage_copies(&dockerfile);
    assert!(!copies.is_empty(), "no COPY line in the build stage");
    let ctx = tempfile::tempdir().unwrap();
    for (sources, dest) in &copies {
        for src in sources {
            let from = repo().join(src);
            assert!(from.exists(), "Dockerfile copies {src}, which does not exist");
            let to = if dest.ends_with('/') || sources.len() > 1 {
                ctx.path().join(dest).join(Path::new(src).file_name().unwrap())
            } else {
                ctx.path().join(dest)
            };
            copy_tree(&from, &to);
        }
    }
    // The image's build (scripts/release: `cargo zigbuild --release --locked -p gpupart`), type-checked (build
    // scripts run, every module compiled to metadata) with a target directory of its own.
    let target = repo().join("target").join("dockerfile-copy-set");
    let out = Command::new(env!("CARGO"))
        .args(["check", "--locked", "--quiet", "-p", "gpupart", "--bin", "gpupart"])
        .current_dir(ctx.path())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Dockerfile's COPY set does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_reference_names_the_same_image() {
    let want = format!("ghcr.io/gpupart/gpupart:{}", env!("CARGO_PKG_VERSION"));
    let mut files = vec![repo().join("Dockerfile"), repo().join("daemonset.yaml"), repo().join("README.md")];
    for dir in ["deploy", "docs"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    let mut seen = 0;
    for f in files.iter().filter(|f| f.is_file()) {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for word in line.split(|c: char| c.is_whitespace() || "`\"'=".contains(c)) {
                // An image reference: `…gpupart:<version>` with or without a registry.
                let tagged = word.match_indices("gpupart:").any(|(i, _)| {
                    word[i + "gpupart:".len()..].starts_with(|c: char| c.is_ascii_digit() || c == 'v' || c == 'l')
                });
                if tagged {
                    assert_eq!(
                        word.trim_end_matches(['.', ',', ')']),
                        want,
                        "{}:{} names another image",
                        f.display(),
                        n + 1
                    );
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= 3, "the Dockerfile and both manifests name the image ({seen} found)");
}
