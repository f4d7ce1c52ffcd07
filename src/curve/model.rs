//! A curve's fitted snapshot: what routing reads on every request.
//!
//! Building one walks every sample of every bucket (a few thousand at most), so a [`Model`] is
//! rebuilt at most every [`super::REFRESH`] while observations arrive and shared behind an
//! `Arc`; asking it for a [`Prediction`] is O(1).

use serde::Serialize;
use tokio::time::Instant;

use super::window::{FirstToken, Summary, Window, weighted_quantile};
use super::{BUCKETS, Fit, MIN_BUCKET_WEIGHT, Point, bucket_of, fit};

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
    /// The concurrency asked about is more than twice the highest one observed: the fit is
    /// extrapolating beyond what it has seen, and routing treats that as exploration.
    pub beyond_evidence: bool,
}

/// TTFT of the requests that found a given occupancy at admission.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TtftSummary {
    weight: f64,
    mean_admitted: f64,
    p50: f64,
    p90: f64,
}

/// A fitted snapshot of one curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The fitted lines.
    pub fit: Fit,
    /// Speed by experienced concurrency.
    buckets: [Option<Summary>; BUCKETS.len()],
    /// TTFT by occupancy at admission.
    starts: [Option<TtftSummary>; BUCKETS.len()],
    /// Highest experienced concurrency among buckets holding at least one sample's weight.
    pub evidence_up_to: f64,
    /// Weighted mean of TTFT + decode time, seconds: how long a request holds its slot.
    pub mean_duration_s: f64,
}

