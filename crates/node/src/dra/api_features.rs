//! What the API server keeps of the optional ResourceSlice fields the plugin publishes (pure).
//!
//! Kubernetes drops a field whose feature gate is off when an object is written (each kind's
//! `dropDisabledFields`), silently: the write succeeds without it. So the plugin writes a probe
//! pool in a server-side dry run ([`probe`]), compares what comes back with what it sent
//! ([`kept`]), and then publishes only what the server keeps ([`withhold`]): a device that needs
//! a dropped field to be safe is left out rather than offered wrongly.

use super::slices::{Capacity, Consumption, CounterSet, Device, DeviceTaint, Pool, Quantity, RequestPolicy};
use super::slices::{Slice, SliceSpec, ValidRange};
use std::collections::BTreeMap;

/// An optional part of the DRA API the plugin uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Feature {
    /// Counter sets and the counters devices consume: MIG placements that overlap.
    Counters,
    /// Device taints: devices that cannot be created now, devices of unhealthy GPUs.
    Taints,
    /// Devices several claims share, each consuming part of its capacity: MPS shares.
    SharedDevices,
    /// A DeviceClass serving a classic extended resource (`nvidia.com/mig-1g.10gb: 1`).
    ExtendedResources,
}

impl Feature {
    /// Every feature.
    pub const ALL: [Feature; 4] =
        [Feature::Counters, Feature::Taints, Feature::SharedDevices, Feature::ExtendedResources];

    /// The Kubernetes feature gate that serves it.
    pub fn gate(self) -> &'static str {
        match self {
            Feature::Counters => "DRAPartitionableDevices",
            Feature::Taints => "DRADeviceTaints",
            Feature::SharedDevices => "DRAConsumableCapacity",
            Feature::ExtendedResources => "DRAExtendedResource",
        }
    }

    /// The field the API server drops while the gate is off.
    pub fn field(self) -> &'static str {
        match self {
            Feature::Counters => "ResourceSlice spec.sharedCounters and devices[].consumesCounters",
            Feature::Taints => "ResourceSlice devices[].taints",
            Feature::SharedDevices => "ResourceSlice devices[].allowMultipleAllocations",
            Feature::ExtendedResources => "DeviceClass spec.extendedResourceName",
        }
    }

    /// The Kubernetes releases that serve it: alpha (off unless the gate is turned on) and beta
    /// (on by default).
    pub fn releases(self) -> &'static str {
        match self {
            Feature::Counters => {
                "alpha in 1.33-1.35 (counter sets in slices of their own from 1.35), on by default since 1.36"
            }
            Feature::Taints => "alpha in 1.33-1.35, on by default since 1.36",
            Feature::SharedDevices => "alpha in 1.34-1.35, on by default since 1.36",
            Feature::ExtendedResources => "alpha in 1.34-1.35, on by default since 1.36",
        }
    }

    /// What the plugin does without it.
    pub fn without(self) -> &'static str {
        match self {
            Feature::Counters => "the scheduler would give out overlapping MIG placements; the plugin cannot run",
            Feature::Taints => {
                "devices that would carry a taint (blocked by an instance or processes outside claims, reserved, or on an unhealthy GPU) are left out of the pool instead"
            }
            Feature::SharedDevices => "MPS devices are left out of the pool (a claim could not get a share of one)",
            Feature::ExtendedResources => {
                "pods asking for nvidia.com/mig-<profile> the classic way are not served by this driver; ResourceClaims are"
            }
        }
    }
}

/// Which optional ResourceSlice fields the API server keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// Counter sets and consumed counters.
    pub counters: bool,
    /// Device taints.
    pub taints: bool,
    /// `allowMultipleAllocations` (and capacity request policies).
    pub shared_devices: bool,
}

impl Kept {
    /// A server that keeps every field (a current Kubernetes with its defaults).
    pub const ALL: Kept = Kept { counters: true, taints: true, shared_devices: true };

    /// The features whose fields are dropped, in order.
    pub fn dropped(&self) -> Vec<Feature> {
        [
            (Feature::Counters, self.counters),
            (Feature::Taints, self.taints),
            (Feature::SharedDevices, self.shared_devices),
        ]
        .into_iter()
        .filter(|(_, kept)| !kept)
        .map(|(f, _)| f)
        .collect()
    }
}

/// The probe's counter set.
pub const PROBE_COUNTER_SET: &str = "gpupart-probe";
/// The probe device that consumes counters.
pub const PROBE_COUNTERS: &str = "probe-counters";
/// The probe device with a taint.
pub const PROBE_TAINTED: &str = "probe-tainted";
/// The probe device several claims may share.
pub const PROBE_SHARED: &str = "probe-shared";

