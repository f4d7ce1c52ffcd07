//! Time-decayed statistics of one concurrency bucket.
//!
//! Why a decayed sample window rather than a decayed histogram or sketch: a bucket sees at most a
//! few samples per second, and routing needs p10/p50/p90 within a few percent. Keeping the last
//! [`WINDOW`] samples, each weighing `2^(-age / half_life)`, gives exact weighted quantiles,
//! costs a few KiB per bucket, and needs no bin layout tuned to tokens per second or seconds. At
//! high rates the oldest samples leave the window before their weight would matter; at low rates
//! old samples stay but weigh little, and the decayed count says how much evidence is left.
//!
//! Why weights are kept relative to an anchor ([`Decay`]): a sample's weight at `now` is its
//! weight at the anchor times a factor every sample shares. Quantiles, means and least-squares
//! fits do not change when all weights are scaled alike, so a window's [`Summary`] depends only
//! on its samples, not on the clock: a model rebuild re-summarises only the windows that changed
//! since the last one, and no sample is decayed (an `exp`) or sorted again.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::spread::Spread;

/// Samples kept per bucket.
pub(crate) const WINDOW: usize = 256;

/// How far past the anchor samples may be taken, in half-lives, before weights are rebased onto
/// a later anchor: `2^64` keeps every weight and weighted sum far inside `f64`.
const REBASE_AFTER_HALF_LIVES: f64 = 64.0;

/// One completed request's speed and latency: what speed buckets hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// When it completed.
    pub at: Instant,
    /// Per-user tokens per second.
    pub tps: f64,
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Experienced concurrency (mean in flight while it decoded): what its speed depends on.
    pub concurrency: f64,
    /// The same of the backends sharing its device: their load slows it too.
    pub neighbours: f64,
}

/// One request's first token: what TTFT buckets hold. Recorded when the token arrives, not when
/// the request ends, so that a queue forming on a backend shows within one TTFT rather than one
/// whole request later.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstToken {
    /// When the first token arrived.
    pub at: Instant,
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Tokens prefilled before it: its prompt's uncached tokens (the stream's count when it
    /// came before the first token, else the estimate routing used) and, where the prefix index
    /// tracks them, those of the requests sent before it and not yet at their first token
    /// (prefills run one after another).
    pub prompt_tokens: Option<u64>,
    /// In flight when it was admitted, itself included: what its TTFT depends on (the queue
    /// it found).
    pub admitted_with: f64,
    /// Other requests waiting for their first token when it was admitted or when its own came:
    /// it shared a queue of prefills, which a burst makes and a steady load seldom does. Such a
    /// first token is evidence only for a while ([`FirstToken::evidence_until`]).
    pub queued_with: u32,
}

/// How many of its own TTFTs a first token that came behind a queue stays evidence for.
pub(crate) const QUEUE_MEMORY_TTFTS: f64 = 3.0;

/// What a first token that shared a queue weighs in the TTFT fit, against one that shared none:
/// the fit describes joining a backend with no queue ahead (a queue now is seen live, and in
/// the recent quantiles of its level), yet where every first token shared one they still shape
/// it.
pub(crate) const QUEUE_FIT_WEIGHT: f64 = 0.1;

/// The least time a first token that came behind a queue stays evidence for.
pub(crate) const QUEUE_MEMORY_MIN: std::time::Duration = std::time::Duration::from_secs(1);

impl FirstToken {
    /// Until when this first token is surely evidence of what joining its backend costs:
    /// always, if it shared no queue; else for [`QUEUE_MEMORY_TTFTS`] of its own TTFT (at least
    /// [`QUEUE_MEMORY_MIN`]), within which the queue it saw drained unless it persists. A slow
    /// first token from a burst is believed at once; past this time, a newer first token that
    /// shows its queue gone has it forgotten (see `Curve::forget_drained_queues`), rather than
    /// it weighing on predictions for a whole half-life (routing keeps traffic away from a level
    /// it believes slow, so that level may see no newer sample of its own). The queue waiting
    /// now is seen live: routing floors a prediction at how long the requests still waiting
    /// have waited.
    pub(crate) fn evidence_until(&self) -> Option<Instant> {
        (self.queued_with > 0).then(|| {
            let memory = std::time::Duration::from_secs_f64(
                (QUEUE_MEMORY_TTFTS * self.ttft).clamp(0.0, 3600.0),
            );
            self.at + memory.max(QUEUE_MEMORY_MIN)
        })
    }
}

