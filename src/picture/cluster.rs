//! The cluster as an SVG, from the agents' node annotations (`gpupart.io/gpus`,
//! `gpupart.io/fragmentation`): a summary strip per pool (its GPUs in use, free and fragmented),
//! then one row per node, grouped by pool and sorted by free room, each GPU a small bar of its
//! memory slices with its instances over their placements. Many nodes are split into pages of
//! `page.size` rows; the strips always cover every node. Pure: nodes in, text out.

use super::{escape, stranded, PATTERNS, STYLE};
use crate::mig::catalog;
use crate::mig::ProfileTable;
use gpupart_cluster::fleet::current::CurrentGpu;
use gpupart_cluster::frag::{ClusterFrag, NodeEntry};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Width of one GPU's bar, pixels (8 slices of 6, 4 of 12).
pub const GPU_W: u32 = 48;
/// Gap between two GPUs' bars.
const GPU_GAP: u32 = 6;
/// Left edge of the first GPU's bar.
pub const GPUS_X: u32 = 272;
/// Height of a node's row.
const ROW_H: u32 = 14;
/// Height of a bar.
const BAR_H: u32 = 10;
/// Width of a pool's summary bar.
const STRIP_W: u32 = 360;
/// The heading of nodes without a pool label.
pub const NO_POOL: &str = "(no pool label)";

/// One node as the picture draws it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Its pool (the pool label's value), if labelled.
    pub pool: Option<String>,
    /// Its GPUs, from its `gpus` annotation.
    pub gpus: Vec<CurrentGpu>,
    /// Its published fragmentation figures.
    pub frag: NodeEntry,
}

impl NodeView {
    /// Free room: unallocated GPU-equivalents.
    pub fn free(&self) -> f64 {
        self.frag.unallocated_gpus
    }
}

/// Which rows one picture holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// 1-based page number.
    pub number: usize,
    /// Node rows per page.
    pub size: usize,
}

/// The default rows per page.
pub const DEFAULT_PAGE_SIZE: u32 = 200;

/// A page that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("page {asked} does not exist: {nodes} nodes make {pages} page(s) of {size}")]
pub struct NoSuchPage {
    /// The page asked for.
    pub asked: usize,
    /// Nodes drawn.
    pub nodes: usize,
    /// Pages they make.
    pub pages: usize,
    /// Rows per page.
    pub size: usize,
}

/// The nodes in drawing order: pools by name (unlabelled last), then most free room first, then name.
pub fn order(nodes: &mut [NodeView]) {
    nodes.sort_by(|a, b| {
        (a.pool.is_none(), &a.pool)
            .cmp(&(b.pool.is_none(), &b.pool))
            .then(b.free().total_cmp(&a.free()))
            .then_with(|| a.name.cmp(&b.name))
    });
}

/// Profile tables by model id, built once per model.
#[derive(Default)]
struct Tables(HashMap<String, Option<ProfileTable>>);

impl Tables {
    fn get(&mut self, model: &str) -> Option<&ProfileTable> {
        self.0
            .entry(model.to_string())
            .or_insert_with(|| catalog::lookup(model).filter(|m| m.mig_capable()).map(|m| m.profile_table()))
            .as_ref()
    }
}

/// A pool's sums for its strip.
#[derive(Debug, Default)]
struct PoolSum {
    nodes: usize,
    gpus: usize,
    unhealthy: usize,
    unallocated: f64,
    fragmented: f64,
}

