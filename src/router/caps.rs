//! Derived concurrency caps: per backend, model and latency class, the largest concurrency the
//! curve predicts still meets the class's SLO (for `/admin/curves` and the
//! `tpsgate_concurrency_cap` gauge); per model and class what the fleet holds within the SLO
//! and what it could still take, for autoscalers ([`capacity`]); and per class whether any
//! backend meets it at all.

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
    /// Requests in flight on the backend, fleet-wide.
    pub in_flight: u32,
    /// How long a request holds its slot there, on average, seconds.
    pub mean_duration_s: f64,
    /// The backend takes requests now (not ejected or cooling down).
    pub healthy: bool,
}

/// Per backend, model and class with an SLO: the largest concurrency its curve predicts
/// meets the SLO (for `/admin/curves` and the `tpsgate_concurrency_cap` gauge). Admission
/// tests the same predictions at in-flight + 1, which for a curve that only falls with load
/// is the test `in_flight + 1 <= cap`.
/// Health is read as of `now`.
pub(crate) fn caps(
    backends: &[Arc<Backend>],
    classes: &[ClassConfig],
    now: tokio::time::Instant,
) -> Vec<Cap> {
    let mut caps = Vec::new();
    for b in backends {
        let (in_flight, healthy) = (b.in_flight(), b.is_healthy(now));
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
                    in_flight,
                    mean_duration_s: model.mean_duration_s,
                    healthy,
                });
            }
        }
    }
    caps
}

/// What the healthy backends serving one model hold within one latency class's SLO, as their
/// curves say: what an autoscaler scales an engine on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Capacity {
    /// Client model name.
    pub model: Arc<str>,
    /// Class name.
    pub class: Arc<str>,
    /// The requests they hold within the SLO: their caps summed.
    pub within_slo: u32,
    /// The requests in flight on them, fleet-wide (a backend's count counts for every model it
    /// serves).
    pub in_flight: u32,
    /// The requests per second they could take on within the SLO: each backend's free slots
    /// under its cap over the time a request holds one (Little's law), summed.
    pub spare_rps: f64,
}

/// [`Capacity`] per model and latency class, from `caps`.
pub(crate) fn capacity(caps: &[Cap]) -> Vec<Capacity> {
    let mut out: Vec<Capacity> = Vec::new();
    for cap in caps.iter().filter(|c| c.healthy) {
        let i = match out
            .iter()
            .position(|c| c.model == cap.model && c.class == cap.class)
        {
            Some(i) => i,
            None => {
                out.push(Capacity {
                    model: Arc::clone(&cap.model),
                    class: Arc::clone(&cap.class),
                    within_slo: 0,
                    in_flight: 0,
                    spare_rps: 0.0,
                });
                out.len() - 1
            }
        };
        let c = &mut out[i];
        c.within_slo = c.within_slo.saturating_add(cap.cap);
        c.in_flight = c.in_flight.saturating_add(cap.in_flight);
        if cap.mean_duration_s > 0.0 {
            c.spare_rps += f64::from(cap.cap.saturating_sub(cap.in_flight)) / cap.mean_duration_s;
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(backend: &str, class: &str, cap: u32, in_flight: u32, healthy: bool) -> Cap {
        Cap {
            backend: backend.into(),
            model: "m".into(),
            class: class.into(),
            cap,
            in_flight,
            mean_duration_s: 2.0,
            healthy,
        }
    }

    #[test]
    fn the_fleets_capacity_sums_the_healthy_backends_caps_and_their_free_slots_per_second() {
        let caps = [
            cap("a", "chat", 8, 6, true),
            cap("b", "chat", 4, 6, true), // past its cap: no free slot, not a negative one
            cap("c", "chat", 100, 0, false),
            cap("a", "agent", 2, 6, true),
        ];
        let chat = Capacity {
            model: "m".into(),
            class: "chat".into(),
            within_slo: 12,
            in_flight: 12,
            // Two free slots on a, each turning over every 2 s.
            spare_rps: 1.0,
        };
        let agent = Capacity {
            model: "m".into(),
            class: "agent".into(),
            within_slo: 2,
            in_flight: 6,
            spare_rps: 0.0,
        };
        assert_eq!(capacity(&caps), [chat, agent]);
    }
}
