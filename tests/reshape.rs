//! A change of the compute-instance split inside a GPU instance that stays (`3g.40gb` ↔ three
//! `1c.3g.40gb`) keeps the GPU instance and redoes only its compute instances, through the real
//! binary on both backends.

#[macro_use]
mod support;

use support::{Backend, Node};

on_both_backends!(a_new_ci_split_keeps_the_gpu_instance);

const CONFIG: &str = "version: v1
mig-configs:
  two-3g:
    - devices: all
      mig-enabled: true
      mig-devices:
        3g.40gb: 2
  split:
    - devices: all
      mig-enabled: true
      mig-devices:
        1c.3g.40gb: 3
        3g.40gb: 1
";

/// (GPU-instance id, placement start) of GPU 0's GIs, sorted.
fn gis(node: &Node) -> Vec<(u64, u64)> {
    let s = node.status();
    let mut v: Vec<(u64, u64)> = s["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["gpu_instance_id"].as_u64().unwrap(), i["placement"]["start"].as_u64().unwrap()))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn a_new_ci_split_keeps_the_gpu_instance(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let file = node.config("c.yaml", CONFIG);
    node.apply(&file, "two-3g");
    let before = gis(&node);
    assert_eq!(before.len(), 2);
    let out = node.run(&["apply", "-f", &file, "-c", "split"]).ok();
    assert!(out.stdout.contains("reshape  3g.40gb@"), "{}", out.all());
    assert!(!out.stdout.contains("destroy ") && !out.stdout.contains("create "), "{}", out.all());
    assert!(out.stdout.contains("GPU instances kept 2, destroyed 0, created 0"), "{}", out.all());
    assert_eq!(gis(&node), before, "the GPU instances stay");
    node.run(&["assert", "-f", &file, "-c", "split"]).ok();
    let devices: Vec<String> = node.status()["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["profile"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(devices.iter().filter(|d| *d == "1c.3g.40gb").count(), 3, "{devices:?}");
    // And back: still the same GPU instances.
    node.run(&["apply", "-f", &file, "-c", "two-3g"]).ok();
    assert_eq!(gis(&node), before);
    node.run(&["assert", "-f", &file, "-c", "two-3g"]).ok();
}
