//! A curve's fitted snapshot: what routing reads on every request.
//!
//! Building one adds up the windows' summaries (each window re-summarised only when it changed,
//! see [`super::window`]); a [`Model`] is rebuilt at most every [`super::REFRESH`] while
//! observations arrive and shared behind an `Arc`; asking it for a [`Prediction`] is O(1).

use serde::Serialize;

use super::spread::Spread;
use super::window::{PrefillRate, StartSummary, Summary};
use super::{BUCKETS, Fit, MIN_BUCKET_WEIGHT, Point, TTFT_LEVELS, bucket_of, fit, ttft_bucket_of};

/// Decayed weight at which a level without enough samples to answer on its own still speaks:
/// a TTFT bucket raises its own prediction over the fit, and the floors above it; a speed level
/// past the trusted ones that reads faster is believed over the fit. One sample up to a
/// half-life old.
const SPARSE_WEIGHT: f64 = 0.5;

/// What the fit weighs, in samples, against a level's own sparse observations: a level with
/// direct observations is predicted from them, weighted by their count against the fit (one
/// sample at a level counts as much as the fit there; two, twice as much). A fit through two
/// levels of a one-slot server otherwise predicted its idle first token 14 times later than it
/// had been seen.
const FIT_WEIGHT: f64 = 1.0;

/// Decayed weight at which a level's own speed tail is trusted as well as its middle: below
/// it, the 10th percentile rests on its slowest sample or two, and one slow draw reads as a
/// level that misses (docs/benchmarks/routing.md, "A level trusted from a few samples: its
/// tail tried, not believed").
const TAIL_WEIGHT: f64 = 20.0;

/// The standard normal's 10th percentile, negated: how many spreads below its median a
/// log-normal's 10th percentile lies.
const Z_10: f64 = 1.2816;

/// What a curve that has seen no spread of its own guesses: a speed tail 10% below the median
/// (at its 10th percentile) and a first token 25% later than the median (at its 90th).
const GUESSED_TPS_P10: f64 = 0.9;

/// See [`GUESSED_TPS_P10`].
const GUESSED_TTFT_P90: f64 = 1.25;

/// What the curve expects for one more request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    /// Per-user TPS median.
    pub per_user_tps_p50: f64,
    /// Per-user TPS 10th percentile.
    pub per_user_tps_p10: f64,
    /// TTFT median, seconds.
    pub ttft_p50_s: f64,
    /// TTFT 90th percentile, seconds.
    pub ttft_p90_s: f64,
    /// 0 (a guess) to nearly 1 (much recent evidence at this concurrency).
    pub confidence: f64,
    /// The concurrency asked about is more than twice what the curve has seen (the highest
    /// experienced concurrency, or the highest occupancy a first token came from, whichever is
    /// lower): the fit is extrapolating, and routing treats that as exploration.
    pub beyond_evidence: bool,
    /// Past the levels whose speed the curve trusts, at a level without enough samples of its
    /// own ([`MIN_BUCKET_WEIGHT`]): its speed is the fit's drawn through the levels below, or a
    /// few samples weighed against it. Or right above a level whose tail it trusts
    /// ([`TAIL_WEIGHT`]), at one whose median agrees with the fit, so that only its few
    /// samples' tail may miss. Either errs either way, and only a request sent there tells which;
    /// routing tries such a level one request at a time where the other end is a refusal
    /// (`Candidate::probe_chance` in `router/candidates.rs`).
    #[serde(skip)]
    pub unproven: bool,
    /// How per-user TPS spreads there: how likely a request is to reach a speed.
    #[serde(skip)]
    pub tps: Spread,
    /// How TTFT spreads there, seconds.
    #[serde(skip)]
    pub ttft: Spread,
}

impl Prediction {
    /// A prediction of these spreads, its quantiles read off them.
    pub(crate) fn new(tps: Spread, ttft: Spread, confidence: f64, beyond_evidence: bool) -> Self {
        Self {
            per_user_tps_p50: tps.median(),
            per_user_tps_p10: tps.quantile(0.1),
            ttft_p50_s: ttft.median(),
            ttft_p90_s: ttft.quantile(0.9),
            confidence,
            beyond_evidence,
            unproven: false,
            tps,
            ttft,
        }
    }

