//! Where a candidate's predictions come from for one request: its curve's fitted model (with the
//! request's uncached prompt, the queue and prefill ahead of it, the engines beside it on its
//! device), the simulator's truth, or nothing (a baseline policy).

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::time::Instant;

use super::oracle::Oracle;
use crate::curve::{Model, Prediction};
use crate::fleet::Backend;

/// The share of the time a request holds its slot by which a first token predicted later than
/// a lone one's is a wait behind the requests there, not a batch's jitter: a queue of 16 slots
/// turning over (see the curve's `QUEUE_GROWTH_SHARE`).
const QUEUED_SHARE: f64 = 1.0 / 16.0;

/// A candidate's fitted model. Where the backend publishes it, it is read there each time a
/// prediction is drawn, so that a candidate no rung asks about takes no count on it: at 256
/// backends, the counts taken and given back were a quarter of a decision
/// (docs/benchmarks/overhead.md, "Models read where they are published; a prompt's touches
/// counted as runs").
#[derive(Debug, Clone)]
pub(crate) enum Fitted<'r> {
    /// The backend's published model of a configured name.
    Published(&'r ArcSwapOption<Model>),
    /// A model in hand (a name the backend tracks under another, or its prior's), if any.
    Held(Option<Arc<Model>>),
}

impl Fitted<'_> {
    /// `read` of the model, `None` before the first observation.
    pub(crate) fn read<T>(&self, read: impl FnOnce(&Model) -> T) -> Option<T> {
        match self {
            Self::Published(slot) => slot.load().as_deref().map(read),
            Self::Held(model) => model.as_deref().map(read),
        }
    }
}

/// A backend's source of predictions for one request.
#[derive(Debug, Clone)]
pub(crate) enum Predictor<'r> {
    /// The backend's curve.
    Curve {
        /// Its fitted model (none before the first observation).
        model: Fitted<'r>,
        /// The backends sharing its device that run now.
        neighbours: f64,
        /// What each of them adds to its tokens ([`Devices::per_neighbour_s`](super::device::Devices::per_neighbour_s)).
        per_neighbour_s: f64,
        /// This request's prompt tokens the backend must prefill (its prefix cache's expected
        /// hit taken off).
        prompt_tokens: u64,
        /// How long the requests there still waiting for a first token have waited
        /// ([`Occupancy::waited`](crate::curve::Occupancy::waited)): a joining request waits
        /// behind them, which the curve learns only when their first tokens come.
        queue_s: f64,
        /// Uncached prompt tokens sent to the backend and not yet at a first token: prefill
        /// this request waits behind, whatever the curve says of the occupancy.
        prefill_waiting: u64,
        /// Its curve's prefill rate, or where that has none yet, the fastest the fleet has
        /// shown for the model: a first token comes no sooner than the prefill before it.
        prefill_rate: Option<f64>,
    },
    /// The simulator's truth for backend `usize`.
    Oracle(Option<&'r Oracle>, usize),
    /// None: a baseline policy decides without predictions.
    Nothing,
}

impl Predictor<'_> {
    /// Where the curve has no prefill rate yet, `fallback`'s: a backend whose prompts were all
    /// alike so far still queues a burst of long ones one after another (docs/benchmarks/
    /// routing.md, "A prompt's prefill charged to the streams it stalls").
    pub(crate) fn or_prefill_rate(mut self, fallback: impl FnOnce() -> Option<f64>) -> Self {
        if let Self::Curve { prefill_rate, .. } = &mut self
            && prefill_rate.is_none()
        {
            *prefill_rate = fallback();
        }
        self
    }

    /// Whether a request predicted `p` on `backend`, which runs, waits behind the requests
    /// there: its first token predicted later than a lone one's by more than [`QUEUED_SHARE`]
    /// of the time a request holds its slot. Its pass then runs once theirs end, beside
    /// whatever runs on the device then: batch work queued behind batch work on a serial
    /// engine keeps the device from the engine beside it the whole while
    /// (docs/benchmarks/real-engines.md, "Why the device's rules are as they are").
    pub(crate) fn queues(&self, backend: &Backend, p: &Prediction) -> bool {
        let Self::Curve { model, .. } = self else {
            return false;
        };
        if !backend.occupancy.busy() {
            return false;
        }
        let Some(mean_duration_s) = model.read(|m| m.mean_duration_s) else {
            return false;
        };
        p.ttft_p50_s - self.at(1.0).map_or(0.0, |a| a.ttft_p50_s) > QUEUED_SHARE * mean_duration_s
    }

    /// The good completions the streams on `backend` lose at `now` to this request's prefill,
    /// each streaming its remaining tokens at a speed drawn from `p`'s spread.
    pub(crate) fn stall_loss(
        &self,
        backend: &Backend,
        now: Instant,
        p: Option<&Prediction>,
    ) -> f64 {
        match self {
            Self::Curve {
                prompt_tokens,
                prefill_waiting,
                prefill_rate,
                ..
            } => backend.paces.stall_loss(
                now,
                p.map(|p| &p.tps),
                *prompt_tokens,
                *prefill_waiting,
                prefill_rate.map(|r| 1.0 / r),
            ),
            Self::Oracle(..) | Self::Nothing => 0.0,
        }
    }

    /// The same, with one more engine running beside the backend on its device.
    pub(crate) fn beside_one_more(mut self) -> Self {
        if let Self::Curve { neighbours, .. } = &mut self {
            *neighbours += 1.0;
        }
        self
    }

    /// The share of its speed a request streaming at `from` in flight keeps at `to`, by the
    /// fit: a smooth line through every level, where the difference of two levels' own
    /// quantiles is two samples' noise (docs/benchmarks/routing.md, "One more request's cost:
    /// the fit's slope, not two levels' difference").
    pub(crate) fn speed_kept(&self, from: f64, to: f64) -> Option<f64> {
        match self {
            Self::Curve {
                model,
                neighbours,
                per_neighbour_s,
                ..
            } => model.read(|m| {
                m.fit.tpot_s(from, *neighbours, *per_neighbour_s)
                    / m.fit.tpot_s(to, *neighbours, *per_neighbour_s)
            }),
            Self::Oracle(..) => Some(self.at(to)?.tps.median() / self.at(from)?.tps.median()),
            Self::Nothing => None,
        }
    }

    /// What a request joining at `concurrency` (itself included) would see.
    pub(crate) fn at(&self, concurrency: f64) -> Option<Prediction> {
        match self {
            Self::Curve {
                model,
                neighbours,
                per_neighbour_s,
                prompt_tokens,
                queue_s,
                prefill_waiting,
                prefill_rate,
            } => {
                // Prefills run one after another (a queue of prefills, as engines schedule
                // them): this one's first token comes after the waiting ones' and its own, and
                // the curve learned TTFT against the same count (`FirstToken::prompt_tokens`).
                let prefill = *prefill_waiting + *prompt_tokens;
                let mut p = model.read(|m| {
                    m.predict_beside(concurrency, *neighbours, *per_neighbour_s, prefill)
                })?;
                if concurrency > 1.0 {
                    p.raise_ttft(*queue_s);
                }
                if let Some(rate) = prefill_rate {
                    p.raise_ttft(prefill as f64 / rate);
                }
                Some(p)
            }
            Self::Oracle(oracle, index) => oracle.as_ref()?.predict(*index, concurrency),
            Self::Nothing => None,
        }
    }
}