/// A prefill rate (uncached prompt tokens per second) rounded to a step of a sixteenth of an
/// octave (about 4%), or none: what a TTFT window's queue quantiles are taken at. Rounded so
/// that a fitted rate wandering in its noise between rebuilds leaves the windows' summaries
/// kept; rounding moves a 2,000-token prefill at 8,000 tokens/s by 6 ms at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PrefillRate(Option<i32>);

/// Steps per octave of the rounded fitted values that windows are summarised at.
const STEPS_PER_OCTAVE: f64 = 16.0;

/// The step nearest `x` (none for none, or a value that is not positive and finite).
fn octave_step(x: Option<f64>) -> Option<i32> {
    x.filter(|v| v.is_finite() && *v > 0.0)
        .map(|v| (v.log2() * STEPS_PER_OCTAVE).round().clamp(-1e6, 1e6) as i32)
}

/// The value of a step.
fn step_value(step: i32) -> f64 {
    (f64::from(step) / STEPS_PER_OCTAVE).exp2()
}

impl PrefillRate {
    /// The step nearest `tokens_per_s` (none for none, or a rate that is not positive and
    /// finite).
    pub(crate) fn near(tokens_per_s: Option<f64>) -> Self {
        Self(octave_step(tokens_per_s))
    }

    /// Seconds to prefill `tokens` at this rate; 0 without one.
    pub(crate) fn prefill_s(self, tokens: f64) -> f64 {
        self.0.map_or(0.0, |step| tokens / step_value(step))
    }
}

/// What each request decoding on the backends sharing a device adds to a token's time
/// (the fit's `d`, seconds), rounded to a sixteenth of an octave, or none: what a speed
/// window's spread is taken at, each sample's speed put back to an idle device beside it, so
/// that a level's spread says how requests spread at a load, not how busy the neighbours were.
/// Rounded, as [`PrefillRate`], so that a term wandering in its noise keeps the summaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NeighbourTerm(Option<i32>);

impl NeighbourTerm {
    /// The step nearest `s_per_request` (none for 0).
    pub(crate) fn near(s_per_request: f64) -> Self {
        Self(octave_step(Some(s_per_request)))
    }

    /// Seconds per token that `neighbours` requests beside it add; 0 without a term.
    pub(crate) fn tpot_s(self, neighbours: f64) -> f64 {
        self.0.map_or(0.0, |step| neighbours * step_value(step))
    }
}

/// What a window holds: anything with a value whose quantiles it keeps. (Its age is in the
/// weight it is pushed with.)
pub(crate) trait Ranked {
    /// The value ranked for quantiles.
    fn value(&self) -> f64;
}

impl Ranked for Sample {
    fn value(&self) -> f64 {
        self.tps
    }
}

impl Ranked for FirstToken {
    fn value(&self) -> f64 {
        self.ttft
    }
}

/// Exponential decay with a half-life, measured from an anchor: the time of the first sample
/// weighed, until weights are rebased onto a later one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decay {
    anchor: Option<Instant>,
    half_life_s: f64,
}

impl Decay {
    /// Decay halving every `half_life_s`.
    pub(crate) const fn new(half_life_s: f64) -> Self {
        Self {
            anchor: None,
            half_life_s,
        }
    }

    /// Half-lives from the anchor to `at` (negative before it).
    fn half_lives(anchor: Instant, at: Instant, half_life_s: f64) -> f64 {
        let secs = if at >= anchor {
            (at - anchor).as_secs_f64()
        } else {
            -(anchor - at).as_secs_f64()
        };
        secs / half_life_s
    }

    /// The weight, relative to the anchor, of a sample taken at `at`: `2^((at - anchor) / h)`.
    pub(crate) fn weigh(&mut self, at: Instant) -> f64 {
        let anchor = *self.anchor.get_or_insert(at);
        Self::half_lives(anchor, at, self.half_life_s).exp2()
    }

