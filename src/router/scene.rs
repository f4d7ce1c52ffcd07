//! What every rung of the decision ladder reads ([`Scene`]: one request and its evaluated
//! candidates) and what it answers ([`Pick`]), and the [`Rung`] it implements. Rungs import
//! this and [`super::candidates`], never the ladder that runs them (`ladder.rs`).

use std::cell::LazyCell;
use std::fmt::Debug;

use super::ask::Ask;
use super::candidates::Candidate;
use super::decision::Reason;
use crate::config::{ClassConfig, OnMiss, Policy};

/// One request as the ladder sees it: facts of the request and of the router's state at its
/// moment, computed once before the first rung, and its candidates, each evaluated.
#[derive(Debug)]
pub(crate) struct Scene<'s, 'r> {
    /// The request, with the TTFT budget it is held to (less the line's reserve, where others
    /// wait in its class's line).
    pub ask: &'s Ask<'s>,
    /// Its class's policy.
    pub policy: Policy,
    /// Every class, in config order: what the requests already on a backend are held to.
    pub classes: &'s [ClassConfig],
    /// Its candidates, evaluated.
    pub candidates: &'s [Candidate<'r>],
    /// What its class does when nothing is feasible.
    pub on_miss: OnMiss,
    /// It decides at its turn in its class's line (`None`: on arrival).
    pub turn: Option<Turn<'s>>,
    /// No request of its class waits in line.
    pub line_empty: bool,
    /// The exploration budget has room for it (never from the line, nor with the oracle).
    pub may_explore: bool,
    /// Its first-token target has not passed while it waited (counted from its arrival, the
    /// line's reserve aside).
    pub in_time: bool,
}

/// A request deciding at its turn in its class's line.
#[derive(Debug)]
pub(crate) struct Turn<'s> {
    /// No slot is expected to free before its first-token target (or its class's queue wait)
    /// runs out: waiting longer could only end in a 429. Read over the backends serving the
    /// model only when a rung asks (only where nothing is feasible).
    pub last_resort: LazyCell<bool, &'s dyn Fn() -> bool>,
}

/// A rung's answer: the candidate to take, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pick {
    /// Index into [`Scene::candidates`].
    pub candidate: usize,
    /// The route reason.
    pub reason: Reason,
    /// It probes a level of the backend's curve that no request has tried: the curve learns
    /// its speed from its first content events, not at its end.
    pub read_early: bool,
}

/// One rule of the routing decision: it looks at the scene and picks a candidate, or passes
/// to the next rung.
pub(crate) trait Rung: Debug + Sync {
    /// Its name, for the decision's debug line.
    fn name(&self) -> &'static str;

    /// The candidate this rung takes, or `None` to pass.
    fn pick(&self, scene: &Scene<'_, '_>) -> Option<Pick>;
}

impl Scene<'_, '_> {
    /// A pick of candidate `i` predicted to meet the SLO (or taking a never-observed backend's
    /// slow start): `queued` when the request waited in line for it.
    pub(crate) fn placed(&self, i: usize) -> Pick {
        let reason = if self.turn.is_some() {
            Reason::Queued
        } else if self.candidates[i].estimate().is_none() {
            Reason::ColdStart
        } else {
            Reason::Feasible
        };
        Pick {
            candidate: i,
            reason,
            read_early: false,
        }
    }
}

/// How many candidates [`kept_best`] asks the costly test of, one after the other, before it
/// asks it of all.
const KEPT_TRIES: usize = 4;

/// The candidate `best` chooses among those that pass `cheap` and `costly`, asking `costly`
/// (the prefill's stall over a backend's streams) only of the ones `best` would choose: the
/// best of those passing `cheap`, and if it fails `costly`, the best of the rest, and so on.
/// The answer is `best`'s over the candidates passing both, ties included; after
/// [`KEPT_TRIES`] failures every candidate is asked. A decision's cost then does not grow
/// with the streams in flight where the chosen backend keeps them
/// (docs/benchmarks/overhead.md, "The decision ladder").
pub(crate) fn kept_best<'a, 'r>(
    candidates: &'a [Candidate<'r>],
    cheap: impl Fn(&Candidate<'r>) -> bool,
    costly: impl Fn(&Candidate<'r>) -> bool,
    best: impl Fn(&mut dyn Iterator<Item = (usize, &'a Candidate<'r>)>) -> Option<usize>,
) -> Option<usize> {
    let mut failed = [usize::MAX; KEPT_TRIES];
    for tried in 0..KEPT_TRIES {
        let mut open = candidates
            .iter()
            .enumerate()
            .filter(|(i, c)| !failed[..tried].contains(i) && cheap(c));
        let i = best(&mut open)?;
        if costly(&candidates[i]) {
            return Some(i);
        }
        failed[tried] = i;
    }
    best(
        &mut candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| cheap(c) && costly(c)),
    )
}
