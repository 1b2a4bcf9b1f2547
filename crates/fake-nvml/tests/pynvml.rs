//! Fidelity check with NVIDIA's own Python binding: nvidia-ml-py loads the fake as
//! `libnvidia-ml.so.1` and must see the catalog's devices, profiles, placements and driver rules.

use gpupart_mig::catalog;
use gpupart_mig::sim::{parse_spec, SimState};
use serde_json::json;
use std::process::Command;

mod common;
use common::fake_library;

#[test]
fn nvidia_ml_py_sees_the_catalog() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_pynvml = Command::new(&python).args(["-c", "import pynvml"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(has_pynvml, "nvidia-ml-py is not installed for {python} (pip install nvidia-ml-py; scripts/test does)");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(fake_library(), dir.path().join("libnvidia-ml.so.1")).unwrap();
    let spec = "A100-SXM4-80GB:1,H100-SXM5-80GB:1,A30-24GB:1,V100-SXM2-16GB:1";
    let state = SimState::new(&parse_spec(spec).unwrap());
    let gpus: Vec<_> = state
        .gpus
        .iter()
        .map(|g| {
            let m = catalog::lookup(&g.model).unwrap();
            let t = m.profile_table();
            let profiles: Vec<_> = t
                .profiles
                .iter()
                .map(|p| {
                    json!({
                        "index": p.index, "id": p.id, "name": p.name.to_string(), "slices": p.slices,
                        "memory_slices": p.memory_slices, "instance_count": p.instance_count,
                        "memory_mib": p.memory_mib, "multiprocessors": p.multiprocessors,
                        "copy_engines": p.engines.copy_engines, "decoders": p.engines.decoders,
                        "encoders": p.engines.encoders, "jpeg": p.engines.jpeg, "ofa": p.engines.ofa,
                        "placements": p.placements.iter().map(|pl| [pl.start, pl.size]).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "model": m.id, "nvml_name": m.nvml_name, "pci_device_id": m.pci_device_id,
                "bus_id": g.bus_id, "memory_bytes": m.memory_bytes(), "profiles": profiles,
                "needs_reset": m.arch.mig_mode_needs_reset(), "compute_slices": t.compute_slices,
            })
        })
        .collect();
    let expect = dir.path().join("expect.json");
    std::fs::write(&expect, serde_json::to_string(&json!({ "gpus": gpus })).unwrap()).unwrap();
    let out = Command::new(&python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pynvml_fidelity.py"))
        .env("LD_LIBRARY_PATH", dir.path())
        .env("FAKE_NVML_STATE", dir.path().join("state.json"))
        .env("FAKE_NVML_GPUS", spec)
        .env("EXPECT_JSON", &expect)
        .env("FAKE_NVIDIA_SMI", env!("CARGO_BIN_EXE_fake-nvidia-smi"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("passed, 0 failed"), "{stdout}");
    println!("{stdout}");
}
