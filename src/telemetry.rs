//! Metrics: names, buckets, and the handles each backend × model keeps.
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where one exists (time to first
//! token, time per output token, token usage; Prometheus spelling, with the unit as suffix) and
//! are `tpsgate_*` otherwise. Histogram handles are built once per backend × model × class and kept
//! by the backend, so a request records into them without a registry lookup. The curve itself is
//! published as gauges, refreshed when `/metrics` is scraped.

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram, counter, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::Policy;
use crate::curve::{Observation, Outcome};

/// `gen_ai.server.time_to_first_token`, seconds.
pub const TTFT: &str = "gen_ai_server_time_to_first_token_seconds";
/// `gen_ai.server.time_per_output_token`, seconds.
pub const TPOT: &str = "gen_ai_server_time_per_output_token_seconds";
/// `gen_ai.client.token.usage`, tokens, labelled `token_type` = `input` | `output`.
pub(crate) const TOKEN_USAGE: &str = "gen_ai_client_token_usage";
/// Per-user tokens per second of each completed stream.
pub const PER_USER_TPS: &str = "tpsgate_per_user_tps";
/// The longest silence between two content chunks of each stream, seconds.
pub(crate) const MAX_CHUNK_GAP: &str = "tpsgate_max_chunk_gap_seconds";
/// Requests answered by a backend, by backend, model, class, status and outcome.
pub const REQUESTS: &str = "tpsgate_requests_total";
/// Requests the gateway answered itself with an error, by code (`model_not_found`,
/// `upstream_unreachable`, …); the upstream failures among them are the `upstream_*` codes.
pub const GATEWAY_ERRORS: &str = "tpsgate_gateway_errors_total";
/// Requests in flight per backend through this replica (summed over replicas, the fleet's).
pub const IN_FLIGHT: &str = "tpsgate_in_flight";
/// The curve's per-user TPS by concurrency bucket and quantile.
pub const CURVE_TPS: &str = "tpsgate_curve_per_user_tps";
/// The curve's TTFT by concurrency bucket and quantile, seconds.
pub const CURVE_TTFT: &str = "tpsgate_curve_ttft_seconds";
/// Routing decisions by class, policy and reason (`feasible`, `cold_start`, `explore`,
/// `best_chance`, `best_effort`, `queued`, `shed`, `baseline`).
pub const ROUTE_DECISIONS: &str = "tpsgate_route_decisions_total";
/// Requests refused with 429 `slo_unmet`, by class and cause (`ttft`, `speed`,
/// `ttft_and_speed`, `others`, `unproven`, `no_room`, `no_prediction`, `room_taken`).
pub const REFUSALS: &str = "tpsgate_refusals_total";
/// The derived concurrency cap per backend, model and class.
pub const CONCURRENCY_CAP: &str = "tpsgate_concurrency_cap";
/// Per model and latency class, over the healthy backends serving the model, by `kind`:
/// `within_slo` (their caps summed: the requests they hold within the SLO) and `in_flight`
/// (their requests in flight, fleet-wide). Their ratio is what an autoscaler scales an engine
/// on (deploy/k8s/autoscale).
pub const CAPACITY_REQUESTS: &str = "tpsgate_capacity_requests";
/// Per model and latency class: the requests per second the healthy backends serving the model
/// could take on within the SLO (each one's free slots under its cap over the time a request
/// holds one).
pub const CAPACITY_SPARE_RPS: &str = "tpsgate_capacity_spare_requests_per_second";
/// Per latency class: 1 while some backend's curve meets its SLO with one request alone, 0
/// while none does (unset before any curve has evidence).
pub(crate) const SLO_FEASIBLE: &str = "tpsgate_slo_feasible";
/// Recent share of a backend's completed requests that met their class's SLO, per class.
pub const SLO_ATTAINMENT: &str = "tpsgate_slo_attainment";
/// Blocks a backend's prefix index holds, and the most it may hold (calibrated), by `kind`
/// (`held`, `capacity`).
pub(crate) const PREFIX_INDEX_BLOCKS: &str = "tpsgate_prefix_index_blocks";
/// Recent share of prompt tokens found in a backend's prefix cache, by `source`: `estimated`
/// (the index, at routing) or `reported` (the backend's usage).
pub(crate) const PREFIX_HIT_RATIO: &str = "tpsgate_prefix_cache_hit_ratio";
/// 1 while a backend is healthy, 0 while it is failing.
pub const BACKEND_HEALTHY: &str = "tpsgate_backend_healthy";
/// Streams (or responses) cut by a timeout, by backend and kind (`first_token`, `stall`,
/// `total`).
pub const TIMEOUTS: &str = "tpsgate_upstream_timeouts_total";
/// Client connections failed because the client took no bytes for the write timeout (it stopped
/// reading); what they held upstream is released.
pub(crate) const CLIENT_WRITE_TIMEOUTS: &str = "tpsgate_client_write_timeouts_total";
/// Retries on another backend (before any content reached the client).
pub const RETRIES: &str = "tpsgate_retries_total";
/// Ejections of backends after upstream failures.
pub const EJECTIONS: &str = "tpsgate_ejections_total";
/// Requests waiting in the `queue` line.
pub const QUEUE_WAITING: &str = "tpsgate_queue_waiting";
/// 1 while this replica's last round trip to the cluster's Redis got through, else 0 (absent
/// without `cluster:`).
pub(crate) const CLUSTER_CONNECTED: &str = "tpsgate_cluster_connected";
/// Other replicas this one sees publishing.
pub(crate) const CLUSTER_PEERS: &str = "tpsgate_cluster_peers";
/// Curve samples shared with the other replicas, by direction (`sent`, `received`, `dropped`:
/// queued while Redis was away for longer than the queue holds).
pub(crate) const CLUSTER_SAMPLES: &str = "tpsgate_cluster_samples_total";
/// Slots claimed fleet-wide at a backend's edge, by outcome (`granted`, `refused`,
/// `unanswered`; [`crate::fleet::claim`]).
pub(crate) const CLUSTER_CLAIMS: &str = "tpsgate_cluster_claims_total";
/// 1, labelled with the version: joins any series to the build that made it.
pub const BUILD_INFO: &str = "tpsgate_build_info";
/// Config reloads by result (`applied`, `refused`).
pub const CONFIG_RELOADS: &str = "tpsgate_config_reload_total";
/// When the last reload was tried, Unix seconds.
pub(crate) const CONFIG_LAST_RELOAD: &str = "tpsgate_config_last_reload_timestamp_seconds";
/// 1 when the last reload was applied, 0 when it was refused.
pub(crate) const CONFIG_LAST_RELOAD_OK: &str = "tpsgate_config_last_reload_successful";

/// Requests admitted per API key, by `key` (the key's configured name, never the key).
pub(crate) const KEY_REQUESTS: &str = "tpsgate_key_requests_total";
/// Tokens used per API key, by `key` and `token_type` (`input`, `output`).
pub(crate) const KEY_TOKENS: &str = "tpsgate_key_tokens_total";
/// Dollars an API key spent in its current budget period (priced by `backends[].cost`).
pub(crate) const KEY_SPEND: &str = "tpsgate_key_spend_usd";
/// Requests an API key's limits refused, by `key` and `limit` (`requests`, `tokens`,
/// `concurrency`, `budget`).
pub(crate) const KEY_LIMITED: &str = "tpsgate_key_limited_total";
/// Requests in flight per API key.
pub(crate) const KEY_IN_FLIGHT: &str = "tpsgate_key_in_flight";
/// The `key` label of the keys past `admin.max_key_series`: their series are shared.
pub(crate) const OTHER_KEYS: &str = "other";
/// Requests per API key and class by what became of them against the class's SLO: `verdict`
/// `met`, `late_first_token`, `too_slow`, `shed`, `queued_too_long`, `upstream_error`,
/// `cancelled` (`crate::tenant::attainment`).
pub(crate) const KEY_SLO_REQUESTS: &str = "tpsgate_key_slo_requests_total";

/// What a metric is, for its `# TYPE`.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric with its `# HELP` text and unit: what a dashboard builder reads first.
const HELP: &[(&str, Kind, metrics::Unit, &str)] = {
    use Kind::{Counter as C, Gauge as G, Histogram as H};
    use metrics::Unit::{Count as N, Seconds as S};
    &[
        (
            TTFT,
            H,
            S,
            "Time to first token of each stream: from sending it to a backend to its first content event",
        ),
        (
            TPOT,
            H,
            S,
            "Time per output token of each stream, after the first",
        ),
        (
            TOKEN_USAGE,
            H,
            N,
            "Tokens per request, by token_type (input, output)",
        ),
        (
            PER_USER_TPS,
            H,
            N,
            "Per-user tokens per second of each completed stream",
        ),
        (
            MAX_CHUNK_GAP,
            H,
            S,
            "The longest silence between two content chunks of each stream",
        ),
        (
            REQUESTS,
            C,
            N,
            "Requests answered by a backend, by backend, model, class, status and outcome",
        ),
        (
            KEY_REQUESTS,
            C,
            N,
            "Requests admitted per API key (by its configured name)",
        ),
        (
            KEY_TOKENS,
            C,
            N,
            "Tokens used per API key, by token_type (input, output)",
        ),
        (
            KEY_SPEND,
            G,
            N,
            "Dollars an API key spent in its current budget period",
        ),
        (
            KEY_LIMITED,
            C,
            N,
            "Requests an API key's limits refused, by limit (requests, tokens, concurrency, budget)",
        ),
        (KEY_IN_FLIGHT, G, N, "Requests in flight per API key"),
        (
            KEY_SLO_REQUESTS,
            C,
            N,
            "Requests per API key and class by verdict against the class's SLO (met, late_first_token, too_slow, shed, queued_too_long, upstream_error, cancelled)",
        ),
        (
            GATEWAY_ERRORS,
            C,
            N,
            "Requests the gateway answered itself with an error, by code",
        ),
        (
            IN_FLIGHT,
            G,
            N,
            "Requests in flight per backend through this replica",
        ),
        (
            CURVE_TPS,
            G,
            N,
            "The curve's per-user tokens per second by concurrency and quantile",
        ),
        (
            CURVE_TTFT,
            G,
            S,
            "The curve's time to first token by concurrency and quantile",
        ),
        (
            ROUTE_DECISIONS,
            C,
            N,
            "Routing decisions by class, policy and reason",
        ),
        (
            REFUSALS,
            C,
            N,
            "Requests refused with 429 slo_unmet, by class and the cause the best candidate gave",
        ),
        (
            CONCURRENCY_CAP,
            G,
            N,
            "The derived concurrency cap per backend, model and class",
        ),
        (
            CAPACITY_REQUESTS,
            G,
            N,
            "Per model and class, over the healthy backends serving it: the requests they hold within the SLO (kind within_slo) and those in flight (kind in_flight)",
        ),
        (
            CAPACITY_SPARE_RPS,
            G,
            N,
            "Per model and class: the requests per second the healthy backends serving it could take on within the SLO",
        ),
        (
            SLO_FEASIBLE,
            G,
            N,
            "1 while some backend meets the class's SLO with one request alone, 0 while none does",
        ),
        (
            PREFIX_INDEX_BLOCKS,
            G,
            N,
            "Blocks a backend's prefix index holds (held) and may hold (capacity)",
        ),
        (
            PREFIX_HIT_RATIO,
            G,
            N,
            "Recent share of prompt tokens in a backend's prefix cache, estimated or reported",
        ),
        (
            SLO_ATTAINMENT,
            G,
            N,
            "Recent share of a backend's completed requests that met their class's SLO",
        ),
        (
            BACKEND_HEALTHY,
            G,
            N,
            "1 while a backend is healthy, 0 while it is ejected or cooling down",
        ),
        (
            TIMEOUTS,
            C,
            N,
            "Streams or responses cut by a timeout, by backend and kind",
        ),
        (
            CLIENT_WRITE_TIMEOUTS,
            C,
            N,
            "Client connections failed for taking no bytes within the write timeout",
        ),
        (
            RETRIES,
            C,
            N,
            "Retries on another backend, before any content reached the client",
        ),
        (
            EJECTIONS,
            C,
            N,
            "Ejections of backends after upstream failures",
        ),
        (
            QUEUE_WAITING,
            G,
            N,
            "Requests waiting in a class's queue for a backend",
        ),
        (
            CLUSTER_CONNECTED,
            G,
            N,
            "1 while this replica's last round trip to the cluster's Redis got through",
        ),
        (
            CLUSTER_PEERS,
            G,
            N,
            "Other replicas this one sees publishing",
        ),
        (
            CLUSTER_SAMPLES,
            C,
            N,
            "Curve samples shared with the other replicas, by direction",
        ),
        (
            CLUSTER_CLAIMS,
            C,
            N,
            "Slots claimed fleet-wide at a backend's edge, by outcome",
        ),
        (
            BUILD_INFO,
            G,
            N,
            "1, labelled with the tpsgate version that serves",
        ),
        (
            CONFIG_RELOADS,
            C,
            N,
            "Config reloads by result (applied, refused)",
        ),
        (
            CONFIG_LAST_RELOAD,
            G,
            S,
            "When the last config reload was tried, Unix time",
        ),
        (
            CONFIG_LAST_RELOAD_OK,
            G,
            N,
            "1 when the last config reload was applied, 0 when it was refused",
        ),
    ]
};

/// A gauge not set for this long leaves the page (see [`prometheus`]).
pub const GAUGE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Sets the gauges that stand between events (the build; the last reload, when there was one:
/// Unix seconds and whether it was applied), so that the idle timeout keeps them: call before
/// rendering the page.
pub(crate) fn refresh_standing(last_reload: Option<(u64, bool)>) {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    if let Some((at, applied)) = last_reload {
        metrics::gauge!(CONFIG_LAST_RELOAD).set(at as f64);
        metrics::gauge!(CONFIG_LAST_RELOAD_OK).set(if applied { 1.0 } else { 0.0 });
    }
}

/// Process metrics (CPU, memory, open files, threads), collected when `/metrics` is read.
fn process() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Describes every metric, sets the build info, and makes the counters an alert reads exist at
/// zero before their first event (a `rate()` over a series that appears only with its first
/// error misses that error).
fn describe() {
    for &(name, kind, unit, help) in HELP {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, unit, help),
            Kind::Gauge => metrics::describe_gauge!(name, unit, help),
            Kind::Histogram => metrics::describe_histogram!(name, unit, help),
        }
    }
    process().describe();
    for result in ["applied", "refused"] {
        counter!(CONFIG_RELOADS, "result" => result).absolute(0);
    }
    for kind in crate::error::ErrorKind::ALL {
        counter!(GATEWAY_ERRORS, "code" => kind.code()).absolute(0);
    }
    counter!(RETRIES).absolute(0);
    counter!(CLIENT_WRITE_TIMEOUTS).absolute(0);
}