    /// Its first token no sooner than `at_least_s` (a wait seen live). A floor at or below the
    /// median moves nothing (the spread's quantiles are not negative). In place: asked of
    /// every candidate, it copies nothing.
    pub(crate) fn raise_ttft(&mut self, at_least_s: f64) {
        if at_least_s <= self.ttft_p50_s && self.ttft.quantile(0.0) >= 0.0 {
            return;
        }
        self.ttft = self.ttft.at_least(at_least_s, at_least_s);
        self.ttft_p50_s = self.ttft.median();
        self.ttft_p90_s = self.ttft.quantile(0.9);
    }

    /// The decayed count of samples behind it at its concurrency (the fewer of speed's and
    /// TTFT's): what [`Prediction::confidence`] was made of, `w / (w + MIN_BUCKET_WEIGHT)`.
    pub(crate) fn evidence(&self) -> f64 {
        let c = self.confidence.clamp(0.0, 0.999_999);
        MIN_BUCKET_WEIGHT * c / (1.0 - c)
    }

    /// The same, with the speed spread `tps`.
    pub(crate) fn with_speed(self, tps: Spread) -> Self {
        Self {
            unproven: self.unproven,
            ..Self::new(tps, self.ttft, self.confidence, self.beyond_evidence)
        }
    }

    /// How likely a request is to reach `min_tps` (either may be absent) and to see its first
    /// token within `max_ttft_s`, speed and TTFT taken as independent.
    pub(crate) fn chance(&self, min_tps: Option<f64>, max_ttft_s: Option<f64>) -> f64 {
        let speed = min_tps.map_or(1.0, |m| self.tps.share_above(m));
        let first = max_ttft_s.map_or(1.0, |m| {
            if m > 0.0 {
                self.ttft.share_below(m)
            } else {
                0.0
            }
        });
        speed * first
    }
}

/// TTFT of the requests that found a given occupancy at admission.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TtftSummary {
    weight: f64,
    mean_admitted: f64,
    p50: f64,
    p90: f64,
    /// The spread of TTFT less each request's own prefill (see [`StartSummary::queue`]).
    queue: Spread,
    /// The rate those were taken at: a request's own prefill is added back at the same.
    rate: PrefillRate,
}

/// A fitted snapshot of one curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The fitted lines.
    pub fit: Fit,
    /// Speed by experienced concurrency.
    buckets: [Option<Summary>; BUCKETS.len()],
    /// TTFT by occupancy at admission ([`TTFT_LEVELS`]).
    starts: [Option<TtftSummary>; TTFT_LEVELS.len()],
    /// Per TTFT bucket, the highest queue p50 and p90 (TTFT less the own prefill) of the
    /// trusted buckets at or below it: more requests ahead never bring the first token sooner,
    /// so a prediction never goes below them (plus its own prompt's prefill). Past the last
    /// trusted bucket, sparse ones count too, and a queue's growth per request is carried on
    /// ([`floors`]).
    floors: [(f64, f64); TTFT_LEVELS.len()],
    /// Highest experienced concurrency among speed buckets holding at least one sample's weight.
    pub speed_seen: f64,
    /// Highest occupancy at admission among TTFT buckets holding at least one sample's weight.
    pub ttft_seen: f64,
    /// Highest experienced concurrency among speed buckets whose own quantiles are trusted
    /// ([`MIN_BUCKET_WEIGHT`]): above it the fit extrapolates.
    speed_trusted: f64,
    /// Weighted mean of TTFT + decode time, seconds: how long a request holds its slot.
    pub mean_duration_s: f64,
    /// How speed spreads about its median where a level has evidence of its own, pooled: the
    /// shape a prediction from the fit (or a sparse level) takes.
    tps_shape: Spread,
    /// The same of the wait for a first token.
    ttft_shape: Spread,
}

