//! What a kube-apiserver of one Kubernetes release serves, for the API test server
//! ([`super::apiserver`]): its `/version`, the `resource.k8s.io` versions its discovery lists
//! (`/apis`, `/apis/resource.k8s.io`; a version it does not serve answers 404), and its DRA
//! feature gates. As kube-apiserver's registry strategies do in `dropDisabledFields`, a gate that
//! is off drops its fields from every object written, silently, unless the object being updated
//! already used them; a dry run (`?dryRun=All`) answers what would be stored and stores nothing.
//! Kubernetes 1.34's ResourceSlice validation refuses a device that consumes a counter set its
//! own slice does not define (from 1.35, counter sets live in slices of their own).
#![allow(dead_code)]

use serde_json::{json, Value};

/// Where a slice's devices may find the counter sets they consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// `DRAPartitionableDevices` off: counter sets and consumed counters are dropped.
    Off,
    /// Kubernetes 1.34 with the gate on: in the device's own slice only.
    SameSlice,
    /// 1.35 with the gate on, 1.36 and later: in any slice of the pool.
    AcrossSlices,
}

/// One API server's release and gates.
#[derive(Debug, Clone)]
pub struct Served {
    /// `gitVersion`.
    pub git_version: String,
    /// The `resource.k8s.io` versions served, preferred first.
    pub resource_versions: Vec<&'static str>,
    /// `DRAPartitionableDevices`.
    pub counters: Counters,
    /// `DRAConsumableCapacity`.
    pub consumable_capacity: bool,
    /// `DRADeviceTaints`.
    pub device_taints: bool,
    /// `DRAExtendedResource`.
    pub extended_resource: bool,
}

impl Default for Served {
    /// Kubernetes 1.36 with its default gates.
    fn default() -> Self {
        Self {
            git_version: "v1.36.2".into(),
            resource_versions: vec!["v1", "v1beta2", "v1beta1"],
            counters: Counters::AcrossSlices,
            consumable_capacity: true,
            device_taints: true,
            extended_resource: true,
        }
    }
}

impl Served {
    /// Kubernetes 1.35 with its default gates: every DRA feature the plugin uses is alpha, off.
    pub fn v1_35() -> Self {
        Self {
            git_version: "v1.35.4".into(),
            counters: Counters::Off,
            consumable_capacity: false,
            device_taints: false,
            extended_resource: false,
            ..Self::default()
        }
    }

    /// Kubernetes 1.34 with `DRAPartitionableDevices` turned on (its alpha form).
    pub fn v1_34_partitionable() -> Self {
        Self { git_version: "v1.34.6".into(), counters: Counters::SameSlice, ..Self::v1_35() }
    }

    /// Kubernetes 1.33: `resource.k8s.io` in beta versions only.
    pub fn v1_33() -> Self {
        Self { git_version: "v1.33.9".into(), resource_versions: vec!["v1beta2", "v1beta1"], ..Self::v1_35() }
    }

    /// `GET /version`.
    pub fn version(&self) -> Value {
        let v = self.git_version.trim_start_matches('v');
        let mut parts = v.split('.');
        json!({"major": parts.next().unwrap_or(""), "minor": parts.next().unwrap_or(""), "gitVersion": self.git_version,
               "platform": "linux/amd64"})
    }

