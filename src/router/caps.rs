//! Derived concurrency caps: per backend, model and latency class, the largest concurrency the
//! curve predicts still meets the class's SLO (for `/admin/curves` and the
//! `tpsgate_concurrency_cap` gauge).

use std::sync::Arc;

use super::Router;
use crate::config::Slo;
use crate::curve::Prediction;

/// A derived concurrency cap.
#[derive(Debug, Clone)]
pub struct Cap {
    /// Backend name.
    pub backend: Arc<str>,
    /// Client model name.
    pub model: Arc<str>,
    /// Class name.
    pub class: Arc<str>,
    /// Largest concurrency predicted to meet the class's SLO (0: not even one request).
    pub cap: u32,
}

impl Router {
    /// Per backend, model and class with an SLO: the largest concurrency its curve predicts
    /// meets the SLO (for `/admin/curves` and the `tpsgate_concurrency_cap` gauge). Admission
    /// tests the same predictions at in-flight + 1, which for a curve that only falls with load
    /// is the test `in_flight + 1 <= cap`.
    pub fn caps(&self) -> Vec<Cap> {
        let mut caps = Vec::new();
        for b in &self.backends {
            let limit = b.config.max_concurrency.unwrap_or(4096).min(4096);
            for entry in &b.curves {
                let Some(model) = entry.value().model().cloned() else {
                    continue;
                };
                for class in self.classes.iter().filter(|c| !c.slo.is_batch()) {
                    caps.push(Cap {
                        backend: Arc::clone(&b.config.name),
                        model: Arc::clone(entry.key()),
                        class: Arc::clone(&class.name),
                        cap: derived_cap(&class.slo, limit, |n| model.predict(n, 0)),
                    });
                }
            }
        }
        caps
    }
}

/// The largest concurrency in `1..=limit` at which `predict` meets `slo`, scanning up from 1
/// and stopping at the first miss (a curve past its knee does not come back) or where the
/// prediction goes beyond the curve's evidence (admission does not trust it there either); 0
/// when even a lone request misses.
pub fn derived_cap(slo: &Slo, limit: u32, predict: impl Fn(f64) -> Prediction) -> u32 {
    let mut cap = 0;
    for n in 1..=limit {
        let p = predict(f64::from(n));
        if p.beyond_evidence || slo.slack(&p) < 0.0 {
            break;
        }
        cap = n;
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prediction(tps: f64, ttft: f64) -> Prediction {
        Prediction {
            per_user_tps_p50: tps,
            per_user_tps_p10: 0.8 * tps,
            ttft_p50_s: ttft,
            ttft_p90_s: 2.0 * ttft,
            confidence: 1.0,
            beyond_evidence: false,
        }
    }

    const INTERACTIVE: Slo = Slo {
        min_tps: Some(25.0),
        tps_percentile: 90,
        max_ttft_s: Some(1.0),
        ttft_percentile: 90,
    };

    #[test]
    fn the_derived_cap_is_the_last_concurrency_before_the_first_miss() {
        // A batching backend: TPOT = 10 ms + 1 ms per request; p10 = 0.8 x median.
        let batching = |c: f64| prediction(1.0 / (0.010 + 0.001 * c), 0.05);
        // 0.8 / (0.010 + 0.001 c) >= 25  <=>  c <= 22.
        assert_eq!(derived_cap(&INTERACTIVE, 64, batching), 22);
        assert_eq!(derived_cap(&INTERACTIVE, 8, batching), 8);
        // A serial backend: speed flat, TTFT grows by 2 s per queued request.
        let serial = |c: f64| prediction(40.0, 0.05 + 2.0 * (c - 1.0));
        assert_eq!(derived_cap(&INTERACTIVE, 64, serial), 1);
        let hopeless = |_| prediction(10.0, 0.05);
        assert_eq!(derived_cap(&INTERACTIVE, 64, hopeless), 0);
    }
}
