use super::*;
use gpupart_node::dra::devices::DeviceKind;
use serde_json::json;

const DRIVER: &str = "gpu.gpupart.io";

fn slice(node: &str, devices: serde_json::Value) -> ResourceSlice {
    serde_json::from_value(json!({"metadata": {"name": format!("{node}-s")}, "spec": {
        "driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}))
    .expect("a slice")
}

fn device(name: &str, index: i64, product: &str, profile: Option<&str>, taint: Option<&str>) -> serde_json::Value {
    let mut attributes = json!({"index": {"int": index}, "productName": {"string": product}});
    if let Some(p) = profile {
        attributes["profile"] = json!({"string": p});
    }
    let mut d = json!({"name": name, "attributes": attributes});
    if let Some(t) = taint {
        d["taints"] = json!([{"key": format!("{DRIVER}/unavailable"), "value": t, "effect": "NoSchedule"}]);
    }
    d
}

fn claim(name: &str, pod: Option<&str>, device: Option<&str>, request: serde_json::Value) -> ResourceClaim {
    let mut c = json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {"devices": {"requests": [request]}}});
    if let Some(d) = device {
        c["status"] = json!({"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": d}]}}});
        if let Some(p) = pod {
            c["status"]["reservedFor"] = json!([{"resource": "pods", "name": p, "uid": "u"}]);
        }
    }
    serde_json::from_value(c).expect("a claim")
}

fn mig_request(profile: &str) -> serde_json::Value {
    json!({"name": "gpu", "exactly": {"deviceClassName": "mig.gpupart.io", "count": 1,
        "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].profile == \"{profile}\"")}}]}})
}

fn classes() -> Vec<DeviceClass> {
    let class = |name: &str, ty: &str, extra: &str, ext: Option<&str>| {
        let expr = format!("device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{ty}'{extra}");
        let mut c = json!({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}});
        if let Some(e) = ext {
            c["spec"]["extendedResourceName"] = json!(e);
        }
        serde_json::from_value::<DeviceClass>(c).expect("a class")
    };
    vec![
        class("gpu.gpupart.io", "gpu", "", None),
        class("mig.gpupart.io", "mig", "", None),
        class(
            "mig-3g.40gb.gpupart.io",
            "mig",
            " && device.attributes['gpu.gpupart.io'].profile == '3g.40gb'",
            Some("nvidia.com/mig-3g.40gb"),
        ),
        class("other", "gpu", "", None),
        class("mps.gpupart.io", "gpu", " && device.attributes['gpu.gpupart.io'].sharing == 'mps'", None),
    ]
    .into_iter()
    .map(|mut c| {
        if c.metadata.name.as_deref() == Some("other") {
            c.spec = None;
        }
        c
    })
    .collect()
}

#[test]
fn gpus_and_holders_read_from_the_published_devices_and_the_allocated_claims() {
    let a100 = "NVIDIA A100-SXM4-80GB";
    let slices = [slice(
        "n1",
        json!([
            device("gpu-0-mig-1g-10gb-19-0", 0, a100, Some("1g.10gb"), None),
            device("gpu-0", 0, a100, None, None),
            device("gpu-1", 1, a100, None, Some("occupied-outside-claims")),
            device("gpu-2", 2, "NVIDIA Z999", None, None),
        ]),
    )];
    let claims = [
        claim("a-gpu", Some("a"), Some("gpu-0-mig-1g-10gb-19-0"), mig_request("1g.10gb")),
        claim("lone", None, Some("gpu-0-mig-1g-10gb-19-1"), mig_request("1g.10gb")),
        claim("waiting", None, None, mig_request("7g.80gb")),
        claim("bad", None, Some("gpu-0-mig-9g-10gb-99-0"), mig_request("1g.10gb")),
    ];
    let (nodes, problems) = nodes(&slices, &claims, DRIVER);
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1], "GPU 2's model is unknown");
    assert!(problems.iter().any(|p| p.contains("GPU 2 (NVIDIA Z999)")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("claim ml/bad")), "{problems:?}");
    let holders: Vec<&str> = n.gpus[0].held.iter().map(|h| h.by.as_str()).collect();
    assert_eq!(holders, vec!["ml/a", "claim ml/lone"]);
    assert!(matches!(n.gpus[0].held[0].kind, DeviceKind::Mig { placement, .. } if placement.start == 0));
    assert_eq!(n.gpus[1].held, vec![Held { kind: DeviceKind::Gpu, by: OUTSIDE.into() }], "occupied outside claims");
    assert_eq!(nodes_of_other_driver(&slices), 0);
}

