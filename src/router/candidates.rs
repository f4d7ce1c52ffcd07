//! The candidates of one request: each backend that serves its model, under its hard limit and
//! healthy (or all of those when none is), as the rungs of the decision ladder read it; what
//! its curve predicts there, when it predicts anything, is its [`Estimate`], drawn when a rung
//! first asks for it. Evaluating them is [`evaluate`](super::evaluate).

use std::cell::{Cell, OnceCell};
use std::sync::Arc;

use tokio::time::Instant;

use super::ask::Ask;
use super::device::NeighbourCost;
use super::predictor::Predictor;
use crate::config::{ClassConfig, Slo};
use crate::curve::Prediction;
use crate::fleet::{Backend, Hit};

/// One candidate backend as the router sees it for one request. What a rung of the decision
/// ladder needs of it is read here: a field where every decision needs it, a method where only
/// some rungs ask. Its estimate and the prefill's stall over the streams there are each drawn
/// once, when first asked: a rung that looks only at the backends holding the prompt predicts
/// nothing of the others (docs/benchmarks/overhead.md, "Estimates drawn when asked").
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'r> {
    /// Index in the router's backend list.
    pub index: usize,
    /// The backend.
    pub backend: &'r Arc<Backend>,
    /// In flight there once this request joins.
    pub joining: u32,
    /// What its prefix index expects of the request, `cached_tokens` no more than the prompt
    /// (nothing without an index).
    pub cache: Hit,
    /// It holds the request's prefix: at least `prefix_cache.min_match_tokens` of it, or the
    /// conversation's hint. Among the feasible, such a backend is preferred.
    pub holds_prefix: bool,
    /// Its rank in the rendezvous order of the request's prefix (higher first;
    /// [`crate::prefix::rendezvous`]), the same in every replica; `None` for a prompt shorter
    /// than `min_match_tokens` without a hint, which no backend holds in a way worth routing by.
    pub affinity: Option<u64>,
    /// Its ramp ([`crate::fleet::ramp`]) allows the request in flight where its curve has no
    /// evidence (never observed, or beyond twice the concurrency seen).
    pub ramping: bool,
    /// It is idle and shares its device (`device:`): the request would start its engine's
    /// passes beside whatever the engines sharing it run meanwhile.
    pub starts_shared: bool,
    /// It is idle and a backend sharing its device has requests in flight
    /// ([`Devices::active_beside`](super::device::Devices::active_beside)): the request would
    /// start its engine beside a running one.
    pub starts_beside: bool,
    /// Where its predictions come from, for this request at its moment.
    pub(super) predictor: Predictor<'r>,
    /// The moment of the decision.
    pub(super) now: Instant,
    /// What its estimate is drawn against.
    pub(super) terms: Terms<'r>,
    /// Its estimate, once asked ([`Candidate::estimate`]): boxed, so that the candidates a
    /// rung never asks about are not moved with room for one.
    pub(super) estimate: OnceCell<Option<Box<Estimate>>>,
    /// The good completions the streams there lose to this prompt's prefill, once asked
    /// ([`Candidate::stall_loss`]).
    pub(super) stall: Cell<Option<f64>>,
}

/// What a candidate's prediction says of the request there, and of the requests it would join.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Estimate {
    /// What this request would see there.
    pub prediction: Prediction,
    /// The request's own slack there ([`Slo::slack`](crate::config::Slo::slack)).
    pub slack: f64,
    /// The request's targets as they stand at the decision (its TTFT budget what it has left):
    /// what [`Estimate::chance`] is read against, only where a rung asks.
    pub slo: Slo,
    /// Every class already decoding there, and on the backends sharing its device, keeps its
    /// speed target (the prefill's stall aside: [`Candidate::keeps_others`]).
    pub keeps_classes: bool,
    /// What the requests decoding on the backends sharing its device lose of their expected
    /// good completions ([`NeighbourCost::loss`](super::device::NeighbourCost::loss)).
    pub neighbour_loss: f64,
    /// After this request joins, a request of every latency class could still join and meet its
    /// SLO there (or the backend cannot serve that class at all), and on every backend sharing
    /// its device with its pass beside them. Batch placement requires it, so that batch work
    /// only takes capacity interactive traffic is not about to need; true for a latency request.
    pub leaves_room: bool,
    /// System tokens per second this request adds there, `S(n) - S(n-1)` where `S(c)` is `c`
    /// requests of `T` tokens each taking `TTFT + T / TPS` (medians); for batch placement (0
    /// for a latency request).
    pub marginal_tps: f64,
    /// Where it shares a device: the most slack a next request like this one would find in the
    /// fleet once this one is placed here (one more on it, its engine running beside the
    /// backends on its device, the rest as they are); infinite elsewhere, where placing a
    /// request changes no other backend ([`Candidate::room`]).
    pub next_slack: f64,
}

