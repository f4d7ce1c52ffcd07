//! The baseline policies kept for comparison (round robin, least in-flight, p2c with peak EWMA,
//! lowest TTFT, prefix hash): they decide without curves, outside the decision ladder.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;

use super::candidates::Candidate;
use crate::config::Policy;

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
