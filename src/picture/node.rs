//! One node's GPUs as an SVG: per GPU a bar of its memory slices (as many as its model has),
//! each GPU instance drawn over the slices it occupies with its profile, busy instances hatched,
//! free slices no profile can still use cross-hatched as stranded, and the largest profile that
//! could still be created. A GPU without MIG is one whole bar (busy or free, with its MPS daemon
//! and slots); an unhealthy GPU is marked with its fault. Pure: states in, text out.

use super::{escape, palette, PATTERNS, STYLE};
use crate::health::HealthBook;
use crate::mig::capacity::Occupancy;
use crate::observed::GpuState;
use std::fmt::Write as _;

/// Width of one memory slice, pixels.
pub const SLICE_W: u32 = 64;
/// Left edge of every bar.
pub const BAR_X: u32 = 16;
/// Height of one GPU's row.
const ROW_H: u32 = 64;
/// Height of a bar.
const BAR_H: u32 = 28;

/// What else is known of a GPU besides NVML: its MPS daemon (slots, used), its foreign instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    /// Client slots of its MPS daemon and how many are in use, when one serves it.
    pub mps: Option<(u32, u32)>,
    /// Placement starts of its instances the layout does not hold (drawn with a dashed outline).
    pub foreign: Vec<u32>,
}

fn fill(memory_slices: u32, total: u32) -> &'static str {
    match memory_slices {
        _ if memory_slices >= total => palette::REDDISH_PURPLE,
        1 => palette::SKY_BLUE,
        2 => palette::BLUISH_GREEN,
        _ => palette::BLUE,
    }
}

/// The free slices of `s` that no profile can still use (each in no creatable placement).
pub fn stranded(s: &GpuState) -> Vec<u32> {
    super::stranded(&s.profiles, s.instances.iter().map(|g| (g.profile_id, g.placement)))
}

/// The SVG of `states` (in order), `extra[i]` for `states[i]`, with the unhealthy GPUs of `fenced`.
pub fn render(states: &[GpuState], extra: &[Extra], fenced: &HealthBook) -> String {
    let widest = states.iter().map(|s| s.profiles.memory_slices.max(1)).max().unwrap_or(1);
    let width = BAR_X * 2 + widest * SLICE_W + 220;
    let height = 24 + ROW_H * states.len() as u32 + 40;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">{STYLE}{PATTERNS}<rect class=\"bg\" width=\"{width}\" height=\"{height}\"/>"
    );
    for (k, s) in states.iter().enumerate() {
        let y = 16 + ROW_H * k as u32;
        gpu(&mut out, s, extra.get(k).cloned().unwrap_or_default(), fenced, y, widest);
    }
    super::legend(&mut out, BAR_X, 16 + ROW_H * states.len() as u32 + 12, 14, "note", &LEGEND);
    out.push_str("</svg>\n");
    out
}