/// The SVG of `nodes` (already in [`order`]), page `page`, with the cluster's figures `totals`.
pub fn render(nodes: &[NodeView], totals: &ClusterFrag, page: Page) -> Result<String, NoSuchPage> {
    let size = page.size.max(1);
    let pages = nodes.len().div_ceil(size).max(1);
    if page.number == 0 || page.number > pages {
        return Err(NoSuchPage { asked: page.number, nodes: nodes.len(), pages, size });
    }
    let first = (page.number - 1) * size;
    let shown = &nodes[first..(first + size).min(nodes.len())];
    let mut pools: BTreeMap<(bool, &str), PoolSum> = BTreeMap::new();
    for n in nodes {
        let p = pools.entry(pool_key(n)).or_default();
        p.nodes += 1;
        p.gpus += n.gpus.len();
        p.unhealthy += n.gpus.iter().filter(|g| g.unhealthy.is_some()).count();
        p.unallocated += n.frag.unallocated_gpus;
        p.fragmented += n.frag.fragmented_gpus;
    }
    let widest = nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0);
    let title = caption(nodes.len(), totals);
    // Text widths estimated at 9 pixels a character (14 px bold) and 7 (11 px).
    let width = (GPUS_X + widest * (GPU_W + GPU_GAP) + 16)
        .max(16 + 260 + STRIP_W + 180)
        .max(32 + 9 * title.chars().count() as u32)
        .max(16 + super::legend_width(&LEGEND) + 16);
    let groups = shown.iter().enumerate().filter(|(k, n)| *k == 0 || pool_key(&shown[k - 1]) != pool_key(n)).count();
    let top = 52 + 22 * pools.len() as u32 + 16;
    let height = top + 20 * groups as u32 + ROW_H * shown.len() as u32 + 44;
    let mut out = String::with_capacity(600 * shown.len() * widest.max(1) as usize + 4096);
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">{STYLE}{PATTERNS}<style>{SMALL}</style><rect class=\"bg\" width=\"{width}\" height=\"{height}\"/>"
    );
    let _ = write!(out, "<text x=\"16\" y=\"22\" style=\"font-size:14px;font-weight:bold\">{}</text><text class=\"note\" x=\"16\" y=\"40\">{STRIP_WORDS}</text>", escape(&title));
    let mut y = 52;
    for ((_, name), p) in &pools {
        strip(&mut out, name, p, y);
        y += 22;
    }
    y += 4;
    let last = first + shown.len();
    let words = if pages > 1 {
        format!(
            "nodes {}–{last} of {}, page {} of {pages} (--page for the others)",
            first + 1,
            nodes.len(),
            page.number
        )
    } else {
        format!("all {} nodes", nodes.len())
    };
    let _ = write!(
        out,
        "<text class=\"note\" x=\"16\" y=\"{y}\">{}; in each pool most free room first (GPU-equivalents, the number)</text>",
        escape(&words)
    );
    y += 12;
    let mut tables = Tables::default();
    for (k, n) in shown.iter().enumerate() {
        if k == 0 || pool_key(&shown[k - 1]) != pool_key(n) {
            let started_before = first + k > 0 && pool_key(&nodes[first + k - 1]) == pool_key(n);
            let more = if started_before { " (continued)" } else { "" };
            let _ = write!(out, "<text x=\"16\" y=\"{}\">pool {}{more}</text>", y + 15, escape(pool_key(n).1));
            y += 20;
        }
        row(&mut out, n, y, &mut tables);
        y += ROW_H;
    }
    if !totals.without_agent.is_empty() {
        let _ = write!(
            out,
            "<text class=\"note\" x=\"16\" y=\"{}\">without a gpupart agent: {}</text>",
            y + 16,
            escape(&names_in_short(&totals.without_agent))
        );
    }
    super::legend(&mut out, 16, y + 24, 12, "note row", &LEGEND);
    out.push_str("</svg>\n");
    Ok(out)
}

/// Classes of the small bars: fills by instance size, without per-element attributes.
const SMALL: &str = ".s1{fill:#56B4E9}.s2{fill:#009E73}.s4{fill:#0072B2}.s8{fill:#CC79A7}.mps{fill:#E69F00}\
.whole{fill:#0072B2}.idle{fill-opacity:.35}.row{font-size:11px}.foreign{stroke:#000;stroke-width:1.5;stroke-dasharray:2 1.5}\
.used{fill:#0072B2}.frag{fill:url(#stranded)}\
@media (prefers-color-scheme:dark){.foreign{stroke:#fff}}";

fn pool_key(n: &NodeView) -> (bool, &str) {
    (n.pool.is_none(), n.pool.as_deref().unwrap_or(NO_POOL))
}

fn names_in_short(names: &[String]) -> String {
    match names.len() {
        0..=8 => names.join(", "),
        n => format!("{} and {} more", names[..8].join(", "), n - 8),
    }
}

/// The cluster's figures, the picture's title.
fn caption(nodes: usize, c: &ClusterFrag) -> String {
    format!(
        "{nodes} nodes · fragmentation {:.0}%: {:.2} of {:.2} unallocated GPU-equivalents fragmented · {} whole free GPUs",
        c.fragmentation_ratio * 100.0,
        c.fragmented_gpus,
        c.unallocated_gpus,
        c.whole_free_gpus
    )
}

/// What the pools' strips show.
const STRIP_WORDS: &str =
    "per pool: GPUs in use (solid), free and usable (pale), free but fragmented (cross-hatched: expected unusable for the workload mix)";

fn strip(out: &mut String, name: &str, p: &PoolSum, y: u32) {
    let sick = if p.unhealthy > 0 { format!(", {} unhealthy", p.unhealthy) } else { String::new() };
    let _ = write!(
        out,
        "<text class=\"row\" x=\"16\" y=\"{}\">{}: {} nodes, {} GPUs{sick}</text>",
        y + 10,
        escape(name),
        p.nodes,
        p.gpus
    );
    let gpus = (p.gpus as f64).max(p.unallocated).max(f64::MIN_POSITIVE);
    let used = ((gpus - p.unallocated).max(0.0) / gpus * f64::from(STRIP_W)).round() as u32;
    let frag = (p.fragmented.min(p.unallocated) / gpus * f64::from(STRIP_W)).round() as u32;
    let free = STRIP_W.saturating_sub(used + frag);
    let x = 16 + 260;
    let _ = write!(
        out,
        "<g data-pool=\"{}\"><rect class=\"free\" x=\"{x}\" y=\"{y}\" width=\"{STRIP_W}\" height=\"{BAR_H}\"/><rect class=\"used\" x=\"{x}\" y=\"{y}\" width=\"{used}\" height=\"{BAR_H}\"/><rect class=\"frag\" x=\"{}\" y=\"{y}\" width=\"{frag}\" height=\"{BAR_H}\"/></g>",
        escape(name),
        x + used + free
    );
    let _ = write!(
        out,
        "<text class=\"note row\" x=\"{}\" y=\"{}\">{:.1} free, {:.1} fragmented</text>",
        x + STRIP_W + 8,
        y + 10,
        p.unallocated,
        p.fragmented
    );
}

