//! The router: for each request, a backend whose curve says it will still meet the request's SLO
//! once this request is added (DESIGN.md, "Routing"), or what the class does when none will.
//!
//! - Candidates ([`Router::candidates`]): backends that speak the dialect, serve the model, are
//!   under their hard `max_concurrency`, and are healthy (all of them if none is).
//! - Each is asked what this request would see there at in-flight + 1: from the curve's cached
//!   [`Model`](crate::curve::Model), a configured prior, or (policy `oracle`) the simulator's truth.
//! - Feasible: the prediction meets the SLO at its percentiles, the concurrency is within twice
//!   what the curve has seen, and the speed of every class already decoding there still holds.
//!   A backend never observed takes one request at a time until it has been (a cold start is a
//!   lone request, so it cannot hurt anyone else).
//! - Choice among the feasible: [`choose`]. No feasible backend: the class's `on_miss`.
//! - Exploration: a budgeted share of requests goes where the curve knows least, but only where
//!   no prediction says it would break an SLO (its own or anyone's already there).

pub mod choose;
pub mod oracle;
pub mod queue;
pub mod slo;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use metrics::Counter;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::config::{BackendDialect, ClassConfig, OnMiss, Policy, Routing};
use crate::curve::{Model, Prediction};
use crate::error::{Error, ErrorKind};
use crate::proxy::body::ProxyBody;
use crate::upstream::{Backend, InFlightGuard};
use oracle::Oracle;
use queue::Line;
use slo::Slo;

/// What the router needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Client model name.
    pub model: &'a str,
    /// The API the client speaks.
    pub dialect: BackendDialect,
    /// Prompt size, estimated from the body.
    pub prompt_tokens: u64,
    /// `max_tokens`, if the body sets it.
    pub max_tokens: Option<u32>,
    /// Index of its class, if any.
    pub class: Option<usize>,
    /// Its targets (the class's, with any per-request overrides).
    pub slo: Slo,
    /// When the gateway received it: queueing counts against the TTFT budget from here.
    pub received: Instant,
    /// Backends (by index, the first 64) not to use: a retry avoids those that failed it.
    pub avoid: u64,
}

impl Ask<'_> {
    /// The SLO as it stands at `now`: the TTFT budget less the time already spent since the
    /// request arrived (reading it, waiting in line).
    pub fn slo_at(&self, now: Instant) -> Slo {
        let waited = now.saturating_duration_since(self.received).as_secs_f64();
        Slo {
            max_ttft_s: self.slo.max_ttft_s.map(|t| t - waited),
            ..self.slo
        }
    }
}

/// Why a backend was chosen (the `reason` label of `tpsgate_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Predicted to meet the SLO, chosen by the class policy.
    Feasible,
    /// A never-observed backend taking a lone request.
    ColdStart,
    /// Spent from the exploration budget.
    Explore,
    /// No backend was feasible: the least predicted violation.
    BestEffort,
    /// Feasible after waiting in the class's line.
    Queued,
    /// Refused with 429: nothing feasible (at once, or before the wait ran out).
    Shed,
    /// Chosen by a baseline policy, which does not predict.
    Baseline,
}

impl Reason {
    const ALL: [Self; 7] = [
        Self::Feasible,
        Self::ColdStart,
        Self::Explore,
        Self::BestEffort,
        Self::Queued,
        Self::Shed,
        Self::Baseline,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Feasible => "feasible",
            Self::ColdStart => "cold_start",
            Self::Explore => "explore",
            Self::BestEffort => "best_effort",
            Self::Queued => "queued",
            Self::Shed => "shed",
            Self::Baseline => "baseline",
        }
    }
}

/// A routing decision with its in-flight slot.
#[derive(Debug)]
pub struct Decision {
    /// The chosen backend.
    pub backend: Arc<Backend>,
    /// Its index in the router's list.
    pub index: usize,
    /// The slot taken there.
    pub guard: InFlightGuard,
    /// What the router expected this request to see there.
    pub prediction: Option<Prediction>,
    /// Why.
    pub reason: Reason,
}

