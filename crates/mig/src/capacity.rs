//! What still fits on a GPU: remaining capacity per profile, the largest creatable profile and
//! stranded memory slices. Pure functions over a profile table and the occupied placements.

use crate::profile::{Engines, GiProfile, ProfileTable};
use crate::Placement;

/// Distinct profiles an [`Occupancy`] counts (a GPU holds at most 8 GPU instances).
const MAX_KINDS: usize = 16;

/// The GPU instances present on one GPU, reduced to what capacity depends on. `Copy`, so the
/// placement search clones it freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    /// Occupied memory slices (bit i = slice i).
    pub mask: u32,
    /// Compute slices in use.
    pub compute_used: u32,
    /// (profile id, instances) for every profile present, the first `kinds` entries.
    counts: [(u32, u32); MAX_KINDS],
    /// How many entries of `counts` are used.
    kinds: usize,
    /// JPEG and OFA engines in use.
    pub media_used: (u32, u32),
}

/// Why a GPU instance cannot be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// The profile id is not in the table.
    #[error("profile id {0} does not exist on this GPU")]
    UnknownProfile(u32),
    /// The placement is not one of the profile's legal placements.
    #[error("placement {placement} is not a legal placement of {profile}")]
    IllegalPlacement {
        /// Profile name.
        profile: String,
        /// Requested placement.
        placement: Placement,
    },
    /// `instanceCount` reached.
    #[error("{profile} already has its maximum of {max} instances")]
    InstanceCount {
        /// Profile name.
        profile: String,
        /// The profile's instanceCount.
        max: u32,
    },
    /// The placement overlaps occupied memory slices.
    #[error("placement {placement} of {profile} overlaps occupied memory slices")]
    Overlap {
        /// Profile name.
        profile: String,
        /// Requested placement.
        placement: Placement,
    },
    /// Not enough compute slices, or media engines (JPEG/OFA) left.
    #[error("{profile} needs {what} that are already in use")]
    Resources {
        /// Profile name.
        profile: String,
        /// What is missing.
        what: &'static str,
    },
}

impl Occupancy {
    /// An empty GPU.
    pub fn empty() -> Self {
        Self { mask: 0, compute_used: 0, counts: [(0, 0); MAX_KINDS], kinds: 0, media_used: (0, 0) }
    }

    /// Builds the occupancy of `instances` (profile id, placement); unknown ids are ignored.
    pub fn of(table: &ProfileTable, instances: impl IntoIterator<Item = (u32, Placement)>) -> Self {
        let mut occ = Self::empty();
        for (id, placement) in instances {
            if let Some(p) = table.by_id(id) {
                occ.add(p, placement);
            }
        }
        occ
    }

    /// Number of instances of a profile.
    pub fn count(&self, profile_id: u32) -> u32 {
        self.counts[..self.kinds].iter().find(|(id, _)| *id == profile_id).map_or(0, |(_, n)| *n)
    }

    /// Records an instance without checks.
    pub fn add(&mut self, profile: &GiProfile, placement: Placement) {
        self.mask |= placement.mask();
        self.compute_used += profile.slices;
        self.media_used.0 += profile.engines.jpeg;
        self.media_used.1 += profile.engines.ofa;
        match self.counts[..self.kinds].iter_mut().find(|(id, _)| *id == profile.id) {
            Some((_, n)) => *n += 1,
            // More kinds than any GPU holds: the count stays unknown (reads as 0).
            None if self.kinds == MAX_KINDS => {}
            None => {
                self.counts[self.kinds] = (profile.id, 1);
                self.kinds += 1;
            }
        }
    }

    /// Checks that an instance of `profile` at `placement` can be added, as the driver would.
    pub fn check(&self, table: &ProfileTable, profile: &GiProfile, placement: Placement) -> Result<(), Conflict> {
        let name = || profile.name.to_string();
        if !profile.placements.contains(&placement) {
            return Err(Conflict::IllegalPlacement { profile: name(), placement });
        }
        if self.count(profile.id) >= profile.instance_count {
            return Err(Conflict::InstanceCount { profile: name(), max: profile.instance_count });
        }
        if self.mask & placement.mask() != 0 {
            return Err(Conflict::Overlap { profile: name(), placement });
        }
        self.check_resources(table, profile)
    }

    /// Whether [`Occupancy::check`] passes, without building the reason (the search's hot path).
    pub fn can_add(&self, table: &ProfileTable, profile: &GiProfile, placement: Placement) -> bool {
        self.mask & placement.mask() == 0
            && self.count(profile.id) < profile.instance_count
            && self.compute_used + profile.slices <= table.compute_slices
            && profile.placements.contains(&placement)
            && (profile.engines.jpeg == 0 && profile.engines.ofa == 0
                || media_fits(table.engine_totals(), self.media_used, profile.engines))
    }

    /// Checks the placement-independent resources (compute slices, JPEG/OFA engines).
    pub fn check_resources(&self, table: &ProfileTable, profile: &GiProfile) -> Result<(), Conflict> {
        let what = if self.compute_used + profile.slices > table.compute_slices {
            "compute slices"
        } else if !media_fits(table.engine_totals(), self.media_used, profile.engines) {
            "media engines (JPEG/OFA)"
        } else {
            return Ok(());
        };
        Err(Conflict::Resources { profile: profile.name.to_string(), what })
    }

