//! The candidates of one request: each backend that serves its model, under its hard limit and
//! healthy (or all of those when none is), evaluated at in-flight + 1 (the new request slows
//! everyone there): its prediction, the request's slack, whether the classes already decoding
//! there keep their speed, and for batch work what it would add and whether it leaves room for a
//! latency request.

use std::cell::Cell;
use std::sync::Arc;

use tokio::time::Instant;

use super::device::NeighbourCost;
use super::oracle::Oracle;
use super::{ASSUMED_OUTPUT_TOKENS, Ask, Router, baseline};
use crate::config::{ClassConfig, Policy};
use crate::curve::{Model, Prediction};
use crate::fleet::claim::EDGE;
use crate::fleet::{Backend, Hit};

/// One candidate backend as the router sees it for one request. What a rung of the decision
/// ladder needs of it is read here: a field where every decision needs it, a method where only
/// some rungs ask (the prefill's stall over the streams there is read once, when first asked).
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'r> {
    /// Index in the router's backend list.
    pub index: usize,
    /// The backend.
    pub backend: &'r Arc<Backend>,
    /// In flight there once this request joins.
    pub joining: u32,
    /// What this request would see there; `None` for a backend never observed.
    pub prediction: Option<Prediction>,
    /// The request's own slack there ([`Slo::slack`]); 0 without a prediction.
    pub slack: f64,
    /// How likely the request is to meet both its targets there
    /// ([`Prediction::chance`](crate::curve::Prediction::chance), with the TTFT budget it has
    /// left); 0 without a prediction.
    pub chance: f64,
    /// Every class already decoding there, and on the backends sharing its device, keeps its
    /// speed target (the prefill's stall aside: [`Candidate::keeps_others`]).
    pub keeps_classes: bool,
    /// The good completions the streams there lose to this prompt's prefill, once asked
    /// ([`Candidate::stall_loss`]).
    stall: Cell<Option<f64>>,
    /// What the requests decoding on the backends sharing its device lose of their expected
    /// good completions ([`NeighbourCost::loss`]); 0 without a prediction.
    pub neighbour_loss: f64,
    /// After this request joins, a request of every latency class could still join and meet its
    /// SLO there (or the backend cannot serve that class at all), and on every backend sharing
    /// its device with its pass beside them ([`NeighbourCost::leaves_room`]). Batch placement
    /// requires it, so that batch work only takes capacity interactive traffic is not about to
    /// need.
    pub leaves_room: bool,
    /// System tokens per second this request adds there, `S(n) - S(n-1)` where `S(c)` is `c`
    /// requests of `T` tokens each taking `TTFT + T / TPS` (medians); computed for batch placement
    /// only (0 for a latency request, and without a prediction).
    pub marginal_tps: f64,
    /// Where it shares a device: the most slack a next request like this one would find in the
    /// fleet once this one is placed here (one more on it, its engine running beside the
    /// backends on its device, the rest as they are); infinite elsewhere, where placing a request changes no
    /// other backend ([`Candidate::room`]).
    pub next_slack: f64,
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
    /// Where its predictions come from, for this request at its moment.
    predictor: Predictor<'r>,
    /// The moment of the decision.
    now: Instant,
    /// It runs, and the request would wait there behind the requests it has
    /// ([`Predictor::queues`]): batch work is not sent to wait in a backend's queue.
    pub queues: bool,
    /// It is idle and shares its device (`device:`): the request would start its engine's
    /// passes beside whatever the engines sharing it run meanwhile.
    pub starts_shared: bool,
    /// It is idle and a backend sharing its device has requests in flight
    /// ([`Devices::active_beside`](super::device::Devices::active_beside)): the request would
    /// start its engine beside a running one.
    pub starts_beside: bool,
}

