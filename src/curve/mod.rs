//! Curves: per backend and model, how per-user TPS and TTFT move with concurrency.
//!
//! Pure: no I/O, time comes in as an argument. Each completed request is an [`Observation`]; its
//! experienced concurrency picks a bucket (1, 2, 3, 4, 6, 8, 12, 16, 24, … — powers of two and the
//! midpoints 1.5× between), whose [`window::Window`] keeps time-decayed samples. [`Curve::fit`]
//! fits TPOT(c) = a + b·c and TTFT(c, P) = t0 + t1·(c − 1) + P/r ([`fit`]; c − 1 requests ahead); [`Curve::predict`] answers
//! from a bucket with enough evidence, else from the fit, with a confidence.

pub(crate) mod fit;
pub(crate) mod model;
pub(crate) mod observation;
pub(crate) mod occupancy;
pub(crate) mod spread;
pub(crate) mod window;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

pub(crate) use model::{Model, Prediction};
pub use observation::{Observation, Outcome};
pub(crate) use occupancy::{Admitted, LocalLoad, Occupancy, PeerLoad, Reading};
pub(crate) use spread::Spread;
pub use window::FirstToken;
use window::{Decay, Levels, NeighbourTerm, PrefillRate, Sample, StartSummary, Summary, Window};

/// Speed bucket levels: the TTFT levels. A probe one request past the highest level seen
/// must land in a level of its own to be believed over the fit.
pub(crate) const BUCKETS: [u32; 30] = TTFT_LEVELS;

/// Occupancy levels of TTFT buckets: every count up to 16, then the speed levels above it. A
/// server's batch limit is an exact count and the request after it waits for a slot, so TTFT can
/// jump between neighbouring counts where limits are small; apart, the jump stays visible.
pub(crate) const TTFT_LEVELS: [u32; 30] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384,
    512, 768, 1024, 1536, 2048,
];

/// The TTFT bucket of occupancy `n` at admission: itself up to 16, else the nearest level in log
/// space.
pub(crate) fn ttft_bucket_of(n: f64) -> usize {
    let n = n.max(1.0);
    if n < 16.5 {
        return n.round() as usize - 1;
    }
    15 + nearest_in_log(&TTFT_LEVELS[15..], n)
}

/// The index of the level nearest to `x` (at least 1) in log space, the lower one on a tie.
/// Past the geometric mean of two neighbouring levels the upper one is nearer, and
/// `x² > a·b` says so without a logarithm (this runs for every prediction).
fn nearest_in_log(levels: &[u32], x: f64) -> usize {
    let squared = x * x;
    levels
        .windows(2)
        .take_while(|pair| squared > f64::from(pair[0]) * f64::from(pair[1]))
        .count()
}

/// A first token that shared no queue and came in at most this share of a queued one's TTFT,
/// at the same or a higher occupancy and later, shows the queue that one saw gone (clearly
/// sooner: TTFTs of one level vary by some percent without any queue).
const QUEUE_GONE_SHARE: f64 = 0.8;

/// Decayed sample weight a bucket needs before its own quantiles are trusted over the fit.
pub(crate) const MIN_BUCKET_WEIGHT: f64 = 5.0;

/// The bucket nearest to concurrency `c` in log space.
pub(crate) fn bucket_of(c: f64) -> usize {
    ttft_bucket_of(c)
}

/// The fitted model of a curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fit {
    /// a in TPOT = a + b·c, seconds.
    pub tpot_base_s: f64,
    /// b in TPOT = a + b·c, seconds per concurrent request.
    pub tpot_per_seq_s: f64,
    /// d in TPOT = a + b·c + d·n, seconds per engine running beside it on its device
    /// (`device:`); 0 where none is, or its samples cannot tell (its neighbours always ran
    /// beside it, or never).
    pub tpot_per_neighbour_s: f64,
    /// t0 in TTFT = t0 + t1·(c − 1) + P/r, seconds: a lone request's wait.
    pub ttft_base_s: f64,
    /// t1, seconds per request ahead.
    pub ttft_per_seq_s: f64,
    /// r, prompt tokens per second; absent when prompts did not vary enough to tell.
    pub prefill_tokens_per_s: Option<f64>,
}

impl Fit {
    /// The fitted time per output token at `concurrency` in flight, `neighbours` engines running
    /// beside it on its device, each costing a token `per_neighbour_s`.
    pub(crate) fn tpot_s(&self, concurrency: f64, neighbours: f64, per_neighbour_s: f64) -> f64 {
        self.tpot_base_s + self.tpot_per_seq_s * concurrency + per_neighbour_s * neighbours
    }
}