impl Model {
    /// Fits speed from `buckets` and TTFT from `starts` as of `now`; `None` before the first
    /// completed request.
    pub fn build(
        buckets: &[Window],
        starts: &[Window<FirstToken>],
        now: Instant,
        half_life_s: f64,
    ) -> Option<Self> {
        let mut summaries = [None; BUCKETS.len()];
        for (slot, w) in summaries.iter_mut().zip(buckets) {
            *slot = w.summary(now, half_life_s);
        }
        let present: Vec<Summary> = summaries.iter().flatten().copied().collect();
        let total: f64 = present.iter().map(|s| s.weight).sum();
        if present.is_empty() || total <= 0.0 {
            return None;
        }
        let mean_tpot = present.iter().map(|s| s.weight * s.mean_tpot).sum::<f64>() / total;
        let (tpot_base_s, tpot_per_seq_s) = match fit::wls(
            present
                .iter()
                .map(|s| ([1.0, s.mean_concurrency], s.mean_tpot, s.weight)),
        ) {
            // Speed cannot rise with load; a negative slope is noise.
            Some([a, b]) if b >= 0.0 && a > 0.0 => (a, b),
            _ => (mean_tpot, 0.0),
        };

        let completed: Vec<_> = buckets
            .iter()
            .flat_map(|w| w.weighted(now, half_life_s))
            .collect();
        let cw: f64 = completed
            .iter()
            .map(|(w, _)| w)
            .sum::<f64>()
            .max(f64::MIN_POSITIVE);
        let mean_duration_s = completed
            .iter()
            .map(|(w, s)| w * (s.ttft + s.output_tokens as f64 / s.tps))
            .sum::<f64>()
            / cw;

        let samples: Vec<(f64, &FirstToken)> = starts
            .iter()
            .flat_map(|w| w.weighted(now, half_life_s))
            .collect();
        let sw: f64 = samples
            .iter()
            .map(|(w, _)| w)
            .sum::<f64>()
            .max(f64::MIN_POSITIVE);
        let mean_ttft = samples.iter().map(|(w, s)| w * s.ttft).sum::<f64>() / sw;
        let with_prompt = samples.iter().all(|(_, s)| s.prompt_tokens.is_some());
        let three = with_prompt
            .then(|| {
                fit::wls(samples.iter().map(|(w, s)| {
                    let p = s.prompt_tokens.unwrap_or(0) as f64;
                    ([1.0, s.admitted_with, p], s.ttft, *w)
                }))
            })
            .flatten()
            .filter(|[_, t1, k]| *t1 >= 0.0 && *k > 0.0);
        let (ttft_base_s, ttft_per_seq_s, prefill_tokens_per_s) = match three {
            Some([t0, t1, k]) => (t0, t1, Some(1.0 / k)),
            None => match fit::wls(
                samples
                    .iter()
                    .map(|(w, s)| ([1.0, s.admitted_with], s.ttft, *w)),
            ) {
                Some([t0, t1]) if t1 >= 0.0 => (t0, t1, None),
                _ => (mean_ttft, 0.0, None),
            },
        };
        let mut by_start: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); BUCKETS.len()];
        for (w, s) in &samples {
            by_start[bucket_of(s.admitted_with)].push((s.ttft, *w, s.admitted_with));
        }
        let mut starts = [None; BUCKETS.len()];
        for (slot, group) in starts.iter_mut().zip(&by_start) {
            let weight: f64 = group.iter().map(|g| g.1).sum();
            if group.is_empty() || weight <= 0.0 {
                continue;
            }
            let mean_admitted = group.iter().map(|g| g.1 * g.2).sum::<f64>() / weight;
            let mut pairs: Vec<(f64, f64)> = group.iter().map(|g| (g.0, g.1)).collect();
            *slot = Some(TtftSummary {
                weight,
                mean_admitted,
                p50: weighted_quantile(&mut pairs, 0.5),
                p90: weighted_quantile(&mut pairs, 0.9),
            });
        }
        let evidence_up_to = present
            .iter()
            .filter(|s| s.weight >= 1.0)
            .map(|s| s.mean_concurrency)
            .chain(
                starts
                    .iter()
                    .flatten()
                    .filter(|s| s.weight >= 1.0)
                    .map(|s| s.mean_admitted),
            )
            .fold(0.0, f64::max);
        Some(Self {
            fit: Fit {
                tpot_base_s,
                tpot_per_seq_s,
                ttft_base_s,
                ttft_per_seq_s,
                prefill_tokens_per_s,
            },
            buckets: summaries,
            starts,
            evidence_up_to,
            mean_duration_s,
        })
    }

    /// What a request joining at `concurrency` (itself included) with `prompt_tokens` should
    /// expect. Speed: the bucket of that experienced concurrency, TTFT: the bucket of that
    /// occupancy at admission, each where it has enough evidence (its quantiles moved along the
    /// fit from where its samples were to this exact concurrency), else the fit.
    pub fn predict(&self, concurrency: f64, prompt_tokens: u64) -> Prediction {
        let i = bucket_of(concurrency);
        let fit = &self.fit;
        let tpot_at = |c: f64| fit.tpot_base_s + fit.tpot_per_seq_s * c;
        let queue_at = |c: f64| fit.ttft_base_s + fit.ttft_per_seq_s * c;
        let speed_weight = self.buckets[i].map_or(0.0, |s| s.weight);
        let start_weight = self.starts[i].map_or(0.0, |s| s.weight);
        let weight = speed_weight.min(start_weight);
        let confidence = weight / (weight + MIN_BUCKET_WEIGHT);
        let beyond_evidence = concurrency > 2.0 * self.evidence_up_to.max(1.0);

        // Without a bucket of its own, the spread is a guess: a slow tail 10% below the median
        // and a TTFT tail 25% above it.
        let (tps_p50, tps_p10) = match self.buckets[i].filter(|s| s.weight >= MIN_BUCKET_WEIGHT) {
            Some(s) => {
                // A bucket spans a range (16 holds 14 to 19): move it along the fit.
                let speed = tpot_at(s.mean_concurrency) / tpot_at(concurrency);
                (s.tps_p50 * speed, s.tps_p10 * speed)
            }
            None => {
                let tps = 1.0 / tpot_at(concurrency);
                (tps, 0.9 * tps)
            }
        };
        let (ttft_p50, ttft_p90) = match self.starts[i].filter(|s| s.weight >= MIN_BUCKET_WEIGHT) {
            Some(s) => {
                let later = queue_at(concurrency) - queue_at(s.mean_admitted);
                ((s.p50 + later).max(0.0), (s.p90 + later).max(0.0))
            }
            None => {
                let prefill = fit
                    .prefill_tokens_per_s
                    .map_or(0.0, |r| prompt_tokens as f64 / r);
                let ttft = queue_at(concurrency) + prefill;
                (ttft, 1.25 * ttft)
            }
        };
        Prediction {
            per_user_tps_p50: tps_p50,
            per_user_tps_p10: tps_p10,
            ttft_p50_s: ttft_p50,
            ttft_p90_s: ttft_p90,
            confidence,
            beyond_evidence,
        }
    }

    /// The levels that hold samples, for `/admin/curves`, the dashboard and the gauges.
    pub fn points(&self) -> Vec<Point> {
        BUCKETS
            .iter()
            .zip(self.buckets.iter().zip(&self.starts))
            .filter(|(_, (speed, start))| speed.is_some() || start.is_some())
            .map(|(level, (speed, start))| Point {
                concurrency: *level,
                samples: speed.map_or(0, |s| s.samples),
                weight: speed.map_or(0.0, |s| s.weight),
                per_user_tps_p50: speed.map(|s| s.tps_p50),
                per_user_tps_p10: speed.map(|s| s.tps_p10),
                ttft_p50_s: start.map(|s| s.p50),
                ttft_p90_s: start.map(|s| s.p90),
                ttft_weight: start.map_or(0.0, |s| s.weight),
            })
            .collect()
    }
}
