//! Curves: per backend and model, how per-user TPS and TTFT move with concurrency.
//!
//! Pure: no I/O, time comes in as an argument. Each completed request is an [`Observation`]; its
//! experienced concurrency picks a bucket (1, 2, 3, 4, 6, 8, 12, 16, 24, … — powers of two and the
//! midpoints 1.5× between), whose [`window::Window`] keeps time-decayed samples. [`Curve::fit`]
//! fits TPOT(c) = a + b·c and TTFT(c, P) = t0 + t1·(c − 1) + P/r ([`fit`]; c − 1 requests ahead); [`Curve::predict`] answers
//! from a bucket with enough evidence, else from the fit, with a confidence.

pub mod fit;
pub mod model;
pub mod observation;
pub mod occupancy;
pub mod spread;
pub mod window;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

pub use model::{Model, Prediction};
pub use observation::{Observation, Outcome, StreamTiming};
pub use occupancy::{Admitted, LocalLoad, Occupancy, PeerLoad, Reading};
pub use spread::Spread;
pub use window::FirstToken;
use window::{Decay, Levels, PrefillRate, Sample, StartSummary, Window};

/// Bucket concurrency levels.
pub const BUCKETS: [u32; 24] = [
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
    3072, 4096,
];

/// Occupancy levels of TTFT buckets: every count up to 16, then the speed levels above it. A
/// server's batch limit is an exact count and the request after it waits for a slot, so TTFT can
/// jump between neighbouring counts where limits are small; apart, the jump stays visible.
pub const TTFT_LEVELS: [u32; 30] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384,
    512, 768, 1024, 1536, 2048,
];

/// The TTFT bucket of occupancy `n` at admission: itself up to 16, else the nearest level in log
/// space.
pub fn ttft_bucket_of(n: f64) -> usize {
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
pub const MIN_BUCKET_WEIGHT: f64 = 5.0;

/// The bucket nearest to concurrency `c` in log space.
pub fn bucket_of(c: f64) -> usize {
    nearest_in_log(&BUCKETS, c.max(1.0))
}

/// The fitted model of a curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fit {
    /// a in TPOT = a + b·c, seconds.
    pub tpot_base_s: f64,
    /// b in TPOT = a + b·c, seconds per concurrent request.
    pub tpot_per_seq_s: f64,
    /// t0 in TTFT = t0 + t1·(c − 1) + P/r, seconds: a lone request's wait.
    pub ttft_base_s: f64,
    /// t1, seconds per request ahead.
    pub ttft_per_seq_s: f64,
    /// r, prompt tokens per second; absent when prompts did not vary enough to tell.
    pub prefill_tokens_per_s: Option<f64>,
}