/// One bucket as `/admin/curves` shows it. Speed is bucketed by experienced concurrency, TTFT by
/// the occupancy a request found at admission, so a level may have one without the other.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Point {
    /// The bucket's concurrency level.
    pub concurrency: u32,
    /// Speed samples in its window.
    pub samples: usize,
    /// Decayed weight of its speed samples.
    pub weight: f64,
    /// Per-user TPS median.
    pub per_user_tps_p50: Option<f64>,
    /// Per-user TPS 10th percentile (the slow tail).
    pub per_user_tps_p10: Option<f64>,
    /// TTFT median, seconds.
    pub ttft_p50_s: Option<f64>,
    /// TTFT 90th percentile, seconds.
    pub ttft_p90_s: Option<f64>,
    /// Decayed weight of its TTFT samples.
    pub ttft_weight: f64,
}

impl Point {
    fn empty(concurrency: u32) -> Self {
        Self {
            concurrency,
            samples: 0,
            weight: 0.0,
            per_user_tps_p50: None,
            per_user_tps_p10: None,
            ttft_p50_s: None,
            ttft_p90_s: None,
            ttft_weight: 0.0,
        }
    }
}

/// How stale a curve's [`Model`] may get while observations arrive.
pub(crate) const REFRESH: Duration = Duration::from_millis(100);

/// Observations before which every one refreshes the model. A rebuild re-summarises the windows
/// that changed since the last one (a walk over their samples each) and adds up the rest: little
/// while a curve is young, too much to pay on every first token and every end of a busy
/// backend's requests. Past this count the model is rebuilt at most every [`REFRESH`].
const EAGER_REFRESH: u64 = 128;

/// The curve of one backend and model.
#[derive(Debug, Clone)]
pub struct Curve {
    /// Speed samples by experienced concurrency.
    buckets: Levels<Sample, { BUCKETS.len() }>,
    /// First tokens by occupancy at admission.
    starts: Levels<FirstToken, { TTFT_LEVELS.len() }>,
    /// How samples' weights decay, from an anchor every window shares.
    decay: Decay,
    observations: u64,
    estimated: u64,
    cancelled: u64,
    model: Option<Arc<Model>>,
    refreshed_at: Option<Instant>,
    /// When the first of the first tokens that shared a queue stops being evidence.
    queue_evidence_until: Option<Instant>,
    /// Some level's newest first tokens shared a queue and are past their time, but nothing
    /// newer has shown the queue gone yet: the next first token may.
    queue_evidence_held: bool,
}

impl Default for Curve {
    fn default() -> Self {
        Self::new(300.0)
    }
}

/// One point of a prior curve: what a backend is believed to do at a concurrency before (or
/// instead of) observing it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PriorPoint {
    /// Concurrency.
    pub concurrency: f64,
    /// Per-user TPS median.
    pub per_user_tps: f64,
    /// TTFT median, seconds.
    pub ttft_s: f64,
}

/// Counters of a curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Counts {
    /// Observations recorded (completed, cancelled or failed).
    pub observations: u64,
    /// Share of completed samples whose token count was estimated.
    pub estimated_share: f64,
    /// Requests the client abandoned.
    pub cancelled: u64,
}

impl Curve {
    /// An empty curve whose observations' weight halves every `half_life_s`.
    pub fn new(half_life_s: f64) -> Self {
        Self {
            buckets: Levels::default(),
            starts: Levels::default(),
            decay: Decay::new(half_life_s),
            observations: 0,
            estimated: 0,
            cancelled: 0,
            model: None,
            refreshed_at: None,
            queue_evidence_until: None,
            queue_evidence_held: false,
        }
    }

    /// A curve that starts from `prior`: each point becomes [`MIN_BUCKET_WEIGHT`] samples dated
    /// `now`, which decay and leave the window like real ones, so observations overwrite the
    /// prior within a few half-lives (or sooner, at high rates).
    pub(crate) fn seeded(half_life_s: f64, prior: &[PriorPoint], now: Instant) -> Self {
        let mut curve = Self::new(half_life_s);
        for p in prior {
            for _ in 0..MIN_BUCKET_WEIGHT as usize {
                curve.push_speed(Sample {
                    at: now,
                    tps: p.per_user_tps,
                    ttft: p.ttft_s,
                    output_tokens: 0,
                    concurrency: p.concurrency,
                    neighbours: 0.0,
                });
                curve.push_start(FirstToken {
                    at: now,
                    ttft: p.ttft_s,
                    prompt_tokens: None,
                    admitted_with: p.concurrency,
                    queued_with: 0,
                });
            }
        }
        curve.refresh(now);
        curve
    }

    /// The latest fitted snapshot, rebuilt at most every [`REFRESH`] as observations arrive.
    pub fn model(&self) -> Option<&Arc<Model>> {
        self.model.as_ref()
    }

