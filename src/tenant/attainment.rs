//! How well a key's requests met their class's SLO: each request's [`Verdict`], tallied per
//! key and class. Every gateway counts a key's tokens and dollars; an operator of shared engines
//! is first asked whether each team got the speed it was promised, and why not where it did not.
//!
//! A request is judged on its own times, from the client's side: its first token within the
//! class's TTFT target (time in a line counts, as the client waited it) and its per-user speed
//! at least the class's target. A class's SLO asks that of a share of its requests (its
//! percentiles); the share that met it is what this reports. A request with no target to miss
//! (a batch class, or a whole answer, which streams no speed and no first token) is met when it
//! completes.

use std::sync::{Arc, Mutex, PoisonError};

use metrics::Counter;
use serde::Serialize;

use crate::config::Slo;

/// What became of one request, against its class's SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Verdict {
    /// Completed within both targets.
    Met,
    /// Its first token came later than the TTFT target.
    LateFirstToken,
    /// It streamed slower than the speed target.
    TooSlow,
    /// Refused at once (429 `slo_unmet`, or every backend at its limit).
    Shed,
    /// Refused after waiting in its class's line for its whole wait.
    QueuedTooLong,
    /// The backend failed it (an error status, a broken stream, no answer).
    UpstreamError,
    /// The client went away first: neither met nor missed.
    Cancelled,
}

impl Verdict {
    /// Every verdict, in the order of [`Verdict::label`]'s counters.
    pub(crate) const ALL: [Self; 7] = [
        Self::Met,
        Self::LateFirstToken,
        Self::TooSlow,
        Self::Shed,
        Self::QueuedTooLong,
        Self::UpstreamError,
        Self::Cancelled,
    ];

    /// As metrics and `/admin/keys` name it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Met => "met",
            Self::LateFirstToken => "late_first_token",
            Self::TooSlow => "too_slow",
            Self::Shed => "shed",
            Self::QueuedTooLong => "queued_too_long",
            Self::UpstreamError => "upstream_error",
            Self::Cancelled => "cancelled",
        }
    }

    /// A completed request whose first token came `ttft_s` after the gateway received it and
    /// which streamed at `tps` per user (either unknown where nothing streamed), against `slo`.
    pub(crate) fn of_completed(slo: &Slo, ttft_s: Option<f64>, tps: Option<f64>) -> Self {
        if let (Some(max), Some(ttft)) = (slo.max_ttft_s, ttft_s)
            && ttft > max
        {
            return Self::LateFirstToken;
        }
        if let (Some(min), Some(tps)) = (slo.min_tps, tps)
            && tps < min
        {
            return Self::TooSlow;
        }
        Self::Met
    }

    /// The code stored in an atomic: 0 is "not judged".
    pub(crate) fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The verdict of [`Verdict::code`].
    pub(crate) fn of_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code.checked_sub(1)?)).copied()
    }
}

/// One key's verdicts per class, in the order the classes were first seen.
#[derive(Debug)]
pub(crate) struct Attainment {
    key: Arc<str>,
    classes: Mutex<Vec<Tally>>,
}

/// One key's requests of one class: counted by verdict, in [`Verdict::ALL`]'s order, and what
/// they used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Counts {
    /// Requests by verdict.
    pub verdicts: [u64; Verdict::ALL.len()],
    /// Tokens used, prompt and output.
    pub tokens: u64,
    /// Spent, USD.
    pub usd: f64,
}

impl Counts {
    fn add(&mut self, other: &Self) {
        for (mine, n) in self.verdicts.iter_mut().zip(other.verdicts) {
            *mine += n;
        }
        self.tokens += other.tokens;
        self.usd += other.usd;
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug)]
struct Tally {
    class: Arc<str>,
    /// Judged through this replica.
    counts: Counts,
    /// Of those, not yet told to the fleet.
    unsent: Counts,
    /// The fleet's counts as of the last round (with `cluster:`), this replica's sent ones
    /// among them.
    fleet: Option<Counts>,
    counters: [Counter; Verdict::ALL.len()],
}

impl Tally {
    /// What `/admin/keys` shows: the fleet's as of the last round and what this replica judged
    /// since, or this replica's alone.
    fn shown(&self) -> Counts {
        match self.fleet {
            Some(mut fleet) => {
                fleet.add(&self.unsent);
                fleet
            }
            None => self.counts,
        }
    }
}

/// One key's requests of one class, as `/admin/keys` shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ClassAttainment {
    /// The class (`none` for requests without one).
    pub class: String,
    /// Requests judged.
    pub requests: u64,
    /// Tokens they used, prompt and output.
    pub tokens: u64,
    /// What they cost, USD.
    pub spent_usd: f64,
    /// Of those not cancelled, the share that met the SLO (`None` before any).
    pub attainment: Option<f64>,
    /// Requests by verdict (`met`, `late_first_token`, `too_slow`, `shed`, `queued_too_long`,
    /// `upstream_error`, `cancelled`), those counted at least once.
    pub by_verdict: std::collections::BTreeMap<&'static str, u64>,
}

