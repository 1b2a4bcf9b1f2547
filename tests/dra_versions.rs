//! `gpupart agent --dra` against API servers of other Kubernetes releases (docs/dra.md,
//! "Kubernetes versions"): the API test server serves as that release does (its version, its
//! discovery, the fields its feature gates drop from what is written, 1.34's refusal of counter
//! sets in another slice), and the plugin must stop where it cannot publish safely, leave out
//! what it cannot offer, and say which gate is missing.

mod support;

use std::time::{Duration, Instant};
use support::dra_rig::{foreign_instance, put_classes, DraRig};
use support::served::{Counters, Served};

/// A rig whose own plugin was stopped and whose slices were removed, for a plugin of a test's own.
fn stopped_rig(spec: &str, edit: impl FnOnce(&mut gpupart::mig::sim::SimState)) -> DraRig {
    DraRig::stopped(spec, &[("RUST_LOG", "info")], edit)
}

/// Waits until the rig's plugin logged `needle`; the log.
fn wait_logged(rig: &DraRig, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = rig.stderr();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "never logged {needle:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_without_resource_v1_stops_the_plugin_naming_its_version_and_nothing_is_written() {
    let rig = stopped_rig("A100-SXM4-80GB:1", |_| {});
    rig.api.serve_release(Served::v1_33());
    let before = rig.api.request_count();
    let (code, log) = rig.try_start(&[], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("(Kubernetes v1.33.9) serves resource.k8s.io v1beta2, v1beta1 only"), "{log}");
    assert!(log.contains("served since Kubernetes 1.34"), "{log}");
    assert!(rig.api.writes_since(before).is_empty(), "written: {:?}", rig.api.writes_since(before));
    assert!(!rig.path("plugins/gpu.gpupart.io/dra.sock").exists(), "the service socket left behind");
    assert!(!rig.path("plugins_registry/gpu.gpupart.io-reg.sock").exists(), "the registration socket left behind");
}

#[test]
fn a_server_that_drops_or_refuses_counter_sets_stops_the_plugin_naming_the_gate_and_stores_nothing() {
    let rig = stopped_rig("A100-SXM4-80GB:1", |_| {});
    // Kubernetes 1.35 as it comes: DRAPartitionableDevices is alpha, off.
    rig.api.serve_release(Served::v1_35());
    let before = rig.api.request_count();
    let (code, log) = rig.try_start(&[], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("(Kubernetes v1.35.4) drops ResourceSlice spec.sharedCounters"), "{log}");
    assert!(log.contains("DRAPartitionableDevices") && log.contains("overlapping MIG placements"), "{log}");
    // Only the dry runs were written, and nothing was stored.
    let writes = rig.api.writes_since(before);
    assert!(!writes.is_empty(), "the probe was not written");
    assert!(writes.iter().all(|(m, p)| m == "POST" && p.contains("dryRun=All")), "{writes:?}");
    assert!(rig.slices().is_empty(), "slices were stored");
    // Kubernetes 1.34 with the gate on refuses a device whose counter set is in another slice.
    rig.api.serve_release(Served::v1_34_partitionable());
    let (code, log) = rig.try_start(&[], 30);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("(Kubernetes v1.34.6) refuses the plugin's ResourceSlices"), "{log}");
    assert!(log.contains("must reference a counter set defined in the ResourceSlice"), "{log}");
    assert!(log.contains("need Kubernetes 1.36, or 1.35 with the feature gate DRAPartitionableDevices on"), "{log}");
    assert!(rig.slices().is_empty(), "slices were stored");
}