    /// Moves the decay's anchor up to `at` once samples come far past it, so that weights stay
    /// well inside `f64`'s range (every 64 half-lives; each window's weights are rescaled).
    fn rebase_if_due(&mut self, at: Instant) {
        if self.decay.due_for_rebase(at) {
            let scale = self.decay.rebase(at);
            self.buckets.rescale(scale);
            self.starts.rescale(scale);
        }
    }

    fn push_speed(&mut self, sample: Sample) {
        self.rebase_if_due(sample.at);
        let weight = self.decay.weigh(sample.at);
        self.buckets
            .push(bucket_of(sample.concurrency), sample, weight);
    }

    fn push_start(&mut self, start: FirstToken) {
        let check_at = if self.queue_evidence_held {
            Some(start.at)
        } else {
            start.evidence_until()
        };
        if let Some(at) = check_at {
            self.queue_evidence_until = Some(self.queue_evidence_until.map_or(at, |u| u.min(at)));
        }
        self.rebase_if_due(start.at);
        let weight = self.decay.weigh(start.at);
        self.starts
            .push(ttft_bucket_of(start.admitted_with), start, weight);
    }

    fn build(&self, now: Instant) -> Option<Model> {
        let (_, starts) = self.start_summaries();
        let (_, speed) = self.speed_summaries();
        Model::build(&speed, &starts, self.decay.factor(now))
    }

    /// The speed windows' summaries, with their spreads taken at the neighbour term that
    /// these same summaries fit (as [`Curve::start_summaries`] does with the prefill rate).
    fn speed_summaries(&self) -> (NeighbourTerm, [Option<Summary>; BUCKETS.len()]) {
        let kept = self.buckets.context().unwrap_or_default();
        let speed = self.buckets.summaries(kept);
        let term = NeighbourTerm::near(model::neighbour_term(&speed));
        if term == kept {
            (term, speed)
        } else {
            (term, self.buckets.summaries(term))
        }
    }

    /// The TTFT windows' summaries, with their queue quantiles taken at the prefill rate that
    /// these same summaries fit (the rate kept from the last rebuild is tried first: it seldom
    /// moves by a step, and then only the changed windows are summarised).
    fn start_summaries(&self) -> (PrefillRate, [Option<StartSummary>; TTFT_LEVELS.len()]) {
        let kept = self.starts.context().unwrap_or_default();
        let starts = self.starts.summaries(kept);
        let rate = PrefillRate::near(model::ttft_fit(&starts).2);
        if rate == kept {
            (rate, starts)
        } else {
            (rate, self.starts.summaries(rate))
        }
    }

    /// Drops the first tokens that shared a queue which has drained as of `now`: past their
    /// time ([`FirstToken::evidence_until`]), and shown gone by a newer first token at the same
    /// or a higher occupancy (the newest of its level) that shared no queue and came clearly
    /// sooner (as many requests ahead or more, yet less time: [`QUEUE_GONE_SHARE`]). A queue
    /// that persists (a batch limit, a serial server) shows no such first token and stays
    /// believed: past a batch limit every first token waits for a slot, some luckier than
    /// others, and a lucky one is no sign of the queue gone (taken for one, it left a 6-wide
    /// batch's occupancy 8 with one first token of 0.11 s where about five had a p90 of 0.46 s).
    fn forget_drained_queues(&mut self, now: Instant) {
        if self.queue_evidence_until.is_none_or(|until| until > now) {
            return;
        }
        let newest: Vec<Option<(Instant, f64)>> = self
            .starts
            .windows()
            .iter()
            .map(|w| {
                w.newest()
                    .filter(|s| s.queued_with == 0)
                    .map(|s| (s.at, s.ttft))
            })
            .collect();
        self.starts.forget(|level, s| {
            s.evidence_until().is_some_and(|until| until <= now)
                && newest[level..]
                    .iter()
                    .flatten()
                    .any(|(at, ttft)| *at > s.at && *ttft <= QUEUE_GONE_SHARE * s.ttft)
        });
        // What is left: first tokens that shared a queue, due later or held until a newer one
        // shows the queue gone.
        let (mut until, mut held) = (None::<Instant>, false);
        for due in self
            .starts
            .windows()
            .iter()
            .flat_map(Window::samples)
            .filter_map(FirstToken::evidence_until)
        {
            if due <= now {
                held = true;
            } else {
                until = Some(until.map_or(due, |u| u.min(due)));
            }
        }
        self.queue_evidence_until = until;
        self.queue_evidence_held = held;
    }

    /// Rebuilds the model as of `now` if first tokens from a drained queue are due to be
    /// forgotten: without traffic nothing else rebuilds it, and a backend that looks slow after
    /// a burst gets no traffic. Cheap when nothing is due (a comparison).
    pub(crate) fn forget_due(&mut self, now: Instant) {
        if self.forgets_by(now) {
            self.refresh(now);
        }
    }

