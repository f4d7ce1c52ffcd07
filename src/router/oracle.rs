//! The benchmark-only `oracle` policy's knowledge: each simulated backend's true curve, read from
//! its `GET /sim/truth` once a second (so that a backend changed mid-run is followed). The oracle
//! decides exactly as `headroom` does, only with these curves instead of measured ones: the gap
//! between the two is what measuring costs.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde::Deserialize;

use crate::curve::{Prediction, Spread};
use crate::fleet::Backend;

/// How often the true curves are re-read.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize)]
struct Truth {
    points: Vec<TruthPoint>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct TruthPoint {
    per_user_tps: f64,
    ttft_s: f64,
}

/// The latest true curve of each backend (by index), if it could be read.
#[derive(Debug)]
pub(crate) struct Oracle {
    curves: Vec<ArcSwapOption<Vec<(f64, f64)>>>,
    query: String,
}

impl Oracle {
    /// An oracle for `backends` asking about requests of this shape.
    pub(crate) fn new(backends: usize, prompt_tokens: u32, output_tokens: u32) -> Self {
        Self {
            curves: (0..backends).map(|_| ArcSwapOption::empty()).collect(),
            query: format!("prompt_tokens={prompt_tokens}&output_tokens={output_tokens}"),
        }
    }

    /// The true prediction for backend `i` at `concurrency`: exact, so both quantiles are the
    /// value itself. Beyond the listed points the last one holds.
    pub(crate) fn predict(&self, i: usize, concurrency: f64) -> Option<Prediction> {
        let curve = self.curves.get(i)?.load_full()?;
        let at = (concurrency.round().max(1.0) as usize - 1).min(curve.len().checked_sub(1)?);
        let (tps, ttft) = curve[at];
        Some(Prediction::new(
            Spread::from_fn(|_| tps),
            Spread::from_fn(|_| ttft),
            1.0,
            false,
        ))
    }

    /// Re-reads every backend's truth; a backend that does not answer keeps its last curve.
    pub(crate) async fn refresh(&self, backends: &[Arc<Backend>]) {
        for (slot, b) in self.curves.iter().zip(backends) {
            let base = b.config.url.to_string();
            let url = format!("{}/sim/truth?{}", base.trim_end_matches('/'), self.query);
            let Ok(req) = Request::get(url)
                .header(http::header::HOST, b.config.host.clone())
                .body(Full::new(Bytes::new()))
            else {
                continue;
            };
            let Ok(Ok(resp)) = tokio::time::timeout(REFRESH, Arc::clone(&b.pool).send(req)).await
            else {
                continue;
            };
            let Ok(body) = resp.into_body().collect().await else {
                continue;
            };
            if let Ok(truth) = serde_json::from_slice::<Truth>(&body.to_bytes()) {
                let points = truth
                    .points
                    .iter()
                    .map(|p| (p.per_user_tps, p.ttft_s))
                    .collect();
                slot.store(Some(Arc::new(points)));
            }
        }
    }
}