impl Candidate<'_> {
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
        self.prediction.is_some_and(|p| {
            (!p.beyond_evidence || self.ramping) && self.slack >= 0.0 && self.keeps_classes
        })
    }

    /// Predicted to meet the SLO and keep every class there, but beyond the concurrency its
    /// curve has seen: what exploration would try. The stall aside, as in
    /// [`Candidate::meets_slo`]: a rung asks [`Candidate::keeps_others`] next.
    pub(crate) fn may_stretch_slo(&self) -> bool {
        self.prediction
            .is_some_and(|p| p.beyond_evidence && self.slack >= 0.0 && self.keeps_classes)
    }

    /// Every class already decoding there, and on the backends sharing its device, keeps its
    /// speed target, and this prompt's prefill costs the streams there less than half a good
    /// completion between them ([`Candidate::stall_loss`]).
    pub(crate) fn keeps_others(&self) -> bool {
        self.keeps_classes && self.stall_loss() < 0.5
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
            .stall_loss(self.backend, self.now, self.prediction.as_ref());
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
    /// that guess at its turn would all stream under the target (BENCHMARKS.md, "On a GPU: two
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
        let p = self.prediction.filter(|p| p.unproven)?;
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

    /// What admitting the request here (predicted `p`) adds to the expected good completions:
    /// its own chance of meeting its SLO, less what it costs the requests already here (per
    /// latency class of `classes` decoding here, its requests times how much less likely each
    /// is to reach its speed target with one more beside it; their first tokens are behind them,
    /// or ahead of this one in the queue) and on the backends sharing its device. Where the
    /// class would rather wait (`waits` is `Some`) and the backend meets its SLO at the class's
    /// percentiles alone, the backend is full, not short of the target: the request is
    /// committed to it only where that adds at least what `waits` holds (else `None`), as it
    /// takes the slot a waiting request would get whichever backend frees first.
    pub(crate) fn chance_gain(
        &self,
        ask: &Ask<'_>,
        classes: &[ClassConfig],
        p: &Prediction,
        waits: Option<f64>,
    ) -> Option<f64> {
        let full = waits.is_some()
            && self
                .at(1.0)
                .is_some_and(|alone| ask.slo.slack(&alone) >= 0.0);
        let loss = match self.at(f64::from(self.joining.saturating_sub(1))) {
            Some(before) if self.joining > 1 => classes
                .iter()
                .enumerate()
                .filter_map(|(i, class)| {
                    Some((self.backend.class_in_flight(i), class.slo.min_tps?))
                })
                .map(|(n, min)| {
                    f64::from(n) * (before.tps.share_above(min) - p.tps.share_above(min)).max(0.0)
                })
                .sum(),
            _ => 0.0,
        };
        let gain = self.chance - loss.max(self.stall_loss()) - self.neighbour_loss;
        (!full || waits.is_some_and(|least| gain >= least)).then_some(gain)
    }

    /// Never observed, and would take its first request alone, or one more that its ramp
    /// allows.
    pub(crate) fn cold_start(&self) -> bool {
        self.prediction.is_none() && (self.joining == 1 || self.ramping)
    }

    /// The room placing the request here leaves: its own slack, or the next request's where
    /// that is less. Two engines on one device, one serial: the serial one alone gives a lone
    /// request the most slack, and takes the device from the batch the next request would join.
    pub(crate) fn room(&self) -> f64 {
        self.slack.min(self.next_slack)
    }

    /// Taken on its ramp's evidence alone: a probe, whose first token and speed tell the ramp.
    pub(crate) fn on_ramp(&self) -> bool {
        self.ramping && self.prediction.is_none_or(|p| p.beyond_evidence)
    }
}

