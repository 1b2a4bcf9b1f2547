//! The one-instance swap matrix on A100-SXM4-80GB: every ordered pair (start, target) of feasible
//! GPU-instance layouts where the target replaces one instance of the start with one of another
//! profile. Each start layout is created by gpupart from an empty GPU, then changed to the
//! target; the table prints the GPU-instance operations (destroys + creates) of a full rebuild,
//! of gpupart, of the best fixed arrangement per start layout (one placement of the start, the
//! best against all its targets: the optimum without knowing the next target), and of the best
//! knowing the target (each pair from the start arrangement best for it).
//!
//! Run: `cargo bench --bench swaps`.

use gpupart::fleet::configs::enumerate;
use gpupart::frag::Workload;
use gpupart::layout::DesiredDevices;
use gpupart::mig::catalog;
use gpupart::mig::{Placement, ProfileTable};
use gpupart::observed::GiState;
use gpupart::plan::plan;
use gpupart::plan::search::arrangements;
use std::time::Instant;

fn gi(table: &ProfileTable, id: u32, profile_id: u32, placement: Placement) -> GiState {
    GiState::with_full_ci(table, id, profile_id, placement).expect("a catalog profile")
}

fn desired(table: &ProfileTable, ids: &[u32]) -> DesiredDevices {
    DesiredDevices::from_keys(ids.iter().map(|&id| (id, table.by_id(id).and_then(|p| p.full_ci()).map_or(0, |c| c.id))))
}

fn ops(table: &ProfileTable, current: &[GiState], want: &[u32]) -> usize {
    let p = plan(table, current, &desired(table, want), false).expect("feasible");
    p.destroy.len() + p.create.len()
}

fn main() {
    let table = catalog::lookup("A100-SXM4-80GB").expect("model").profile_table();
    let ids: Vec<u32> = table.profiles.iter().map(|p| p.id).collect();
    let layouts = enumerate(&table, &ids, &Workload::default()).all;
    let expand = |counts: &[u32]| -> Vec<u32> {
        ids.iter().zip(counts).flat_map(|(&id, &n)| std::iter::repeat_n(id, n as usize)).collect()
    };
    let feasible = |counts: &[u32]| layouts.iter().any(|l| l.counts == counts);
    let (mut pairs, mut rebuild, mut gpupart_ops, mut fixed_best, mut knowing) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let started = Instant::now();
    for start in &layouts {
        // The start as gpupart creates it from an empty GPU.
        let p = plan(&table, &[], &desired(&table, &expand(&start.counts)), false).expect("feasible");
        let current: Vec<GiState> =
            p.create.iter().enumerate().map(|(k, c)| gi(&table, k as u32 + 1, c.profile_id, c.placement)).collect();
        let starts: Vec<Vec<GiState>> = arrangements(&table, &expand(&start.counts))
            .into_iter()
            .map(|a| a.iter().enumerate().map(|(k, (id, pl))| gi(&table, k as u32 + 1, *id, *pl)).collect())
            .collect();
        let mut targets = Vec::new();
        for a in 0..ids.len() {
            if start.counts[a] == 0 {
                continue;
            }
            for b in 0..ids.len() {
                if b == a {
                    continue;
                }
                let mut t = start.counts.clone();
                t[a] -= 1;
                t[b] += 1;
                if !feasible(&t) {
                    continue;
                }
                pairs += 1;
                let n = start.instances as usize;
                rebuild += 2 * n;
                gpupart_ops += ops(&table, &current, &expand(&t));
                targets.push(expand(&t));
            }
        }
        // ops[arrangement][target]
        let table_ops: Vec<Vec<usize>> =
            starts.iter().map(|cur| targets.iter().map(|t| ops(&table, cur, t)).collect()).collect();
        fixed_best += table_ops.iter().map(|row| row.iter().sum::<usize>()).min().unwrap_or(0);
        knowing += (0..targets.len()).map(|j| table_ops.iter().map(|row| row[j]).min().unwrap_or(0)).sum::<usize>();
    }
    let elapsed = started.elapsed();
    // Planning time per GPU: every start (as gpupart creates it) to every feasible layout.
    let mut times: Vec<f64> = Vec::new();
    for start in &layouts {
        let p = plan(&table, &[], &desired(&table, &expand(&start.counts)), false).expect("feasible");
        let current: Vec<GiState> =
            p.create.iter().enumerate().map(|(k, c)| gi(&table, k as u32 + 1, c.profile_id, c.placement)).collect();
        for target in &layouts {
            let want = desired(&table, &expand(&target.counts));
            let t = Instant::now();
            let _ = plan(&table, &current, &want, false);
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    println!("\n## One-instance swaps on A100-SXM4-80GB ({} feasible layouts)\n", layouts.len());
    println!("| pairs | full rebuild | gpupart | best fixed arrangement | knowing the target | bench time |");
    println!("|---|---|---|---|---|---|");
    println!("| {pairs} | {rebuild} | {gpupart_ops} | {fixed_best} | {knowing} | {:.1} s |", elapsed.as_secs_f64());
    println!("\n## Planning time per GPU, every ordered pair of the {} layouts\n", layouts.len());
    println!("| plans | median | p99 | max |");
    println!("|---|---|---|---|");
    println!("| {} | {:.0} µs | {:.0} µs | {:.0} µs |", times.len(), at(0.5), at(0.99), at(1.0));
}