impl Model {
    /// Fits speed from the speed windows' summaries and TTFT from the TTFT windows', whose
    /// anchor-relative weights are worth `factor` each as of the moment fitted (see
    /// [`super::window::Decay`]); `None` before the first completed request.
    pub(crate) fn build(
        speed: &[Option<Summary>; BUCKETS.len()],
        starts: &[Option<StartSummary>; TTFT_LEVELS.len()],
        factor: f64,
    ) -> Option<Self> {
        let buckets = speed.map(|s| {
            s.map(|s| Summary {
                weight: s.weight * factor,
                ..s
            })
        });
        let present = || buckets.iter().flatten();
        let trusted_speed_levels = || present().filter(|s| s.weight >= MIN_BUCKET_WEIGHT);
        let total: f64 = present().map(|s| s.weight).sum();
        if total <= 0.0 {
            return None;
        }
        let mean = |f: fn(&Summary) -> f64| present().map(|s| s.weight * f(s)).sum::<f64>() / total;
        let (tpot_base_s, tpot_per_seq_s, tpot_per_neighbour_s) = beside_neighbours(&buckets)
            .unwrap_or_else(|| {
                match fit::wls(
                    present().map(|s| ([1.0, s.mean_concurrency], s.mean_tpot, s.weight)),
                ) {
                    // Speed cannot rise with load; a negative slope is noise.
                    Some([a, b]) if b >= 0.0 && a > 0.0 => (a, b, 0.0),
                    _ => (mean(|s| s.mean_tpot), 0.0, 0.0),
                }
            });
        let mean_duration_s = mean(|s| s.mean_duration_s);

        let (ttft_base_s, ttft_per_seq_s, prefill_tokens_per_s) = ttft_fit(starts);
        let starts = starts.map(|s| {
            s.map(|s| TtftSummary {
                weight: s.weight * factor,
                mean_admitted: s.mean_admitted,
                p50: s.p50,
                p90: s.p90,
                queue: s.queue,
                rate: s.rate,
            })
        });
        // Speed and TTFT each need their own evidence: a one-slot server's requests decode at a
        // high experienced concurrency (the queue behind them counts) long before any has been
        // admitted behind a queue and shown what that costs.
        let speed_seen = present()
            .filter(|s| s.weight >= 1.0)
            .map(|s| s.mean_concurrency)
            .fold(0.0, f64::max);
        let speed_trusted = trusted_speed_levels()
            .map(|s| s.mean_concurrency)
            .fold(0.0, f64::max);
        let ttft_seen = starts
            .iter()
            .flatten()
            .filter(|s| s.weight >= 1.0)
            .map(|s| s.mean_admitted)
            .fold(0.0, f64::max);
        // Pooled as a ratio of sums, so that a level whose median wait is a few milliseconds
        // does not stretch every other level's shape.
        let tps_shape = shape(trusted_speed_levels().map(|s| (s.weight, s.tps)))
            .unwrap_or_else(|| Spread::log_normal(1.0, 0.1, GUESSED_TPS_P10));
        let trusted_starts = starts
            .iter()
            .flatten()
            .filter(|s| s.weight >= MIN_BUCKET_WEIGHT);
        let ttft_shape = shape(trusted_starts.map(|s| (s.weight, s.queue)))
            .unwrap_or_else(|| Spread::log_normal(1.0, 0.9, GUESSED_TTFT_P90));

        Some(Self {
            fit: Fit {
                tpot_base_s,
                tpot_per_seq_s,
                tpot_per_neighbour_s,
                ttft_base_s,
                ttft_per_seq_s,
                prefill_tokens_per_s,
            },
            buckets,
            starts,
            floors: floors(&starts, mean_duration_s),
            speed_seen,
            ttft_seen,
            speed_trusted,
            mean_duration_s,
            tps_shape,
            ttft_shape,
        })
    }

    /// What a request joining at `concurrency` (itself included) with `prompt_tokens` should
    /// expect. Speed: the bucket of that experienced concurrency, TTFT: the bucket of that
    /// occupancy at admission, each where it has enough evidence (its spread moved along the
    /// fit from where its samples were to this exact concurrency); else the fit, weighed
    /// against the level's own few observations ([`FIT_WEIGHT`]), in the shape the levels with
    /// evidence spread.
    ///
    /// `neighbours` is the load on the backends sharing its device (`device:`; 0 for none):
    /// speed moves along the fit's neighbour term with it, TTFT is taken as its own queue's.
    pub(crate) fn predict(
        &self,
        concurrency: f64,
        neighbours: f64,
        prompt_tokens: u64,
    ) -> Prediction {
        let per_neighbour_s = self.fit.tpot_per_neighbour_s;
        self.predict_beside(concurrency, neighbours, per_neighbour_s, prompt_tokens)
    }

