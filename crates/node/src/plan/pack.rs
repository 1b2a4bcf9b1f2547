//! Packing wanted MIG devices (compute instances) into new GPU instances, with explicit CI
//! placements: first fit, largest CI first — never more GIs than mig-parted's packing.

use crate::layout::DeviceKey;
use crate::mig::{GiProfile, Placement, ProfileTable};
use std::collections::BTreeMap;

/// A GPU instance to create: its profile and the CIs (profile id, start slice) to put in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiShape {
    /// GI profile id.
    pub profile_id: u32,
    /// Compute instances: (CI profile id, placement in compute slices).
    pub cis: Vec<(u32, Placement)>,
}

struct Bin {
    mask: u32,
    cis: Vec<(u32, Placement)>,
}

fn try_place(profile: &GiProfile, bin: &Bin, ci_id: u32) -> Option<Placement> {
    let cp = profile.ci(ci_id)?;
    let count = bin.cis.iter().filter(|(id, _)| *id == ci_id).count() as u32;
    if count >= cp.instance_count {
        return None;
    }
    cp.placements.iter().map(|&s| Placement::new(s, cp.slices)).find(|p| p.mask() & bin.mask == 0)
}

/// Packs `devices` (count per (GI profile, CI profile)) into GI shapes; `None` when a CI profile
/// cannot be placed even in an empty GI of its profile.
pub fn pack(table: &ProfileTable, devices: &BTreeMap<DeviceKey, u32>) -> Option<Vec<GiShape>> {
    let mut by_gi: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&(gi, ci), &n) in devices {
        by_gi.entry(gi).or_default().extend(std::iter::repeat_n(ci, n as usize));
    }
    let mut shapes = Vec::new();
    for (gi, mut cis) in by_gi {
        let profile = table.by_id(gi)?;
        cis.sort_by_key(|id| (std::cmp::Reverse(profile.ci(*id).map_or(0, |c| c.slices)), *id));
        let mut bins: Vec<Bin> = Vec::new();
        for ci in cis {
            let slot = bins.iter().enumerate().find_map(|(i, b)| try_place(profile, b, ci).map(|p| (i, p)));
            let (i, p) = match slot {
                Some(s) => s,
                None => {
                    let empty = Bin { mask: 0, cis: Vec::new() };
                    let p = try_place(profile, &empty, ci)?;
                    bins.push(empty);
                    (bins.len() - 1, p)
                }
            };
            bins[i].mask |= p.mask();
            bins[i].cis.push((ci, p));
        }
        shapes.extend(bins.into_iter().map(|b| GiShape { profile_id: gi, cis: b.cis }));
    }
    Some(shapes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::DesiredDevices;
    use crate::mig::catalog;

    fn shapes(model: &str, spec: &[(&str, u32)]) -> Vec<GiShape> {
        let t = catalog::lookup(model).unwrap().profile_table();
        let names: Vec<_> = spec.iter().map(|(n, c)| (n.parse().unwrap(), *c)).collect();
        let d = DesiredDevices::resolve(&t, &names).unwrap();
        pack(&t, &d.counts).unwrap()
    }

    #[test]
    fn counts_are_mig_devices_not_gpu_instances() {
        let s = shapes("A100-SXM4-80GB", &[("1c.2g.20gb", 6)]);
        assert_eq!(s.len(), 3);
        assert!(s.iter().all(|g| g.cis.len() == 2));
        let s = shapes("A100-SXM4-80GB", &[("1c.3g.40gb", 1), ("2c.3g.40gb", 1)]);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].cis, vec![(1, Placement::new(0, 2)), (0, Placement::new(2, 1))]);
        let s = shapes("A100-SXM4-80GB", &[("3g.40gb", 2), ("1g.10gb", 3)]);
        assert_eq!(s.len(), 5);
        let s = shapes("H100-SXM5-80GB", &[("3c.7g.80gb", 2), ("1c.7g.80gb", 1)]);
        assert_eq!(s.len(), 1, "3c@0, 3c@4 and a 1c fit one 7g GI: {s:?}");
    }
}
