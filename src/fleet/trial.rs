//! What one admitted request tries for its backend, beside being served: a probe of the slow
//! start ([`super::ramp`]: its first token and its speed tell the ramp whether to go on), and a
//! level probe of its curve, whose speed the curve learns from its first content events rather
//! than at its end. Most requests try neither and carry no `Trial`.

use std::sync::Arc;

use super::backend::Backend;
use super::ramp::{PROBE_EVENTS, Probe};

/// Content events a level probe streams before the curve learns its speed from them: twice
/// what the ramp judges a probe by, a rate over a few hundred milliseconds at tens of tokens a
/// second.
pub(crate) const EARLY_EVENTS: u32 = 2 * PROBE_EVENTS;

/// Whether a request's speed is taught to its curve early, from its first content events.
/// A level past a curve's evidence is tried one request at a time, and a whole request takes
/// seconds: read at its end, the probes climb one level per completed request
/// (docs/benchmarks/routing.md, "The line at its turn, and the room for the next request").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EarlyRead {
    /// At its end, as every request.
    No,
    /// Once it has streamed [`EARLY_EVENTS`] content events.
    Due,
    /// Done: its end teaches the curve nothing more.
    Done,
}

/// One request's probes of its backend (see the module doc). Dropped with the request's slot:
/// a level probe that ended before its speed was read lets the next one go.
#[derive(Debug)]
pub(crate) struct Trial {
    backend: Arc<Backend>,
    /// Admitted on the backend's ramp alone: what it tells the ramp, until its speed is told.
    probe: Option<Probe>,
    /// Its speed looked short a few events in: judged at its end, not per chunk.
    probe_at_end: bool,
    early: EarlyRead,
}

impl Trial {
    /// Nothing tried yet on `backend`.
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self {
            backend,
            probe: None,
            probe_at_end: false,
            early: EarlyRead::No,
        }
    }

    /// It was admitted on the backend's ramp alone with `admitted_with` in flight: its first
    /// token and its speed tell the ramp whether to go on.
    pub(crate) fn probe(
        &mut self,
        admitted_with: u32,
        max_ttft_s: Option<f64>,
        min_tps: Option<f64>,
    ) {
        self.probe = Some(Probe {
            admitted_with,
            max_ttft_s,
            min_tps,
        });
    }

    /// A probe whose speed the ramp has not been told yet, and may be told by its next chunk.
    pub(crate) fn probing(&self) -> bool {
        self.probe.is_some() && !self.probe_at_end
    }

    /// A probe whose speed the ramp has not been told yet (at its end, this is the last word).
    pub(crate) fn probe_unjudged(&self) -> bool {
        self.probe.is_some()
    }

    /// Its first token came `ttft_s` after it was sent: the ramp learns it if it is a probe.
    pub(crate) fn first_token(&self, ttft_s: f64) {
        if let Some(probe) = &self.probe
            && self.backend.ramp.first_token(probe, ttft_s)
        {
            self.backend.room_grew();
        }
    }

    /// A probe's speed, once. A few content events in ([`PROBE_EVENTS`], `events` so far, the
    /// first and the latest `visible_s` apart) each event taken as one token: at the target,
    /// the ramp grows at once. Below it, the judgment waits for the end (`ended`), where the
    /// stream's reported `tokens` say how many tokens its events carried: a hosted API that
    /// streams several tokens an event is not mistaken for a slow one.
    pub(crate) fn probe_speed(
        &mut self,
        events: u32,
        visible_s: f64,
        ended: bool,
        tokens: Option<u64>,
    ) {
        if !(ended || events >= PROBE_EVENTS) || events < 2 || visible_s <= 0.0 {
            if ended {
                self.probe = None;
            }
            return;
        }
        let Some(probe) = self.probe else {
            return;
        };
        let per_event = match tokens {
            Some(t) if ended && t > u64::from(events) => t as f64 / f64::from(events),
            _ => self.backend.chunking.per_event(),
        };
        let tps = f64::from(events - 1) * per_event / visible_s;
        if !ended && probe.min_tps.is_some_and(|min| tps < min) {
            self.probe_at_end = true;
            return;
        }
        self.probe = None;
        if self.backend.ramp.speed(&probe, tps) {
            self.backend.room_grew();
        }
    }

    /// It probes a level of its backend's curve that no request has tried: the curve learns
    /// its speed from its first [`EARLY_EVENTS`] content events ([`Trial::early_due`]), not
    /// from its whole stream at its end. The backend's next level probe waits until then.
    pub(crate) fn read_early(&mut self) {
        self.early = EarlyRead::Due;
        self.backend.level_probe.set(true);
    }

    /// A level probe whose speed the curve has not learned yet: `events` content events so far
    /// are enough to tell it.
    pub(crate) fn early_due(&self, events: u32) -> bool {
        self.early == EarlyRead::Due && events >= EARLY_EVENTS
    }

    /// Whether its speed is to be read early and has not been yet (checked per chunk).
    pub(crate) fn early_pending(&self) -> bool {
        self.early == EarlyRead::Due
    }

    /// The curve learned its speed early; its end teaches it nothing more.
    pub(crate) fn read_early_done(&mut self) {
        self.early = EarlyRead::Done;
        self.backend.level_probe.set(false);
    }

    /// Whether the curve learned its speed early ([`Trial::read_early`]).
    pub(crate) fn was_read_early(&self) -> bool {
        self.early == EarlyRead::Done
    }
}

impl Drop for Trial {
    fn drop(&mut self) {
        if self.early == EarlyRead::Due {
            // Ended or failed before its speed could be read: the next probe may go.
            self.backend.level_probe.set(false);
        }
    }
}