    /// [`Model::predict`], each neighbour running costing a token `per_neighbour_s` (where
    /// the curve has not told its own, what another engine on the device learned).
    pub(crate) fn predict_beside(
        &self,
        concurrency: f64,
        neighbours: f64,
        per_neighbour_s: f64,
        prompt_tokens: u64,
    ) -> Prediction {
        let i = bucket_of(concurrency);
        let j = ttft_bucket_of(concurrency);
        let fit = &self.fit;
        let tpot_at = |c: f64, n: f64| fit.tpot_s(c, n, per_neighbour_s);
        // The requests ahead: a lone request waits for none.
        let queue_at = |c: f64| fit.ttft_base_s + fit.ttft_per_seq_s * (c - 1.0).max(0.0);
        let speed_weight = self.buckets[i].map_or(0.0, |s| s.weight);
        let start_weight = self.starts[j].map_or(0.0, |s| s.weight);
        let weight = speed_weight.min(start_weight);
        let confidence = weight / (weight + MIN_BUCKET_WEIGHT);
        let beyond_evidence = concurrency > 2.0 * self.speed_seen.min(self.ttft_seen).max(1.0);

        // A level's observations weighed against the fit: all of it once they are evidence.
        let observed_share = |w: f64| {
            if w >= MIN_BUCKET_WEIGHT {
                1.0
            } else {
                w / (w + FIT_WEIGHT)
            }
        };
        // A level trusted from fewer samples than its tail needs, right above one whose tail
        // is trusted, with a middle no slower than the fit's: only its thin tail may miss.
        let tail_below = i > 0 && self.buckets[i - 1].is_some_and(|s| s.weight >= TAIL_WEIGHT);
        let mut thin_tail = false;
        let tps = match self.buckets[i] {
            Some(s) => {
                // A bucket spans a range (16 holds 14 to 19): move it along the fit.
                let seen = s.tps.scaled(
                    tpot_at(s.mean_concurrency, s.spread_neighbours)
                        / tpot_at(concurrency, neighbours),
                );
                let fitted = 1.0 / tpot_at(concurrency, neighbours);
                let share = if concurrency > self.speed_trusted
                    && s.weight >= SPARSE_WEIGHT
                    && seen.median() > fitted
                {
                    // Past the trusted levels the fit extrapolates a line drawn below them,
                    // which a batch's cost per request need not follow (an H200's engine held
                    // its speed from 8 in flight on): a level's own samples that read faster
                    // are believed. Slower, they are weighed by their count as below: a gloomy
                    // level lets nobody in to correct it, and one sample slowed by a
                    // neighbour's pass would hold it shut for a half-life.
                    1.0
                } else {
                    observed_share(s.weight)
                };
                if s.weight >= MIN_BUCKET_WEIGHT {
                    thin_tail = tail_below
                        && s.weight < TAIL_WEIGHT
                        && self.median_agrees(seen.median(), fitted, s.weight);
                    seen
                } else {
                    let median = share * seen.median() + (1.0 - share) * fitted;
                    self.tps_shape.scaled(median)
                }
            }
            None => self
                .tps_shape
                .scaled(1.0 / tpot_at(concurrency, neighbours)),
        };
        let prompt = prompt_tokens as f64;
        let prefill = fit.prefill_tokens_per_s.map_or(0.0, |r| prompt / r);
        let ttft = match self.starts[j] {
            Some(s) => {
                // The level's wait for the requests ahead, moved along the fit to this
                // concurrency, plus this prompt's own prefill at the rate the wait was measured
                // against.
                let later =
                    queue_at(concurrency) - queue_at(s.mean_admitted) + s.rate.prefill_s(prompt);
                let seen = s.queue.shifted(later);
                let share = observed_share(s.weight);
                let fitted = queue_at(concurrency) + prefill;
                if share >= 1.0 {
                    seen
                } else if seen.median() > fitted && s.weight >= SPARSE_WEIGHT {
                    // Bad news is believed before it is certain: a first token at this very
                    // occupancy, within about a half-life, that came later than the fit says
                    // is how a queue past a batch limit, or a burst's, first shows (the fit,
                    // drawn mostly through the levels below it, cannot bend there).
                    self.ttft_shape.scaled(seen.median())
                } else {
                    let median = share * seen.median() + (1.0 - share) * fitted;
                    self.ttft_shape.scaled(median)
                }
            }
            None => self.ttft_shape.scaled(queue_at(concurrency) + prefill),
        };
        let (floor_p50, floor_p90) = self.floors[j];
        let ttft = ttft.at_least(floor_p50 + prefill, floor_p90 + prefill);
        // Past the trusted levels, at one without enough samples of its own to be trusted; or
        // at a level whose thin tail alone may miss.
        let unproven =
            (concurrency > self.speed_trusted && speed_weight < MIN_BUCKET_WEIGHT) || thin_tail;
        Prediction {
            unproven,
            ..Prediction::new(tps, ttft, confidence, beyond_evidence)
        }
    }

