//! A backend at runtime: its config, its client, and its in-flight count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::client::{self, UpstreamClient};
use crate::config::BackendConfig;

/// One upstream provider, shared by every request routed to it.
#[derive(Debug)]
pub struct Backend {
    /// Its validated config.
    pub config: BackendConfig,
    /// Its pooled client.
    pub client: UpstreamClient,
    in_flight: AtomicU32,
}

impl Backend {
    /// Builds the client for `config`.
    pub fn new(config: BackendConfig) -> Result<Arc<Self>, String> {
        let client = client::build(&config)?;
        Ok(Arc::new(Self {
            config,
            client,
            in_flight: AtomicU32::new(0),
        }))
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Admits a request if the backend is under its `max_concurrency`. The guard releases the
    /// slot when dropped, which the response body does when it ends, fails or is dropped.
    pub fn try_admit(self: &Arc<Self>) -> Option<InFlightGuard> {
        let limit = self.config.max_concurrency.unwrap_or(u32::MAX);
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(InFlightGuard(Arc::clone(self)))
    }
}

/// One admitted request; releases its slot on drop.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Backend>);

impl InFlightGuard {
    /// The backend this request was admitted to.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
