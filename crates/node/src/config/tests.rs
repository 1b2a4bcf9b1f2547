use super::*;
use std::path::PathBuf;

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/nvidia-configs")
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

const HEAD: &str = "version: v1\nmig-configs:\n  c:\n";

#[test]
fn nvidia_mig_configs_parse() {
    let dir = reference_dir();
    let mut parsed = 0;
    for name in [
        "default-mig-parted-config.yaml",
        "mig-parted-example-config.yaml",
        "mig-parted-example-dgx-station-80gb-config.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| {
            panic!("{}: {e} (shared/reference must sit beside the repo)", dir.join(name).display())
        });
        let file = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        parsed += file.configs.len();
    }
    let default = parse(&std::fs::read_to_string(dir.join("default-mig-parted-config.yaml")).unwrap()).unwrap();
    assert_eq!(default.configs.len(), 81);
    let balanced = default.get("all-balanced").unwrap();
    assert_eq!(balanced.specs.len(), 12);
    assert_eq!(balanced.specs[0].filter[0].device_id, 0x2941_10DE);
    assert!(parsed > 81);
}

#[test]
fn parses_every_form_of_each_key() {
    let f = parse(
        r#"version: v1
mig-configs:
  mixed:
    - device-filter: "0x20B210DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1c.2g.20gb": 2, "3g.40gb": 1, "1g.10gb+me": 0, "1g.10gb": 1}
    - device-filter: ["0x20B010DE:0x134F10DE", "0x233010DE"]
      devices: [0, 3]
      mig-enabled: false
    - devices: all
      mig-enabled: true
      mig-devices: {}
"#,
    )
    .unwrap();
    let c = f.choose(None).unwrap();
    assert_eq!(c.specs[0].mig_devices.len(), 3, "zero counts are dropped");
    assert_eq!(c.specs[0].mig_devices[0].0.to_string(), "1c.2g.20gb");
    assert_eq!(c.specs[1].filter[0], DeviceFilter { device_id: 0x20B0_10DE, subsystem_id: Some(0x134F_10DE) });
    assert!(c.specs[1].filter[0].matches(0x20B0_10DE, Some(0x134F_10DE)));
    assert!(!c.specs[1].filter[0].matches(0x20B0_10DE, Some(0x1111_10DE)));
    assert!(c.specs[1].filter[1].matches(0x2330_10DE, None));
    assert_eq!(c.specs[1].devices, Devices::Indices(vec![0, 3]));
    assert!(c.specs[2].mig_enabled && c.specs[2].mig_devices.is_empty());
    // JSON is accepted too.
    let j = parse(r#"{"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": false}]}}"#).unwrap();
    assert_eq!(j.names(), vec!["a"]);
}

