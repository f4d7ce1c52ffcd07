//! Derived concurrency caps: per backend, model and latency class, the largest concurrency the
//! curve predicts still meets the class's SLO (for `/admin/curves` and the
//! `tpsgate_concurrency_cap` gauge); and per class whether any backend meets it at all.

use std::sync::Arc;

use crate::config::ClassConfig;
use crate::fleet::Backend;

/// A derived concurrency cap.
#[derive(Debug, Clone)]
pub(crate) struct Cap {
    /// Backend name.
    pub backend: Arc<str>,
    /// Client model name.
    pub model: Arc<str>,
    /// Class name.
    pub class: Arc<str>,
    /// Largest concurrency predicted to meet the class's SLO (0: not even one request).
    pub cap: u32,
}

/// Per backend, model and class with an SLO: the largest concurrency its curve predicts
/// meets the SLO (for `/admin/curves` and the `tpsgate_concurrency_cap` gauge). Admission
/// tests the same predictions at in-flight + 1, which for a curve that only falls with load
/// is the test `in_flight + 1 <= cap`.
pub(crate) fn caps(backends: &[Arc<Backend>], classes: &[ClassConfig]) -> Vec<Cap> {
    let mut caps = Vec::new();
    for b in backends {
        let limit = b.config.max_concurrency.unwrap_or(4096).min(4096);
        for entry in &b.curves {
            let Some(model) = entry.value().model().cloned() else {
                continue;
            };
            for class in classes.iter().filter(|c| !c.slo.is_batch()) {
                caps.push(Cap {
                    backend: Arc::clone(&b.config.name),
                    model: Arc::clone(entry.key()),
                    class: Arc::clone(&class.name),
                    cap: class.slo.derived_cap(limit, |n| model.predict(n, 0.0, 0)),
                });
            }
        }
    }
    caps
}

/// Whether a latency class's SLO is met anywhere, as far as the curves know: its standing on
/// `/admin/curves`, the `tpsgate_slo_feasible` gauge and the warning the gateway logs once.
#[derive(Debug, Clone)]
pub(crate) struct SloStanding {
    /// Class name.
    pub class: Arc<str>,
    /// Some backend is predicted to meet the SLO at its percentiles with one request alone;
    /// `None` before any curve has evidence.
    pub feasible: Option<bool>,
    /// The backend likeliest to meet the SLO alone, with what its curve says there.
    pub best: Option<Best>,
}

/// The backend and model likeliest to meet a class's SLO with one request alone.
#[derive(Debug, Clone)]
pub(crate) struct Best {
    /// Backend name.
    pub backend: Arc<str>,
    /// Client model name.
    pub model: Arc<str>,
    /// Its curve alone: per-user TPS median and 10th percentile, TTFT median and 90th.
    pub per_user_tps_p50: f64,
    /// See `per_user_tps_p50`.
    pub per_user_tps_p10: f64,
    /// See `per_user_tps_p50`.
    pub ttft_p50_s: f64,
    /// See `per_user_tps_p50`.
    pub ttft_p90_s: f64,
    /// How likely a lone request is to meet both targets there.
    pub chance: f64,
}

/// Per latency class: whether any backend's curve predicts it meets the SLO with one request
/// alone, and which comes closest. A class no backend meets even idle is served where its
/// requests are likeliest to meet it (see [`MIN_CHANCE`](super::rungs::best_chance::MIN_CHANCE));
/// the operator should know.
pub(crate) fn standings(backends: &[Arc<Backend>], classes: &[ClassConfig]) -> Vec<SloStanding> {
    let alone: Vec<_> = backends
        .iter()
        .flat_map(|b| {
            b.curves.iter().filter_map(|entry| {
                let model = entry.value().model()?;
                Some((
                    Arc::clone(&b.config.name),
                    Arc::clone(entry.key()),
                    model.predict(1.0, 0.0, 0),
                ))
            })
        })
        .collect();
    classes
        .iter()
        .filter(|c| !c.slo.is_batch())
        .map(|class| {
            let slo = class.slo;
            let chance = |p: &crate::curve::Prediction| p.chance(slo.min_tps, slo.max_ttft_s);
            let best = alone
                .iter()
                .max_by(|a, b| {
                    chance(&a.2)
                        .total_cmp(&chance(&b.2))
                        .then(slo.slack(&a.2).total_cmp(&slo.slack(&b.2)))
                })
                .map(|(backend, model, p)| Best {
                    backend: Arc::clone(backend),
                    model: Arc::clone(model),
                    per_user_tps_p50: p.per_user_tps_p50,
                    per_user_tps_p10: p.per_user_tps_p10,
                    ttft_p50_s: p.ttft_p50_s,
                    ttft_p90_s: p.ttft_p90_s,
                    chance: chance(p),
                });
            SloStanding {
                class: Arc::clone(&class.name),
                feasible: (!alone.is_empty())
                    .then(|| alone.iter().any(|(_, _, p)| slo.slack(p) >= 0.0)),
                best,
            }
        })
        .collect()
}
