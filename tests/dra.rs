//! `gpupart agent --dra` end to end: the real binary on the fake NVML, registered with the fake
//! DRA kubelet over real unix sockets, publishing to the API test server, with claims allocated
//! by the scheduler stand-in from what it published.

mod support;

use std::os::unix::fs::PermissionsExt;
use support::dra_rig::{DraRig, DRIVER, NODE};

/// Device name → its GPU index.
fn gpu_of(device: &str) -> u32 {
    device.trim_start_matches("gpu-").split('-').next().unwrap().parse().unwrap()
}

#[test]
fn registers_publishes_and_registers_again_when_its_socket_goes() {
    let rig = DraRig::start("A100-SXM4-80GB:2,T4-16GB:1");
    let info = rig.kubelet.wait_registered(1);
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    let endpoint = rig.path("plugins").join(DRIVER).join("dra.sock");
    assert_eq!(info.endpoint, endpoint.display().to_string());
    for sock in [endpoint.clone(), rig.path("plugins_registry").join(format!("{DRIVER}-reg.sock"))] {
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is owner-only", sock.display());
    }
    let slices = rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let generation = slices[0].1.pool.generation;
    for (name, s) in &slices {
        assert_eq!(s.driver, DRIVER);
        assert_eq!(s.node_name.as_deref(), Some(NODE));
        assert_eq!(s.pool.name, NODE);
        assert_eq!((s.pool.generation, s.pool.resource_slice_count), (generation, slices.len() as i64), "{name}");
        assert!(s.devices.is_empty() || s.shared_counters.is_empty(), "{name}: counters or devices");
        assert!(s.devices.len() <= 64 && s.shared_counters.len() <= 8, "{name}");
    }
    let sets: Vec<&str> = slices.iter().flat_map(|(_, s)| s.shared_counters.iter().map(|c| c.name.as_str())).collect();
    assert_eq!(sets, ["gpu-0-counter-set", "gpu-1-counter-set"], "one counter set per MIG GPU");
    let devices: Vec<_> = slices.iter().flat_map(|(_, s)| s.devices.iter()).collect();
    let t4 = devices.iter().find(|d| d.name == "gpu-2").expect("the T4 whole");
    assert!(t4.consumes_counters.is_empty());
    assert_eq!(t4.attributes["type"].string.as_deref(), Some("gpu"));
    let mig = devices.iter().find(|d| d.name.starts_with("gpu-0-mig-1g-10gb-")).expect("a 1g.10gb device");
    for a in [
        "profile",
        "parentUUID",
        "productName",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "placementStart",
        "placementSize",
    ] {
        assert!(mig.attributes.contains_key(a), "{a} missing: {:?}", mig.attributes);
    }
    assert_eq!(mig.attributes["architecture"].string.as_deref(), Some("Ampere"));
    assert_eq!(mig.attributes["cudaComputeCapability"].version.as_deref(), Some("8.0.0"));
    assert_eq!(mig.consumes_counters[0].counter_set, "gpu-0-counter-set");
    let slices_consumed: Vec<&String> =
        mig.consumes_counters[0].counters.keys().filter(|k| k.starts_with("memory-slice-")).collect();
    assert_eq!(slices_consumed.len(), 1);
    // Every placement of every profile on both A100s, plus three whole GPUs.
    let per_gpu = devices.iter().filter(|d| d.name.starts_with("gpu-0-mig-")).count();
    assert!(per_gpu >= 18, "{per_gpu}");
    assert_eq!(devices.len(), 2 * per_gpu + 3);

    // The kubelet cleans its registry (a restart): the plugin is served and registered again.
    std::fs::remove_file(rig.path("plugins_registry").join(format!("{DRIVER}-reg.sock"))).unwrap();
    rig.kubelet.wait_registered(2);
    assert!(rig.kubelet.seen().refused.is_empty());
}