/// One candidate backend as the router sees it for one request.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'r> {
    /// Index in the router's backend list.
    pub index: usize,
    /// The backend.
    pub backend: &'r Arc<Backend>,
    /// In flight there once this request joins.
    pub joining: u32,
    /// What this request would see there; `None` for a backend never observed.
    pub prediction: Option<Prediction>,
    /// The request's own slack there ([`Slo::slack`]); 0 without a prediction.
    pub slack: f64,
    /// Every class already decoding there keeps its speed target.
    pub keeps_others: bool,
    /// After this request joins, a request of every latency class could still join and meet its
    /// SLO there (or the backend cannot serve that class at all). Batch placement requires it,
    /// so that batch work only takes capacity interactive traffic is not about to need.
    pub leaves_room: bool,
    /// System tokens per second this request adds there, `S(n) - S(n-1)` where `S(c)` is `c`
    /// requests of `T` tokens each taking `TTFT + T / TPS` (medians); computed for batch placement
    /// only (0 for a latency request, and without a prediction).
    pub marginal_tps: f64,
}

impl Candidate<'_> {
    /// Meets the SLO on a prediction the curve stands behind.
    fn feasible(&self) -> bool {
        self.prediction
            .is_some_and(|p| !p.beyond_evidence && self.slack >= 0.0 && self.keeps_others)
    }

    /// Never observed, and would take its first request alone.
    fn cold_start(&self) -> bool {
        self.prediction.is_none() && self.joining == 1
    }
}

/// The backends, the classes and the policies' shared state.
#[derive(Debug)]
pub struct Router {
    backends: Vec<Arc<Backend>>,
    default_backend: Option<usize>,
    classes: Vec<ClassConfig>,
    routing: Routing,
    line: Arc<Line>,
    oracle: Option<Oracle>,
    turn: AtomicUsize,
    decided: AtomicU64,
    explored: AtomicU64,
    /// Decision counters by class (the last row: requests without a class) and [`Reason`].
    counters: Vec<[Counter; Reason::ALL.len()]>,
    /// Retries allowed as a share of requests.
    budget: RetryBudget,
}

/// Retries as a share of requests, as linkerd and Envoy bound them: every request deposits
/// `ratio` of a retry, a retry spends one, and the balance starts (and is capped) at
/// [`RetryBudget::RESERVE`] so that a quiet gateway can still retry a few.
#[derive(Debug)]
pub struct RetryBudget {
    /// Balance in thousandths of a retry.
    milli: std::sync::atomic::AtomicI64,
    deposit: i64,
}

impl RetryBudget {
    /// Retries available to a gateway that has seen no requests yet.
    pub const RESERVE: i64 = 10;

    fn new(ratio: f64) -> Self {
        Self {
            milli: std::sync::atomic::AtomicI64::new(Self::RESERVE * 1000),
            deposit: (ratio * 1000.0).round() as i64,
        }
    }

    /// One request passed.
    pub fn deposit(&self) {
        let cap = Self::RESERVE * 1000 * 10;
        let _ = self
            .milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m + self.deposit).min(cap))
            });
    }

    /// Spends one retry if the balance allows.
    pub fn withdraw(&self) -> bool {
        self.milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                (m >= 1000).then_some(m - 1000)
            })
            .is_ok()
    }
}

impl Router {
    /// A router over `backends` (built with [`Router::line`] shared) for `classes`.
    pub fn new(
        backends: Vec<Arc<Backend>>,
        default_backend: Option<usize>,
        classes: Vec<ClassConfig>,
        routing: Routing,
        line: Arc<Line>,
    ) -> Self {
        let _ = crate::telemetry::prometheus();
        let uses_oracle =
            routing.policy == Policy::Oracle || classes.iter().any(|c| c.policy == Policy::Oracle);
        let oracle = uses_oracle.then(|| {
            let (prompt, output) = routing.oracle_shape;
            Oracle::new(backends.len(), prompt, output)
        });
        let mut counters: Vec<_> = classes
            .iter()
            .map(|c| crate::telemetry::decision_counters(&c.name, c.policy, Reason::ALL))
            .collect();
        counters.push(crate::telemetry::decision_counters(
            "",
            routing.policy,
            Reason::ALL,
        ));
        Self {
            backends,
            default_backend,
            classes,
            routing,
            line,
            oracle,
            turn: AtomicUsize::new(0),
            decided: AtomicU64::new(0),
            explored: AtomicU64::new(0),
            counters,
            budget: RetryBudget::new(routing.retry_budget),
        }
    }

    /// The backends, in config order.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    /// The classes, in config order.
    pub fn classes(&self) -> &[ClassConfig] {
        &self.classes
    }

    /// The oracle, when a class uses it; its curves need [`Oracle::refresh`] now and then.
    pub fn oracle(&self) -> Option<&Oracle> {
        self.oracle.as_ref()
    }

