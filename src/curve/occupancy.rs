//! Experienced concurrency: a backend's in-flight count and its integral over time; and the
//! requests still waiting for their first token, with how long they have waited.
//!
//! Admit and release update both in O(1). A request reads the integral when its first content
//! arrives and when its stream ends; the difference over the elapsed time is the mean number of
//! requests that shared the backend with it while it decoded. Only those two reads and the
//! admit/release take the (uncontended, never held across an await) lock — nothing per chunk.
//! What a routing decision reads of every candidate (the count, whether it decodes, whether any
//! request waits) is published in one atomic word as the lock is let go, so a decision over
//! hundreds of backends takes none of their locks for it.
//!
//! With several gateway replicas in front of the same backends, the backend's load is the
//! fleet's: the peers' latest counts ([`PeerLoad`], set by the cluster's sync) are added to this
//! replica's own. The integral then counts the peers too: at each sync, the sum of their own
//! published integrals; between syncs, their count carried forward from it. Admission, the count
//! a request is admitted with, readings and the wait floor are all fleet-wide;
//! [`Occupancy::local`] is what this replica publishes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

/// In-flight count and its time integral, for one backend.
#[derive(Debug)]
pub struct Occupancy {
    state: Mutex<State>,
    /// The fleet-wide count (high half) and requests waiting for a first token (low half), as
    /// the last update left them ([`State::counts`]).
    counts: AtomicU64,
    /// Origin of the admission times summed in [`State::waiting_since`].
    epoch: Instant,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// In flight through this replica.
    count: u32,
    /// This replica's request-seconds accumulated up to `last`.
    area: f64,
    /// Seconds with a request past its first token (decoding), fleet-wide as this replica
    /// knows it (the peers' as of their last round), up to `last`: the time the backend's
    /// engine runs its forward passes on a device it shares. A device runs one engine's pass
    /// at a time, so what an engine costs its neighbours is whether it runs, not how many
    /// requests its pass carries; a request waiting in its queue costs nothing.
    busy_area: f64,
    /// The backend's time each request in flight has been owed, seconds, up to `last`: every
    /// second divided among the requests in flight then, fleet-wide. A request's share of the
    /// engine is its growth from admission to release; the shares add up to the time the
    /// engine held any request.
    share: f64,
    last: Instant,
    /// Admitted requests whose first token has not come yet.
    waiting: u32,
    /// Sum of their admission times, seconds after `epoch`: their mean age in O(1).
    waiting_since: f64,
    /// The peers' load as of the last sync.
    peers: PeerLoad,
    /// When it was set, seconds after `epoch`.
    peers_at: f64,
    /// Readings of the peers' load so far; the last [`RECENT`] of their counts, by number.
    readings: u64,
    recent: [(u64, u32); RECENT],
}

/// The peers' counts kept, reading by reading: about three seconds of rounds at the default
/// 50-ms interval (less with claims between them); a first token later than that learns
/// nothing of requests it did not see.
const RECENT: usize = 64;

/// The load the other replicas put on a backend, as their last publications say.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct PeerLoad {
    /// Their requests in flight.
    pub count: u32,
    /// Their integrals summed, request-seconds, as of the sync (only its growth matters: any
    /// origin will do, as long as it stays the same).
    pub area: f64,
    /// Their requests still waiting for a first token.
    pub waiting: u32,
    /// The sum of those requests' ages, seconds, as of the sync.
    pub waiting_age_s: f64,
}

/// What this replica alone puts on a backend, for its peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LocalLoad {
    /// Requests in flight through this replica.
    pub count: u32,
    /// Its running integral of them, request-seconds.
    pub area: f64,
    /// Those still waiting for a first token.
    pub waiting: u32,
    /// The sum of their ages, seconds.
    pub waiting_age_s: f64,
}

