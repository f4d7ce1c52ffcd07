//! Rung 7: with no candidate feasible at the class's percentiles, the request still goes where
//! it is most likely to meet its SLO, unless admitting it is predicted to cost the requests
//! already there more good completions than it adds. A percentile is a target for choosing,
//! not a cliff (docs/benchmarks/routing.md, "Noisy engines and marginal SLOs: no regret against the
//! baselines"; "The line at its turn, and the room for the next request").

use crate::config::OnMiss;
use crate::router::candidates::Candidate;
use crate::router::decision::Reason;
use crate::router::scene::{Pick, Rung, Scene};

/// The least a request sent where no backend meets its SLO at the class's percentiles must add
/// to the expected good completions (its own chance less what it costs the requests already
/// there): one in twenty. Below it the slot is worth more to a later request, and the class's
/// `on_miss` applies.
pub(crate) const MIN_CHANCE: f64 = 0.05;

/// The least a request of a class that queues must add to the expected good completions (its
/// chance less its cost to the others) to be committed to a backend that is full, meeting the
/// SLO alone but not with one more: likelier than not, and only by a request that finds its
/// class's line empty (at its turn in line, once no slot is expected to free in time, any
/// chance worth [`MIN_CHANCE`]). Waiting pays where a backend past its edge would fail the
/// request and slots free often; where a percentile is missed by a few outliers and a slot
/// frees once a second, waiting for an idle engine refuses most requests (docs/benchmarks/routing.md, "The
/// line at its turn, and the room for the next request").
pub(crate) const QUEUE_CHANCE: f64 = 0.5;

/// Where the request adds the most expected good completions.
#[derive(Debug)]
pub(crate) struct BestChance;

impl Rung for BestChance {
    fn name(&self) -> &'static str {
        "best_chance"
    }

    /// The candidate where the request's chance of meeting both targets, less what it costs
    /// the requests already there ([`Candidate::chance_gain`]), is largest, if at least
    /// [`MIN_CHANCE`]. For a class that queues a full backend ([`Candidate::full`]) must clear
    /// the bar [`waits`] sets for the request to go rather than wait. Once one candidate
    /// clears its bar the request goes, and it goes where it gains most: a full backend's bar
    /// weighs going against waiting, not one backend against another. Only where the line
    /// claims the full backends' slots (behind others, or at its turn with a slot due) does a
    /// full backend stay out. A prediction beyond the curve's evidence is a guess, and counts
    /// only where the backend's ramp would admit it anyway, or at a last resort, one guess at a
    /// time ([`Candidate::first_guess`]). Where the other end is a refusal or the line, a level
    /// whose speed is unproven takes one request as a probe, at the chance the level below's
    /// speed gives it ([`Candidate::probe_chance`]), read a few tokens in.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick> {
        let ask = scene.ask;
        let waits = waits(scene);
        let last_resort = scene.turn.as_ref().is_some_and(|t| *t.last_resort);
        let refused = scene.turn.is_some() || waits.is_none();
        // Its gain, whether it is a probe, and the bar it must clear for the request to go.
        let gain_of = |c: &Candidate<'_>| -> Option<(f64, bool, f64)> {
            let e = c.estimate()?;
            if refused && let Some(chance) = c.probe_chance(ask) {
                let gain = chance - e.neighbour_loss - c.stall_loss();
                return (gain >= MIN_CHANCE).then_some((gain, true, MIN_CHANCE));
            }
            if e.prediction.beyond_evidence && !c.ramping && !(last_resort && c.first_guess()) {
                return None;
            }
            let gain = c.chance_gain(scene.classes, e);
            let bar = match waits {
                Some(least) if c.full(ask) => least,
                _ => MIN_CHANCE,
            };
            (gain >= MIN_CHANCE && bar.is_finite()).then_some((gain, false, bar))
        };
        let mut goes = false;
        let mut best: Option<(usize, f64, bool)> = None;
        for (i, (gain, probe, bar)) in scene
            .candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| gain_of(c).map(|g| (i, g)))
        {
            goes |= gain >= bar;
            if best.is_none_or(|(_, most, _)| gain >= most) {
                best = Some((i, gain, probe));
            }
        }
        let (i, gain, probe) = best.filter(|_| goes)?;
        tracing::debug!(
            backend = &*scene.candidates[i].backend.config.name,
            gain,
            probe,
            queued = scene.turn.is_some(),
            last_resort,
            "best chance"
        );
        Some(Pick {
            candidate: i,
            reason: Reason::BestChance,
            read_early: probe,
        })
    }
}

/// The least a class that queues must gain to commit a request to a full backend, meeting its
/// SLO alone but not with one more: [`QUEUE_CHANCE`] arriving to an empty line, [`MIN_CHANCE`]
/// at its turn once no slot is expected in time (waiting could only end in a 429), never
/// (infinity) behind others or at its turn while a slot is expected, as the line pools the
/// fleet's slots better than a backend past its edge serves. `None` for a class that does not
/// queue.
fn waits(scene: &Scene<'_, '_>) -> Option<f64> {
    let least = match &scene.turn {
        Some(turn) if *turn.last_resort => MIN_CHANCE,
        Some(_) => f64::INFINITY,
        None if scene.line_empty => QUEUE_CHANCE,
        None => f64::INFINITY,
    };
    (scene.on_miss == OnMiss::Queue).then_some(least)
}
