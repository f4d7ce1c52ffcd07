//! A backend at runtime: its config, its client, its in-flight count with the time integral
//! behind experienced concurrency, and its curves (one per client model name).

use std::sync::Arc;

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
    /// Curve and metric handles by client model name.
    pub curves: DashMap<Arc<str>, ModelState>,
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

    /// Adds what one request taught us to the curve and metrics of `model`.
    pub fn record(&self, model: &str, obs: &Observation, max_gap_s: f64) {
        // The map guard lives only for this call: never across an await.
        let mut state = match self.curves.get_mut(model) {
            Some(state) => state,
            None => self
                .curves
                .entry(Arc::from(model))
                .or_insert_with(|| ModelState {
                    curve: Curve::default(),
                    metrics: ModelMetrics::new(&self.config.name, model),
                }),
        };
        state.curve.record(obs);
        state.metrics.observe(obs, max_gap_s);
    }
}

/// What a backend keeps per client model.
#[derive(Debug)]
pub struct ModelState {
    /// The curve.
    pub curve: Curve,
    /// Metric handles, built once.
    pub metrics: ModelMetrics,
}

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
