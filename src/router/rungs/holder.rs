//! Rung 2: the backend holding the longest prefix of the prompt, where it meets the SLO: a
//! prompt that leaves the backend holding its prefix pays its prefill cold elsewhere
//! (docs/benchmarks/routing.md, "Conversations and shared prompts").

use std::cmp::Ordering;

use super::policy::order;
use crate::router::candidates::Candidate;
use crate::router::scene::{Pick, Rung, Scene, kept_best};

/// The holder of the prompt's prefix.
#[derive(Debug)]
pub(crate) struct Holder;

impl Rung for Holder {
    fn name(&self) -> &'static str {
        "holder"
    }

    /// Among the candidates that hold the prompt's prefix (at least `min_match_tokens` of it,
    /// or the conversation's hint) and meet the SLO, or would past the concurrency their curve
    /// has seen ([`Candidate::may_stretch_slo`]: what exploration would try, where going elsewhere
    /// costs a cold prefill): more cached tokens first, then the prefix's rendezvous order,
    /// then the policy. Among holders of equally long prefixes the rendezvous order decides,
    /// not the slack: the first keeps a shared prompt's new conversations while it meets the
    /// SLO, so that a copy another backend took in an overflow goes cold there and is evicted,
    /// rather than both copies being kept warm by turns.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        let better = |a: &Candidate<'_>, b: &Candidate<'_>| -> Ordering {
            a.cache
                .cached_tokens
                .cmp(&b.cache.cached_tokens)
                .then(a.affinity.cmp(&b.affinity))
                .then_with(|| order(scene.policy, scene.ask, a, b))
        };
        let i = kept_best(
            scene.candidates,
            |c| c.holds_prefix && (c.meets_slo() || c.may_stretch_slo()),
            Candidate::keeps_others,
            |open| open.max_by(|(_, a), (_, b)| better(a, b)).map(|(i, _)| i),
        )?;
        Some(scene.placed(i))
    }
}
