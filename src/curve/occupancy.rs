//! Experienced concurrency: a backend's in-flight count and its integral over time; and the
//! requests still waiting for their first token, with how long they have waited.
//!
//! Admit and release update both in O(1). A request reads the integral when its first content
//! arrives and when its stream ends; the difference over the elapsed time is the mean number of
//! requests that shared the backend with it while it decoded. Only those two reads and the
//! admit/release take the (uncontended, never held across an await) lock — nothing per chunk.

use std::sync::Mutex;

use tokio::time::Instant;

/// In-flight count and its time integral, for one backend.
#[derive(Debug)]
pub struct Occupancy {
    state: Mutex<State>,
    /// Origin of the admission times summed in [`State::waiting_since`].
    epoch: Instant,
}

#[derive(Debug, Clone, Copy)]
struct State {
    count: u32,
    /// Request-seconds accumulated up to `last`.
    area: f64,
    last: Instant,
    /// Admitted requests whose first token has not come yet.
    waiting: u32,
    /// Sum of their admission times, seconds after `epoch`: their mean age in O(1).
    waiting_since: f64,
}

/// A reading of the integral.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Request-seconds since the backend was created.
    pub area: f64,
    /// In flight at the moment of reading.
    pub count: u32,
    /// When it was read.
    pub at: Instant,
}

impl Reading {
    /// The same integral as it stood at `earlier` (no admit or release between): what accrued
    /// since then, `count` requests for the time between, taken back.
    pub fn rewound_to(&self, earlier: Instant) -> Reading {
        Reading {
            area: self.area - f64::from(self.count) * (self.at - earlier).as_secs_f64(),
            count: self.count,
            at: earlier,
        }
    }

    /// Mean in-flight count between `self` and a later reading.
    pub fn mean_until(&self, later: &Reading) -> Option<f64> {
        let secs = (later.at - self.at).as_secs_f64();
        (secs > 0.0).then(|| (later.area - self.area) / secs)
    }
}

impl State {
    /// One request admitted `at` seconds after the epoch no longer waits for a first token.
    fn unwait(&mut self, at: f64) {
        if self.waiting > 0 {
            self.waiting -= 1;
            self.waiting_since = if self.waiting == 0 {
                0.0
            } else {
                self.waiting_since - at
            };
        }
    }

    fn reading(&self, now: Instant) -> Reading {
        Reading {
            area: self.area,
            count: self.count,
            at: now,
        }
    }
}

impl Default for Occupancy {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl Occupancy {
    /// Nothing in flight as of `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            state: Mutex::new(State {
                count: 0,
                area: 0.0,
                last: now,
                waiting: 0,
                waiting_since: 0.0,
            }),
            epoch: now,
        }
    }

    fn since_epoch(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.epoch).as_secs_f64()
    }

    fn update<T>(&self, now: Instant, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now > state.last {
            state.area += f64::from(state.count) * (now - state.last).as_secs_f64();
            state.last = now;
        }
        f(&mut state)
    }

    /// One more in flight (and waiting for its first token) if fewer than `limit` are; returns
    /// the count including it.
    pub fn try_admit(&self, now: Instant, limit: u32) -> Option<u32> {
        let at = self.since_epoch(now);
        self.update(now, |s| {
            (s.count < limit).then(|| {
                s.count += 1;
                s.waiting += 1;
                s.waiting_since += at;
                s.count
            })
        })
    }

    /// The request admitted at `admitted` stopped waiting: it will have no first token (not a
    /// stream).
    pub fn stop_waiting(&self, admitted: Instant) {
        let at = self.since_epoch(admitted);
        self.update(Instant::now(), |s| s.unwait(at));
    }

    /// The first token of the request admitted at `admitted` came at `now`: it stops waiting,
    /// and the integral is read for its experienced concurrency (one lock for both).
    pub fn first_token(&self, admitted: Instant, now: Instant) -> Reading {
        let at = self.since_epoch(admitted);
        self.update(now, |s| {
            s.unwait(at);
            s.reading(now)
        })
    }

    /// One fewer in flight; `waiting_since` is its admission time if it never stopped waiting.
    pub fn release(&self, now: Instant, waiting_since: Option<Instant>) {
        let at = waiting_since.map(|t| self.since_epoch(t));
        self.update(now, |s| {
            s.count = s.count.saturating_sub(1);
            if let Some(at) = at {
                s.unwait(at);
            }
        });
    }

    /// How long the requests still waiting for their first token have waited, on average, as of
    /// `now`; 0 when none is. A request arriving now queues behind them: in a steady queue it
    /// waits about as long as they have, so this is a floor under its predicted TTFT that needs
    /// no first token to have come back yet.
    pub fn waited(&self, now: Instant) -> f64 {
        let at = self.since_epoch(now);
        self.update(now, |s| {
            if s.waiting == 0 {
                0.0
            } else {
                (at - s.waiting_since / f64::from(s.waiting)).max(0.0)
            }
        })
    }

    /// The integral up to `now`.
    pub fn read(&self, now: Instant) -> Reading {
        self.update(now, |s| s.reading(now))
    }

    /// In flight now. (Reading the count leaves the integral alone: no clock read.)
    pub fn count(&self) -> u32 {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn mean_concurrency_is_the_time_weighted_in_flight_count() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        occ.try_admit(at(0), u32::MAX);
        let start = occ.read(at(0)); // 1 in flight
        occ.try_admit(at(100), u32::MAX); // 2 from 100 ms
        occ.try_admit(at(200), 3); // 3 from 200 ms
        assert_eq!(occ.try_admit(at(200), 3), None, "the limit holds");
        occ.release(at(300), None); // 2 from 300 ms
        let end = occ.read(at(400));
        // 100 ms x 1 + 100 ms x 2 + 100 ms x 3 + 100 ms x 2 = 0.8 request-seconds over 0.4 s.
        assert!((start.mean_until(&end).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(end.count, 2);
    }

    #[test]
    fn waited_is_the_mean_age_of_requests_without_a_first_token() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        assert_eq!(occ.waited(at(0)), 0.0);
        occ.try_admit(at(0), u32::MAX);
        occ.try_admit(at(200), u32::MAX);
        occ.try_admit(at(400), u32::MAX);
        // Ages 1.0, 0.8 and 0.6 s.
        assert!((occ.waited(at(1000)) - 0.8).abs() < 1e-9);
        occ.first_token(at(0), at(1000));
        assert!((occ.waited(at(1000)) - 0.7).abs() < 1e-9);
        occ.stop_waiting(at(200));
        occ.release(at(1000), Some(at(400)));
        assert_eq!(occ.waited(at(1000)), 0.0);
    }
}
