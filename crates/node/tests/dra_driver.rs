//! The DRA plugin's node side on the simulator: Prepare creates exactly the allocated placement
//! and a CDI spec, is idempotent, rolls back on an NVML fault; Unprepare refuses a busy device
//! and is idempotent; a restart adopts, rolls back or finishes what the checkpoint lists and
//! never touches another instance; MIG mode follows whole-GPU claims and comes back.

use gpupart_node::backend::sim::SimBackend;
use gpupart_node::backend::GpuBackend;
use gpupart_node::dra::checkpoint::{ClaimState, PreparedDevice};
use gpupart_node::dra::devices::{DeviceKind, DeviceRef};
use gpupart_node::dra::driver::{AllocatedDevice, ClaimToPrepare, Driver, DriverConfig, Reason};
use gpupart_node::mig::sim::fault::Faults;
use gpupart_node::mig::sim::SimProcess;
use gpupart_node::mig::{Placement, ProfileTable};

struct Rig {
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Capability minors as the driver lists them: gpu<minor>/gi<id>/access, …/ci<id>/access.
        let mut minors = String::from("config 1\nmonitor 2\n");
        for g in 0..2 {
            for gi in 0..15 {
                minors.push_str(&format!("gpu{g}/gi{gi}/access {}\n", 100 * (g + 1) + gi * 2));
                minors.push_str(&format!("gpu{g}/gi{gi}/ci0/access {}\n", 100 * (g + 1) + gi * 2 + 1));
            }
        }
        std::fs::write(dir.path().join("mig-minors"), minors).unwrap();
        Self { dir }
    }

    fn cfg(&self) -> DriverConfig {
        DriverConfig {
            pool: "node-a".into(),
            cdi_dir: self.dir.path().join("cdi"),
            mig_minors: self.dir.path().join("mig-minors"),
            state_dir: self.dir.path().join("state"),
        }
    }

    fn driver(&self) -> Driver {
        Driver::open(self.cfg()).expect("checkpoint")
    }

    fn cdi(&self, uid: &str) -> Option<serde_json::Value> {
        let p = self.dir.path().join("cdi").join(format!("k8s.gpu.gpupart.io-claim_{uid}.json"));
        std::fs::read_to_string(p).ok().map(|t| serde_json::from_str(&t).unwrap())
    }
}

fn node() -> SimBackend {
    let b = SimBackend::open(Some("A100-SXM4-80GB:2"), None).unwrap();
    for g in 0..2 {
        b.set_mig_mode(g, true).unwrap();
        b.reset_gpu(g).unwrap();
    }
    b
}

fn table(b: &SimBackend) -> ProfileTable {
    b.observe(0).unwrap().profiles
}

fn mig_name(b: &SimBackend, gpu: u32, profile: &str, start: u32) -> String {
    let t = table(b);
    let p = t.profiles.iter().find(|p| p.name.to_string() == profile).unwrap();
    DeviceRef { gpu, kind: DeviceKind::Mig { profile_id: p.id, placement: Placement::new(start, p.memory_slices) } }
        .name(&t)
}

fn claim(uid: &str, devices: &[&str]) -> ClaimToPrepare {
    ClaimToPrepare {
        uid: uid.into(),
        namespace: "ml".into(),
        name: format!("claim-{uid}"),
        devices: devices.iter().map(|d| AllocatedDevice::whole("gpu", "node-a", d)).collect(),
        share_config: None,
    }
}

/// (profile, start) of every GPU instance of GPU `g`.
fn instances(b: &SimBackend, g: u32) -> Vec<(String, u32)> {
    let s = b.observe(g).unwrap();
    let mut v: Vec<(String, u32)> = s.instances.iter().map(|i| (s.gi_name(i), i.placement.start)).collect();
    v.sort();
    v
}