    /// Whether a level's median speed `seen`, from `weight` samples, is within its sampling
    /// error of the fit's `fitted` or above it: the standard error of a median of `w` draws
    /// is about 1.25 spreads over the root of `w`, the spread the pooled shape's.
    fn median_agrees(&self, seen: f64, fitted: f64, weight: f64) -> bool {
        let shape = &self.tps_shape;
        let sigma = (shape.median() / shape.quantile(0.1)).ln().max(0.0) / Z_10;
        seen >= fitted * (-1.25 * sigma / weight.sqrt()).exp()
    }

    /// The levels that hold samples, for `/admin/curves`, the dashboard and the gauges.
    pub(crate) fn points(&self) -> Vec<Point> {
        let mut points = std::collections::BTreeMap::new();
        for (level, speed) in BUCKETS.iter().zip(&self.buckets) {
            if let Some(s) = speed {
                let p = points.entry(*level).or_insert_with(|| Point::empty(*level));
                p.samples = s.samples;
                p.weight = s.weight;
                p.per_user_tps_p50 = Some(s.tps.median());
                p.per_user_tps_p10 = Some(s.tps.quantile(0.1));
            }
        }
        for (level, start) in TTFT_LEVELS.iter().zip(&self.starts) {
            if let Some(s) = start {
                let p = points.entry(*level).or_insert_with(|| Point::empty(*level));
                p.ttft_p50_s = Some(s.p50);
                p.ttft_p90_s = Some(s.p90);
                p.ttft_weight = s.weight;
            }
        }
        points.into_values().collect()
    }
}

/// `d` of [`beside_neighbours`], 0 where there is none.
pub(crate) fn neighbour_term(buckets: &[Option<Summary>; BUCKETS.len()]) -> f64 {
    beside_neighbours(buckets).map_or(0.0, |(_, _, d)| d)
}

/// TPOT = a + b·c + d·n fitted sample by sample, where the backends sharing this one's device
/// have been seen busy (`None` where they have not, or the fit says nothing sensible): (a, b, d)
/// with every term a cost. `d` is what the neighbours cost within a level
/// ([`neighbour_cost_within_levels`]) where the levels say, else the pooled fit's; `a` and `b`
/// are then the line through the speeds put back beside an idle device. Where the pooled three
/// cannot be told apart as costs (its own load seems to speed it up, as a one-slot server's
/// experienced concurrency counts a queue that does not slow it; or its own load and its
/// neighbours' rose together), its own term is left out.
fn beside_neighbours(buckets: &[Option<Summary>; BUCKETS.len()]) -> Option<(f64, f64, f64)> {
    let present = || buckets.iter().flatten();
    if !present().any(|s| s.mean_neighbours > 0.0) {
        return None;
    }
    let mut xx = [[0.0; 3]; 3];
    let mut xy = [0.0; 3];
    for s in present() {
        for (row, add) in xx.iter_mut().zip(&s.xx) {
            for (cell, a) in row.iter_mut().zip(add) {
                *cell += a;
            }
        }
        for (cell, a) in xy.iter_mut().zip(&s.xy) {
            *cell += a;
        }
    }
    if let Some(d) = neighbour_cost_within_levels(buckets) {
        // The line through each speed less what its neighbours cost it.
        let own = [[xx[0][0], xx[0][1]], [xx[1][0], xx[1][1]]];
        let rest = [xy[0] - d * xx[0][2], xy[1] - d * xx[1][2]];
        return match fit::solve(own, rest) {
            Some([a, b]) if a > 0.0 && b >= 0.0 => Some((a, b, d)),
            _ => (rest[0] > 0.0).then(|| (rest[0] / xx[0][0], 0.0, d)),
        };
    }
    match fit::solve(xx, xy) {
        Some([a, b, d]) if a > 0.0 && b >= 0.0 && d >= 0.0 => Some((a, b, d)),
        _ => {
            // Its own load and its neighbours' moved together (or not at all): the neighbours'
            // alone.
            let alone = [[xx[0][0], xx[0][2]], [xx[2][0], xx[2][2]]];
            match fit::solve(alone, [xy[0], xy[2]]) {
                Some([a, d]) if a > 0.0 && d >= 0.0 => Some((a, 0.0, d)),
                _ => None,
            }
        }
    }
}

