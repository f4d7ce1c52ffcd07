//! Choosing among evaluated candidates: the SLO policies, batch placement, best effort,
//! exploration targets and the baselines. Pure functions of [`Candidate`]s.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;

use super::{Ask, Candidate};
use crate::config::Policy;
use crate::config::Slo;

/// Output tokens assumed when the request sets no `max_tokens` (for prices and throughput).
pub(crate) const ASSUMED_OUTPUT_TOKENS: f64 = 256.0;

/// Baselines decide without curves.
pub(crate) fn is_baseline(policy: Policy) -> bool {
    matches!(
        policy,
        Policy::RoundRobin
            | Policy::LeastInflight
            | Policy::P2cPeakEwma
            | Policy::LowestTtft
            | Policy::PrefixHash
    )
}

/// Among the feasible (or, failing those, cold backends taking a lone request, though where the
/// cold one would start beside a running engine on its device, first a backend that
/// [`Candidate::may_stretch`]): the one that
/// holds the longest prefix of the prompt, where any holds one (at least `min_match_tokens`,
/// or the request's conversation hint; more cached tokens first, then the prefix's rendezvous
/// order); else, for a prompt long enough to be worth holding, [`place`]; else by policy:
/// `headroom` the most room ([`Candidate::room`]: the slack, or the next request's where a
/// shared device makes that less), `pack` the least slack, `cheapest` the lowest price then the most
/// slack. `oracle` decides as `headroom` does. A holder that cannot meet the SLO is passed
/// over, and the backend chosen instead holds the prefix from then on. A holder beyond the
/// concurrency its curve has seen still counts where its prediction meets the SLO and keeps
/// every class there ([`Candidate::may_stretch`]): it is what exploration would try, and going
/// elsewhere costs a cold prefill.
///
/// Among holders of equally long prefixes the rendezvous order decides, not the slack: the
/// first keeps a shared prompt's new conversations while it meets the SLO, so that a copy
/// another backend took in an overflow goes cold there and is evicted, rather than both copies
/// being kept warm by turns and every cache holding more prompts than it has room for.
pub(crate) fn among_feasible(
    policy: Policy,
    candidates: &[Candidate<'_>],
    ask: &Ask<'_>,
) -> Option<usize> {
    let feasible = || candidates.iter().enumerate().filter(|(_, c)| c.feasible());
    let holder = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.holds_prefix && (c.feasible() || c.may_stretch()))
        .max_by(|(_, a), (_, b)| {
            a.cache
                .cached_tokens
                .cmp(&b.cache.cached_tokens)
                .then(a.affinity.cmp(&b.affinity))
                .then_with(|| order(policy, ask, a, b))
        });
    if let Some((i, _)) = holder {
        return Some(i);
    }
    if let Some(i) = place(policy, candidates, ask) {
        return Some(i);
    }
    let pick = match policy {
        Policy::Pack => feasible().min_by(|(_, a), (_, b)| a.slack.total_cmp(&b.slack)),
        Policy::Cheapest => feasible().min_by(|(_, a), (_, b)| {
            price(a, ask)
                .total_cmp(&price(b, ask))
                .then(b.slack.total_cmp(&a.slack))
        }),
        _ => feasible().max_by(|(_, a), (_, b)| a.room().total_cmp(&b.room())),
    };
    pick.or_else(|| {
        let cold = cold(candidates);
        if cold.is_some_and(|(_, c)| c.starts_beside) {
            // Its engine would start beside a running one: the running one, a level past its
            // evidence where it is predicted to meet the SLO, adds no pass beside anything.
            stretch(candidates).or(cold)
        } else {
            cold
        }
    })
    .map(|(i, _)| i)
}

/// The candidate with the most room among those that [`Candidate::may_stretch`].
fn stretch<'a, 'r>(candidates: &'a [Candidate<'r>]) -> Option<(usize, &'a Candidate<'r>)> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.may_stretch())
        .max_by(|(_, a), (_, b)| a.room().total_cmp(&b.room()))
}

/// Where a prompt no feasible backend holds goes, when it is long enough to be worth holding
/// (at least `min_match_tokens`, or hinted) and the policy spreads load (`pack` and `cheapest`
/// keep their own order): the backend whose prefix index is least full, among those meeting the
/// SLO and those never observed that their ramp admits (an idle backend with an empty cache is
/// the best home for a new prompt, and its ramp bounds what trying it costs); ties, as when
/// every index is full, by the policy. A prompt will be re-sent where it lands, and an engine's
/// cache, not its compute, is what a prompt too many overflows: headroom alone filled the first
/// backends to be observed with every prompt while the others stood idle.
fn place(policy: Policy, candidates: &[Candidate<'_>], ask: &Ask<'_>) -> Option<usize> {
    if matches!(policy, Policy::Pack | Policy::Cheapest) {
        return None;
    }
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.affinity.is_some() && (c.feasible() || c.cold_start()))
        .min_by(|(_, a), (_, b)| {
            a.cache
                .fill_per_mille
                .cmp(&b.cache.fill_per_mille)
                .then_with(|| order(policy, ask, b, a))
        })
        .map(|(i, _)| i)
}

