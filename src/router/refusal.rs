//! Why a request was refused with 429 `slo_unmet`: the best candidate it had, what its curve
//! predicted there against the SLO, and the evidence behind that prediction. The refusal carries
//! it to the client in `x-tpsgate-refusal`, and each class counts its refusals by [`Cause`] for
//! `/admin/curves` and `tpsgate_refusals_total`, so that a wrong refusal can be seen without a
//! debugger.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, counter};
use serde::Serialize;

use super::candidates::Candidate;
use crate::config::Slo;

/// The response header that explains a refusal.
pub(crate) const HEADER: &str = "x-tpsgate-refusal";

/// What kept the best candidate from taking the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Cause {
    /// Its first token was predicted later than the TTFT target (or what is left of it after
    /// waiting in line).
    Ttft,
    /// Its speed was predicted below the speed target.
    Speed,
    /// Both.
    TtftAndSpeed,
    /// The request itself would meet its SLO there, but the streams already there would not
    /// keep theirs once it joined (their speed, or the stall its prefill puts on them).
    Others,
    /// Predicted to meet the SLO only where the curve has not seen that many in flight, and
    /// neither its ramp nor the exploration budget allowed the try.
    Unproven,
    /// Batch work goes only where it leaves room for the latency classes: no backend did.
    NoRoom,
    /// No backend serving the model predicts anything yet (none observed, none on its ramp).
    NoPrediction,
    /// The best candidate looks as if it could take it at the moment of refusal: requests ahead
    /// in the line took the room while this one waited, or the slot went between its
    /// evaluation and its admission.
    RoomTaken,
}

impl Cause {
    pub(crate) const ALL: [Self; 8] = [
        Self::Ttft,
        Self::Speed,
        Self::TtftAndSpeed,
        Self::Others,
        Self::Unproven,
        Self::NoRoom,
        Self::NoPrediction,
        Self::RoomTaken,
    ];

    /// The metric label and the header's `cause`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Ttft => "ttft",
            Self::Speed => "speed",
            Self::TtftAndSpeed => "ttft_and_speed",
            Self::Others => "others",
            Self::Unproven => "unproven",
            Self::NoRoom => "no_room",
            Self::NoPrediction => "no_prediction",
            Self::RoomTaken => "room_taken",
        }
    }
}

/// One refusal explained: the candidate likeliest to have met the SLO and what it was
/// predicted to give, at the class's percentiles. Its [`Display`](fmt::Display) is the
/// header's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal<'a> {
    pub cause: Cause,
    /// The best candidate's name, with what its curve says there; `None` with
    /// [`Cause::NoPrediction`].
    pub best: Option<Best<'a>>,
    /// The SLO it was judged by, its TTFT target what was left of it at the refusal.
    pub slo: Slo,
    /// How long the request waited in line before it, seconds.
    pub waited_s: f64,
}

/// The best candidate of a refused request, as its curve predicted the request there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Best<'a> {
    pub backend: &'a str,
    /// Requests in flight there with this one.
    pub joining: u32,
    /// TTFT at the SLO's percentile, seconds.
    pub ttft_s: f64,
    /// Per-user speed at the SLO's percentile, tokens per second.
    pub tps: f64,
    /// The decayed count of samples behind the prediction at that concurrency (the fewer of
    /// speed's and TTFT's).
    pub evidence: f64,
    /// The prediction reaches past twice the concurrency the curve has seen.
    pub beyond_evidence: bool,
}