#[test]
fn errors_use_mig_parted_texts_and_name_the_place() {
    assert_eq!(err("version: v2\nmig-configs: {}\n"), "unknown version: 'v2'");
    assert_eq!(err("version: v1\nfoo: 1\nmig-configs: {}\n"), "unexpected field: foo");
    assert_eq!(
        err(&format!("{HEAD}    - devices: all\n      mig-enabled: true\n      extra: 1\n      mig-devices: {{}}\n")),
        "config 'c', entry 0, key 'extra': unexpected field: extra"
    );
    assert_eq!(
        err(&format!("{HEAD}    - devices: some\n      mig-enabled: false\n")),
        "config 'c', entry 0, key 'devices': invalid string input for 'devices': 'some'"
    );
    assert!(err(&format!("{HEAD}    - devices: 7\n      mig-enabled: false\n")).contains("key 'devices'"));
    assert_eq!(
        err(&format!("{HEAD}    - devices: all\n      mig-enabled: true\n")),
        "config 'c', entry 0, key 'mig-devices': missing required field 'mig-devices' when 'mig-enabled' is true"
    );
    assert_eq!(
        err(&format!("{HEAD}    - devices: all\n      mig-enabled: false\n      mig-devices: {{\"1g.10gb\": 1}}\n")),
        "config 'c', entry 0, key 'mig-devices': MIG devices included when 'mig-enabled' is false"
    );
    assert_eq!(
        err(&format!("{HEAD}    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"1g.10gb\": 0}}\n")),
        "config 'c', entry 0, key 'mig-devices': all counts for all MigProfiles are 0"
    );
    let e =
        err(&format!("{HEAD}    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"1g.10gb\": -1}}\n"));
    assert!(e.contains("invalid count -1 for '1g.10gb'"), "{e}");
    let e = err(&format!("{HEAD}    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"3g.40\": 1}}\n"));
    assert!(e.starts_with("config 'c', entry 0, key 'mig-devices': invalid MIG profile '3g.40'"), "{e}");
    let e = err(&format!("{HEAD}    - device-filter: 0x20B2\n      devices: all\n      mig-enabled: false\n"));
    assert!(e.contains("key 'device-filter'"), "{e}");
    let e = err(&format!("{HEAD}    - device-filter: \"nvidia\"\n      devices: all\n      mig-enabled: false\n"));
    assert!(e.contains("invalid device id 'nvidia'"), "{e}");
    let e = err(&format!("{HEAD}    - devices: all\n      mig-enabled: \"true\"\n"));
    assert!(e.contains("key 'mig-enabled'"), "{e}");
    let e = err("version: v1\nmig-configs:\n  c: []\n");
    assert!(e.contains("config 'c'"), "{e}");
    let e = err("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        4g.40gb: 1\n        4g.40gb: 1\n");
    assert!(e.contains("invalid YAML") && e.to_lowercase().contains("duplicate"), "{e}");
    assert!(err(": : :").starts_with("invalid YAML"));
}

#[test]
fn choose_by_name_or_single() {
    let f = parse("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n  b:\n    - devices: all\n      mig-enabled: false\n").unwrap();
    assert!(f.choose(None).unwrap_err().to_string().contains("choose one with -c (a, b)"));
    assert!(f.choose(Some("zz")).unwrap_err().to_string().contains("unknown config 'zz'"));
    assert_eq!(f.choose(Some("b")).unwrap().name, "b");
}

fn gpu(index: u32, device_id: u32, mig: bool) -> GpuIdent {
    GpuIdent { index, device_id, subsystem_id: None, mig_capable: mig, model: format!("m{index}") }
}

#[test]
fn selection_follows_mig_parted() {
    let f = parse(
        r#"version: v1
mig-configs:
  c:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - device-filter: "0x1DB110DE"
      devices: [2]
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
"#,
    )
    .unwrap();
    let c = f.choose(None).unwrap();
    let node =
        [gpu(0, 0x20B2_10DE, true), gpu(1, 0x20B2_10DE, true), gpu(2, 0x1DB1_10DE, false), gpu(3, 0x1DB1_10DE, false)];
    let s = select(c, &node).unwrap();
    assert!(matches!(&s[0], Selection::Enabled { entry: 0, devices } if devices[0].1 == 7));
    assert!(matches!(&s[1], Selection::Enabled { entry: 2, .. }), "the last entry wins");
    assert_eq!(s[2], Selection::Disabled { entry: 1, mps: None });
    assert_eq!(s[3], Selection::SkippedNoMig { entry: 0 });
    let bad = parse("version: v1\nmig-configs:\n  c:\n    - devices: [9]\n      mig-enabled: false\n").unwrap();
    let e = select(bad.choose(None).unwrap(), &node).unwrap_err().to_string();
    assert_eq!(e, "config 'c', entry 0, key 'devices': device index 9 is out of range (the node has 4 GPUs)");
    let bad =
        parse("version: v1\nmig-configs:\n  c:\n    - devices: [3]\n      mig-enabled: true\n      mig-devices: {}\n")
            .unwrap();
    let e = select(bad.choose(None).unwrap(), &node).unwrap_err().to_string();
    assert!(e.contains("GPU 3 (m3) does not support MIG"), "{e}");
}

