//! A slot taken fleet-wide at a backend's edge. Replicas count each other's requests as of the
//! last sync, so two of them can each see a backend's last slot for an SLO free and both take
//! it: the loser waits out the winner's request inside the engine (a serial backend's whole
//! reply), misses its SLO, and teaches its curve a queue that is not there. Where a backend is
//! within [`EDGE`] requests of its knee or its `max_concurrency`, the replica that routes a
//! request there asks the cluster's sync task to state the admission in Redis at once, on the
//! condition that the fleet's count there, this request included, stays within the limit; a
//! refusal comes back with the fleet's counts read fresh, and the router decides again on them.
//! Far from the edge, and on a gateway without peers, nothing is asked: the request path waits
//! on Redis only where a slot is scarce.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// A request claims its slot in Redis when fewer than this many requests, itself included,
/// would still meet its SLO on the backend. Requests routed further from the edge go without
/// a claim and are stated at their replica's next round: at the rates where knees matter the
/// peers admit a fraction of a request per interval, so they seldom reach a slot a claim
/// counts on (the bound when they do: docs/gateway.md, "Several replicas").
pub(crate) const EDGE: u32 = 3;

/// Claims queued for the sync task before a new one goes unasked.
const QUEUED: usize = 1024;

/// The answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Stated: the fleet counts the request there.
    Granted,
    /// The fleet, with this request, would pass the limit there; the replica's view of it is
    /// fresh now.
    Refused,
    /// No answer in time (Redis away or slow, no peers' picture yet): the request goes on the
    /// replica's own view, as it would without a cluster.
    Unanswered,
}

impl Claimed {
    /// The `outcome` label of `tpsgate_cluster_claims_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Refused => "refused",
            Self::Unanswered => "unanswered",
        }
    }
}

/// One claim, on its way to the sync task.
#[derive(Debug)]
pub(crate) struct Claim {
    /// The backend's name.
    pub backend: Arc<str>,
    /// The most requests the fleet may have in flight there, this one included.
    pub limit: u32,
    /// Where the answer goes.
    pub answer: oneshot::Sender<Claimed>,
}

/// The asking side, held by every backend while the gateway runs in a cluster.
#[derive(Debug, Clone)]
pub struct Claims {
    tx: mpsc::Sender<Claim>,
    /// Whether any peer holds a lease: a lone replica has no one to race.
    shared: Arc<AtomicBool>,
    /// How long a request waits for the answer.
    wait: Duration,
}

/// The answering side, served by the cluster's sync task.
#[derive(Debug)]
pub(crate) struct Desk {
    rx: mpsc::Receiver<Claim>,
    shared: Arc<AtomicBool>,
}

/// A pair of claims and desk; a request waits at most `wait` for an answer.
pub(crate) fn claims(wait: Duration) -> (Claims, Desk) {
    let (tx, rx) = mpsc::channel(QUEUED);
    let shared = Arc::new(AtomicBool::new(false));
    (
        Claims {
            tx,
            shared: Arc::clone(&shared),
            wait,
        },
        Desk { rx, shared },
    )
}

impl Claims {
    /// Whether slots at the edge are claimed (peers hold leases).
    pub(crate) fn shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    /// Asks for one request's slot on `backend` with at most `limit` in flight there fleet-wide.
    pub(crate) async fn claim(&self, backend: &Arc<str>, limit: u32) -> Claimed {
        let (answer, rx) = oneshot::channel();
        let claim = Claim {
            backend: Arc::clone(backend),
            limit,
            answer,
        };
        let claimed = if self.tx.try_send(claim).is_err() {
            Claimed::Unanswered
        } else {
            match tokio::time::timeout(self.wait, rx).await {
                Ok(Ok(claimed)) => claimed,
                _ => Claimed::Unanswered,
            }
        };
        crate::telemetry::count_claim(claimed.label());
        claimed
    }
}

impl Desk {
    /// The next claim (`None` once every asking side is gone).
    pub(crate) async fn next(&mut self) -> Option<Claim> {
        self.rx.recv().await
    }

    /// The claims queued now, up to `max` in `into`, without waiting.
    pub(crate) fn drain(&mut self, max: usize, into: &mut Vec<Claim>) {
        while into.len() < max {
            match self.rx.try_recv() {
                Ok(claim) => into.push(claim),
                Err(_) => break,
            }
        }
    }

    /// Whether there are peers to claim against.
    pub(crate) fn set_shared(&self, shared: bool) {
        self.shared.store(shared, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_claim_nobody_answers_in_time_lets_the_request_go_on_its_own_view() {
        let (claims, mut desk) = claims(Duration::from_millis(20));
        let name: Arc<str> = Arc::from("b");
        assert_eq!(claims.claim(&name, 1).await, Claimed::Unanswered);
        // The desk got it; an answer after the wait is lost, not misread.
        let mut asked = Vec::new();
        desk.drain(8, &mut asked);
        assert_eq!(asked.len(), 1);
        assert_eq!((&*asked[0].backend, asked[0].limit), ("b", 1));
        let served = tokio::spawn(async move {
            let claim = desk.next().await.expect("a second claim");
            let _ = claim.answer.send(Claimed::Refused);
        });
        assert_eq!(claims.claim(&name, 2).await, Claimed::Refused);
        served.await.expect("the desk answered");
        // The desk gone, claims go unanswered at once.
        assert_eq!(claims.claim(&name, 2).await, Claimed::Unanswered);
    }
}
