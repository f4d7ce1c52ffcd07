//! Rung 5 (and the batch ladder's first choice): a never-observed backend takes the request on
//! its ramp, a lone request first, then one more per first token in time
//! ([`crate::fleet::ramp`]; docs/benchmarks/routing.md, "Cold start under load: a slow start").

use crate::router::candidates::Candidate;
use crate::router::scene::{Pick, Rung, Scene};

/// A never-observed backend's slow start.
#[derive(Debug)]
pub(crate) struct SlowStart;

impl Rung for SlowStart {
    fn name(&self) -> &'static str {
        "slow_start"
    }

    /// The never-observed backend with the fewest in flight; where its engine would start beside
    /// a running one on its device ([`Candidate::starts_beside`]), first the running backend a
    /// level past its evidence where its line meets the SLO ([`Candidate::may_stretch_slo`]), which
    /// adds no pass beside anything.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        let candidates = scene.candidates;
        let i = match cold(candidates) {
            Some(i) if candidates[i].starts_beside => stretch(candidates).unwrap_or(i),
            cold => cold?,
        };
        Some(scene.placed(i))
    }
}

/// The never-observed backend that would take the request with the fewest in flight (a lone
/// request, or one its ramp allows), one that would not start its engine beside a running one
/// on its device first. Two never-observed engines started together on one device take it from
/// each other, and each curve's first samples book the other's load as its own
/// (docs/benchmarks/real-engines.md, "Collapses on the CPU engines"); where nothing else can, the engine is still
/// started beside the other, rather than never tried.
pub(crate) fn cold(candidates: &[Candidate<'_>]) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.cold_start())
        .min_by_key(|(_, c)| (c.starts_beside, c.joining))
        .map(|(i, _)| i)
}

/// The candidate with the most room among those that [`Candidate::may_stretch_slo`].
fn stretch(candidates: &[Candidate<'_>]) -> Option<usize> {
    crate::router::scene::kept_best(
        candidates,
        Candidate::may_stretch_slo,
        Candidate::keeps_others,
        |open| {
            open.max_by(|(_, a), (_, b)| a.room().total_cmp(&b.room()))
                .map(|(i, _)| i)
        },
    )
}
