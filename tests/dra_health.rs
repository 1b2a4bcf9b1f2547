//! GPU health in DRA mode end to end: the real binary on fake NVML with the DRA kubelet stand-in
//! and the allocator stand-in (which, as the published allocator, allocates no device with a
//! `NoSchedule` or `NoExecute` taint a request does not tolerate). An XID 79 on the GPU holding a
//! prepared claim taints every device of that GPU in place (`gpu.gpupart.io/unhealthy`, value
//! `xid-79`; the pool complete at every moment, no generation bump), the prepared device stays
//! listed and tainted, the next claim lands on the other GPU, an allocation that names the
//! unhealthy GPU anyway fails Prepare with the reason, an application XID 43 changes nothing,
//! and the operator's annotation lifts the taints.

mod support;

use gpupart::dra::slices::SliceSpec;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::dra_rig::{DraRig, DRIVER, NODE};

const TAINT: &str = "gpu.gpupart.io/unhealthy";

fn gpu_of(device: &str) -> u32 {
    device.strip_prefix("gpu-").and_then(|r| r.split('-').next()).and_then(|n| n.parse().ok()).unwrap()
}

/// The unhealthy taints of every device: (device, value, effect).
fn unhealthy(slices: &[(String, SliceSpec)]) -> Vec<(String, String, String)> {
    slices
        .iter()
        .flat_map(|(_, s)| &s.devices)
        .flat_map(|d| {
            d.taints
                .iter()
                .filter(|t| t.key == TAINT)
                .map(|t| (d.name.clone(), t.value.clone().unwrap_or_default(), t.effect.clone()))
        })
        .collect()
}

fn devices_of(slices: &[(String, SliceSpec)], gpu: u32) -> Vec<String> {
    slices.iter().flat_map(|(_, s)| &s.devices).map(|d| d.name.clone()).filter(|n| gpu_of(n) == gpu).collect()
}

