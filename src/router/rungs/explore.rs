//! Rung 1: a budgeted share of requests (`routing.exploration`) goes where the curve knows
//! least, only where no prediction says it would break an SLO, its own or anyone's already
//! there (docs/benchmarks/routing.md, "Backends that share a device").

use crate::router::candidates::Candidate;
use crate::router::decision::Reason;
use crate::router::scene::{Pick, Rung, Scene, kept_best};

/// Spends the exploration budget.
#[derive(Debug)]
pub(crate) struct Explore;

impl Rung for Explore {
    fn name(&self) -> &'static str {
        "explore"
    }

    /// A backend whose curve has no confident answer at this concurrency (never observed,
    /// beyond twice the concurrency it has seen, or a bucket gone stale), whose prediction,
    /// where there is one, keeps this request's SLO, the speed of every class already there and
    /// (for batch work, which holds a slot for long) room for the next latency request. Least
    /// confidence first. Never one whose idle engine it would start on a device it shares
    /// ([`Candidate::starts_shared`](crate::router::candidates::Candidate)): what its passes cost the
    /// device's other engines is what exploring does not know. Such an engine is tried as its
    /// slow start, or as an idle engine on thin evidence, where nothing is feasible.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        if !scene.may_explore {
            return None;
        }
        let batch = scene.ask.slo.is_batch();
        let i = least_confident(
            scene.candidates,
            |c| {
                !c.starts_shared
                    && match c.estimate() {
                        None => true,
                        Some(e) if c.joining == 1 && e.prediction.confidence < 0.5 => {
                            e.keeps_classes
                                && e.leaves_room
                                && e.neighbour_loss < super::best_chance::MIN_CHANCE
                        }
                        Some(e) => {
                            (e.prediction.beyond_evidence || e.prediction.confidence < 0.5)
                                && e.keeps_classes
                                && e.leaves_room
                                && if batch { !c.queues() } else { e.slack >= 0.0 }
                        }
                    }
            },
            |c| c.estimate().is_none() || c.keeps_others(),
        )?;
        Some(Pick {
            candidate: i,
            reason: Reason::Explore,
            read_early: false,
        })
    }
}

/// Of the candidates passing `cheap` and then `costly` (as in [`kept_best`]), the one whose
/// prediction has the least confidence (none counts as 0): where trying it teaches the curve
/// the most.
pub(super) fn least_confident<'r>(
    candidates: &[Candidate<'r>],
    cheap: impl Fn(&Candidate<'r>) -> bool,
    costly: impl Fn(&Candidate<'r>) -> bool,
) -> Option<usize> {
    let confidence = |c: &Candidate<'_>| c.prediction().map_or(0.0, |p| p.confidence);
    kept_best(candidates, cheap, costly, |open| {
        open.min_by(|(_, a), (_, b)| confidence(a).total_cmp(&confidence(b)))
            .map(|(i, _)| i)
    })
}