    /// What one unit of anchor-relative weight weighs at `now`: `2^(-(now - anchor) / h)`.
    pub(crate) fn factor(&self, now: Instant) -> f64 {
        self.anchor.map_or(1.0, |anchor| {
            (-Self::half_lives(anchor, now, self.half_life_s)).exp2()
        })
    }

    /// Whether a sample at `at` is far enough past the anchor that weights should be rebased.
    pub(crate) fn due_for_rebase(&self, at: Instant) -> bool {
        self.anchor.is_some_and(|anchor| {
            Self::half_lives(anchor, at, self.half_life_s) > REBASE_AFTER_HALF_LIVES
        })
    }

    /// Moves the anchor to `to`; returns what existing anchor-relative weights must be
    /// multiplied by.
    pub(crate) fn rebase(&mut self, to: Instant) -> f64 {
        let scale = self.factor(to);
        self.anchor = Some(to);
        scale
    }
}

/// Decayed summary of a speed window, in anchor-relative weights (see [`Decay`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    /// Decayed sample count (sum of weights).
    pub weight: f64,
    /// Samples in the window.
    pub samples: usize,
    /// Weighted mean TPOT (seconds per token), the fit's input.
    pub mean_tpot: f64,
    /// Weighted mean experienced concurrency.
    pub mean_concurrency: f64,
    /// Weighted mean load of the backends sharing its device.
    pub mean_neighbours: f64,
    /// The load beside it that `tps` stands at: 0 where each sample was put back to an idle
    /// device ([`NeighbourTerm`]), else `mean_neighbours`.
    pub spread_neighbours: f64,
    /// Its share of the least-squares sums of TPOT = a + b·c + d·n (c: experienced
    /// concurrency, n: the device neighbours'), sample by sample: `Σ w·x·xᵀ` and `Σ w·x·y`
    /// with x = (1, c, n). Used where neighbours have been seen busy; their load varies within
    /// a level, and bucket means would hide it.
    pub xx: [[f64; 3]; 3],
    /// See `xx`.
    pub xy: [f64; 3],
    /// Weighted mean time a request held its slot (TTFT + decode), seconds.
    pub mean_duration_s: f64,
    /// How per-user TPS spread.
    pub tps: Spread,
}

/// Decayed summary of a TTFT window, in anchor-relative weights: its quantiles, and its share
/// of the least-squares sums of TTFT = t0 + t1·ahead + P/r (ahead: the requests in flight
/// before it, one less than its occupancy at admission), so that the fit over all windows
/// adds up per-window sums instead of walking every sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StartSummary {
    /// Decayed sample count.
    pub weight: f64,
    /// Weighted mean occupancy at admission.
    pub mean_admitted: f64,
    /// TTFT median, seconds.
    pub p50: f64,
    /// TTFT 90th percentile, seconds.
    pub p90: f64,
    /// How TTFT less each sample's own prefill at [`Self::rate`] spreads: the wait for the
    /// requests ahead, apart from how long this prompt took. Where prefix-cache hits and
    /// misses share a level the TTFT quantiles are the misses' tail; a request whose prompt is
    /// mostly cached waits as long as the others and prefills far less.
    pub queue: Spread,
    /// The prefill rate the queue quantiles were taken at (without one, they are TTFT's).
    pub rate: PrefillRate,
    /// Σ w·x·xᵀ with x = (1, ahead, prompt tokens), a first token that shared a queue
    /// weighing [`QUEUE_FIT_WEIGHT`] of its weight.
    pub xx: [[f64; 3]; 3],
    /// Σ w·x·ttft.
    pub xy: [f64; 3],
    /// Every sample knew its prompt size.
    pub with_prompt: bool,
}

/// The last [`WINDOW`] samples of a bucket.
#[derive(Debug, Clone)]
pub(crate) struct Window<S = Sample> {
    /// Oldest first, each with its anchor-relative weight.
    samples: VecDeque<(S, f64)>,
    /// The same samples' (value, weight), ascending by value: quantiles without a sort.
    ranked: Vec<(f64, f64)>,
}

impl<S> Default for Window<S> {
    fn default() -> Self {
        Self {
            samples: VecDeque::new(),
            ranked: Vec::new(),
        }
    }
}