#[test]
fn an_xid_taints_every_device_of_its_gpu_in_place_until_the_operator_recovers_it() {
    let rig = DraRig::start_with("A100-SXM4-80GB:2", &[], &[("RUST_LOG", "info")]);
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| !s.is_empty());
    rig.mig_claim("a", "1g.10gb");
    let held = rig.schedule("a").unwrap()[0].device.clone();
    rig.prepare("a").unwrap();
    let (bad, good) = (gpu_of(&held), 1 - gpu_of(&held));
    let before = rig.wait_slices("claim a counted", |_| rig.wait_caught_up());
    assert!(unhealthy(&before).is_empty());
    let generation = before[0].1.pool.generation;
    let names: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();

    // Every moment the pool is read from now on, it is complete.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (api, done) = (rig.api.handle(), done.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !done.load(Ordering::Relaxed) {
                let store = api.store();
                let slices: Vec<SliceSpec> = store
                    .all("resourceslices")
                    .into_iter()
                    .map(|o| serde_json::from_value(o["spec"].clone()).unwrap())
                    .collect();
                drop(store);
                let n = slices.len() as i64;
                assert!(
                    slices.iter().all(|s| s.pool.generation == generation && s.pool.resource_slice_count == n),
                    "the pool was incomplete or changed generation mid-way"
                );
                seen += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        })
    };
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    rig.node.inject_xid(good, 43, None);
    let t = rig.node.inject_xid(bad, 79, None);
    let after =
        rig.wait_slices("every device of the faulty GPU tainted", |s| unhealthy(s).len() == devices_of(s, bad).len());
    let to_taint = t.elapsed();
    println!("XID 79 → taint in the ResourceSlices in {to_taint:?}");
    for (device, value, effect) in unhealthy(&after) {
        assert_eq!((gpu_of(&device), value.as_str(), effect.as_str()), (bad, "xid-79", "NoSchedule"), "{device}");
    }
    assert!(unhealthy(&after).iter().any(|(d, _, _)| *d == held), "the prepared device stays listed, tainted");
    assert_eq!(after.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(), names, "the same slices");
    assert_eq!(after[0].1.pool.generation, generation, "in place");

    // The next claim lands on the healthy GPU; the faulty GPU is offered nothing.
    rig.mig_claim("b", "1g.10gb");
    let got = rig.schedule("b").unwrap()[0].device.clone();
    assert_eq!(gpu_of(&got), good, "{got}");
    rig.prepare("b").unwrap();
    assert!(rig.offered().iter().all(|d| gpu_of(d) == good));
    // An allocation that names the faulty GPU anyway fails Prepare, saying why.
    let free_there = devices_of(&after, bad)
        .into_iter()
        .find(|d| d.contains("-mig-1g-10gb-") && *d != held && !d.ends_with(&held[held.rfind('-').unwrap()..]))
        .unwrap();
    rig.claim("c", &[("gpu", "mig.gpupart.io", "", 1)]);
    rig.set_allocation("c", &[("gpu", DRIVER, NODE, &free_there)]);
    let refused = rig.prepare("c").unwrap_err();
    assert!(refused.contains(&format!("is on GPU {bad}, which is unhealthy (XID 79)")), "{refused}");
    let fenced_metric = format!("gpupart_gpu_healthy{{gpu=\"{bad}\"}} 0");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !support::metrics_in_log(&rig.stderr()).contains(&fenced_metric) {
        assert!(Instant::now() < deadline, "no {fenced_metric}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let event = |reason: &str, text: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !rig.api.events().iter().any(|(_, r, n)| r == reason && n.contains(text)) {
            assert!(Instant::now() < deadline, "no {reason} event saying {text}: {:?}", rig.api.events());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    event("GpuUnhealthy", &format!("GPU {bad} is unhealthy (XID 79)"));

    // The operator brings it back: the taints go, in place.
    rig.api.annotate("gpupart.io/recover-gpus", Some("all"));
    let back = rig.wait_slices("no unhealthy taint", |s| unhealthy(s).is_empty());
    assert_eq!(back[0].1.pool.generation, generation);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.api.state().annotations.contains_key("gpupart.io/recover-gpus") {
        assert!(Instant::now() < deadline, "the annotation stays");
        std::thread::sleep(Duration::from_millis(20));
    }
    event("GpuRecovered", &format!("GPU {bad} healthy again: the operator's annotation"));
    done.store(true, Ordering::Relaxed);
    let reads = watcher.join().expect("the pool stayed complete");
    println!("the pool was read {reads} times, complete every time");
}

#[test]
fn behind_the_flag_the_taint_evicts_and_a_flag_that_does_not_read_is_refused_by_name() {
    let rig =
        DraRig::start_with("A100-SXM4-80GB:1", &["--health-taint-effect", "NoExecute", "--ignore-xids", "79"], &[]);
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| !s.is_empty());
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    rig.node.inject_xid(0, 79, None); // ignored by the flag
    rig.node.inject_xid(0, 48, None);
    let s = rig.wait_slices("the GPU tainted", |s| !unhealthy(s).is_empty());
    assert!(
        unhealthy(&s).iter().all(|(_, v, e)| (v.as_str(), e.as_str()) == ("xid-48", "NoExecute")),
        "{:?}",
        unhealthy(&s)
    );

    let bad = rig.node.run(&["agent", "--dra", "--node-name", NODE, "--ignore-xids", "48,x9"]).failed();
    assert!(bad.stderr.contains("'x9' is not an XID"), "{}", bad.stderr);
}