/// Collects the process metrics: call before rendering the page.
pub(crate) fn collect_process() {
    process().collect();
}

/// Counts one config reload (its time and outcome are the reload status's, read at the next
/// scrape).
pub(crate) fn count_reload(applied: bool) {
    let _ = prometheus();
    let result = if applied { "applied" } else { "refused" };
    counter!(CONFIG_RELOADS, "result" => result).increment(1);
}

/// Buckets for LLM latencies. TTFT: from a cached prompt on a fast GPU (25 ms) to a long queue
/// (60 s). TPOT: from 200 tok/s (5 ms) down to 1 tok/s. Per-user TPS: the same range, upside
/// down. Tokens: powers of two up to long generations. Gaps: a normal step (10 ms) to a stall.
const TTFT_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];
const TPS_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 150.0, 200.0, 300.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];
const GAP_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// The process's Prometheus recorder, installed on first use (one per process: gateways started
/// in the same process, as in tests, share it).
pub(crate) fn prometheus() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = [
                (TTFT, TTFT_BUCKETS),
                (TPOT, TPOT_BUCKETS),
                (PER_USER_TPS, TPS_BUCKETS),
                (TOKEN_USAGE, TOKEN_BUCKETS),
                (MAX_CHUNK_GAP, GAP_BUCKETS),
            ]
            .into_iter()
            .try_fold(
                // Gauges not set for a while go: those of a backend discovery let go (or of a
                // curve bucket that decayed away) would otherwise show their last value for
                // ever. Every gauge that stands is set again before each page is rendered.
                PrometheusBuilder::new()
                    .idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(GAUGE_IDLE)),
                |b, (name, buckets)| {
                    b.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
                },
            );
            match builder.and_then(PrometheusBuilder::install_recorder) {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(err) => {
                    tracing::warn!(%err, "metrics recorder not installed; /metrics will be empty");
                    None
                }
            }
        })
        .as_ref()
}