/// What every candidate's estimate is drawn against, the same for the whole decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms<'r> {
    /// The request's targets as they stand at the decision.
    pub slo: Slo,
    /// Batch placement: the policy places throughput, or the request's class is batch.
    pub batch: bool,
    /// The output tokens the request is expected to stream.
    pub tokens: f64,
    /// Every class, in config order: what the requests already on a backend are held to.
    pub classes: &'r [ClassConfig],
}

impl Estimate {
    /// What prediction `p` of `backend` (its source `predictor`), which the request would join
    /// as the `joining`-th in flight, says of the request there and of the others, with what it
    /// costs the backends sharing its device (`next_slack` is set by the evaluator's look
    /// ahead, where a device is shared).
    pub(super) fn new(
        terms: &Terms<'_>,
        (backend, joining): (&Backend, u32),
        predictor: &Predictor<'_>,
        p: Prediction,
        neighbours: NeighbourCost,
    ) -> Self {
        let n = f64::from(joining);
        let tokens = terms.tokens;
        // System TPS of n requests: each yields T tokens per TTFT + T / TPS seconds, so a
        // backend that queues (TTFT growing with n) adds nothing by taking more.
        let system =
            |c: f64, p: &Prediction| c * tokens / (p.ttft_p50_s + tokens / p.per_user_tps_p50);
        let marginal_tps = if terms.batch {
            let before = if n > 1.0 {
                predictor.at(n - 1.0).map_or(0.0, |p| system(n - 1.0, &p))
            } else {
                0.0
            };
            system(n, &p) - before
        } else {
            0.0
        };
        Self {
            prediction: p,
            slack: terms.slo.slack(&p),
            slo: terms.slo,
            keeps_classes: classes_keep_speed(terms.classes, backend, &p) && neighbours.keeps,
            neighbour_loss: neighbours.loss,
            leaves_room: !terms.batch
                || (leaves_room(terms.classes, predictor, n + 1.0) && neighbours.leaves_room),
            marginal_tps,
            next_slack: f64::INFINITY,
        }
    }

    /// How likely the request is to meet both its targets there
    /// ([`Prediction::chance`](crate::curve::Prediction::chance)).
    pub(crate) fn chance(&self) -> f64 {
        self.prediction
            .chance(self.slo.min_tps, self.slo.max_ttft_s)
    }
}

/// Whether a latency-class request joining as the `next`-th would meet its SLO, for every
/// latency class of `classes` the backend can serve at all (a lone request meets it).
pub(super) fn leaves_room(classes: &[ClassConfig], predictor: &Predictor<'_>, next: f64) -> bool {
    let (Some(then), Some(alone)) = (predictor.at(next), predictor.at(1.0)) else {
        return true;
    };
    classes
        .iter()
        .filter(|c| !c.slo.is_batch() && c.slo.slack(&alone) >= 0.0)
        .all(|c| c.slo.slack(&then) >= 0.0)
}

/// Whether every class of `classes` with requests decoding on `backend` keeps its speed at `p`.
pub(super) fn classes_keep_speed(
    classes: &[ClassConfig],
    backend: &Backend,
    p: &Prediction,
) -> bool {
    classes
        .iter()
        .enumerate()
        .all(|(i, c)| backend.class_in_flight(i) == 0 || c.slo.speed_holds(p))
}