impl<'a> Refusal<'a> {
    /// The refusal of a request judged by `slo` (its TTFT target what is left after
    /// `waited_s`) among `candidates`: the best of them is the one likeliest to meet the SLO
    /// (then the one with the most slack).
    pub(crate) fn explain(candidates: &'a [Candidate<'_>], slo: Slo, waited_s: f64) -> Self {
        let best = candidates
            .iter()
            .filter_map(|c| c.estimate().map(|e| (c, e)))
            .max_by(|(_, a), (_, b)| {
                a.chance()
                    .total_cmp(&b.chance())
                    .then(a.slack.total_cmp(&b.slack))
            });
        let Some((c, e)) = best else {
            return Self {
                cause: Cause::NoPrediction,
                best: None,
                slo,
                waited_s,
            };
        };
        let p = &e.prediction;
        let late = slo.max_ttft_s.is_some_and(|max| slo.ttft(p) > max);
        let slow = slo.min_tps.is_some_and(|min| slo.tps(p) < min);
        let cause = match (late, slow) {
            (true, true) => Cause::TtftAndSpeed,
            (true, false) => Cause::Ttft,
            (false, true) => Cause::Speed,
            (false, false) if slo.is_batch() => Cause::NoRoom,
            (false, false) if !c.keeps_others() => Cause::Others,
            (false, false) if !c.meets_slo() => Cause::Unproven,
            (false, false) => Cause::RoomTaken,
        };
        Self {
            cause,
            best: Some(Best {
                backend: &c.backend.config.name,
                joining: c.joining,
                ttft_s: slo.ttft(p),
                tps: slo.tps(p),
                evidence: p.evidence(),
                beyond_evidence: p.beyond_evidence,
            }),
            slo,
            waited_s,
        }
    }
}

/// `cause=ttft; backend="gpu-a"; in_flight=8; ttft_p90_ms=1830; max_ttft_ms=1000; tps_p10=21.4;
/// min_tps=25; evidence=14.2; beyond_evidence=false; waited_ms=0`: the percentiles named are
/// the SLO's, a target left out is not printed.
impl fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cause={}", self.cause.label())?;
        if let Some(b) = &self.best {
            let ttft_q = if self.slo.ttft_percentile >= 90 {
                90
            } else {
                50
            };
            let tps_q = if self.slo.tps_percentile >= 90 {
                10
            } else {
                50
            };
            write!(
                f,
                "; backend=\"{}\"; in_flight={}; ttft_p{ttft_q}_ms={:.0}",
                b.backend,
                b.joining,
                b.ttft_s * 1e3
            )?;
            if let Some(max) = self.slo.max_ttft_s {
                write!(f, "; max_ttft_ms={:.0}", max * 1e3)?;
            }
            write!(f, "; tps_p{tps_q}={:.1}", b.tps)?;
            if let Some(min) = self.slo.min_tps {
                write!(f, "; min_tps={min}")?;
            }
            write!(
                f,
                "; evidence={:.1}; beyond_evidence={}",
                b.evidence, b.beyond_evidence
            )?;
        }
        write!(f, "; waited_ms={:.0}", self.waited_s * 1e3)
    }
}

/// Refusals counted by class (the last row: requests without a class) and [`Cause`]: readable
/// for `/admin/curves`, and exported as `tpsgate_refusals_total{class,cause}`.
#[derive(Debug)]
pub(crate) struct Refusals {
    rows: Vec<[(AtomicU64, Counter); Cause::ALL.len()]>,
}

impl Refusals {
    /// Counters for the classes named `classes`, and a row for requests without one.
    pub(crate) fn new<'n>(classes: impl Iterator<Item = &'n str>) -> Self {
        let row = |class: &str| {
            Cause::ALL.map(|cause| {
                let metric = counter!(crate::telemetry::REFUSALS, "class" => class.to_owned(), "cause" => cause.label());
                (AtomicU64::new(0), metric)
            })
        };
        let mut rows: Vec<_> = classes.map(row).collect();
        rows.push(row(""));
        Self { rows }
    }

    /// Counts one refusal of a request of class `class` (`None`: without one).
    pub(crate) fn count(&self, class: Option<usize>, cause: Cause) {
        let row = class
            .unwrap_or(self.rows.len() - 1)
            .min(self.rows.len() - 1);
        let (mine, metric) = &self.rows[row][cause as usize];
        mine.fetch_add(1, Ordering::Relaxed);
        metric.increment(1);
    }

    /// The refusals of class `class` so far, by cause label (those counted at least once).
    pub(crate) fn of(&self, class: usize) -> Vec<(&'static str, u64)> {
        self.rows.get(class).map_or_else(Vec::new, |row| {
            Cause::ALL
                .iter()
                .zip(row)
                .map(|(cause, (n, _))| (cause.label(), n.load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect()
        })
    }
}