    /// Whether first tokens from a drained queue are due to be forgotten by `now`.
    pub(crate) fn forgets_by(&self, now: Instant) -> bool {
        self.queue_evidence_until.is_some_and(|until| until <= now)
    }

    fn refresh(&mut self, now: Instant) {
        self.forget_drained_queues(now);
        let ((term, speed), (rate, starts)) = (self.speed_summaries(), self.start_summaries());
        self.buckets.keep(term, &speed);
        self.starts.keep(rate, &starts);
        self.model = Model::build(&speed, &starts, self.decay.factor(now)).map(Arc::new);
        self.refreshed_at = Some(now);
    }

    /// Refreshes the model as of `now` if it is [`REFRESH`] old (samples that arrive late, from
    /// other replicas, refresh it as of their own time, which may be earlier).
    pub(crate) fn refresh_due(&mut self, now: Instant) {
        if self
            .refreshed_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REFRESH)
        {
            self.refresh(now);
        }
    }

    /// Refreshes the model if it is young (every sample changes it a lot, and costs little to
    /// fit) or [`REFRESH`] old.
    fn maybe_refresh(&mut self, now: Instant) {
        if self.observations <= EAGER_REFRESH
            || self
                .refreshed_at
                .is_none_or(|at| now.saturating_duration_since(at) >= REFRESH)
        {
            self.refresh(now);
        }
    }

    /// Records a request's first token: TTFT at the occupancy it was admitted with.
    pub fn first_token(&mut self, start: &FirstToken) {
        if !(start.ttft.is_finite() && start.ttft >= 0.0) {
            return;
        }
        self.push_start(*start);
        self.maybe_refresh(start.at);
    }

    /// Records one finished request. Only completed requests with a TTFT, a TPOT and a
    /// concurrency become speed samples; the rest are only counted. (Its TTFT was learned from
    /// [`Curve::first_token`].)
    pub fn record(&mut self, obs: &Observation) {
        self.observations += 1;
        if obs.outcome == Outcome::Cancelled {
            self.cancelled += 1;
        }
        let (Outcome::Completed, Some(ttft), Some(tpot), Some(concurrency)) =
            (obs.outcome, obs.ttft, obs.tpot, obs.concurrency)
        else {
            return;
        };
        if !(tpot > 0.0 && tpot.is_finite() && ttft.is_finite()) {
            return;
        }
        if obs.estimated {
            self.estimated += 1;
        }
        self.push_speed(Sample {
            at: obs.at,
            tps: 1.0 / tpot,
            ttft,
            output_tokens: obs.output_tokens,
            concurrency,
            neighbours: obs.neighbours,
        });
        self.maybe_refresh(obs.at);
    }

    /// Counters.
    pub(crate) fn counts(&self) -> Counts {
        let samples: usize = self
            .buckets
            .windows()
            .iter()
            .map(|b| b.samples().count())
            .sum();
        Counts {
            observations: self.observations,
            estimated_share: if samples == 0 {
                0.0
            } else {
                self.estimated as f64 / samples as f64
            },
            cancelled: self.cancelled,
        }
    }

    /// The buckets that hold samples: speed by experienced concurrency, TTFT by the occupancy
    /// requests found at admission.
    pub(crate) fn points(&self, now: Instant) -> Vec<Point> {
        self.build(now).map_or_else(Vec::new, |m| m.points())
    }

    /// Decayed share of recent samples that met an SLO (`min_tps` and `max_ttft_s`, either may
    /// be absent); `None` before the first sample.
    pub(crate) fn attainment(&self, min_tps: Option<f64>, max_ttft_s: Option<f64>) -> Option<f64> {
        // A share of decayed weights: the same whenever it is asked, as every weight decays
        // alike.
        let (mut good, mut all) = (0.0, 0.0);
        for (w, s) in self.buckets.windows().iter().flat_map(Window::weighted) {
            all += w;
            if min_tps.is_none_or(|m| s.tps >= m) && max_ttft_s.is_none_or(|m| s.ttft <= m) {
                good += w;
            }
        }
        (all > 0.0).then(|| good / all)
    }

    /// Fits TPOT and TTFT as of `now`; `None` before the first sample.
    pub(crate) fn fit(&self, now: Instant) -> Option<Fit> {
        self.build(now).map(|m| m.fit)
    }

    #[cfg(test)]
    /// What a request joining at `concurrency` (itself included) with `prompt_tokens` should
    /// expect as of `now`; `None` before the first sample. Routing reads [`Curve::model`]
    /// instead, which is cached.
    pub(crate) fn predict(
        &self,
        concurrency: f64,
        prompt_tokens: u64,
        now: Instant,
    ) -> Option<Prediction> {
        self.build(now)
            .map(|m| m.predict(concurrency, 0.0, prompt_tokens))
    }
}

#[cfg(test)]
mod tests;