#[test]
fn gpupart_workload_extension() {
    let f = parse("version: v1\ngpupart:\n  workload: {\"1g.10gb\": 0.7, \"3g.40gb\": 0.3}\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n").unwrap();
    assert_eq!(f.workload.len(), 2);
    assert_eq!(f.workload[0].1, 0.7);
    let e = parse("version: v1\ngpupart:\n  workload: {\"1g.10gb\": -1}\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n").unwrap_err().to_string();
    assert_eq!(e, "key 'gpupart.workload': invalid weight -1 for '1g.10gb': expected a number >= 0");
    let e =
        parse("version: v1\ngpupart:\n  other: 1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n")
            .unwrap_err()
            .to_string();
    assert!(e.contains("unexpected field: other"), "{e}");
}

const MPS_HEAD: &str = "version: v1\nmig-configs:\n  mps-node:\n    - devices: [0, 1]\n      mig-enabled: false\n";

#[test]
fn mps_block_parses_with_and_without_limits() {
    let f = parse(&format!(
        "{MPS_HEAD}      mps:\n        replicas: 4\n        active-thread-percentage: 25\n        pinned-memory-limit: 7G\n    - devices: [2]\n      mig-enabled: false\n      mps: {{replicas: 3, pinned-memory-limit: 512M}}\n    - devices: [3]\n      mig-enabled: false\n"
    ))
    .unwrap();
    let c = f.get("mps-node").unwrap();
    assert_eq!(
        c.specs[0].mps,
        Some(MpsSpec { replicas: 4, active_thread_percentage: Some(25), pinned_memory_limit_mib: Some(7168) })
    );
    assert_eq!(
        c.specs[1].mps,
        Some(MpsSpec { replicas: 3, active_thread_percentage: None, pinned_memory_limit_mib: Some(512) })
    );
    assert_eq!(c.specs[2].mps, None);
}

#[test]
fn mps_refusals_name_config_entry_and_key() {
    let on_mig = err("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 7}\n      mps: {replicas: 2}\n");
    assert!(
        on_mig.starts_with("config 'c', entry 0, key 'mps': MPS is configured on an entry with 'mig-enabled: true'"),
        "{on_mig}"
    );
    let cases = [
        ("mps: {replicas: 1}", "key 'mps.replicas': invalid replicas 1"),
        ("mps: {replicas: 49}", "key 'mps.replicas': invalid replicas 49"),
        ("mps: {replicas: two}", "key 'mps.replicas': invalid replicas 'two'"),
        ("mps: {active-thread-percentage: 50}", "key 'mps.replicas': missing required field 'replicas'"),
        ("mps: {replicas: 2, active-thread-percentage: 0}", "key 'mps.active-thread-percentage': invalid percentage 0"),
        (
            "mps: {replicas: 2, active-thread-percentage: 101}",
            "key 'mps.active-thread-percentage': invalid percentage 101",
        ),
        ("mps: {replicas: 2, pinned-memory-limit: 7GB}", "key 'mps.pinned-memory-limit': invalid memory limit '7GB'"),
        ("mps: {replicas: 2, pinned-memory-limit: 0M}", "key 'mps.pinned-memory-limit': invalid memory limit '0M'"),
        ("mps: {replicas: 2, pinned-memory-limit: 7}", "key 'mps.pinned-memory-limit': invalid memory limit 7"),
        ("mps: {replicas: 2, clients: 3}", "key 'mps.clients': unexpected field: clients"),
        ("mps: 4", "key 'mps': expected a mapping"),
    ];
    for (block, want) in cases {
        let e = err(&format!("{MPS_HEAD}      {block}\n"));
        assert!(e.starts_with("config 'mps-node', entry 0, ") && e.contains(want), "{block}: {e}");
    }
}

#[test]
fn memory_limits_take_m_and_g() {
    assert_eq!(parse::parse_mem_limit("7G"), Some(7168));
    assert_eq!(parse::parse_mem_limit("4096M"), Some(4096));
    assert_eq!(parse::parse_mem_limit("1g"), Some(1024));
    for bad in ["", "G", "7", "7GiB", "-1G", "1.5G", "0G"] {
        assert_eq!(parse::parse_mem_limit(bad), None, "{bad}");
    }
}
