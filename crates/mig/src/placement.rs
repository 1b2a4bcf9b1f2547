//! Memory-slice placements of GPU instances and the bit masks used to test overlap.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A GPU-instance placement on the memory-slice axis: `start` and `size` in memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    /// Index of the first occupied memory slice.
    pub start: u32,
    /// Number of memory slices occupied.
    pub size: u32,
}

impl Placement {
    /// Creates a placement.
    pub const fn new(start: u32, size: u32) -> Self {
        Self { start, size }
    }

    /// Bit mask of the memory slices this placement occupies (bit i = slice i).
    pub fn mask(self) -> u32 {
        if self.size == 0 {
            return 0;
        }
        let width = if self.size >= 32 { u32::MAX } else { (1u32 << self.size) - 1 };
        width.checked_shl(self.start).unwrap_or(0)
    }

    /// True when the two placements share a memory slice.
    pub fn overlaps(self, other: Placement) -> bool {
        self.mask() & other.mask() != 0
    }

    /// One past the last occupied slice.
    pub fn end(self) -> u32 {
        self.start + self.size
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// Number of set bits in the low `slices` bits of `mask`.
pub fn count_slices(mask: u32, slices: u32) -> u32 {
    let all = if slices >= 32 { u32::MAX } else { (1u32 << slices) - 1 };
    (mask & all).count_ones()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_overlap() {
        assert_eq!(Placement::new(0, 1).mask(), 0b1);
        assert_eq!(Placement::new(4, 4).mask(), 0b1111_0000);
        assert_eq!(Placement::new(6, 2).mask(), 0b1100_0000);
        assert!(Placement::new(4, 4).overlaps(Placement::new(6, 2)));
        assert!(!Placement::new(0, 4).overlaps(Placement::new(4, 4)));
        assert_eq!(Placement::new(2, 2).to_string(), "2:2");
        assert_eq!(count_slices(0b1111_0001, 8), 5);
    }
}