/// Metric handles of one backend × model × class: the histograms, built with it, and the
/// response counter of each status × outcome, built the first time that one is seen (a registry
/// lookup hashes and copies every label: docs/benchmarks/overhead.md, "Instructions per request").
#[derive(Debug)]
pub(crate) struct ModelMetrics {
    labels: [(&'static str, String); 3],
    responses: Vec<(u16, Outcome, Counter)>,
    ttft: Histogram,
    tpot: Histogram,
    tps: Histogram,
    input_tokens: Histogram,
    output_tokens: Histogram,
    max_gap: Histogram,
}

impl ModelMetrics {
    /// Builds the handles (once per backend × model × class).
    pub(crate) fn new(backend: &str, model: &str, class: &str) -> Self {
        let _ = prometheus();
        let labels = [
            ("backend", backend.to_owned()),
            ("model", model.to_owned()),
            ("class", class.to_owned()),
        ];
        let with = |token_type: &'static str| histogram!(TOKEN_USAGE, "backend" => backend.to_owned(), "model" => model.to_owned(), "class" => class.to_owned(), "token_type" => token_type);
        Self {
            ttft: histogram!(TTFT, &labels),
            tpot: histogram!(TPOT, &labels),
            tps: histogram!(PER_USER_TPS, &labels),
            input_tokens: with("input"),
            output_tokens: with("output"),
            max_gap: histogram!(MAX_CHUNK_GAP, &labels),
            labels,
            responses: Vec::new(),
        }
    }

    /// The `tpsgate_requests_total` counter for `status` × `outcome`, if it was built already.
    pub(crate) fn responses(&self, status: u16, outcome: Outcome) -> Option<&Counter> {
        self.responses
            .iter()
            .find(|(s, o, _)| *s == status && *o == outcome)
            .map(|(_, _, c)| c)
    }

    /// The class these handles count.
    pub(crate) fn class(&self) -> &str {
        &self.labels[2].1
    }

    /// Builds (once) and returns the counter for `status` × `outcome`.
    pub(crate) fn add_responses(&mut self, status: u16, outcome: Outcome) -> &Counter {
        let at = match self
            .responses
            .iter()
            .position(|(s, o, _)| *s == status && *o == outcome)
        {
            Some(at) => at,
            None => {
                let [(_, backend), (_, model), (_, class)] = &self.labels;
                let counter = responses_counter(backend, model, class, status, outcome);
                self.responses.push((status, outcome, counter));
                self.responses.len() - 1
            }
        };
        &self.responses[at].2
    }

    /// Records one request.
    pub(crate) fn record(&self, obs: &Observation, max_gap_s: f64) {
        if obs.outcome != Outcome::Completed {
            return;
        }
        if let Some(ttft) = obs.ttft {
            self.ttft.record(ttft);
        }
        if let Some(tpot) = obs.tpot {
            self.tpot.record(tpot);
            self.tps.record(1.0 / tpot);
        }
        if let Some(p) = obs.prompt_tokens {
            self.input_tokens.record(p as f64);
        }
        self.output_tokens.record(obs.output_tokens as f64);
        if max_gap_s > 0.0 {
            self.max_gap.record(max_gap_s);
        }
    }
}

fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Completed => "completed",
        Outcome::Cancelled => "cancelled",
        Outcome::Failed => "failed",
    }
}