impl Router {
    /// The candidates for `ask`, each evaluated: serving, under the hard limit, healthy (or all
    /// of those when none is healthy).
    pub(crate) fn candidates(&self, ask: &Ask<'_>, policy: Policy) -> Vec<Candidate<'_>> {
        let under_limit = |b: &Arc<Backend>| {
            b.config
                .max_concurrency
                .is_none_or(|limit| b.in_flight() < limit)
        };
        let now = ask.now;
        let healthy_exists = self
            .serving(ask)
            .any(|(_, b)| under_limit(b) && b.is_healthy(now));
        let predicts = !baseline::is_baseline(policy);
        let slo = ask.slo_at(now);
        let min_match = self.routing.prefix.map_or(u64::MAX, |p| p.min_match_tokens);
        // A request's key in rendezvous orders: its hint, else the block that makes a match.
        let key = self
            .routing
            .prefix
            .zip(ask.prefix)
            .and_then(|(routing, prefix)| {
                let blocks = min_match.div_ceil(u64::from(routing.block_tokens.max(1)));
                prefix.hint.or_else(|| {
                    let at = usize::try_from(blocks).ok()?.checked_sub(1)?;
                    prefix.hashes.get(at).copied()
                })
            });
        let fastest = std::cell::OnceCell::new();
        // Sized once: a candidate carries two spreads, and growing the list moves them all.
        let mut candidates: Vec<Candidate<'_>> = Vec::with_capacity(self.backends.len());
        candidates.extend(
            self.serving(ask)
                .filter(|(_, b)| under_limit(b) && (!healthy_exists || b.is_healthy(now)))
                .map(|(index, backend)| {
                    let joining = backend.in_flight() + 1;
                    let hit = match (&backend.prefix, ask.prefix) {
                        (Some(index), Some(prefix)) => index.expected(prefix, now),
                        _ => Hit::default(),
                    };
                    let cached_tokens = hit.cached_tokens.min(ask.prompt_tokens);
                    let holds_prefix = hit.hint || cached_tokens >= min_match;
                    let cache = Hit {
                        cached_tokens,
                        ..hit
                    };
                    let affinity =
                        key.map(|k| crate::prefix::rendezvous(k, backend.rendezvous_seed));
                    if !predicts {
                        return Candidate {
                            index,
                            backend,
                            joining,
                            prediction: None,
                            slack: 0.0,
                            chance: 0.0,
                            keeps_classes: true,
                            stall: Cell::new(Some(0.0)),
                            neighbour_loss: 0.0,
                            leaves_room: true,
                            marginal_tps: 0.0,
                            next_slack: f64::INFINITY,
                            cache,
                            holds_prefix,
                            affinity,
                            ramping: false,
                            predictor: Predictor::Nothing,
                            now,
                            queues: false,
                            starts_shared: false,
                            starts_beside: false,
                        };
                    }
                    let n = f64::from(joining);
                    let predictor = self
                        .predictor(index, backend, ask, policy, now, cache.cached_tokens)
                        .or_prefill_rate(|| *fastest.get_or_init(|| self.fastest_prefill(ask)));
                    let prediction = predictor.at(n);
                    let batch = policy == Policy::Throughput || ask.slo.is_batch();
                    // System TPS of n requests: each yields T tokens per TTFT + T / TPS seconds,
                    // so a backend that queues (TTFT growing with n) adds nothing by taking more.
                    let tokens = ask.max_tokens.map_or(ASSUMED_OUTPUT_TOKENS, f64::from);
                    let system = |c: f64, p: &Prediction| {
                        c * tokens / (p.ttft_p50_s + tokens / p.per_user_tps_p50)
                    };
                    let before = if batch && joining > 1 {
                        predictor.at(n - 1.0).map_or(0.0, |p| system(n - 1.0, &p))
                    } else {
                        0.0
                    };
                    let queues = prediction
                        .as_ref()
                        .is_some_and(|p| predictor.queues(backend, p));
                    let neighbours = match prediction {
                        Some(_) => {
                            self.devices
                                .cost(index, backend, queues, ask.model, &self.classes)
                        }
                        None => NeighbourCost::NONE,
                    };
                    let leaves_room =
                        !batch || (self.leaves_room(&predictor, n + 1.0) && neighbours.leaves_room);
                    Candidate {
                        index,
                        backend,
                        joining,
                        prediction,
                        slack: prediction.as_ref().map_or(0.0, |p| slo.slack(p)),
                        chance: prediction
                            .as_ref()
                            .map_or(0.0, |p| p.chance(slo.min_tps, slo.max_ttft_s)),
                        keeps_classes: prediction
                            .as_ref()
                            .is_none_or(|p| self.classes_keep_speed(backend, p))
                            && neighbours.keeps,
                        stall: Cell::new(None),
                        neighbour_loss: neighbours.loss,
                        leaves_room,
                        marginal_tps: if batch {
                            prediction.as_ref().map_or(0.0, |p| system(n, p) - before)
                        } else {
                            0.0
                        },
                        next_slack: f64::INFINITY,
                        cache,
                        holds_prefix,
                        affinity,
                        ramping: backend.ramp.allows(joining),
                        predictor,
                        now,
                        queues,
                        starts_shared: joining == 1 && self.devices.of(index).is_some(),
                        starts_beside: joining == 1 && self.devices.active_beside(index),
                    }
                }),
        );
        if predicts {
            self.look_ahead(ask, &mut candidates);
        }
        candidates
    }

    /// Sets `next_slack` on each candidate that shares a device and has a prediction. Where
    /// none shares one, nothing is predicted; where some do, two predictions more each, and a
    /// pass over the others.
    fn look_ahead(&self, ask: &Ask<'_>, candidates: &mut [Candidate<'_>]) {
        let shares = |c: &Candidate<'_>| self.devices.of(c.index).is_some();
        if !candidates.iter().any(shares) {
            return;
        }
        let slo = ask.slo_at(ask.now);
        let slack = |p: Option<Prediction>| p.map_or(f64::NEG_INFINITY, |p| slo.slack(&p));
        // Per candidate: the next request's slack there with one more on it, and with one more
        // on a backend beside it.
        let ahead: Vec<Option<(f64, f64)>> = candidates
            .iter()
            .map(|c| {
                c.prediction.filter(|_| shares(c))?;
                let n = f64::from(c.joining);
                Some((
                    slack(c.at(n + 1.0)),
                    slack(c.predictor.clone().beside_one_more().at(n)),
                ))
            })
            .collect();
        fn device<'r>(c: &Candidate<'r>) -> Option<&'r str> {
            c.backend.config.device.as_deref()
        }
        for x in 0..candidates.len() {
            let Some((here, _)) = ahead[x] else {
                continue;
            };
            let on = device(&candidates[x]);
            // A request that starts an idle engine, or queues on a busy one, puts its pass
            // beside the others on its device; one that joins a running pass changes nothing
            // for them.
            let starts = {
                let c = &candidates[x];
                c.prediction.is_some_and(|p| {
                    !c.backend.occupancy.busy() || c.predictor.queues(c.backend, &p)
                })
            };
            let elsewhere = candidates
                .iter()
                .enumerate()
                .filter(|&(y, c)| y != x && c.prediction.is_some())
                .map(|(y, c)| {
                    if starts && device(c) == on {
                        ahead[y].map_or(f64::NEG_INFINITY, |(_, beside)| beside)
                    } else {
                        c.slack
                    }
                })
                .fold(f64::NEG_INFINITY, f64::max);
            candidates[x].next_slack = here.max(elsewhere);
        }
    }

    /// Near candidate `c`'s edge, in a cluster with peers: the most requests the fleet may have
    /// there with this one among them, claimed in Redis before the request goes
    /// ([`crate::fleet::claim`]). Asked of the chosen candidate only: a few predictions more.
    pub(super) fn edge_of(&self, ask: &Ask<'_>, c: &Candidate<'_>, policy: Policy) -> Option<u32> {
        let backend = c.backend;
        if !backend.claims_slots() {
            return None;
        }
        let cap = backend.config.max_concurrency;
        if baseline::is_baseline(policy) {
            return edge(cap, c.joining, |_| true);
        }
        let slo = ask.slo_at(ask.now);
        let predictor = &c.predictor;
        let batch = policy == Policy::Throughput || ask.slo.is_batch();
        edge(cap, c.joining, |m| {
            let at = f64::from(m);
            if batch {
                return self.leaves_room(predictor, at + 1.0);
            }
            match predictor.at(at) {
                Some(p) => {
                    (!p.beyond_evidence || backend.ramp.allows(m))
                        && slo.slack(&p) >= 0.0
                        && self.classes_keep_speed(backend, &p)
                }
                None => m == 1 || backend.ramp.allows(m),
            }
        })
    }

    /// The fastest prefill any backend serving the model has shown: no backend clears a queue
    /// of prefill faster than that, one whose own curve has not told its rate yet included
    /// (all its prompts alike so far, or a few samples).
    fn fastest_prefill(&self, ask: &Ask<'_>) -> Option<f64> {
        self.serving(ask)
            .filter_map(|(_, b)| b.model(ask.model)?.fit.prefill_tokens_per_s)
            .reduce(f64::max)
    }

    /// Where `backend`'s predictions come from for `ask`, which should find `cached_tokens` of
    /// its prompt in the backend's prefix cache: the oracle, or its curve's model (looked up
    /// once per request, whatever the number of concurrencies asked about), pricing only the
    /// uncached tokens as prefill.
    fn predictor(
        &self,
        index: usize,
        backend: &Backend,
        ask: &Ask<'_>,
        policy: Policy,
        now: Instant,
        cached_tokens: u64,
    ) -> Predictor<'_> {
        if policy == Policy::Oracle {
            Predictor::Oracle(self.oracle.as_ref(), index)
        } else {
            let model = backend.model(ask.model);
            Predictor::Curve {
                prefill_rate: model.as_ref().and_then(|m| m.fit.prefill_tokens_per_s),
                per_neighbour_s: model
                    .as_ref()
                    .map_or(0.0, |m| self.devices.per_neighbour_s(index, m, ask.model)),
                model,
                neighbours: self.devices.load(index),
                prompt_tokens: ask.prompt_tokens - cached_tokens,
                queue_s: backend.occupancy.waited(now),
                prefill_waiting: backend.prefix.as_ref().map_or(0, |i| i.prefill_waiting()),
            }
        }
    }

    /// Whether a latency-class request joining as the `next`-th would meet its SLO, for every
    /// latency class the backend can serve at all (a lone request meets it).
    fn leaves_room(&self, predictor: &Predictor<'_>, next: f64) -> bool {
        let (Some(then), Some(alone)) = (predictor.at(next), predictor.at(1.0)) else {
            return true;
        };
        self.classes
            .iter()
            .filter(|c| !c.slo.is_batch() && c.slo.slack(&alone) >= 0.0)
            .all(|c| c.slo.slack(&then) >= 0.0)
    }

    /// Whether every class with requests decoding on `backend` keeps its speed at `p`.
    fn classes_keep_speed(&self, backend: &Backend, p: &Prediction) -> bool {
        self.classes
            .iter()
            .enumerate()
            .all(|(i, c)| backend.class_in_flight(i) == 0 || c.slo.speed_holds(p))
    }
}

