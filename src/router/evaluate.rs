//! Evaluating a request's candidates ([`Evaluator`]): for each backend that serves its model,
//! under its hard limit and healthy (or all of those when none is), what it would see at
//! in-flight + 1 (the new request slows everyone there), its slack, whether the classes already
//! decoding there keep their speed, and for batch work what it would add and whether it leaves
//! room for a latency request.

use std::cell::{Cell, OnceCell};
use std::sync::Arc;

use super::ask::{ASSUMED_OUTPUT_TOKENS, Ask, Reach};
use super::baseline;
use super::candidates::{Candidate, Estimate, Terms, classes_keep_speed, leaves_room};
use super::device::Devices;
use super::oracle::Oracle;
use super::predictor::Predictor;
use super::served::{Served, Server};
use crate::config::{ClassConfig, Policy, PrefixRouting};
use crate::curve::Prediction;
use crate::fleet::claim::EDGE;
use crate::fleet::{Backend, Hit};

/// What evaluating a request's candidates reads of the router: the backends and which of them
/// serve each model, the devices they share, the classes, the prefix index's settings and the
/// oracle. Borrowed for one decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evaluator<'r> {
    /// The backends, in config order.
    pub backends: &'r [Arc<Backend>],
    /// Which of them serve each model.
    pub served: &'r Served,
    /// Which of them share a device.
    pub devices: &'r Devices,
    /// The classes, in config order.
    pub classes: &'r [ClassConfig],
    /// Prefix-cache-aware routing's settings, unless it is off.
    pub prefix: Option<PrefixRouting>,
    /// The simulator's truth, when a class routes by it.
    pub oracle: Option<&'r Oracle>,
}

