//! Time-decayed statistics of one concurrency bucket.
//!
//! Why a decayed sample window rather than a decayed histogram or sketch: a bucket sees at most a
//! few samples per second, and routing needs p10/p50/p90 within a few percent. Keeping the last
//! [`WINDOW`] samples with their times and weighting each by `2^(-age / half_life)` at read time
//! gives exact weighted quantiles, costs O(1) per sample and a few KiB per bucket, and needs no
//! bin layout tuned to tokens per second or seconds. At high rates the oldest samples leave the
//! window before their weight would matter; at low rates old samples stay but weigh little, and
//! the decayed count says how much evidence is left.

use std::collections::VecDeque;

use tokio::time::Instant;

/// Samples kept per bucket.
pub const WINDOW: usize = 256;

/// One completed request's speed and latency: what speed buckets hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
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
    /// Prompt tokens (the stream's count when it came before the first token, else the
    /// estimate routing used).
    pub prompt_tokens: Option<u64>,
    /// In flight when it was admitted, itself included: what its TTFT depends on (the queue
    /// it found).
    pub admitted_with: f64,
}

/// What a window holds: anything with a time, so that it can be decayed.
pub trait Dated {
    /// When it was observed.
    fn at(&self) -> Instant;
}

impl Dated for Sample {
    fn at(&self) -> Instant {
        self.at
    }
}

impl Dated for FirstToken {
    fn at(&self) -> Instant {
        self.at
    }
}

/// Decayed summary of a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Decayed sample count (sum of weights).
    pub weight: f64,
    /// Samples in the window.
    pub samples: usize,
    /// Weighted mean TPOT (seconds per token), the fit's input.
    pub mean_tpot: f64,
    /// Weighted mean experienced concurrency.
    pub mean_concurrency: f64,
    /// Per-user TPS quantiles.
    pub tps_p10: f64,
    /// See `tps_p10`.
    pub tps_p50: f64,
}

/// The last [`WINDOW`] samples of a bucket.
#[derive(Debug, Clone)]
pub struct Window<S = Sample> {
    samples: VecDeque<S>,
}

impl<S> Default for Window<S> {
    fn default() -> Self {
        Self {
            samples: VecDeque::new(),
        }
    }
}

/// Weight of a sample `age_s` old.
pub fn weight(age_s: f64, half_life_s: f64) -> f64 {
    (-age_s.max(0.0) / half_life_s * std::f64::consts::LN_2).exp()
}

/// The weighted `q` quantile of (value, weight) pairs: the smallest value whose cumulative weight
/// reaches `q` of the total.
pub fn weighted_quantile(pairs: &mut [(f64, f64)], q: f64) -> f64 {
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    let target = q * total;
    let mut acc = 0.0;
    for &(value, w) in pairs.iter() {
        acc += w;
        if acc >= target {
            return value;
        }
    }
    pairs.last().map_or(f64::NAN, |p| p.0)
}

impl<S: Dated> Window<S> {
    /// Adds a sample, dropping the oldest beyond [`WINDOW`].
    pub fn push(&mut self, sample: S) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> impl Iterator<Item = &S> {
        self.samples.iter()
    }

    /// The samples with their decayed weights as of `now`.
    pub fn weighted(&self, now: Instant, half_life_s: f64) -> impl Iterator<Item = (f64, &S)> {
        self.samples.iter().map(move |s| {
            let age = now.saturating_duration_since(s.at()).as_secs_f64();
            (weight(age, half_life_s), s)
        })
    }
}

impl Window {
    /// The decayed summary as of `now`, or `None` when empty.
    pub fn summary(&self, now: Instant, half_life_s: f64) -> Option<Summary> {
        if self.samples.is_empty() {
            return None;
        }
        let weighted: Vec<(f64, &Sample)> = self.weighted(now, half_life_s).collect();
        let total: f64 = weighted.iter().map(|(w, _)| w).sum();
        let mean =
            |f: fn(&Sample) -> f64| weighted.iter().map(|(w, s)| w * f(s)).sum::<f64>() / total;
        let mut tps: Vec<(f64, f64)> = weighted.iter().map(|(w, s)| (s.tps, *w)).collect();
        Some(Summary {
            weight: total,
            samples: self.samples.len(),
            mean_tpot: mean(|s| 1.0 / s.tps),
            mean_concurrency: mean(|s| s.concurrency),
            tps_p10: weighted_quantile(&mut tps, 0.1),
            tps_p50: weighted_quantile(&mut tps, 0.5),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn weight_halves_every_half_life_and_is_monotone() {
        assert!((weight(10.0, 10.0) - 0.5).abs() < 1e-12);
        assert!((weight(20.0, 10.0) - 0.25).abs() < 1e-12);
        let mut last = 1.0;
        for age in 1..100 {
            let w = weight(f64::from(age), 7.0);
            assert!(w < last);
            last = w;
        }
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
        let mut w = Window::default();
        let sample = |at, tps| Sample {
            at,
            tps,
            ttft: 0.1,
            output_tokens: 10,
            concurrency: 1.0,
        };
        w.push(sample(t0, 10.0));
        w.push(sample(t0 + Duration::from_secs(100), 20.0));
        let s = w.summary(t0 + Duration::from_secs(100), 10.0).unwrap();
        // The old sample weighs 2^-10: the median is the new one.
        assert_eq!(s.tps_p50, 20.0);
        assert!((s.weight - (1.0 + 2f64.powi(-10))).abs() < 1e-9);
        for i in 0..2 * WINDOW {
            w.push(sample(t0, i as f64));
        }
        assert_eq!(w.summary(t0, 10.0).unwrap().samples, WINDOW);
    }
}