#[test]
fn prepare_creates_exactly_the_allocated_placement_with_a_cdi_spec() {
    let (rig, b) = (Rig::new(), node());
    let mut d = rig.driver();
    let dev = mig_name(&b, 1, "3g.40gb", 4);
    let got = d.prepare(&b, &claim("u1", &[&dev])).expect("prepared");
    assert_eq!(instances(&b, 1), vec![("3g.40gb".to_string(), 4)]);
    assert!(instances(&b, 0).is_empty());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].device, dev);
    assert_eq!(got[0].cdi_ids, vec![format!("k8s.gpu.gpupart.io/claim=u1-{dev}")]);
    let spec = rig.cdi("u1").expect("a CDI spec");
    assert_eq!(spec["kind"], "k8s.gpu.gpupart.io/claim");
    let device = &spec["devices"][0];
    assert_eq!(device["name"], format!("u1-{dev}"));
    let mig_uuid = b.observe(1).unwrap().instances[0].cis[0].uuid.clone();
    assert_eq!(device["containerEdits"]["env"][0], format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}"));
    let nodes: Vec<&str> = device["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    let gi = b.observe(1).unwrap().instances[0].id;
    assert_eq!(
        nodes,
        vec![
            "/dev/nvidia1".to_string(),
            format!("/dev/nvidia-caps/nvidia-cap{}", 200 + gi * 2),
            format!("/dev/nvidia-caps/nvidia-cap{}", 200 + gi * 2 + 1)
        ]
    );
    let common: Vec<&str> =
        spec["containerEdits"]["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap()).collect();
    assert_eq!(common, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]);
    // Idempotent: the same answer, nothing created.
    assert_eq!(d.prepare(&b, &claim("u1", &[&dev])).unwrap(), got);
    assert_eq!(instances(&b, 1).len(), 1);
    // The checkpoint survives a restart.
    let d2 = rig.driver();
    assert!(d2.is_prepared("u1"));
}

