//! A per-minute limit as a token bucket: it holds up to the limit, refills the limit over a
//! minute, and is drawn at admission by an estimate that the request's end settles. Settling
//! above the estimate may take it below zero: the debt is refilled before the key is admitted
//! again, so that over any minute what a key used stays within its limit plus what was in
//! flight.

use std::time::Duration;

use tokio::time::Instant;

/// A limit per minute, its level and when that was last brought up to date.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    per_minute: f64,
    level: f64,
    at: Instant,
    /// The share of the refill that is this replica's (1 alone; 1/R of R replicas sharing the
    /// bucket through the cluster).
    share: f64,
}

/// One limit's state for the response headers: the limit, what is left, and how long until
/// the bucket is full again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Allowance {
    /// Per minute.
    pub limit: u64,
    /// What may still be used now.
    pub remaining: u64,
    /// Until the full limit is available again.
    #[serde(serialize_with = "seconds")]
    pub reset: Duration,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Bucket {
    /// A full bucket of `per_minute`.
    pub(crate) fn full(per_minute: u64, now: Instant) -> Self {
        let per_minute = per_minute as f64;
        Self {
            per_minute,
            level: per_minute,
            at: now,
            share: 1.0,
        }
    }

    /// Refilled up to `now`.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level =
            (self.level + elapsed * self.share * self.per_minute / 60.0).min(self.per_minute);
        self.at = self.at.max(now);
    }

    /// How long until `amount` may be drawn (`None`: now). A draw larger than the whole limit
    /// waits for a full bucket instead of for ever.
    ///
    /// A replica's part of a shared bucket may stay below one request's need for ever (a
    /// bucket of 50 among 100 replicas): there, what is left is drawn by chance, a request
    /// admitted with the probability `level / need`, so that the replicas together admit what
    /// the fleet's bucket holds on average and none starves.
    pub(crate) fn wait_for(&mut self, amount: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let need = (amount as f64).min(self.per_minute);
        if self.level >= need
            || (self.share < 1.0 && self.level > 0.0 && rand::random::<f64>() * need < self.level)
        {
            return None;
        }
        let rate = self.share * self.per_minute / 60.0;
        Some(Duration::from_secs_f64((need - self.level) / rate))
    }

    /// Draws `amount` (after [`Bucket::wait_for`] said it fits).
    pub(crate) fn draw(&mut self, amount: u64) {
        self.level -= amount as f64;
    }

    /// Gives back `amount` (an estimate above what was used), or draws more where negative.
    pub(crate) fn settle(&mut self, amount: f64, now: Instant) {
        self.refill(now);
        self.level = (self.level + amount).min(self.per_minute);
    }

    /// The limit changed to `per_minute`: what was used stays used.
    pub(crate) fn resize(&mut self, per_minute: u64, now: Instant) {
        self.refill(now);
        let used = self.per_minute - self.level;
        self.per_minute = per_minute as f64;
        self.level = self.per_minute - used;
    }

    /// The fleet's bucket stood at `fleet_level` when `replicas` share it: this replica may
    /// use its `1 / replicas` part of that until the next sync, refilled at its part of the
    /// rate, so that together the replicas admit no more than the fleet's bucket holds.
    pub(crate) fn share_fleet(&mut self, fleet_level: f64, replicas: usize, now: Instant) {
        let replicas = replicas.max(1) as f64;
        self.at = self.at.max(now);
        self.share = 1.0 / replicas;
        self.level = (fleet_level / replicas).min(self.per_minute);
    }

    /// Alone again (the cluster's Redis away): the whole limit, refilled at the whole rate.
    pub(crate) fn alone(&mut self, now: Instant) {
        self.refill(now);
        self.share = 1.0;
    }

    /// The state at `now`.
    pub(crate) fn allowance(&mut self, now: Instant) -> Allowance {
        self.refill(now);
        Allowance {
            limit: self.per_minute as u64,
            remaining: self.level.max(0.0) as u64,
            reset: Duration::from_secs_f64((self.per_minute - self.level) * 60.0 / self.per_minute),
        }
    }
}
