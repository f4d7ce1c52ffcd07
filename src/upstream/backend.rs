//! A backend at runtime: its config, its client, its in-flight count with the time integral
//! behind experienced concurrency, and its curves (one per client model name).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use super::client::{self, UpstreamClient};
use crate::config::BackendConfig;
use crate::curve::{Curve, Model, Observation, Occupancy};
use crate::router::queue::Line;
use crate::telemetry::ModelMetrics;

/// One upstream provider, shared by every request routed to it.
#[derive(Debug)]
pub struct Backend {
    /// Its validated config.
    pub config: BackendConfig,
    /// Its pooled client.
    pub client: UpstreamClient,
    /// In flight and its integral.
    pub occupancy: Occupancy,
    /// Curves by client model name.
    pub curves: DashMap<Arc<str>, Curve>,
    /// Metric handles by client model name and class, built once each.
    metrics: DashMap<(Arc<str>, Arc<str>), ModelMetrics>,
    /// Upstream failures in a row (connect errors, 5xx, broken streams); a success resets it.
    failures_in_a_row: AtomicU32,
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
        let client = client::build(&config)?;
        let now = Instant::now();
        let prior = config
            .prior
            .as_deref()
            .map(|points| Curve::seeded(half_life_s, points, now));
        let curves = DashMap::new();
        if let Some(prior) = &prior {
            for model in config.models.aliases.keys() {
                curves.insert(Arc::from(model.as_str()), prior.clone());
            }
        }
        Ok(Arc::new(Self {
            config,
            client,
            occupancy: Occupancy::default(),
            curves,
            metrics: DashMap::new(),
            failures_in_a_row: AtomicU32::new(0),
            half_life_s,
            prior,
            class_in_flight: (0..classes).map(|_| AtomicU32::new(0)).collect(),
            ttft_ewma: AtomicU64::new(0),
            ttft_peak_ewma: AtomicU64::new(0),
            line,
        }))
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
        let admitted_with = self.occupancy.try_admit(Instant::now(), limit)?;
        let class = class.filter(|c| *c < self.class_in_flight.len());
        if let Some(c) = class {
            self.class_in_flight[c].fetch_add(1, Ordering::Relaxed);
        }
        Some(InFlightGuard {
            backend: Arc::clone(self),
            admitted_with,
            class,
        })
    }

    /// Adds what one request taught us to the curve of `model` and the metrics of `model` and
    /// `class`.
    pub fn record(&self, model: &str, class: &str, obs: &Observation, max_gap_s: f64) {
        // Map guards live only for these statements: never across an await.
        match self.curves.get_mut(model) {
            Some(mut curve) => curve.record(obs),
            None => self
                .curves
                .entry(Arc::from(model))
                .or_insert_with(|| match &self.config.prior {
                    Some(points) => Curve::seeded(self.half_life_s, points, obs.at),
                    None => Curve::new(self.half_life_s),
                })
                .record(obs),
        }
        if let Some(ttft) = obs.ttft {
            self.note_ttft(ttft);
        }
        let key = (Arc::from(model), Arc::from(class));
        self.metrics
            .entry(key)
            .or_insert_with(|| ModelMetrics::new(&self.config.name, model, class))
            .observe(obs, max_gap_s);
    }

    /// Notes how an upstream exchange went, for [`Backend::health`].
    pub fn note_upstream(&self, ok: bool) {
        if ok {
            self.failures_in_a_row.store(0, Ordering::Relaxed);
        } else {
            self.failures_in_a_row.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Not failing.
    pub fn is_healthy(&self) -> bool {
        self.failures_in_a_row.load(Ordering::Relaxed) < FAILING_AFTER
    }

    /// `healthy`, or `failing` after [`FAILING_AFTER`] upstream failures in a row (until the next
    /// success). Reported only: ejecting a failing backend is the resilience layer's job.
    pub fn health(&self) -> &'static str {
        if self.failures_in_a_row.load(Ordering::Relaxed) >= FAILING_AFTER {
            "failing"
        } else {
            "healthy"
        }
    }
}

/// Upstream failures in a row after which a backend reports itself failing.
pub const FAILING_AFTER: u32 = 3;

/// One admitted request; releases its slot on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    backend: Arc<Backend>,
    admitted_with: u32,
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
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.backend.occupancy.release(Instant::now());
        if let Some(c) = self.class {
            self.backend.class_in_flight[c].fetch_sub(1, Ordering::Relaxed);
        }
        self.backend.line.released();
    }
}