/// The weighted `q` quantile of (value, weight) pairs sorted by value: the smallest value whose
/// cumulative weight reaches `q` of `total`.
fn ranked_quantile(ranked: &[(f64, f64)], total: f64, q: f64) -> f64 {
    let target = q * total;
    let mut acc = 0.0;
    for &(value, w) in ranked {
        acc += w;
        if acc >= target {
            return value;
        }
    }
    ranked.last().map_or(f64::NAN, |p| p.0)
}

impl<S: Ranked> Window<S> {
    /// Adds a sample with its anchor-relative `weight`, dropping the oldest beyond [`WINDOW`].
    /// Values are finite (the curve admits no others), so plain comparisons rank them.
    pub(crate) fn push(&mut self, sample: S, weight: f64) {
        let value = sample.value();
        let at = self.ranked.partition_point(|p| p.0 <= value);
        let oldest = (self.samples.len() == WINDOW)
            .then(|| self.samples.pop_front())
            .flatten()
            .and_then(|(old, old_weight)| {
                let old_value = old.value();
                let from = self.ranked.partition_point(|p| p.0 < old_value);
                self.ranked[from..]
                    .iter()
                    .position(|p| p.0 == old_value && p.1 == old_weight)
                    .map(|i| from + i)
            });
        match oldest {
            // One shift of the samples between the one leaving and the new one's place.
            Some(gone) if gone < at => {
                self.ranked.copy_within(gone + 1..at, gone);
                self.ranked[at - 1] = (value, weight);
            }
            Some(gone) => {
                self.ranked.copy_within(at..gone, at + 1);
                self.ranked[at] = (value, weight);
            }
            None => self.ranked.insert(at, (value, weight)),
        }
        self.samples.push_back((sample, weight));
    }

    /// The samples, oldest first.
    pub(crate) fn samples(&self) -> impl Iterator<Item = &S> {
        self.samples.iter().map(|(s, _)| s)
    }

    /// The sample pushed last.
    pub(crate) fn newest(&self) -> Option<&S> {
        self.samples.back().map(|(s, _)| s)
    }

    /// The samples with their anchor-relative weights.
    pub(crate) fn weighted(&self) -> impl Iterator<Item = (f64, &S)> {
        self.samples.iter().map(|(s, w)| (*w, s))
    }

    /// Drops the samples `stale` says so of; returns whether any went.
    pub(crate) fn forget(&mut self, stale: impl Fn(&S) -> bool) -> bool {
        let before = self.samples.len();
        self.samples.retain(|(s, _)| !stale(s));
        if self.samples.len() == before {
            return false;
        }
        self.ranked = self.samples.iter().map(|(s, w)| (s.value(), *w)).collect();
        self.ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        true
    }

    /// Multiplies every weight by `scale` (the anchor moved).
    pub(crate) fn rescale(&mut self, scale: f64) {
        for (_, w) in &mut self.samples {
            *w *= scale;
        }
        for (_, w) in &mut self.ranked {
            *w *= scale;
        }
    }

    /// Sum of weights, and the weighted `qs` quantiles of the samples' values; `None` when the
    /// window is empty or weighs nothing.
    fn quantiles<const N: usize>(&self, qs: [f64; N]) -> Option<(f64, [f64; N])> {
        let total = self.total();
        (total > 0.0).then(|| (total, qs.map(|q| ranked_quantile(&self.ranked, total, q))))
    }

    /// Sum of weights.
    fn total(&self) -> f64 {
        self.ranked.iter().map(|p| p.1).sum()
    }
}

/// What a window of these samples sums up to: the input of a model rebuild.
pub(crate) trait Summarize: Ranked + Sized {
    /// The summary.
    type Summary: Copy;
    /// What a summary depends on besides the samples (a kept summary serves only the same).
    type Context: Copy + PartialEq;
    /// The window's summary, or `None` when it is empty or weighs nothing.
    fn summarize(window: &Window<Self>, context: Self::Context) -> Option<Self::Summary>;
}

impl<S: Summarize> Window<S> {
    /// The decayed summary, or `None` when empty.
    pub(crate) fn summary(&self, context: S::Context) -> Option<S::Summary> {
        S::summarize(self, context)
    }
}

