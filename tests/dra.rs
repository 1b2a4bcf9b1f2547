//! `gpupart agent --dra` end to end: the real binary on the fake NVML, registered with the fake
//! DRA kubelet over real unix sockets, publishing to the API test server, with claims allocated
//! by the scheduler stand-in from what it published.

mod support;

use std::os::unix::fs::PermissionsExt;
use support::dra_rig::{foreign_instance, DraRig, DRIVER, NODE};

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
    assert_eq!(
        sets,
        ["gpu-0-counter-set", "gpu-1-counter-set", "gpu-2-counter-set"],
        "one counter set per GPU (the T4's: its memory, whole or shared)"
    );
    let devices: Vec<_> = slices.iter().flat_map(|(_, s)| s.devices.iter()).collect();
    let t4 = devices.iter().find(|d| d.name == "gpu-2").expect("the T4 whole");
    assert_eq!(t4.consumes_counters.len(), 1, "the T4's counter set: its memory");
    assert_eq!(t4.consumes_counters[0].counter_set, "gpu-2-counter-set");
    assert_eq!(t4.attributes["sharing"].text().as_deref(), Some("none"));
    assert!(devices.iter().any(|d| d.name == "gpu-2-mps"), "and as MPS shares");
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
    // Every placement of every profile on both A100s, plus three whole GPUs and the T4's MPS device.
    let per_gpu = devices.iter().filter(|d| d.name.starts_with("gpu-0-mig-")).count();
    assert!(per_gpu >= 18, "{per_gpu}");
    assert_eq!(devices.len(), 2 * per_gpu + 3 + 1);

    // The kubelet cleans its registry (a restart): the plugin is served and registered again.
    std::fs::remove_file(rig.path("plugins_registry").join(format!("{DRIVER}-reg.sock"))).unwrap();
    rig.kubelet.wait_registered(2);
    assert!(rig.kubelet.seen().refused.is_empty());
    // Every call was made with the socket's path as `:authority`, as kubelet 1.36 dials.
    assert!(rig.kubelet.seen().failed.is_empty(), "{:?}", rig.kubelet.seen().failed);
}

