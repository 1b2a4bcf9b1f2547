//! Wall time of a full 8-GPU reconfiguration on the simulator with a per-operation delay that
//! models real NVML latencies, concurrent (`--parallel 8`) against sequential (`--parallel 1`).
//! Prints a table. Run: `cargo bench --bench reconfigure`.

use gpupart::backend::sim::SimBackend;
use gpupart::config::{self, ConfigFile};
use gpupart::exec::ExecOptions;
use gpupart::reconfigure::{self, Options};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
"#;

fn pass(backend: &SimBackend, file: &ConfigFile, name: &str, parallel: usize) -> (Duration, usize) {
    let opts = Options {
        force: false,
        mode_only: false,
        exec: ExecOptions { dry_run: false, parallel, skip_reset: false, stop: None },
    };
    let t = Instant::now();
    let p = reconfigure::run(backend, file.get(name).expect("config"), opts).expect("applies");
    assert_eq!(p.failed(), 0);
    let steps = p.reports.iter().map(|r| r.steps.len()).sum();
    (t.elapsed(), steps)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful. Run either way.
    let file = config::parse(CONFIG).expect("config");
    let delay = Duration::from_millis(50);
    println!("8 x A100-SXM4-80GB, {} ms per NVML operation", delay.as_millis());
    println!("{:<34} {:>10} {:>8} {:>10}", "transition", "parallel", "ops", "wall s");
    for (from, to) in [("all-1g.10gb", "all-balanced"), ("all-balanced", "all-1g.10gb")] {
        let mut walls = Vec::new();
        for parallel in [1usize, 8] {
            let backend = SimBackend::open(Some("A100-SXM4-80GB:8"), None).expect("simulator");
            pass(&backend, &file, from, 8);
            let backend = backend.with_op_delay(delay);
            let (wall, ops) = pass(&backend, &file, to, parallel);
            println!("{:<34} {parallel:>10} {ops:>8} {:>10.2}", format!("{from} -> {to}"), wall.as_secs_f64());
            walls.push(wall);
        }
        println!("{:<34} speed-up {:.1}x", "", walls[0].as_secs_f64() / walls[1].as_secs_f64());
    }
}
