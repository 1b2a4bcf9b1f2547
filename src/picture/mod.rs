//! Pictures of the GPUs as self-contained SVG (no scripts, no external fonts): [`node`] draws one
//! node's GPUs as bars of memory slices. Colours are the Okabe–Ito palette, readable with every
//! common colour-vision deficiency, and the text follows the viewer's dark mode.

pub mod cluster;
pub mod node;

use crate::mig::capacity::Occupancy;
use crate::mig::{Placement, ProfileTable};

/// The free slices of a GPU with `instances` (profile id, placement) that no profile of `table`
/// can still use: each lies in no placement that could still be created.
pub fn stranded(table: &ProfileTable, instances: impl IntoIterator<Item = (u32, Placement)> + Clone) -> Vec<u32> {
    let occ = Occupancy::of(table, instances.clone());
    let taken: u32 = instances.into_iter().fold(0, |m, (_, pl)| m | pl.mask());
    let mut usable = 0u32;
    for p in &table.profiles {
        for pl in occ.free_placements(p) {
            if occ.can_add(table, p, pl) {
                usable |= pl.mask();
            }
        }
    }
    (0..table.memory_slices).filter(|&k| (taken | usable) & (1 << k) == 0).collect()
}

/// One legend line at (`x`, `y`): per entry a `swatch`-pixel square painted by its attributes
/// (`class="free"`, `fill="url(#busy)"`) and its words in `text_class`.
pub fn legend(out: &mut String, x: u32, y: u32, swatch: u32, text_class: &str, entries: &[(&str, &str)]) {
    use std::fmt::Write as _;
    let mut x = x;
    for (paint, words) in entries {
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{swatch}\" height=\"{swatch}\" {paint} stroke=\"#888\"/><text class=\"{text_class}\" x=\"{}\" y=\"{}\">{words}</text>",
            x + swatch + 4,
            y + swatch - 3
        );
        x += 24 + 7 * words.len() as u32;
    }
}

/// The width [`legend`] takes for `entries` (7 pixels a character).
pub fn legend_width(entries: &[(&str, &str)]) -> u32 {
    entries.iter().map(|(_, words)| 24 + 7 * words.len() as u32).sum()
}

/// An instance rectangle read back from either picture: (profile, start, size, x, width, busy,
/// foreign); busy when the busy hatching follows it.
#[cfg(test)]
pub(crate) type Drawn = (String, u32, u32, u32, u32, bool, bool);

/// The instance rectangles under `scope`, read back.
#[cfg(test)]
pub(crate) fn drawn_instances(scope: roxmltree::Node) -> Vec<Drawn> {
    let n = |e: &roxmltree::Node, k: &str| e.attribute(k).unwrap().parse::<u32>().unwrap();
    scope
        .descendants()
        .filter(|e| e.attribute("class").is_some_and(|c| c.starts_with("instance")))
        .map(|e| {
            let class = e.attribute("class").unwrap();
            let busy = e.next_sibling_element().is_some_and(|s| s.attribute("fill") == Some("url(#busy)"));
            let profile = e.attribute("data-profile").unwrap().to_string();
            (
                profile,
                n(&e, "data-start"),
                n(&e, "data-size"),
                n(&e, "x"),
                n(&e, "width"),
                busy,
                class.contains("foreign"),
            )
        })
        .collect()
}

/// The Okabe–Ito palette (Okabe & Ito, "Color Universal Design", 2008).
pub mod palette {
    /// Sky blue: a one-slice instance.
    pub const SKY_BLUE: &str = "#56B4E9";
    /// Bluish green: a two-slice instance.
    pub const BLUISH_GREEN: &str = "#009E73";
    /// Blue: a three- or four-slice instance.
    pub const BLUE: &str = "#0072B2";
    /// Reddish purple: an instance of the whole GPU's memory.
    pub const REDDISH_PURPLE: &str = "#CC79A7";
    /// Vermillion: stranded slices and unhealthy GPUs.
    pub const VERMILLION: &str = "#D55E00";
    /// Orange: MPS.
    pub const ORANGE: &str = "#E69F00";
}

/// `s` with `&`, `<`, `>` and `"` escaped for SVG text and attributes.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The document's style: light by default, dark where the viewer prefers it.
pub const STYLE: &str = "<style>\
text{font-family:sans-serif;font-size:12px;fill:#000}\
.bg{fill:#fff}\
.free{fill:#f2f2f2;stroke:#bbb;stroke-width:1}.instance{stroke:#000;stroke-width:1}\
.label{font-size:11px;fill:#000}.note{fill:#555}\
.stranded{fill:url(#stranded)}.unhealthy{fill:#D55E00}\
.foreign{stroke:#000;stroke-width:2.5;stroke-dasharray:5 3}\
@media (prefers-color-scheme:dark){text,.label{fill:#eee}.bg{fill:#1e1e1e}.free{fill:#333}\
.note{fill:#bbb}.instance{stroke:#eee}.foreign{stroke:#fff}}\
</style>";

/// Hatching for busy instances and the cross-hatch of stranded slices.
pub const PATTERNS: &str = "<defs>\
<pattern id=\"busy\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">\
<rect width=\"2\" height=\"6\" fill=\"#000\" fill-opacity=\"0.45\"/></pattern>\
<pattern id=\"stranded\" width=\"8\" height=\"8\" patternUnits=\"userSpaceOnUse\">\
<path d=\"M0,0L8,8M8,0L0,8\" stroke=\"#D55E00\" stroke-width=\"1.5\"/></pattern>\
</defs>";
