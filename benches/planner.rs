//! Planning time for an 8-GPU A100-SXM4-80GB node over every ordered pair of NVIDIA's default
//! configs that apply to it, plus the transition-matrix figure: GPU-instance operations gpupart
//! plans against a mig-parted-style full rebuild of every GPU whose layout differs.
//!
//! Run: `cargo bench --bench planner` (needs ../shared/reference beside the repository).

use criterion::{criterion_group, criterion_main, Criterion};
use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::config::{self, ConfigFile};
use gpupart::exec::ExecOptions;
use gpupart::observed::GpuState;
use gpupart::prepare::{prepare, targets, Target};
use gpupart::reconfigure::{self, Options};
use std::time::{Duration, Instant};

const NODE: &str = "A100-SXM4-80GB:8";

fn default_file() -> ConfigFile {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/reference/nvidia-configs/default-mig-parted-config.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    config::parse(&text).expect("NVIDIA's default config parses")
}

/// The node's GPUs after applying `name` to a fresh simulated node.
fn layout(file: &ConfigFile, name: &str) -> Vec<GpuState> {
    let backend = SimBackend::open(Some(NODE), None).expect("simulator");
    let opts = Options {
        force: false,
        mode_only: false,
        exec: ExecOptions { dry_run: false, parallel: 8, skip_reset: false, stop: None },
    };
    let pass = reconfigure::run(&backend, file.get(name).expect("config"), opts).expect("applies");
    assert_eq!(pass.failed(), 0);
    backend.observe_all().expect("observe")
}

fn applicable(file: &ConfigFile) -> Vec<String> {
    let states = SimBackend::open(Some(NODE), None).and_then(|b| b.observe_all()).expect("simulator");
    file.configs
        .iter()
        .filter(|c| targets(&states, c).is_ok_and(|t| t.iter().all(|t| !matches!(t, Target::Leave { .. }))))
        .map(|c| c.name.clone())
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn transition_matrix(c: &mut Criterion) {
    let file = default_file();
    let names = applicable(&file);
    let layouts: Vec<Vec<GpuState>> = names.iter().map(|n| layout(&file, n)).collect();
    let (mut planned, mut rebuild, mut pairs) = (0usize, 0usize, 0usize);
    let mut medians = Vec::new();
    println!("\n{:<16} {:<16} {:>8} {:>8} {:>10}", "from", "to", "gpupart", "rebuild", "median µs");
    for (i, from) in names.iter().enumerate() {
        for (j, to) in names.iter().enumerate() {
            if i == j {
                continue;
            }
            let cfg = file.get(to).expect("config");
            let jobs = prepare(layouts[i].clone(), cfg, false, false).expect("plans");
            let ops: usize =
                jobs.iter().filter_map(|j| j.plan.as_ref()).map(|p| p.destroy.len() + p.create.len()).sum();
            // mig-parted clears and rebuilds every GPU whose profile multiset differs.
            let full: usize = layouts[i]
                .iter()
                .zip(&layouts[j])
                .map(|(a, b)| {
                    let (mut x, mut y) = (a.device_names(), b.device_names());
                    x.sort();
                    y.sort();
                    if x == y {
                        0
                    } else {
                        a.instances.len() + b.instances.len()
                    }
                })
                .sum();
            let samples: Vec<Duration> = (0..50)
                .map(|_| {
                    let states = layouts[i].clone();
                    let t = Instant::now();
                    let jobs = prepare(states, cfg, false, false).expect("plans");
                    let d = t.elapsed();
                    std::hint::black_box(jobs);
                    d
                })
                .collect();
            let m = median(samples);
            medians.push(m);
            println!("{from:<16} {to:<16} {ops:>8} {full:>8} {:>10.1}", m.as_secs_f64() * 1e6);
            planned += ops;
            rebuild += full;
            pairs += 1;
        }
    }
    let worst = medians.iter().max().copied().unwrap_or_default();
    println!(
        "\n{pairs} ordered pairs of {} configs on {NODE}: gpupart plans {planned} GI destroy+create operations, \
         a full rebuild {rebuild} ({:.1}% fewer)",
        names.len(),
        100.0 * (1.0 - planned as f64 / rebuild.max(1) as f64)
    );
    println!(
        "planning time per 8-GPU node: median of pair medians {:.1} µs, worst pair median {:.1} µs\n",
        median(medians.clone()).as_secs_f64() * 1e6,
        worst.as_secs_f64() * 1e6
    );

    let balanced = file.get("all-balanced").expect("config").clone();
    let from = layouts[names.iter().position(|n| n == "all-1g.10gb").expect("all-1g.10gb")].clone();
    c.bench_function("plan 8 GPUs all-1g.10gb -> all-balanced", |b| {
        b.iter(|| prepare(std::hint::black_box(from.clone()), &balanced, false, false).expect("plans"))
    });
    let empty = SimBackend::open(Some(NODE), None).and_then(|b| b.observe_all()).expect("simulator");
    c.bench_function("plan 8 GPUs empty -> all-balanced", |b| {
        b.iter(|| prepare(std::hint::black_box(empty.clone()), &balanced, false, false).expect("plans"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = transition_matrix
}
criterion_main!(benches);
