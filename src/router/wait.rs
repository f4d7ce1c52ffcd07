//! Where a request may wait: in its class's line until a backend is feasible, and on Redis for a
//! slot near a backend's edge that other replicas may be taking too
//! ([`crate::fleet::claim`]). The decision itself (`mod.rs`) is synchronous and reads no
//! clock; this module reads one each time a waiting request tries again.

use tokio::time::Instant;

use super::{Ask, Decision, Router};
use crate::error::{Error, ErrorKind};
use crate::fleet::{Claimed, Share};

/// How many times a decision whose slot another replica took first is made again before the
/// request is answered 503.
const CLAIM_TRIES: usize = 3;

/// Waits in the class's line (in weighted fair order by tokens within the class, as
/// `share`) until a backend is feasible, or sheds with 429 when the class's queue wait,
/// counted from receipt, runs out.
pub(crate) async fn in_line(
    router: &Router,
    ask: &Ask<'_>,
    share: Share,
) -> Result<Decision, Error> {
    let policy = router.policy(ask);
    let (_, max_wait) = router.on_miss(ask);
    let Some(class) = ask.class else {
        return Err(router.shed(ask, "no backend is predicted to meet the SLO"));
    };
    let deadline = ask.received + max_wait;
    let place = router.line.join(class, share);
    let wake = place.wake();
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(round) = place.turn() {
            match router.try_decide(&ask.at(Instant::now()), policy, true) {
                Ok(decision) => match claim(router, ask, decision).await {
                    Some(decision) => {
                        tracing::debug!(
                            flow = share.flow,
                            waited_ms = ask.received.elapsed().as_secs_f64() * 1e3,
                            reason = decision.reason.label(),
                            "line served"
                        );
                        return Ok(decision);
                    }
                    // Another replica took the slot; the counts are fresh now.
                    None => place.pass(round),
                },
                Err(_) => place.pass(round),
            }
        }
        // Curves also change without a release (a refresh after a completion elsewhere):
        // look again at the curve's refresh period at the latest.
        let tick = Instant::now() + crate::curve::REFRESH;
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(tick.min(deadline)) => place.look_again(),
        }
        if Instant::now() >= deadline {
            tracing::debug!(flow = share.flow, "line shed");
            let why = if ask.slo.is_batch() {
                "no backend had room for batch work within the class's queue wait"
            } else {
                "no backend could meet the SLO within the class's queue wait"
            };
            return Err(router.shed(&ask.at(Instant::now()), why));
        }
    }
}

/// Settles a decision near its backend's edge with the other replicas
/// ([`crate::fleet::claim`]): its slot is claimed in Redis, and where another replica took
/// it first, the slot is let go and the request decided again on the fleet's fresh counts
/// (in its class's line, if nothing is feasible and the class queues). A decision without a
/// claim goes as it is.
pub(crate) async fn settle(
    router: &Router,
    ask: &Ask<'_>,
    decision: Decision,
    share: Share,
) -> Result<Decision, Error> {
    let mut decision = decision;
    for _ in 0..CLAIM_TRIES {
        if let Some(settled) = claim(router, ask, decision).await {
            return Ok(settled);
        }
        decision = match router.route(&ask.at(Instant::now()))? {
            Some(next) => next,
            None if !ask.avoid.is_empty() => {
                return Err(Error::new(
                    ErrorKind::NoBackendAvailable,
                    "no other backend can take the request now",
                ));
            }
            None => return in_line(router, ask, share).await,
        };
    }
    claim(router, ask, decision).await.ok_or_else(|| {
        Error::new(
            ErrorKind::NoBackendAvailable,
            "other gateway replicas kept taking the slots this request was routed to; retry shortly",
        )
    })
}

/// The decision, once its slot is claimed where it needs to be (or the claim went
/// unanswered: the request goes on this replica's view); `None` when another replica had
/// taken the slot, and the decision is undone.
async fn claim(router: &Router, ask: &Ask<'_>, decision: Decision) -> Option<Decision> {
    let Some(limit) = decision.claim else {
        return Some(decision);
    };
    if decision.backend.claim(limit).await == Claimed::Refused {
        tracing::debug!(
            backend = &*decision.backend.config.name,
            limit,
            "slot claimed by another replica first"
        );
        return None;
    }
    router.count(ask, decision.reason);
    let ask = ask.at(Instant::now());
    router.placed(&ask, &decision.backend, decision.guard.expected());
    Some(decision)
}
