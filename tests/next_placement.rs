//! `apply` places new instances for the change after this one, through the real binary on both
//! backends: uniform one-instance swaps by default, the config file's `gpupart.workload` mix when
//! it has one.

#[macro_use]
mod support;

use support::{Backend, Node};

on_both_backends!(three_1g20_leave_room_for_a_4g, the_workload_mix_steers_placements);

const UNIFORM: &str = "version: v1
mig-configs:
  three:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.20gb: 3
  grow:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.20gb: 2
        4g.40gb: 1
";

fn three_1g20_leave_room_for_a_4g(b: Backend) {
    // Three 1g.20gb at 0, 4 and 6 (not 0, 2, 4): replacing one by a 4g.40gb (slices 0-3) then
    // costs one destroy and one create.
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let file = node.config("c.yaml", UNIFORM);
    node.apply(&file, "three");
    let out = node.run(&["apply", "-f", &file, "-c", "grow"]).ok();
    assert!(out.stdout.contains("GPU instances kept 2, destroyed 1, created 1"), "{}", out.all());
    node.run(&["assert", "-f", &file, "-c", "grow"]).ok();
}

const LAYOUTS: &str = "mig-configs:
  start:
    - devices: all
      mig-enabled: true
      mig-devices:
        3g.40gb: 1
        2g.20gb: 1
        1g.10gb: 1
  grow:
    - devices: all
      mig-enabled: true
      mig-devices:
        4g.40gb: 1
        2g.20gb: 1
        1g.10gb: 1
";

/// GPU-instance operations of `start` → `grow` on a fresh GPU, with the file `text`.
fn grow(b: Backend, text: &str) -> String {
    let node = Node::with(b, "A100-SXM4-80GB:1");
    let file = node.config("c.yaml", text);
    node.apply(&file, "start");
    let out = node.run(&["apply", "-f", &file, "-c", "grow"]).ok();
    node.run(&["assert", "-f", &file, "-c", "grow"]).ok();
    out.stdout
}

fn the_workload_mix_steers_placements(b: Backend) {
    // With 4g.40gb the only profile the workload adds, the 3g.40gb goes to slices 0-3, where a
    // 4g.40gb can replace it alone; under uniform swaps it goes to 4-7 and the same change moves
    // the two small instances too.
    let mixed = grow(b, &format!("version: v1\ngpupart:\n  workload:\n    4g.40gb: 1\n{LAYOUTS}"));
    assert!(mixed.contains("GPU instances kept 2, destroyed 1, created 1"), "{mixed}");
    let uniform = grow(b, &format!("version: v1\n{LAYOUTS}"));
    assert!(uniform.contains("GPU instances kept 0, destroyed 3, created 3"), "{uniform}");
}