#[test]
fn an_xid_naming_a_mig_device_taints_only_what_holds_its_slices_even_after_it_is_gone() {
    let rig = DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| !s.is_empty());
    rig.mig_claim("a", "1g.10gb");
    let held = rig.schedule("a").unwrap()[0].device.clone();
    rig.prepare("a").unwrap();
    let status = rig.node.status();
    let inst = &status["gpus"][0]["instances"][0];
    let (gi, ci) =
        (inst["gpu_instance_id"].as_u64().unwrap() as u32, inst["compute_instance_id"].as_u64().unwrap() as u32);
    let start = inst["placement"]["start"].as_u64().unwrap() as u32;
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    rig.node.inject_xid(0, 94, Some((gi, ci)));
    let overlaps = |name: &str| {
        // `gpu-0-mig-<g>-<memory>[-me]-<id>-<start>`: whether it spans the faulty slice `start`.
        let parts: Vec<&str> = name.split('-').collect();
        let from: u32 = parts.last().unwrap().parse().unwrap();
        // A100 80GB: a memory slice is 10 GB (`20gb` spans two).
        let slices: u32 = parts[4].trim_end_matches("gb").parse::<u32>().unwrap() / 10;
        (from..from + slices).contains(&start)
    };
    // Tainted: the whole GPU and every placement over the faulty slice; nothing else.
    let expected = |s: &[(String, SliceSpec)]| -> Vec<String> {
        let mut names: Vec<String> = s
            .iter()
            .flat_map(|(_, sl)| &sl.devices)
            .map(|d| d.name.clone())
            .filter(|n| n == "gpu-0" || (n.contains("-mig-") && overlaps(n)))
            .collect();
        names.sort();
        names
    };
    let tainted_now = |s: &[(String, SliceSpec)]| -> Vec<String> {
        let mut names: Vec<String> = unhealthy(s).into_iter().map(|(d, _, _)| d).collect();
        names.sort();
        names
    };
    let after = rig.wait_slices("the faulty device's slices tainted", |s| tainted_now(s) == expected(s));
    let tainted = tainted_now(&after);
    assert!(unhealthy(&after).iter().all(|(_, v, _)| v == "xid-94"));
    assert!(tainted.contains(&held) && tainted.len() < after.iter().map(|(_, s)| s.devices.len()).sum::<usize>());
    // The rest of the GPU serves on.
    rig.mig_claim("b", "1g.10gb");
    rig.schedule("b").unwrap();
    rig.prepare("b").unwrap();
    // Once its claim is gone the instance goes, and its slices stay fenced.
    rig.unprepare("a");
    rig.delete_claim("a");
    std::thread::sleep(Duration::from_millis(300));
    let later = rig.wait_slices("still tainted", |s| unhealthy(s).iter().any(|(d, _, _)| *d == held));
    assert_eq!(unhealthy(&later).len(), tainted.len());
    rig.claim("c", &[("gpu", "mig.gpupart.io", "", 1)]);
    rig.set_allocation("c", &[("gpu", DRIVER, NODE, &held)]);
    let refused = rig.prepare("c").unwrap_err();
    assert!(
        refused.contains(&format!("holds the slices of GPU 0's faulty MIG device 1g.10gb@{start} (XID 94)")),
        "{refused}"
    );
    rig.api.annotate("gpupart.io/recover-gpus", Some("0"));
    rig.wait_slices("no unhealthy taint", |s| unhealthy(s).is_empty());
}

#[test]
fn a_lost_gpu_stays_listed_tainted_while_the_other_serves_and_comes_back_after_its_reset() {
    let rig = DraRig::start("A100-SXM4-80GB:2");
    rig.kubelet.wait_registered(1);
    let before = rig.wait_slices("the pool", |s| !s.is_empty());
    let generation = before[0].1.pool.generation;
    std::thread::sleep(Duration::from_millis(600)); // the watch has made its event set
    rig.node.set_lost(1, true);
    let after = rig.wait_slices("GPU 1 tainted", |s| unhealthy(s).len() == devices_of(s, 1).len());
    assert!(unhealthy(&after).iter().all(|(d, v, _)| gpu_of(d) == 1 && v == "gpu-lost"));
    assert_eq!(after[0].1.pool.generation, generation, "listed as last seen, in place");
    rig.mig_claim("a", "1g.10gb");
    let got = rig.schedule("a").unwrap()[0].device.clone();
    assert_eq!(gpu_of(&got), 0);
    rig.prepare("a").unwrap();
    rig.claim("b", &[("gpu", "gpu.gpupart.io", "", 1)]);
    rig.set_allocation("b", &[("gpu", DRIVER, NODE, "gpu-1")]);
    let refused = rig.prepare("b").unwrap_err();
    assert!(refused.contains("is on GPU 1, which is unhealthy (GPU is lost)"), "{refused}");
    rig.node.set_lost(1, false);
    rig.wait_slices("back after its reset", |s| unhealthy(s).is_empty());
}
