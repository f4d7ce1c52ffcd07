//! The in-flight slot of one admitted request: counted in its backend's occupancy from admission
//! until the guard is dropped, which the response body does when it ends, fails or is dropped
//! (tower-http's `in_flight_requests` defines in-flight the same way).

use std::sync::Arc;

use tokio::time::Instant;

use super::backend::Backend;
use crate::curve::Reading;

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
    /// The slot of a request admitted to `backend` at `admitted`, `admitted_with` in flight
    /// there then (itself included).
    pub(super) fn new(
        backend: Arc<Backend>,
        admitted_with: u32,
        admitted: Instant,
        class: Option<usize>,
    ) -> Self {
        Self {
            backend,
            admitted_with,
            admitted,
            waiting: true,
            class,
        }
    }

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
        self.backend.release(waiting_since, self.class);
    }
}
