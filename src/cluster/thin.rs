//! Thinning the shared samples: a curve needs some tens of samples a second to stay current, and
//! a fleet of hundreds of replicas takes far more of a busy backend. Each replica counts every
//! sample it takes into a fleet-wide counter per backend and model (see [`super::sums`]), reads
//! the fleet's rate back from it, and shares each sample with the chance that keeps the fleet's
//! total near [`BUDGET`] a second: all of them where samples are scarce, a share where they are
//! plentiful. What a replica reads from the stream then does not grow with the replica count.
//! It still learns every sample of its own.

use std::collections::HashMap;

use tokio::time::Instant;

/// Samples a second the fleet shares per backend and model (first tokens and ends together).
pub(super) const BUDGET: f64 = 10.0;
/// The fleet's rate is measured over at least this long.
const WINDOW_S: f64 = 1.0;

/// The fleet's sample rate per counter, and the share to send.
#[derive(Debug, Default)]
pub(super) struct Thinning {
    counters: HashMap<String, Counter>,
}

#[derive(Debug)]
struct Counter {
    /// The counter's value and when it was read, at the start of the current window.
    mark: (i64, Instant),
    /// Samples a second, fleet-wide, over the last full window.
    rate: f64,
}

impl Thinning {
    /// Takes a reading of the fleet's counter `field`.
    pub(super) fn read(&mut self, field: &str, total: i64, now: Instant) {
        match self.counters.get_mut(field) {
            None => {
                self.counters.insert(
                    field.to_owned(),
                    Counter {
                        mark: (total, now),
                        rate: 0.0,
                    },
                );
            }
            Some(c) => {
                let secs = now.saturating_duration_since(c.mark.1).as_secs_f64();
                if secs >= WINDOW_S {
                    c.rate = (total - c.mark.0).max(0) as f64 / secs;
                    c.mark = (total, now);
                }
            }
        }
    }

    /// The chance of sharing a sample counted in `field`.
    pub(super) fn share(&self, field: &str) -> f64 {
        self.counters.get(field).map_or(1.0, |c| {
            if c.rate > BUDGET {
                BUDGET / c.rate
            } else {
                1.0
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn samples_are_all_shared_where_scarce_and_thinned_to_the_budget_where_plentiful() {
        let t0 = Instant::now();
        let mut thin = Thinning::default();
        assert_eq!(thin.share("q"), 1.0, "nothing known: share all");
        thin.read("q", 1_000, t0);
        thin.read("q", 1_008, t0 + Duration::from_secs(1));
        assert_eq!(thin.share("q"), 1.0, "8 a second is below the budget");
        thin.read("q", 1_408, t0 + Duration::from_secs(2));
        assert!((thin.share("q") - BUDGET / 400.0).abs() < 1e-9);
        // Within a window, the rate stays as measured.
        thin.read("q", 1_409, t0 + Duration::from_millis(2_500));
        assert!((thin.share("q") - BUDGET / 400.0).abs() < 1e-9);
    }
}
