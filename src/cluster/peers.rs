//! The other replicas as this one last saw them: each peer's latest [`Snapshot`], since when it
//! has not changed, and the fleet-wide sums a backend's occupancy takes ([`PeerLoad`]). Pure:
//! time comes in as an argument.
//!
//! A peer's integral is counted from where it stood when this replica first saw the peer (only
//! its growth matters), and between its publications its count is carried forward. A peer that
//! stops publishing drops out after `expiry`; what it had accrued by then stays in the sum, so
//! that the fleet's integral never steps back.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::wire::Snapshot;
use crate::curve::PeerLoad;

/// Every peer, by replica id.
#[derive(Debug)]
pub struct Peers {
    me: String,
    expiry: Duration,
    peers: HashMap<String, Peer>,
    /// Per backend: request-seconds of peers that have left.
    retired: HashMap<String, f64>,
}

#[derive(Debug)]
struct Peer {
    snapshot: Snapshot,
    /// When its `seq` last changed (this replica's time).
    seen: Instant,
    /// Per backend: its integral when first seen.
    base: HashMap<String, f64>,
}

/// A peer, as `/admin/cluster` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeerInfo {
    /// Its replica id.
    pub replica: String,
    /// Seconds since its last publication was seen.
    pub age_s: f64,
    /// Its requests in flight, all backends.
    pub in_flight: u32,
}

impl Peer {
    /// Its integral on `backend` since first seen, carried forward to `now` at its count.
    fn accrued(&self, backend: &str, now: Instant) -> f64 {
        let Some(load) = self.snapshot.backends.get(backend) else {
            return 0.0;
        };
        let base = self.base.get(backend).copied().unwrap_or(load.area);
        (load.area - base).max(0.0)
            + f64::from(load.count) * now.saturating_duration_since(self.seen).as_secs_f64()
    }
}

impl Peers {
    /// No peers yet; `me` is this replica's own id (its own publication is not a peer's), and
    /// a peer unseen for `expiry` drops out.
    pub fn new(me: String, expiry: Duration) -> Self {
        Self {
            me,
            expiry,
            peers: HashMap::new(),
            retired: HashMap::new(),
        }
    }

    /// Takes what every replica has published, as read at `now`.
    pub fn update<'a>(
        &mut self,
        now: Instant,
        published: impl IntoIterator<Item = (&'a str, Snapshot)>,
    ) {
        for (id, snapshot) in published {
            if id == self.me {
                continue;
            }
            match self.peers.get_mut(id) {
                Some(peer) if peer.snapshot.seq == snapshot.seq => {}
                Some(peer) => {
                    for (backend, load) in &snapshot.backends {
                        peer.base.entry(backend.clone()).or_insert(load.area);
                    }
                    peer.snapshot = snapshot;
                    peer.seen = now;
                }
                None => {
                    let base = snapshot
                        .backends
                        .iter()
                        .map(|(b, load)| (b.clone(), load.area))
                        .collect();
                    self.peers.insert(
                        id.to_owned(),
                        Peer {
                            snapshot,
                            seen: now,
                            base,
                        },
                    );
                }
            }
        }
        self.expire(now);
    }

