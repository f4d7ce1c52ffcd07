//! Service-level objectives: what a class promises its requests, how far a prediction is inside
//! or outside that promise (slack), and the largest concurrency a curve predicts keeps it.
//! Pure functions of predictions.

use serde::Serialize;

use crate::curve::Prediction;

/// What a request is promised: a per-user speed and a time to first token, each at a percentile
/// of requests. A target left out is not promised; an SLO with neither is a batch SLO.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Slo {
    /// Smallest acceptable per-user tokens per second.
    pub min_tps: Option<f64>,
    /// 50: the median must reach `min_tps`; 90: nine requests in ten must (the curve's p10).
    pub tps_percentile: u8,
    /// Largest acceptable TTFT, seconds.
    pub max_ttft_s: Option<f64>,
    /// 50 or 90: which TTFT quantile must stay under `max_ttft_s`.
    pub ttft_percentile: u8,
}

impl Slo {
    /// Neither target is set: the request wants throughput, not latency.
    pub(crate) fn is_batch(&self) -> bool {
        self.min_tps.is_none() && self.max_ttft_s.is_none()
    }

    /// The predicted per-user TPS at this SLO's percentile.
    pub(crate) fn tps(&self, p: &Prediction) -> f64 {
        if self.tps_percentile >= 90 {
            p.per_user_tps_p10
        } else {
            p.per_user_tps_p50
        }
    }

    /// The share of requests that must reach `min_tps`: a half, or nine in ten.
    pub(crate) fn tps_share(&self) -> f64 {
        if self.tps_percentile >= 90 { 0.9 } else { 0.5 }
    }

    /// The predicted TTFT at this SLO's percentile, seconds.
    pub(crate) fn ttft(&self, p: &Prediction) -> f64 {
        if self.ttft_percentile >= 90 {
            p.ttft_p90_s
        } else {
            p.ttft_p50_s
        }
    }

    /// How far a prediction is inside the SLO, as the smaller relative margin of its targets:
    /// 0.2 means 20% to spare on the tighter target, negative means a predicted miss by that
    /// share. A batch SLO has infinite slack.
    pub(crate) fn slack(&self, p: &Prediction) -> f64 {
        let tps = self
            .min_tps
            .map_or(f64::INFINITY, |min| (self.tps(p) - min) / min);
        let ttft = self.max_ttft_s.map_or(f64::INFINITY, |max| {
            if max > 0.0 {
                (max - self.ttft(p)) / max
            } else {
                // The budget is spent (a request that waited in line for all of it).
                f64::NEG_INFINITY
            }
        });
        tps.min(ttft)
    }

    /// Whether the speed target holds (TTFT aside): what requests already decoding on a
    /// backend care about when one more joins.
    pub(crate) fn speed_holds(&self, p: &Prediction) -> bool {
        self.min_tps.is_none_or(|min| self.tps(p) >= min)
    }

    /// The largest concurrency in `1..=limit` at which `predict` meets this SLO, scanning up
    /// from 1 and stopping at the first miss (a curve past its knee does not come back) or
    /// where the prediction goes beyond the curve's evidence (admission does not trust it there
    /// either); 0 when even a lone request misses.
    pub(crate) fn derived_cap(&self, limit: u32, predict: impl Fn(f64) -> Prediction) -> u32 {
        let mut cap = 0;
        for n in 1..=limit {
            let p = predict(f64::from(n));
            if p.beyond_evidence || self.slack(&p) < 0.0 {
                break;
            }
            cap = n;
        }
        cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::Spread;

    fn prediction(tps: f64, ttft: f64) -> Prediction {
        Prediction::new(
            Spread::log_normal(tps, 0.1, 0.8),
            Spread::log_normal(ttft, 0.9, 2.0),
            1.0,
            false,
        )
    }

    const INTERACTIVE: Slo = Slo {
        min_tps: Some(25.0),
        tps_percentile: 90,
        max_ttft_s: Some(1.0),
        ttft_percentile: 90,
    };

    #[test]
    fn slack_is_the_tighter_relative_margin_at_the_chosen_percentiles() {
        // p10 TPS 40 (60% over 25), p90 TTFT 0.8 s (20% under 1 s): TTFT is tighter.
        let p = prediction(50.0, 0.4);
        assert!((INTERACTIVE.slack(&p) - 0.2).abs() < 1e-12);
        // At the median both look better: TPS 50 (+100%), TTFT 0.4 (+60%).
        let median = Slo {
            tps_percentile: 50,
            ttft_percentile: 50,
            ..INTERACTIVE
        };
        assert!((median.slack(&p) - 0.6).abs() < 1e-12);
        // A predicted miss is negative slack by the share of the miss.
        assert!((INTERACTIVE.slack(&prediction(25.0, 0.1)) - (-0.2)).abs() < 1e-12);
        assert_eq!(Slo::default().slack(&p), f64::INFINITY);
        assert!(Slo::default().is_batch() && !INTERACTIVE.is_batch());
    }

    #[test]
    fn the_derived_cap_is_the_last_concurrency_before_the_first_miss() {
        // A batching backend: TPOT = 10 ms + 1 ms per request; p10 = 0.8 x median.
        let batching = |c: f64| prediction(1.0 / (0.010 + 0.001 * c), 0.05);
        // 0.8 / (0.010 + 0.001 c) >= 25  <=>  c <= 22.
        assert_eq!(INTERACTIVE.derived_cap(64, batching), 22);
        assert_eq!(INTERACTIVE.derived_cap(8, batching), 8);
        // A serial backend: speed flat, TTFT grows by 2 s per queued request.
        let serial = |c: f64| prediction(40.0, 0.05 + 2.0 * (c - 1.0));
        assert_eq!(INTERACTIVE.derived_cap(64, serial), 1);
        let hopeless = |_| prediction(10.0, 0.05);
        assert_eq!(INTERACTIVE.derived_cap(64, hopeless), 0);
    }
}
