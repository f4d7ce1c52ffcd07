//! Summaries of a set of samples: quantiles, per-level report rows, SLO attainment.

use serde::Serialize;

use super::client::Measurement;

/// The `q` quantile (0..=1) of `values`, linearly interpolated between order statistics (numpy's
/// default). `None` when there are no values.
pub(crate) fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (values.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(values[lo] + (values[hi] - values[lo]) * (pos - lo as f64))
}

/// An SLO a request must meet to count as good.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BenchSlo {
    /// Largest acceptable TTFT, seconds.
    pub ttft_s: f64,
    /// Smallest acceptable per-user TPS.
    pub tps: f64,
}

impl BenchSlo {
    /// Whether a sample met both targets.
    pub(crate) fn met(&self, s: &Measurement) -> bool {
        s.error.is_none()
            && s.ttft.is_some_and(|t| t <= self.ttft_s)
            && s.per_user_tps().is_some_and(|tps| tps >= self.tps)
    }
}

/// One line of bench output: a concurrency level (closed loop) or an arrival rate (open loop).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LevelReport {
    /// Requests kept in flight (closed loop); absent in open loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// Poisson arrival rate, requests per second (open loop; all classes together).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_rps: Option<f64>,
    /// The class these requests were sent as (open loop with `--mix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Measured requests.
    pub requests: usize,
    /// Of those, how many failed.
    pub errors: usize,
    /// TTFT quantiles, seconds.
    pub ttft_p50_s: Option<f64>,
    /// See `ttft_p50_s`.
    pub ttft_p90_s: Option<f64>,
    /// See `ttft_p50_s`.
    pub ttft_p99_s: Option<f64>,
    /// Per-user TPS quantiles (p10 is the slow tail).
    pub per_user_tps_p10: Option<f64>,
    /// See `per_user_tps_p10`.
    pub per_user_tps_p50: Option<f64>,
    /// See `per_user_tps_p10`.
    pub per_user_tps_p90: Option<f64>,
    /// Output tokens per second across all requests in flight.
    pub system_tps: f64,
    /// 99th percentile of gaps between content events, seconds.
    pub chunk_gap_p99_s: Option<f64>,
    /// Content events received, over all requests.
    pub content_events: u64,
    /// Body frames received, over all requests (more events than frames: something coalesced).
    pub frames: u64,
    /// Whole-request time quantiles, seconds (send to end of body).
    pub latency_p50_s: Option<f64>,
    /// See `latency_p50_s`.
    pub latency_p99_s: Option<f64>,
    /// Closed loop: completed requests per second (`c / mean request time`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// Requests whose token count was estimated (the stream carried no usage).
    pub estimated: usize,
    /// Open loop: the SLO requests were scored against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<BenchSlo>,
    /// Open loop: share of measured requests that met the SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_attainment: Option<f64>,
    /// Open loop: requests per second that met the SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput_rps: Option<f64>,
    /// The first error seen, to say what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Requests per answering backend (`x-tpsgate-backend`), when a tpsgate answered.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub backends: std::collections::BTreeMap<String, usize>,
    /// The request mix the level was measured with (lengths, prompt file, seed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<String>,
    /// Mean prompt size sent, tokens (a text's estimated at 4 bytes a token).
    pub prompt_tokens_mean: Option<f64>,
    /// Mean output asked for (`max_tokens`).
    pub max_tokens_mean: Option<f64>,
    /// Mean output received, tokens, over the requests that completed.
    pub output_tokens_mean: Option<f64>,
    /// Share of prompt tokens the server reported served from its prefix cache, over the
    /// requests whose usage said (absent when none did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_share: Option<f64>,
    /// Trace replay: the window of arrival times, seconds from the replay's start, that these
    /// requests arrived in (absent for the whole replay, and outside a replay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_s: Option<[f64; 2]>,
}

impl LevelReport {
    /// Summarises `samples`; `system_tps` is computed by the caller, who knows the load shape.
    pub(crate) fn from_samples(samples: &[Measurement], system_tps: f64) -> Self {
        let ok = || samples.iter().filter(|s| s.error.is_none());
        let mut ttft: Vec<f64> = ok().filter_map(|s| s.ttft).collect();
        let mut tps: Vec<f64> = ok().filter_map(Measurement::per_user_tps).collect();
        let mut gaps: Vec<f64> = ok().flat_map(|s| s.gaps.iter().copied()).collect();
        let mut latency: Vec<f64> = ok().map(|s| s.total).collect();
        let mean = |values: &mut dyn Iterator<Item = u32>| {
            let (sum, n) = values.fold((0.0, 0_usize), |(sum, n), v| (sum + f64::from(v), n + 1));
            (n > 0).then(|| sum / n as f64)
        };
        let (cached, prompt) = ok()
            .filter_map(|s| Some((s.cached_tokens?, s.reported_prompt_tokens?)))
            .fold((0.0, 0.0), |(c, p), (sc, sp)| {
                (c + f64::from(sc), p + f64::from(sp))
            });
        Self {
            cached_share: (prompt > 0.0).then(|| cached / prompt),
            mix: None,
            prompt_tokens_mean: mean(&mut samples.iter().map(|s| s.prompt_tokens)),
            max_tokens_mean: mean(&mut samples.iter().map(|s| s.max_tokens)),
            output_tokens_mean: mean(&mut ok().map(|s| s.output_tokens)),
            concurrency: None,
            rate_rps: None,
            requests: samples.len(),
            errors: samples.iter().filter(|s| s.error.is_some()).count(),
            ttft_p50_s: quantile(&mut ttft, 0.5),
            ttft_p90_s: quantile(&mut ttft, 0.9),
            ttft_p99_s: quantile(&mut ttft, 0.99),
            per_user_tps_p10: quantile(&mut tps, 0.1),
            per_user_tps_p50: quantile(&mut tps, 0.5),
            per_user_tps_p90: quantile(&mut tps, 0.9),
            system_tps,
            chunk_gap_p99_s: quantile(&mut gaps, 0.99),
            content_events: ok().map(|s| u64::from(s.content_events)).sum(),
            frames: ok().map(|s| u64::from(s.frames)).sum(),
            latency_p50_s: quantile(&mut latency, 0.5),
            latency_p99_s: quantile(&mut latency, 0.99),
            requests_per_s: None,
            estimated: ok().filter(|s| s.estimated).count(),
            slo: None,
            slo_attainment: None,
            goodput_rps: None,
            first_error: samples.iter().find_map(|s| s.error.clone()),
            window_s: None,
            class: None,
            backends: samples.iter().filter_map(|s| s.backend.clone()).fold(
                std::collections::BTreeMap::new(),
                |mut m, b| {
                    *m.entry(b).or_insert(0) += 1;
                    m
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&mut v, 0.5), Some(2.5));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut v, 1.0), Some(4.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    #[test]
    fn slo_needs_both_ttft_and_speed() {
        let slo = BenchSlo {
            ttft_s: 1.0,
            tps: 20.0,
        };
        let fast = Measurement {
            ttft: Some(0.5),
            decode: 0.09,
            visible: 0.09,
            output_tokens: 10,
            content_events: 10,
            ..Measurement::default()
        };
        let slow_start = Measurement {
            ttft: Some(1.5),
            ..fast.clone()
        };
        let slow_decode = Measurement {
            decode: 1.0,
            visible: 1.0,
            ..fast.clone()
        };
        assert!(slo.met(&fast));
        assert!(!slo.met(&slow_start));
        assert!(!slo.met(&slow_decode));
    }
}
