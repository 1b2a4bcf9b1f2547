//! What the defragmenter reads of the nodes that run `gpupart agent --dra` (pure): their GPUs
//! from the devices the agent publishes, what holds each GPU from the allocated
//! ResourceClaims, and what a waiting pod's unallocated claim asks for ([`Want`]).
//!
//! A GPU's model comes from its devices' `productName` (NVML's name), checked against the MIG
//! profiles its devices name; a device the agent taints `occupied-outside-claims` (another tool's
//! instance, processes outside claims) makes its whole GPU off limits to the planner, since the
//! slices do not say which instance blocks it.

use super::room::{Gpu, Held, Node, Want};
use crate::mig::catalog::{self, Model};
use gpupart_node::dra::devices::DeviceRef;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use std::collections::{BTreeMap, BTreeSet};

/// Who holds a device allocated to a claim that no pod uses (`claim <namespace>/<name>`): it
/// never moves.
pub fn claim_holder(namespace: &str, name: &str) -> String {
    format!("claim {namespace}/{name}")
}

/// What holds a GPU the agent marks occupied outside claims.
pub const OUTSIDE: &str = "outside claims";

/// The catalog model whose NVML name (or id) is `product` and that has every profile in
/// `profiles`.
fn model_of(product: &str, profiles: &BTreeSet<String>) -> Option<&'static Model> {
    let named = |m: &&'static Model| {
        m.nvml_name.eq_ignore_ascii_case(product.trim()) || m.id.eq_ignore_ascii_case(product.trim())
    };
    catalog::all_models().filter(named).find(|m| {
        let t = m.profile_table();
        profiles.iter().all(|p| t.profiles.iter().any(|x| x.name.to_string() == *p))
    })
}

/// One GPU as its published devices describe it.
#[derive(Default)]
struct Published {
    product: Option<String>,
    profiles: BTreeSet<String>,
    outside: bool,
}

/// The nodes of `driver` with their GPUs and what holds them; nodes or GPUs whose devices do not
/// say what they are (an unknown model) are left out, with why in the second list.
pub fn nodes(slices: &[ResourceSlice], claims: &[ResourceClaim], driver: &str) -> (Vec<Node>, Vec<String>) {
    let mut gpus: BTreeMap<String, BTreeMap<u32, Published>> = BTreeMap::new();
    let mut problems = Vec::new();
    for s in slices.iter().filter(|s| s.spec.driver == driver) {
        let Some(node) = s.spec.node_name.as_deref() else { continue };
        let of_node = gpus.entry(node.to_string()).or_default();
        for d in s.spec.devices.iter().flatten() {
            let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k));
            let Some(index) = attr("index").and_then(|a| a.int).and_then(|i| u32::try_from(i).ok()) else { continue };
            let g = of_node.entry(index).or_default();
            if let Some(p) = attr("productName").and_then(|a| a.string.clone()) {
                g.product = Some(p);
            }
            if let Some(p) = attr("profile").and_then(|a| a.string.clone()).filter(|p| !p.is_empty()) {
                g.profiles.insert(p);
            }
            let occupied = |t: &k8s_openapi::api::resource::v1::DeviceTaint| {
                t.value.as_deref() == Some(gpupart_node::dra::unavailable::OCCUPIED)
            };
            if d.taints.iter().flatten().any(occupied) {
                g.outside = true;
            }
        }
    }
    let mut out: Vec<Node> = Vec::new();
    for (name, published) in gpus {
        let mut node = Node { name: name.clone(), gpus: Vec::new() };
        for (index, p) in published {
            let Some(model) = p.product.as_deref().and_then(|prod| model_of(prod, &p.profiles)) else {
                problems.push(format!(
                    "node {name}: GPU {index} ({}) is not a model gpupart knows",
                    p.product.as_deref().unwrap_or("no productName")
                ));
                continue;
            };
            let held = if p.outside {
                vec![Held { kind: gpupart_node::dra::devices::DeviceKind::Gpu, by: OUTSIDE.into() }]
            } else {
                Vec::new()
            };
            node.gpus.push(Gpu { index, table: model.profile_table(), mig_enabled: model.mig_capable(), held });
        }
        out.push(node);
    }
    for c in claims {
        let ns = c.metadata.namespace.as_deref().unwrap_or("default");
        let name = c.metadata.name.as_deref().unwrap_or_default();
        let Some(status) = c.status.as_ref() else { continue };
        let by = status
            .reserved_for
            .iter()
            .flatten()
            .find(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
            .map_or_else(|| claim_holder(ns, name), |r| format!("{ns}/{}", r.name));
        let results = status.allocation.as_ref().and_then(|a| a.devices.as_ref()).and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten().filter(|r| r.driver == driver) {
            let Some(at) = out.iter().position(|n| n.name == r.pool) else { continue };
            let table_of = |i: u32| out[at].gpus.iter().find(|g| g.index == i).map(|g| &g.table);
            let Some(d) = DeviceRef::parse(&r.device, table_of) else {
                problems.push(format!(
                    "claim {ns}/{name}: device {} of pool {} is not one gpupart publishes",
                    r.device, r.pool
                ));
                continue;
            };
            if let Some(g) = out[at].gpus.iter_mut().find(|g| g.index == d.gpu) {
                g.held.push(Held { kind: d.kind, by: by.clone() });
                if d.kind == gpupart_node::dra::devices::DeviceKind::Gpu {
                    g.mig_enabled = false;
                }
            }
        }
    }
    (out, problems)
}

