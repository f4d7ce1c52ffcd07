//! A backend at runtime: its config, its connection pool, its in-flight count with the time
//! integral behind experienced concurrency, its health, its curves (one per client model name)
//! and its metric handles.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use dashmap::DashMap;
use tokio::time::Instant;

use super::chunking::Chunking;
use super::claim::Claimed;
use super::health::{Health, State};
use super::outbox::{Event, Learned, Outbox};
use super::paces::Paces;
use super::prefix::PrefixIndex;
use super::ramp::{LevelProbe, Ramp};
use super::waiters::Line;
use super::window::Windows;
use crate::config::BackendConfig;
use crate::curve::{Admitted, Curve, FirstToken, Model, Observation, Occupancy, Outcome};
use crate::prefix::RequestPrefix;
use crate::telemetry::ModelMetrics;
use crate::upstream::Pool;

/// A map keyed by client model name, read several times per request: hashed with foldhash, not
/// SipHash (its keys are bounded, [`Backend::tracked`], and the seed is random per process all
/// the same).
pub(crate) type ByModel<V> = DashMap<Arc<str>, V, foldhash::fast::RandomState>;

/// One upstream provider, shared by every request routed to it.
#[derive(Debug)]
pub struct Backend {
    /// Its validated config.
    pub config: BackendConfig,
    /// Its connections.
    pub pool: Arc<Pool>,
    /// In flight and its integral.
    pub occupancy: Occupancy,
    /// Its name as a header value (`x-tpsgate-backend` on every response), made once; `None`
    /// for a name a header cannot carry.
    pub name_header: Option<http::HeaderValue>,
    /// Curves by client model name. Changed only through this type, which publishes each
    /// configured name's fitted model to `fitted` as it changes.
    pub curves: ByModel<Curve>,
    /// The fitted model of each configured model name, in `config.models.aliases` order (or
    /// the prior's, before the name is observed): what a decision reads of every candidate,
    /// without hashing the name into the curves' map (docs/benchmarks/overhead.md, "The cost
    /// of a decision: a candidate's fit read without the curves' map").
    fitted: Box<[ArcSwapOption<Model>]>,
    /// Metric handles by client model name, then by class (a handful: found by a scan, with no
    /// key to allocate per request), built once each.
    metrics: ByModel<Vec<ModelMetrics>>,
    /// Outlier ejection and 429 cool-down.
    health: Health,
    /// Half-life of curve observations, seconds.
    pub half_life_s: f64,
    /// The prior as a curve, for models not observed yet.
    prior: Option<Curve>,
    /// In flight per class index, through this replica.
    class_in_flight: Box<[AtomicU32]>,
    /// In flight per class index through the other replicas, as of the last sync.
    peer_class_in_flight: Box<[AtomicU32]>,
    /// Where what this backend learns goes for the other replicas (in a cluster).
    outbox: Option<Outbox>,
    /// TTFT EWMAs (f64 bits), for the baselines.
    ttft_ewma: AtomicU64,
    ttft_peak_ewma: AtomicU64,
    /// Told when a slot frees, for requests waiting in line.
    line: Arc<Line>,
    /// What its prefix cache is believed to hold (unless `prefix_cache.enabled` is false).
    pub prefix: Option<PrefixIndex>,
    /// Its name's hash: its place in a prefix's rendezvous order ([`crate::prefix::rendezvous`]).
    pub rendezvous_seed: u64,
    /// Its slow start: requests it may take beyond what its curve has seen.
    pub ramp: Ramp,
    /// A probe of a level its curve has not proven, out and not read yet.
    pub level_probe: LevelProbe,
    /// Its streams' spare time against their speed targets, and the stall a prefill costs
    /// them.
    pub paces: Paces,
    /// Its context windows by model: configured, and reported by its `/v1/models`.
    pub windows: Windows,
    /// How many tokens its content events carry.
    pub chunking: Chunking,
}

/// The name models beyond a backend's `max_models` are tracked under.
pub(crate) const OTHER: &str = "other";

/// Weight of a new TTFT in the baselines' EWMAs.
const EWMA_ALPHA: f64 = 0.1;

