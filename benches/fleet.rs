//! `gpupart plan` figures: planning time for large fleets (targets: 1,000 nodes × 8 GPUs with a
//! mixed demand in under 1 s; 100,000 nodes in seconds, with progress logged), and plan quality against first-fit and against the exact optimum
//! on small cases (the exact programme vs the greedy front alone vs first-fit).
//!
//! Run: `cargo bench --bench fleet`.

use gpupart::fleet::configs::enumerate;
use gpupart::fleet::pack::{pack, pack_with};
use gpupart::fleet::{self, input, report};
use gpupart::frag::Workload;
use gpupart::mig::catalog;
use std::time::Instant;

fn fleet_yaml(nodes: u32, scale: u32) -> String {
    format!(
        "fleet:\n  - {{name: a100, count: {nodes}, gpu: A100-SXM4-80GB, gpus: 8}}\ndemand:\n\
         \x20 - {{name: llama-70b, gpus: 8, replicas: {}}}\n\
         \x20 - {{name: llama-13b, memory: 30Gi, replicas: {}}}\n\
         \x20 - {{name: llama-7b, memory: 16Gi, replicas: {}}}\n\
         \x20 - {{name: embed, profile: 1g.10gb, replicas: {}}}\n\
         \x20 - {{name: whisper, memory: 6Gi, sharing: mps, replicas: {}}}\n\
         \x20 - {{name: big, memory: 75Gi, replicas: {}}}\n",
        scale / 10,
        3 * scale,
        7 * scale,
        5 * scale,
        2 * scale,
        scale / 3
    )
}

fn large() {
    println!("\n## Planning time (release build; median of 5 runs, 1 run from 20,000 nodes)\n");
    println!("| nodes × GPUs | replicas | plan ms | report ms | method | MIG GPUs | lower bound | GPUs used | first-fit GPUs |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (nodes, scale) in [(8u32, 2u32), (100, 100), (1000, 1000), (2000, 2000), (20_000, 20_000), (100_000, 100_000)] {
        let i = input::parse(&fleet_yaml(nodes, scale)).expect("input");
        let replicas: u32 = i.demand.iter().map(|d| d.replicas).sum();
        let (mut plan_ms, mut report_ms) = (Vec::new(), Vec::new());
        let mut last = None;
        let runs = if nodes >= 20_000 { 1 } else { 5 };
        for _ in 0..runs {
            let t = Instant::now();
            let p = fleet::plan(&i, &fleet::Options::default()).expect("plan");
            plan_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let doc = report::report(&i, &p);
            report_ms.push(t.elapsed().as_secs_f64() * 1e3);
            last = Some(doc);
        }
        plan_ms.sort_by(f64::total_cmp);
        report_ms.sort_by(f64::total_cmp);
        let doc = last.expect("ran");
        let s = &doc.summary;
        println!(
            "| {nodes} × 8 | {replicas} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
            plan_ms[plan_ms.len() / 2],
            report_ms[report_ms.len() / 2],
            s.search.method,
            s.search.mig_gpus,
            s.search.lower_bound_gpus,
            s.gpus_used,
            doc.baseline.gpus_used
        );
    }
}

/// A tiny deterministic generator (xorshift), so the table is the same every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

fn small() {
    println!("\n## MIG packing quality on small cases (≤ 32 GPUs; 200 random demands per model)\n");
    println!("| model | cases | exact GPUs (sum) | greedy-only GPUs (sum) | greedy worse in | first-fit GPUs (sum) | first-fit worse in | exact frag (slices) | first-fit frag (slices) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for model in ["A100-SXM4-80GB", "H100-SXM5-80GB", "A30-24GB"] {
        let m = catalog::lookup(model).expect("model");
        let t = m.profile_table();
        let base: Vec<u32> = t.profiles.iter().filter(|p| p.name.suffix.is_empty()).map(|p| p.id).collect();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut ex, mut gr, mut gr_worse, mut ff, mut ff_worse, mut ex_frag, mut ff_frag) = (0, 0, 0, 0, 0, 0.0, 0.0);
        let cases = 200;
        for _ in 0..cases {
            let demand: Vec<u32> = base.iter().map(|_| rng.next(9)).collect();
            if demand.iter().all(|n| *n == 0) {
                continue;
            }
            let w = Workload {
                weights: base
                    .iter()
                    .zip(&demand)
                    .map(|(id, n)| (t.by_id(*id).expect("id").name.clone(), f64::from(*n)))
                    .collect(),
            };
            let configs = enumerate(&t, &base, &w);
            let exact = pack(&t, &configs, &demand, 32);
            let greedy = pack_with(&t, &configs, &demand, 32, 1);
            let (ff_gpus, ff_f) = first_fit(&t, &base, &demand, &w);
            ex += exact.gpus.len();
            gr += greedy.gpus.len();
            ff += ff_gpus;
            gr_worse += usize::from(greedy.gpus.len() > exact.gpus.len());
            ff_worse += usize::from(ff_gpus > exact.gpus.len());
            ex_frag += exact.frag_slices(&configs);
            ff_frag += ff_f;
        }
        println!("| {model} | {cases} | {ex} | {gr} | {gr_worse} | {ff} | {ff_worse} | {ex_frag:.1} | {ff_frag:.1} |");
    }
}

/// First-fit of the instances in demand order at each GPU's lowest free legal placement.
fn first_fit(t: &gpupart::mig::ProfileTable, base: &[u32], demand: &[u32], w: &Workload) -> (usize, f64) {
    use gpupart::mig::capacity::Occupancy;
    let mut gpus: Vec<Occupancy> = Vec::new();
    for (&id, &n) in base.iter().zip(demand) {
        let p = t.by_id(id).expect("id");
        for _ in 0..n {
            let spot = gpus.iter().position(|o| p.placements.iter().any(|pl| o.check(t, p, *pl).is_ok()));
            let k = spot.unwrap_or_else(|| {
                gpus.push(Occupancy::empty());
                gpus.len() - 1
            });
            let pl =
                p.placements.iter().copied().find(|pl| gpus[k].check(t, p, *pl).is_ok()).expect("fits an empty GPU");
            gpus[k].add(p, pl);
        }
    }
    let frag = gpus.iter().map(|o| gpupart::frag::expected_fragmentation(t, o, Some(w))).sum();
    (gpus.len(), frag)
}

fn main() {
    large();
    small();
}
