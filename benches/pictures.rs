//! Cluster picture figures (prints a table): `frag --cluster -o svg` rendering time and size for
//! 1,000 and 5,000 nodes of 8 × A100-80GB with mixed layouts (busy, foreign and stranded
//! instances, MPS and unhealthy GPUs), one page of the default 200 rows and all rows on one page.
//! Target: 1,000 nodes in under a second, each page under 2 MB. Run: `cargo bench --bench pictures`.

use gpupart::fleet::current::from_annotation;
use gpupart::picture::cluster::{order, render, NodeView, Page, DEFAULT_PAGE_SIZE};
use std::time::{Duration, Instant};

/// One node's `gpus` annotation, in the agent's format (docs/metrics.md), varied by `k`.
fn gpus(k: usize) -> String {
    let layouts = [
        r#""mode":"mig","layout":["3g.40gb@4*","2g.20gb@0","1g.10gb@2","1g.10gb@3*"]"#,
        r#""mode":"mig","layout":["1g.10gb@0*","1g.10gb@1","1g.10gb@2*","1g.10gb@3","1g.10gb@4","1g.10gb@5","1g.10gb@6*"]"#,
        r#""mode":"mig","layout":["3g.40gb@0*","1g.10gb@6"],"foreign":["1g.10gb@6"]"#,
        r#""mode":"mig","layout":["7g.80gb@0*"]"#,
        r#""mode":"mig","layout":[]"#,
        r#""mode":"mps","slots":4,"slotsUsed":2"#,
        r#""mode":"none","busy":true,"unhealthy":"XID 79""#,
        r#""mode":"none","busy":false"#,
    ];
    let gpus: Vec<String> = (0..8)
        .map(|i| format!(r#"{{"i":{i},"model":"A100-SXM4-80GB",{}}}"#, layouts[(k * 3 + i) % layouts.len()]))
        .collect();
    format!("[{}]", gpus.join(","))
}

fn nodes(n: usize) -> (Vec<NodeView>, gpupart_cluster::frag::ClusterFrag) {
    let published: Vec<(String, Option<String>)> = (0..n)
        .map(|k| {
            let free = (k % 17) as f64 * 0.25;
            let frag = format!(
                r#"{{"ratio":0.1,"fragmentedGpus":{},"unallocatedGpus":{free},"wholeFreeGpus":{}}}"#,
                free / 10.0,
                k % 3
            );
            (format!("gpu-node-{k:05}.example.internal"), Some(frag))
        })
        .collect();
    let c = gpupart_cluster::frag::cluster(&published).expect("figures");
    let pools = ["shared", "dedicated", "mps", "batch"];
    let mut views: Vec<NodeView> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(k, e)| NodeView {
            name: e.name.clone(),
            pool: Some(pools[k % pools.len()].to_string()),
            gpus: from_annotation(&e.name, &gpus(k)).expect("annotation"),
            frag: e.clone(),
        })
        .collect();
    order(&mut views);
    (views, c)
}

fn main() {
    println!("\n## Cluster picture (release build; median of 5 runs)\n");
    println!("| nodes × GPUs | rows on the page | render ms | SVG size |");
    println!("|---|---|---|---|");
    for n in [1000usize, 5000] {
        let (views, c) = nodes(n);
        for size in [DEFAULT_PAGE_SIZE as usize, n] {
            let mut times: Vec<Duration> = Vec::new();
            let mut bytes = 0;
            for _ in 0..5 {
                let t = Instant::now();
                let svg = render(&views, &c, Page { number: 1, size }).expect("page 1");
                times.push(t.elapsed());
                bytes = svg.len();
            }
            times.sort();
            println!(
                "| {n} × 8 | {} | {:.1} | {:.2} MB |",
                size.min(n),
                times[2].as_secs_f64() * 1000.0,
                bytes as f64 / 1e6
            );
        }
    }
}
