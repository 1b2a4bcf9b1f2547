//! The DRA deployment artefacts: deploy/dra/*.yaml validate against the Kubernetes schemas, a
//! DeviceClass maps `nvidia.com/mig-<profile>` for every profile of NVIDIA's default config, the
//! DaemonSet runs `agent --dra` with flags the binary knows, and its RBAC grants what the plugin
//! asks (every request of an end-to-end run) and no write on claims.

mod support;

use std::path::Path;
use support::rbac::{attributes, Permissions};
use support::tool;

fn repo(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(file).to_str().unwrap().to_string()
}

fn documents_of(file: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(&std::fs::read_to_string(repo(file)).unwrap()).unwrap()
}

#[test]
fn dra_manifests_validate_against_kubernetes_schemas() {
    for f in ["deploy/dra/deviceclasses.yaml", "deploy/dra/daemonset.yaml", "deploy/dra/admission-policy.yaml"] {
        let (ok, out) = tool("kubernetes-validate", &["--strict", &repo(f)]);
        assert!(ok, "{f}: {out}");
    }
}

/// Every MIG profile named in NVIDIA's default mig-parted config (without an extension such as
/// `+me` or `+gfx`: resource names cannot hold `+`).
fn default_config_profiles() -> Vec<String> {
    let text = std::fs::read_to_string(support::nvidia_config("default-mig-parted-config.yaml")).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let mut out = Vec::new();
    for entries in doc["mig-configs"].as_object().unwrap().values() {
        for e in entries.as_array().unwrap() {
            for p in e["mig-devices"].as_object().into_iter().flat_map(|m| m.keys()) {
                if !p.contains('+') && !out.contains(p) {
                    out.push(p.clone());
                }
            }
        }
    }
    assert!(out.len() > 40, "{out:?}");
    out
}

#[test]
fn every_default_profile_has_a_class_mapping_its_extended_resource() {
    let classes = documents_of("deploy/dra/deviceclasses.yaml");
    assert!(classes.iter().all(|c| c["kind"] == "DeviceClass"));
    let by_resource = |r: &str| classes.iter().find(|c| c["spec"]["extendedResourceName"] == r);
    for p in default_config_profiles() {
        let c =
            by_resource(&format!("nvidia.com/mig-{p}")).unwrap_or_else(|| panic!("no class for nvidia.com/mig-{p}"));
        let expr = c["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(expr.contains(&format!("profile == '{p}'")) && expr.contains("type == 'mig'"), "{expr}");
        assert!(expr.contains("device.driver == 'gpu.gpupart.io'"), "{expr}");
    }
    for (name, ty, sharing) in [
        ("gpu.gpupart.io", "gpu", Some("none")),
        ("mps.gpupart.io", "gpu", Some("mps")),
        ("mig.gpupart.io", "mig", None),
    ] {
        let c = classes.iter().find(|c| c["metadata"]["name"] == name).unwrap_or_else(|| panic!("no {name}"));
        let expr = c["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(expr.contains(&format!("type == '{ty}'")), "{expr}");
        if let Some(s) = sharing {
            assert!(
                expr.contains(&format!("sharing == '{s}'")),
                "{name}: a whole GPU and an MPS share are told apart: {expr}"
            );
        }
    }
}

#[test]
fn the_daemonset_runs_the_plugin_with_known_flags_and_mounts_the_kubelet_dirs() {
    let docs = documents_of("deploy/dra/daemonset.yaml");
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let args: Vec<String> = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(&args[..2], ["agent", "--dra"]);
    let help = support::gpupart(&["agent", "--help"], &[]).ok().stdout;
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap();
        assert!(help.contains(flag), "{flag} is not an agent flag");
    }
    let mounts: Vec<&str> = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for dir in [
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
        "/var/lib/gpupart",
        "/run/gpupart",
    ] {
        assert!(mounts.contains(&dir), "{dir} not mounted: {mounts:?}");
    }
}

#[test]
fn the_plugins_requests_are_all_allowed_and_claims_are_read_only() {
    let p = Permissions::of(&[&repo("deploy/dra/daemonset.yaml")], "gpupart-system", "gpupart-dra");
    for verb in ["create", "update", "patch", "delete"] {
        let a = attributes(
            if verb == "create" {
                "POST"
            } else if verb == "update" {
                "PUT"
            } else if verb == "patch" {
                "PATCH"
            } else {
                "DELETE"
            },
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c",
        );
        let a = if verb == "create" {
            attributes("POST", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims")
        } else {
            a
        };
        assert!(!p.allows(&a), "claims are never written ({verb})");
    }
    // A run that publishes, prepares and unprepares.
    let rig = support::dra_rig::DraRig::start("A100-SXM4-80GB:1");
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    rig.mig_claim("c", "2g.20gb");
    rig.schedule("c").unwrap();
    rig.prepare("c").unwrap();
    assert_eq!(rig.unprepare("c"), "");
    rig.wait_caught_up();
    let requests = rig.api.state().requests;
    support::rbac::assert_allowed(&p, &requests, "gpupart agent --dra");
}
