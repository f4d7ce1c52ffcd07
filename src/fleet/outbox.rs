//! What this replica learns that its peers should learn too, on its way to the cluster's sync
//! task: curve samples (each first token, each request's end) and health events (an ejection, a
//! 429 cool-down). The request path never waits for it: a sample is handed over with a
//! non-blocking send, and when the queue is full (Redis away for long) it is dropped and counted.
//! Beside it travel the [claims](super::claim) of slots at a backend's edge, the one thing a
//! request waits for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::claim::{self, Claims, Desk};
use crate::curve::{FirstToken, Observation};

/// Samples and events queued before the oldest is refused: at two samples per request, a few
/// seconds of a busy gateway's traffic, about a megabyte.
pub(crate) const CAPACITY: usize = 16 * 1024;

/// What a backend learned, for its peers.
#[derive(Debug, Clone)]
pub(crate) enum Learned {
    /// A request's first token (its TTFT, at the occupancy it was admitted with).
    FirstToken(FirstToken),
    /// A request's end (its speed, at the concurrency it experienced).
    Ended(Observation),
}

/// One thing for the peers.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// A curve sample of `backend` for client model `model`.
    Learned {
        /// The backend's name.
        backend: Arc<str>,
        /// The client model name.
        model: Arc<str>,
        /// The sample.
        learned: Learned,
    },
    /// `backend` was ejected after upstream failures, until `until`.
    Ejected {
        /// The backend's name.
        backend: Arc<str>,
        /// The end of the ejection.
        until: Instant,
    },
    /// A prompt was routed to `backend`: its prefix cache holds the prompt's blocks now.
    Routed {
        /// The backend's name.
        backend: Arc<str>,
        /// Every [`SHARE_STEP`](crate::prefix::SHARE_STEP)-th block hash of the prompt and
        /// its last ([`crate::prefix::coarse`]).
        hashes: Box<[u64]>,
        /// The conversation's hint, if it had one.
        hint: Option<u64>,
    },
    /// `backend` answered 429: it cools down until `until`.
    Cooling {
        /// The backend's name.
        backend: Arc<str>,
        /// The end of the cool-down.
        until: Instant,
    },
}

/// The sending side, held by every backend while the gateway runs in a cluster.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
    /// Slots claimed at a backend's edge.
    pub claims: Claims,
}

/// The receiving side, drained by the cluster's sync task.
#[derive(Debug)]
pub(crate) struct Inbox {
    rx: mpsc::Receiver<Event>,
    dropped: Arc<AtomicU64>,
    /// Where the claims arrive.
    pub claims: Desk,
}

/// An outbox and the inbox it feeds; a claim waits at most `claim_wait` for its answer.
pub(crate) fn outbox(claim_wait: Duration) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let dropped = Arc::new(AtomicU64::new(0));
    let (claims, desk) = claim::claims(claim_wait);
    (
        Outbox {
            tx,
            dropped: Arc::clone(&dropped),
            claims,
        },
        Inbox {
            rx,
            dropped,
            claims: desk,
        },
    )
}

impl Outbox {
    /// Queues `event` if there is room; otherwise drops it and counts the drop.
    pub(crate) fn send(&self, event: Event) {
        if self.tx.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Inbox {
    /// Everything queued now, up to `max` events, without waiting.
    pub(crate) fn drain(&mut self, max: usize, into: &mut Vec<Event>) {
        while into.len() < max {
            match self.rx.try_recv() {
                Ok(event) => into.push(event),
                Err(_) => break,
            }
        }
    }

    /// Events dropped so far because the queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