#[test]
fn every_slice_is_owned_by_its_node_and_goes_with_it() {
    let rig = DraRig::start("A100-SXM4-80GB:4");
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let slices = rig.api.store().all("resourceslices").into_iter().cloned().collect::<Vec<_>>();
    assert!(slices.len() >= 2, "counters and devices: {}", slices.len());
    for s in &slices {
        let owners = &s["metadata"]["ownerReferences"];
        assert_eq!(
            owners,
            &serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": support::apiserver::NODE_UID, "controller": true}]),
            "{}",
            s["metadata"]["name"]
        );
    }
    // Deleting the Node removes its slices (the garbage collector follows the ownerReference).
    rig.kill();
    rig.api.delete("nodes", "", NODE);
    assert!(rig.api.store().all("resourceslices").is_empty());
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
    // The claim is deallocated while its instance is still in use: the scheduler no longer counts
    // it, so what it blocks is tainted until it goes.
    let placement = rig.node.load().gpus[0].gpu_instances[0].placement;
    rig.delete_claim("big");
    let tainted = |s: &[(String, gpupart::dra::slices::SliceSpec)]| -> Vec<String> {
        s.iter().flat_map(|(_, x)| x.devices.iter()).filter(|d| !d.taints.is_empty()).map(|d| d.name.clone()).collect()
    };
    let blocked = |s: &[(String, gpupart::dra::slices::SliceSpec)]| -> Vec<String> {
        s.iter()
            .flat_map(|(_, x)| x.devices.iter())
            .filter(|d| {
                let start = d.attributes.get("placementStart").and_then(|a| a.int).unwrap_or(0) as u32;
                let size = d.attributes.get("placementSize").and_then(|a| a.int).unwrap_or(8) as u32;
                gpupart::mig::Placement::new(start, size).overlaps(placement)
            })
            .map(|d| d.name.clone())
            .collect()
    };
    let slices = rig.wait_slices("what the busy instance blocks tainted, and only that", |s| tainted(s) == blocked(s));
    assert!(tainted(&slices).len() > 5, "{:?}", tainted(&slices));
    let mut s = rig.node.load();
    s.gpus[0].gpu_instances[0].compute_instances[0].processes.clear();
    rig.node.save(&s);
    assert_eq!(rig.unprepare("big"), "");
    assert!(rig.node.load().gpus[0].gpu_instances.is_empty());
    assert!(!rig.path("cdi").join("k8s.gpu.gpupart.io-claim_uid-big.json").exists());
    rig.wait_slices("no taint once it went", |s| tainted(s).is_empty());
    // Idempotent, and fine when the claim is gone from the API.
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
    rig.set_allocation("odd", &[("gpu", DRIVER, NODE, "gpu-7-mig-1g-10gb-19-0")]);
    let e = rig.prepare("odd").unwrap_err();
    assert!(e.contains("ml/odd") && e.contains("gpu-7-mig-1g-10gb-19-0"), "{e}");
    // Another driver's devices only.
    rig.mig_claim("theirs", "1g.10gb");
    rig.set_allocation("theirs", &[("gpu", "gpu.nvidia.com", NODE, "gpu-0")]);
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

#[test]
fn a_failed_prepare_is_an_event_on_the_claim() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("theirs", "1g.10gb");
    rig.set_allocation("theirs", &[("gpu", "gpu.nvidia.com", NODE, "gpu-0")]);
    let e = rig.prepare("theirs").unwrap_err();
    rig.prepare("theirs").unwrap_err();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let events: Vec<_> =
            rig.api.events().into_iter().filter(|(n, r, _)| n == "theirs" && r == "PrepareFailed").collect();
        if !events.is_empty() {
            assert_eq!(events.len(), 1, "one Event for a repeated failure: {events:?}");
            assert_eq!(events[0].2, e);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no PrepareFailed Event: {:?}", rig.api.events());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_kill_in_the_middle_of_prepare_converges_after_a_restart() {
    let rig = DraRig::start_with("A100-SXM4-80GB:1", &[], &[("FAKE_NVML_OP_DELAY_MS", "400")]);
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("slow", "3g.40gb");
    let got = rig.schedule("slow").unwrap();
    std::thread::scope(|s| {
        let prepare = s.spawn(|| rig.prepare("slow"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while rig.node.load().gpus[0].gpu_instances.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the GPU instance was never created");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        rig.kill();
        assert!(prepare.join().unwrap().is_err(), "the kubelet's call died with the plugin");
    });
    let st = rig.node.load();
    assert_eq!(st.gpus[0].gpu_instances.len(), 1, "killed with a half-made instance");
    rig.launch();
    rig.kubelet.wait_registered(2);
    // The kubelet retries: exactly the allocated instance, once.
    let prepared = rig.prepare("slow").expect("prepared after the restart");
    assert_eq!(prepared[0].0, got[0].device);
    let st = rig.node.load();
    assert_eq!(st.gpus[0].gpu_instances.len(), 1, "{:?}", st.gpus[0].gpu_instances);
    assert_eq!(st.gpus[0].gpu_instances[0].compute_instances.len(), 1);
    let start = got[0].device.rsplit('-').next().unwrap().parse::<u32>().unwrap();
    assert_eq!(st.gpus[0].gpu_instances[0].placement.start, start);
}

#[test]
fn a_foreign_instance_is_never_offered_over_nor_destroyed() {
    let rig = DraRig::start_after("A100-SXM4-80GB:1", &["--annotation-min-interval", "100ms"], &[], foreign_instance);
    rig.kubelet.wait_registered(1);
    let slices = rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    // Every device stays listed; what the foreign instance blocks (the counters cannot know it)
    // carries a NoSchedule taint saying so, and nothing else does.
    for d in slices.iter().flat_map(|(_, s)| s.devices.iter()) {
        let start = d.attributes.get("placementStart").and_then(|a| a.int).unwrap_or(0);
        let size = d.attributes.get("placementSize").and_then(|a| a.int).unwrap_or(8);
        let blocked = start + size > 6;
        let taint = d.taints.iter().find(|t| t.key == format!("{DRIVER}/unavailable"));
        assert_eq!(taint.is_some(), blocked, "{}: {:?}", d.name, d.taints);
        if let Some(t) = taint {
            assert_eq!((t.effect.as_str(), t.value.as_deref()), ("NoSchedule", Some("occupied-outside-claims")));
        }
    }
    assert!(!rig.offered().iter().any(|d| d == "gpu-0"), "the GPU is not idle");
    rig.launch();
    rig.kubelet.wait_registered(2);
    rig.mig_claim("small", "1g.10gb");
    rig.schedule("small").unwrap();
    rig.prepare("small").unwrap();
    let gis = rig.node.load().gpus[0].gpu_instances.clone();
    assert_eq!(gis.len(), 2);
    assert!(gis.iter().any(|g| g.id == 9 && g.placement.start == 6), "the foreign instance stays");
    // The node's summary reports it as foreign, and not the claim's instance (pictures.md).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let a = rig.api.state().annotations;
        let gpus: serde_json::Value =
            a.get("gpupart.io/gpus").and_then(|g| serde_json::from_str(g).ok()).unwrap_or_default();
        if gpus[0]["layout"].as_array().is_some_and(|l| l.len() == 2) {
            assert_eq!(gpus[0]["foreign"], serde_json::json!(["1g.10gb@6"]), "{gpus}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no summary with both instances: {a:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn room_reserved_for_a_waiting_claim_goes_to_it_and_to_no_other_claim() {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    // The controller reserves GPU 0 for a waiting 7g.80gb claim.
    let until = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let reservation = format!(r#"{{"pod": "ml/llm", "gpus": [0], "wants": {{"mig": "7g.80gb"}}, "until": {until}}}"#);
    rig.api.annotate("gpupart.io/defrag-reservation", Some(&reservation));
    let reserved = |d: &gpupart::dra::slices::Device| {
        d.taints.iter().any(|t| {
            t.key == format!("{DRIVER}/unavailable") && t.value.as_deref() == Some("reserved-for-a-waiting-claim")
        })
    };
    let room = |d: &gpupart::dra::slices::Device| d.name.starts_with("gpu-0") && !d.name.contains("-7g-");
    let slices = rig.wait_slices("the reserved GPU's devices tainted", |s| {
        s.iter().flat_map(|(_, x)| &x.devices).all(|d| reserved(d) == room(d))
    });
    // Every device of GPU 0 but its 7g is tainted NoSchedule, in place; GPU 1 is untouched.
    for d in slices.iter().flat_map(|(_, s)| s.devices.iter()) {
        assert_eq!(reserved(d), room(d), "{}: {:?}", d.name, d.taints);
        assert!(d.taints.iter().all(|t| t.effect == "NoSchedule"), "{:?}", d.taints);
    }
    // A small claim (a moved pod's replacement) never lands in the room; the waiting one does.
    for i in 0..3 {
        let name = format!("small-{i}");
        rig.mig_claim(&name, "1g.10gb");
        let got = rig.schedule(&name).expect("allocated");
        assert!(got[0].device.starts_with("gpu-1-"), "{name} took {}", got[0].device);
        rig.wait_caught_up();
    }
    rig.mig_claim("llm", "7g.80gb");
    assert_eq!(rig.schedule("llm").expect("allocated")[0].device, "gpu-0-mig-7g-80gb-0-0");
    rig.prepare("llm").expect("prepared");
    // The reservation removed, the taints go.
    rig.api.annotate("gpupart.io/defrag-reservation", None);
    rig.wait_slices("no reservation taint", |s| !s.iter().flat_map(|(_, x)| &x.devices).any(&reserved));
    // A reservation the node cannot honour is ignored, with a warning naming it.
    rig.api.annotate(
        "gpupart.io/defrag-reservation",
        Some(r#"{"pod": "ml/x", "gpus": [7], "wants": {"whole": 1}, "until": 1}"#),
    );
    let t = std::time::Instant::now();
    while !rig.stderr().contains("reserves GPU 7, which this node does not have") {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "{}", rig.stderr());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A reservation lifts itself when it expires.
    let soon = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 2;
    let short = format!(r#"{{"pod": "ml/tp", "gpus": [1], "wants": {{"whole": 1}}, "until": {soon}}}"#);
    rig.api.annotate("gpupart.io/defrag-reservation", Some(&short));
    rig.wait_slices("GPU 1's MIG devices reserved", |s| {
        s.iter().flat_map(|(_, x)| &x.devices).any(|d| d.name.starts_with("gpu-1-") && reserved(d))
    });
    rig.wait_slices("the reservation expired", |s| !s.iter().flat_map(|(_, x)| &x.devices).any(&reserved));
}

#[test]
fn a_whole_gpu_claim_turns_mig_off_and_the_gpu_returns_to_mig_after() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.claim("whole", &[("gpu", "gpu.gpupart.io", "", 1)]);
    let got = rig.schedule("whole").unwrap();
    assert_eq!(got[0].device, "gpu-0");
    rig.prepare("whole").expect("prepared");
    assert!(!rig.node.load().gpus[0].mig_mode.current, "MIG off for a whole GPU");
    assert!(rig.wait_caught_up(), "republished");
    assert_eq!(rig.offered(), Vec::<String>::new(), "no MIG device offered while the GPU is held whole");
    assert_eq!(rig.unprepare("whole"), "");
    assert!(rig.node.load().gpus[0].mig_mode.current, "back in MIG mode");
}

#[test]
fn a_classic_extended_resource_request_gets_a_dynamically_created_instance() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dra/deviceclasses.yaml"))
            .unwrap();
    for class in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
        rig.api.put("deviceclasses", class);
    }
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    // What the scheduler makes for a pod asking `nvidia.com/mig-2g.20gb: 1`.
    rig.claim("pod-a-extended-resources", &[("container-0-request-0", "mig-2g.20gb.gpupart.io", "", 1)]);
    let got = rig.schedule("pod-a-extended-resources").unwrap();
    assert!(got[0].device.starts_with("gpu-0-mig-2g-20gb-"), "{got:?}");
    rig.prepare("pod-a-extended-resources").unwrap();
    let gis = rig.node.load().gpus[0].gpu_instances.clone();
    assert_eq!(gis.len(), 1);
    assert_eq!(gis[0].placement.size, 2);
}

#[test]
fn a_4g_still_fits_after_small_claims_come_and_go() {
    // One A100: three 1g.10gb claims, one leaves, another comes, then a 4g.40gb. In index order
    // the 1g claims would hold slices 0..2 and the 4g (placement 0 only) would be refused.
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    for name in ["a", "b", "c"] {
        rig.mig_claim(name, "1g.10gb");
        rig.schedule(name).unwrap();
        rig.prepare(name).unwrap();
    }
    assert_eq!(rig.unprepare("b"), "");
    rig.delete_claim("b");
    rig.mig_claim("d", "1g.10gb");
    rig.schedule("d").unwrap();
    rig.prepare("d").unwrap();
    rig.mig_claim("big", "4g.40gb");
    let got = rig.schedule("big").expect("the 4g still fits");
    assert!(got[0].device.ends_with("-0"), "{got:?}");
    rig.prepare("big").unwrap();
    assert_eq!(rig.node.load().gpus[0].gpu_instances.len(), 4);
}

#[test]
fn filling_gpus_rewrites_the_same_slices_and_never_makes_the_pool_incomplete() {
    // Three A100s list more than 64 devices; each 7g.80gb claim removes a GPU's placements from
    // the list. The pool keeps its slices and generation, so the scheduler never meets a pool
    // whose slices carry two generations, and every claim is allocated at the first try.
    let rig = DraRig::start("A100-SXM4-80GB:3");
    rig.kubelet.wait_registered(1);
    let shape = |s: &[(String, gpupart::dra::slices::SliceSpec)]| -> Vec<(String, i64, i64)> {
        s.iter().map(|(n, x)| (n.clone(), x.pool.generation, x.pool.resource_slice_count)).collect()
    };
    let listed =
        |s: &[(String, gpupart::dra::slices::SliceSpec)]| s.iter().map(|(_, x)| x.devices.len()).sum::<usize>();
    let first = rig.wait_slices("the whole pool, over several device slices", |s| {
        s.first().is_some_and(|(_, x)| x.pool.resource_slice_count == s.len() as i64) && listed(s) > 64
    });
    for i in 0..3 {
        let name = format!("full-{i}");
        rig.mig_claim(&name, "7g.80gb");
        rig.schedule(&name).expect("allocated at the first try");
        rig.prepare(&name).unwrap();
        assert!(rig.wait_caught_up(), "republished after {name}");
        let now = rig.slices();
        assert_eq!(listed(&now), listed(&first), "every device stays listed");
        assert!(rig.offered().len() < listed(&first), "fewer devices offered");
        assert_eq!(shape(&now), shape(&first), "the same slices and generation after {name}");
    }
    // Small claims come and go across the two device slices.
    assert_eq!(rig.unprepare("full-1"), "");
    rig.delete_claim("full-1");
    for i in 0..5 {
        let name = format!("small-{i}");
        rig.mig_claim(&name, if i % 2 == 0 { "1g.10gb" } else { "2g.20gb" });
        rig.schedule(&name).expect("allocated at the first try");
        rig.prepare(&name).unwrap();
    }
    assert_eq!(rig.unprepare("full-0"), "");
    rig.delete_claim("full-0");
    assert!(rig.wait_caught_up());
    every_moment_lists_each_device_once_and_every_allocated_one(&rig);
}

/// Replays the API server's history: at every moment the node's pool is complete, no device is
/// listed twice and every device allocated to a claim is listed.
fn every_moment_lists_each_device_once_and_every_allocated_one(rig: &DraRig) {
    use std::collections::BTreeMap;
    let changes = rig.api.store().changes.clone();
    let mut slices: BTreeMap<String, gpupart::dra::slices::SliceSpec> = BTreeMap::new();
    let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut moments = 0;
    for c in changes {
        let name = c.key.2.clone();
        match (c.key.0.as_str(), c.kind) {
            ("resourceslices", "DELETED") => {
                slices.remove(&name);
            }
            ("resourceslices", _) => {
                slices.insert(name, serde_json::from_value(c.object["spec"].clone()).unwrap());
            }
            ("resourceclaims", "DELETED") => {
                claims.remove(&name);
            }
            ("resourceclaims", _) => {
                let results = c.object["status"]["allocation"]["devices"]["results"].as_array().cloned();
                let devices =
                    results.unwrap_or_default().iter().filter_map(|r| r["device"].as_str().map(String::from)).collect();
                claims.insert(name, devices);
            }
            _ => continue,
        }
        let newest = slices.values().map(|s| s.pool.generation).max().unwrap_or(0);
        let pool: Vec<_> = slices.values().filter(|s| s.pool.generation == newest).collect();
        if pool.is_empty() || pool[0].pool.resource_slice_count != pool.len() as i64 {
            continue;
        }
        moments += 1;
        let listed: Vec<&str> = pool.iter().flat_map(|s| s.devices.iter().map(|d| d.name.as_str())).collect();
        let mut unique = listed.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), listed.len(), "a device listed twice at moment {moments}");
        for (claim, devices) in &claims {
            for d in devices {
                assert!(listed.contains(&d.as_str()), "{d} of {claim} not listed at moment {moments}");
            }
        }
    }
    assert!(moments > 10, "{moments} moments");
}

/// The plugin's resident memory, in KiB.
fn rss_kib(rig: &DraRig) -> u64 {
    let pid = rig.agent.lock().unwrap().as_ref().unwrap().0.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
}

#[test]
fn ten_thousand_claims_in_the_cluster_only_this_pools_count() {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let before = rss_kib(&rig);
    // 9,996 claims allocated on other nodes' pools, 4 on this one.
    let ours = ["gpu-1-mig-1g-10gb-19-0", "gpu-1-mig-1g-10gb-19-1", "gpu-1-mig-2g-20gb-14-2", "gpu-1-mig-3g-40gb-9-4"];
    rig.api.change(|s| {
        for i in 0..10_000 {
            let (pool, device) = match ours.get(i) {
                Some(d) => (NODE.to_string(), d.to_string()),
                None => (format!("node-{}", i % 500), format!("gpu-{}-mig-1g-10gb-19-{}", i % 8, i % 7)),
            };
            let name = format!("claim-{i}");
            let claim = serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.gpupart.io", "count": 1}}]}},
                "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}}},
            });
            s.put(("resourceclaims".into(), "ml".into(), name), claim);
        }
    });
    assert!(rig.wait_caught_up(), "the publication counts this pool's four allocations as taken");
    let (order, offered) = (rig.device_order(), rig.offered());
    for d in ours {
        assert!(order.iter().any(|x| x == d), "{d} is still published");
        assert!(!offered.iter().any(|x| x == d), "{d} is not offered");
    }
    assert!(!offered.iter().any(|d| d == "gpu-1"), "GPU 1 is not idle any more");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = rss_kib(&rig);
    eprintln!(
        "plugin RSS: {before} KiB before, {after} KiB with 10,000 claims in the cluster (+{} KiB)",
        after.saturating_sub(before)
    );
}

#[test]
fn the_claim_watch_counts_an_allocation_before_prepare_and_can_be_off() {
    for watch in [true, false] {
        let extra: &[&str] = if watch { &[] } else { &["--watch-claims=false"] };
        let rig = DraRig::start_with("A100-SXM4-80GB:2", extra, &[]);
        rig.kubelet.wait_registered(1);
        rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
        // A 3g.40gb on GPU 1 (allocated by hand): GPU 1 is then the one to pack, so every small
        // profile's order changes (GPU 0, the lower index, came first while both were idle).
        rig.mig_claim("early", "3g.40gb");
        rig.set_allocation("early", &[("gpu", DRIVER, NODE, "gpu-1-mig-3g-40gb-9-4")]);
        // Allocated, not prepared: with the watch the next publication already counts it.
        let t = std::time::Instant::now();
        assert_eq!(rig.wait_caught_up(), watch, "watch {watch}");
        if watch {
            eprintln!("allocation to republication: {} ms", t.elapsed().as_millis());
        }
        rig.prepare("early").unwrap();
        assert!(rig.wait_caught_up(), "Prepare republishes (watch {watch})");
    }
}

#[test]
fn the_node_summary_annotations_are_written_as_in_label_mode() {
    let rig = DraRig::start_with("A100-SXM4-80GB:1", &["--annotation-min-interval", "200ms"], &[]);
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("a", "3g.40gb");
    rig.schedule("a").unwrap();
    rig.prepare("a").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let a = rig.api.state().annotations;
        if a.get("gpupart.io/gpus").is_some_and(|g| g.contains("3g.40gb@"))
            && a.contains_key("gpupart.io/fragmentation")
        {
            // And the mark that keeps the controller's layouts off this node.
            assert_eq!(a.get("gpupart.io/dra-driver").map(String::as_str), Some(DRIVER), "{a:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no summary annotations: {a:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_claim_with_two_requests_gets_both_devices_packed_and_prepared() {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let small = format!("device.attributes['{DRIVER}'].profile == '1g.10gb'");
    let mid = format!("device.attributes['{DRIVER}'].profile == '2g.20gb'");
    rig.claim("pair", &[("draft", "mig.gpupart.io", &small, 1), ("target", "mig.gpupart.io", &mid, 1)]);
    let got = rig.schedule("pair").unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(gpu_of(&got[0].device), gpu_of(&got[1].device), "both on one GPU: {got:?}");
    let prepared = rig.prepare("pair").unwrap();
    assert_eq!(prepared.len(), 2);
    let g = gpu_of(&got[0].device) as usize;
    assert_eq!(rig.node.load().gpus[g].gpu_instances.len(), 2);
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rig.path("cdi").join("k8s.gpu.gpupart.io-claim_uid-pair.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["devices"].as_array().unwrap().len(), 2);
    assert_eq!(rig.unprepare("pair"), "");
    assert!(rig.node.load().gpus[g].gpu_instances.is_empty());
}