    /// Free placements of a profile (legal and not overlapping occupied slices).
    pub fn free_placements<'a>(&self, profile: &'a GiProfile) -> impl Iterator<Item = Placement> + 'a {
        let mask = self.mask;
        profile.placements.iter().copied().filter(move |p| p.mask() & mask == 0)
    }

    /// How many more instances of `profile` can be created now (NVML's remaining capacity).
    pub fn remaining_capacity(&self, table: &ProfileTable, profile: &GiProfile) -> u32 {
        let mut occ = *self;
        let mut n = 0;
        // Placements of one profile never overlap each other, so greedy filling is exact.
        loop {
            let next = occ.free_placements(profile).next();
            let Some(p) = next else { break };
            if !occ.can_add(table, profile, p) {
                break;
            }
            occ.add(profile, p);
            n += 1;
        }
        n
    }

    /// The largest profile that can still be created (by memory slices, then compute slices).
    pub fn largest_creatable<'a>(&self, table: &'a ProfileTable) -> Option<&'a GiProfile> {
        table
            .profiles
            .iter()
            .filter(|p| self.remaining_capacity(table, p) > 0)
            .max_by_key(|p| (p.memory_slices, p.slices, p.memory_mib, std::cmp::Reverse(p.index)))
    }

    /// Free memory slices that no creatable profile can use (covered by no free placement of a
    /// profile with remaining capacity).
    pub fn stranded_slices(&self, table: &ProfileTable) -> u32 {
        let mut usable = 0u32;
        for p in &table.profiles {
            if self.remaining_capacity(table, p) > 0 {
                for pl in self.free_placements(p) {
                    usable |= pl.mask();
                }
            }
        }
        self.free_memory_slices(table) - (usable & !self.mask).count_ones()
    }

    /// Free memory slices.
    pub fn free_memory_slices(&self, table: &ProfileTable) -> u32 {
        table.memory_slices - crate::placement::count_slices(self.mask, table.memory_slices)
    }

    /// Free compute slices.
    pub fn free_compute_slices(&self, table: &ProfileTable) -> u32 {
        table.compute_slices.saturating_sub(self.compute_used)
    }
}

fn media_fits(total: Engines, used: (u32, u32), need: Engines) -> bool {
    (need.jpeg == 0 || used.0 + need.jpeg <= total.jpeg) && (need.ofa == 0 || used.1 + need.ofa <= total.ofa)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    fn table(model: &str) -> ProfileTable {
        catalog::lookup(model).unwrap().profile_table()
    }

    fn id(t: &ProfileTable, name: &str) -> u32 {
        t.resolve(&name.parse().unwrap()).unwrap().0.id
    }

    #[test]
    fn reference_fragmentation_example() {
        // 1g at slots 0, 1 and 5 on an H100: four free compute slices, yet no 3g, 4g or 7g.
        let t = table("H100-SXM5-80GB");
        let one = id(&t, "1g.10gb");
        let occ = Occupancy::of(&t, [0, 1, 5].map(|s| (one, Placement::new(s, 1))));
        assert_eq!(occ.free_compute_slices(&t), 4);
        for big in ["3g.40gb", "4g.40gb", "7g.80gb"] {
            let p = t.by_id(id(&t, big)).unwrap();
            assert_eq!(occ.remaining_capacity(&t, p), 0, "{big}");
        }
        assert_eq!(occ.largest_creatable(&t).unwrap().name.to_string(), "2g.20gb");
        assert_eq!(occ.stranded_slices(&t), 0);
    }

    #[test]
    fn checks_mirror_driver_rules() {
        let t = table("A100-SXM4-80GB");
        let three = t.by_id(id(&t, "3g.40gb")).unwrap();
        let mut occ = Occupancy::empty();
        assert!(matches!(occ.check(&t, three, Placement::new(2, 4)), Err(Conflict::IllegalPlacement { .. })));
        occ.add(three, Placement::new(0, 4));
        assert!(matches!(occ.check(&t, three, Placement::new(0, 4)), Err(Conflict::Overlap { .. })));
        occ.add(three, Placement::new(4, 4));
        assert_eq!(occ.remaining_capacity(&t, three), 0);
        // Two 3g leave one compute slice but no memory: nothing is creatable.
        assert!(occ.largest_creatable(&t).is_none());
    }

    #[test]
    fn can_add_agrees_with_check() {
        // Every catalog model, every one- and two-instance occupancy, every profile and placement.
        for model in catalog::all_models() {
            let t = model.profile_table();
            let mut occs = vec![Occupancy::empty()];
            for a in &t.profiles {
                for &pa in &a.placements {
                    occs.push(Occupancy::of(&t, [(a.id, pa)]));
                    for b in &t.profiles {
                        occs.extend(b.placements.iter().map(|&pb| Occupancy::of(&t, [(a.id, pa), (b.id, pb)])));
                    }
                }
            }
            for occ in &occs {
                for p in &t.profiles {
                    for start in 0..t.memory_slices {
                        let pl = Placement::new(start, p.memory_slices);
                        assert_eq!(
                            occ.can_add(&t, p, pl),
                            occ.check(&t, p, pl).is_ok(),
                            "{} {} {pl}",
                            model.id,
                            p.name
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a30_me_profiles_exclude_each_other() {
        let t = table("A30-24GB");
        let me1 = t.by_id(id(&t, "1g.6gb+me")).unwrap();
        let me2 = t.by_id(id(&t, "2g.12gb+me")).unwrap();
        let occ = Occupancy::of(&t, [(me1.id, Placement::new(0, 1))]);
        assert_eq!(occ.remaining_capacity(&t, me2), 0);
    }
}
