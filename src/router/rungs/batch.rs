//! The batch ladder's placement: batch work goes where it adds the most system throughput
//! without costing latency traffic its SLO, there or on the engines beside it
//! (docs/benchmarks/routing.md, "Backends that share a device").

use super::slow_start::cold;
use crate::router::candidates::Candidate;
use crate::router::scene::{Pick, Rung, Scene, kept_best};

/// Batch placement.
#[derive(Debug)]
pub(crate) struct Batch;

impl Rung for Batch {
    fn name(&self) -> &'static str {
        "batch"
    }

    /// A never-observed backend first (batch traffic is the one that can afford to teach the
    /// curves), else the backend where the request adds the most system TPS among those where
    /// every class already decoding keeps its speed, a latency request could still join after
    /// it, and it would not wait behind the requests there ([`Candidate::queues`]: in the
    /// gateway's line it takes whichever backend frees first, in a backend's queue only that
    /// one's turn, holding the slot meanwhile). Nor does batch work start an idle engine beside
    /// a running one on its device ([`Candidate::starts_beside`]): a batch request's pass runs
    /// for its whole long answer.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        let i = cold(scene.candidates).or_else(|| {
            kept_best(
                scene.candidates,
                |c| {
                    c.estimate()
                        .is_some_and(|e| e.keeps_classes && e.leaves_room)
                        && !c.queues()
                        && !c.starts_beside
                },
                Candidate::keeps_others,
                |open| {
                    open.max_by(|(_, a), (_, b)| marginal_tps(a).total_cmp(&marginal_tps(b)))
                        .map(|(i, _)| i)
                },
            )
        })?;
        Some(scene.placed(i))
    }
}

/// System tokens per second the request adds there (nothing known: nothing added).
pub(super) fn marginal_tps(c: &Candidate<'_>) -> f64 {
    c.estimate().map_or(f64::NEG_INFINITY, |e| e.marginal_tps)
}
