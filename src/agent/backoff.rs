//! Capped exponential backoff with jitter for retries after a failed reconcile.

use std::time::Duration;

/// Retry delays: `min · 2^attempt`, capped at `max`, each drawn uniformly from its upper half.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    rng: u64,
}

impl Backoff {
    /// A backoff between `min` and `max`; `seed` makes the jitter reproducible.
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Self { min, max: max.max(min), attempt: 0, rng: seed | 1 }
    }

    /// The next delay; grows until `max`.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(30)).unwrap_or(u32::MAX);
        let base = self.min.saturating_mul(factor).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        // xorshift64*: deterministic jitter without a dependency.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(0.5 + 0.5 * unit)
    }

    /// Failures in a row so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Back to the minimum after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn delays_grow_stay_in_bounds_and_reset(seed in any::<u64>(), min_ms in 1u64..2000, max_ms in 1u64..600_000) {
            let (min, max) = (Duration::from_millis(min_ms), Duration::from_millis(max_ms));
            let mut b = Backoff::new(min, max, seed);
            let cap = max.max(min);
            let mut prev_base = Duration::ZERO;
            for i in 0..40u32 {
                let d = b.next_delay();
                let base = min.saturating_mul(1u32.checked_shl(i.min(30)).unwrap_or(u32::MAX)).min(cap);
                prop_assert!(d <= base && d >= base / 2, "attempt {i}: {d:?} outside [{:?}, {base:?}]", base / 2);
                prop_assert!(base >= prev_base);
                prev_base = base;
            }
            prop_assert_eq!(b.attempts(), 40);
            b.reset();
            prop_assert!(b.next_delay() <= min);
        }
    }
}
