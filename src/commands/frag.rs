//! `gpupart frag`: fragmentation figures of every GPU and of the node (docs/fragmentation.md).

use super::io::read_config;
use crate::backend::open as open_backend;
use crate::cli::{FragArgs, FragFormat, GpuOptions};
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
        let nodes = crate::kube::cluster::read_nodes()?;
        let key = format!("{}fragmentation", a.annotation_prefix);
        let published: Vec<_> = nodes.iter().map(|n| (n.name.clone(), n.annotations.get(&key).cloned())).collect();
        let c = gpupart_cluster::frag::cluster(&published)?;
        match a.output {
            FragFormat::Json => outln!("{}", serde_json::to_string_pretty(&c)?),
            FragFormat::Table => out!("{}", cluster_table(&c)),
            FragFormat::Svg => {
                let mut views = node_views(&nodes, &c, a)?;
                crate::picture::cluster::order(&mut views);
                let page = crate::picture::cluster::Page { number: a.page as usize, size: a.page_size as usize };
                out!("{}", crate::picture::cluster::render(&views, &c, page)?)
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if a.output == FragFormat::Svg {
        let o = super::status::observe(g)?;
        out!("{}", super::status::picture(&o, None));
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
        FragFormat::Json => outln!("{}", serde_json::to_string_pretty(&doc)?),
        FragFormat::Table | FragFormat::Svg => out!("{}", table(&doc)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The nodes of the cluster picture: those with published figures (`c.nodes`), with their pool
/// label and the GPUs of their `<prefix>gpus` annotation.
fn node_views(
    nodes: &[crate::kube::cluster::NodeMeta],
    c: &gpupart_cluster::frag::ClusterFrag,
    a: &FragArgs,
) -> anyhow::Result<Vec<crate::picture::cluster::NodeView>> {
    let key = format!("{}gpus", a.annotation_prefix);
    let by_name: std::collections::HashMap<&str, &crate::kube::cluster::NodeMeta> =
        nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    c.nodes
        .iter()
        .map(|e| {
            let meta = by_name.get(e.name.as_str()).copied();
            let gpus = match meta.and_then(|m| m.annotations.get(&key)) {
                Some(text) => gpupart_cluster::fleet::current::from_annotation(&e.name, text)?,
                None => Vec::new(),
            };
            let pool = meta.and_then(|m| m.labels.get(&a.pool_label)).cloned();
            Ok(crate::picture::cluster::NodeView { name: e.name.clone(), pool, gpus, frag: e.clone() })
        })
        .collect()
}