#[test]
fn bad_allocations_are_refused_naming_the_claim_and_create_nothing() {
    let (rig, b) = (Rig::new(), node());
    let mut d = rig.driver();
    let ok = mig_name(&b, 0, "1g.10gb", 0);
    let mut other_pool = claim("u2", &[&ok]);
    other_pool.devices[0].pool = "node-b".into();
    let e = d.prepare(&b, &other_pool).unwrap_err();
    assert_eq!(e.reason, Reason::UnknownDevice);
    assert!(e.to_string().starts_with("claim ml/claim-u2: device gpu-0-mig-1g-10gb"), "{e}");
    for bad in ["gpu-9-mig-1g-10gb-19-0", "gpu-0-mig-2g-20gb-14-1", "nonsense"] {
        let e = d.prepare(&b, &claim("u3", &[bad])).unwrap_err();
        assert_eq!(e.reason, Reason::UnknownDevice, "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
    let e = d.prepare(&b, &claim("u4", &[])).unwrap_err();
    assert_eq!(e.reason, Reason::UnknownDevice);
    // An occupied placement (another claim's) is refused.
    d.prepare(&b, &claim("u5", &[&mig_name(&b, 0, "4g.40gb", 0)])).unwrap();
    let e = d.prepare(&b, &claim("u6", &[&ok])).unwrap_err();
    assert_eq!(e.reason, Reason::Occupied);
    assert!(e.to_string().contains("taken by claim ml/claim-u5"), "{e}");
    assert_eq!(instances(&b, 0), vec![("4g.40gb".to_string(), 0)]);
    assert!(!d.checkpoint().claims.contains_key("u6") && rig.cdi("u6").is_none());
}

#[test]
fn an_nvml_fault_rolls_back_what_the_claim_made() {
    let rig = Rig::new();
    let b = node()
        .with_faults(Faults::parse("nvmlGpuInstanceCreateComputeInstanceWithPlacement:2:NVML_ERROR_UNKNOWN").unwrap());
    let mut d = rig.driver();
    let (a, c) = (mig_name(&b, 0, "3g.40gb", 0), mig_name(&b, 0, "3g.40gb", 4));
    let e = d.prepare(&b, &claim("u1", &[&a, &c])).unwrap_err();
    assert_eq!(e.reason, Reason::Nvml);
    assert!(
        e.to_string().contains("GPU 0")
            && e.to_string().contains("placement 4..8")
            && e.to_string().contains("NVML_ERROR_UNKNOWN"),
        "{e}"
    );
    assert!(instances(&b, 0).is_empty(), "nothing of the claim is left: {:?}", instances(&b, 0));
    assert!(d.checkpoint().claims.is_empty() && rig.cdi("u1").is_none());
    // The kubelet retries: it works now.
    d.prepare(&b, &claim("u1", &[&a, &c])).expect("the retry works");
    assert_eq!(instances(&b, 0).len(), 2);
}

fn attach(b: &SimBackend, gpu: usize) -> SimBackend {
    let mut state = b.snapshot();
    state.gpus[gpu].gpu_instances[0].compute_instances[0].processes.push(SimProcess {
        pid: 777,
        name: "vllm".into(),
        used_memory_mib: 1,
    });
    SimBackend::new(state, None)
}

#[test]
fn unprepare_refuses_a_busy_device_then_destroys_it() {
    let rig = Rig::new();
    let b = node();
    let mut d = rig.driver();
    d.prepare(&b, &claim("u1", &[&mig_name(&b, 0, "2g.20gb", 2)])).unwrap();
    let busy = attach(&b, 0);
    let e = d.unprepare(&busy, "u1").unwrap_err();
    assert_eq!(e.reason, Reason::Busy);
    assert!(e.to_string().contains("pids 777"), "{e}");
    assert_eq!(instances(&busy, 0).len(), 1, "never destroyed while busy");
    // The process ended (the original backend has none): done, and done again.
    d.unprepare(&b, "u1").expect("unprepared");
    assert!(instances(&b, 0).is_empty() && rig.cdi("u1").is_none() && !d.is_prepared("u1"));
    d.unprepare(&b, "u1").expect("idempotent");
    d.unprepare(&b, "never-seen").expect("a claim never prepared is done");
}

#[test]
fn a_restart_rolls_back_half_prepared_claims_and_never_touches_foreign_instances() {
    let rig = Rig::new();
    let b = node();
    // A foreign instance (made by hand) and a prepared claim.
    let t = table(&b);
    let one = t.profiles.iter().find(|p| p.name.to_string() == "1g.10gb").unwrap();
    let foreign = b.create_gpu_instance(1, one.id, Placement::new(6, 1)).unwrap();
    b.create_compute_instance(1, foreign, one.ci_with_slices(1).unwrap().id, Placement::new(0, 1)).unwrap();
    let mut d = rig.driver();
    d.prepare(&b, &claim("kept", &[&mig_name(&b, 0, "3g.40gb", 4)])).unwrap();
    // A claim killed mid-Prepare: recorded as preparing, its GI made but not recorded.
    let half = mig_name(&b, 1, "4g.40gb", 0);
    let four = t.profiles.iter().find(|p| p.name.to_string() == "4g.40gb").unwrap();
    b.create_gpu_instance(1, four.id, Placement::new(0, 4)).unwrap();
    let mut cp = d.checkpoint().clone();
    cp.claims.insert(
        "half".into(),
        gpupart_node::dra::checkpoint::ClaimEntry {
            namespace: "ml".into(),
            name: "half".into(),
            state: ClaimState::Preparing,
            devices: vec![PreparedDevice {
                requests: vec!["gpu".into()],
                pool: "node-a".into(),
                device: half,
                gpu: 1,
                gpu_uuid: b.observe(1).unwrap().info.uuid,
                kind: DeviceKind::Mig { profile_id: four.id, placement: Placement::new(0, 4) },
                gi: None,
                ci: None,
                uuid: None,
                share: None,
            }],
        },
    );
    cp.save(&rig.cfg().state_dir.join("checkpoint.json")).unwrap();
    let mut restarted = rig.driver();
    let report = restarted.start(&b).unwrap();
    assert_eq!((report.adopted, report.rolled_back, report.forgotten), (1, 1, 0));
    assert_eq!(instances(&b, 1), vec![("1g.10gb".to_string(), 6)], "the half-made 4g is gone, the foreign 1g stays");
    assert_eq!(instances(&b, 0), vec![("3g.40gb".to_string(), 4)], "the prepared claim is adopted");
    assert!(restarted.is_prepared("kept") && !restarted.checkpoint().claims.contains_key("half"));
    // The foreign instance's placements are never offered, and preparing over it is refused.
    let views = restarted.views(&b.observe_all().unwrap(), &[]);
    let offered = gpupart_node::dra::order::order(&views);
    assert!(offered.iter().all(|o| match o.kind {
        DeviceKind::Mig { placement, .. } => o.gpu != 1 || !placement.overlaps(Placement::new(6, 1)),
        DeviceKind::Gpu => o.gpu != 1 && o.gpu != 0,
        DeviceKind::Mps => false,
    }));
    let e = restarted.prepare(&b, &claim("over", &[&mig_name(&b, 1, "3g.40gb", 4)])).unwrap_err();
    assert_eq!(e.reason, Reason::Occupied);
    assert!(e.to_string().contains("GPU instance"), "{e}");
}

#[test]
fn an_instance_that_vanished_is_forgotten_at_start() {
    let rig = Rig::new();
    let b = node();
    let mut d = rig.driver();
    d.prepare(&b, &claim("u1", &[&mig_name(&b, 0, "1g.10gb", 3)])).unwrap();
    let gi = b.observe(0).unwrap().instances[0].clone();
    b.destroy_compute_instance(0, gi.id, gi.cis[0].id).unwrap();
    b.destroy_gpu_instance(0, gi.id).unwrap();
    let mut restarted = rig.driver();
    let report = restarted.start(&b).unwrap();
    assert_eq!((report.adopted, report.forgotten), (0, 1));
    assert!(restarted.checkpoint().claims.is_empty() && rig.cdi("u1").is_none());
}

#[test]
fn a_whole_gpu_claim_switches_mig_off_and_the_gpu_returns_to_mig_after() {
    let rig = Rig::new();
    let b = node();
    let mut d = rig.driver();
    let whole = DeviceRef { gpu: 1, kind: DeviceKind::Gpu }.name(&table(&b));
    let got = d.prepare(&b, &claim("w", &[&whole])).unwrap();
    assert!(!b.observe(1).unwrap().mig_mode.current, "MIG off for a whole GPU");
    let spec = rig.cdi("w").unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"][0],
        format!("NVIDIA_VISIBLE_DEVICES={}", b.observe(1).unwrap().info.uuid)
    );
    assert_eq!(got[0].device, "gpu-1");
    // A MIG device on that GPU is refused while it is held whole.
    let e = d.prepare(&b, &claim("m", &[&mig_name(&b, 1, "1g.10gb", 0)])).unwrap_err();
    assert_eq!(e.reason, Reason::Occupied);
    d.unprepare(&b, "w").unwrap();
    assert!(b.observe(1).unwrap().mig_mode.current, "back in MIG mode");
    // A whole GPU a claim's MIG device is on, or holding someone else's instance, is refused.
    d.prepare(&b, &claim("m", &[&mig_name(&b, 0, "1g.10gb", 0)])).unwrap();
    let e = d.prepare(&b, &claim("w0", &["gpu-0"])).unwrap_err();
    assert_eq!(e.reason, Reason::Occupied);
    assert!(e.to_string().contains("taken by claim ml/claim-m"), "{e}");
    let one = table(&b).profiles.iter().find(|p| p.name.to_string() == "1g.10gb").unwrap().id;
    b.create_gpu_instance(1, one, Placement::new(3, 1)).unwrap();
    let e = d.prepare(&b, &claim("w1", &["gpu-1"])).unwrap_err();
    assert_eq!(e.reason, Reason::Occupied);
    assert!(e.to_string().contains("holds 1 MIG instance"), "{e}");
}

#[test]
fn the_checkpoint_file_is_owner_only() {
    let rig = Rig::new();
    let b = node();
    let mut d = rig.driver();
    d.prepare(&b, &claim("u1", &[&mig_name(&b, 0, "1g.10gb", 0)])).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(rig.cfg().state_dir.join("checkpoint.json")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}
