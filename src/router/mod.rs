//! The router: for each request, a backend whose curve says it will still meet the request's SLO
//! once this request is added (docs/ARCHITECTURE.md, "Routing"), or what the class does when none
//! will. Pure decisions over the [fleet](crate::fleet): it knows nothing of HTTP or the stack.
//!
//! - Candidates ([`candidates`]): backends in the client's reach ([`Reach`]: its dialect, or the
//!   other through translation) that serve the model, are under their hard `max_concurrency`,
//!   and are healthy (all of them if none is).
//! - Each is asked what this request would see there at in-flight + 1: from the curve's cached
//!   [`Model`](crate::curve::Model), a configured prior, or (policy `oracle`) the simulator's truth.
//! - Feasible: the prediction meets the SLO at its percentiles, the concurrency is within twice
//!   what the curve has seen, and the speed of every class already decoding there still holds.
//!   Where the curve has no evidence (never observed, or beyond twice what it has seen), the
//!   backend's [ramp](crate::fleet::ramp) stands in: a lone request first, then more as their
//!   first tokens and speed keep the SLO (TCP's slow start).
//! - The choice: the decision [`ladder`], an ordered list of [`rungs`], each a rule that picks a
//!   candidate or passes ([`scene`]: what they read and answer). A request every rung passes
//!   gets its class's `on_miss`. Baseline policies decide without curves ([`baseline`]).
//!
//! A decision is synchronous and reads no clock: [`Ask::now`] is the moment it is taken. Where a
//! request waits (in its class's line, or on a claim another replica may contest) is [`wait`],
//! which reads one each time a waiting request tries again.
//!
//! The words the rungs share are in their own files: [`ask`] (the request), [`decision`] (what
//! is answered and why), [`served`] (which backends serve a model). `impl Router` is this file.

pub(crate) mod ask;
pub(crate) mod baseline;
pub(crate) mod candidates;
pub(crate) mod caps;
pub(crate) mod decision;
pub(crate) mod device;
pub(crate) mod evaluate;
pub(crate) mod ladder;
pub(crate) mod oracle;
pub(crate) mod predictor;
pub(crate) mod refusal;
pub(crate) mod rungs;
pub(crate) mod scene;
pub(crate) mod served;
pub(crate) mod wait;

use std::cell::LazyCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use metrics::Counter;

use crate::config::{ClassConfig, OnMiss, Policy, PrefixRouting, Routing};
use crate::error::{Error, ErrorKind};
use crate::fleet::{Backend, Hit, InFlightGuard, Line};
pub(crate) use ask::ASSUMED_OUTPUT_TOKENS;
use ask::LINE_RESERVE;
pub use ask::{Ask, Reach};
pub(crate) use candidates::Candidate;
pub(crate) use caps::{Best, Cap, SloStanding, capacity};
pub(crate) use decision::{Decision, Reason};
use evaluate::Evaluator;
use oracle::Oracle;
use scene::{Rung, Scene, Turn};
pub(crate) use served::{Entries, Vacant};

/// The backends, the classes and the policies' shared state.
#[derive(Debug)]
pub struct Router {
    backends: Vec<Arc<Backend>>,
    /// Which of them serve each model.
    served: served::Served,
    /// Which of them share a device.
    devices: device::Devices,
    entries: Entries,
    classes: Vec<ClassConfig>,
    routing: Routing,
    line: Arc<Line>,
    oracle: Option<Oracle>,
    turn: AtomicUsize,
    decided: AtomicU64,
    explored: AtomicU64,
    /// Decision counters by class (the last row: requests without a class) and [`Reason`].
    counters: Vec<[Counter; Reason::ALL.len()]>,
    /// Refusals by class and cause, for `/admin/curves`.
    refusals: refusal::Refusals,
    /// Per class: the warning that no backend meets its SLO has been logged.
    unmet_warned: Vec<AtomicBool>,
}