impl<'r> Evaluator<'r> {
    /// Backends in `reach` that serve `model`.
    pub(crate) fn reachable<'a>(
        self,
        model: &'a str,
        reach: Reach,
    ) -> impl Iterator<Item = Server<'r>> + use<'r, 'a> {
        let backends = self.backends;
        self.served
            .of(model)
            .filter_map(move |(i, slot)| Some(Server::new(i, backends.get(i)?, slot)))
            .filter(move |s| reach.reaches(s.backend.config.dialect, s.backend.config.translate))
    }

    /// Backends in the request's reach that serve the model and whose context window holds
    /// its prompt, but those it avoids.
    pub(crate) fn serving<'a>(
        self,
        ask: &'a Ask<'_>,
    ) -> impl Iterator<Item = Server<'r>> + use<'r, 'a> {
        self.reachable(ask.model, ask.reach)
            .filter(|s| !ask.avoid.contains(&s.index))
            .filter(|s| {
                let b = s.backend;
                b.windows.holds(&b.config, ask.model, ask.prompt_tokens)
            })
    }

    /// When the curves expect a slot to free, seconds from now: one over the rate the backends
    /// serving the model finish requests at, each its requests in flight over a request's mean
    /// duration there (infinite where no curve has a duration yet).
    pub(crate) fn slot_free_in_s(self, ask: &Ask<'_>) -> f64 {
        let per_s: f64 = self
            .serving(ask)
            .filter_map(|s| {
                let model = s.model(ask.model)?;
                (model.mean_duration_s > 0.0)
                    .then(|| f64::from(s.backend.in_flight().max(1)) / model.mean_duration_s)
            })
            .sum();
        per_s.recip()
    }

    /// The candidates for `ask`, each evaluated: serving, under the hard limit, healthy (or all
    /// of those when none is healthy).
    pub(crate) fn candidates(self, ask: &Ask<'_>, policy: Policy) -> Vec<Candidate<'r>> {
        let under_limit = |b: &Arc<Backend>| {
            b.config
                .max_concurrency
                .is_none_or(|limit| b.in_flight() < limit)
        };
        let now = ask.now;
        let basis = Basis::new(self, ask, policy);
        // Sized once: a candidate carries two spreads, and growing the list moves them all.
        let mut candidates: Vec<Candidate<'r>> = Vec::with_capacity(self.backends.len());
        // The healthy ones, in one pass; where none is, every one under its limit.
        let mut unhealthy = false;
        candidates.extend(
            self.serving(ask)
                .filter(|s| under_limit(s.backend))
                .filter(|s| {
                    let healthy = s.backend.is_healthy(now);
                    unhealthy |= !healthy;
                    healthy
                })
                .map(|s| self.candidate(&basis, s)),
        );
        if candidates.is_empty() && unhealthy {
            candidates.extend(
                self.serving(ask)
                    .filter(|s| under_limit(s.backend))
                    .map(|s| self.candidate(&basis, s)),
            );
        }
        if basis.predicts {
            self.look_ahead(ask, &mut candidates);
        }
        candidates
    }

    /// `server` as a candidate for the request `basis` was drawn from.
    fn candidate(self, basis: &Basis<'_, '_, 'r>, server: Server<'r>) -> Candidate<'r> {
        let Server { index, backend, .. } = server;
        let ask = basis.ask;
        let joining = backend.in_flight() + 1;
        let hit = match (&backend.prefix, ask.prefix) {
            (Some(index), Some(prefix)) => index.expected(prefix, ask.now),
            _ => Hit::default(),
        };
        let cached_tokens = hit.cached_tokens.min(ask.prompt_tokens);
        let cache = Hit {
            cached_tokens,
            ..hit
        };
        let predictor = if basis.predicts {
            self.predictor(server, ask, basis.policy, cached_tokens)
                .or_prefill_rate(|| *basis.fastest.get_or_init(|| self.fastest_prefill(ask)))
        } else {
            Predictor::Nothing
        };
        // A backend sharing a device is estimated now, with what it costs the others there
        // (whether it queues is asked only where they would pay for it); any other when a rung
        // first asks.
        let estimate = OnceCell::new();
        if self.devices.of(index).is_some() {
            let drawn = predictor.at(f64::from(joining)).map(|p| {
                let queues = predictor.queues(backend, &p);
                let neighbours = self
                    .devices
                    .cost(index, backend, queues, ask.model, self.classes);
                Box::new(Estimate::new(
                    &basis.terms,
                    (backend, joining),
                    &predictor,
                    p,
                    neighbours,
                ))
            });
            let _ = estimate.set(drawn);
        }
        Candidate {
            index,
            backend,
            joining,
            cache,
            holds_prefix: hit.hint || cached_tokens >= basis.min_match,
            affinity: basis
                .key
                .map(|k| crate::prefix::rendezvous(k, backend.rendezvous_seed)),
            ramping: basis.predicts && backend.ramp.allows(joining),
            starts_shared: basis.predicts && joining == 1 && self.devices.of(index).is_some(),
            starts_beside: basis.predicts && joining == 1 && self.devices.active_beside(index),
            predictor,
            now: ask.now,
            terms: basis.terms,
            estimate,
            stall: Cell::new(None),
        }
    }

    /// Sets `next_slack` on each candidate that shares a device and has a prediction. Where
    /// none shares one, nothing is predicted; where some do, two predictions more each, and a
    /// pass over the others.
    fn look_ahead(self, ask: &Ask<'_>, candidates: &mut [Candidate<'_>]) {
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
                c.estimate().filter(|_| shares(c))?;
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
                c.estimate().is_some_and(|e| {
                    !c.backend.occupancy.busy() || c.predictor.queues(c.backend, &e.prediction)
                })
            };
            let elsewhere = candidates
                .iter()
                .enumerate()
                .filter(|&(y, _)| y != x)
                .filter_map(|(y, c)| {
                    let e = c.estimate()?;
                    Some(if starts && device(c) == on {
                        ahead[y].map_or(f64::NEG_INFINITY, |(_, beside)| beside)
                    } else {
                        e.slack
                    })
                })
                .fold(f64::NEG_INFINITY, f64::max);
            if let Some(Some(e)) = candidates[x].estimate.get_mut() {
                e.next_slack = here.max(elsewhere);
            }
        }
    }

    /// Near candidate `c`'s edge, in a cluster with peers: the most requests the fleet may have
    /// there with this one among them, claimed in Redis before the request goes
    /// ([`crate::fleet::claim`]). Asked of the chosen candidate only: a few predictions more.
    pub(super) fn edge_of(self, ask: &Ask<'_>, c: &Candidate<'_>, policy: Policy) -> Option<u32> {
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
                return leaves_room(self.classes, predictor, at + 1.0);
            }
            match predictor.at(at) {
                Some(p) => {
                    (!p.beyond_evidence || backend.ramp.allows(m))
                        && slo.slack(&p) >= 0.0
                        && classes_keep_speed(self.classes, backend, &p)
                }
                None => m == 1 || backend.ramp.allows(m),
            }
        })
    }

    /// The fastest prefill any backend serving the model has shown: no backend clears a queue
    /// of prefill faster than that, one whose own curve has not told its rate yet included
    /// (all its prompts alike so far, or a few samples).
    fn fastest_prefill(self, ask: &Ask<'_>) -> Option<f64> {
        self.serving(ask)
            .filter_map(|s| s.model(ask.model)?.fit.prefill_tokens_per_s)
            .reduce(f64::max)
    }

    /// Where `backend`'s predictions come from for `ask`, which should find `cached_tokens` of
    /// its prompt in the backend's prefix cache: the oracle, or its curve's model (looked up
    /// once per request, whatever the number of concurrencies asked about), pricing only the
    /// uncached tokens as prefill.
    fn predictor(
        self,
        server: Server<'r>,
        ask: &Ask<'_>,
        policy: Policy,
        cached_tokens: u64,
    ) -> Predictor<'r> {
        let Server { index, backend, .. } = server;
        if policy == Policy::Oracle {
            Predictor::Oracle(self.oracle, index)
        } else {
            let model = server.fitted(ask.model);
            let (prefill_rate, per_neighbour_s) = model
                .read(|m| {
                    (
                        m.fit.prefill_tokens_per_s,
                        self.devices.per_neighbour_s(index, m, ask.model),
                    )
                })
                .unwrap_or((None, 0.0));
            Predictor::Curve {
                prefill_rate,
                per_neighbour_s,
                model,
                neighbours: self.devices.load(index),
                prompt_tokens: ask.prompt_tokens - cached_tokens,
                queue_s: backend.occupancy.waited(ask.now),
                prefill_waiting: backend.prefix.as_ref().map_or(0, |i| i.prefill_waiting()),
            }
        }
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