/// One bucket as `/admin/curves` shows it. Speed is bucketed by experienced concurrency, TTFT by
/// the occupancy a request found at admission, so a level may have one without the other.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
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
pub const REFRESH: Duration = Duration::from_millis(100);

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
pub struct Counts {
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
    pub fn seeded(half_life_s: f64, prior: &[PriorPoint], now: Instant) -> Self {
        let mut curve = Self::new(half_life_s);
        for p in prior {
            for _ in 0..MIN_BUCKET_WEIGHT as usize {
                curve.push_speed(Sample {
                    at: now,
                    tps: p.per_user_tps,
                    ttft: p.ttft_s,
                    output_tokens: 0,
                    concurrency: p.concurrency,
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
        Model::build(&self.buckets.summaries(()), &starts, self.decay.factor(now))
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
    pub fn forget_due(&mut self, now: Instant) {
        if self.forgets_by(now) {
            self.refresh(now);
        }
    }

    /// Whether first tokens from a drained queue are due to be forgotten by `now`.
    pub fn forgets_by(&self, now: Instant) -> bool {
        self.queue_evidence_until.is_some_and(|until| until <= now)
    }

    fn refresh(&mut self, now: Instant) {
        self.forget_drained_queues(now);
        let (speed, (rate, starts)) = (self.buckets.summaries(()), self.start_summaries());
        self.buckets.keep((), &speed);
        self.starts.keep(rate, &starts);
        self.model = Model::build(&speed, &starts, self.decay.factor(now)).map(Arc::new);
        self.refreshed_at = Some(now);
    }

    /// Refreshes the model as of `now` if it is [`REFRESH`] old (samples that arrive late, from
    /// other replicas, refresh it as of their own time, which may be earlier).
    pub fn refresh_due(&mut self, now: Instant) {
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
        });
        self.maybe_refresh(obs.at);
    }

    /// Counters.
    pub fn counts(&self) -> Counts {
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
    pub fn points(&self, now: Instant) -> Vec<Point> {
        self.build(now).map_or_else(Vec::new, |m| m.points())
    }

    /// Decayed share of recent samples that met an SLO (`min_tps` and `max_ttft_s`, either may
    /// be absent); `None` before the first sample.
    pub fn attainment(&self, min_tps: Option<f64>, max_ttft_s: Option<f64>) -> Option<f64> {
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
    pub fn fit(&self, now: Instant) -> Option<Fit> {
        self.build(now).map(|m| m.fit)
    }

    /// What a request joining at `concurrency` (itself included) with `prompt_tokens` should
    /// expect as of `now`; `None` before the first sample. Routing reads [`Curve::model`]
    /// instead, which is cached.
    pub fn predict(
        &self,
        concurrency: f64,
        prompt_tokens: u64,
        now: Instant,
    ) -> Option<Prediction> {
        self.build(now)
            .map(|m| m.predict(concurrency, prompt_tokens))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A synthetic batching backend: TPOT = 10 ms + 1 ms per request, TTFT = 20 ms + 2 ms per
    /// request + P / 5000.
    fn observation(at: Instant, c: f64, prompt: u64, slow: f64) -> Observation {
        Observation {
            at,
            outcome: Outcome::Completed,
            ttft: Some(0.020 + 0.002 * c + prompt as f64 / 5000.0),
            tpot: Some(slow * (0.010 + 0.001 * c)),
            output_tokens: 100,
            estimated: false,
            prompt_tokens: Some(prompt),
            concurrency: Some(c),
        }
    }

    /// One request of [`observation`] as the proxy reports it: its first token, then its end.
    fn learn(curve: &mut Curve, obs: &Observation) {
        curve.first_token(&FirstToken {
            at: obs.at,
            ttft: obs.ttft.unwrap(),
            prompt_tokens: obs.prompt_tokens,
            admitted_with: obs.concurrency.unwrap(),
            queued_with: 0,
        });
        curve.record(obs);
    }

    #[test]
    fn buckets_round_to_the_nearest_level_in_log_space() {
        assert_eq!(BUCKETS[bucket_of(0.3)], 1);
        assert_eq!(BUCKETS[bucket_of(1.4)], 1);
        assert_eq!(BUCKETS[bucket_of(1.5)], 2);
        assert_eq!(BUCKETS[bucket_of(5.0)], 6);
        assert_eq!(BUCKETS[bucket_of(30.0)], 32);
        assert_eq!(BUCKETS[bucket_of(1e6)], 4096);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(0.0)], 1);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(9.0)], 9);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(16.0)], 16);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(19.0)], 16);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(21.0)], 24);
        assert_eq!(TTFT_LEVELS[ttft_bucket_of(1e6)], 2048);
    }

    #[test]
    fn the_nearest_level_is_the_one_with_the_smallest_log_distance() {
        let by_logs = |levels: &[u32], x: f64| {
            let ln = x.max(1.0).ln();
            (0..levels.len())
                .min_by(|&a, &b| {
                    let d = |i: usize| (f64::from(levels[i]).ln() - ln).abs();
                    d(a).total_cmp(&d(b))
                })
                .unwrap_or(0)
        };
        for step in 0..20_000 {
            let c = 0.5 + f64::from(step) * 0.25;
            assert_eq!(bucket_of(c), by_logs(&BUCKETS, c), "concurrency {c}");
            if c >= 16.5 {
                assert_eq!(
                    ttft_bucket_of(c),
                    15 + by_logs(&TTFT_LEVELS[15..], c),
                    "occupancy {c}"
                );
            }
        }
    }

    #[test]
    fn the_fit_recovers_a_known_backend() {
        let now = Instant::now();
        let mut curve = Curve::default();
        for (i, c) in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0].into_iter().enumerate() {
            for p in [64, 512, 2048] {
                learn(&mut curve, &observation(now, c, p + i as u64, 1.0));
            }
        }
        let fit = curve.fit(now).unwrap();
        assert!((fit.tpot_base_s - 0.010).abs() < 1e-6, "{fit:?}");
        assert!((fit.tpot_per_seq_s - 0.001).abs() < 1e-7, "{fit:?}");
        assert!((fit.ttft_per_seq_s - 0.002).abs() < 1e-6, "{fit:?}");
        assert!(
            (fit.prefill_tokens_per_s.unwrap() - 5000.0).abs() < 1.0,
            "{fit:?}"
        );
        // Between buckets and beyond them, the fit answers.
        let p = curve.predict(64.0, 0, now).unwrap();
        assert!((p.per_user_tps_p50 - 1.0 / 0.074).abs() < 0.01, "{p:?}");
        assert!(p.confidence < 0.01);
        // Where a bucket has evidence, its own quantiles answer.
        let p = curve.predict(8.0, 0, now).unwrap();
        assert!((p.per_user_tps_p50 - 1.0 / 0.018).abs() < 1e-6);
    }

    /// A curve that learned TTFT = 20 ms + 2 ms per request + P / 5000 (plus noise) from
    /// first tokens at occupancies 1 to 8, with prompt sizes drawn by `prompt(i)`.
    fn ttft_curve(prompt: impl Fn(u64) -> u64) -> (Curve, Instant) {
        let now = Instant::now();
        let mut curve = Curve::default();
        // One completed request: a model needs speed too.
        curve.record(&observation(now, 1.0, 76, 1.0));
        let mut seed = 7_u64;
        for i in 0..200 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Odd requests 4 ms slower, then ±1 ms at random: with sizes 76 and 77 by parity,
            // a token would seem to cost 8 ms.
            let parity = if i % 2 == 1 { 0.004 } else { -0.004 };
            let noise = parity + ((seed >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.002;
            let (c, p) = ((i % 8 + 1) as f64, prompt(i));
            curve.first_token(&FirstToken {
                at: now,
                ttft: 0.020 + 0.002 * c + p as f64 / 5000.0 + noise,
                prompt_tokens: Some(p),
                admitted_with: c,
                queued_with: 0,
            });
        }
        (curve, now)
    }

    #[test]
    fn a_prefill_rate_is_fitted_only_from_a_real_spread_of_prompt_sizes() {
        // Equal prompts whose size estimate moves by a token: no rate, and a 1,000-token
        // prompt is not predicted from one.
        let (constant, now) = ttft_curve(|i| 76 + i % 2);
        let fit = constant.fit(now).unwrap();
        assert_eq!(fit.prefill_tokens_per_s, None, "{fit:?}");
        assert!(
            fit.ttft_base_s >= 0.0 && fit.ttft_per_seq_s >= 0.0,
            "{fit:?}"
        );
        let near = |a: f64, b: f64| (a - b).abs() < 0.002;
        // The base is a lone request's TTFT: 20 ms + 2 ms for its own place in the count.
        let expect = 0.022 + 76.5 / 5000.0;
        assert!(near(fit.ttft_base_s, expect), "{fit:?}");
        // Two sizes far apart, and a wide mix, tell the rate.
        let two_valued = |i: u64| -> u64 { if i.is_multiple_of(3) { 1000 } else { 100 } };
        let wide = |i: u64| 50 + (i * 7919) % 1950;
        for (name, prompt) in [
            ("two-valued", &two_valued as &dyn Fn(u64) -> u64),
            ("wide", &wide),
        ] {
            let (curve, now) = ttft_curve(prompt);
            let fit = curve.fit(now).unwrap();
            let rate = fit.prefill_tokens_per_s.unwrap_or_default();
            assert!((rate - 5000.0).abs() < 250.0, "{name}: {fit:?}");
            assert!(near(fit.ttft_base_s, 0.022), "{name}: {fit:?}");
            assert!(
                (fit.ttft_per_seq_s - 0.002).abs() < 0.0005,
                "{name}: {fit:?}"
            );
        }
    }

    #[test]
    fn a_mostly_cached_prompt_waits_as_long_as_the_others_and_prefills_only_its_own_tokens() {
        // A third of the requests miss the prefix cache (1,000 tokens to prefill, 200 ms at
        // 5,000 tokens/s), the rest hit it (100 tokens, 20 ms): every level's TTFT p90 is a
        // miss. A hit joining at 4 in flight waits 28 ms for those ahead, then prefills 20 ms.
        let two_valued = |i: u64| -> u64 { if i.is_multiple_of(3) { 1000 } else { 100 } };
        let (curve, now) = ttft_curve(two_valued);
        let wait = 0.020 + 0.002 * 4.0;
        let hit = curve.predict(4.0, 100, now).unwrap();
        assert!((hit.ttft_p50_s - (wait + 0.020)).abs() < 0.006, "{hit:?}");
        assert!(hit.ttft_p90_s < wait + 0.020 + 0.010, "{hit:?}");
        let miss = curve.predict(4.0, 1000, now).unwrap();
        assert!((miss.ttft_p90_s - (wait + 0.200)).abs() < 0.020, "{miss:?}");
    }

    #[test]
    fn every_fitted_ttft_parameter_is_physically_possible() {
        let now = Instant::now();
        let mut curve = Curve::default();
        curve.record(&observation(now, 1.0, 76, 1.0));
        // Steeper than any line from a non-negative base: unconstrained, t0 would be -100 ms.
        // And prompt sizes that move opposite to TTFT: unconstrained, a negative rate.
        for i in 0..64_u64 {
            let c = (i % 8 + 1) as f64;
            curve.first_token(&FirstToken {
                at: now,
                ttft: (0.150 * c - 0.100).max(0.001),
                prompt_tokens: Some(2000 - 200 * (i % 8)),
                admitted_with: c,
                queued_with: 0,
            });
        }
        let fit = curve.fit(now).unwrap();
        assert!(fit.ttft_base_s >= 0.0, "{fit:?}");
        assert!(fit.ttft_per_seq_s > 0.0, "{fit:?}");
        assert!(
            fit.prefill_tokens_per_s
                .is_none_or(|r| r > 0.0 && r.is_finite()),
            "{fit:?}"
        );
        let p = curve.predict(8.0, 5000, now).unwrap();
        assert!(p.ttft_p50_s > 0.0 && p.ttft_p50_s < 2.0, "{p:?}");
    }

    #[test]
    fn the_curve_follows_a_backend_that_slows_down_within_two_half_lives() {
        let t0 = Instant::now();
        let mut curve = Curve::new(60.0);
        // Ten minutes at normal speed, one sample a second at concurrency 4...
        for s in 0..600 {
            learn(
                &mut curve,
                &observation(t0 + Duration::from_secs(s), 4.0, 100, 1.0),
            );
        }
        // ...then the backend becomes twice as slow.
        let slow_from = t0 + Duration::from_secs(600);
        for s in 0..=120 {
            let obs = observation(slow_from + Duration::from_secs(s), 4.0, 100, 2.0);
            learn(&mut curve, &obs);
        }
        let after_two_half_lives = slow_from + Duration::from_secs(120);
        let p = curve.predict(4.0, 100, after_two_half_lives).unwrap();
        let slow_tps = 1.0 / (2.0 * 0.014);
        assert!(
            (p.per_user_tps_p50 - slow_tps).abs() / slow_tps < 0.05,
            "{p:?}"
        );
    }

    #[test]
    fn a_queue_shows_in_predicted_ttft_at_its_first_token_not_when_the_request_ends() {
        // A one-slot server: alone, 50 ms to the first token; second in line, 3 s.
        let now = Instant::now();
        let mut curve = Curve::default();
        for _ in 0..10 {
            let mut obs = observation(now, 1.0, 64, 1.0);
            obs.ttft = Some(0.05);
            learn(&mut curve, &obs);
        }
        let before = curve.model().unwrap().predict(2.0, 64);
        assert!(before.ttft_p50_s < 0.1, "nothing seen at 2 yet: {before:?}");
        // The second request's first token arrives; it is still decoding.
        curve.first_token(&FirstToken {
            at: now,
            ttft: 3.0,
            prompt_tokens: Some(64),
            admitted_with: 2.0,
            queued_with: 0,
        });
        let after = curve.model().unwrap().predict(2.0, 64);
        assert!(after.ttft_p50_s > 2.5, "{after:?}");
    }

    #[test]
    fn speed_seen_behind_a_queue_is_no_evidence_for_joining_one() {
        // One slot: each request found it free, then decoded with three more waiting behind.
        let now = Instant::now();
        let mut curve = Curve::default();
        for _ in 0..10 {
            let obs = observation(now, 4.0, 64, 1.0);
            curve.first_token(&FirstToken {
                at: now,
                ttft: 0.05,
                prompt_tokens: Some(64),
                admitted_with: 1.0,
                queued_with: 0,
            });
            curve.record(&obs);
        }
        let model = curve.model().unwrap();
        assert!(!model.predict(2.0, 64).beyond_evidence);
        assert!(model.predict(3.0, 64).beyond_evidence);
    }

    #[test]
    fn ttft_jumps_right_after_a_batch_limit_and_stays_up_beyond_it() {
        // Eight slots: the ninth request in waits for one to free.
        let now = Instant::now();
        let mut curve = Curve::default();
        for n in 1..=9u32 {
            for _ in 0..10 {
                let mut obs = observation(now, f64::from(n), 64, 1.0);
                obs.ttft = Some(if n <= 8 { 0.02 } else { 1.5 });
                curve.first_token(&FirstToken {
                    at: now,
                    ttft: obs.ttft.unwrap(),
                    prompt_tokens: Some(64),
                    admitted_with: f64::from(n),
                    queued_with: 0,
                });
                curve.record(&obs);
            }
        }
        let model = curve.model().unwrap();
        assert!(model.predict(8.0, 64).ttft_p90_s < 0.05);
        assert!(model.predict(9.0, 64).ttft_p50_s >= 1.5);
        // Nothing seen at 10 yet: no sooner than at 9.
        assert!(model.predict(10.0, 64).ttft_p50_s >= 1.5);
    }

    #[test]
    fn one_recent_slow_first_token_past_the_levels_seen_is_believed() {
        let t0 = Instant::now();
        let mut curve = Curve::new(60.0);
        for n in 1..=8u32 {
            for _ in 0..10 {
                let mut obs = observation(t0, f64::from(n), 64, 1.0);
                obs.ttft = Some(0.02);
                learn(&mut curve, &obs);
            }
        }
        let slow_at_nine = |at| FirstToken {
            at,
            ttft: 1.5,
            prompt_tokens: Some(64),
            admitted_with: 9.0,
            queued_with: 0,
        };
        curve.first_token(&slow_at_nine(t0));
        assert!(curve.model().unwrap().predict(9.0, 64).ttft_p90_s >= 1.5);
        // And for the levels above it, which nobody has tried: no sooner there.
        assert!(curve.model().unwrap().predict(12.0, 64).ttft_p50_s >= 1.5);
        // Two half-lives later, one old sample no longer speaks for the level.
        let later = t0 + Duration::from_secs(120);
        let p = curve.predict(9.0, 64, later).unwrap();
        assert!(p.ttft_p90_s < 0.5, "{p:?}");
        assert!(curve.predict(12.0, 64, later).unwrap().ttft_p90_s < 0.5);
    }

    /// A curve of ten quick first tokens (20 ms) at each occupancy up to `trusted`, then one
    /// first token each at the `sparse` (occupancy, TTFT) pairs.
    fn trusted_then_sparse(t0: Instant, trusted: u32, ttft: f64, sparse: &[(f64, f64)]) -> Curve {
        let mut curve = Curve::new(60.0);
        for n in 1..=trusted {
            for _ in 0..10 {
                let mut obs = observation(t0, f64::from(n), 64, 1.0);
                obs.ttft = Some(ttft);
                learn(&mut curve, &obs);
            }
        }
        for &(admitted_with, ttft) in sparse {
            curve.first_token(&FirstToken {
                at: t0,
                ttft,
                prompt_tokens: Some(64),
                admitted_with,
                queued_with: 0,
            });
        }
        curve
    }

    #[test]
    fn past_a_batch_limit_each_request_ahead_costs_at_least_what_the_last_did() {
        // A batch of 6 full: the 7th waits 250 ms for a slot, the 8th 500 ms; nobody has
        // been admitted at 9 or 10 yet. Requests hold their slot ~1.6 s.
        let t0 = Instant::now();
        let curve = trusted_then_sparse(t0, 6, 0.02, &[(7.0, 0.25), (8.0, 0.5)]);
        let model = curve.model().unwrap();
        assert!(model.predict(6.0, 64).ttft_p90_s < 0.05);
        let at_nine = model.predict(9.0, 64).ttft_p50_s;
        assert!(
            at_nine >= 0.74,
            "one more request ahead, one more slot to wait for: {at_nine}"
        );
        let at_ten = model.predict(10.0, 64).ttft_p90_s;
        assert!(at_ten >= 0.99, "{at_ten}");
        // A lucky first token at 9 (a slot freed just then) does not make 10 look cheap.
        let lucky = trusted_then_sparse(t0, 6, 0.02, &[(7.0, 0.25), (8.0, 0.5), (9.0, 0.3)]);
        let at_ten = lucky.model().unwrap().predict(10.0, 64).ttft_p90_s;
        assert!(at_ten >= 0.99, "{at_ten}");
    }

    #[test]
    fn a_queue_measured_past_a_batch_limit_is_carried_on_to_the_levels_nobody_tried() {
        // The 7th and 8th waited for a slot, time and again: both levels trusted, none above.
        let t0 = Instant::now();
        let mut curve = trusted_then_sparse(t0, 6, 0.02, &[]);
        for (n, ttft) in [(7.0, 0.25), (8.0, 0.5)] {
            for _ in 0..10 {
                let mut obs = observation(t0, n, 64, 1.0);
                obs.ttft = Some(ttft);
                learn(&mut curve, &obs);
            }
        }
        let model = curve.model().unwrap();
        assert!(model.predict(8.0, 64).ttft_p90_s < 0.6);
        // Not 500 ms, the highest level's, as before: two more slots to wait for than at 8.
        let at_ten = model.predict(10.0, 64).ttft_p50_s;
        assert!(at_ten >= 0.99, "{at_ten}");
    }

    #[test]
    fn jitter_on_a_flat_first_token_is_not_taken_for_a_queue() {
        // A hosted API's fixed 850 ms, a little later at 4 and 5 by chance.
        let t0 = Instant::now();
        let curve = trusted_then_sparse(t0, 3, 0.85, &[(4.0, 0.88), (5.0, 0.90)]);
        let at_ten = curve.model().unwrap().predict(10.0, 64).ttft_p50_s;
        assert!(at_ten < 0.95, "{at_ten}");
    }

    #[test]
    fn a_burst_is_believed_at_once_and_forgotten_once_its_queue_is_gone() {
        // Steady traffic at 8 in flight: first tokens in 150 ms, nobody waiting ahead.
        let t0 = Instant::now();
        let steady = |curve: &mut Curve, from: Instant, n: u64| {
            for i in 0..n {
                let at = from + Duration::from_millis(100 * i);
                let mut obs = observation(at, 8.0, 64, 1.0);
                obs.ttft = Some(0.150);
                curve.first_token(&FirstToken {
                    at,
                    ttft: 0.150,
                    prompt_tokens: Some(64),
                    admitted_with: 8.0,
                    queued_with: 0,
                });
                curve.record(&obs);
            }
        };
        let mut reference = Curve::new(60.0);
        steady(&mut reference, t0, 40);
        let mut curve = Curve::new(60.0);
        steady(&mut curve, t0, 40);
        // Then eight requests at once: the n-th waits behind n - 1 prefills.
        let burst = t0 + Duration::from_secs(4);
        for n in 1..=8u32 {
            curve.first_token(&FirstToken {
                at: burst,
                ttft: 0.150 + 0.130 * f64::from(n - 1),
                prompt_tokens: Some(64),
                admitted_with: f64::from(n),
                queued_with: n - 1,
            });
        }
        let believed = curve.model().unwrap().predict(7.0, 64).ttft_p50_s;
        assert!(believed >= 0.9, "the queue is believed at once: {believed}");
        // Steady traffic again, as the reference saw: newer first tokens at 8, sooner than any
        // of the burst's queued ones, show their queue gone.
        steady(&mut curve, burst + Duration::from_millis(100), 15);
        steady(&mut reference, burst + Duration::from_millis(100), 15);
        // The 8th waited 1.06 s: its queue is surely gone 3.2 s later, when traffic has
        // stopped: the periodic check rebuilds the curve.
        let later = burst + Duration::from_secs(8);
        assert!(curve.forgets_by(later));
        curve.forget_due(later);
        reference.refresh(later);
        let (got, want) = (curve.model().unwrap(), reference.model().unwrap());
        for n in 1..=8 {
            let (g, w) = (
                got.predict(f64::from(n), 64).ttft_p50_s,
                want.predict(f64::from(n), 64).ttft_p50_s,
            );
            assert!((g / w - 1.0).abs() < 0.10, "at {n}: {g} against {w}");
        }
        assert!(!curve.forgets_by(later + Duration::from_secs(600)));
    }

    #[test]
    fn queue_evidence_at_a_level_traffic_still_visits_ages_like_any_sample() {
        // Past a batch limit of 8, first tokens at 9 wait for a slot, some behind others.
        let t0 = Instant::now();
        let mut curve = Curve::new(60.0);
        curve.record(&observation(t0, 8.0, 64, 1.0));
        let at_nine = |i: u64, queued_with| FirstToken {
            at: t0 + Duration::from_millis(500 * i),
            ttft: 1.2,
            prompt_tokens: Some(64),
            admitted_with: 9.0,
            queued_with,
        };
        for i in 0..10 {
            curve.first_token(&at_nine(i, 1));
        }
        // A newer first token at 9 with no queue: the queued ones before it stay evidence.
        curve.first_token(&at_nine(10, 0));
        let later = t0 + Duration::from_secs(30);
        curve.forget_due(later);
        assert!(!curve.forgets_by(later + Duration::from_secs(600)));
        let p = curve.predict(9.0, 64, later).unwrap();
        assert!(p.ttft_p50_s >= 1.2, "{p:?}");
    }

    #[test]
    fn a_queue_past_a_batch_limit_is_not_forgotten_for_a_lucky_first_token() {
        // A batch of 6 full and 3 more waiting: the 10th waits for 4 slots to turn over, 1.2 s
        // mostly, 0.5 s when they happen to end together.
        let t0 = Instant::now();
        let mut curve = trusted_then_sparse(t0, 6, 0.02, &[]);
        let at_ten = |ms: u64, ttft| FirstToken {
            at: t0 + Duration::from_millis(ms),
            ttft,
            prompt_tokens: Some(64),
            admitted_with: 10.0,
            queued_with: 3,
        };
        for i in 0..5 {
            curve.first_token(&at_ten(300 * i, 1.2));
        }
        curve.first_token(&at_ten(1600, 0.5));
        let later = t0 + Duration::from_secs(8);
        curve.forget_due(later);
        let p = curve.predict(10.0, 64, later).unwrap();
        assert!(p.ttft_p90_s >= 1.0, "{p:?}");
    }

    #[test]
    fn attainment_is_the_share_of_recent_samples_meeting_both_targets() {
        let now = Instant::now();
        let mut curve = Curve::default();
        for c in [1.0, 2.0, 4.0, 8.0] {
            learn(&mut curve, &observation(now, c, 0, 1.0));
        }
        // TPS: 90.9, 83.3, 71.4, 55.6; TTFT: 22, 24, 28, 36 ms.
        assert_eq!(curve.attainment(Some(60.0), None), Some(0.75));
        assert_eq!(curve.attainment(Some(60.0), Some(0.025)), Some(0.5));
        assert_eq!(curve.attainment(None, None), Some(1.0));
    }

    #[test]
    fn a_model_rebuilt_from_kept_summaries_equals_one_built_from_every_sample() {
        // Rebuilds fall due every 100 ms, and each re-summarises only the windows changed since.
        let t0 = Instant::now();
        let mut curve = Curve::new(0.5);
        let mut at = t0;
        let learn_at = |curve: &mut Curve, at, i: u32| {
            let c = f64::from(i % 40 + 1);
            let slow = 1.0 + f64::from(i % 3) / 10.0;
            learn(curve, &observation(at, c, u64::from(i % 300), slow));
        };
        for i in 0..2000 {
            at += Duration::from_millis(10);
            learn_at(&mut curve, at, i);
        }
        let every_sample = |curve: &Curve, at| {
            let speed = std::array::from_fn(|i| curve.buckets.windows()[i].summary(()));
            // The fit's sums do not depend on the rate the quantiles are taken at.
            let any = std::array::from_fn(|i| curve.starts.windows()[i].summary(<_>::default()));
            let rate = PrefillRate::near(model::ttft_fit(&any).2);
            let starts = std::array::from_fn(|i| curve.starts.windows()[i].summary(rate));
            Model::build(&speed, &starts, curve.decay.factor(at)).unwrap()
        };
        curve.refresh(at);
        assert_eq!(**curve.model().unwrap(), every_sample(&curve, at));
        // One request 40 s later (80 half-lives of 0.5 s past the first sample): the weights are
        // rebased onto a later anchor, and every window's kept summary with them.
        at += Duration::from_secs(40);
        learn_at(&mut curve, at, 0);
        assert!(curve.decay.factor(at) > 2f64.powi(-64), "rebased");
        curve.refresh(at);
        assert_eq!(**curve.model().unwrap(), every_sample(&curve, at));
    }

    #[test]
    fn cancelled_requests_are_counted_but_never_sampled() {
        let now = Instant::now();
        let mut curve = Curve::default();
        let mut obs = observation(now, 2.0, 10, 1.0);
        obs.outcome = Outcome::Cancelled;
        curve.record(&obs);
        assert_eq!(curve.counts().cancelled, 1);
        assert!(curve.points(now).is_empty());
        assert_eq!(curve.predict(2.0, 10, now), None);
    }

    #[test]
    fn an_idle_serial_engine_is_not_charged_a_queue() {
        // A one-slot engine seen only busy: a request admitted as the n-th waits for the n - 1
        // ahead of it, a second each, after its own 140 ms. Alone, it waits for none.
        let now = Instant::now();
        let mut curve = Curve::default();
        for n in 2..=6_u32 {
            for _ in 0..8 {
                let obs = Observation {
                    ttft: Some(0.140 + 1.0 * f64::from(n - 1)),
                    tpot: Some(1.0 / 64.0),
                    ..observation(now, f64::from(n), 64, 1.0)
                };
                learn(&mut curve, &obs);
            }
        }
        let fit = curve.fit(now).unwrap();
        assert!((fit.ttft_base_s - 0.140).abs() < 0.01, "{fit:?}");
        assert!((fit.ttft_per_seq_s - 1.0).abs() < 0.01, "{fit:?}");
        let idle = curve.predict(1.0, 64, now).unwrap();
        assert!((idle.ttft_p50_s - 0.140).abs() < 0.02, "{idle:?}");
    }

    #[test]
    fn a_level_spreads_as_its_requests_did_and_says_how_likely_a_target_is() {
        // Speeds 8 to 12 tok/s at concurrency 4, evenly: a 10 tok/s target is met by about
        // half, 9 by three in four.
        let now = Instant::now();
        let mut curve = Curve::default();
        for k in 0..=40 {
            let obs = Observation {
                tpot: Some(1.0 / (8.0 + 0.1 * f64::from(k))),
                ..observation(now, 4.0, 64, 1.0)
            };
            learn(&mut curve, &obs);
        }
        let p = curve.predict(4.0, 64, now).unwrap();
        assert!((p.per_user_tps_p10 - 8.4).abs() < 0.11, "{p:?}");
        let half = p.chance(Some(10.0), None);
        assert!((half - 0.5).abs() < 0.05, "{half}");
        let most = p.chance(Some(9.0), None);
        assert!((most - 0.75).abs() < 0.05, "{most}");
        // TTFT: every first token came in 28 ms (20 + 2 x 4 ms): a 1-s target is sure.
        assert!((p.chance(Some(9.0), Some(1.0)) - most).abs() < 1e-9);
        assert_eq!(p.chance(None, Some(0.001)), 0.0);
    }
}