/// What one running neighbour adds to a token's time, told by the samples of each level
/// against each other only (each level's own means taken out, the differences pooled): a
/// level's requests decoding beside a busy neighbour against those of the same level beside an
/// idle one. A line through every level would charge the neighbours for how speed bends with
/// the engine's own load: on an H200's engine that slowed to 8 in flight and held from there,
/// the pooled fit took a serial engine's pass beside it for 2 ms a token where it cost 8.5, so
/// samples slowed by that pass were put back barely faster, and the batch stayed shut at 8 in
/// flight for a half-life. `None` where no level has seen its neighbours both busy and idle,
/// or the difference is no cost.
fn neighbour_cost_within_levels(buckets: &[Option<Summary>; BUCKETS.len()]) -> Option<f64> {
    // Centred sums of (c, n) against each other and against TPOT, per level, pooled.
    let mut cc = [[0.0; 2]; 2];
    let mut cy = [0.0; 2];
    for s in buckets.iter().flatten() {
        let w = s.xx[0][0];
        if w <= 0.0 {
            continue;
        }
        for (j, row) in cc.iter_mut().enumerate() {
            for (k, cell) in row.iter_mut().enumerate() {
                *cell += s.xx[j + 1][k + 1] - s.xx[0][j + 1] * s.xx[0][k + 1] / w;
            }
            cy[j] += s.xy[j + 1] - s.xx[0][j + 1] * s.xy[0] / w;
        }
    }
    let d = match fit::solve(cc, cy) {
        Some([b, d]) if b >= 0.0 => d,
        // Its own load within a level says nothing (a one-slot server's queue): the
        // neighbours' alone.
        _ => fit::solve([[cc[1][1]]], [cy[1]])?[0],
    };
    (d > 0.0).then_some(d)
}

/// The shape of weighted spreads about their medians: their weighted sum over the weighted sum
/// of their medians (the pooled spread's own median); `None` without weight or without a
/// positive median.
fn shape(spreads: impl Iterator<Item = (f64, Spread)>) -> Option<Spread> {
    Spread::pooled(spreads)?.relative()
}

/// The TTFT fit over the TTFT windows' summaries: (t0, t1, r) of TTFT = t0 + t1·c + P/r.
pub(crate) fn ttft_fit(
    starts: &[Option<StartSummary>; TTFT_LEVELS.len()],
) -> (f64, f64, Option<f64>) {
    // The normal equations are sums over samples, so over windows.
    let mut xx = [[0.0; 3]; 3];
    let mut xy = [0.0; 3];
    let mut with_prompt = true;
    for s in starts.iter().flatten() {
        with_prompt &= s.with_prompt;
        for (row, add) in xx.iter_mut().zip(&s.xx) {
            for (cell, a) in row.iter_mut().zip(add) {
                *cell += a;
            }
        }
        for (cell, a) in xy.iter_mut().zip(&s.xy) {
            *cell += a;
        }
    }
    fit_ttft(&xx, &xy, with_prompt)
}

/// Prompt sizes must spread by at least this many tokens, and [`MIN_PROMPT_SPREAD_SHARE`] of
/// their mean, beyond what occupancy explains, before a prefill rate is fitted: a size estimate
/// that moves by a token on equal prompts says nothing about prefill.
const MIN_PROMPT_SPREAD_TOKENS: f64 = 32.0;

