//! Rung 4: the class's policy among the backends predicted to meet its SLO: `headroom` the
//! most room, `pack` the least slack, `cheapest` the lowest price (docs/benchmarks/routing.md, "Routing:
//! goodput per policy on the simulated fleet").

use std::cmp::Ordering;

use crate::config::Policy;
use crate::router::ask::{ASSUMED_OUTPUT_TOKENS, Ask};
use crate::router::candidates::Candidate;
use crate::router::scene::{Pick, Rung, Scene, kept_best};

/// The class's policy among the feasible.
#[derive(Debug)]
pub(crate) struct ByPolicy;

impl Rung for ByPolicy {
    fn name(&self) -> &'static str {
        "policy"
    }

    /// `headroom` (and `oracle`): the most room ([`Candidate::room`]: the slack, or the next
    /// request's where a shared device makes that less); `pack`: the least slack; `cheapest`:
    /// the lowest price, then the most slack.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        let ask = scene.ask;
        let i = kept_best(
            scene.candidates,
            Candidate::meets_slo,
            Candidate::keeps_others,
            |open| {
                let pick = match scene.policy {
                    Policy::Pack => open.min_by(|(_, a), (_, b)| slack(a).total_cmp(&slack(b))),
                    Policy::Cheapest => open.min_by(|(_, a), (_, b)| {
                        price(a, ask)
                            .total_cmp(&price(b, ask))
                            .then(slack(b).total_cmp(&slack(a)))
                    }),
                    _ => open.max_by(|(_, a), (_, b)| a.room().total_cmp(&b.room())),
                };
                pick.map(|(i, _)| i)
            },
        )?;
        Some(scene.placed(i))
    }
}

/// The policy's preference between two feasible candidates (`Greater`: `a` is better).
pub(super) fn order(
    policy: Policy,
    ask: &Ask<'_>,
    a: &Candidate<'_>,
    b: &Candidate<'_>,
) -> Ordering {
    match policy {
        Policy::Pack => slack(b).total_cmp(&slack(a)),
        Policy::Cheapest => price(b, ask)
            .total_cmp(&price(a, ask))
            .then(slack(a).total_cmp(&slack(b))),
        _ => a.room().total_cmp(&b.room()),
    }
}

/// Price of the request on a candidate, USD per million tokens times tokens; unpriced backends
/// (self-hosted) cost 0.
fn price(c: &Candidate<'_>, ask: &Ask<'_>) -> f64 {
    c.backend.config.cost.as_ref().map_or(0.0, |cost| {
        let price = cost.price(ask.model);
        price.input_per_1m * ask.prompt_tokens as f64
            + price.output_per_1m * ask.max_tokens.map_or(ASSUMED_OUTPUT_TOKENS, f64::from)
    })
}

/// The request's slack there; a backend never observed has none to speak of (0, as its
/// [`room`](Candidate::room)).
fn slack(c: &Candidate<'_>) -> f64 {
    c.estimate().map_or(0.0, |e| e.slack)
}