impl Candidate<'_> {
    /// What its curve (or the oracle) predicts there, drawn the first time it is asked;
    /// `None` for a backend never observed, and under a baseline policy, which predicts
    /// nothing. A backend sharing a device has its estimate drawn with the others' costs when
    /// it is evaluated.
    pub(crate) fn estimate(&self) -> Option<&Estimate> {
        self.estimate
            .get_or_init(|| {
                let p = self.predictor.at(f64::from(self.joining))?;
                Some(Box::new(Estimate::new(
                    &self.terms,
                    (self.backend, self.joining),
                    &self.predictor,
                    p,
                    NeighbourCost::NONE,
                )))
            })
            .as_deref()
    }

    /// Its prediction, if it has one.
    pub(crate) fn prediction(&self) -> Option<&Prediction> {
        self.estimate().map(|e| &e.prediction)
    }

    /// Meets the SLO on a prediction the curve stands behind, or its ramp does where the curve
    /// has not seen this concurrency, and keeps the others there ([`Candidate::keeps_others`]):
    /// what the rungs that choose among the feasible ask, in two steps.
    #[cfg(test)]
    pub(crate) fn feasible(&self) -> bool {
        self.meets_slo() && self.keeps_others()
    }

    /// [`Candidate::feasible`] but for the prefill's stall, which is read only when asked: what
    /// a rung filters on before it asks the stall of the few it would choose
    /// ([`Candidate::keeps_others`], [`super::scene::kept_best`]).
    pub(crate) fn meets_slo(&self) -> bool {
        self.estimate().is_some_and(|e| {
            (!e.prediction.beyond_evidence || self.ramping) && e.slack >= 0.0 && e.keeps_classes
        })
    }

    /// Predicted to meet the SLO and keep every class there, but beyond the concurrency its
    /// curve has seen: what exploration would try. The stall aside, as in
    /// [`Candidate::meets_slo`]: a rung asks [`Candidate::keeps_others`] next.
    pub(crate) fn may_stretch_slo(&self) -> bool {
        self.estimate()
            .is_some_and(|e| e.prediction.beyond_evidence && e.slack >= 0.0 && e.keeps_classes)
    }

    /// Every class already decoding there, and on the backends sharing its device, keeps its
    /// speed target (as far as anything is predicted), and this prompt's prefill costs the
    /// streams there less than half a good completion between them
    /// ([`Candidate::stall_loss`]).
    pub(crate) fn keeps_others(&self) -> bool {
        self.estimate().is_none_or(|e| e.keeps_classes) && self.stall_loss() < 0.5
    }

    /// The good completions the streams there lose to this prompt's prefill
    /// ([`Paces::stall_loss`](crate::fleet::paces::Paces::stall_loss)), read over the
    /// backend's streams the first time it is asked.
    pub(crate) fn stall_loss(&self) -> f64 {
        if let Some(loss) = self.stall.get() {
            return loss;
        }
        let loss = self
            .predictor
            .stall_loss(self.backend, self.now, self.prediction());
        self.stall.set(Some(loss));
        loss
    }

    /// What a request joining at `level` (itself included) would see here.
    pub(crate) fn at(&self, level: f64) -> Option<Prediction> {
        self.predictor.at(level)
    }

    /// Whether the requests already here are all within its curve's evidence, so that this
    /// one would be the only guess there. A curve seen at one or two in flight fits no cost per
    /// request: its guess is as fast at twelve as at three, and a line of requests each taking
    /// that guess at its turn would all stream under the target (docs/benchmarks/real-engines.md, "On a GPU: two
    /// `transformers serve` sharing one H200").
    pub(crate) fn first_guess(&self) -> bool {
        self.joining <= 1
            || self
                .at(f64::from(self.joining - 1))
                .is_some_and(|p| !p.beyond_evidence)
    }

    /// The request's chance here as a probe of a level whose speed is unproven
    /// ([`Prediction::unproven`]): the speed the requests here now are predicted, held flat one
    /// request up, its first token as predicted here. `None` where the level is proven, where a
    /// probe is out here and not read yet ([`LevelProbe`](crate::fleet::ramp::LevelProbe)),
    /// where the requests here are past the curve's evidence, or for an idle backend. A fit
    /// drawn through the levels below errs either way above them: too hopeful, it is corrected
    /// by the requests it lets in; too gloomy, by none, as it lets none in.
    pub(crate) fn probe_chance(&self, ask: &Ask<'_>) -> Option<f64> {
        let p = self.prediction().filter(|p| p.unproven)?;
        if self.backend.level_probe.out() {
            return None;
        }
        let now = f64::from(self.joining.checked_sub(1).filter(|&n| n > 0)?);
        let there = self.at(now)?;
        if there.beyond_evidence {
            return None;
        }
        let slo = ask.slo_at(ask.now);
        Some(p.with_speed(there.tps).chance(slo.min_tps, slo.max_ttft_s))
    }

    /// What admitting the request here (estimated `e`) adds to the expected good completions:
    /// its own chance of meeting its SLO, less what it costs the requests already here (per
    /// latency class of `classes` decoding here, its requests times how much less likely each
    /// is to reach its speed target once slowed by one more beside it, as the fit slows a
    /// request ([`Predictor::speed_kept`]); their first tokens are behind them, or ahead of
    /// this one in the queue) and on the backends sharing its device.
    pub(crate) fn chance_gain(&self, classes: &[ClassConfig], e: &Estimate) -> f64 {
        // The requests there now, and how their speed spreads with one more beside them.
        let slowed = || {
            let now = f64::from(self.joining.checked_sub(1).filter(|&n| n > 0)?);
            let before = self.at(now)?;
            let kept = self.predictor.speed_kept(now, now + 1.0)?;
            Some((before.tps, before.tps.scaled(kept.min(1.0))))
        };
        let loss = match slowed() {
            Some((before, after)) => classes
                .iter()
                .enumerate()
                .filter_map(|(i, class)| {
                    Some((self.backend.class_in_flight(i), class.slo.min_tps?))
                })
                .map(|(n, min)| {
                    f64::from(n) * (before.share_above(min) - after.share_above(min)).max(0.0)
                })
                .sum(),
            _ => 0.0,
        };
        e.chance() - loss.max(self.stall_loss()) - e.neighbour_loss
    }

    /// It meets the request's SLO at the class's percentiles alone: where nothing is feasible
    /// it is full, not short of the target, and a slot here frees for a request that waits.
    pub(crate) fn full(&self, ask: &Ask<'_>) -> bool {
        self.at(1.0)
            .is_some_and(|alone| ask.slo.slack(&alone) >= 0.0)
    }

    /// Never observed, and would take its first request alone, or one more that its ramp
    /// allows.
    pub(crate) fn cold_start(&self) -> bool {
        self.estimate().is_none() && (self.joining == 1 || self.ramping)
    }

    /// The room placing the request here leaves: its own slack, or the next request's where
    /// that is less. Two engines on one device, one serial: the serial one alone gives a lone
    /// request the most slack, and takes the device from the batch the next request would join.
    /// A backend never observed has no room to speak of: 0, below every backend that meets
    /// the SLO and above every one that misses it.
    pub(crate) fn room(&self) -> f64 {
        self.estimate().map_or(0.0, |e| e.slack.min(e.next_slack))
    }

    /// It runs, and the request would wait there behind the requests it has
    /// ([`Predictor::queues`]): batch work is not sent to wait in a backend's queue. Asked by
    /// the rungs that place batch work (a second prediction, of a lone request).
    pub(crate) fn queues(&self) -> bool {
        self.estimate()
            .is_some_and(|e| self.predictor.queues(self.backend, &e.prediction))
    }

    /// Taken on its ramp's evidence alone: a probe, whose first token and speed tell the ramp.
    pub(crate) fn on_ramp(&self) -> bool {
        self.ramping && self.estimate().is_none_or(|e| e.prediction.beyond_evidence)
    }
}
