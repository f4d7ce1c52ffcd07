//! A backend's slow start: how many requests it may hold before its curve has evidence there.
//!
//! A backend never observed, or asked about beyond twice the concurrency its curve has seen,
//! has no prediction to trust. Taking one request at a time until a whole request has completed
//! is safe but slow: a pod found cold in DNS under load sheds while it learns. The ramp does
//! what TCP's slow start does with its window. The requests admitted on its evidence alone are
//! probes, each carrying its own SLO: every probe whose first token comes within its TTFT
//! target allows one more request in flight, up to twice the highest occupancy at which a probe
//! also streamed its first [`PROBE_EVENTS`] content events at its speed target, and each such
//! probe raises the allowance to twice its occupancy: the allowance doubles once per TTFT and a
//! few tokens, speed checked at every doubling (a few tokens into each probe, not at its end;
//! a probe that looks slow there, each event taken as a token, is judged again at its end by the
//! tokens it reported, so that a stream of several tokens an event is not taken for a slow one).
//! The first probe that misses either target ends the ramp for good: from then on the curve
//! alone decides (it has just learned where the backend stops keeping up), as it did before the
//! ramp.
//!
//! Per replica: the peers' samples teach this replica's curves, not its ramp.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Content events a probe streams before its speed is judged: enough for a rate, few enough
/// that the check comes long before the request ends.
pub(crate) const PROBE_EVENTS: u32 = 8;

/// The targets a probe is judged by (its request's SLO as admitted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Probe {
    /// In flight when it was admitted, itself included.
    pub admitted_with: u32,
    /// Its TTFT target, seconds (from when the gateway sent it).
    pub max_ttft_s: Option<f64>,
    /// Its per-user TPS target.
    pub min_tps: Option<f64>,
}

/// A backend's slow start (see the module doc).
#[derive(Debug)]
pub struct Ramp {
    /// Requests in flight it may hold on the ramp's evidence; 0 once the ramp has ended.
    allowance: AtomicU32,
    /// The highest occupancy at admission of a probe whose speed held (at least 1).
    verified: AtomicU32,
}

impl Default for Ramp {
    fn default() -> Self {
        Self {
            allowance: AtomicU32::new(1),
            verified: AtomicU32::new(1),
        }
    }
}

impl Ramp {
    /// Whether a request may join as the `joining`-th in flight (itself included) on the
    /// ramp's evidence.
    pub(crate) fn allows(&self, joining: u32) -> bool {
        joining <= self.allowance.load(Ordering::Relaxed)
    }

    /// Requests in flight it may hold on the ramp's evidence (0: the ramp has ended).
    pub(crate) fn allowance(&self) -> u32 {
        self.allowance.load(Ordering::Relaxed)
    }

    /// A probe's first token came `ttft_s` after the request was sent; whether the allowance
    /// grew.
    pub(crate) fn first_token(&self, probe: &Probe, ttft_s: f64) -> bool {
        match probe.max_ttft_s {
            Some(max) if ttft_s > max => {
                self.end();
                false
            }
            Some(_) => {
                let cap = 2 * self.verified.load(Ordering::Relaxed);
                self.grow(|a| (a + 1).min(cap))
            }
            None => false,
        }
    }

    /// A probe's per-user speed over its first content events (or its whole stream, if
    /// shorter): at its target the occupancy it was admitted at is verified, and the allowance
    /// is at least twice that; below, the ramp ends. Whether the allowance grew.
    pub(crate) fn speed(&self, probe: &Probe, tps: f64) -> bool {
        match probe.min_tps {
            Some(min) if tps < min => {
                self.end();
                false
            }
            Some(_) => {
                let verified = self
                    .verified
                    .fetch_max(probe.admitted_with, Ordering::Relaxed)
                    .max(probe.admitted_with);
                self.grow(|_| 2 * verified)
            }
            None => false,
        }
    }

    /// Raises the allowance to `to(allowance)` while the ramp lasts (an ended one stays at 0).
    fn grow(&self, to: impl Fn(u32) -> u32) -> bool {
        self.allowance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                (a > 0 && to(a) > a).then(|| to(a))
            })
            .is_ok()
    }

    fn end(&self) {
        self.allowance.store(0, Ordering::Relaxed);
    }
}

/// Whether a probe of a level its curve has not proven is out on a backend and its speed not
/// read yet: such levels are tried one request at a time, each read a few tokens in
/// ([`super::trial::EARLY_EVENTS`]) before the next is sent.
#[derive(Debug, Default)]
pub struct LevelProbe(AtomicBool);

impl LevelProbe {
    /// Whether one is out.
    pub(crate) fn out(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(super) fn set(&self, out: bool) {
        self.0.store(out, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(admitted_with: u32) -> Probe {
        Probe {
            admitted_with,
            max_ttft_s: Some(1.0),
            min_tps: Some(25.0),
        }
    }

    #[test]
    fn the_allowance_doubles_per_round_of_timely_first_tokens_as_far_as_speed_was_checked() {
        let ramp = Ramp::default();
        assert!(ramp.allows(1) && !ramp.allows(2), "a lone request first");
        assert!(ramp.first_token(&probe(1), 0.1));
        assert_eq!(ramp.allowance(), 2);
        // Another timely first token, but speed is verified only at 1 in flight: at most 2.
        assert!(!ramp.first_token(&probe(2), 0.1));
        assert_eq!(ramp.allowance(), 2);
        assert!(!ramp.speed(&probe(1), 40.0));
        // Speed held at 2 in flight: 4.
        assert!(ramp.speed(&probe(2), 40.0));
        assert_eq!(ramp.allowance(), 4);
        // Verified at 2, so timely first tokens alone go no further than 4.
        assert!(!ramp.first_token(&probe(3), 0.1));
        ramp.speed(&probe(3), 30.0);
        assert_eq!(ramp.allowance(), 6);
        for n in 4..=8 {
            ramp.first_token(&probe(n), 0.2);
        }
        assert_eq!(ramp.allowance(), 6, "verified at 3: up to 6");
        ramp.speed(&probe(6), 30.0);
        assert_eq!(ramp.allowance(), 12);
    }

    #[test]
    fn a_late_first_token_or_a_slow_stream_ends_the_ramp_for_good() {
        let late = Ramp::default();
        late.first_token(&probe(1), 1.5);
        assert!(!late.allows(1), "the curve alone decides from here");
        late.speed(&probe(1), 40.0);
        late.first_token(&probe(1), 0.1);
        assert_eq!(late.allowance(), 0, "an ended ramp never grows again");

        let slow = Ramp::default();
        slow.first_token(&probe(1), 0.1);
        slow.speed(&probe(1), 20.0);
        assert_eq!(slow.allowance(), 0);
    }

    #[test]
    fn a_probe_without_targets_teaches_the_ramp_nothing() {
        let ramp = Ramp::default();
        let batch = Probe {
            admitted_with: 1,
            max_ttft_s: None,
            min_tps: None,
        };
        ramp.first_token(&batch, 30.0);
        assert_eq!(ramp.allowance(), 1);
        ramp.speed(&batch, 0.5);
        assert_eq!(ramp.allowance(), 1, "nothing to miss");
    }
}