/// The most requests the fleet may have on a backend with this one among them (`joining` in
/// this replica's view), when fewer than [`EDGE`] fit from `joining` on: the last count that
/// `fits` the request and the backend's `max_concurrency`. `None` far from the edge; where the request
/// does not fit even now (best effort, exploration), only the hard limit binds it.
fn edge(max_concurrency: Option<u32>, joining: u32, fits: impl Fn(u32) -> bool) -> Option<u32> {
    let cap = max_concurrency.unwrap_or(u32::MAX);
    let near = joining.saturating_add(EDGE - 1);
    let last = (joining..=near)
        .take_while(|&m| m <= cap && fits(m))
        .last()
        .unwrap_or(cap);
    (last < near).then_some(last)
}

/// The share of the time a request holds its slot by which a first token predicted later than
/// a lone one's is a wait behind the requests there, not a batch's jitter: a queue of 16 slots
/// turning over (see the curve's `QUEUE_GROWTH_SHARE`).
const QUEUED_SHARE: f64 = 1.0 / 16.0;

/// A backend's source of predictions for one request.
#[derive(Debug, Clone)]
enum Predictor<'r> {
    /// The backend's curve.
    Curve {
        /// Its fitted model (none before the first observation).
        model: Option<Arc<Model>>,
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
    /// alike so far still queues a burst of long ones one after another. On the Azure trace,
    /// three prompts of seconds of prefill went one after another to a pod whose curve had
    /// seen three, none of them waiting; it still predicted 0.6 s, and seven more followed.
    fn or_prefill_rate(mut self, fallback: impl FnOnce() -> Option<f64>) -> Self {
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
    /// whatever runs on the device then. On the H200's pair (and its copy in the simulator) a
    /// serial engine took batch work queued behind batch work, each request joining an engine
    /// already running, and kept the device from the batching engine beside it the whole
    /// while.
    fn queues(&self, backend: &Backend, p: &Prediction) -> bool {
        let Self::Curve { model: Some(m), .. } = self else {
            return false;
        };
        backend.occupancy.busy()
            && p.ttft_p50_s - self.at(1.0).map_or(0.0, |a| a.ttft_p50_s)
                > QUEUED_SHARE * m.mean_duration_s
    }

    /// The good completions the streams on `backend` lose at `now` to this request's prefill,
    /// each streaming its remaining tokens at a speed drawn from `p`'s spread.
    fn stall_loss(&self, backend: &Backend, now: Instant, p: Option<&Prediction>) -> f64 {
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
    fn beside_one_more(mut self) -> Self {
        if let Self::Curve { neighbours, .. } = &mut self {
            *neighbours += 1.0;
        }
        self
    }

    /// What a request joining at `concurrency` (itself included) would see.
    fn at(&self, concurrency: f64) -> Option<Prediction> {
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
                let model = model.as_ref()?;
                // Prefills run one after another (a queue of prefills, as engines schedule
                // them): this one's first token comes after the waiting ones' and its own, and
                // the curve learned TTFT against the same count (`FirstToken::prompt_tokens`).
                let prefill = *prefill_waiting + *prompt_tokens;
                let mut p =
                    model.predict_beside(concurrency, *neighbours, *per_neighbour_s, prefill);
                if concurrency > 1.0 {
                    p = p.ttft_at_least(*queue_s);
                }
                if let Some(rate) = prefill_rate {
                    p = p.ttft_at_least(prefill as f64 / rate);
                }
                Some(p)
            }
            Self::Oracle(oracle, index) => oracle.as_ref()?.predict(*index, concurrency),
            Self::Nothing => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_claimed_only_when_fewer_than_three_requests_would_still_fit() {
        let knee_at = |k: u32| move |m: u32| m <= k;
        // Far from the knee and the limit: nothing to claim.
        assert_eq!(edge(None, 1, knee_at(10)), None);
        assert_eq!(edge(Some(10), 8, knee_at(100)), None);
        // Within three of the knee: the limit is the knee.
        assert_eq!(edge(None, 9, knee_at(10)), Some(10));
        assert_eq!(edge(None, 1, knee_at(1)), Some(1), "a serial backend");
        // Within three of `max_concurrency`, whichever comes first.
        assert_eq!(edge(Some(3), 1, knee_at(100)), None, "three fit: 1, 2, 3");
        assert_eq!(edge(Some(3), 2, knee_at(100)), Some(3));
        assert_eq!(edge(Some(9), 8, knee_at(8)), Some(8));
        // A request that does not fit even now (best effort) is bound by the limit alone.
        assert_eq!(edge(Some(4), 3, knee_at(1)), Some(4));
        assert_eq!(edge(None, 3, knee_at(1)), None);
    }
}
