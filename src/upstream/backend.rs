//! A backend at runtime: its config, its client, its in-flight count with the time integral
//! behind experienced concurrency, and its curves (one per client model name).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dashmap::DashMap;
use tokio::time::Instant;

use super::client::{self, UpstreamClient};
use crate::config::BackendConfig;
use crate::curve::{Curve, Observation, Occupancy};
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
}

impl Backend {
    /// Builds the client for `config`.
    pub fn new(config: BackendConfig, half_life_s: f64) -> Result<Arc<Self>, String> {
        let client = client::build(&config)?;
        Ok(Arc::new(Self {
            config,
            client,
            occupancy: Occupancy::default(),
            curves: DashMap::new(),
            metrics: DashMap::new(),
            failures_in_a_row: AtomicU32::new(0),
            half_life_s,
        }))
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> u32 {
        self.occupancy.count()
    }

    /// Admits a request if the backend is under its `max_concurrency`. The guard releases the
    /// slot when dropped, which the response body does when it ends, fails or is dropped.
    pub fn try_admit(self: &Arc<Self>) -> Option<InFlightGuard> {
        let limit = self.config.max_concurrency.unwrap_or(u32::MAX);
        let admitted_with = self.occupancy.try_admit(Instant::now(), limit)?;
        Some(InFlightGuard {
            backend: Arc::clone(self),
            admitted_with,
        })
    }

    /// Adds what one request taught us to the curve of `model` and the metrics of `model` and
    /// `class`.
    pub fn record(&self, model: &str, class: &str, obs: &Observation, max_gap_s: f64) {
        // Map guards live only for these statements: never across an await.
        match self.curves.get_mut(model) {
            Some(mut curve) => curve.record(obs),
            None => self.curves.entry(Arc::from(model)).or_default().record(obs),
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
    }
}