/// Counts one response from a backend through the registry (for responses without a model;
/// the others count through their [`ModelMetrics`]).
pub(crate) fn count_response(
    backend: &str,
    model: Option<&str>,
    class: &str,
    status: u16,
    outcome: Outcome,
) {
    responses_counter(backend, model.unwrap_or("-"), class, status, outcome).increment(1);
}

/// The `tpsgate_requests_total` series of one backend, model, class, status and outcome (a
/// registry lookup: hashes and copies every label).
fn responses_counter(
    backend: &str,
    model: &str,
    class: &str,
    status: u16,
    outcome: Outcome,
) -> Counter {
    let _ = prometheus();
    counter!(
        REQUESTS,
        "backend" => backend.to_owned(),
        "model" => model.to_owned(),
        "class" => class.to_owned(),
        "status" => status.to_string(),
        "outcome" => outcome_label(outcome)
    )
}

/// Counts one timeout (rare: the labels are built here).
pub(crate) fn count_timeout(backend: &str, kind: &'static str) {
    let _ = prometheus();
    counter!(TIMEOUTS, "backend" => backend.to_owned(), "kind" => kind).increment(1);
}

/// Counts one retry.
pub(crate) fn count_retry() {
    let _ = prometheus();
    counter!(RETRIES).increment(1);
}

