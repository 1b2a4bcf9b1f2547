//! Every config of NVIDIA's default mig-parted file that applies to a simulated GPU model applies
//! and asserts there, one after the other on the same node (so each is also a reconfiguration).

#[macro_use]
mod support;

use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::prepare::{targets, Target};
use support::{nvidia_config, Backend, Node, EIGHTY_GB};

on_both_backends!(a100_80gb, a100_40gb, a30, hopper, blackwell_and_more_hopper, example_configs_apply);

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

fn blackwell_and_more_hopper(b: Backend) {
    for (model, expect) in [
        (
            "B200-180GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-1g.23gb",
                "all-1g.23gb.me",
                "all-1g.45gb",
                "all-2g.45gb",
                "all-3g.90gb",
                "all-4g.90gb",
                "all-7g.180gb",
                "all-balanced",
            ][..],
        ),
        (
            "GB200-186GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-1g.23gb",
                "all-1g.23gb.me",
                "all-1g.47gb",
                "all-2g.47gb",
                "all-3g.93gb",
                "all-4g.93gb",
                "all-7g.186gb",
                "all-balanced",
            ][..],
        ),
        (
            "GB200-186GB-R570",
            &[
                "all-disabled",
                "all-enabled",
                "all-1g.24gb.me",
                "all-1g.24gb",
                "all-1g.47gb",
                "all-2g.47gb",
                "all-3g.95gb",
                "all-4g.95gb",
                "all-7g.189gb",
            ][..],
        ),
        (
            "B300-269GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-balanced",
                "all-1g.34gb",
                "all-1g.34gb.me",
                "all-1g.67gb",
                "all-2g.67gb",
                "all-3g.135gb",
                "all-4g.135gb",
                "all-7g.269gb",
            ][..],
        ),
        (
            "GB300-278GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-balanced",
                "all-1g.35gb",
                "all-1g.35gb.me",
                "all-1g.70gb",
                "all-2g.70gb",
                "all-3g.139gb",
                "all-4g.139gb",
                "all-7g.278gb",
            ][..],
        ),
        (
            "RTX-PRO-6000-96GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-1g.24gb.gfx",
                "all-1g.24gb.me.all",
                "all-1g.24gb-me",
                "all-2g.48gb",
                "all-2g.48gb.gfx",
                "all-2g.48gb.me.all",
                "all-2g.48gb-me",
                "all-4g.96gb",
                "all-4g.96gb.gfx",
                "all-1g.24gb.me",
                "all-1g.24gb",
                "all-balanced",
            ][..],
        ),
        (
            "GH200-144GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-balanced",
                "all-1g.18gb",
                "all-1g.18gb.me",
                "all-1g.36gb",
                "all-2g.36gb",
                "all-3g.72gb",
                "all-4g.72gb",
                "all-7g.144gb",
            ][..],
        ),
        (
            "H100-96GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-1g.12gb",
                "all-1g.12gb.me",
                "all-1g.24gb",
                "all-2g.24gb",
                "all-3g.48gb",
                "all-4g.48gb",
                "all-7g.96gb",
                "all-balanced",
            ][..],
        ),
        (
            "H200-NVL-141GB",
            &[
                "all-disabled",
                "all-enabled",
                "all-balanced",
                "all-1g.18gb",
                "all-1g.18gb.me",
                "all-2g.35gb",
                "all-3g.71gb",
                "all-4g.71gb",
                "all-7g.141gb",
            ][..],
        ),
    ] {
        apply_all(b, model, expect);
    }
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