/// What a request found on its backend when it was admitted, fleet-wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Admitted {
    /// In flight, itself included: what its TTFT is bucketed by.
    pub in_flight: u32,
    /// Requests admitted before it and still waiting for their first token: a queue, which a
    /// burst leaves for a moment and a steady load seldom does.
    pub queued_behind: u32,
    /// Of `in_flight`, the other replicas' (as of their last round).
    pub peers: u32,
    /// The number of that reading of their load: the next one shows what they had admitted
    /// and not yet stated.
    pub reading: u64,
    /// [`State::share`] at its admission.
    pub share: f64,
}

/// A reading of the integral.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// Request-seconds since the backend was created.
    pub area: f64,
    /// In flight at the moment of reading.
    pub count: u32,
    /// When it was read.
    pub at: Instant,
    /// The integral of its running (a request decoding): the load it puts on a device it
    /// shares ([`Reading::with_neighbours`]).
    pub busy_area: f64,
    /// 1 where it runs at the moment of reading, else 0.
    pub busy: u32,
    /// The running integrals summed over the backends that share its device (`device:`),
    /// read at the same moment: 0 for a backend that shares none.
    pub neighbours_area: f64,
    /// Those of them running at the moment of reading.
    pub neighbours: u32,
}

impl Reading {
    /// The same integral as it stood at `earlier` (no admit or release between): what accrued
    /// since then, `count` requests for the time between, taken back (the neighbours' too).
    pub(crate) fn rewound_to(&self, earlier: Instant) -> Reading {
        let secs = (self.at - earlier).as_secs_f64();
        Reading {
            area: self.area - f64::from(self.count) * secs,
            count: self.count,
            at: earlier,
            busy_area: self.busy_area - f64::from(self.busy) * secs,
            busy: self.busy,
            neighbours_area: self.neighbours_area - f64::from(self.neighbours) * secs,
            neighbours: self.neighbours,
        }
    }

    /// Mean in-flight count between `self` and a later reading.
    pub(crate) fn mean_until(&self, later: &Reading) -> Option<f64> {
        let secs = (later.at - self.at).as_secs_f64();
        (secs > 0.0).then(|| (later.area - self.area) / secs)
    }

    /// Mean count of the backends sharing its device that ran (had a request decoding) between
    /// `self` and a later reading (0 for a backend that shares none).
    pub(crate) fn neighbours_mean_until(&self, later: &Reading) -> f64 {
        let secs = (later.at - self.at).as_secs_f64();
        if secs > 0.0 {
            ((later.neighbours_area - self.neighbours_area) / secs).max(0.0)
        } else {
            0.0
        }
    }