/// Whether the scheduler found no node for `pod` (`PodScheduled=False`, `Unschedulable`) and it
/// is not bound.
pub fn unschedulable(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    !bound
        && phase == "Pending"
        && pod.metadata.deletion_timestamp.is_none()
        && crate::controller::pods::unschedulable_condition(pod).is_some()
}

/// The names of the ResourceClaims a pod uses (those made from a template once the claim
/// controller named them in the pod's status).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let statuses: BTreeMap<&str, &str> = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|s| Some((s.name.as_str(), s.resource_claim_name.as_deref()?)))
        .collect();
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone().or_else(|| statuses.get(c.name.as_str()).map(|s| s.to_string())))
        .collect()
}

/// The value a CEL expression compares `attribute` with (`….profile == '1g.10gb'`, either
/// quote), if it does.
fn compared(expr: &str, attribute: &str) -> Option<String> {
    let at = expr.find(&format!(".{attribute}"))?;
    let rest = expr[at + attribute.len() + 1..].trim_start().strip_prefix("==")?.trim_start();
    let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let body = &rest[1..];
    body.find(quote).map(|end| body[..end].to_string())
}

/// What one request asks, from its DeviceClass's and its own CEL selectors, if it is one device of
/// a MIG profile or whole GPUs of `driver`.
fn want_of(class: &DeviceClass, own: &[String], count: i64, driver: &str) -> Result<Want, String> {
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    let exprs: Vec<String> = class
        .spec
        .iter()
        .flat_map(|s| s.selectors.iter().flatten())
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
        .chain(own.iter().cloned())
        .collect();
    if !exprs.iter().any(|e| e.contains(driver)) {
        return Err(format!("DeviceClass {class_name} is not of driver {driver}"));
    }
    if let Some(p) = exprs.iter().find_map(|e| compared(e, "profile")) {
        return if count == 1 {
            Ok(Want::Mig(p))
        } else {
            Err(format!("asks for {count} MIG devices of {p}; only one is planned for"))
        };
    }
    if exprs.iter().find_map(|e| compared(e, "sharing")).as_deref() == Some("mps") {
        return Err(format!(
            "DeviceClass {class_name} asks for an MPS share; only MIG devices and whole GPUs are planned for"
        ));
    }
    match exprs.iter().find_map(|e| compared(e, "type")).as_deref() {
        Some("gpu") => u32::try_from(count).map(Want::Whole).map_err(|_| format!("asks for {count} GPUs")),
        _ => Err(format!("DeviceClass {class_name} names neither a MIG profile nor whole GPUs")),
    }
}