    /// Attempts a request may make (1: no retries).
    pub fn max_attempts(&self) -> u32 {
        self.routing.max_attempts
    }

    /// The retry budget.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The wait line (shared with the backends, which wake it).
    pub fn line(&self) -> Arc<Line> {
        Arc::clone(&self.line)
    }

    /// Requests waiting in the `queue` line.
    pub fn waiting(&self) -> usize {
        self.line.waiting()
    }

    fn policy(&self, ask: &Ask<'_>) -> Policy {
        ask.class
            .and_then(|i| self.classes.get(i))
            .map_or(self.routing.policy, |c| c.policy)
    }

    fn on_miss(&self, ask: &Ask<'_>) -> (OnMiss, Duration) {
        ask.class
            .and_then(|i| self.classes.get(i))
            .map_or((OnMiss::BestEffort, Duration::ZERO), |c| {
                (c.on_miss, c.queue_max_wait)
            })
    }

    fn count(&self, ask: &Ask<'_>, reason: Reason) {
        let row = ask.class.unwrap_or(self.classes.len());
        if let (Some(row), Some(i)) = (
            self.counters.get(row),
            Reason::ALL.iter().position(|r| *r == reason),
        ) {
            row[i].increment(1);
        }
    }

    /// The backend for a request naming no model: the default backend, if configured.
    pub fn route_default(&self) -> Result<Decision, Error> {
        let backend = self
            .default_backend
            .and_then(|i| self.backends.get(i))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidRequest,
                    "the body names no `model` and no default_backend is configured",
                )
            })?;
        let guard = backend.try_admit(None).ok_or_else(|| {
            Error::new(
                ErrorKind::NoBackendAvailable,
                "the default backend is at its concurrency limit",
            )
        })?;
        Ok(Decision {
            backend: Arc::clone(backend),
            index: self.default_backend.unwrap_or(0),
            guard,
            prediction: None,
            reason: Reason::Baseline,
        })
    }

    /// Decides for `ask` now. `Ok(None)`: its class queues and nothing is feasible yet, so
    /// [`Router::wait_in_line`] next. Errors: 404 when no backend serves the model, 503 when all
    /// that do are at their hard limit, 429 with Retry-After when the class sheds.
    pub fn route(&self, ask: &Ask<'_>) -> Result<Option<Decision>, Error> {
        let served = self.serving(ask).count();
        if served == 0 {
            return Err(Error::new(
                ErrorKind::ModelNotFound,
                format!(
                    "model `{}` is not served by any backend; available: {}",
                    ask.model,
                    self.model_list(ask.dialect)
                ),
            ));
        }
        let policy = self.policy(ask);
        if choose::is_baseline(policy) {
            let candidates = self.candidates(ask, policy);
            return choose::baseline(policy, &candidates, &self.turn)
                .and_then(|c| self.admit(ask, &candidates[c], Reason::Baseline))
                .or_else(|| self.any_admissible(ask, &candidates))
                .map(Some)
                .ok_or_else(|| self.at_limit(ask));
        }
        let (on_miss, _) = self.on_miss(ask);
        self.decided.fetch_add(1, Ordering::Relaxed);
        let queued_before = ask
            .class
            .is_some_and(|c| on_miss == OnMiss::Queue && self.line.waiting_in(c) > 0);
        let missed = if queued_before {
            None
        } else {
            match self.try_decide(ask, policy, false) {
                Ok(decision) => return Ok(Some(decision)),
                Err(candidates) => Some(candidates),
            }
        };
        match on_miss {
            OnMiss::BestEffort => {
                let candidates = missed.unwrap_or_else(|| self.candidates(ask, policy));
                choose::best_effort(&ask.slo, &candidates)
                    .and_then(|c| self.admit(ask, &candidates[c], Reason::BestEffort))
                    .or_else(|| self.any_admissible(ask, &candidates))
                    .map(Some)
                    .ok_or_else(|| self.at_limit(ask))
            }
            OnMiss::Shed => Err(self.shed(ask, "no backend is predicted to meet the SLO")),
            OnMiss::Queue => Ok(None),
        }
    }

    /// One attempt to place the request on a feasible (or exploring, or cold) backend; on a
    /// miss, the candidates as evaluated, for `on_miss`. A request waiting in line (`queued`)
    /// neither explores nor counts again toward the exploration budget.
    fn try_decide(
        &self,
        ask: &Ask<'_>,
        policy: Policy,
        queued: bool,
    ) -> Result<Decision, Vec<Candidate<'_>>> {
        let candidates = self.candidates(ask, policy);
        let may_explore = !queued
            && policy != Policy::Oracle
            && (self.explored.load(Ordering::Relaxed) as f64)
                < self.routing.exploration * self.decided.load(Ordering::Relaxed) as f64;
        if may_explore
            && let Some(c) = choose::exploration_target(&ask.slo, &candidates)
            && let Some(decision) = self.admit(ask, &candidates[c], Reason::Explore)
        {
            self.explored.fetch_add(1, Ordering::Relaxed);
            return Ok(decision);
        }
        let throughput = policy == Policy::Throughput || ask.slo.is_batch();
        let pick = if throughput {
            choose::throughput(&candidates)
        } else {
            choose::among_feasible(policy, &candidates, ask)
        };
        let decision = pick.and_then(|i| {
            let c = &candidates[i];
            let reason = if queued {
                Reason::Queued
            } else if c.prediction.is_none() {
                Reason::ColdStart
            } else {
                Reason::Feasible
            };
            self.admit(ask, c, reason)
        });
        decision.ok_or(candidates)
    }

    /// Waits in the class's line (first come, first served within the class) until a backend is
    /// feasible, or sheds with 429 when the class's queue wait, counted from receipt, runs out.
    pub async fn wait_in_line(&self, ask: &Ask<'_>) -> Result<Decision, Error> {
        let policy = self.policy(ask);
        let (_, max_wait) = self.on_miss(ask);
        let Some(class) = ask.class else {
            return Err(self.shed(ask, "no backend is predicted to meet the SLO"));
        };
        let deadline = ask.received + max_wait;
        let place = self.line.join(class);
        loop {
            let notified = place.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if place.is_first()
                && let Ok(decision) = self.try_decide(ask, policy, true)
            {
                return Ok(decision);
            }
            // Curves also change without a release (a refresh after a completion elsewhere):
            // look again at the curve's refresh period at the latest.
            let tick = Instant::now() + crate::curve::REFRESH;
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(tick.min(deadline)) => {}
            }
            if Instant::now() >= deadline {
                let why = if ask.slo.is_batch() {
                    "no backend had room for batch work within the class's queue wait"
                } else {
                    "no backend could meet the SLO within the class's queue wait"
                };
                return Err(self.shed(ask, why));
            }
        }
    }

    /// Takes a slot on candidate `c`, counting and logging the decision.
    fn admit(&self, ask: &Ask<'_>, c: &Candidate<'_>, reason: Reason) -> Option<Decision> {
        let guard = c.backend.try_admit(ask.class)?;
        self.count(ask, reason);
        tracing::debug!(
            backend = &*c.backend.config.name,
            class = ask
                .class
                .and_then(|i| self.classes.get(i))
                .map(|k| &*k.name),
            reason = reason.label(),
            joining = c.joining,
            predicted_tps = c.prediction.map(|p| p.per_user_tps_p50),
            predicted_ttft_ms = c.prediction.map(|p| p.ttft_p50_s * 1e3),
            slack = c.slack,
            "routed"
        );
        Some(Decision {
            backend: Arc::clone(c.backend),
            index: c.index,
            guard,
            prediction: c.prediction,
            reason,
        })
    }

    fn any_admissible(&self, ask: &Ask<'_>, candidates: &[Candidate<'_>]) -> Option<Decision> {
        candidates
            .iter()
            .find_map(|c| self.admit(ask, c, Reason::BestEffort))
    }

    fn at_limit(&self, ask: &Ask<'_>) -> Error {
        Error::new(
            ErrorKind::NoBackendAvailable,
            format!(
                "every backend serving `{}` is at its concurrency limit; retry shortly",
                ask.model
            ),
        )
    }

    /// A 429 whose Retry-After is when the curves expect a slot to free: the shortest, over the
    /// backends serving the model, of a request's mean duration divided by the requests there.
    fn shed(&self, ask: &Ask<'_>, why: &str) -> Error {
        self.count(ask, Reason::Shed);
        let soonest = self
            .serving(ask)
            .filter_map(|(_, b)| {
                let model = b.model(ask.model)?;
                Some(model.mean_duration_s / f64::from(b.in_flight().max(1)))
            })
            .fold(f64::INFINITY, f64::min);
        let retry_after = if soonest.is_finite() {
            soonest.ceil().clamp(1.0, 60.0) as u32
        } else {
            1
        };
        let or_batch = if ask.slo.is_batch() {
            ""
        } else {
            ", or send it as a batch class"
        };
        Error::new(
            ErrorKind::SloUnmet,
            format!("{why}; retry after {retry_after} s{or_batch}"),
        )
        .retry_after(retry_after)
    }

    /// Whether a backend other than the one at `index` serves `ask`'s model: only then can a
    /// failed attempt there be tried again.
    pub fn serves_elsewhere(&self, ask: &Ask<'_>, index: usize) -> bool {
        self.serving(ask).any(|(i, _)| i != index)
    }

    /// Backends that speak the dialect and serve the model, with their indices.
    fn serving<'r, 'a>(
        &'r self,
        ask: &'a Ask<'_>,
    ) -> impl Iterator<Item = (usize, &'r Arc<Backend>)> + use<'r, 'a> {
        self.backends.iter().enumerate().filter(|(i, b)| {
            b.config.dialect == ask.dialect
                && b.config.models.upstream(ask.model).is_some()
                && (*i >= 64 || ask.avoid & (1 << i) == 0)
        })
    }

    /// The candidates for `ask`, each evaluated: serving, under the hard limit, healthy (or all
    /// of those when none is healthy).
    pub fn candidates(&self, ask: &Ask<'_>, policy: Policy) -> Vec<Candidate<'_>> {
        let under_limit = |b: &Arc<Backend>| {
            b.config
                .max_concurrency
                .is_none_or(|limit| b.in_flight() < limit)
        };
        // One clock read for every check of this decision.
        let now = Instant::now();
        let healthy_exists = self
            .serving(ask)
            .any(|(_, b)| under_limit(b) && b.is_healthy(now));
        let predicts = !choose::is_baseline(policy);
        let slo = ask.slo_at(now);
        self.serving(ask)
            .filter(|(_, b)| under_limit(b) && (!healthy_exists || b.is_healthy(now)))
            .map(|(index, backend)| {
                let joining = backend.in_flight() + 1;
                if !predicts {
                    return Candidate {
                        index,
                        backend,
                        joining,
                        prediction: None,
                        slack: 0.0,
                        keeps_others: true,
                        leaves_room: true,
                        marginal_tps: 0.0,
                    };
                }
                let n = f64::from(joining);
                let predictor = self.predictor(index, backend, ask, policy, now);
                let prediction = predictor.at(n);
                let batch = policy == Policy::Throughput || ask.slo.is_batch();
                let leaves_room = !batch || self.leaves_room(&predictor, n + 1.0);
                // System TPS of n requests: each yields T tokens per TTFT + T / TPS seconds,
                // so a backend that queues (TTFT growing with n) adds nothing by taking more.
                let tokens = ask
                    .max_tokens
                    .map_or(choose::ASSUMED_OUTPUT_TOKENS, f64::from);
                let system = |c: f64, p: &Prediction| {
                    c * tokens / (p.ttft_p50_s + tokens / p.per_user_tps_p50)
                };
                let before = if batch && joining > 1 {
                    predictor.at(n - 1.0).map_or(0.0, |p| system(n - 1.0, &p))
                } else {
                    0.0
                };
                Candidate {
                    index,
                    backend,
                    joining,
                    prediction,
                    slack: prediction.map_or(0.0, |p| slo.slack(&p)),
                    keeps_others: prediction.is_none_or(|p| self.keeps_others(backend, &p)),
                    leaves_room,
                    marginal_tps: if batch {
                        prediction.map_or(0.0, |p| system(n, &p) - before)
                    } else {
                        0.0
                    },
                }
            })
            .collect()
    }

    /// Where `backend`'s predictions come from for `ask`: the oracle, or its curve's model
    /// (looked up once per request, whatever the number of concurrencies asked about).
    fn predictor(
        &self,
        index: usize,
        backend: &Backend,
        ask: &Ask<'_>,
        policy: Policy,
        now: Instant,
    ) -> Predictor<'_> {
        if policy == Policy::Oracle {
            Predictor::Oracle(self.oracle.as_ref(), index)
        } else {
            Predictor::Curve {
                model: backend.model(ask.model),
                prompt_tokens: ask.prompt_tokens,
                queue_s: backend.occupancy.waited(now),
            }
        }
    }

    /// Whether a latency-class request joining as the `next`-th would meet its SLO, for every
    /// latency class the backend can serve at all (a lone request meets it).
    fn leaves_room(&self, predictor: &Predictor<'_>, next: f64) -> bool {
        let (Some(then), Some(alone)) = (predictor.at(next), predictor.at(1.0)) else {
            return true;
        };
        self.classes
            .iter()
            .filter(|c| !c.slo.is_batch() && c.slo.slack(&alone) >= 0.0)
            .all(|c| c.slo.slack(&then) >= 0.0)
    }

    /// Whether every class with requests decoding on `backend` keeps its speed at `p`.
    fn keeps_others(&self, backend: &Backend, p: &Prediction) -> bool {
        self.classes
            .iter()
            .enumerate()
            .all(|(i, c)| backend.class_in_flight(i) == 0 || c.slo.speed_holds(p))
    }

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
                        cap: slo::derived_cap(&class.slo, limit, |n| model.predict(n, 0)),
                    });
                }
            }
        }
        caps
    }

    /// Client model names served in a dialect, sorted.
    fn model_names(&self, dialect: BackendDialect) -> BTreeSet<&str> {
        self.backends
            .iter()
            .filter(|b| b.config.dialect == dialect)
            .flat_map(|b| b.config.models.aliases.keys().map(String::as_str))
            .collect()
    }

    fn model_list(&self, dialect: BackendDialect) -> String {
        let names: Vec<&str> = self.model_names(dialect).into_iter().collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// `GET /v1/models`: the union over all backends, in OpenAI's list format.
    pub fn models_response(&self) -> Response<ProxyBody> {
        let mut owners: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
        for b in &self.backends {
            for name in b.config.models.aliases.keys() {
                owners.entry(name).or_insert(&b.config.name);
            }
        }
        let data: Vec<_> = owners
            .iter()
            .map(
                |(id, owner)| json!({"id": id, "object": "model", "created": 0, "owned_by": owner}),
            )
            .collect();
        let body = json!({"object": "list", "data": data}).to_string();
        let mut resp = Response::new(ProxyBody::full(Bytes::from(body)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// A backend's source of predictions for one request.
enum Predictor<'r> {
    /// The backend's curve.
    Curve {
        /// Its fitted model (none before the first observation).
        model: Option<Arc<Model>>,
        /// This request's prompt size.
        prompt_tokens: u64,
        /// How long the requests there still waiting for a first token have waited
        /// ([`Occupancy::waited`](crate::curve::Occupancy::waited)): a joining request waits
        /// behind them, which the curve learns only when their first tokens come.
        queue_s: f64,
    },
    /// The simulator's truth for backend `usize`.
    Oracle(Option<&'r Oracle>, usize),
}

impl Predictor<'_> {
    /// What a request joining at `concurrency` (itself included) would see.
    fn at(&self, concurrency: f64) -> Option<Prediction> {
        match self {
            Self::Curve {
                model,
                prompt_tokens,
                queue_s,
            } => {
                let mut p = model.as_ref()?.predict(concurrency, *prompt_tokens);
                if concurrency > 1.0 {
                    p.ttft_p50_s = p.ttft_p50_s.max(*queue_s);
                    p.ttft_p90_s = p.ttft_p90_s.max(*queue_s);
                }
                Some(p)
            }
            Self::Oracle(oracle, index) => oracle.as_ref()?.predict(*index, concurrency),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::{FirstToken, Observation, Outcome};

    /// A router over `backends` (each serving `m`, on unused ports) with classes `interactive`
    /// (median speed >= 41 tok/s), `loose` (>= 21 tok/s), both shedding on a miss, and `batch`
    /// (waiting for room, the default), never exploring.
    fn router_over(backends: &[&str]) -> Router {
        router_exploring(backends, 0.0)
    }

    fn router_exploring(backends: &[&str], exploration: f64) -> Router {
        let list: String = backends
            .iter()
            .map(|name| {
                format!("- {{name: {name}, url: 'http://127.0.0.1:1', dialect: openai, models: {{m: m}}}}\n")
            })
            .collect();
        let text = format!(
            "backends:\n{list}\
            classes:\n\
            - {{name: interactive, min_tps: 41, tps_percentile: 50, on_miss: shed}}\n\
            - {{name: loose, min_tps: 21, tps_percentile: 50, on_miss: shed}}\n\
            - {{name: batch}}\n\
            routing: {{exploration: {exploration}}}\n"
        );
        let config = crate::config::parse(&text, |_| None).unwrap();
        let line = Arc::new(Line::new(config.classes.len()));
        let backends = config
            .backends
            .iter()
            .map(|b| Backend::new(b.clone(), 300.0, config.classes.len(), Arc::clone(&line)))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        Router::new(backends, None, config.classes, config.routing, line)
    }

    fn router() -> Router {
        router_over(&["a"])
    }

    /// Teaches backend `i` a batching curve: TPOT = 10 ms + `per_seq_ms` per request.
    fn teach(router: &Router, i: usize, per_seq_ms: f64) {
        teach_at(
            router,
            i,
            per_seq_ms,
            &[1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0],
        );
    }

    /// [`teach`], seen at the given concurrencies only.
    fn teach_at(router: &Router, i: usize, per_seq_ms: f64, seen: &[f64]) {
        let now = Instant::now();
        for &c in seen {
            for _ in 0..8 {
                let obs = Observation {
                    at: now,
                    outcome: Outcome::Completed,
                    ttft: Some(0.05),
                    tpot: Some(0.010 + per_seq_ms * 1e-3 * c),
                    output_tokens: 100,
                    estimated: false,
                    prompt_tokens: Some(10),
                    concurrency: Some(c),
                };
                router.backends[i].first_token(
                    "m",
                    &FirstToken {
                        at: now,
                        ttft: 0.05,
                        prompt_tokens: Some(10),
                        admitted_with: c,
                    },
                );
                router.backends[i].record("m", &obs);
            }
        }
    }

    fn ask(router: &Router, class: usize) -> Ask<'static> {
        Ask {
            model: "m",
            dialect: BackendDialect::Openai,
            prompt_tokens: 10,
            max_tokens: None,
            class: Some(class),
            slo: router.classes[class].slo,
            received: Instant::now(),
            avoid: 0,
        }
    }

    /// Holds `n` slots of `class` on backend `i`.
    fn occupy(router: &Router, i: usize, class: usize, n: usize) -> Vec<InFlightGuard> {
        (0..n)
            .map(|_| router.backends[i].try_admit(Some(class)).unwrap())
            .collect()
    }

    fn chosen(router: &Router, class: usize) -> Result<&str, ErrorKind> {
        match router.route(&ask(router, class)) {
            Ok(Some(d)) => Ok(router
                .backends
                .iter()
                .find(|b| Arc::ptr_eq(b, &d.backend))
                .map(|b| &*b.config.name)
                .unwrap()),
            Ok(None) => Err(ErrorKind::NoBackendAvailable),
            Err(e) => Err(e.kind()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_still_waiting_for_a_first_token_keep_ttft_sensitive_ones_away() {
        let router = router_over(&["a", "b"]);
        // Third on `a`: 62.5 tok/s; alone on `b`: 55.6 tok/s.
        teach(&router, 0, 2.0);
        teach(&router, 1, 8.0);
        // Two requests on `a`, neither with a first token yet.
        let _held = occupy(&router, 0, 0, 2);
        let pick = |router: &Router| {
            let within_a_second = Ask {
                slo: Slo {
                    max_ttft_s: Some(1.0),
                    ..router.classes[0].slo
                },
                ..ask(router, 0)
            };
            let d = router.route(&within_a_second).unwrap().unwrap();
            d.backend.config.name.to_string()
        };
        assert_eq!(pick(&router), "a", "a fresh queue costs nothing yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            pick(&router),
            "b",
            "two seconds without a first token: a queue"
        );
    }

    #[test]
    fn headroom_picks_the_most_slack_and_pack_the_least() {
        let mut router = router_over(&["a", "b"]);
        teach(&router, 0, 1.0);
        teach(&router, 1, 0.5);
        // Alone on either, b (flatter curve) has more slack.
        assert_eq!(chosen(&router, 0), Ok("b"));
        router.classes[0].policy = Policy::Pack;
        assert_eq!(chosen(&router, 0), Ok("a"));
    }

    #[test]
    fn cheapest_takes_the_lower_price_among_the_feasible_even_with_less_slack() {
        let text = "backends:\n\
            - {name: dear, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}, cost: {input_per_1m: 1, output_per_1m: 4}}\n\
            - {name: cheap, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}, cost: {input_per_1m: 0.1, output_per_1m: 0.4}}\n\
            classes:\n\
            - {name: interactive, min_tps: 41, tps_percentile: 50, policy: cheapest, on_miss: shed}\n\
            routing: {exploration: 0}\n";
        let config = crate::config::parse(text, |_| None).unwrap();
        let line = Arc::new(Line::new(1));
        let backends = config
            .backends
            .iter()
            .map(|b| Backend::new(b.clone(), 300.0, 1, Arc::clone(&line)))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let router = Router::new(backends, None, config.classes, config.routing, line);
        teach(&router, 0, 0.5);
        teach(&router, 1, 1.0);
        assert_eq!(chosen(&router, 0), Ok("cheap"));
        // Once the cheap one can no longer meet the SLO, the dear one takes it.
        let _held = occupy(&router, 1, 0, 14);
        assert_eq!(chosen(&router, 0), Ok("dear"));
    }

    #[test]
    fn a_request_is_refused_where_it_would_slow_others_below_their_slo() {
        let router = router();
        teach(&router, 0, 1.0);
        // 41 tok/s at the median holds up to 14 requests: 1 / (10 + 14) ms = 41.7.
        let _held = occupy(&router, 0, 0, 14);
        // A loose request would get 40 tok/s at 15 (enough for it), but the 14 interactive
        // requests there would drop below 41.
        assert_eq!(chosen(&router, 1), Err(ErrorKind::SloUnmet));
        let only_loose = router_over(&["a"]);
        teach(&only_loose, 0, 1.0);
        let _held = occupy(&only_loose, 0, 1, 14);
        assert_eq!(chosen(&only_loose, 1), Ok("a"), "only loose requests there");
    }

    #[test]
    fn batch_work_leaves_room_for_one_more_latency_request() {
        let router = router();
        teach(&router, 0, 1.0);
        // Interactive fits up to 14 (see above). With 12 batch requests in flight, a 13th
        // leaves room for one interactive request at 14; with 13, it would not.
        let mut held = occupy(&router, 0, 2, 12);
        assert_eq!(chosen(&router, 2), Ok("a"));
        held.extend(occupy(&router, 0, 2, 1));
        assert_eq!(
            chosen(&router, 2),
            Err(ErrorKind::NoBackendAvailable),
            "batch waits in line"
        );
        assert_eq!(chosen(&router, 0), Ok("a"), "the room is there");
    }

    #[tokio::test(start_paused = true)]
    async fn batch_waits_at_the_gateway_until_a_slot_frees_rather_than_take_the_room() {
        let router = router();
        teach(&router, 0, 1.0);
        let mut held = occupy(&router, 0, 2, 13);
        let batch = ask(&router, 2);
        assert!(router.route(&batch).unwrap().is_none(), "it waits in line");
        let (decision, ()) = tokio::join!(router.wait_in_line(&batch), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            held.pop();
        });
        let decision = decision.unwrap();
        assert_eq!(&*decision.backend.config.name, "a");
        assert_eq!(decision.reason, Reason::Queued);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_that_never_finds_room_is_shed_after_its_wait_with_a_retry_time() {
        let router = router();
        teach(&router, 0, 1.0);
        let _held = occupy(&router, 0, 2, 13);
        let batch = ask(&router, 2);
        let waited = Instant::now();
        let err = router.wait_in_line(&batch).await.unwrap_err();
        assert_eq!(
            waited.elapsed(),
            Duration::from_secs(60),
            "the batch default"
        );
        assert_eq!(err.kind(), ErrorKind::SloUnmet);
        assert!(err.retry_after_s().is_some_and(|s| s >= 1));
        let message = err.to_string();
        assert!(message.contains("room for batch work"), "{message}");
        assert!(!message.contains("send it as a batch class"), "{message}");
    }

    #[test]
    fn exploring_never_takes_the_room_a_latency_request_needs() {
        // The first request may explore; `a` was only seen up to 4 at once, so 14 is unexplored.
        let router = router_exploring(&["a"], 0.5);
        teach_at(&router, 0, 1.0, &[1.0, 2.0, 4.0]);
        let _held = occupy(&router, 0, 2, 13);
        // A 14th batch request would leave an interactive one 40 tok/s at 15 (< 41).
        assert_eq!(
            chosen(&router, 2),
            Err(ErrorKind::NoBackendAvailable),
            "no exploring here"
        );
    }

    #[test]
    fn derived_caps_follow_the_curve_and_the_class() {
        let router = router();
        teach(&router, 0, 1.0);
        let caps = router.caps();
        let cap = |class: &str| caps.iter().find(|c| &*c.class == class).unwrap().cap;
        assert_eq!(cap("interactive"), 14);
        // 21 tok/s: 1 / (10 + 37.6) ms; beyond the learned 32 the fit extrapolates.
        assert_eq!(cap("loose"), 37);
        assert!(caps.iter().all(|c| &*c.class != "batch"));
    }
}