#[test]
fn without_taints_and_shared_devices_the_pool_leaves_out_what_needs_them_and_says_which_gates() {
    // GPU 0 (MIG) has another tool's 1g.10gb at slice 6, so the placements over it are tainted;
    // GPU 1 (no MIG) has an MPS device several claims share.
    let rig = DraRig::start_after("A100-SXM4-80GB:1,V100-SXM2-16GB:1", &[], &[("RUST_LOG", "info")], foreign_instance);
    let devices = |s: &[(String, gpupart::dra::slices::SliceSpec)]| -> Vec<gpupart::dra::slices::Device> {
        s.iter().flat_map(|(_, x)| x.devices.clone()).collect()
    };
    // On a current server: tainted devices and the MPS device are published.
    let full = devices(&rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty())));
    let tainted: Vec<String> = full.iter().filter(|d| !d.taints.is_empty()).map(|d| d.name.clone()).collect();
    let shared: Vec<String> =
        full.iter().filter(|d| d.allow_multiple_allocations == Some(true)).map(|d| d.name.clone()).collect();
    assert!(!tainted.is_empty() && shared == ["gpu-1-mps"], "tainted {tainted:?}, shared {shared:?}");
    let log = wait_logged(&rig, "the API server serves what the plugin publishes");
    assert!(
        log.contains("version=v1.36.2") && log.contains("taints=true") && log.contains("shared_devices=true"),
        "{log}"
    );
    assert!(!log.contains("DRADeviceTaints") && !log.contains("DRAConsumableCapacity"), "{log}");

    // Kubernetes 1.35 with only DRAPartitionableDevices turned on.
    rig.kill();
    rig.api.change(|s| s.objects.retain(|k, _| k.0 != "resourceslices"));
    rig.api.serve_release(Served { counters: Counters::AcrossSlices, ..Served::v1_35() });
    rig.launch();
    let log = wait_logged(&rig, "the API server serves what the plugin publishes");
    let left = devices(&rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty())));
    let names: Vec<String> = left.iter().map(|d| d.name.clone()).collect();
    let expected: Vec<String> =
        full.iter().map(|d| d.name.clone()).filter(|n| !tainted.contains(n) && !shared.contains(n)).collect();
    assert_eq!(names, expected, "what needs a dropped field is left out, the rest published as before");
    assert!(left.iter().all(|d| d.taints.is_empty() && d.allow_multiple_allocations.is_none()));
    for (gate, says) in [
        ("DRADeviceTaints", "devices that would carry a taint"),
        ("DRAConsumableCapacity", "MPS devices are left out of the pool"),
    ] {
        let line = log.lines().find(|l| l.contains(gate)).unwrap_or_else(|| panic!("{gate} not named:\n{log}"));
        assert!(line.contains("WARN") && line.contains(says), "{line}");
        assert_eq!(log.matches(&format!("feature_gate={gate}")).count(), 1, "said once:\n{log}");
    }
    assert!(
        log.contains("version=v1.35.4") && log.contains("taints=false") && log.contains("shared_devices=false"),
        "{log}"
    );
}

#[test]
fn deviceclasses_that_lost_extended_resource_name_or_are_missing_are_warned_of() {
    let rig = stopped_rig("A100-SXM4-80GB:1", |_| {});
    // The classes applied while DRAExtendedResource is off: the server dropped the field.
    rig.api.serve_release(Served { extended_resource: false, ..Served::default() });
    rig.api.change(|s| s.objects.retain(|k, _| k.0 != "deviceclasses"));
    put_classes(&rig.api);
    assert!(
        rig.api.get("deviceclasses", "", "mig-1g.10gb.gpupart.io").unwrap()["spec"]["extendedResourceName"].is_null()
    );
    rig.launch();
    let log = wait_logged(&rig, "the API server serves what the plugin publishes");
    let line = log.lines().find(|l| l.contains("DRAExtendedResource")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("WARN") && line.contains("mig-1g.10gb.gpupart.io"), "names the classes: {line}");
    assert!(line.contains("none has DeviceClass spec.extendedResourceName"), "{line}");
    assert!(line.contains("apply deploy/dra/deviceclasses.yaml again"), "{line}");
    assert!(log.contains("extended_resources=\"dropped\""), "{log}");
    // Nothing else is missing: the pool is published whole.
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));

    // The gate on and the classes applied again: no warning.
    rig.kill();
    rig.api.serve_release(Served::default());
    put_classes(&rig.api);
    rig.launch();
    let log = wait_logged(&rig, "the API server serves what the plugin publishes");
    assert!(!log.contains("DRAExtendedResource") && log.contains("extended_resources=\"served\""), "{log}");

    // No DeviceClass selects the driver at all.
    rig.kill();
    rig.api.change(|s| s.objects.retain(|k, _| k.0 != "deviceclasses"));
    rig.launch();
    let log = wait_logged(&rig, "the API server serves what the plugin publishes");
    assert!(log.contains("no DeviceClass selects driver gpu.gpupart.io's devices"), "{log}");
    assert!(log.contains("extended_resources=\"no classes\""), "{log}");
}