/// Counts one ejection (rare: the label is built here).
pub(crate) fn count_ejection(backend: &str) {
    let _ = prometheus();
    counter!(EJECTIONS, "backend" => backend.to_owned()).increment(1);
}

/// Counts one error the gateway answered itself.
pub(crate) fn count_gateway_error(kind: crate::error::ErrorKind) {
    let _ = prometheus();
    counter!(GATEWAY_ERRORS, "code" => kind.code()).increment(1);
}

/// One API key's metric handles, built once so that a request costs atomic adds.
#[derive(Debug)]
pub(crate) struct KeyMetrics {
    /// Requests admitted.
    pub requests: Counter,
    /// Prompt tokens used.
    pub input_tokens: Counter,
    /// Output tokens used.
    pub output_tokens: Counter,
    /// Spend this period.
    pub spend: Gauge,
    /// Requests in flight.
    pub in_flight: Gauge,
    /// Refusals, by limit in the order given to [`KeyMetrics::new`].
    pub limited: [Counter; 4],
}

impl KeyMetrics {
    /// The handles of the key named `key`, one refusal counter per label of `limits` (in the
    /// order [`KeyMetrics::limited`] is indexed by); they exist at zero from now.
    pub(crate) fn new(key: &str, limits: [&'static str; 4]) -> Self {
        let _ = prometheus();
        let limited = limits.map(|limit| {
            let c = counter!(KEY_LIMITED, "key" => key.to_owned(), "limit" => limit);
            c.increment(0);
            c
        });
        Self {
            requests: counter!(KEY_REQUESTS, "key" => key.to_owned()),
            input_tokens: counter!(KEY_TOKENS, "key" => key.to_owned(), "token_type" => "input"),
            output_tokens: counter!(KEY_TOKENS, "key" => key.to_owned(), "token_type" => "output"),
            // Keys sharing `key="other"` (past `admin.max_key_series`) have no one spend to show.
            spend: if key == OTHER_KEYS {
                metrics::Gauge::noop()
            } else {
                metrics::gauge!(KEY_SPEND, "key" => key.to_owned())
            },
            in_flight: metrics::gauge!(KEY_IN_FLIGHT, "key" => key.to_owned()),
            limited,
        }
    }
}

/// The decision counters of one class (`""` for requests without one), one per reason label,
/// built once so that a decision costs an atomic add.
pub(crate) fn decision_counters<const N: usize>(
    class: &str,
    policy: Policy,
    reasons: [&'static str; N],
) -> [Counter; N] {
    let _ = prometheus();
    let policy = serde_json::to_value(policy)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    reasons.map(|r| {
        counter!(ROUTE_DECISIONS, "class" => class.to_owned(), "policy" => policy.clone(), "reason" => r)
    })
}

/// Counts `n` curve samples shared with the other replicas in `direction`.
pub(crate) fn count_cluster_samples(direction: &'static str, n: u64) {
    let _ = prometheus();
    counter!(CLUSTER_SAMPLES, "direction" => direction).increment(n);
}

/// Counts one claim of a slot at a backend's edge, by its outcome.
pub(crate) fn count_claim(outcome: &'static str) {
    let _ = prometheus();
    counter!(CLUSTER_CLAIMS, "outcome" => outcome).increment(1);
}

/// The cluster link's state: connected or not, and how many peers publish.
pub(crate) fn set_cluster(connected: bool, peers: usize) {
    let _ = prometheus();
    metrics::gauge!(CLUSTER_CONNECTED).set(if connected { 1.0 } else { 0.0 });
    metrics::gauge!(CLUSTER_PEERS).set(peers as f64);
}

/// Counts one client connection failed for taking no bytes.
pub(crate) fn count_client_write_timeout() {
    let _ = prometheus();
    counter!(CLIENT_WRITE_TIMEOUTS).increment(1);
}
