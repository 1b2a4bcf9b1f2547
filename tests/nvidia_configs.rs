//! Every config of NVIDIA's default mig-parted file that applies to a simulated GPU model applies
//! and asserts there, one after the other on the same node (so each is also a reconfiguration).

#[macro_use]
mod support;

use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::prepare::{targets, Target};
use support::{nvidia_config, Backend, Node, EIGHTY_GB};

on_both_backends!(a100_80gb, a100_40gb, a30, hopper, example_configs_apply);

/// Names of the default configs that resolve on `model`, with whether they touch a GPU.
fn applicable(model: &str) -> Vec<String> {
    let path = nvidia_config("default-mig-parted-config.yaml");
    let file = gpupart::config::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let backend = SimBackend::open(Some(&format!("{model}:2")), None).unwrap();
    let states = backend.observe_all().unwrap();
    file.configs
        .iter()
        .filter(|c| match targets(&states, c) {
            Ok(t) => t.iter().all(|t| !matches!(t, Target::Leave { .. })),
            Err(_) => false,
        })
        .map(|c| c.name.clone())
        .collect()
}

fn apply_all(b: Backend, model: &str, expect: &[&str]) {
    let names = applicable(model);
    assert_eq!(names, expect, "{model}");
    let node = Node::with(b, &format!("{model}:2"));
    let file = nvidia_config("default-mig-parted-config.yaml");
    let file = file.to_str().unwrap();
    for name in names.iter().chain(names.iter().rev()) {
        node.run(&["apply", "-f", file, "-c", name]).ok();
        node.run(&["assert", "-f", file, "-c", name]).ok();
    }
}

fn a100_80gb(b: Backend) {
    apply_all(b, "A100-SXM4-80GB", &EIGHTY_GB);
    apply_all(b, "A100-PCIE-80GB", &EIGHTY_GB);
}
fn a100_40gb(b: Backend) {
    let expect = [
        "all-disabled",
        "all-enabled",
        "all-1g.5gb",
        "all-1g.5gb.me",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-4g.20gb",
        "all-7g.40gb",
        "all-1g.10gb",
        "all-balanced",
    ];
    apply_all(b, "A100-SXM4-40GB", &expect);
    apply_all(b, "A100-PCIE-40GB", &expect);
}

fn a30(b: Backend) {
    apply_all(
        b,
        "A30-24GB",
        &[
            "all-disabled",
            "all-enabled",
            "all-1g.6gb",
            "all-1g.6gb.me",
            "all-2g.12gb",
            "all-2g.12gb.me",
            "all-4g.24gb",
            "all-balanced",
        ],
    );
}

fn hopper(b: Backend) {
    apply_all(b, "H100-SXM5-80GB", &EIGHTY_GB);
    apply_all(b, "H100-PCIE-80GB", &EIGHTY_GB);
    apply_all(
        b,
        "H100-NVL-94GB",
        &[
            "all-disabled",
            "all-enabled",
            "all-1g.12gb",
            "all-1g.12gb.me",
            "all-1g.24gb",
            "all-2g.24gb",
            "all-3g.47gb",
            "all-4g.47gb",
            "all-7g.94gb",
            "all-balanced",
        ],
    );
    apply_all(
        b,
        "H200-SXM-141GB",
        &[
            "all-disabled",
            "all-enabled",
            "all-balanced",
            "all-1g.18gb",
            "all-1g.18gb.me",
            "all-1g.35gb",
            "all-2g.35gb",
            "all-3g.71gb",
            "all-4g.71gb",
            "all-7g.141gb",
        ],
    );
}

fn example_configs_apply(b: Backend) {
    let node = Node::with(b, "A100-SXM4-40GB:8");
    let f = nvidia_config("mig-parted-example-config.yaml");
    let f = f.to_str().unwrap();
    for name in ["all-balanced", "custom-config", "all-1g.5gb", "all-3g.20gb", "all-disabled"] {
        node.run(&["apply", "-f", f, "-c", name]).ok();
        node.run(&["assert", "-f", f, "-c", name]).ok();
    }
    let node = Node::with(b, "A100-SXM4-80GB:4");
    let f = nvidia_config("mig-parted-example-dgx-station-80gb-config.yaml");
    let f = f.to_str().unwrap();
    node.run(&["apply", "-f", f, "-c", "all-balanced-dgx-station-80"]).ok();
    node.run(&["assert", "-f", f, "-c", "all-balanced-dgx-station-80"]).ok();
}