/// The policy's preference between two feasible candidates (`Greater`: `a` is better).
fn order(
    policy: Policy,
    ask: &Ask<'_>,
    a: &Candidate<'_>,
    b: &Candidate<'_>,
) -> std::cmp::Ordering {
    match policy {
        Policy::Pack => b.slack.total_cmp(&a.slack),
        Policy::Cheapest => price(b, ask)
            .total_cmp(&price(a, ask))
            .then(a.slack.total_cmp(&b.slack)),
        _ => a.room().total_cmp(&b.room()),
    }
}

/// Price of the request on a candidate, USD per million tokens times tokens; unpriced backends
/// (self-hosted) cost 0.
fn price(c: &Candidate<'_>, ask: &Ask<'_>) -> f64 {
    c.backend.config.cost.map_or(0.0, |cost| {
        cost.input_per_1m * ask.prompt_tokens as f64
            + cost.output_per_1m * ask.max_tokens.map_or(ASSUMED_OUTPUT_TOKENS, f64::from)
    })
}

/// The never-observed backend that would take the request with the fewest in flight (a lone
/// request, or one its ramp allows), one that would not start its engine beside a running one
/// on its device first ([`Candidate::starts_beside`]). Two never-observed engines started
/// together on one device take it from each other, and each curve's first samples book the
/// other's load as its own: on the CPU engines, the serial engine started beside the batching
/// engine's first request slowed that one's first tokens from 30 ms to 1.2–2.2 s, and the
/// gateway then took the batching engine to miss the target even alone and locked onto the
/// serial one. The ramp of the engine already running takes the next request instead, or that
/// engine a level past its evidence where its line meets the SLO ([`among_feasible`]); where
/// nothing else can, the engine is still started beside the other, rather than never tried.
fn cold<'a, 'r>(candidates: &'a [Candidate<'r>]) -> Option<(usize, &'a Candidate<'r>)> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.cold_start())
        .min_by_key(|(_, c)| (c.starts_beside, c.joining))
}

/// Batch placement: a never-observed backend first (batch traffic is the one that can afford to
/// teach the curves), else the backend where the request adds the most system TPS among those
/// where every class already decoding keeps its speed, a latency-class request could still
/// join after it, and it would not wait behind the requests there ([`Candidate::queues`]): in
/// the gateway's line it takes whichever backend frees first, in a backend's queue only that
/// one's turn, holding the slot meanwhile. On the simulator's copy of the H200's pair, eight
/// batch requests went to wait behind each other on the serial engine, each adding a sliver of
/// throughput by the sums, while the batching engine beside it held five: the serial engine's
/// pass ran beside the batch for 40 s, and the latency class was refused the whole while.
/// Nor does batch work start an idle engine beside a running one on its device
/// ([`Candidate::starts_beside`]): the neighbour cost its curves have learned may be too
/// little, and a batch request's pass runs for its whole long answer. On the same copy at 4
/// req/s, one started the serial engine beside the batching engine's latency requests (its
/// curves said they kept their speed), a second queued behind it, and 84 to 95 latency
/// requests got a 429 in 30 s.
pub(crate) fn throughput(candidates: &[Candidate<'_>]) -> Option<usize> {
    if let Some((i, _)) = cold(candidates) {
        return Some(i);
    }
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.prediction.is_some()
                && c.keeps_others
                && c.leaves_room
                && !c.queues
                && !c.starts_beside
        })
        .max_by(|(_, a), (_, b)| a.marginal_tps.total_cmp(&b.marginal_tps))
        .map(|(i, _)| i)
}