/// A curve's windows by level, each with its summary kept from the last rebuild until a sample
/// changes it: a rebuild re-summarises only the windows that changed (or all of them, when
/// asked in another context).
#[derive(Debug, Clone)]
pub(crate) struct Levels<S: Summarize, const N: usize> {
    windows: Vec<Window<S>>,
    /// `None` where the window changed since its summary was kept.
    kept: [Option<Option<S::Summary>>; N],
    /// The context the kept summaries were made in.
    context: Option<S::Context>,
}

impl<S: Summarize, const N: usize> Default for Levels<S, N> {
    fn default() -> Self {
        Self {
            windows: (0..N).map(|_| Window::default()).collect(),
            kept: [None; N],
            context: None,
        }
    }
}

impl<S: Summarize, const N: usize> Levels<S, N> {
    /// Adds a sample with its anchor-relative `weight` to level `i`.
    pub(crate) fn push(&mut self, i: usize, sample: S, weight: f64) {
        self.windows[i].push(sample, weight);
        self.kept[i] = None;
    }

    /// In every window, drops the samples `stale` says so of (given the window's level).
    pub(crate) fn forget(&mut self, stale: impl Fn(usize, &S) -> bool) {
        for (level, (window, kept)) in self.windows.iter_mut().zip(&mut self.kept).enumerate() {
            if window.forget(|s| stale(level, s)) {
                *kept = None;
            }
        }
    }

    /// Multiplies every weight by `scale` (the anchor moved).
    pub(crate) fn rescale(&mut self, scale: f64) {
        for w in &mut self.windows {
            w.rescale(scale);
        }
        self.kept = [None; N];
    }

    /// The windows, by level.
    pub(crate) fn windows(&self) -> &[Window<S>] {
        &self.windows
    }

    /// Every window's summary in `context`: the kept one, or a new one where the window
    /// changed since (or the context did).
    pub(crate) fn summaries(&self, context: S::Context) -> [Option<S::Summary>; N] {
        let same = self.context == Some(context);
        std::array::from_fn(|i| {
            self.kept[i]
                .filter(|_| same)
                .unwrap_or_else(|| self.windows[i].summary(context))
        })
    }

    /// The context the kept summaries were made in, if any were.
    pub(crate) fn context(&self) -> Option<S::Context> {
        self.context
    }

    /// Keeps `summaries` (this levels' own, as [`Levels::summaries`] gave them in `context`)
    /// for the next rebuild.
    pub(crate) fn keep(&mut self, context: S::Context, summaries: &[Option<S::Summary>; N]) {
        self.kept = summaries.map(Some);
        self.context = Some(context);
    }
}

impl Summarize for Sample {
    type Summary = Summary;
    type Context = NeighbourTerm;

    fn summarize(window: &Window<Self>, term: NeighbourTerm) -> Option<Summary> {
        let total = window.total();
        if total <= 0.0 {
            return None;
        }
        let mean =
            |f: fn(&Sample) -> f64| window.weighted().map(|(w, s)| w * f(s)).sum::<f64>() / total;
        let mut xx = [[0.0; 3]; 3];
        let mut xy = [0.0; 3];
        for (w, s) in window.weighted() {
            let x = [1.0, s.concurrency, s.neighbours];
            for (row, xi) in xx.iter_mut().zip(x) {
                for (cell, xj) in row.iter_mut().zip(x) {
                    *cell += w * xi * xj;
                }
            }
            for (cell, xi) in xy.iter_mut().zip(x) {
                *cell += w * xi / s.tps;
            }
        }
        let mean_neighbours = mean(|s| s.neighbours);
        let (tps, spread_neighbours) = if term == NeighbourTerm::default() {
            let tps = Spread::from_fn(|q| ranked_quantile(&window.ranked, total, q));
            (tps, mean_neighbours)
        } else {
            let mut alone = put_back(window.weighted(), term);
            alone.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            (Spread::from_fn(|q| ranked_quantile(&alone, total, q)), 0.0)
        };
        Some(Summary {
            weight: total,
            samples: window.samples.len(),
            mean_tpot: mean(|s| 1.0 / s.tps),
            mean_concurrency: mean(|s| s.concurrency),
            mean_neighbours,
            spread_neighbours,
            xx,
            xy,
            mean_duration_s: mean(|s| s.ttft + s.output_tokens as f64 / s.tps),
            tps,
        })
    }
}