impl Attainment {
    /// Nothing judged yet for the key named `key`.
    pub(crate) fn new(key: Arc<str>) -> Self {
        Self {
            key,
            classes: Mutex::new(Vec::new()),
        }
    }

    /// One request of `class` (`None`: without one) ended so, having used `tokens` at `usd`.
    pub(crate) fn tally(&self, class: Option<&Arc<str>>, verdict: Verdict, tokens: u64, usd: f64) {
        let mut one = Counts {
            tokens,
            usd,
            ..Counts::default()
        };
        one.verdicts[verdict as usize] = 1;
        let mut classes = self.lock();
        let tally = self.of(&mut classes, class.map_or("none", |c| c));
        tally.counts.add(&one);
        tally.unsent.add(&one);
        tally.counters[verdict as usize].increment(1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Tally>> {
        self.classes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tally of `class`, begun if new.
    fn of<'a>(&self, classes: &'a mut Vec<Tally>, class: &str) -> &'a mut Tally {
        let i = match classes.iter().position(|t| &*t.class == class) {
            Some(i) => i,
            None => {
                let name: Arc<str> = class.into();
                let counters = Verdict::ALL.map(|v| {
                    metrics::counter!(crate::telemetry::KEY_SLO_REQUESTS, "key" => self.key.to_string(), "class" => name.to_string(), "verdict" => v.label())
                });
                classes.push(Tally {
                    class: name,
                    counts: Counts::default(),
                    unsent: Counts::default(),
                    fleet: None,
                    counters,
                });
                classes.len() - 1
            }
        };
        &mut classes[i]
    }

    /// What this replica judged since it last told the fleet, by class (taken: see
    /// [`Attainment::untake`] where telling failed).
    pub(crate) fn take_unsent(&self) -> Vec<(Arc<str>, Counts)> {
        self.lock()
            .iter_mut()
            .filter(|t| !t.unsent.is_empty())
            .map(|t| (Arc::clone(&t.class), std::mem::take(&mut t.unsent)))
            .collect()
    }

    /// What [`Attainment::take_unsent`] took, not told after all.
    pub(crate) fn untake(&self, unsent: Vec<(Arc<str>, Counts)>) {
        let mut classes = self.lock();
        for (class, counts) in unsent {
            self.of(&mut classes, &class).unsent.add(&counts);
        }
    }

    /// The fleet's counts per class after a round.
    pub(crate) fn set_fleet(&self, fleet: Vec<(String, Counts)>) {
        let mut classes = self.lock();
        for (class, counts) in fleet {
            self.of(&mut classes, &class).fleet = Some(counts);
        }
    }

    /// Per class, what was judged so far.
    pub(crate) fn classes(&self) -> Vec<ClassAttainment> {
        self.lock()
            .iter()
            .map(|t| {
                let counts = t.shown();
                let requests = counts.verdicts.iter().sum();
                let met = counts.verdicts[Verdict::Met as usize];
                let judged = requests - counts.verdicts[Verdict::Cancelled as usize];
                ClassAttainment {
                    class: t.class.to_string(),
                    requests,
                    tokens: counts.tokens,
                    spent_usd: counts.usd,
                    attainment: (judged > 0).then(|| met as f64 / judged as f64),
                    by_verdict: Verdict::ALL
                        .iter()
                        .zip(counts.verdicts)
                        .filter(|(_, n)| *n > 0)
                        .map(|(v, n)| (v.label(), n))
                        .collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLO: Slo = Slo {
        min_tps: Some(25.0),
        tps_percentile: 90,
        max_ttft_s: Some(1.0),
        ttft_percentile: 90,
    };

    #[test]
    fn a_request_misses_on_its_first_token_first_then_on_its_speed() {
        let judge = |ttft, tps| Verdict::of_completed(&SLO, ttft, tps);
        assert_eq!(judge(Some(0.5), Some(30.0)), Verdict::Met);
        assert_eq!(judge(Some(1.5), Some(10.0)), Verdict::LateFirstToken);
        assert_eq!(judge(Some(0.5), Some(10.0)), Verdict::TooSlow);
        assert_eq!(
            judge(None, None),
            Verdict::Met,
            "a whole answer that completed"
        );
        for v in Verdict::ALL {
            assert_eq!(Verdict::of_code(v.code()), Some(v));
        }
        assert_eq!(Verdict::of_code(0), None);
    }

    #[test]
    fn the_share_met_leaves_out_requests_the_client_gave_up() {
        let a = Attainment::new("team-a".into());
        let chat: Arc<str> = "chat".into();
        for v in [
            Verdict::Met,
            Verdict::Met,
            Verdict::Met,
            Verdict::Shed,
            Verdict::Cancelled,
        ] {
            a.tally(Some(&chat), v, 0, 0.0);
        }
        a.tally(None, Verdict::UpstreamError, 0, 0.0);
        let classes = a.classes();
        assert_eq!(classes[0].class, "chat");
        assert_eq!(classes[0].requests, 5);
        assert_eq!(classes[0].attainment, Some(0.75));
        assert_eq!(classes[0].by_verdict["shed"], 1);
        assert_eq!(classes[1].class, "none");
        assert_eq!(classes[1].attainment, Some(0.0));
    }
}