    /// `GET /apis`: every group of `prefixes` (`/apis/<group>/<version>/`), `resource.k8s.io`
    /// with the versions this release serves.
    pub fn groups(&self, prefixes: &[&str]) -> Value {
        let mut groups: Vec<Value> = Vec::new();
        for p in prefixes {
            let mut parts = p.trim_matches('/').split('/').skip(1);
            let (Some(group), Some(version)) = (parts.next(), parts.next()) else { continue };
            if group == "resource.k8s.io" {
                if let Some(g) = self.resource_group() {
                    groups.push(g);
                }
                continue;
            }
            let v = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            groups.push(json!({"name": group, "versions": [v], "preferredVersion": v}));
        }
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `GET /apis/resource.k8s.io`, if it serves any version of it.
    pub fn resource_group(&self) -> Option<Value> {
        let versions: Vec<Value> = self
            .resource_versions
            .iter()
            .map(|v| json!({"groupVersion": format!("resource.k8s.io/{v}"), "version": v}))
            .collect();
        let preferred = versions.first()?.clone();
        Some(json!({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": versions,
                    "preferredVersion": preferred}))
    }

    /// Whether a request path is served (`resource.k8s.io/v1` only where that version is).
    pub fn serves(&self, path: &str) -> bool {
        !path.starts_with("/apis/resource.k8s.io/v1/") || self.resource_versions.contains(&"v1")
    }

    /// Drops what a gate that is off drops from `new` of collection `plural`, unless `old` (the
    /// object being updated) already used it.
    pub fn drop_disabled(&self, plural: &str, new: &mut Value, old: Option<&Value>) {
        match plural {
            "resourceslices" => {
                let used = |f: &dyn Fn(&Value) -> bool| old.is_some_and(f);
                let devices = |v: &Value| v["spec"]["devices"].as_array().cloned().unwrap_or_default();
                let any_device = |v: &Value, field: &str| devices(v).iter().any(|d| !d[field].is_null());
                if self.counters == Counters::Off
                    && !used(&|o| !o["spec"]["sharedCounters"].is_null() || any_device(o, "consumesCounters"))
                {
                    remove_in(new, "spec", "sharedCounters");
                    each_device(new, |d| remove(d, "consumesCounters"));
                }
                if !self.device_taints && !used(&|o| any_device(o, "taints")) {
                    each_device(new, |d| remove(d, "taints"));
                }
                if !self.consumable_capacity && !used(&|o| any_device(o, "allowMultipleAllocations")) {
                    each_device(new, |d| {
                        remove(d, "allowMultipleAllocations");
                        if let Some(caps) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                            caps.values_mut().for_each(|c| remove(c, "requestPolicy"));
                        }
                    });
                }
            }
            "deviceclasses"
                if !self.extended_resource && old.is_none_or(|o| o["spec"]["extendedResourceName"].is_null()) =>
            {
                remove_in(new, "spec", "extendedResourceName");
            }
            _ => {}
        }
    }

    /// The validation error, if this release refuses `obj` of collection `plural`.
    pub fn invalid(&self, plural: &str, obj: &Value) -> Option<String> {
        if plural != "resourceslices" || self.counters != Counters::SameSlice {
            return None;
        }
        let defined: Vec<&str> =
            obj["spec"]["sharedCounters"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
        for (i, d) in obj["spec"]["devices"].as_array().into_iter().flatten().enumerate() {
            for (j, c) in d["consumesCounters"].as_array().into_iter().flatten().enumerate() {
                let set = c["counterSet"].as_str().unwrap_or("");
                if !defined.contains(&set) {
                    let name = obj["metadata"]["name"].as_str().unwrap_or("");
                    return Some(format!(
                        "ResourceSlice.resource.k8s.io \"{name}\" is invalid: spec.devices[{i}].consumesCounters[{j}].counterSet: Invalid value: \"{set}\": must reference a counter set defined in the ResourceSlice's sharedCounters"
                    ));
                }
            }
        }
        None
    }
}

fn remove(v: &mut Value, field: &str) {
    if let Some(m) = v.as_object_mut() {
        m.remove(field);
    }
}

/// Removes `parent.field`; nothing when `parent` is missing.
fn remove_in(v: &mut Value, parent: &str, field: &str) {
    if let Some(p) = v.get_mut(parent) {
        remove(p, field);
    }
}

fn each_device(slice: &mut Value, f: impl Fn(&mut Value)) {
    // `get_mut`, not indexing: indexing a missing key would write a null into the object.
    if let Some(devices) = slice.get_mut("spec").and_then(|s| s.get_mut("devices")).and_then(Value::as_array_mut) {
        devices.iter_mut().for_each(f);
    }
}