/// One node's row at `y`: name, free room, GPUs.
fn row(out: &mut String, n: &NodeView, y: u32, tables: &mut Tables) {
    let name: String =
        if n.name.chars().count() > 34 { n.name.chars().take(33).chain(['…']).collect() } else { n.name.clone() };
    let _ = write!(
        out,
        "<g class=\"node\" data-node=\"{}\"><text class=\"row\" x=\"16\" y=\"{}\">{}</text><text class=\"row note\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.2}</text>",
        escape(&n.name),
        y + 10,
        escape(&name),
        GPUS_X - 8,
        y + 10,
        n.free()
    );
    for (k, g) in n.gpus.iter().enumerate() {
        gpu(out, g, GPUS_X + k as u32 * (GPU_W + GPU_GAP), y, tables);
    }
    out.push_str("</g>");
}

/// One GPU's small bar at (`x`, `y`), its instances placed by slice.
fn gpu(out: &mut String, g: &CurrentGpu, x: u32, y: u32, tables: &mut Tables) {
    let _ = write!(out, "<g data-gpu=\"{}\" transform=\"translate({x},{y})\">", g.index);
    let table = tables.get(&g.model).filter(|_| g.mig);
    match table {
        Some(t) => {
            let slices = t.memory_slices.max(1);
            let sw = GPU_W / slices;
            let _ = write!(out, "<rect class=\"free\" width=\"{GPU_W}\" height=\"{BAR_H}\"/>");
            let mut placed = Vec::new();
            for i in &g.instances {
                // A profile or placement this model lacks (a garbled annotation) is not drawn.
                let Ok((p, _)) = t.resolve(&i.profile) else { continue };
                let Some(size) = p.placements.iter().find(|pl| pl.start == i.start).map(|pl| pl.size) else { continue };
                placed.push((p.id, crate::mig::Placement::new(i.start, size)));
                let class = match size {
                    _ if size >= slices => "s8",
                    1 => "s1",
                    2 => "s2",
                    _ => "s4",
                };
                let foreign = if i.foreign { " foreign" } else { "" };
                let _ = write!(
                    out,
                    "<rect class=\"instance {class}{foreign}\" data-profile=\"{}\" data-start=\"{}\" data-size=\"{size}\" x=\"{}\" width=\"{}\" height=\"{BAR_H}\"/>",
                    escape(&i.profile.to_string()),
                    i.start,
                    i.start * sw,
                    size * sw
                );
                if i.busy {
                    let _ = write!(
                        out,
                        "<rect x=\"{}\" width=\"{}\" height=\"{BAR_H}\" fill=\"url(#busy)\"/>",
                        i.start * sw,
                        size * sw
                    );
                }
            }
            for s in stranded(t, placed.iter().copied()) {
                let _ = write!(out, "<rect class=\"stranded\" x=\"{}\" width=\"{sw}\" height=\"{BAR_H}\"/>", s * sw);
            }
        }
        None => {
            let class = if g.mps_slots.is_some() { "mps" } else { "whole" };
            let idle = if g.busy { "" } else { " idle" };
            let _ = write!(out, "<rect class=\"{class}{idle}\" width=\"{GPU_W}\" height=\"{BAR_H}\"/>");
            if g.busy {
                let _ = write!(out, "<rect width=\"{GPU_W}\" height=\"{BAR_H}\" fill=\"url(#busy)\"/>");
            }
        }
    }
    if let Some(why) = &g.unhealthy {
        let _ = write!(
            out,
            "<rect class=\"unhealthy\" y=\"{}\" width=\"{GPU_W}\" height=\"3\"><title>unhealthy: {}</title></rect>",
            BAR_H + 1,
            escape(why)
        );
    }
    out.push_str("</g>");
}

/// The legend's entries: (paint, words).
const LEGEND: [(&str, &str); 7] = [
    ("class=\"free\"", "free slice"),
    ("class=\"s1\"", "instance (fill by size)"),
    ("fill=\"url(#busy)\"", "in use"),
    ("class=\"free foreign\"", "foreign: not in the layout"),
    ("class=\"stranded\"", "stranded slice"),
    ("class=\"mps\"", "MPS GPU"),
    ("class=\"unhealthy\"", "unhealthy GPU"),
];

#[cfg(test)]
mod tests;
