//! `on_miss: best_effort`, after the ladder: where nothing is feasible nor worth a chance, a
//! class that sends anyway sends where the request costs the fleet least
//! (docs/benchmarks/routing.md, "A prompt's prefill charged to the streams it stalls").

use std::cmp::Ordering;

use super::batch::marginal_tps;
use crate::config::Slo;
use crate::router::candidates::Candidate;

/// For a latency request whose prompt some backend holds, that backend (the longest prefix,
/// then the likeliest to meet the SLO): a request that misses its SLO anyway costs the fleet
/// least where its prefill is cached, while a cold prefill elsewhere stalls every stream
/// decoding there and evicts what that backend held. Otherwise where it adds the most good
/// completions ([`likelier`]). For a batch request, the most added throughput; without any
/// prediction, the fewest in flight.
pub(crate) fn best_effort(slo: &Slo, candidates: &[Candidate<'_>]) -> Option<usize> {
    let all = || candidates.iter().enumerate();
    let predicted = || all().filter(|(_, c)| c.estimate().is_some());
    let pick = if slo.is_batch() {
        predicted().max_by(|(_, a), (_, b)| marginal_tps(a).total_cmp(&marginal_tps(b)))
    } else {
        predicted()
            .filter(|(_, c)| c.holds_prefix)
            .max_by(|(_, a), (_, b)| {
                a.cache
                    .cached_tokens
                    .cmp(&b.cache.cached_tokens)
                    .then(likelier(a, b))
            })
            .or_else(|| all().max_by(|(_, a), (_, b)| likelier(a, b)))
    };
    pick.or_else(|| all().min_by_key(|(_, c)| c.joining))
        .map(|(i, _)| i)
}

/// The candidate where the request adds more good completions (`Greater`: `a`): its chance
/// less what its prefill costs the streams there, then the one predicted to miss by less, then
/// the one with fewer in flight.
fn likelier(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    // A backend never observed counts as no chance and no slack: below any that has some.
    let gain = |c: &Candidate<'_>| c.estimate().map_or(0.0, |e| e.chance()) - c.stall_loss();
    let slack = |c: &Candidate<'_>| c.estimate().map_or(0.0, |e| e.slack);
    gain(a)
        .total_cmp(&gain(b))
        .then(slack(a).total_cmp(&slack(b)))
        .then(b.joining.cmp(&a.joining))
}