    /// This reading with the neighbours' readings (`others`, taken at the same moment) added.
    pub(crate) fn with_neighbours(self, others: impl Iterator<Item = Reading>) -> Reading {
        others.fold(self, |r, o| Reading {
            neighbours_area: r.neighbours_area + o.busy_area,
            neighbours: r.neighbours.saturating_add(o.busy),
            ..r
        })
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

    /// The peers' integral `at` seconds after the epoch, as their last round states it.
    fn peers_area(&self, at: f64) -> f64 {
        self.peers.area + f64::from(self.peers.count) * (at - self.peers_at).max(0.0)
    }

    /// In flight fleet-wide.
    fn fleet_count(&self) -> u32 {
        self.count.saturating_add(self.peers.count)
    }

    /// `at` seconds after the epoch (not before the last update).
    fn reading(&self, now: Instant, at: f64) -> Reading {
        Reading {
            area: self.area + self.peers_area(at),
            count: self.fleet_count(),
            at: now,
            busy_area: self.busy_area,
            busy: u32::from(self.fleet_decoding() > 0),
            neighbours_area: 0.0,
            neighbours: 0,
        }
    }

    /// Waiting for their first token, fleet-wide.
    fn fleet_waiting(&self) -> u32 {
        self.waiting.saturating_add(self.peers.waiting)
    }

    /// The fleet-wide count and waiting requests, in one word ([`Counts`]).
    fn counts(&self) -> u64 {
        u64::from(self.fleet_count()) << 32 | u64::from(self.fleet_waiting())
    }

    /// Past their first token, fleet-wide.
    fn fleet_decoding(&self) -> u32 {
        self.fleet_count().saturating_sub(self.fleet_waiting())
    }
}

/// A [`State::counts`] word read back.
#[derive(Debug, Clone, Copy)]
struct Counts {
    in_flight: u32,
    waiting: u32,
}

impl From<u64> for Counts {
    fn from(word: u64) -> Self {
        Self {
            in_flight: (word >> 32) as u32,
            waiting: word as u32,
        }
    }
}

impl Occupancy {
    /// Nothing in flight as of `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            state: Mutex::new(State {
                count: 0,
                area: 0.0,
                busy_area: 0.0,
                share: 0.0,
                last: now,
                waiting: 0,
                waiting_since: 0.0,
                peers: PeerLoad::default(),
                peers_at: 0.0,
                readings: 0,
                recent: [(0, 0); RECENT],
            }),
            counts: AtomicU64::new(0),
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
            let secs = (now - state.last).as_secs_f64();
            state.area += f64::from(state.count) * secs;
            if state.fleet_decoding() > 0 {
                state.busy_area += secs;
            }
            if state.count > 0 {
                state.share += secs / f64::from(state.fleet_count());
            }
            state.last = now;
        }
        let out = f(&mut state);
        self.counts.store(state.counts(), Ordering::Release);
        out
    }

    fn counts(&self) -> Counts {
        Counts::from(self.counts.load(Ordering::Acquire))
    }

    /// One more in flight (and waiting for its first token) if fewer than `limit` are,
    /// fleet-wide; returns what it found, itself included.
    pub(crate) fn try_admit(&self, now: Instant, limit: u32) -> Option<Admitted> {
        let at = self.since_epoch(now);
        self.update(now, |s| {
            (s.fleet_count() < limit).then(|| {
                let queued_behind = s.fleet_waiting();
                s.count += 1;
                s.waiting += 1;
                s.waiting_since += at;
                Admitted {
                    in_flight: s.fleet_count(),
                    queued_behind,
                    peers: s.peers.count,
                    reading: s.readings,
                    share: s.share,
                }
            })
        })
    }

    /// The request admitted at `admitted` stopped waiting at `now`: it will have no first token
    /// (not a stream).
    pub(crate) fn stop_waiting(&self, admitted: Instant, now: Instant) {
        let at = self.since_epoch(admitted);
        self.update(now, |s| s.unwait(at));
    }

    /// The first token of the request admitted at `admitted`, where it found `found`, came at
    /// `now`: it stops waiting, and the integral is read for its experienced concurrency (one
    /// lock for both). Also how many others still wait for theirs, fleet-wide, and how many
    /// requests it found in flight that it could not see: another replica's admissions not
    /// yet stated at its last round (a race for the last slot: the loser waits a whole request
    /// at an occupancy that does not show it, and its TTFT belongs to the occupancy it really
    /// found), which the peers' next reading after its admission shows. Not their mean over
    /// its whole wait: that counts the requests admitted after it too (behind it, in an
    /// engine's queue), and a slow first token learned at an occupancy that high leaves the
    /// levels where it was really admitted looking clean.
    pub(crate) fn first_token(
        &self,
        admitted: Instant,
        found: &Admitted,
        now: Instant,
    ) -> (Reading, u32, u32) {
        let since = self.since_epoch(admitted);
        let at = self.since_epoch(now);
        self.update(now, |s| {
            s.unwait(since);
            let next = found.reading + 1;
            let unseen = match s.recent[(next % RECENT as u64) as usize] {
                (n, count) if n == next => count.saturating_sub(found.peers),
                // No reading since its admission, or one too old to be kept.
                _ => 0,
            };
            (s.reading(now, at), s.fleet_waiting(), unseen)
        })
    }

    /// One fewer in flight; `waiting_since` is its admission time if it never stopped waiting.
    pub(crate) fn release(&self, now: Instant, waiting_since: Option<Instant>) {
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
    /// no first token to have come back yet. The peers' waiting requests count too.
    pub(crate) fn waited(&self, now: Instant) -> f64 {
        if self.counts().waiting == 0 {
            return 0.0;
        }
        let at = self.since_epoch(now);
        self.update(now, |s| {
            let waiting = s.waiting + s.peers.waiting;
            if waiting == 0 {
                return 0.0;
            }
            let local = f64::from(s.waiting) * at - s.waiting_since;
            let peers = s.peers.waiting_age_s + f64::from(s.peers.waiting) * (at - s.peers_at);
            ((local + peers) / f64::from(waiting)).max(0.0)
        })
    }

    /// The backend's time owed to each request in flight, up to `now` ([`State::share`]): a
    /// request's share of the engine is this less its [`Admitted::share`].
    pub(crate) fn share(&self, now: Instant) -> f64 {
        self.update(now, |s| s.share)
    }

    /// The integral up to `now`.
    pub(crate) fn read(&self, now: Instant) -> Reading {
        let at = self.since_epoch(now);
        self.update(now, |s| s.reading(now, at))
    }

    /// In flight now, fleet-wide. (Reading the count leaves the integral alone: no clock read.)
    pub(crate) fn count(&self) -> u32 {
        self.counts().in_flight
    }

    /// Whether a request is past its first token (decoding) now, fleet-wide: whether its
    /// engine runs on a device it shares.
    pub(crate) fn busy(&self) -> bool {
        let Counts { in_flight, waiting } = self.counts();
        in_flight > waiting
    }

    /// In flight through this replica alone.
    pub(crate) fn local_count(&self) -> u32 {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count
    }

    /// This replica's own load as of `now`, for its peers.
    pub(crate) fn local(&self, now: Instant) -> LocalLoad {
        let at = self.since_epoch(now);
        self.update(now, |s| LocalLoad {
            count: s.count,
            area: s.area,
            waiting: s.waiting,
            waiting_age_s: (f64::from(s.waiting) * at - s.waiting_since).max(0.0),
        })
    }

    /// The peers' load as of `now`; their count is carried forward from here until the next.
    /// Whether they hold fewer requests than before (room freed elsewhere).
    pub(crate) fn set_peers(&self, now: Instant, load: PeerLoad) -> bool {
        let at = self.since_epoch(now);
        self.update(now, |s| {
            let fewer = load.count < s.peers.count;
            s.peers = load;
            s.peers_at = at;
            s.readings += 1;
            s.recent[(s.readings % RECENT as u64) as usize] = (s.readings, load.count);
            fewer
        })
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
    fn each_moment_of_the_engine_is_shared_among_the_requests_in_flight_then() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        let first = occ.try_admit(at(0), u32::MAX).unwrap(); // alone for 100 ms
        let second = occ.try_admit(at(100), u32::MAX).unwrap(); // shared for 200 ms
        occ.release(at(300), None);
        let first_s = occ.share(at(300)) - first.share;
        // Alone 300 ms more, then idle: idle time is nobody's.
        occ.release(at(600), None);
        let second_s = occ.share(at(900)) - second.share;
        assert!((first_s - 0.2).abs() < 1e-9, "{first_s}");
        assert!((second_s - 0.4).abs() < 1e-9, "{second_s}");
        // The shares add up to the 600 ms the engine held a request.
        assert!((first_s + second_s - 0.6).abs() < 1e-9);
    }

    #[test]
    fn waited_is_the_mean_age_of_requests_without_a_first_token() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        assert_eq!(occ.waited(at(0)), 0.0);
        let first = occ.try_admit(at(0), u32::MAX).unwrap();
        occ.try_admit(at(200), u32::MAX);
        occ.try_admit(at(400), u32::MAX);
        // Ages 1.0, 0.8 and 0.6 s.
        assert!((occ.waited(at(1000)) - 0.8).abs() < 1e-9);
        occ.first_token(at(0), &first, at(1000));
        assert!((occ.waited(at(1000)) - 0.7).abs() < 1e-9);
        occ.stop_waiting(at(200), at(200));
        occ.release(at(1000), Some(at(400)));
        assert_eq!(occ.waited(at(1000)), 0.0);
    }

    #[test]
    fn the_peers_load_counts_in_admission_readings_and_the_wait_floor() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        occ.try_admit(at(0), u32::MAX);
        // Peers: 3 in flight, their integrals summing to 10 request-seconds, one of them
        // waiting for its first token for 0.5 s.
        let fewer = occ.set_peers(
            at(0),
            PeerLoad {
                count: 3,
                area: 10.0,
                waiting: 1,
                waiting_age_s: 0.5,
            },
        );
        assert!(!fewer, "the peers hold more than before");
        let start = occ.read(at(0));
        assert_eq!((occ.count(), occ.local_count()), (4, 1));
        assert_eq!(
            occ.try_admit(at(0), 5).map(|a| a.in_flight),
            Some(5),
            "fleet-wide: 4 + 1"
        );
        assert_eq!(
            occ.try_admit(at(0), 5),
            None,
            "the limit counts the peers' requests"
        );
        // 200 ms on, the peers published 10.9 request-seconds (they had 4.5 in flight on
        // average, not the 3 carried forward) and have 2 in flight now.
        let carried = occ.read(at(200));
        assert!((carried.area - start.area - (0.6 + 2.0 * 0.2)).abs() < 1e-9);
        let fewer = occ.set_peers(
            at(200),
            PeerLoad {
                count: 2,
                area: 10.9,
                waiting: 0,
                waiting_age_s: 0.0,
            },
        );
        assert!(
            fewer,
            "a peer's request ended: room for this replica's line"
        );
        let end = occ.read(at(400));
        // Over 400 ms: this replica 2 in flight (0.8), the peers 0.9 then 2 x 0.2 (1.3).
        assert!((end.area - start.area - (0.8 + 1.3)).abs() < 1e-9);
        assert_eq!(end.count, 4);
        // The wait floor: this replica's two requests waiting since 0 (0.4 s each).
        assert!((occ.waited(at(400)) - 0.4).abs() < 1e-9);
        let local = occ.local(at(400));
        assert_eq!((local.count, local.waiting), (2, 2));
        assert!((local.area - 0.8).abs() < 1e-9);
        assert!((local.waiting_age_s - 0.8).abs() < 1e-9);
    }

    #[test]
    fn a_request_another_replica_admitted_unseen_counts_in_what_the_first_token_found() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let occ = Occupancy::new(t0);
        let found = occ.try_admit(at(100), 2).unwrap();
        assert_eq!(found.in_flight, 1, "the peers' request is not stated yet");
        // Their next round states a request they admitted at 90 ms (its area counts from
        // then), the one after that its end at 1,290 ms.
        let peers = |count, area| PeerLoad {
            count,
            area,
            ..PeerLoad::default()
        };
        occ.set_peers(at(150), peers(1, 0.06));
        occ.set_peers(at(1300), peers(0, 1.2));
        let (_, _, unseen) = occ.first_token(at(100), &found, at(1300));
        assert_eq!(unseen, 1, "it waited behind a request it did not see");
        // Alone in the fleet, it finds what it saw.
        let alone = occ.try_admit(at(1300), 2).unwrap();
        let (_, _, unseen) = occ.first_token(at(1300), &alone, at(1340));
        assert_eq!(unseen, 0);
        // Requests the peers admit after it queue behind it: a long wait while they pile up
        // does not move the occupancy it found.
        occ.set_peers(at(1400), peers(2, 1.3));
        let early = occ.try_admit(at(1410), 10).unwrap();
        assert_eq!(early.peers, 2);
        occ.set_peers(at(1450), peers(2, 1.4));
        occ.set_peers(at(1500), peers(5, 1.6));
        occ.set_peers(at(2500), peers(6, 7.0));
        let (_, _, unseen) = occ.first_token(at(1410), &early, at(2500));
        assert_eq!(unseen, 0, "nobody it did not see was ahead of it");
    }
}