/// Each sample's speed as it would have been beside an idle device, `(tps, weight)`: its time
/// per token less what `term` says its neighbours' mean load cost it, never faster than any
/// sample from a lighter load put back. A linear term overshoots a sample that its neighbours
/// slowed less than their mean load says (two engines on two CPU cores: 33 ms a token per
/// neighbour, fitted where one took the cores from the other, put samples that a neighbour
/// barely touched back at 1,000-4,000 tok/s, and a request placed beside them was charged
/// nothing for slowing them); one it overshoots with no lighter sample to bound it keeps its
/// speed as seen. Bounded by the lighter loads' samples, not by the fastest seen: a level whose
/// every request ran beside a neighbour's pass (a bend engine's seven in flight, all beside the
/// serial engine, read 27-30 tok/s where alone they stream 36) would otherwise be put back no
/// faster than it was slowed, and stay shut.
fn put_back<'s>(
    samples: impl Iterator<Item = (f64, &'s Sample)>,
    term: NeighbourTerm,
) -> Vec<(f64, f64)> {
    let mut samples: Vec<(f64, &Sample)> = samples.collect();
    samples.sort_unstable_by(|a, b| a.1.neighbours.total_cmp(&b.1.neighbours));
    let mut alone = Vec::with_capacity(samples.len());
    // The fastest put back from a load lighter than the sample's, and from the sample's own
    // (0: none yet).
    let (mut lighter, mut this_load, mut load) = (0.0_f64, 0.0_f64, f64::NAN);
    for (w, s) in samples {
        if s.neighbours != load {
            lighter = lighter.max(this_load);
            (this_load, load) = (0.0, s.neighbours);
        }
        let idle = 1.0 / s.tps - term.tpot_s(s.neighbours);
        let tps = match (idle > 0.0, lighter > 0.0) {
            (true, true) => (1.0 / idle).min(lighter),
            (true, false) => 1.0 / idle,
            (false, true) => lighter,
            (false, false) => s.tps,
        };
        this_load = this_load.max(tps);
        alone.push((tps, w));
    }
    alone
}

impl Summarize for FirstToken {
    type Summary = StartSummary;
    type Context = PrefillRate;