/// The probe pool for `node`: one slice with a counter set, one with three devices, each using
/// one optional feature the way the real pool does, so that a field the server drops shows on
/// its device alone. Written only in a dry run: nothing is stored.
pub fn probe(driver: &str, node: &str) -> Vec<Slice> {
    let spec = |shared_counters, devices| SliceSpec {
        driver: driver.to_string(),
        pool: Pool { name: node.to_string(), generation: 1, resource_slice_count: 2 },
        node_name: Some(node.to_string()),
        shared_counters,
        devices,
    };
    let counters = BTreeMap::from([("memory".to_string(), Quantity::of(1 << 30))]);
    let consumes = Consumption { counter_set: PROBE_COUNTER_SET.into(), counters: counters.clone() };
    let bare = |name: &str| Device {
        name: name.into(),
        attributes: BTreeMap::new(),
        capacity: BTreeMap::new(),
        allow_multiple_allocations: None,
        consumes_counters: Vec::new(),
        taints: Vec::new(),
    };
    let mut with_counters = bare(PROBE_COUNTERS);
    with_counters.consumes_counters.push(consumes);
    let mut tainted = bare(PROBE_TAINTED);
    tainted.taints.push(DeviceTaint {
        key: format!("{driver}/probe"),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    });
    let mut shared = bare(PROBE_SHARED);
    shared.allow_multiple_allocations = Some(true);
    let policy = RequestPolicy {
        default: Some((1u64 << 30).to_string()),
        valid_range: Some(ValidRange {
            min: (256u64 << 20).to_string(),
            max: None,
            step: Some((256u64 << 20).to_string()),
        }),
        valid_values: Vec::new(),
    };
    shared.capacity.insert("memory".into(), Capacity { value: (1u64 << 30).to_string(), request_policy: Some(policy) });
    let sets = vec![CounterSet { name: PROBE_COUNTER_SET.into(), counters }];
    vec![
        Slice { name: format!("{node}-{driver}-probe-counters"), spec: spec(sets, Vec::new()) },
        Slice {
            name: format!("{node}-{driver}-probe-devices"),
            spec: spec(Vec::new(), vec![with_counters, tainted, shared]),
        },
    ]
}

/// What the server kept of the probe, from the specs its dry run answered (any order).
pub fn kept(answered: &[SliceSpec]) -> Kept {
    let device = |name: &str| answered.iter().flat_map(|s| &s.devices).find(|d| d.name == name);
    let sets = answered.iter().any(|s| s.shared_counters.iter().any(|c| c.name == PROBE_COUNTER_SET));
    Kept {
        counters: sets && device(PROBE_COUNTERS).is_some_and(|d| !d.consumes_counters.is_empty()),
        taints: device(PROBE_TAINTED).is_some_and(|d| !d.taints.is_empty()),
        shared_devices: device(PROBE_SHARED).is_some_and(|d| d.allow_multiple_allocations == Some(true)),
    }
}

/// Leaves out of `slices` every device that needs a field the server drops: a tainted device
/// without taints, a shared device without `allowMultipleAllocations`. Slices stay (an emptied
/// one is published empty), so the pool's slice set does not change with what is left out.
/// Returns how many devices were left out.
pub fn withhold(slices: &mut [Slice], kept: Kept) -> usize {
    let mut left_out = 0;
    for s in slices {
        let before = s.spec.devices.len();
        s.spec.devices.retain(|d| {
            (kept.taints || d.taints.is_empty()) && (kept.shared_devices || d.allow_multiple_allocations != Some(true))
        });
        left_out += before - s.spec.devices.len();
    }
    left_out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered_by(keep: Kept) -> Vec<SliceSpec> {
        probe("gpu.gpupart.io", "n").into_iter().map(|s| server_drops(s.spec, keep)).collect()
    }

    /// What an API server with these gates stores (its strategy's `dropDisabledFields`).
    fn server_drops(mut spec: SliceSpec, keep: Kept) -> SliceSpec {
        if !keep.counters {
            spec.shared_counters.clear();
        }
        for d in &mut spec.devices {
            if !keep.counters {
                d.consumes_counters.clear();
            }
            if !keep.taints {
                d.taints.clear();
            }
            if !keep.shared_devices {
                d.allow_multiple_allocations = None;
                for c in d.capacity.values_mut() {
                    c.request_policy = None;
                }
            }
        }
        spec
    }

    #[test]
    fn each_dropped_field_is_seen_on_its_own_device() {
        for counters in [true, false] {
            for taints in [true, false] {
                for shared_devices in [true, false] {
                    let keep = Kept { counters, taints, shared_devices };
                    assert_eq!(kept(&answered_by(keep)), keep);
                }
            }
        }
        assert_eq!(
            Kept { counters: false, taints: true, shared_devices: false }.dropped(),
            [Feature::Counters, Feature::SharedDevices]
        );
        assert!(Kept::ALL.dropped().is_empty());
    }

    #[test]
    fn an_answer_without_the_probe_keeps_nothing() {
        assert_eq!(kept(&[]), Kept { counters: false, taints: false, shared_devices: false });
    }

    #[test]
    fn what_needs_a_dropped_field_is_left_out_and_every_slice_stays() {
        let mut slices = probe("gpu.gpupart.io", "n");
        assert_eq!(withhold(&mut slices.clone(), Kept::ALL), 0);
        let left = withhold(&mut slices, Kept { counters: true, taints: false, shared_devices: false });
        assert_eq!(left, 2);
        assert_eq!(slices.len(), 2);
        let names: Vec<&str> = slices.iter().flat_map(|s| &s.spec.devices).map(|d| d.name.as_str()).collect();
        assert_eq!(names, [PROBE_COUNTERS]);
    }

    #[test]
    fn the_probe_is_a_valid_pool_of_two_slices_naming_the_node() {
        let slices = probe("gpu.gpupart.io", "gpu-node-1");
        assert_eq!(slices.len(), 2);
        for s in &slices {
            assert_eq!(s.spec.node_name.as_deref(), Some("gpu-node-1"));
            assert_eq!(s.spec.pool.resource_slice_count, 2);
            assert!(s.spec.shared_counters.is_empty() != s.spec.devices.is_empty(), "counters or devices, not both");
            assert!(s.name.starts_with("gpu-node-1-gpu.gpupart.io-probe-"));
        }
        for f in Feature::ALL {
            assert!(!f.gate().is_empty() && f.releases().contains("1.36"), "{f:?}");
        }
    }
}