/// See [`MIN_PROMPT_SPREAD_TOKENS`].
const MIN_PROMPT_SPREAD_SHARE: f64 = 0.1;

/// Fits TTFT = t0 + t1·c + P/r from the weighted sums `xx = Σ w·x·xᵀ`, `xy = Σ w·x·ttft` with
/// x = (1, occupancy, prompt tokens); returns (t0, t1, r).
///
/// Every parameter stays physically possible: no negative base, no negative slope, no
/// negative or infinite rate. The prefill rate is fitted only where prompt sizes really spread
/// (`with_prompt`: every sample knew its size). Where the full fit puts one of the other two
/// out of bounds, that one is pinned at 0 and the rest fitted again (a base of a few
/// milliseconds, the decode step, comes out slightly negative in noise; a prefix cache's hits
/// and misses spread the prompt sizes widely): a line through the origin in occupancy and
/// prompt, or a base plus prefill. Failing those, the occupancy-only line; where that has a
/// negative base, a line through the origin; where it falls with occupancy, the mean.
fn fit_ttft(xx: &[[f64; 3]; 3], xy: &[f64; 3], with_prompt: bool) -> (f64, f64, Option<f64>) {
    let n = xx[0][0];
    if n <= 0.0 {
        return (0.0, 0.0, None);
    }
    let mean_ttft = (xy[0] / n).max(0.0);
    let rate_ok = |k: f64| k > 0.0 && (1.0 / k).is_finite();
    if with_prompt && prompts_spread(xx) {
        if let Some([t0, t1, k]) = fit::solve(*xx, *xy)
            && t0 >= 0.0
            && t1 >= 0.0
            && rate_ok(k)
        {
            return (t0, t1, Some(1.0 / k));
        }
        // Pinned base: the (occupancy, prompt) columns alone.
        if let Some([t1, k]) =
            fit::solve([[xx[1][1], xx[1][2]], [xx[2][1], xx[2][2]]], [xy[1], xy[2]])
            && t1 >= 0.0
            && rate_ok(k)
        {
            return (0.0, t1, Some(1.0 / k));
        }
        // Pinned slope: the (1, prompt) columns alone.
        if let Some([t0, k]) =
            fit::solve([[xx[0][0], xx[0][2]], [xx[2][0], xx[2][2]]], [xy[0], xy[2]])
            && t0 >= 0.0
            && rate_ok(k)
        {
            return (t0, 0.0, Some(1.0 / k));
        }
    }
    match fit::solve([[xx[0][0], xx[0][1]], [xx[1][0], xx[1][1]]], [xy[0], xy[1]]) {
        Some([t0, t1]) if t1 >= 0.0 && t0 >= 0.0 => (t0, t1, None),
        // Steeper than a line from a non-negative base allows: through the origin, the
        // least-squares slope of TTFT on occupancy alone.
        Some([_, t1]) if t1 >= 0.0 && xx[1][1] > 0.0 => (0.0, (xy[1] / xx[1][1]).max(0.0), None),
        _ => (mean_ttft, 0.0, None),
    }
}

/// Whether prompt sizes vary enough, beyond what occupancy explains, to tell a prefill rate:
/// the weighted spread of the prompt size left after regressing it on occupancy.
fn prompts_spread(xx: &[[f64; 3]; 3]) -> bool {
    let n = xx[0][0];
    let (mean_c, mean_p) = (xx[0][1] / n, xx[0][2] / n);
    let var_c = xx[1][1] / n - mean_c * mean_c;
    let var_p = xx[2][2] / n - mean_p * mean_p;
    let cov = xx[1][2] / n - mean_c * mean_p;
    let unexplained = if var_c > 1e-12 {
        var_p - cov * cov / var_c
    } else {
        var_p
    };
    let spread = unexplained.max(0.0).sqrt();
    spread >= MIN_PROMPT_SPREAD_TOKENS && spread >= MIN_PROMPT_SPREAD_SHARE * mean_p
}

