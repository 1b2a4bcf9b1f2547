use super::ops::Activation;
use super::*;
use crate::catalog;
use crate::sim::state::SimProcess;
use crate::Placement;

fn node(spec: &str) -> SimState {
    SimState::new(&crate::sim::parse_spec(spec).unwrap())
}

fn proc(pid: u32) -> SimProcess {
    SimProcess { pid, name: "python".into(), used_memory_mib: 100 }
}

#[test]
fn ampere_mode_is_pending_until_reset_hopper_is_immediate() {
    let mut s = node("A100-SXM4-80GB:1,H100-SXM5-80GB:1,V100-SXM2-16GB:1");
    assert_eq!(s.set_mig_mode(0, true).unwrap(), Activation::PendingReset);
    assert_eq!(s.gpus[0].mig_mode, MigModeState { current: false, pending: true });
    assert_eq!(s.create_gpu_instance(0, 19, None).unwrap_err().code, NvmlCode::NotSupported);
    s.reset(0).unwrap();
    assert!(s.gpus[0].mig_mode.current);
    assert_eq!(s.set_mig_mode(1, true).unwrap(), Activation::Done);
    assert!(s.gpus[1].mig_mode.current);
    assert_eq!(s.set_mig_mode(2, true).unwrap_err().code, NvmlCode::NotSupported);
}

#[test]
fn reset_and_hopper_mode_change_refuse_busy_gpus() {
    let mut s = node("A100-SXM4-40GB:1,H100-SXM5-80GB:1");
    s.gpus[0].processes.push(proc(7));
    s.set_mig_mode(0, true).unwrap();
    assert_eq!(s.reset(0).unwrap_err().code, NvmlCode::InUse);
    assert!(!s.gpus[0].mig_mode.current);
    s.gpus[1].processes.push(proc(8));
    assert_eq!(s.set_mig_mode(1, true).unwrap(), Activation::InUse);
    assert!(!s.gpus[1].mig_mode.current);
}

#[test]
fn placements_counts_and_overlap_follow_driver_rules() {
    let mut s = node("A100-SXM4-80GB:1");
    s.set_mig_mode(0, true).unwrap();
    s.reset(0).unwrap();
    let t = catalog::lookup("A100-SXM4-80GB").unwrap().profile_table();
    let three = t.resolve(&"3g.40gb".parse().unwrap()).unwrap().0.id;
    let one = t.resolve(&"1g.10gb".parse().unwrap()).unwrap().0.id;
    let e = s.create_gpu_instance(0, three, Some(Placement::new(2, 4))).unwrap_err();
    assert_eq!(e.code, NvmlCode::InvalidArgument);
    let gi = s.create_gpu_instance(0, three, Some(Placement::new(4, 4))).unwrap();
    let e = s.create_gpu_instance(0, one, Some(Placement::new(5, 1))).unwrap_err();
    assert_eq!(e.code, NvmlCode::InsufficientResources);
    assert_eq!(s.create_gpu_instance(0, 999, None).unwrap_err().code, NvmlCode::InvalidArgument);
    // CI: default full CI, then a second full CI does not fit.
    let ci = s.create_compute_instance(0, gi, 2, None).unwrap();
    assert_eq!(ci, 0);
    assert!(s.gpus[0].gpu_instances[0].compute_instances[0].uuid.starts_with("MIG-"));
    assert_eq!(s.create_compute_instance(0, gi, 0, None).unwrap_err().code, NvmlCode::InsufficientResources);
    // Destroy order: GI with a CI is IN_USE.
    assert_eq!(s.destroy_gpu_instance(0, gi).unwrap_err().code, NvmlCode::InUse);
    s.gpus[0].gpu_instances[0].compute_instances[0].processes.push(proc(42));
    assert_eq!(s.destroy_compute_instance(0, gi, ci).unwrap_err().code, NvmlCode::InUse);
    s.gpus[0].gpu_instances[0].compute_instances[0].processes.clear();
    s.destroy_compute_instance(0, gi, ci).unwrap();
    s.destroy_gpu_instance(0, gi).unwrap();
    assert_eq!(s.destroy_gpu_instance(0, gi).unwrap_err().code, NvmlCode::NotFound);
    assert!(s.validate().is_ok());
}

#[test]
fn automatic_placement_and_instance_count() {
    let mut s = node("H100-SXM5-80GB:1");
    s.set_mig_mode(0, true).unwrap();
    for _ in 0..7 {
        s.create_gpu_instance(0, 19, None).unwrap();
    }
    assert_eq!(s.create_gpu_instance(0, 19, None).unwrap_err().code, NvmlCode::InsufficientResources);
    let mut ids: Vec<u32> = s.gpus[0].gpu_instances.iter().map(|g| g.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 7);
}

#[test]
fn disabling_mig_with_instances_is_in_use() {
    let mut s = node("H100-SXM5-80GB:1");
    s.set_mig_mode(0, true).unwrap();
    s.create_gpu_instance(0, 0, None).unwrap();
    assert_eq!(s.set_mig_mode(0, false).unwrap(), Activation::InUse);
    assert!(s.gpus[0].mig_mode.current);
}

#[test]
fn state_round_trips_through_json_and_rejects_inconsistency() {
    let mut s = node("A30-24GB:2");
    s.set_mig_mode(0, true).unwrap();
    s.reset(0).unwrap();
    s.create_gpu_instance(0, 5, Some(Placement::new(0, 2))).unwrap();
    let dir = std::env::temp_dir().join(format!("gpupart-mig-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    store::save(&path, &s).unwrap();
    assert_eq!(store::load(&path).unwrap(), s);
    let mut bad = s.clone();
    let dup = bad.gpus[0].gpu_instances[0].clone();
    bad.gpus[0].gpu_instances.push(dup);
    store::save(&path, &bad).unwrap();
    let e = store::load(&path).unwrap_err().to_string();
    assert!(e.contains("gpus[0]"), "{e}");
    std::fs::write(&path, "{\"version\":1,\"gpus\":[],\"extra\":1}").unwrap();
    assert!(store::load(&path).unwrap_err().to_string().contains("extra"));
    std::fs::remove_dir_all(&dir).unwrap();
}