#[test]
fn seven_small_claims_pack_onto_one_gpu_and_prepare_makes_exactly_them() {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let mut gpus = Vec::new();
    for i in 0..7 {
        let name = format!("small-{i}");
        rig.mig_claim(&name, "1g.10gb");
        let got = rig.schedule(&name).expect("allocated");
        let prepared = rig.prepare(&name).expect("prepared");
        assert_eq!(prepared.len(), 1);
        assert_eq!(prepared[0].0, got[0].device);
        assert_eq!(prepared[0].1, vec![format!("k8s.gpu.gpupart.io/claim=uid-{name}-{}", got[0].device)]);
        gpus.push(gpu_of(&got[0].device));
    }
    assert!(gpus.iter().all(|g| *g == gpus[0]), "all seven on one GPU: {gpus:?}");
    let other = 1 - gpus[0];
    let st = rig.node.status();
    assert_eq!(st["gpus"][gpus[0] as usize]["instances"].as_array().unwrap().len(), 7);
    assert!(st["gpus"][other as usize]["instances"].as_array().unwrap().is_empty());
    rig.wait_slices("the other GPU still whole", |s| {
        s.iter().any(|(_, x)| x.devices.iter().any(|d| d.name == format!("gpu-{other}")))
    });
    // A repeated Prepare answers the same and creates nothing.
    let again = rig.prepare("small-0").unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(rig.node.status()["gpus"][gpus[0] as usize]["instances"].as_array().unwrap().len(), 7);
    // CDI spec of a claim.
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rig.path("cdi").join("k8s.gpu.gpupart.io-claim_uid-small-0.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.gpupart.io/claim");
    assert!(spec["devices"][0]["containerEdits"]["env"][0]
        .as_str()
        .unwrap()
        .starts_with("NVIDIA_VISIBLE_DEVICES=MIG-"));
}

#[test]
fn a_busy_device_is_not_unprepared_until_its_process_ends() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("big", "3g.40gb");
    rig.schedule("big").unwrap();
    rig.prepare("big").unwrap();
    let gi = rig.node.load().gpus[0].gpu_instances[0].id;
    rig.node.attach(0, gi, 4321);
    let e = rig.unprepare("big");
    assert!(e.contains("ml/big") && e.contains("4321"), "{e}");
    assert_eq!(rig.node.load().gpus[0].gpu_instances.len(), 1, "never destroyed while busy");
    let mut s = rig.node.load();
    s.gpus[0].gpu_instances[0].compute_instances[0].processes.clear();
    rig.node.save(&s);
    assert_eq!(rig.unprepare("big"), "");
    assert!(rig.node.load().gpus[0].gpu_instances.is_empty());
    assert!(!rig.path("cdi").join("k8s.gpu.gpupart.io-claim_uid-big.json").exists());
    // Idempotent, and fine when the claim is gone from the API.
    rig.delete_claim("big");
    assert_eq!(rig.unprepare("big"), "");
}

#[test]
fn bad_claims_get_an_error_naming_them_and_create_nothing() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    // Not in the API at all.
    let e = rig.prepare("ghost").unwrap_err();
    assert!(e.contains("ml/ghost") && e.contains("reading the claim"), "{e}");
    // Allocated a device this node does not publish.
    rig.mig_claim("odd", "1g.10gb");
    let key = ("resourceclaims".to_string(), "ml".to_string(), "odd".to_string());
    let results =
        serde_json::json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-7-mig-1g-10gb-19-0"}]);
    rig.api.change(|s| {
        let mut c = s.objects.get(&key).cloned().unwrap();
        c["status"] = serde_json::json!({"allocation": {"devices": {"results": results}}});
        s.put(key.clone(), c);
    });
    let e = rig.prepare("odd").unwrap_err();
    assert!(e.contains("ml/odd") && e.contains("gpu-7-mig-1g-10gb-19-0"), "{e}");
    // Another driver's devices only.
    rig.mig_claim("theirs", "1g.10gb");
    let key = ("resourceclaims".to_string(), "ml".to_string(), "theirs".to_string());
    rig.api.change(|s| {
        let mut c = s.objects.get(&key).cloned().unwrap();
        c["status"] = serde_json::json!({"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"}]}}});
        s.put(key.clone(), c);
    });
    let e = rig.prepare("theirs").unwrap_err();
    assert!(e.contains("ml/theirs") && e.contains("gpu.nvidia.com"), "{e}");
    // The API cannot be reached.
    rig.mig_claim("later", "1g.10gb");
    rig.schedule("later").unwrap();
    rig.api.go_down();
    let e = rig.prepare("later").unwrap_err();
    assert!(e.contains("ml/later") && e.contains("reading the claim"), "{e}");
    assert!(rig.node.load().gpus[0].gpu_instances.is_empty(), "nothing created");
    rig.api.come_back();
    rig.prepare("later").expect("the kubelet's retry works");
}
