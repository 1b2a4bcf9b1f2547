//! An outage of the Kubernetes API as the agent's loops see it: reconnect delays capped at one
//! second (so a change lands within about two seconds of the server answering again), and one
//! WARN line when the outage starts and one INFO line with the number of failed attempts when it
//! ends, instead of a line per attempt.

use std::time::{Duration, Instant};

/// First reconnect delay.
const FIRST: Duration = Duration::from_millis(100);
/// The longest reconnect delay.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// One loop's view of the API's reachability.
#[derive(Debug)]
pub struct Outage {
    what: &'static str,
    since: Option<(Instant, u32)>,
    delay: Duration,
}

impl Outage {
    /// A tracker for the loop doing `what` (e.g. "watching the node").
    pub fn new(what: &'static str) -> Self {
        Self { what, since: None, delay: FIRST }
    }

    /// Records a failed attempt and returns how long to wait before the next one.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) -> Duration {
        match &mut self.since {
            None => {
                tracing::warn!(error = %error, "{}: the Kubernetes API does not answer; retrying (logged once per outage)", self.what);
                self.since = Some((Instant::now(), 1));
            }
            Some((_, n)) => {
                *n += 1;
                tracing::debug!(error = %error, attempts = *n, "{}: still failing", self.what);
            }
        }
        let d = self.delay;
        self.delay = (self.delay * 2).min(MAX_DELAY);
        d
    }

    /// Records a success; ends the outage, if any, with one line.
    pub fn ok(&mut self) {
        if let Some((since, n)) = self.since.take() {
            tracing::info!(
                failed_attempts = n,
                outage_ms = since.elapsed().as_millis() as u64,
                "{}: the Kubernetes API answers again",
                self.what
            );
        }
        self.delay = FIRST;
    }

    /// Whether an outage is under way.
    pub fn ongoing(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_one_second_and_reset_on_success() {
        let mut o = Outage::new("test");
        let delays: Vec<u64> = (0..6).map(|_| o.failed(&"refused").as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert!(o.ongoing());
        o.ok();
        assert!(!o.ongoing());
        assert_eq!(o.failed(&"refused"), Duration::from_millis(100));
    }
}