/// One GPU's row at `y`; a GPU without MIG spans `widest` slices' width.
fn gpu(out: &mut String, s: &GpuState, extra: Extra, fenced: &HealthBook, y: u32, widest: u32) {
    let i = s.info.index;
    let mig = s.info.mig_capable && s.mig_mode.current;
    let mode = match (mig, extra.mps) {
        (true, _) => "MIG".to_string(),
        (false, Some((slots, used))) => format!("MPS, {used} of {slots} slots used"),
        (false, None) => "whole GPU".to_string(),
    };
    let health = fenced.unhealthy().get(&i).map(|u| format!(" — UNHEALTHY ({})", u.reason)).unwrap_or_default();
    let _ = write!(
        out,
        "<g class=\"gpu\" data-gpu=\"{i}\"><text x=\"{BAR_X}\" y=\"{}\">GPU {i} · {} · {}{}</text>",
        y + 10,
        escape(&s.info.model),
        escape(&mode),
        escape(&health)
    );
    let bar_y = y + 16;
    let slices = if mig { s.profiles.memory_slices.max(1) } else { 1 };
    let bar_w = if mig { slices * SLICE_W } else { widest * SLICE_W };
    if mig {
        let strand = stranded(s);
        for slice in 0..slices {
            let class = if strand.contains(&slice) { "free stranded" } else { "free" };
            let _ = write!(
                out,
                "<rect class=\"{class}\" data-slice=\"{slice}\" x=\"{}\" y=\"{bar_y}\" width=\"{SLICE_W}\" height=\"{BAR_H}\"/>",
                BAR_X + slice * SLICE_W
            );
        }
        let mut gis: Vec<_> = s.instances.iter().collect();
        gis.sort_by_key(|g| g.placement.start);
        for g in gis {
            let (start, size) = (g.placement.start, g.placement.size);
            let name = s.gi_name(g);
            let (x, w) = (BAR_X + start * SLICE_W, size * SLICE_W);
            let busy = g.busy();
            let foreign = if extra.foreign.contains(&start) { " foreign" } else { "" };
            let _ = write!(
                out,
                "<rect class=\"instance{}{foreign}\" data-profile=\"{}\" data-start=\"{start}\" data-size=\"{size}\" x=\"{x}\" y=\"{bar_y}\" width=\"{w}\" height=\"{BAR_H}\" fill=\"{}\"/>",
                if busy { " busy" } else { "" },
                escape(&name),
                fill(size, slices)
            );
            if busy {
                let _ =
                    write!(out, "<rect x=\"{x}\" y=\"{bar_y}\" width=\"{w}\" height=\"{BAR_H}\" fill=\"url(#busy)\"/>");
            }
            let _ = write!(out, "<text class=\"label\" x=\"{}\" y=\"{}\">{}</text>", x + 4, bar_y + 18, escape(&name));
        }
        let occ = Occupancy::of(&s.profiles, s.instances.iter().map(|g| (g.profile_id, g.placement)));
        let largest = occ.largest_creatable(&s.profiles).map_or_else(|| "none".to_string(), |p| p.name.to_string());
        let _ = write!(
            out,
            "<text class=\"note\" x=\"{}\" y=\"{}\">largest creatable: {}</text>",
            BAR_X + bar_w + 12,
            bar_y + 18,
            escape(&largest)
        );
    } else {
        let busy = !s.processes.is_empty() || !s.pods.is_empty() || extra.mps.is_some_and(|(_, used)| used > 0);
        let fill = if extra.mps.is_some() { palette::ORANGE } else { palette::BLUE };
        let class = if busy { "whole busy" } else { "whole" };
        let _ = write!(
            out,
            "<rect class=\"{class}\" x=\"{BAR_X}\" y=\"{bar_y}\" width=\"{bar_w}\" height=\"{BAR_H}\" fill=\"{fill}\" fill-opacity=\"{}\"/>",
            if busy { "1" } else { "0.35" }
        );
        if busy {
            let _ = write!(
                out,
                "<rect x=\"{BAR_X}\" y=\"{bar_y}\" width=\"{bar_w}\" height=\"{BAR_H}\" fill=\"url(#busy)\"/>"
            );
        }
    }
    if fenced.is_unhealthy(i) {
        let _ = write!(
            out,
            "<rect class=\"unhealthy\" x=\"{BAR_X}\" y=\"{}\" width=\"{bar_w}\" height=\"4\"/>",
            bar_y + BAR_H + 2
        );
    }
    out.push_str("</g>");
}

/// The legend's entries: (paint, words).
const LEGEND: [(&str, &str); 5] = [
    ("class=\"free\"", "free slice"),
    ("fill=\"url(#busy)\"", "in use"),
    ("class=\"stranded\"", "free, no profile fits"),
    ("class=\"free foreign\"", "foreign: not in the layout"),
    ("class=\"unhealthy\"", "unhealthy GPU"),
];

#[cfg(test)]
mod tests;