    /// Drops the peers unseen for longer than the expiry as of `now` (their count carried
    /// forward until then).
    pub fn expire(&mut self, now: Instant) {
        let expiry = self.expiry;
        let gone: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.seen) > expiry)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(peer) = self.peers.remove(&id) {
                for backend in peer.snapshot.backends.keys() {
                    let accrued = peer.accrued(backend, now);
                    *self.retired.entry(backend.clone()).or_default() += accrued;
                }
                tracing::info!(replica = %id, "cluster: peer stopped publishing; dropped");
            }
        }
    }

    /// The peers' load on `backend` as of `now`.
    pub fn load(&self, backend: &str, now: Instant) -> PeerLoad {
        let mut load = PeerLoad {
            area: self.retired.get(backend).copied().unwrap_or(0.0),
            ..PeerLoad::default()
        };
        for peer in self.peers.values() {
            let Some(b) = peer.snapshot.backends.get(backend) else {
                continue;
            };
            let since = now.saturating_duration_since(peer.seen).as_secs_f64();
            load.count += b.count;
            load.area += peer.accrued(backend, now);
            load.waiting += b.waiting;
            load.waiting_age_s += b.waiting_age_s + f64::from(b.waiting) * since;
        }
        load
    }

    /// The peers' requests in flight for the API key named `key`.
    pub fn key_in_flight(&self, key: &str) -> u64 {
        self.peers
            .values()
            .filter_map(|p| p.snapshot.keys.get(key))
            .sum()
    }

    /// The peers' requests in flight on `backend` by class name.
    pub fn classes(&self, backend: &str) -> BTreeMap<&str, u32> {
        let mut out = BTreeMap::new();
        for peer in self.peers.values() {
            if let Some(b) = peer.snapshot.backends.get(backend) {
                for (class, n) in &b.classes {
                    *out.entry(class.as_str()).or_default() += n;
                }
            }
        }
        out
    }

    /// The live peers, for the admin plane.
    pub fn info(&self, now: Instant) -> Vec<PeerInfo> {
        let mut list: Vec<PeerInfo> = self
            .peers
            .iter()
            .map(|(id, p)| PeerInfo {
                replica: id.clone(),
                age_s: now.saturating_duration_since(p.seen).as_secs_f64(),
                in_flight: p.snapshot.backends.values().map(|b| b.count).sum(),
            })
            .collect();
        list.sort_by(|a, b| a.replica.cmp(&b.replica));
        list
    }

    /// How many are live.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Ids of peers unseen for longer than `stale`, whose publications may be removed from the
    /// store (a replica that crashed never removes its own).
    pub fn long_gone<'a>(
        &self,
        now: Instant,
        published: impl IntoIterator<Item = (&'a str, u64)>,
        stale: &mut HashMap<String, (u64, Instant)>,
        after: Duration,
    ) -> Vec<String> {
        let mut gone = Vec::new();
        let mut present = std::collections::HashSet::new();
        for (id, seq) in published {
            present.insert(id.to_owned());
            if id == self.me {
                continue;
            }
            let entry = stale.entry(id.to_owned()).or_insert((seq, now));
            if entry.0 != seq {
                *entry = (seq, now);
            } else if now.saturating_duration_since(entry.1) > after {
                gone.push(id.to_owned());
            }
        }
        stale.retain(|id, _| present.contains(id));
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::BackendLoad;

    fn snapshot(seq: u64, count: u32, area: f64) -> Snapshot {
        let mut s = Snapshot {
            seq,
            ..Snapshot::default()
        };
        s.backends.insert(
            "b".to_owned(),
            BackendLoad {
                count,
                area,
                waiting: 1,
                waiting_age_s: 0.5,
                classes: [("interactive".to_owned(), count)].into(),
            },
        );
        s
    }

    #[test]
    fn peers_add_up_without_this_replica_and_carry_their_count_forward() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut peers = Peers::new("me".to_owned(), Duration::from_millis(400));
        peers.update(
            t0,
            [
                ("me", snapshot(1, 50, 0.0)),
                ("a", snapshot(1, 2, 100.0)),
                ("b", snapshot(9, 3, 7.0)),
            ],
        );
        assert_eq!(peers.len(), 2);
        let load = peers.load("b", t0);
        assert_eq!((load.count, load.area, load.waiting), (5, 0.0, 2));
        assert_eq!(peers.classes("b")["interactive"], 5);
        // 100 ms later, `a` published again: 2.5 request-seconds more; `b` did not.
        peers.update(
            ms(100),
            [("a", snapshot(2, 1, 102.5)), ("b", snapshot(9, 3, 7.0))],
        );
        let load = peers.load("b", ms(200));
        // a: 2.5 + 1 x 0.1 carried; b: 3 x 0.2 carried.
        assert!((load.area - (2.6 + 0.6)).abs() < 1e-9, "{load:?}");
        assert_eq!(load.count, 4);
        assert!((load.waiting_age_s - (0.5 + 0.1 + 0.5 + 0.2)).abs() < 1e-9);
    }

    #[test]
    fn a_peer_that_stops_publishing_drops_out_and_keeps_what_it_accrued() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut peers = Peers::new("me".to_owned(), Duration::from_millis(400));
        peers.update(t0, [("a", snapshot(1, 2, 10.0))]);
        peers.update(ms(100), [("a", snapshot(2, 2, 10.2))]);
        peers.expire(ms(450));
        assert_eq!(peers.len(), 1, "still within its expiry");
        let before = peers.load("b", ms(550)).area;
        assert!((before - (0.2 + 2.0 * 0.45)).abs() < 1e-9);
        peers.expire(ms(550));
        assert!(peers.is_empty());
        let after = peers.load("b", ms(600));
        assert_eq!(after.count, 0);
        assert!(
            (after.area - before).abs() < 1e-9,
            "{} {before}",
            after.area
        );
    }

    #[test]
    fn publications_unchanged_for_long_are_named_for_removal() {
        let t0 = Instant::now();
        let peers = Peers::new("me".to_owned(), Duration::from_millis(400));
        let mut stale = HashMap::new();
        let after = Duration::from_secs(60);
        assert!(
            peers
                .long_gone(t0, [("a", 1), ("me", 1)], &mut stale, after)
                .is_empty()
        );
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            peers.long_gone(later, [("a", 1), ("me", 1)], &mut stale, after),
            ["a"]
        );
        assert!(
            peers
                .long_gone(later, [("a", 2)], &mut stale, after)
                .is_empty()
        );
    }
}
