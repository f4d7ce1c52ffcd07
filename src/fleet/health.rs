//! A backend's health: outlier ejection after upstream failures in a row, and the cool-down a
//! 429 asks for. Pure: time comes in as an argument; the backend logs and counts what it says.
//!
//! Ejection follows Envoy's outlier detection (consecutive failures eject for a base period that
//! grows with each ejection that follows a failed probe), in the half-open shape of a circuit
//! breaker: once the period ends, requests are let through again and the first result decides.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Ejection;

/// Ejection and cool-down deadlines, as milliseconds since the backend was built (atomics: read
/// on every routing decision), and the failures that lead to them.
#[derive(Debug)]
pub(crate) struct Health {
    born: Instant,
    ejected_until_ms: AtomicU64,
    cooling_until_ms: AtomicU64,
    /// Ejections since the last success.
    ejections: AtomicU32,
    /// Upstream failures in a row (connect errors, 5xx, broken streams); a success resets it.
    failures_in_a_row: AtomicU32,
}

/// What [`Health::state`] says of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Takes requests.
    Healthy,
    /// Ejected after upstream failures.
    Ejected,
    /// Cooling down after a 429.
    Cooling,
}

impl State {
    /// Its name on `/admin/backends`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Ejected => "ejected",
            Self::Cooling => "cooling",
        }
    }
}

impl Health {
    /// Healthy, as of `born`.
    pub(crate) fn new(born: Instant) -> Self {
        Self {
            born,
            ejected_until_ms: AtomicU64::new(0),
            cooling_until_ms: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            failures_in_a_row: AtomicU32::new(0),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_millis()).unwrap_or(u64::MAX)
    }

    fn until(&self, slot: &AtomicU64, now: Instant) -> Option<Instant> {
        let until = slot.load(Ordering::Relaxed);
        // 0: never set, or cleared (most backends, every decision): no clock arithmetic.
        (until != 0 && until > self.ms(now)).then(|| self.born + Duration::from_millis(until))
    }

    /// Until when the backend is ejected, if it is at `now`.
    pub(crate) fn ejected_until(&self, now: Instant) -> Option<Instant> {
        self.until(&self.ejected_until_ms, now)
    }

    /// Until when the backend cools down after a 429, if it does at `now`.
    pub(crate) fn cooling_until(&self, now: Instant) -> Option<Instant> {
        self.until(&self.cooling_until_ms, now)
    }

    /// Notes how an upstream exchange went at `now`. `rule.after_failures` failures in a row
    /// eject the backend for `rule.base`, doubling with each ejection that follows a failed
    /// probe (up to `rule.max`); once the period ends, requests are let through again
    /// (half-open) and the first result decides: a success clears everything, a failure ejects
    /// at once for longer. Returns the period when this note ejected the backend.
    pub(crate) fn note_upstream(&self, ok: bool, rule: Ejection, now: Instant) -> Option<Duration> {
        if ok {
            // A success (a probe, or the only backend tried anyway) ends any ejection.
            self.failures_in_a_row.store(0, Ordering::Relaxed);
            self.ejections.store(0, Ordering::Relaxed);
            self.ejected_until_ms.store(0, Ordering::Relaxed);
            return None;
        }
        let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        let probing =
            self.ejections.load(Ordering::Relaxed) > 0 && self.ejected_until(now).is_none();
        if failures < rule.after_failures && !probing {
            return None;
        }
        let k = self.ejections.fetch_add(1, Ordering::Relaxed).min(16);
        let period = rule.base.saturating_mul(1 << k).min(rule.max);
        self.ejected_until_ms
            .store(self.ms(now + period), Ordering::Relaxed);
        self.failures_in_a_row.store(0, Ordering::Relaxed);
        Some(period)
    }

