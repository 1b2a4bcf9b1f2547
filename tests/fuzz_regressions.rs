//! Replays the fuzz seeds and every input that ever crashed a fuzz target (fuzz/regressions/)
//! through the targets' functions: none may panic. `scripts/fuzz` does the fuzzing itself.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.path().display().to_string(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    out
}

#[test]
fn seeds_and_regressions_never_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, target) in gpupart::fuzzing::TARGETS {
        let seeds = inputs(&root.join("seeds").join(name));
        assert!(!seeds.is_empty(), "fuzz target {name} has no seeds in fuzz/seeds/{name}");
        for (path, data) in seeds.iter().chain(inputs(&root.join("regressions").join(name)).iter()) {
            let r = std::panic::catch_unwind(|| target(data));
            assert!(r.is_ok(), "fuzz target {name} panicked on {path}");
            replayed += 1;
        }
    }
    assert!(replayed >= gpupart::fuzzing::TARGETS.len());
}

#[test]
fn nvidia_reference_files_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/nvidia-configs");
    let files = inputs(&dir);
    assert!(!files.is_empty(), "{} missing", dir.display());
    for (path, data) in &files {
        gpupart::fuzzing::config(data);
        gpupart::fuzzing::hooks(data);
        let mut label = b"all-balanced\n".to_vec();
        label.extend_from_slice(data);
        gpupart::fuzzing::layout_label(&label);
        let _ = path;
    }
}
