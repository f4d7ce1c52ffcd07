//! Rung 6: where nothing is feasible, an idle backend whose thin evidence predicts a miss is
//! tried again, as a never-observed one is, outside the exploration budget and from the line
//! too: a first answer slowed by the engine's own cold start, or a fit through two samples,
//! must not lock a backend out while requests wait or fail elsewhere (docs/benchmarks/real-engines.md,
//! "Collapses on the CPU engines").

use super::explore::least_confident;
use crate::router::decision::Reason;
use crate::router::scene::{Pick, Rung, Scene};

/// An idle backend on thin evidence, tried again.
#[derive(Debug)]
pub(crate) struct RetryIdle;

impl Rung for RetryIdle {
    fn name(&self) -> &'static str {
        "retry_idle"
    }

    /// An idle backend with a prediction of confidence under one half, where trying it costs
    /// nobody else anything: it leaves room, keeps the others there and costs the requests
    /// beside it on its device less than [`MIN_CHANCE`](super::best_chance::MIN_CHANCE) of a good
    /// completion. Least confidence first. Not for a request whose first-token target has passed
    /// while it waited: it would only take the slot from the ones behind it.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        if !scene.in_time {
            return None;
        }
        let i = least_confident(
            scene.candidates,
            |c| {
                c.joining == 1
                    && c.estimate().is_some_and(|e| {
                        e.leaves_room
                            && e.keeps_classes
                            && e.neighbour_loss < super::best_chance::MIN_CHANCE
                            && e.prediction.confidence < 0.5
                    })
            },
            |c| c.keeps_others(),
        )?;
        Some(Pick {
            candidate: i,
            reason: Reason::Explore,
            read_early: false,
        })
    }
}
