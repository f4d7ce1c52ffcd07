//! The decision ladder: the rungs in the order a request meets them. The first that picks a
//! candidate decides; a request every rung passes gets its class's `on_miss`
//! (docs/ARCHITECTURE.md, "Routing", lists the same order).

use super::rungs::batch::Batch;
use super::rungs::best_chance::BestChance;
use super::rungs::explore::Explore;
use super::rungs::holder::Holder;
use super::rungs::place::Place;
use super::rungs::policy::ByPolicy;
use super::rungs::retry_idle::RetryIdle;
use super::rungs::slow_start::SlowStart;
use super::scene::{Pick, Rung, Scene};

/// A latency request's rungs.
pub(crate) const LATENCY: &[&dyn Rung] = &[
    &Explore,
    &Holder,
    &Place,
    &ByPolicy,
    &SlowStart,
    &RetryIdle,
    &BestChance,
];

/// A batch request's rungs (a class without targets, or the `throughput` policy).
pub(crate) const BATCH: &[&dyn Rung] = &[&Explore, &Batch];

/// The first pick of `rungs[from..]`, with the index of the rung that made it.
pub(crate) fn climb(
    rungs: &[&dyn Rung],
    scene: &Scene<'_, '_>,
    from: usize,
) -> Option<(usize, Pick)> {
    rungs
        .iter()
        .enumerate()
        .skip(from)
        .find_map(|(at, rung)| rung.pick(scene).map(|pick| (at, pick)))
}
