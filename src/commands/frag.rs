//! `gpupart frag`: fragmentation figures of every GPU and of the node (docs/fragmentation.md).

use super::io::read_config;
use crate::backend::open as open_backend;
use crate::cli::{FragArgs, GpuOptions, StatusFormat};
use crate::frag::{node_frag, GpuFrag, NodeFrag, Workload};
use anyhow::Context;
use serde::Serialize;
use std::fmt::Write as _;
use std::process::ExitCode;

/// `frag -o json` document.
#[derive(Debug, Serialize)]
pub struct FragDoc {
    /// True when the GPUs are simulated: nothing here is real hardware.
    pub simulated: bool,
    /// Node totals.
    pub node: NodeFrag,
    /// Per GPU.
    pub gpus: Vec<GpuFrag>,
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn table(doc: &FragDoc) -> String {
    let mut out = String::new();
    for g in &doc.gpus {
        if g.mps_slots > 0 {
            let (used, total) = (g.mps_slots_used, g.mps_slots);
            let _ = writeln!(out, "GPU {} {}: MPS, {used} of {total} client slots in use", g.index, g.model);
            continue;
        }
        if !g.mig_enabled {
            let state = if g.idle_without_mig { "idle" } else { "in use" };
            let _ = writeln!(out, "GPU {} {}: MIG disabled, whole GPU {state}", g.index, g.model);
            continue;
        }
        let mix: Vec<String> = g.workload.iter().map(|(p, w)| format!("{p} {}", pct(*w))).collect();
        let _ = writeln!(
            out,
            "GPU {} {}: free {}/{} memory slices, {}/{} compute; largest creatable {}; expected fragmentation {:.2} slices ({} of free) against {}",
            g.index,
            g.model,
            g.free_memory_slices,
            g.memory_slices,
            g.free_compute_slices,
            g.compute_slices,
            g.largest_creatable.as_deref().unwrap_or("none"),
            g.expected_fragmentation_slices,
            pct(g.expected_fragmentation_ratio),
            mix.join(", ")
        );
        let _ = writeln!(out, "  {:<14} {:>9} {:>8} {:>9}", "PROFILE", "CREATABLE", "STRANDED", "UNUSABLE");
        for p in &g.profiles {
            let _ = writeln!(
                out,
                "  {:<14} {:>9} {:>8} {:>9}",
                p.profile,
                p.creatable,
                p.stranded_slices,
                pct(p.unusable_ratio)
            );
        }
    }
    let n = &doc.node;
    let _ = writeln!(
        out,
        "node: {} GPUs, {:.2} GPU-equivalents unallocated, {:.2} fragmented ({}), {} whole free GPUs, {} idle without MIG",
        n.gpus,
        n.unallocated_gpus,
        n.fragmented_gpus,
        pct(n.fragmentation_ratio),
        n.whole_free_gpus,
        n.idle_without_mig_gpus
    );
    out
}

/// The table of `frag --cluster`.
fn cluster_table(c: &gpupart_cluster::frag::ClusterFrag) -> String {
    let mut out =
        format!("{:<28} {:>9} {:>11} {:>13} {:>10}\n", "NODE", "FRAG", "FRAG GPUS", "UNALLOC GPUS", "FREE GPUS");
    for n in &c.nodes {
        let _ = writeln!(
            out,
            "{:<28} {:>9} {:>11.2} {:>13.2} {:>10}",
            n.name,
            pct(n.ratio),
            n.fragmented_gpus,
            n.unallocated_gpus,
            n.whole_free_gpus
        );
    }
    let _ = writeln!(
        out,
        "{:<28} {:>9} {:>11.2} {:>13.2} {:>10}",
        "total",
        pct(c.fragmentation_ratio),
        c.fragmented_gpus,
        c.unallocated_gpus,
        c.whole_free_gpus
    );
    if !c.without_agent.is_empty() {
        let _ = writeln!(out, "without a gpupart agent: {}", c.without_agent.join(", "));
    }
    out
}

/// Runs `frag`.
pub fn run(g: &GpuOptions, a: &FragArgs) -> anyhow::Result<ExitCode> {
    if a.cluster {
        let nodes = crate::kube::cluster::read_node_annotations(&format!("{}fragmentation", a.annotation_prefix))?;
        let c = gpupart_cluster::frag::cluster(&nodes)?;
        match a.output {
            StatusFormat::Json => outln!("{}", serde_json::to_string_pretty(&c)?),
            StatusFormat::Table => out!("{}", cluster_table(&c)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let workload = match &a.config_file {
        Some(f) => Some(Workload { weights: read_config(f)?.workload }),
        None => None,
    };
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let mps = crate::mps::Mps::from_args(g);
    let daemons: Vec<_> = states.iter().map(|s| mps.observe(s)).collect();
    let gpus: Vec<GpuFrag> = crate::frag::node_gpu_frags(&states, &daemons, workload.as_ref());
    let doc = FragDoc { simulated: backend.is_simulated(), node: node_frag(&gpus), gpus };
    match a.output {
        StatusFormat::Json => outln!("{}", serde_json::to_string_pretty(&doc)?),
        StatusFormat::Table => out!("{}", table(&doc)),
    }
    Ok(ExitCode::SUCCESS)
}