fn nodes_of_other_driver(slices: &[ResourceSlice]) -> usize {
    nodes(slices, &[], "other.example.com").0.len()
}

fn waiting_pod(claims: serde_json::Value, limits: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "llm", "namespace": "ml"}, "spec": {
        "resourceClaims": claims,
        "containers": [{"name": "m", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "llm-gpu-x1"}]}}))
    .expect("a pod")
}

#[test]
fn a_waiting_pod_asks_what_its_unallocated_claim_or_its_extended_resource_names() {
    let classes = classes();
    let by_class: BTreeMap<String, &DeviceClass> =
        classes.iter().map(|c| (c.metadata.name.clone().unwrap_or_default(), c)).collect();
    let seven = claim("llm-gpu-x1", None, None, mig_request("7g.80gb"));
    let whole =
        claim("tp", None, None, json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.gpupart.io", "count": 2}}));
    let done = claim(
        "done",
        Some("llm"),
        Some("gpu-0"),
        json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.gpupart.io"}}),
    );
    let strange = claim("odd", None, None, json!({"name": "gpu", "exactly": {"deviceClassName": "other"}}));
    let share = claim("share", None, None, json!({"name": "gpu", "exactly": {"deviceClassName": "mps.gpupart.io"}}));
    let all = [seven, whole, done, strange, share];
    let claims: BTreeMap<(String, String), &ResourceClaim> =
        all.iter().map(|c| (("ml".to_string(), c.metadata.name.clone().unwrap_or_default()), c)).collect();
    // From the template, as the claim controller named it in the pod's status.
    let pod = waiting_pod(json!([{"name": "gpu", "resourceClaimTemplateName": "one-7g"}]), json!({}));
    assert!(unschedulable(&pod));
    assert_eq!(want(&pod, &claims, &by_class, DRIVER), Ok(Some(Want::Mig("7g.80gb".into()))));
    let pod = waiting_pod(json!([{"name": "gpu", "resourceClaimName": "tp"}]), json!({}));
    assert_eq!(want(&pod, &claims, &by_class, DRIVER), Ok(Some(Want::Whole(2))));
    let pod = waiting_pod(json!([{"name": "gpu", "resourceClaimName": "done"}]), json!({}));
    assert_eq!(want(&pod, &claims, &by_class, DRIVER), Ok(None), "allocated already");
    let pod = waiting_pod(json!([{"name": "gpu", "resourceClaimName": "odd"}]), json!({}));
    let e = want(&pod, &claims, &by_class, DRIVER).expect_err("not ours");
    assert!(e.contains("claim ml/odd") && e.contains("DeviceClass other"), "{e}");
    let pod = waiting_pod(json!([{"name": "gpu", "resourceClaimName": "share"}]), json!({}));
    let e = want(&pod, &claims, &by_class, DRIVER).expect_err("an MPS share is not a whole GPU");
    assert!(e.contains("MPS share"), "{e}");
    let pod = waiting_pod(json!([]), json!({"nvidia.com/mig-3g.40gb": "1"}));
    assert_eq!(want(&pod, &claims, &by_class, DRIVER), Ok(Some(Want::Mig("3g.40gb".into()))), "a classic request");
    let pod = waiting_pod(json!([]), json!({"cpu": "1"}));
    assert_eq!(want(&pod, &claims, &by_class, DRIVER), Ok(None));
}
