//! The agent's `/metrics`: scraped while the agent runs on both backends, linted with `promtool
//! check metrics` (Debian's prometheus package, installed by scripts/test), values checked for known
//! layouts, and series of destroyed instances gone after a reconfiguration.

#[macro_use]
mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};
use support::baremetal::start;
use support::{promtool, Backend, Node};

on_both_backends!(metrics_follow_the_layout_and_pass_promtool, a_stuck_node_is_visible_and_alerts);

fn scrape(port: u16, accept: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

fn value(text: &str, series_prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(series_prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

fn instances(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("gpupart_mig_instance_info{"))
        .filter_map(|l| l.split("mig_uuid=\"").nth(1).and_then(|r| r.split('"').next()).map(str::to_string))
        .collect()
}

fn wait_for(port: u16, what: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = scrape(port, "*/*");
        if f(&t) {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{t}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metrics_follow_the_layout_and_pass_promtool(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2,V100-SXM2-16GB:1");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent = start(&node, &layout, &["--poll-interval", "100ms", "--metrics-interval", "1h"]);
    let port = agent.port;
    let text = wait_for(port, "8 MIG devices", |t| instances(t).len() == 8);
    promtool(&text);
    assert_eq!(value(&text, "gpupart_node_unallocated_gpus "), Some(1.0), "only the V100 is free");
    assert_eq!(value(&text, "gpupart_node_idle_without_mig_gpus "), Some(1.0));
    assert_eq!(value(&text, "gpupart_node_fragmented_gpus "), Some(0.0));
    assert_eq!(value(&text, "gpupart_last_collect_success "), Some(1.0));
    assert!(value(&text, "gpupart_last_collect_timestamp_seconds ").unwrap() > 1.7e9);
    // One metric per quantity: no family mixes units behind a `quantity` label.
    assert!(!text.contains("quantity="), "{text}");
    assert_eq!(value(&text, "gpupart_agent_state{state=\"success\"} "), Some(1.0));
    assert_eq!(value(&text, "gpupart_agent_state{state=\"failed\"} "), Some(0.0));
    assert!(value(&text, "gpupart_agent_last_success_timestamp_seconds ").unwrap() > 1.7e9);
    assert_eq!(value(&text, "gpupart_reconfigurations_total{kind=\"gi_create\",result=\"success\"}"), Some(8.0));
    assert!(
        text.contains("gpupart_gpu_partition_mode{") && text.contains("mode=\"none\"} 1"),
        "V100 has no partitions"
    );
    let open = scrape(port, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5");
    assert!(open.ends_with("# EOF\n") && open.contains("# TYPE gpupart_build info"), "OpenMetrics for Prometheus");

    let before = instances(&text);
    std::fs::write(&layout, "mixed-3g-2g\n").unwrap();
    let text = wait_for(port, "6 MIG devices", |t| instances(t).len() == 6);
    promtool(&text);
    let after = instances(&text);
    assert_eq!(before.iter().filter(|u| after.contains(u)).count(), 4, "kept devices keep their series");
    assert!(
        before.iter().filter(|u| !after.contains(u)).all(|u| !text.contains(u.as_str())),
        "destroyed devices' series are gone"
    );
    assert_eq!(value(&text, "gpupart_reconfigurations_total{kind=\"gi_destroy\",result=\"success\"}"), Some(4.0));
    assert!(
        value(&text, "gpupart_reconfiguration_duration_seconds_count{kind=\"gi_create\",result=\"success\"}").unwrap()
            >= 10.0
    );
}

/// A node that cannot reach its layout (a busy instance in the way) shows `failed`, its attempts
/// and failures by reason in `/metrics`; the documented alert rule fires on it (promtool test
/// rules over the scraped values), and the success afterwards is timestamped.
fn a_stuck_node_is_visible_and_alerts(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let cfg = support::example_config();
    node.apply(&cfg, "all-1g.10gb");
    node.attach(0, 1, 4242);
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-disabled\n").unwrap();
    let agent = start(&node, &layout, &["--metrics-interval", "1h"]);
    let text =
        wait_for(agent.port, "3 failed attempts", |t| value(t, "gpupart_agent_attempts ").is_some_and(|v| v >= 3.0));
    promtool(&text);
    assert_eq!(value(&text, "gpupart_agent_state{state=\"failed\"} "), Some(1.0), "{text}");
    assert_eq!(value(&text, "gpupart_agent_state{state=\"success\"} "), Some(0.0));
    assert!(value(&text, "gpupart_agent_failures_total{reason=\"busy\"} ").unwrap() >= 3.0, "{text}");
    assert_eq!(value(&text, "gpupart_agent_failures_total{reason=\"config\"} "), Some(0.0), "every reason is a series");
    assert_eq!(value(&text, "gpupart_agent_last_success_timestamp_seconds "), Some(0.0));
    check_alert_rule_fires();
    // The process goes away: the next attempt succeeds and is timestamped.
    let mut s = node.load();
    s.gpus[0].gpu_instances.iter_mut().flat_map(|g| g.compute_instances.iter_mut()).for_each(|c| c.processes.clear());
    node.save(&s);
    let text = wait_for(agent.port, "success", |t| value(t, "gpupart_agent_state{state=\"success\"} ") == Some(1.0));
    assert_eq!(value(&text, "gpupart_agent_attempts "), Some(0.0));
    assert!(value(&text, "gpupart_agent_last_success_timestamp_seconds ").unwrap() > 1.7e9);
}

/// deploy/alerts.yaml passes `promtool check rules`, and `promtool test rules` shows its
/// stuck-node alert firing after 10 minutes of `failed` and not before, and its unhealthy-GPU
/// alert firing for the fenced GPU only, a minute after the fence.
fn check_alert_rule_fires() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/alerts.yaml");
    let (ok, out) = support::tool("promtool", &["check", "rules", rules]);
    assert!(ok, "{out}");
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("alerts_test.yaml");
    std::fs::write(
        &test,
        format!(
            r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'gpupart_agent_state{{instance="gpu-node-1",state="failed"}}'
        values: '1x20'
    alert_rule_test:
      - eval_time: 5m
        alertname: GpupartNodeStuckFailed
        exp_alerts: []
      - eval_time: 15m
        alertname: GpupartNodeStuckFailed
        exp_alerts:
          - exp_labels: {{severity: warning, instance: gpu-node-1, state: failed}}
            exp_annotations:
              summary: "gpupart on gpu-node-1 has been failed for 10 min"
              description: "The requested layout cannot be applied: see gpupart_agent_attempts, gpupart_agent_failures_total and the node's Events (or the status file)."
  - interval: 1m
    input_series:
      - series: 'gpupart_gpu_healthy{{instance="gpu-node-1",gpu="0"}}'
        values: '1x10'
      - series: 'gpupart_gpu_healthy{{instance="gpu-node-1",gpu="1"}}'
        values: '1 1 0x8'
    alert_rule_test:
      - eval_time: 2m
        alertname: GpupartGpuUnhealthy
        exp_alerts: []
      - eval_time: 4m
        alertname: GpupartGpuUnhealthy
        exp_alerts:
          - exp_labels: {{severity: warning, instance: gpu-node-1, gpu: "1"}}
            exp_annotations:
              summary: "GPU 1 on gpu-node-1 is fenced after an NVML fault"
              description: "No new work is placed on it (see the node's GpuUnhealthy Event or `gpupart health`); once it is repaired or reset, bring it back with the gpupart.io/recover-gpus annotation (docs/health.md)."
"#
        ),
    )
    .unwrap();
    let (ok, out) = support::tool("promtool", &["test", "rules", test.to_str().unwrap()]);
    assert!(ok, "{out}");
}

/// deploy/prometheusrule.yaml is a PrometheusRule whose `spec` holds exactly the groups of
/// deploy/alerts.yaml, and its rules pass `promtool check rules` on their own.
#[test]
fn the_prometheus_rule_carries_the_same_rules_and_passes_promtool() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| -> serde_json::Value {
        serde_saphyr::from_str(&std::fs::read_to_string(root.join(p)).unwrap()).unwrap()
    };
    let (rule, alerts) = (read("deploy/prometheusrule.yaml"), read("deploy/alerts.yaml"));
    assert_eq!(
        (rule["apiVersion"].as_str(), rule["kind"].as_str()),
        (Some("monitoring.coreos.com/v1"), Some("PrometheusRule"))
    );
    assert_eq!(rule["metadata"]["namespace"], "gpupart-system");
    assert_eq!(rule["spec"]["groups"], alerts["groups"], "the same rules as alerts.yaml");
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec.yaml");
    std::fs::write(&spec, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let (ok, out) = support::tool("promtool", &["check", "rules", spec.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 4 rules found"), "{out}");
}