impl Backend {
    /// Builds the client for `config`; `classes` is the number of traffic classes, `line` the
    /// router's wait line, `outbox` where its samples and health events go for the other
    /// replicas (in a cluster).
    pub fn new(
        config: BackendConfig,
        half_life_s: f64,
        classes: usize,
        line: Arc<Line>,
        outbox: Option<Outbox>,
    ) -> Result<Arc<Self>, String> {
        let pool = Pool::for_backend(&config)?;
        let now = Instant::now();
        let prior = config
            .prior
            .as_deref()
            .map(|points| Curve::seeded(half_life_s, points, now));
        let curves = ByModel::default();
        if let Some(prior) = &prior {
            for model in config.models.aliases.keys() {
                curves.insert(Arc::from(model.as_str()), prior.clone());
            }
        }
        let fitted = config
            .models
            .aliases
            .keys()
            .map(|_| ArcSwapOption::new(prior.as_ref().and_then(|p| p.model().cloned())))
            .collect();
        let prefix = config.prefix_index.map(PrefixIndex::new);
        let rendezvous_seed = crate::prefix::name_seed(&config.name);
        let windows = Windows::new(config.max_context_tokens.clone());
        Ok(Arc::new(Self {
            name_header: http::HeaderValue::from_str(&config.name).ok(),
            config,
            pool,
            occupancy: Occupancy::new(Instant::now()),
            curves,
            fitted,
            metrics: ByModel::default(),
            health: Health::new(now),
            half_life_s,
            prior,
            class_in_flight: (0..classes).map(|_| AtomicU32::new(0)).collect(),
            peer_class_in_flight: (0..classes).map(|_| AtomicU32::new(0)).collect(),
            outbox,
            ttft_ewma: AtomicU64::new(0),
            ttft_peak_ewma: AtomicU64::new(0),
            line,
            prefix,
            rendezvous_seed,
            ramp: Ramp::default(),
            level_probe: LevelProbe::default(),
            paces: Paces::default(),
            windows,
            chunking: Chunking::default(),
        }))
    }

    /// Takes over what was learned of `old`, its curves and the context windows it reported (a
    /// reload changed this backend's config, not what it is).
    pub(crate) fn adopt(&self, old: &Self) {
        self.windows.adopt(&old.windows);
        for entry in &old.curves {
            self.curves
                .insert(Arc::clone(entry.key()), entry.value().clone());
            self.publish(entry.key(), entry.value());
        }
    }

    /// The fitted model of the `slot`-th configured model name (in `config.models.aliases`
    /// order): [`Backend::model`] of that name, read without the curves' map.
    pub(crate) fn fitted(&self, slot: usize) -> Option<Arc<Model>> {
        self.fitted.get(slot)?.load_full()
    }

    /// Where [`Backend::fitted`] of the `slot`-th configured name is published, to be read
    /// without taking a count on the model.
    pub(crate) fn published(&self, slot: usize) -> Option<&ArcSwapOption<Model>> {
        self.fitted.get(slot)
    }

    /// Tells `fitted` that the curve under `key` changed, where `key` is a configured name and
    /// its model is a new one.
    fn publish(&self, key: &str, curve: &Curve) {
        let Some(slot) = self
            .config
            .models
            .aliases
            .keys()
            .position(|k| k == key)
            .and_then(|i| self.fitted.get(i))
        else {
            return;
        };
        let model = curve.model();
        let same = match (&*slot.load(), model) {
            (Some(old), Some(new)) => Arc::ptr_eq(old, new),
            (None, None) => true,
            _ => false,
        };
        if !same {
            slot.store(model.cloned());
        }
    }