/// `on_miss: best_effort`: for a latency request whose prompt some backend holds, that backend
/// (the longest prefix, then the likeliest to meet the SLO): a request that misses its SLO
/// anyway costs the fleet least where its prefill is cached, while a cold prefill elsewhere
/// stalls every stream decoding there and evicts what that backend held. Otherwise where it
/// adds the most good completions: its chance of meeting the SLO (0 where nothing is
/// predicted) less what its prefill costs the streams there
/// ([`Candidate::stall_loss`]), then the least predicted violation, then the fewest in
/// flight. For a batch request, the most added throughput; without any prediction, the
/// fewest in flight.
pub(crate) fn best_effort(slo: &Slo, candidates: &[Candidate<'_>]) -> Option<usize> {
    let all = || candidates.iter().enumerate();
    let predicted = || all().filter(|(_, c)| c.prediction.is_some());
    let pick = if slo.is_batch() {
        predicted().max_by(|(_, a), (_, b)| a.marginal_tps.total_cmp(&b.marginal_tps))
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
/// less what its prefill costs the streams there, then the one predicted to miss by
/// less, then the one with fewer in flight.
fn likelier(a: &Candidate<'_>, b: &Candidate<'_>) -> std::cmp::Ordering {
    let gain = |c: &Candidate<'_>| c.chance - c.stall_loss;
    gain(a)
        .total_cmp(&gain(b))
        .then(a.slack.total_cmp(&b.slack))
        .then(b.joining.cmp(&a.joining))
}

/// Where nothing is feasible: an idle backend whose thin evidence predicts a miss, tried again
/// as a cold one is, outside the exploration budget and from the line too. A first answer
/// slowed by the engine's own cold start, or a fit through two samples, must not lock a
/// backend out while requests wait or fail elsewhere, and trying it costs nobody else
/// anything — where it shares no device, or the requests running beside it on its device
/// keep their speed with its pass beside them. Trying a serial engine beside a busy batch on
/// two CPU cores slowed the batch's every request fourfold: that is how the collapses on the
/// CPU engines began. Least confidence first.
pub(crate) fn idle_unproven(candidates: &[Candidate<'_>]) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.joining == 1
                && c.leaves_room
                && c.costs_others_nothing()
                && c.prediction.is_some_and(|p| p.confidence < 0.5)
        })
        .min_by(|(_, a), (_, b)| {
            let conf = |c: &Candidate<'_>| c.prediction.map_or(0.0, |p| p.confidence);
            conf(a).total_cmp(&conf(b))
        })
        .map(|(i, _)| i)
}

/// Where exploring teaches the most without breaking an SLO that can be predicted: a backend
/// whose curve has no confident answer at this concurrency (never observed, beyond twice the
/// concurrency it has seen, or a bucket gone stale), whose prediction — when there is one —
/// keeps this request's SLO, the speed of every class already there and (for batch work, which
/// holds a slot for long) room for the next latency request. Least confidence first.
///
/// Never one whose idle engine it would start on a device it shares
/// ([`Candidate::starts_shared`]): its passes run beside whatever the device's other engines
/// take meanwhile, and what that costs them is what exploring does not know. On two CPU cores
/// a serial engine explored beside two requests on the batching engine slowed every request on
/// both under the target for 30 s (the router refused 30 of 69). Explored only while the
/// device was idle, it still ran 0.4 s and more: the next arrivals went to its queue and beside
/// its pass, and in four runs of six the router then refused 3 to 7 requests. Such an engine is
/// tried again as its cold start and an idle engine on thin evidence are, where nothing is
/// feasible; joining an engine already running (a level its curve has not seen) adds no pass
/// and may still be explored.
pub(crate) fn exploration_target(slo: &Slo, candidates: &[Candidate<'_>]) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.starts_shared)
        .filter(|(_, c)| match c.prediction {
            None => true,
            Some(p) if c.joining == 1 && p.confidence < 0.5 => {
                c.leaves_room && c.costs_others_nothing()
            }
            Some(p) => {
                (p.beyond_evidence || p.confidence < 0.5)
                    && c.keeps_others
                    && c.leaves_room
                    && if slo.is_batch() {
                        !c.queues
                    } else {
                        c.slack >= 0.0
                    }
            }
        })
        .min_by(|(_, a), (_, b)| {
            let conf = |c: &Candidate<'_>| c.prediction.map_or(0.0, |p| p.confidence);
            conf(a).total_cmp(&conf(b))
        })
        .map(|(i, _)| i)
}

/// A baseline's pick. `round_robin`: in turn. `least_inflight`: fewest in flight, ties in turn.
/// `p2c_peak_ewma`: of two random candidates, the lower peak-EWMA TTFT x (in flight + 1) (the
/// load measure of Finagle, linkerd and tower's `PeakEwma`, with TTFT as the latency because a
/// stream's head arrives before its first token). `lowest_ttft`: the lowest recent TTFT (what
/// latency-based routers do).
/// `prefix_hash`: the backend (by router index) `pinned` holds the request's key, and is
/// taken while it is a candidate (in turn when it is not, or the request has no key).
pub(crate) fn baseline(
    policy: Policy,
    candidates: &[Candidate<'_>],
    turn: &AtomicUsize,
    pinned: Option<usize>,
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let n = candidates.len();
    let start = turn.fetch_add(1, Ordering::Relaxed) % n;
    let in_turn = (0..n).map(|k| (start + k) % n);
    match policy {
        Policy::LeastInflight => in_turn.min_by_key(|&i| candidates[i].joining),
        Policy::P2cPeakEwma => {
            let mut rng = rand::rng();
            let a = rng.random_range(0..n);
            let b = (a + rng.random_range(1..n.max(2))) % n;
            let cost = |i: usize| {
                let c = &candidates[i];
                c.backend.ttft_peak_ewma() * f64::from(c.joining)
            };
            Some(if cost(b) < cost(a) { b } else { a })
        }
        Policy::PrefixHash => pinned
            .and_then(|index| candidates.iter().position(|c| c.index == index))
            .or(Some(start)),
        Policy::LowestTtft => in_turn.min_by(|&a, &b| {
            candidates[a]
                .backend
                .ttft_ewma()
                .total_cmp(&candidates[b].backend.ttft_ewma())
        }),
        _ => Some(start),
    }
}