/// What every candidate of one request is evaluated against, drawn once per decision.
struct Basis<'a, 'b, 'r> {
    ask: &'a Ask<'b>,
    policy: Policy,
    /// The policy predicts (it is not a baseline).
    predicts: bool,
    /// What each candidate's estimate is drawn against.
    terms: Terms<'r>,
    /// The prefix index's `min_match_tokens` (none: no backend holds a prefix).
    min_match: u64,
    /// The request's key in rendezvous orders: its hint, else the block that makes a match.
    key: Option<u64>,
    /// The fleet's fastest prefill, asked of the first candidate whose curve has none.
    fastest: OnceCell<Option<f64>>,
}

impl<'a, 'b, 'r> Basis<'a, 'b, 'r> {
    fn new(eval: Evaluator<'r>, ask: &'a Ask<'b>, policy: Policy) -> Self {
        let min_match = eval.prefix.map_or(u64::MAX, |p| p.min_match_tokens);
        let key = eval.prefix.zip(ask.prefix).and_then(|(routing, prefix)| {
            let blocks = min_match.div_ceil(u64::from(routing.block_tokens.max(1)));
            prefix.hint.or_else(|| {
                let at = usize::try_from(blocks).ok()?.checked_sub(1)?;
                prefix.hashes.get(at).copied()
            })
        });
        Self {
            ask,
            policy,
            predicts: !baseline::is_baseline(policy),
            terms: Terms {
                slo: ask.slo_at(ask.now),
                batch: policy == Policy::Throughput || ask.slo.is_batch(),
                tokens: ask.max_tokens.map_or(ASSUMED_OUTPUT_TOKENS, f64::from),
                classes: eval.classes,
            },
            min_match,
            key,
            fastest: OnceCell::new(),
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
