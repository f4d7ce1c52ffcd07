//! Rung 3: a prompt worth holding that no feasible backend holds goes to the least full prefix
//! index: a prompt is re-sent where it lands, and an engine's cache, not its compute, is what a
//! prompt too many overflows (docs/benchmarks/routing.md, "Conversations and shared prompts").

use super::policy::order;
use crate::config::Policy;
use crate::router::scene::{Pick, Rung, Scene, kept_best};

/// The home of a new prompt.
#[derive(Debug)]
pub(crate) struct Place;

impl Rung for Place {
    fn name(&self) -> &'static str {
        "place"
    }

    /// For a prompt long enough to be worth holding (at least `min_match_tokens`, or hinted),
    /// when the policy spreads load (`pack` and `cheapest` keep their own order): the backend
    /// whose prefix index is least full, among those meeting the SLO and those never observed
    /// that their ramp admits (an idle backend with an empty cache is the best home for a new
    /// prompt, and its ramp bounds what trying it costs); ties, as when every index is full, by
    /// the policy.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        if matches!(scene.policy, Policy::Pack | Policy::Cheapest) {
            return None;
        }
        let i = kept_best(
            scene.candidates,
            |c| c.affinity.is_some() && (c.meets_slo() || c.cold_start()),
            |c| c.cold_start() || c.keeps_others(),
            |open| {
                open.min_by(|(_, a), (_, b)| {
                    a.cache
                        .fill_per_mille
                        .cmp(&b.cache.fill_per_mille)
                        .then_with(|| order(scene.policy, scene.ask, b, a))
                })
                .map(|(i, _)| i)
            },
        )?;
        Some(scene.placed(i))
    }
}