    fn summarize(window: &Window<Self>, rate: PrefillRate) -> Option<StartSummary> {
        let (total, [p50, p90]) = window.quantiles([0.5, 0.9])?;
        let queue = if rate == PrefillRate::default() {
            Spread::from_fn(|q| ranked_quantile(&window.ranked, total, q))
        } else {
            let mut queued: Vec<(f64, f64)> = window
                .weighted()
                .map(|(w, s)| {
                    (
                        s.ttft - rate.prefill_s(s.prompt_tokens.unwrap_or(0) as f64),
                        w,
                    )
                })
                .collect();
            queued.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            Spread::from_fn(|q| ranked_quantile(&queued, total, q))
        };
        let mut xx = [[0.0; 3]; 3];
        let mut xy = [0.0; 3];
        let mut with_prompt = true;
        let mut admitted = 0.0;
        for (w, s) in window.weighted() {
            with_prompt &= s.prompt_tokens.is_some();
            admitted += w * s.admitted_with;
            // The fit describes joining with no queue ahead; a queue now is seen live.
            let w = if s.queued_with > 0 {
                w * QUEUE_FIT_WEIGHT
            } else {
                w
            };
            // The queue term counts the requests ahead: a lone request waits for none.
            let ahead = (s.admitted_with - 1.0).max(0.0);
            let x = [1.0, ahead, s.prompt_tokens.unwrap_or(0) as f64];
            for i in 0..3 {
                xy[i] += w * x[i] * s.ttft;
                for j in 0..3 {
                    xx[i][j] += w * x[i] * x[j];
                }
            }
        }
        Some(StartSummary {
            weight: total,
            mean_admitted: admitted / total,
            p50,
            p90,
            queue,
            rate,
            xx,
            xy,
            with_prompt,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The weighted `q` quantile by sorting: the reference the ranked windows are checked
    /// against.
    fn weighted_quantile(pairs: &mut [(f64, f64)], q: f64) -> f64 {
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = pairs.iter().map(|p| p.1).sum();
        ranked_quantile(pairs, total, q)
    }

    fn sample(at: Instant, tps: f64) -> Sample {
        Sample {
            at,
            tps,
            ttft: 0.1,
            output_tokens: 10,
            concurrency: 1.0,
            neighbours: 0.0,
        }
    }

    #[test]
    fn weight_halves_every_half_life_and_is_monotone() {
        let t0 = Instant::now();
        let mut decay = Decay::new(10.0);
        decay.weigh(t0);
        let mut weight = |age_s: f64| {
            let now = t0 + Duration::from_secs(1000);
            decay.weigh(now - Duration::from_secs_f64(age_s)) * decay.factor(now)
        };
        assert!((weight(10.0) - 0.5).abs() < 1e-12);
        assert!((weight(20.0) - 0.25).abs() < 1e-12);
        let mut last = weight(0.0);
        assert!((last - 1.0).abs() < 1e-12);
        for age in 1..100 {
            let w = weight(f64::from(age));
            assert!(w < last);
            last = w;
        }
    }

    #[test]
    fn rebasing_keeps_every_weight() {
        let t0 = Instant::now();
        let mut decay = Decay::new(10.0);
        assert_eq!(decay.weigh(t0), 1.0, "the first sample anchors");
        let at = t0 + Duration::from_secs(650);
        assert!(decay.due_for_rebase(at) && !decay.due_for_rebase(t0));
        let now = at + Duration::from_secs(5);
        let before = decay.weigh(at) * decay.factor(now);
        let scale = decay.rebase(at);
        let after = decay.weigh(at) * decay.factor(now);
        assert!((before - after).abs() < 1e-12 * after);
        assert_eq!(decay.weigh(t0), scale);
    }

    #[test]
    fn quantiles_of_equal_weights_are_order_statistics() {
        let mut pairs: Vec<(f64, f64)> = (1..=10).map(|v| (f64::from(v), 1.0)).collect();
        assert_eq!(weighted_quantile(&mut pairs, 0.5), 5.0);
        assert_eq!(weighted_quantile(&mut pairs, 0.1), 1.0);
        assert_eq!(weighted_quantile(&mut pairs, 0.9), 9.0);
    }

    #[test]
    fn old_samples_weigh_less_and_the_window_is_bounded() {
        let t0 = Instant::now();
        let mut decay = Decay::new(10.0);
        let mut w = Window::default();
        let later = t0 + Duration::from_secs(100);
        w.push(sample(t0, 10.0), decay.weigh(t0));
        w.push(sample(later, 20.0), decay.weigh(later));
        let s = w.summary(NeighbourTerm::default()).unwrap();
        // The old sample weighs 2^-10: the median is the new one.
        assert_eq!(s.tps.median(), 20.0);
        assert!((s.weight * decay.factor(later) - (1.0 + 2f64.powi(-10))).abs() < 1e-9);
        for i in 0..2 * WINDOW {
            w.push(sample(t0, i as f64), 1.0);
        }
        assert_eq!(w.summary(NeighbourTerm::default()).unwrap().samples, WINDOW);
    }

    #[test]
    fn quantiles_kept_in_rank_match_a_sort_of_the_window() {
        // Values repeat and arrive out of order, and the window overflows twice.
        let t0 = Instant::now();
        let mut w = Window::default();
        for i in 0..3 * WINDOW as u64 {
            let value = ((i * 7919) % 97) as f64;
            w.push(sample(t0, value), 1.0 + (i % 5) as f64);
            let mut pairs: Vec<(f64, f64)> = w.weighted().map(|(w, s)| (s.tps, w)).collect();
            let s = w.summary(NeighbourTerm::default()).unwrap();
            assert_eq!(
                s.tps.quantile(0.1),
                weighted_quantile(&mut pairs, 0.1),
                "after {i}"
            );
            assert_eq!(
                s.tps.median(),
                weighted_quantile(&mut pairs, 0.5),
                "after {i}"
            );
        }
        assert_eq!(w.ranked.len(), WINDOW);
    }
}