    /// The name `model` is tracked under (its curve, its metric series): itself if configured
    /// or already tracked, or while fewer than `max_models` are; otherwise [`OTHER`]. Without
    /// this, a wildcard backend would keep a curve and a set of series for every name a client
    /// makes up.
    pub(crate) fn tracked<'a>(&self, model: &'a str) -> &'a str {
        if self.curves.contains_key(model)
            || self.metrics.contains_key(model)
            || self.config.models.aliases.contains_key(model)
            || self.curves.len().max(self.metrics.len()) < self.config.max_models
        {
            model
        } else {
            OTHER
        }
    }

    /// The fitted curve of `model` (or the prior's, before it has been observed).
    pub(crate) fn model(&self, model: &str) -> Option<Arc<Model>> {
        // One look-up where the model has a curve: every decision asks it of every candidate.
        if let Some(curve) = self.curves.get(model) {
            return curve.model().cloned();
        }
        match self.curves.get(self.tracked(model)) {
            Some(curve) => curve.model().cloned(),
            None => self.prior.as_ref()?.model().cloned(),
        }
    }

    /// Requests of class `class` in flight, fleet-wide.
    pub(crate) fn class_in_flight(&self, class: usize) -> u32 {
        let count =
            |counts: &[AtomicU32]| counts.get(class).map_or(0, |n| n.load(Ordering::Relaxed));
        count(&self.class_in_flight) + count(&self.peer_class_in_flight)
    }

    /// Requests of class `class` in flight through this replica.
    pub(crate) fn local_class_in_flight(&self, class: usize) -> u32 {
        self.class_in_flight
            .get(class)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// The other replicas' requests in flight per class index, as of a sync.
    pub(crate) fn set_peer_classes(&self, counts: impl Iterator<Item = u32>) {
        for (slot, n) in self.peer_class_in_flight.iter().zip(counts) {
            slot.store(n, Ordering::Relaxed);
        }
    }

    /// Recent TTFT, exponentially weighted; 0 before the first.
    pub(crate) fn ttft_ewma(&self) -> f64 {
        f64::from_bits(self.ttft_ewma.load(Ordering::Relaxed))
    }

    /// Recent TTFT, jumping to any higher sample and decaying slowly (peak EWMA).
    pub(crate) fn ttft_peak_ewma(&self) -> f64 {
        f64::from_bits(self.ttft_peak_ewma.load(Ordering::Relaxed))
    }

    fn note_ttft(&self, ttft: f64) {
        let update = |peak: bool| {
            move |bits: u64| {
                let old = f64::from_bits(bits);
                let new = if old == 0.0 || (peak && ttft > old) {
                    ttft
                } else {
                    old + EWMA_ALPHA * (ttft - old)
                };
                Some(new.to_bits())
            }
        };
        let _ = self
            .ttft_ewma
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, update(false));
        let _ =
            self.ttft_peak_ewma
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, update(true));
    }

    /// Requests admitted and not yet finished, fleet-wide (the other replicas' as of the last
    /// sync).
    pub(crate) fn in_flight(&self) -> u32 {
        self.occupancy.count()
    }

    /// Requests admitted through this replica and not yet finished.
    pub(crate) fn local_in_flight(&self) -> u32 {
        self.occupancy.local_count()
    }

    /// Takes a slot for a request of `class` at `now` if the backend is under its
    /// `max_concurrency` (see [`InFlightGuard::try_admit`](super::InFlightGuard::try_admit)):
    /// what it found, and the class counted (an index in range).
    pub(super) fn admit(
        &self,
        class: Option<usize>,
        now: Instant,
    ) -> Option<(Admitted, Option<usize>)> {
        let limit = self.config.max_concurrency.unwrap_or(u32::MAX);
        let admitted_with = self.occupancy.try_admit(now, limit)?;
        let class = class.filter(|c| *c < self.class_in_flight.len());
        if let Some(c) = class {
            self.class_in_flight[c].fetch_add(1, Ordering::Relaxed);
        }
        Some((admitted_with, class))
    }

    /// Releases the slot of a request admitted with `class`; `waiting_since` is its admission
    /// time if it never had a first token.
    pub(super) fn release(&self, waiting_since: Option<Instant>, class: Option<usize>) {
        self.occupancy.release(Instant::now(), waiting_since);
        if let Some(c) = class {
            self.class_in_flight[c].fetch_sub(1, Ordering::Relaxed);
        }
        self.line.released();
    }

    /// It may take more requests than before (its ramp grew, or another replica's requests
    /// there ended): requests waiting in line look.
    pub(crate) fn room_grew(&self) {
        self.line.released();
    }

    /// Adds what one finished request taught us to the curve of `model` (its metrics:
    /// [`Self::count`]), and hands it to the other replicas.
    pub fn record(&self, model: &str, obs: &Observation) {
        let model = self.with_curve(model, obs.at, |curve| curve.record(obs));
        self.share(model, Learned::Ended(*obs));
    }

    /// A request's first token for `model`: its TTFT, learned as soon as it is known, and
    /// handed to the other replicas.
    pub fn first_token(&self, model: &str, start: &FirstToken) {
        let model = self.with_curve(model, start.at, |curve| curve.first_token(start));
        self.note_ttft(start.ttft);
        self.share(model, Learned::FirstToken(*start));
    }

    /// Rebuilds the curves whose first tokens from a drained queue are due to be forgotten
    /// ([`Curve::forget_due`]); looks without locking for writing when none is.
    pub(crate) fn forget_drained_queues(&self, now: Instant) {
        if self.curves.iter().any(|c| c.value().forgets_by(now)) {
            for mut curve in self.curves.iter_mut() {
                curve.value_mut().forget_due(now);
                self.publish(curve.key(), curve.value());
            }
        }
    }

    /// What another replica learned of this backend for `model`: the curve takes it as its
    /// own (the metrics and the baselines' EWMAs stay this replica's).
    pub(crate) fn learn(&self, model: &str, learned: &Learned) {
        // A peer's sample is older than now: the model is refreshed as of now, not of it.
        let now = Instant::now();
        match learned {
            Learned::FirstToken(start) => self.with_curve(model, start.at, |curve| {
                curve.first_token(start);
                curve.refresh_due(now);
            }),
            Learned::Ended(obs) => self.with_curve(model, obs.at, |curve| {
                curve.record(obs);
                curve.refresh_due(now);
            }),
        };
    }

    /// A prompt with `prefix` was routed here: the peers' indexes learn it too, at the coarse
    /// step (a cluster's replicas route one conversation's turns wherever the load balancer
    /// sends them).
    pub(crate) fn share_prefix(&self, prefix: &RequestPrefix) {
        if let Some(outbox) = &self.outbox
            && !(prefix.hashes.is_empty() && prefix.hint.is_none())
        {
            outbox.send(Event::Routed {
                backend: Arc::clone(&self.config.name),
                hashes: crate::prefix::coarse(&prefix.hashes).collect(),
                hint: prefix.hint,
            });
        }
    }

    /// Whether a slot near this backend's edge is claimed fleet-wide before a request goes
    /// ([`claim`](super::claim)): in a cluster whose replica has peers.
    pub(crate) fn claims_slots(&self) -> bool {
        self.outbox.as_ref().is_some_and(|o| o.claims.shared())
    }

    /// Claims a slot here for a request already admitted through this replica, with at most
    /// `limit` in flight fleet-wide (see [`claim`](super::claim)).
    pub(crate) async fn claim(&self, limit: u32) -> Claimed {
        match &self.outbox {
            Some(outbox) => outbox.claims.claim(&self.config.name, limit).await,
            None => Claimed::Unanswered,
        }
    }

    fn share(&self, model: Arc<str>, learned: Learned) {
        if let Some(outbox) = &self.outbox {
            outbox.send(Event::Learned {
                backend: Arc::clone(&self.config.name),
                model,
                learned,
            });
        }
    }

    /// Runs `f` on the curve of `model` (as [tracked](Self::tracked)), made if it is the first
    /// sample; returns the curve's key.
    fn with_curve(&self, model: &str, now: Instant, f: impl FnOnce(&mut Curve)) -> Arc<str> {
        // Map guards live only for these statements: never across an await.
        let found = match self.curves.get_mut(model) {
            Some(curve) => Some(curve),
            None => self.curves.get_mut(self.tracked(model)),
        };
        match found {
            Some(mut curve) => {
                f(&mut curve);
                self.publish(curve.key(), &curve);
                Arc::clone(curve.key())
            }
            None => {
                let model = self.tracked(model);
                let mut curve = self
                    .curves
                    .entry(Arc::from(model))
                    .or_insert_with(|| match &self.config.prior {
                        Some(points) => Curve::seeded(self.half_life_s, points, now),
                        None => Curve::new(self.half_life_s),
                    });
                f(&mut curve);
                self.publish(curve.key(), &curve);
                Arc::clone(curve.key())
            }
        }
    }

    /// Counts one response for `model` and `class` in the metrics, with its timings when it
    /// was a stream that succeeded.
    pub(crate) fn count(
        &self,
        model: &str,
        class: &str,
        status: u16,
        outcome: Outcome,
        timed: Option<&(Observation, f64)>,
    ) {
        let counted = |m: &ModelMetrics| {
            if let Some((obs, max_gap_s)) = timed {
                m.record(obs, *max_gap_s);
            }
        };
        // The common case under a read lock: handles exist for this model, class and status
        // (a model folded into `other` finds them on the second look).
        let fast = |model: &str| {
            if let Some(classes) = self.metrics.get(model)
                && let Some(m) = classes.iter().find(|m| m.class() == class)
                && let Some(responses) = m.responses(status, outcome)
            {
                responses.increment(1);
                counted(m);
                return true;
            }
            false
        };
        if fast(model) {
            return;
        }
        let model = self.tracked(model);
        if model == OTHER && fast(model) {
            return;
        }
        let mut classes = self.metrics.entry(Arc::from(model)).or_default();
        let at = match classes.iter().position(|m| m.class() == class) {
            Some(at) => at,
            None => {
                classes.push(ModelMetrics::new(&self.config.name, model, class));
                classes.len() - 1
            }
        };
        let m = &mut classes[at];
        m.add_responses(status, outcome).increment(1);
        counted(m);
    }

    /// Notes how an upstream exchange went (see [`Health::note_upstream`]); logs and counts an
    /// ejection.
    pub(crate) fn note_upstream(&self, ok: bool) {
        let ejected = self
            .health
            .note_upstream(ok, self.config.ejection, Instant::now());
        if let Some(period) = ejected {
            if let Some(outbox) = &self.outbox {
                outbox.send(Event::Ejected {
                    backend: Arc::clone(&self.config.name),
                    until: Instant::now() + period,
                });
            }
            crate::telemetry::count_ejection(&self.config.name);
            tracing::warn!(
                backend = &*self.config.name,
                seconds = period.as_secs_f64(),
                "backend ejected after upstream failures"
            );
        }
    }

    /// Notes a 429 from the backend (see [`Health::note_rate_limited`]).
    pub(crate) fn note_rate_limited(&self, retry_after: Option<std::time::Duration>) {
        let until = self.health.note_rate_limited(retry_after, Instant::now());
        if let Some(outbox) = &self.outbox {
            outbox.send(Event::Cooling {
                backend: Arc::clone(&self.config.name),
                until,
            });
        }
    }

    /// Another replica ejected this backend until `until`.
    pub(crate) fn ejected_elsewhere(&self, until: Instant) {
        self.health.eject_until(Instant::now(), until);
    }

    /// Another replica saw a 429 from this backend: it cools down until `until`.
    pub(crate) fn cooling_elsewhere(&self, until: Instant) {
        self.health.cool_until(until);
    }

    /// Takes requests as of `now`: neither ejected nor cooling down after a 429.
    pub(crate) fn is_healthy(&self, now: Instant) -> bool {
        self.health.is_healthy(now)
    }

    /// Its health now, with the seconds that state has left.
    pub(crate) fn health(&self) -> (State, f64) {
        self.health.state(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(extra: &str) -> Arc<Backend> {
        let text = format!(
            "backends:\n- {{name: b, url: 'http://127.0.0.1:1', dialect: openai, models: {{a: a, b: b}}{extra}}}\n"
        );
        let config = crate::config::parse(&text, |_| None).unwrap();
        let line = Arc::new(Line::new(1));
        Backend::new(config.backends[0].clone(), 300.0, 1, line, None).unwrap()
    }

    fn completed(at: Instant) -> Observation {
        Observation {
            at,
            outcome: Outcome::Completed,
            ttft: Some(0.05),
            tpot: Some(0.01),
            output_tokens: 64,
            estimated: false,
            prompt_tokens: Some(64),
            concurrency: Some(1.0),
            neighbours: 0.0,
        }
    }

    /// What a decision reads by a model's place among the backend's names.
    fn same(a: Option<Arc<Model>>, b: Option<Arc<Model>>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a, &b),
            (None, None) => true,
            _ => false,
        }
    }

    #[test]
    fn a_decision_reads_the_fit_a_curve_last_published_under_its_name() {
        let b = backend("");
        assert!(
            b.fitted(0).is_none() && b.fitted(1).is_none(),
            "nothing seen"
        );
        let now = Instant::now();
        b.record("b", &completed(now));
        assert!(b.fitted(1).is_some());
        assert!(same(b.fitted(1), b.model("b")));
        assert!(b.fitted(0).is_none(), "`a` was not observed");
        // A reload's new backend takes the curves over, and what a decision reads with them.
        let reloaded = backend("");
        reloaded.adopt(&b);
        assert!(same(reloaded.fitted(1), reloaded.model("b")));
        assert!(reloaded.fitted(1).is_some());
    }

    #[test]
    fn a_name_not_yet_observed_reads_the_prior() {
        let b = backend(", prior: {points: [{concurrency: 1, per_user_tps: 50, ttft_ms: 100}]}");
        assert!(b.fitted(0).is_some());
        assert!(same(b.fitted(0), b.model("a")));
        b.record("a", &completed(Instant::now()));
        assert!(
            same(b.fitted(0), b.model("a")),
            "the curve moved on from it"
        );
        assert!(same(b.fitted(1), b.model("b")));
    }
}
