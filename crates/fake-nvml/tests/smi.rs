//! `fake-nvidia-smi` takes what the real `-i` takes (index, UUID, serial, PCI bus id in any form,
//! comma-separated lists) for `--gpu-reset`, `-L` and `-q`, and prints what scripts parse.

use gpupart_mig::sim::{parse_spec, store, SimState};
use std::process::Command;

fn smi(state: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_fake-nvidia-smi")).args(args).env("FAKE_NVML_STATE", state).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn node(dir: &tempfile::TempDir, spec: &str) -> (std::path::PathBuf, SimState) {
    let path = dir.path().join("state.json");
    let s = SimState::new(&parse_spec(spec).unwrap());
    store::save(&path, &s).unwrap();
    (path, s)
}

#[test]
fn list_and_query_take_every_id_form() {
    let dir = tempfile::tempdir().unwrap();
    let (path, s) = node(&dir, "A100-SXM4-80GB:3");
    let (code, out, _) = smi(&path, &["-L"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.starts_with(&format!("GPU 0: NVIDIA A100-SXM4-80GB (UUID: {})", s.gpus[0].uuid)), "{out}");
    let bus = &s.gpus[1].bus_id;
    let short = bus[9..].to_lowercase();
    let ids = format!("2,{},{short}", s.gpus[0].uuid);
    let (code, out, _) = smi(&path, &["-L", "-i", &ids]);
    assert_eq!(code, 0);
    let firsts: Vec<&str> = out.lines().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(firsts, ["GPU 2", "GPU 0", "GPU 1"], "{out}");
    let (code, out, _) = smi(&path, &["-q", "-i", &bus[4..]]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("GPU {bus}")) && out.contains("Serial Number") && out.contains("MIG Mode"), "{out}");
    let serial = out.lines().find(|l| l.contains("Serial Number")).unwrap().rsplit(' ').next().unwrap().to_string();
    let (code, out, _) = smi(&path, &["-L", "-i", &serial]);
    assert_eq!((code, out.lines().count()), (0, 1), "{out}");
    let (code, _, err) = smi(&path, &["-L", "-i", "0,0000:99:00.0"]);
    assert_eq!(code, 6);
    assert!(err.contains("No devices were found matching 0000:99:00.0"), "{err}");
    let (code, _, err) = smi(&path, &["--bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("usage"), "{err}");
}

#[test]
fn reset_takes_a_comma_separated_list_and_changes_nothing_when_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut s) = node(&dir, "A100-SXM4-80GB:3");
    for g in &mut s.gpus {
        g.mig_mode.pending = true;
    }
    store::save(&path, &s).unwrap();
    let list = format!("{},{}", s.gpus[0].bus_id, s.gpus[2].bus_id);
    let (code, out, err) = smi(&path, &["--gpu-reset", "-i", &list]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("All done."), "{out}");
    let after = store::load(&path).unwrap();
    assert_eq!(after.gpus.iter().map(|g| g.mig_mode.current).collect::<Vec<_>>(), [true, false, true]);
    // One unknown id: nothing is reset.
    let (code, _, err) = smi(&path, &["--gpu-reset", "-i", "1,7"]);
    assert_eq!(code, 3);
    assert!(err.contains("No devices were found matching 7"), "{err}");
    assert!(!store::load(&path).unwrap().gpus[1].mig_mode.current);
}
