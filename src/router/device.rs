//! Backends that share a device (`device:` in their config): two engines on one GPU, or on one
//! host's cores, take compute from each other. The device runs one engine's forward pass at a
//! time, so while one runs (has a request decoding) every request decoding on another waits
//! for its pass too, however many requests that pass carries. Each backend's curve learns its
//! speed against how many of its neighbours run as well as its own load
//! (`Fit::tpot_per_neighbour_s`), and a request that starts an idle engine is charged what it
//! costs the requests on the others, as it is charged what it costs those on its own backend;
//! one that joins an engine already running adds no pass (docs/routing.md, "Backends that
//! share a device").

use std::sync::Arc;

use crate::config::ClassConfig;
use crate::curve::Model;
use crate::fleet::Backend;

/// Per backend (by index in the router's list): the others on its device.
#[derive(Debug, Default)]
pub(crate) struct Devices {
    by_backend: Vec<Option<Neighbours>>,
}

/// The backends sharing one backend's device, itself left out.
#[derive(Debug)]
struct Neighbours {
    /// Their indexes in the router's list.
    indexes: Box<[usize]>,
    /// The same backends, for the in-flight guards that learn against their load.
    backends: Arc<[Arc<Backend>]>,
}

/// What placing one more request on a backend does to the requests decoding on its neighbours.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NeighbourCost {
    /// Every class decoding on a neighbour keeps its speed target there.
    pub keeps: bool,
    /// The expected good completions they lose: per neighbour and latency class, its requests
    /// times how much less likely each is to reach its speed target.
    pub loss: f64,
    /// A request of every latency class a neighbour can serve alone could still join it and
    /// meet its SLO with this pass beside it: batch work on one engine must not take the room
    /// latency traffic needs on another (a batch request on a serial engine holds the device
    /// for its whole run, however the load beside it grows meanwhile).
    pub leaves_room: bool,
}

impl NeighbourCost {
    /// No neighbours, or none with requests decoding.
    pub(crate) const NONE: Self = Self {
        keeps: true,
        loss: 0.0,
        leaves_room: true,
    };
}

impl Devices {
    /// Groups `backends` by their `device:` names.
    pub(crate) fn new(backends: &[Arc<Backend>]) -> Self {
        let device = |i: usize| backends[i].config.device.as_deref();
        let by_backend = (0..backends.len())
            .map(|i| {
                let name = device(i)?;
                let indexes: Box<[usize]> = (0..backends.len())
                    .filter(|&j| j != i && device(j) == Some(name))
                    .collect();
                (!indexes.is_empty()).then(|| Neighbours {
                    backends: indexes.iter().map(|&j| Arc::clone(&backends[j])).collect(),
                    indexes,
                })
            })
            .collect();
        Self { by_backend }
    }

    /// The backends sharing backend `index`'s device; `None` where it shares none.
    pub(crate) fn of(&self, index: usize) -> Option<&Arc<[Arc<Backend>]>> {
        self.neighbours(index).map(|n| &n.backends)
    }

    fn neighbours(&self, index: usize) -> Option<&Neighbours> {
        self.by_backend.get(index)?.as_ref()
    }

    /// The backends sharing backend `index`'s device that run now (a request past its first
    /// token: one waiting in an engine's queue costs the device nothing yet).
    pub(crate) fn load(&self, index: usize) -> f64 {
        self.neighbours(index).map_or(0.0, |n| {
            n.backends.iter().filter(|b| b.occupancy.busy()).count() as f64
        })
    }

    /// Whether a backend sharing backend `index`'s device has requests in flight (prefilling,
    /// decoding or queued behind those): a request that starts backend `index` would run beside
    /// it.
    pub(crate) fn active_beside(&self, index: usize) -> bool {
        self.neighbours(index)
            .is_some_and(|n| n.backends.iter().any(|b| b.in_flight() > 0))
    }

