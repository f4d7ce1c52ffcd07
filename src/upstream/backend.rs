//! A backend at runtime: its config, its connection pool, its in-flight count with the time
//! integral behind experienced concurrency, and its curves (one per client model name).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use super::client;
use super::pool::Pool;
use crate::config::BackendConfig;
use crate::curve::{Curve, FirstToken, Model, Observation, Occupancy, Outcome, Reading};
use crate::router::queue::Line;
use crate::telemetry::ModelMetrics;

/// A map keyed by client model name, read several times per request: hashed with foldhash, not
/// SipHash (its keys are the configured model names, so flooding it is not a concern, and the
/// seed is random per process all the same).
pub type ByModel<V> = DashMap<Arc<str>, V, foldhash::fast::RandomState>;

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
    /// Curves by client model name.
    pub curves: ByModel<Curve>,
    /// Metric handles by client model name, then by class (a handful: found by a scan, with no
    /// key to allocate per request), built once each.
    metrics: ByModel<Vec<ModelMetrics>>,
    /// Upstream failures in a row (connect errors, 5xx, broken streams); a success resets it.
    failures_in_a_row: AtomicU32,
    /// Outlier ejection and 429 cooldown.
    outlier: Outlier,
    /// Half-life of curve observations, seconds.
    pub half_life_s: f64,
    /// The prior as a curve, for models not observed yet.
    prior: Option<Curve>,
    /// In flight per class index.
    class_in_flight: Box<[AtomicU32]>,
    /// TTFT EWMAs (f64 bits), for the baselines.
    ttft_ewma: AtomicU64,
    ttft_peak_ewma: AtomicU64,
    /// Told when a slot frees, for requests waiting in line.
    line: Arc<Line>,
}

/// Weight of a new TTFT in the baselines' EWMAs.
const EWMA_ALPHA: f64 = 0.1;

impl Backend {
    /// Builds the client for `config`; `classes` is the number of traffic classes, `line` the
    /// router's wait line.
    pub fn new(
        config: BackendConfig,
        half_life_s: f64,
        classes: usize,
        line: Arc<Line>,
    ) -> Result<Arc<Self>, String> {
        let pool = client::build(&config)?;
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
        Ok(Arc::new(Self {
            name_header: http::HeaderValue::from_str(&config.name).ok(),
            config,
            pool,
            occupancy: Occupancy::default(),
            curves,
            metrics: ByModel::default(),
            failures_in_a_row: AtomicU32::new(0),
            outlier: Outlier::new(now),
            half_life_s,
            prior,
            class_in_flight: (0..classes).map(|_| AtomicU32::new(0)).collect(),
            ttft_ewma: AtomicU64::new(0),
            ttft_peak_ewma: AtomicU64::new(0),
            line,
        }))
    }

    /// Takes over the curves of `old` (a reload changed this backend's config, not what it is).
    pub fn adopt_curves(&self, old: &Self) {
        for entry in &old.curves {
            self.curves
                .insert(Arc::clone(entry.key()), entry.value().clone());
        }
    }

    /// The fitted curve of `model` (or the prior's, before it has been observed).
    pub fn model(&self, model: &str) -> Option<Arc<Model>> {
        match self.curves.get(model) {
            Some(curve) => curve.model().cloned(),
            None => self.prior.as_ref()?.model().cloned(),
        }
    }