/// What a waiting pod asks of DRA devices of `driver`: its one unallocated claim with one request
/// (`Ok(None)` when every claim it uses is allocated or it uses none); `Err` says why the
/// defragmenter cannot plan for it.
pub fn want(
    pod: &Pod,
    claims: &BTreeMap<(String, String), &ResourceClaim>,
    classes: &BTreeMap<String, &DeviceClass>,
    driver: &str,
) -> Result<Option<Want>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut wants = Vec::new();
    for name in claim_names(pod) {
        let Some(c) = claims.get(&(ns.to_string(), name.clone())) else { continue };
        if c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some() {
            continue;
        }
        for r in
            c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref()).into_iter().flatten()
        {
            let Some(ex) = r.exactly.as_ref() else {
                return Err(format!("claim {ns}/{name}: request {} has no exact device request", r.name));
            };
            if ex.allocation_mode.as_deref().is_some_and(|m| m != "ExactCount") {
                return Err(format!("claim {ns}/{name}: request {} asks for all devices", r.name));
            }
            let class = classes
                .get(&ex.device_class_name)
                .ok_or_else(|| format!("claim {ns}/{name}: no DeviceClass {}", ex.device_class_name))?;
            let own: Vec<String> =
                ex.selectors.iter().flatten().filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone())).collect();
            wants.push(
                want_of(class, &own, ex.count.unwrap_or(1), driver).map_err(|e| format!("claim {ns}/{name}: {e}"))?,
            );
        }
    }
    // A classic extended resource a DeviceClass maps (the scheduler makes its claim).
    if wants.is_empty() {
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            for (res, q) in c.resources.iter().flat_map(|r| r.limits.iter().flatten()) {
                let Some(class) = classes
                    .values()
                    .find(|k| k.spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()) == Some(res.as_str()))
                else {
                    continue;
                };
                let count: i64 = q.0.trim().parse().map_err(|_| format!("asks for {res}: '{}'", q.0))?;
                wants.push(want_of(class, &[], count, driver)?);
            }
        }
    }
    match wants.len() {
        0 => Ok(None),
        1 => Ok(wants.pop()),
        n => Err(format!("asks for {n} devices in separate requests; only one is planned for")),
    }
}

#[cfg(test)]
mod tests;

/// Whether the agent publishes `reservation` on `node`: every device it makes unavailable carries
/// the reserved taint in the node's slices (only then is the room safe from the moved pods'
/// replacements).
pub fn reservation_published(
    slices: &[ResourceSlice],
    driver: &str,
    node: &Node,
    reservation: &gpupart_node::dra::reservation::Reservation,
    now: i64,
) -> bool {
    let tables: BTreeMap<u32, &crate::mig::ProfileTable> = node.gpus.iter().map(|g| (g.index, &g.table)).collect();
    let wanted: BTreeSet<String> = reservation
        .unavailable(now, |i| tables.get(&i).copied())
        .keys()
        .filter_map(|d| Some(d.name(tables.get(&d.gpu)?)))
        .collect();
    let tainted: BTreeSet<&str> = slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node.name.as_str()))
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| {
            d.taints.iter().flatten().any(|t| {
                t.value.as_deref() == Some(gpupart_node::dra::reservation::RESERVED) && t.effect == "NoSchedule"
            })
        })
        .map(|d| d.name.as_str())
        .collect();
    !wanted.is_empty() && wanted.iter().all(|w| tainted.contains(w.as_str()))
}

/// The nodes among `nodes` a pod may land on as the controller's fit rules judge its node
/// selector, required node affinity and tolerations (its CPU and memory are not judged: its
/// replacement's node is the scheduler's to pick among them).
pub fn lands(pod: &Pod, nodes: &[k8s_openapi::api::core::v1::Node]) -> BTreeSet<String> {
    let c = crate::controller::fit::constraints(pod);
    let room = crate::controller::fit::NodeRoom::default();
    nodes
        .iter()
        .filter(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            let labels = n.metadata.labels.clone().unwrap_or_default();
            let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            crate::controller::fit::blocked(&c, name, &labels, &taints, &room, "").is_none()
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}