    /// Notes a 429 at `now`: no requests go there for `retry_after` (its `Retry-After`, else a
    /// second; at most a minute). Returns the end of this cool-down.
    pub(crate) fn note_rate_limited(&self, retry_after: Option<Duration>, now: Instant) -> Instant {
        let period = retry_after
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(60));
        self.cool_until(now + period);
        now + period
    }

    /// Cools down until `until` (or later, if it already does).
    pub(crate) fn cool_until(&self, until: Instant) {
        self.cooling_until_ms
            .fetch_max(self.ms(until), Ordering::Relaxed);
    }

    /// Ejected until `until` (or later, if it already is), as another replica decided at
    /// `now`: its failures count as this one's, so a failed probe afterwards ejects for longer.
    pub(crate) fn eject_until(&self, now: Instant, until: Instant) {
        if until > now {
            self.ejected_until_ms
                .fetch_max(self.ms(until), Ordering::Relaxed);
            self.ejections.fetch_max(1, Ordering::Relaxed);
        }
    }

    /// Takes requests as of `now`: neither ejected nor cooling down after a 429.
    pub(crate) fn is_healthy(&self, now: Instant) -> bool {
        self.ejected_until(now).is_none() && self.cooling_until(now).is_none()
    }

    /// Its state at `now`, with the seconds it has left.
    pub(crate) fn state(&self, now: Instant) -> (State, f64) {
        let left = |until: Instant| until.saturating_duration_since(now).as_secs_f64();
        if let Some(until) = self.ejected_until(now) {
            (State::Ejected, left(until))
        } else if let Some(until) = self.cooling_until(now) {
            (State::Cooling, left(until))
        } else {
            (State::Healthy, 0.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Ejection = Ejection {
        after_failures: 3,
        base: Duration::from_secs(10),
        max: Duration::from_secs(25),
    };

    #[test]
    fn failures_in_a_row_eject_and_a_success_between_them_forgives() {
        let t0 = Instant::now();
        let health = Health::new(t0);
        assert_eq!(health.note_upstream(false, RULE, t0), None);
        assert_eq!(health.note_upstream(false, RULE, t0), None);
        assert_eq!(health.note_upstream(true, RULE, t0), None);
        assert_eq!(health.note_upstream(false, RULE, t0), None);
        assert_eq!(health.note_upstream(false, RULE, t0), None);
        assert!(health.is_healthy(t0));
        assert_eq!(
            health.note_upstream(false, RULE, t0),
            Some(Duration::from_secs(10))
        );
        assert_eq!(health.state(t0), (State::Ejected, 10.0));
        assert!(health.is_healthy(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn a_failed_probe_ejects_at_once_for_twice_as_long_up_to_the_max() {
        let t0 = Instant::now();
        let health = Health::new(t0);
        for _ in 0..3 {
            health.note_upstream(false, RULE, t0);
        }
        // Half-open after 10 s: one failure is enough now, and the period doubles.
        let probe = t0 + Duration::from_secs(10);
        assert_eq!(
            health.note_upstream(false, RULE, probe),
            Some(Duration::from_secs(20))
        );
        let probe = probe + Duration::from_secs(20);
        assert_eq!(
            health.note_upstream(false, RULE, probe),
            Some(Duration::from_secs(25)),
            "capped at the max"
        );
        // A successful probe clears the ejection and its history.
        let probe = probe + Duration::from_secs(25);
        health.note_upstream(true, RULE, probe);
        assert_eq!(health.note_upstream(false, RULE, probe), None);
    }

    #[test]
    fn a_429_cools_the_backend_for_its_retry_after_at_most_a_minute() {
        let t0 = Instant::now();
        let health = Health::new(t0);
        health.note_rate_limited(Some(Duration::from_secs(3)), t0);
        assert_eq!(health.state(t0), (State::Cooling, 3.0));
        // A shorter one later does not shorten it.
        health.note_rate_limited(Some(Duration::from_secs(1)), t0);
        assert!(!health.is_healthy(t0 + Duration::from_millis(2999)));
        assert!(health.is_healthy(t0 + Duration::from_secs(3)));
        health.note_rate_limited(Some(Duration::from_secs(3600)), t0);
        assert_eq!(health.state(t0).1, 60.0);
        health.note_rate_limited(None, t0 + Duration::from_secs(100));
        assert_eq!(health.state(t0 + Duration::from_secs(100)).1, 1.0);
    }
}