    /// What an engine running beside backend `index` adds to each of its tokens, by `curve`,
    /// its curve for `model`: the curve's own neighbour term, or where its samples cannot tell
    /// one (the engine beside it always ran, or never), the most that any engine on its device
    /// has learned for the model; where none has learned one yet, what a lone token takes on
    /// the engines beside it, the most a pass can take. Erring gloomy is corrected by the first
    /// requests run beside each other; charging nothing let a serial engine's passes slow a
    /// batching engine's requests as if free (docs/benchmarks/real-engines.md, "Why the
    /// device's rules are as they are").
    pub(crate) fn per_neighbour_s(&self, index: usize, curve: &Model, model: &str) -> f64 {
        let own = curve.fit.tpot_per_neighbour_s;
        if own > 0.0 {
            return own;
        }
        self.neighbours(index).map_or(0.0, |n| {
            let curves = || n.backends.iter().filter_map(|b| b.model(model));
            let learned = curves()
                .map(|m| m.fit.tpot_per_neighbour_s)
                .fold(0.0, f64::max);
            if learned > 0.0 {
                return learned;
            }
            curves()
                .map(|m| m.fit.tpot_s(1.0, 0.0, 0.0))
                .fold(0.0, f64::max)
        })
    }

    /// What one more request of `model` on `backend` (index `index`) costs the requests
    /// decoding on its neighbours, by their curves for the same model (a neighbour without one
    /// is charged nothing: nothing says what it would lose). A request that starts an idle
    /// engine adds its pass beside them; one that `queues` behind the requests on a running
    /// engine keeps its pass beside them once theirs end; one that joins a running pass costs
    /// them nothing.
    pub(crate) fn cost(
        &self,
        index: usize,
        backend: &Backend,
        queues: bool,
        model: &str,
        classes: &[ClassConfig],
    ) -> NeighbourCost {
        let Some(neighbours) = self.neighbours(index) else {
            return NeighbourCost::NONE;
        };
        let running = backend.occupancy.busy();
        if running && !queues {
            return NeighbourCost::NONE;
        }
        // Beside the neighbours' load as it will be without this request: a queued one's
        // pass comes once the running one's has ended.
        let without = if running { -1.0 } else { 0.0 };
        let mut cost = NeighbourCost::NONE;
        for (&j, neighbour) in neighbours.indexes.iter().zip(neighbours.backends.iter()) {
            let Some(curve) = neighbour.model(model) else {
                continue;
            };
            let own = f64::from(neighbour.in_flight());
            let load = self.load(j) + without;
            let per_pass = self.per_neighbour_s(j, &curve, model);
            let alone = curve.predict_beside(1.0, 0.0, per_pass, 0);
            let next = curve.predict_beside(own + 1.0, load + 1.0, per_pass, 0);
            cost.leaves_room &= classes
                .iter()
                .filter(|c| !c.slo.is_batch() && c.slo.slack(&alone) >= 0.0)
                .all(|c| c.slo.slack(&next) >= 0.0);
            let decoding = |i: usize| neighbour.class_in_flight(i);
            if (0..classes.len()).all(|i| decoding(i) == 0) {
                continue;
            }
            // Requests decoding at a level the curve has not proven are taken to meet their
            // target there, as they were let in to (a gloomy guess there would say they have
            // little left to lose, and let a pass slow them as if free); not where the curve
            // says the engine misses the target even alone, where they came in on their best
            // chance (docs/benchmarks/real-engines.md, "Why the device's rules are as they are").
            let before = curve.predict_beside(own, load, per_pass, 0);
            let after = curve.predict_beside(own, load + 1.0, per_pass, 0);
            for (i, class) in classes.iter().enumerate() {
                let n = decoding(i);
                let Some(min) = class.slo.min_tps.filter(|_| n > 0) else {
                    continue;
                };
                let let_in_to_meet = before.unproven && class.slo.tps(&alone) >= min;
                let (let_in, kept) = match class.slo.tps(&before) {
                    tps if let_in_to_meet && tps < min => (min / tps, class.slo.tps_share()),
                    _ => (1.0, before.tps.share_above(min)),
                };
                let after = after.with_speed(after.tps.scaled(let_in));
                cost.keeps &= class.slo.speed_holds(&after);
                cost.loss += f64::from(n) * (kept - after.tps.share_above(min)).max(0.0);
            }
        }
        cost
    }
}