impl Router {
    /// A router over `backends` (built with [`Router::line`] shared) for `classes`;
    /// `entries` says where requests naming no model go, and which discovered entries have
    /// no backend now.
    pub fn new(
        backends: Vec<Arc<Backend>>,
        entries: Entries,
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
        let labels = Reason::ALL.map(Reason::label);
        let mut counters: Vec<_> = classes
            .iter()
            .map(|c| crate::telemetry::decision_counters(&c.name, c.policy, labels))
            .collect();
        counters.push(crate::telemetry::decision_counters(
            "",
            routing.policy,
            labels,
        ));
        let unmet_warned = classes.iter().map(|_| AtomicBool::new(false)).collect();
        let refusals = refusal::Refusals::new(classes.iter().map(|c| &*c.name));
        Self {
            devices: device::Devices::new(&backends),
            served: served::Served::new(&backends),
            backends,
            entries,
            classes,
            routing,
            line,
            oracle,
            turn: AtomicUsize::new(0),
            decided: AtomicU64::new(0),
            explored: AtomicU64::new(0),
            counters,
            refusals,
            unmet_warned,
        }
    }

    /// The backends, in config order.
    pub(crate) fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    /// The classes, in config order.
    pub fn classes(&self) -> &[ClassConfig] {
        &self.classes
    }

    /// The oracle, when a class uses it; its curves need [`Oracle::refresh`] now and then.
    pub(crate) fn oracle(&self) -> Option<&Oracle> {
        self.oracle.as_ref()
    }

    /// The wait line (shared with the backends, which wake it).
    pub(crate) fn line(&self) -> Arc<Line> {
        Arc::clone(&self.line)
    }

