//! ResourceSlices of one node's pool (pure): the counter sets and the devices in publication
//! order, split within the API's limits. The types serialize to `resource.k8s.io/v1`
//! `ResourceSliceSpec` JSON (camelCase), and read it back.
//!
//! Since Kubernetes 1.35 a slice holds counter sets or devices, not both; at most 8 counter sets
//! per slice, and at most 64 devices per slice when devices consume counters. The scheduler reads
//! a pool's slices sorted by name, so device slices are named `<node>-<driver>-devices-<nnn>-<group>`
//! in publication order and counter slices `<node>-<driver>-counters-<nnn>`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Counter sets per slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Devices per slice when they consume counters.
pub const MAX_DEVICES: usize = 64;

/// A quantity (`{"value": "8"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantity {
    /// The value as the API writes it (plain integers here).
    pub value: String,
}

impl Quantity {
    /// An integer quantity.
    pub fn of(v: u64) -> Self {
        Self { value: v.to_string() }
    }

    /// The integer it holds (suffixes `Ki`, `Mi`, `Gi`, `Ti`, `k`, `M`, `G`, `T` understood).
    pub fn as_u64(&self) -> Option<u64> {
        let v = self.value.trim();
        let units: [(&str, u64); 8] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("k", 1000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
        ];
        for (suffix, mult) in units {
            if let Some(n) = v.strip_suffix(suffix) {
                return n.parse::<u64>().ok().and_then(|n| n.checked_mul(mult));
            }
        }
        v.parse().ok()
    }
}

/// How a share of a device's capacity is asked for (`capacity.<name>.requestPolicy`), on a device
/// that allows multiple allocations: what a request that names no amount takes, and the amounts
/// a request is rounded up to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPolicy {
    /// Taken when a request names no amount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// The amounts allowed as a range (`min`, `max`, `step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<ValidRange>,
    /// The amounts allowed, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<String>,
}

/// `requestPolicy.validRange`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidRange {
    /// The least amount (requests below take it).
    pub min: String,
    /// The most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Amounts are `min + k·step` (requests are rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// One capacity of a device (`capacity.<name>`): its value and, on a shared device, how it is
/// consumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// The total, as the API writes it.
    pub value: String,
    /// How shares of it are asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<RequestPolicy>,
}

impl Capacity {
    /// A plain integer capacity.
    pub fn of(v: u64) -> Self {
        Self { value: v.to_string(), request_policy: None }
    }

    /// The integer it holds.
    pub fn as_u64(&self) -> Option<u64> {
        Quantity { value: self.value.clone() }.as_u64()
    }
}

/// A device attribute: exactly one of the fields is set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Attribute {
    /// A string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// An integer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A boolean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// A semantic version (`8.0.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl Attribute {
    /// A string attribute.
    pub fn string(s: impl Into<String>) -> Self {
        Self { string: Some(s.into()), ..Self::default() }
    }
    /// An integer attribute.
    pub fn int(i: i64) -> Self {
        Self { int: Some(i), ..Self::default() }
    }
    /// A version attribute.
    pub fn version(v: impl Into<String>) -> Self {
        Self { version: Some(v.into()), ..Self::default() }
    }
    /// The value as text, whatever its type.
    pub fn text(&self) -> Option<String> {
        self.string
            .clone()
            .or_else(|| self.version.clone())
            .or_else(|| self.int.map(|i| i.to_string()))
            .or_else(|| self.bool.map(|b| b.to_string()))
    }
}

/// One counter set (`sharedCounters[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    /// Its name (`gpu-<index>-counter-set`).
    pub name: String,
    /// Counter name → value.
    pub counters: BTreeMap<String, Quantity>,
}

/// What a device takes from one counter set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumption {
    /// The counter set's name.
    pub counter_set: String,
    /// Counter name → amount.
    pub counters: BTreeMap<String, Quantity>,
}

/// A device taint (`devices[].taints[]`): the scheduler allocates no device with a `NoSchedule`
/// or `NoExecute` taint that the request does not tolerate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaint {
    /// The key (a qualified name).
    pub key: String,
    /// The value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule` or `NoExecute`.
    pub effect: String,
    /// When the taint was added (the API server sets it when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its name, unique in the pool.
    pub name: String,
    /// Attributes (`type`, `profile`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, Attribute>,
    /// Capacities (`memory` in bytes; an MPS device's `clients` too).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Capacity>,
    /// Several claims may be allocated it, each consuming part of its capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
    /// The counters it consumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<Consumption>,
    /// Its taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
}

/// A pool's identity in each of its slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// The pool's name (the node's).
    pub name: String,
    /// The generation every slice of the pool carries.
    pub generation: i64,
    /// How many slices the pool has.
    pub resource_slice_count: i64,
}

