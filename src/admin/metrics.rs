//! The Prometheus page: the in-flight, health, curve, attainment and cap gauges refreshed from
//! the live router, then the exposition text of every metric.

use metrics::gauge;

use crate::router::Router;
use crate::telemetry::{
    BACKEND_HEALTHY, CAPACITY_REQUESTS, CAPACITY_SPARE_RPS, CONCURRENCY_CAP, CURVE_TPS, CURVE_TTFT,
    IN_FLIGHT, PREFIX_HIT_RATIO, PREFIX_INDEX_BLOCKS, QUEUE_WAITING, SLO_ATTAINMENT, SLO_FEASIBLE,
    prometheus,
};

/// Renders `/metrics`: refreshes the in-flight, curve, process and standing gauges (with the
/// last reload's time and outcome, if there was one), then the exposition text.
pub(crate) fn render(router: &Router, last_reload: Option<(u64, bool)>) -> String {
    let Some(handle) = prometheus() else {
        return String::new();
    };
    let now = tokio::time::Instant::now();
    for b in router.backends() {
        let backend = b.config.name.to_string();
        gauge!(IN_FLIGHT, "backend" => backend.clone()).set(f64::from(b.local_in_flight()));
        gauge!(BACKEND_HEALTHY, "backend" => backend.clone()).set(if b.is_healthy(now) {
            1.0
        } else {
            0.0
        });
        if let Some(index) = &b.prefix {
            let view = index.view();
            for (kind, n) in [("held", view.blocks), ("capacity", view.capacity_blocks)] {
                gauge!(PREFIX_INDEX_BLOCKS, "backend" => backend.clone(), "kind" => kind)
                    .set(n as f64);
            }
            for (source, rate) in [
                ("estimated", view.estimated_hit_rate),
                ("reported", view.reported_hit_rate),
            ] {
                if let Some(rate) = rate {
                    gauge!(PREFIX_HIT_RATIO, "backend" => backend.clone(), "source" => source)
                        .set(rate);
                }
            }
        }
        for entry in &b.curves {
            let model = entry.key().to_string();
            for class in router.classes().iter().filter(|c| !c.slo.is_batch()) {
                if let Some(share) = entry
                    .value()
                    .attainment(class.slo.min_tps, class.slo.max_ttft_s)
                {
                    gauge!(SLO_ATTAINMENT, "backend" => backend.clone(), "model" => model.clone(), "class" => class.name.to_string()).set(share);
                }
            }
            for p in entry.value().points(now) {
                let c = p.concurrency.to_string();
                let set = |name: &'static str, q: &'static str, v: f64| {
                    gauge!(name, "backend" => backend.clone(), "model" => model.clone(), "concurrency" => c.clone(), "percentile" => q).set(v);
                };
                // `percentile`, not `quantile`: that label is a summary's, and these are gauges.
                for (name, q, value) in [
                    (CURVE_TPS, "50", p.per_user_tps_p50),
                    (CURVE_TPS, "10", p.per_user_tps_p10),
                    (CURVE_TTFT, "50", p.ttft_p50_s),
                    (CURVE_TTFT, "90", p.ttft_p90_s),
                ] {
                    if let Some(v) = value {
                        set(name, q, v);
                    }
                }
            }
        }
    }
    for standing in router.standings() {
        if let Some(feasible) = standing.feasible {
            gauge!(SLO_FEASIBLE, "class" => standing.class.to_string())
                .set(f64::from(u8::from(feasible)));
        }
    }
    let caps = router.caps(now);
    for cap in &caps {
        gauge!(CONCURRENCY_CAP, "backend" => cap.backend.to_string(), "model" => cap.model.to_string(), "class" => cap.class.to_string()).set(f64::from(cap.cap));
    }
    for c in crate::router::capacity(&caps) {
        let (model, class) = (c.model.to_string(), c.class.to_string());
        for (kind, n) in [("within_slo", c.within_slo), ("in_flight", c.in_flight)] {
            gauge!(CAPACITY_REQUESTS, "model" => model.clone(), "class" => class.clone(), "kind" => kind)
                .set(f64::from(n));
        }
        gauge!(CAPACITY_SPARE_RPS, "model" => model, "class" => class).set(c.spare_rps);
    }
    gauge!(QUEUE_WAITING).set(router.waiting() as f64);
    crate::telemetry::collect_process();
    crate::telemetry::refresh_standing(last_reload);
    handle.run_upkeep();
    handle.render()
}