    /// Requests waiting in the `queue` line.
    pub(crate) fn waiting(&self) -> usize {
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

    /// The TTFT kept back for the line ([`LINE_RESERVE`]), seconds: only for a request waiting
    /// in line (a fresh one is tried at once only when its class's line is empty), and only
    /// while others wait there too.
    fn line_reserve(&self, ask: &Ask<'_>, queued: bool) -> Option<f64> {
        let max_ttft_s = ask.slo.max_ttft_s.filter(|_| queued)?;
        let others = ask.class.is_some_and(|c| self.line.waiting_in(c) > 1);
        others.then_some(max_ttft_s * LINE_RESERVE)
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

    /// The backend for a request on `path` naming no model: a `routes[]` rule's for the path,
    /// else the default backend, if configured (of a discovered entry's members, the least
    /// occupied that admits it).
    pub(crate) fn route_default(&self, path: &str) -> Result<Decision, Error> {
        let members = self
            .entries
            .by_path
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, members)| members)
            .or(self.entries.default.as_ref())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidRequest,
                    "the body names no `model` and there is no default_backend (nor a routes[] rule naming a backend for this path)",
                )
            })?;
        if members.is_empty() {
            // A discovered entry whose host has no address now: there, but not yet.
            return Err(Error::new(
                ErrorKind::NoBackendAvailable,
                "the backend for requests naming no model has no address now (discovery: dns); try again shortly",
            ));
        }
        let members = members.iter().copied();
        let least = members
            .clone()
            .min_by_key(|&i| self.backends.get(i).map_or(u32::MAX, |b| b.in_flight()));
        least
            .into_iter()
            .chain(members)
            .find_map(|index| {
                let backend = self.backends.get(index)?;
                let mut guard = InFlightGuard::try_admit(backend, None)?;
                guard.beside(self.devices.of(index));
                Some(Decision {
                    backend: Arc::clone(backend),
                    index,
                    guard,
                    prediction: None,
                    reason: Reason::Baseline,
                    claim: None,
                })
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NoBackendAvailable,
                    "the default backend is at its concurrency limit",
                )
            })
    }

    /// Prefix-cache-aware routing's settings, unless it is off: the stack hashes requests'
    /// prompts with them.
    pub(crate) fn prefix_routing(&self) -> Option<PrefixRouting> {
        self.routing.prefix
    }

    /// The candidates for `ask`, evaluated as a decision would ([`Evaluator::candidates`]).
    #[cfg(test)]
    pub(crate) fn candidates(&self, ask: &Ask<'_>, policy: Policy) -> Vec<Candidate<'_>> {
        self.evaluator().candidates(ask, policy)
    }

    /// What evaluating a request's candidates reads, borrowed for one decision.
    fn evaluator(&self) -> Evaluator<'_> {
        Evaluator {
            backends: &self.backends,
            served: &self.served,
            devices: &self.devices,
            classes: &self.classes,
            prefix: self.routing.prefix,
            oracle: self.oracle.as_ref(),
        }
    }

    /// The derived concurrency caps ([`caps::caps`]).
    pub(crate) fn caps(&self, now: tokio::time::Instant) -> Vec<Cap> {
        caps::caps(&self.backends, &self.classes, now)
    }

    /// Per latency class, whether any backend meets its SLO ([`caps::standings`]).
    pub(crate) fn standings(&self) -> Vec<SloStanding> {
        caps::standings(&self.backends, &self.classes)
    }

    /// Warns, once per class, when the curves first show that no backend meets its SLO even
    /// with one request alone, naming the best backend's figures.
    pub(crate) fn warn_unmet_slos(&self) {
        for standing in self.standings() {
            let (Some(false), Some(best)) = (standing.feasible, &standing.best) else {
                continue;
            };
            let Some(i) = self.classes.iter().position(|c| c.name == standing.class) else {
                continue;
            };
            if self.unmet_warned[i].swap(true, Ordering::Relaxed) {
                continue;
            }
            let slo = self.classes[i].slo;
            tracing::warn!(
                class = &*standing.class,
                min_tps = slo.min_tps,
                tps_percentile = slo.tps_percentile,
                max_ttft_ms = slo.max_ttft_s.map(|s| s * 1e3),
                ttft_percentile = slo.ttft_percentile,
                best_backend = &*best.backend,
                model = &*best.model,
                tps_p10 = best.per_user_tps_p10,
                tps_p50 = best.per_user_tps_p50,
                ttft_p50_ms = best.ttft_p50_s * 1e3,
                ttft_p90_ms = best.ttft_p90_s * 1e3,
                chance = best.chance,
                "no backend meets this class's SLO even with one request alone: its requests go \
                 where they are likeliest to meet it (route reason best_chance); loosen the SLO \
                 or add a faster backend"
            );
        }
    }

    /// The 400 for a prompt that no backend serving its model can hold: every one of them
    /// (but those a retry avoids) has a context window, and the prompt fills the largest.
    fn too_long(&self, ask: &Ask<'_>) -> Option<Error> {
        let windows = self
            .evaluator()
            .reachable(ask.model, ask.reach)
            .filter(|s| !ask.avoid.contains(&s.index))
            .map(|s| s.backend.windows.of(&s.backend.config, ask.model));
        let largest = windows.max()??;
        Some(Error::new(
            ErrorKind::ContextLengthExceeded,
            format!(
                "prompt is too long: {} tokens > {largest} maximum (the tokens estimated from the request's size; {largest} is the largest context window among the backends serving `{}`): shorten the conversation",
                ask.prompt_tokens, ask.model
            ),
        ))
    }

    /// No slot is expected to free before the request's first-token target or its class's
    /// queue wait runs out: waiting longer would only end in a 429. The slot counted is the
    /// next one, not the one after those the requests ahead in line will take: counting theirs
    /// sent the newest of a flooding key's requests, the deepest in line, onto full backends
    /// ahead of the fair order (docs/benchmarks/routing.md, "The last resort counts the
    /// request's own slot").
    fn no_slot_in_time(&self, ask: &Ask<'_>) -> bool {
        let (_, max_wait) = self.on_miss(ask);
        let waited = ask.now.saturating_duration_since(ask.received);
        let mut left_s = max_wait.saturating_sub(waited).as_secs_f64();
        if let Some(ttft_s) = ask.slo_at(ask.now).max_ttft_s {
            left_s = left_s.min(ttft_s);
        }
        self.evaluator().slot_free_in_s(ask) >= left_s
    }

    /// Decides for `ask` now. `Ok(None)`: its class queues and nothing is feasible yet, so
    /// [`wait::in_line`] next. Errors: 404 when no backend serves the model, 503 when all
    /// that do are at their hard limit, 429 with Retry-After when the class sheds.
    pub fn route(&self, ask: &Ask<'_>) -> Result<Option<Decision>, Error> {
        let served = self.evaluator().serving(ask).count();
        if served == 0 {
            if let Some(too_long) = self.too_long(ask) {
                return Err(too_long);
            }
            if let Some(Vacant { name: entry, .. }) = self.entries.vacant.iter().find(|v| {
                ask.reach.reaches(v.dialect, v.translate) && v.models.upstream(ask.model).is_some()
            }) {
                return Err(Error::new(
                    ErrorKind::NoBackendAvailable,
                    format!(
                        "model `{}` is served by `{entry}`, whose host resolves to no address now (discovery: dns); try again shortly",
                        ask.model
                    ),
                ));
            }
            return Err(Error::new(
                ErrorKind::ModelNotFound,
                format!(
                    "model `{}` is not served by any backend; available: {}",
                    ask.model,
                    self.model_list(ask.reach)
                ),
            ));
        }
        let policy = self.policy(ask);
        if baseline::is_baseline(policy) {
            let candidates = self.evaluator().candidates(ask, policy);
            let pinned = (policy == Policy::PrefixHash)
                .then(|| self.pinned(ask, served))
                .flatten();
            return baseline::baseline(policy, &candidates, &self.turn, pinned)
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
                let candidates = missed.unwrap_or_else(|| self.evaluator().candidates(ask, policy));
                rungs::best_effort::best_effort(&ask.slo, &candidates)
                    .and_then(|c| self.admit(ask, &candidates[c], Reason::BestEffort))
                    .or_else(|| self.any_admissible(ask, &candidates))
                    .map(Some)
                    .ok_or_else(|| self.at_limit(ask))
            }
            OnMiss::Shed => Err(self.shed(ask, "no backend is predicted to meet the SLO")),
            OnMiss::Queue => Ok(None),
        }
    }

    /// One climb of the decision ladder ([`ladder`]); on a miss (every rung passed, or no slot
    /// left where they picked), the candidates as evaluated, for `on_miss`. A request waiting in
    /// line (`queued`, at its turn) neither explores nor counts again toward the exploration
    /// budget.
    fn try_decide(
        &self,
        ask: &Ask<'_>,
        policy: Policy,
        queued: bool,
    ) -> Result<Decision, Vec<Candidate<'_>>> {
        let in_time = ask.slo.max_ttft_s.is_none_or(|t| {
            ask.now
                .saturating_duration_since(ask.received)
                .as_secs_f64()
                < t
        });
        let held;
        let ask = match self.line_reserve(ask, queued) {
            Some(reserve_s) => {
                held = ask.holding_back(ask.now, reserve_s);
                &held
            }
            None => ask,
        };
        let candidates = self.evaluator().candidates(ask, policy);
        if tracing::enabled!(tracing::Level::TRACE) {
            candidates.iter().for_each(trace_candidate);
        }
        let no_slot_in_time = || self.no_slot_in_time(ask);
        let decision = {
            let scene = Scene {
                ask,
                policy,
                classes: &self.classes,
                candidates: &candidates,
                on_miss: self.on_miss(ask).0,
                turn: queued.then(|| Turn {
                    last_resort: LazyCell::new(&no_slot_in_time as &dyn Fn() -> bool),
                }),
                line_empty: ask.class.is_some_and(|c| self.line.waiting_in(c) == 0),
                may_explore: !queued
                    && policy != Policy::Oracle
                    && (self.explored.load(Ordering::Relaxed) as f64)
                        < self.routing.exploration * self.decided.load(Ordering::Relaxed) as f64,
                in_time,
            };
            let rungs = if policy == Policy::Throughput || ask.slo.is_batch() {
                ladder::BATCH
            } else {
                ladder::LATENCY
            };
            self.climb(&scene, rungs)
        };
        decision.ok_or(candidates)
    }

    /// The first pick down `rungs` whose slot can be taken (a backend may fill between its
    /// evaluation and its pick: the next rungs are asked then).
    fn climb(&self, scene: &Scene<'_, '_>, rungs: &[&dyn Rung]) -> Option<Decision> {
        let mut from = 0;
        while let Some((at, pick)) = ladder::climb(rungs, scene, from) {
            let c = &scene.candidates[pick.candidate];
            if tracing::enabled!(tracing::Level::DEBUG) {
                left_holder(scene.candidates, c);
            }
            if let Some(mut decision) = self.admit(scene.ask, c, pick.reason) {
                tracing::debug!(rung = rungs[at].name(), "rung");
                if rungs[at].name() == rungs::explore::Explore.name() {
                    self.explored.fetch_add(1, Ordering::Relaxed);
                }
                if pick.read_early {
                    decision.guard.trial().read_early();
                }
                return Some(decision);
            }
            from = at + 1;
        }
        None
    }

    /// The request goes to `backend`, which should hold `cache` of its prompt: its prefix
    /// index (and the peers') holds the whole prompt from now on.
    fn placed(&self, ask: &Ask<'_>, backend: &Backend, cache: Hit) {
        if let (Some(index), Some(prefix)) = (&backend.prefix, ask.prefix) {
            index.routed(prefix, cache, ask.prompt_tokens, ask.now);
            backend.share_prefix(prefix);
        }
    }

    /// Takes a slot on candidate `c`, counting and logging the decision.
    fn admit(&self, ask: &Ask<'_>, c: &Candidate<'_>, reason: Reason) -> Option<Decision> {
        let mut guard = InFlightGuard::try_admit(c.backend, ask.class)?;
        guard.beside(self.devices.of(c.index));
        if c.on_ramp() {
            let slo = ask.slo_at(ask.now);
            let admitted_with = guard.admitted_with();
            guard
                .trial()
                .probe(admitted_with, slo.max_ttft_s, slo.min_tps);
        }
        guard.expect_prefill(ask.prompt_tokens, c.cache);
        guard.pace(
            ask.max_tokens.unwrap_or(ASSUMED_OUTPUT_TOKENS as u32),
            ask.slo.min_tps,
        );
        let edge = self.evaluator().edge_of(ask, c, self.policy(ask));
        // A decision at the edge counts once its claim is settled: a refused one never went.
        if edge.is_none() {
            self.count(ask, reason);
            self.placed(ask, c.backend, c.cache);
        }
        tracing::debug!(
            backend = &*c.backend.config.name,
            class = ask
                .class
                .and_then(|i| self.classes.get(i))
                .map(|k| &*k.name),
            reason = reason.label(),
            joining = c.joining,
            predicted_tps = c.prediction().map(|p| p.per_user_tps_p50),
            predicted_ttft_ms = c.prediction().map(|p| p.ttft_p50_s * 1e3),
            slack = c.estimate().map(|e| e.slack),
            beyond_evidence = c.prediction().map(|p| p.beyond_evidence),
            keeps_others = c.keeps_others(),
            cached_tokens = c.cache.cached_tokens,
            edge,
            "routed"
        );
        Some(Decision {
            backend: Arc::clone(c.backend),
            index: c.index,
            guard,
            prediction: c.prediction().copied(),
            reason,
            claim: edge,
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

    /// The refusals of class `class` (its index in [`Router::classes`]) by cause, since this
    /// router was built.
    pub(crate) fn refusals(&self, class: usize) -> Vec<(&'static str, u64)> {
        self.refusals.of(class)
    }

    /// A 429 whose Retry-After is when the curves expect a slot to free
    /// ([`Evaluator::slot_free_in_s`](evaluate::Evaluator::slot_free_in_s)), explained in
    /// [`refusal::HEADER`] by the candidates as they stand now.
    fn shed(&self, ask: &Ask<'_>, why: &str) -> Error {
        self.count(ask, Reason::Shed);
        let candidates = self.evaluator().candidates(ask, self.policy(ask));
        let waited_s = ask
            .now
            .saturating_duration_since(ask.received)
            .as_secs_f64();
        let refusal = refusal::Refusal::explain(&candidates, ask.slo_at(ask.now), waited_s);
        self.refusals.count(ask.class, refusal.cause);
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_str(&refusal.to_string()) {
            headers.insert(refusal::HEADER, value);
        }
        let soonest = self.evaluator().slot_free_in_s(ask);
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
            format!(
                "{why} ({}); retry after {retry_after} s{or_batch}",
                refusal.cause.label()
            ),
        )
        .retry_after(retry_after)
        .with_headers(headers)
    }

    /// `prefix_hash`'s backend for `ask`: its key (the hint, else the prompt's first block)
    /// over the `served` backends that serve its model, so that a key keeps its backend
    /// whatever the load.
    fn pinned(&self, ask: &Ask<'_>, served: usize) -> Option<usize> {
        let prefix = ask.prefix?;
        let key = prefix.hint.or_else(|| prefix.hashes.first().copied())?;
        let nth = usize::try_from(key % served.max(1) as u64).ok()?;
        self.evaluator().serving(ask).nth(nth).map(|s| s.index)
    }

    /// Backends in `reach` that serve `model`: with more than one, a failed attempt can be
    /// tried again elsewhere.
    pub(crate) fn serving_count(&self, model: &str, reach: Reach) -> usize {
        self.evaluator().reachable(model, reach).count()
    }

    /// Client model names served in reach, sorted.
    fn model_names(&self, reach: Reach) -> BTreeSet<&str> {
        self.backends
            .iter()
            .filter(|b| reach.reaches(b.config.dialect, b.config.translate))
            .flat_map(|b| b.config.models.aliases.keys().map(String::as_str))
            .collect()
    }

    fn model_list(&self, reach: Reach) -> String {
        let names: Vec<&str> = self.model_names(reach).into_iter().collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// `GET /v1/models`: every client model name, with the first backend (in config order)
    /// that serves it.
    pub(crate) fn models(&self) -> BTreeMap<&str, &str> {
        let mut owners = BTreeMap::new();
        for b in &self.backends {
            for name in b.config.models.aliases.keys() {
                owners.entry(name.as_str()).or_insert(&*b.config.name);
            }
        }
        owners
    }
}

/// The prompt is leaving the backend that holds its prefix for `chosen`: it pays its prefill
/// cold there. Why the holder was passed over, at debug level.
fn left_holder(candidates: &[Candidate<'_>], chosen: &Candidate<'_>) {
    if chosen.holds_prefix {
        return;
    }
    let Some(holder) = candidates.iter().find(|c| c.holds_prefix) else {
        return;
    };
    let p = holder.prediction();
    tracing::debug!(
        holder = &*holder.backend.config.name,
        holder_slack = holder.estimate().map(|e| e.slack),
        holder_ttft_p90_ms = p.map(|p| p.ttft_p90_s * 1e3),
        holder_tps_p10 = p.map(|p| p.per_user_tps_p10),
        holder_beyond_evidence = p.map(|p| p.beyond_evidence),
        holder_keeps_others = holder.keeps_others(),
        holder_joining = holder.joining,
        chosen = &*chosen.backend.config.name,
        chosen_slack = chosen.estimate().map(|e| e.slack),
        chosen_ttft_p90_ms = chosen.prediction().map(|p| p.ttft_p90_s * 1e3),
        "left the prefix's holder"
    );
}

/// One evaluated candidate as the router saw it (`RUST_LOG=tpsgate::router=trace`): what a
/// decision weighed, for the operator asking why a request went where it did.
fn trace_candidate(c: &Candidate<'_>) {
    let p = c.prediction();
    let e = c.estimate();
    tracing::trace!(
        backend = &*c.backend.config.name,
        joining = c.joining,
        predicted_tps = p.map(|p| p.per_user_tps_p50),
        predicted_ttft_ms = p.map(|p| p.ttft_p50_s * 1e3),
        confidence = p.map(|p| p.confidence),
        beyond_evidence = p.map(|p| p.beyond_evidence),
        slack = e.map(|e| e.slack),
        next_slack = e.map(|e| e.next_slack),
        chance = e.map(|e| e.chance()),
        keeps_others = c.keeps_others(),
        stall_loss = c.stall_loss(),
        stall_s_per_token = c.backend.paces.stall_s_per_token(),
        neighbour_loss = e.map(|e| e.neighbour_loss),
        "candidate"
    );
}

#[cfg(test)]
mod tests;