/// A ResourceSlice's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: Pool,
    /// The node the devices are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Counter sets (a slice holds these or devices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
    /// Devices, in publication order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
}

/// One slice to publish: its object name and spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// `metadata.name`.
    pub name: String,
    /// `spec`.
    pub spec: SliceSpec,
}

/// Lays a pool out in slices: counter sets first (8 per slice), then one or more device slices
/// per group, in group order. A group is a set of devices that always lives in the same slices
/// (split in chunks of 64 in the order given), so rewriting the pool never moves a device from
/// one slice to another: a new order within a group is one write of each of its slices. Every
/// slice carries `generation` and the pool's slice count; an empty pool still has one slice.
pub fn layout(
    driver: &str,
    node: &str,
    generation: i64,
    counter_sets: Vec<CounterSet>,
    groups: Vec<(String, Vec<Device>)>,
) -> Vec<Slice> {
    let counter_chunks: Vec<Vec<CounterSet>> = counter_sets.chunks(MAX_COUNTER_SETS).map(<[_]>::to_vec).collect();
    let mut device_chunks: Vec<(String, Vec<Device>)> = Vec::new();
    for (label, devices) in groups {
        let chunks: Vec<&[Device]> = devices.chunks(MAX_DEVICES).collect();
        let split = chunks.len() > 1;
        for (k, c) in chunks.into_iter().enumerate() {
            let label = if split { format!("{label}-{k}") } else { label.clone() };
            device_chunks.push((label, c.to_vec()));
        }
    }
    if device_chunks.is_empty() && counter_chunks.is_empty() {
        device_chunks.push(("none".into(), Vec::new()));
    }
    let count = (counter_chunks.len() + device_chunks.len()) as i64;
    let spec = |shared_counters, devices| SliceSpec {
        driver: driver.to_string(),
        pool: Pool { name: node.to_string(), generation, resource_slice_count: count },
        node_name: Some(node.to_string()),
        shared_counters,
        devices,
    };
    let mut out = Vec::new();
    for (i, c) in counter_chunks.into_iter().enumerate() {
        out.push(Slice { name: format!("{node}-{driver}-counters-{i:03}"), spec: spec(c, Vec::new()) });
    }
    for (i, (label, d)) in device_chunks.into_iter().enumerate() {
        out.push(Slice { name: device_slice_name(driver, node, i, &label), spec: spec(Vec::new(), d) });
    }
    out
}

/// The name of the pool's `index`th device slice, holding the group `label`
/// (`<node>-<driver>-devices-<nnn>-<label>`): the scheduler visits a pool's slices by name, so
/// the index keeps the groups in order.
pub fn device_slice_name(driver: &str, node: &str, index: usize, label: &str) -> String {
    format!("{node}-{driver}-devices-{index:03}-{label}")
}

/// `next` with every slice whose content the scheduler would use the same way as what the API
/// holds (`current`) replaced by that content, so it is not written: the same pool fields, the
/// same devices with the same attributes, counters and taints, and the devices that can be
/// created now (`offered`) in the same order. Where the others sit among them does not matter:
/// the scheduler skips them (their counters are taken, or they are tainted), so a slice whose
/// offered devices keep their order needs no write.
pub fn keep_unchanged(
    current: &BTreeMap<String, SliceSpec>,
    next: Vec<Slice>,
    offered: &BTreeSet<String>,
) -> Vec<Slice> {
    let same_use = |cur: &SliceSpec, new: &SliceSpec| {
        let by_name = |s: &SliceSpec| s.devices.iter().map(|d| (d.name.clone(), d.clone())).collect::<BTreeMap<_, _>>();
        let order = |s: &SliceSpec| {
            s.devices.iter().filter(|d| offered.contains(&d.name)).map(|d| d.name.clone()).collect::<Vec<_>>()
        };
        cur.driver == new.driver
            && cur.pool == new.pool
            && cur.node_name == new.node_name
            && cur.shared_counters == new.shared_counters
            && by_name(cur) == by_name(new)
            && order(cur) == order(new)
    };
    next.into_iter()
        .map(|s| match current.get(&s.name) {
            Some(cur) if cur != &s.spec && same_use(cur, &s.spec) => Slice { name: s.name, spec: cur.clone() },
            _ => s,
        })
        .collect()
}

/// The writes that take the pool from `current` (slice name → spec, as the API holds it) to
/// `next`, in order: every slice whose spec differs, once. Since a device lives in the same slice
/// for good ([`layout`]), no sequence of these writes ever lists a device twice or misses one.
pub fn write_plan(current: &BTreeMap<String, SliceSpec>, next: &[Slice]) -> Vec<Slice> {
    next.iter().filter(|s| current.get(&s.name) != Some(&s.spec)).cloned().collect()
}