    /// Requests of class `class` in flight.
    pub fn class_in_flight(&self, class: usize) -> u32 {
        self.class_in_flight
            .get(class)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Recent TTFT, exponentially weighted; 0 before the first.
    pub fn ttft_ewma(&self) -> f64 {
        f64::from_bits(self.ttft_ewma.load(Ordering::Relaxed))
    }

    /// Recent TTFT, jumping to any higher sample and decaying slowly (peak EWMA).
    pub fn ttft_peak_ewma(&self) -> f64 {
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

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> u32 {
        self.occupancy.count()
    }

    /// Admits a request if the backend is under its `max_concurrency`. The guard releases the
    /// slot when dropped, which the response body does when it ends, fails or is dropped.
    pub fn try_admit(self: &Arc<Self>, class: Option<usize>) -> Option<InFlightGuard> {
        let limit = self.config.max_concurrency.unwrap_or(u32::MAX);
        let now = Instant::now();
        let admitted_with = self.occupancy.try_admit(now, limit)?;
        let class = class.filter(|c| *c < self.class_in_flight.len());
        if let Some(c) = class {
            self.class_in_flight[c].fetch_add(1, Ordering::Relaxed);
        }
        Some(InFlightGuard {
            backend: Arc::clone(self),
            admitted_with,
            admitted: now,
            waiting: true,
            class,
        })
    }

    /// Adds what one finished request taught us to the curve of `model` (its metrics:
    /// [`Self::count`]).
    pub fn record(&self, model: &str, obs: &Observation) {
        self.with_curve(model, obs.at, |curve| curve.record(obs));
    }

    /// A request's first token for `model`: its TTFT, learned as soon as it is known.
    pub fn first_token(&self, model: &str, start: &FirstToken) {
        self.with_curve(model, start.at, |curve| curve.first_token(start));
        self.note_ttft(start.ttft);
    }

    fn with_curve(&self, model: &str, now: Instant, f: impl FnOnce(&mut Curve)) {
        // Map guards live only for these statements: never across an await.
        match self.curves.get_mut(model) {
            Some(mut curve) => f(&mut curve),
            None => f(&mut self.curves.entry(Arc::from(model)).or_insert_with(|| {
                match &self.config.prior {
                    Some(points) => Curve::seeded(self.half_life_s, points, now),
                    None => Curve::new(self.half_life_s),
                }
            })),
        }
    }

    /// Counts one response for `model` and `class` in the metrics, with its timings when it
    /// was a stream that succeeded.
    pub fn count(
        &self,
        model: &str,
        class: &str,
        status: u16,
        outcome: Outcome,
        timed: Option<&(Observation, f64)>,
    ) {
        let counted = |m: &ModelMetrics| {
            if let Some((obs, max_gap_s)) = timed {
                m.observe(obs, *max_gap_s);
            }
        };
        // The common case under a read lock: handles exist for this model, class and status.
        if let Some(classes) = self.metrics.get(model)
            && let Some(m) = classes.iter().find(|m| m.class() == class)
            && let Some(responses) = m.responses(status, outcome)
        {
            responses.increment(1);
            counted(m);
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

    /// Notes how an upstream exchange went. `ejection.after_failures` failures in a row eject
    /// the backend for `ejection.base`, doubling with each ejection that follows a failed probe
    /// (up to `ejection.max`); once the period ends, requests are let through again (half-open) and
    /// the first result decides: a success clears everything, a failure ejects at once for
    /// longer.
    pub fn note_upstream(&self, ok: bool) {
        let now = Instant::now();
        if ok {
            // A success (a probe, or the only backend tried anyway) ends any ejection.
            self.failures_in_a_row.store(0, Ordering::Relaxed);
            self.outlier.ejections.store(0, Ordering::Relaxed);
            self.outlier.ejected_until_ms.store(0, Ordering::Relaxed);
            return;
        }
        let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        let probing = self.outlier.ejections.load(Ordering::Relaxed) > 0
            && self.outlier.ejected_until(now).is_none();
        let rule = self.config.ejection;
        if failures >= rule.after_failures || probing {
            let k = self
                .outlier
                .ejections
                .fetch_add(1, Ordering::Relaxed)
                .min(16);
            let period = rule.base.saturating_mul(1 << k).min(rule.max);
            self.outlier.eject(now, period);
            self.failures_in_a_row.store(0, Ordering::Relaxed);
            crate::telemetry::count_ejection(&self.config.name);
            tracing::warn!(
                backend = &*self.config.name,
                seconds = period.as_secs_f64(),
                "backend ejected after upstream failures"
            );
        }
    }

    /// Notes a 429 from the backend: no requests go there for `retry_after` (its `Retry-After`,
    /// else a second; at most a minute).
    pub fn note_rate_limited(&self, retry_after: Option<std::time::Duration>) {
        let period = retry_after
            .unwrap_or(std::time::Duration::from_secs(1))
            .min(std::time::Duration::from_secs(60));
        self.outlier.cool(Instant::now(), period);
    }

    /// Takes requests as of `now`: neither ejected nor cooling down after a 429.
    pub fn is_healthy(&self, now: Instant) -> bool {
        self.outlier.ejected_until(now).is_none() && self.outlier.cooling_until(now).is_none()
    }

    /// `healthy`, `ejected` (after upstream failures) or `cooling` (after a 429), with the
    /// seconds left.
    pub fn health(&self) -> (&'static str, f64) {
        let now = Instant::now();
        let left = |until: Instant| until.saturating_duration_since(now).as_secs_f64();
        if let Some(until) = self.outlier.ejected_until(now) {
            ("ejected", left(until))
        } else if let Some(until) = self.outlier.cooling_until(now) {
            ("cooling", left(until))
        } else {
            ("healthy", 0.0)
        }
    }
}

/// Ejection and cooldown deadlines, as milliseconds since the backend was built (atomics: read
/// on every routing decision).
#[derive(Debug)]
struct Outlier {
    born: Instant,
    ejected_until_ms: AtomicU64,
    cooling_until_ms: AtomicU64,
    /// Ejections since the last success.
    ejections: AtomicU32,
}

impl Outlier {
    fn new(born: Instant) -> Self {
        Self {
            born,
            ejected_until_ms: AtomicU64::new(0),
            cooling_until_ms: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_millis()).unwrap_or(u64::MAX)
    }

    fn until(&self, slot: &AtomicU64, now: Instant) -> Option<Instant> {
        let until = slot.load(Ordering::Relaxed);
        (until > self.ms(now)).then(|| self.born + std::time::Duration::from_millis(until))
    }

    fn ejected_until(&self, now: Instant) -> Option<Instant> {
        self.until(&self.ejected_until_ms, now)
    }

    fn cooling_until(&self, now: Instant) -> Option<Instant> {
        self.until(&self.cooling_until_ms, now)
    }

    fn eject(&self, now: Instant, period: std::time::Duration) {
        self.ejected_until_ms
            .store(self.ms(now + period), Ordering::Relaxed);
    }

    fn cool(&self, now: Instant, period: std::time::Duration) {
        self.cooling_until_ms
            .fetch_max(self.ms(now + period), Ordering::Relaxed);
    }
}

/// One admitted request; releases its slot on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    backend: Arc<Backend>,
    admitted_with: u32,
    admitted: Instant,
    /// Still counted among the backend's requests waiting for a first token.
    waiting: bool,
    class: Option<usize>,
}

impl InFlightGuard {
    /// The backend this request was admitted to.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// In flight at admission, this request included.
    pub fn admitted_with(&self) -> u32 {
        self.admitted_with
    }

    /// It will have no first token (not a stream): no longer waiting for one.
    pub fn stop_waiting(&mut self) {
        if std::mem::take(&mut self.waiting) {
            self.backend.occupancy.stop_waiting(self.admitted);
        }
    }

    /// Its first token came at `now`: no longer waiting; the occupancy integral as of then.
    pub fn first_token(&mut self, now: Instant) -> Reading {
        if std::mem::take(&mut self.waiting) {
            self.backend.occupancy.first_token(self.admitted, now)
        } else {
            self.backend.occupancy.read(now)
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let waiting_since = std::mem::take(&mut self.waiting).then_some(self.admitted);
        self.backend
            .occupancy
            .release(Instant::now(), waiting_since);
        if let Some(c) = self.class {
            self.backend.class_in_flight[c].fetch_sub(1, Ordering::Relaxed);
        }
        self.backend.line.released();
    }
}