/// Per request ahead, the least a first token's queue must grow by, as a share of how long a
/// request holds its slot, before the growth is taken for a queue and carried on to the levels
/// above: a batch of 16 or fewer turning over. Jitter on a flat TTFT (a hosted API's) grows
/// less than that, and a wide batch's queue is seen at its own levels long before it matters.
const QUEUE_GROWTH_SHARE: f64 = 1.0 / 16.0;

/// Running maxima of the trusted TTFT buckets' queue quantiles, from the lowest occupancy up,
/// and past the last trusted one, a queue's growth carried on.
fn floors(
    starts: &[Option<TtftSummary>; TTFT_LEVELS.len()],
    mean_duration_s: f64,
) -> [(f64, f64); TTFT_LEVELS.len()] {
    // Past the last level with full evidence, a recent first token on its own is believed
    // for every level above it too: beyond it the fit, drawn through the levels below, cannot
    // bend at a batch limit, and a request routed on it to a level nobody has tried yet (a
    // replica's view a round old, exploration) finds the queue the sparse one found.
    let evidenced = starts
        .iter()
        .rposition(|s| s.is_some_and(|s| s.weight >= MIN_BUCKET_WEIGHT));
    let queue_growth = QUEUE_GROWTH_SHARE * mean_duration_s;
    let mut floors = [(0.0, 0.0); TTFT_LEVELS.len()];
    let mut floor = (0.0_f64, 0.0_f64);
    let mut below = 0.0;
    // The last believed level (occupancy, queue p50) and the steepest growth of the queue per
    // request seen between believed levels: trusted ones, and past them sparse ones.
    let mut last: Option<(f64, f64)> = None;
    let mut growth = 0.0_f64;
    for (level, (out, start)) in floors.iter_mut().zip(starts).enumerate() {
        let sparse = evidenced.is_none_or(|e| level > e);
        let occupancy = f64::from(TTFT_LEVELS[level]);
        // Once a queue has formed past a batch limit, each request ahead costs about what the
        // last did (a slot turning over), never less: carried on from the level below, it
        // reaches levels that hold one lucky first token, or none.
        if sparse {
            let ahead = growth * (occupancy - below);
            floor = (floor.0 + ahead, floor.1 + ahead);
        }
        below = occupancy;
        let believed = if sparse {
            SPARSE_WEIGHT
        } else {
            MIN_BUCKET_WEIGHT
        };
        if let Some(s) = start.filter(|s| s.weight >= believed) {
            if let Some((at, p50)) = last
                && s.mean_admitted > at
            {
                let step = (s.queue.median() - p50) / (s.mean_admitted - at);
                if step >= queue_growth {
                    growth = growth.max(step);
                }
            }
            floor = (
                floor.0.max(s.queue.median()),
                floor.1.max(s.queue.quantile(0.9)),
            );
            last = Some((s.mean_admitted, s.queue.median()));
        }
        *out = floor;
    }
    floors
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The normal equations of TTFT samples `(occupancy, prompt, ttft)`.
    fn sums(samples: &[(f64, f64, f64)]) -> ([[f64; 3]; 3], [f64; 3]) {
        let mut xx = [[0.0; 3]; 3];
        let mut xy = [0.0; 3];
        for &(c, p, ttft) in samples {
            let x = [1.0, c, p];
            for i in 0..3 {
                xy[i] += x[i] * ttft;
                for j in 0..3 {
                    xx[i][j] += x[i] * x[j];
                }
            }
        }
        (xx, xy)
    }

    #[test]
    fn a_base_that_fits_below_zero_is_pinned_and_the_prefill_rate_kept() {
        // Prefix-cache hits (150 uncached tokens) and misses (2,300) at 8,000 tokens/s, with
        // a base a little under zero, as noise about a base of a few milliseconds makes it.
        let samples: Vec<(f64, f64, f64)> = (0..40)
            .map(|i| {
                let c = f64::from(i % 6 + 1);
                let p = if i % 3 == 0 { 2300.0 } else { 150.0 };
                (c, p, -0.004 + 0.003 * c + p / 8000.0)
            })
            .collect();
        let (xx, xy) = sums(&samples);
        let (t0, t1, rate) = fit_ttft(&xx, &xy, true);
        assert_eq!(t0, 0.0);
        assert!(t1 > 0.0);
        let rate = rate.unwrap();
        assert!((rate - 8000.0).abs() < 800.0, "rate {rate}");
    }
}
