//! What a decision answers: the backend with its slot ([`Decision`]) and why ([`Reason`]).

use std::sync::Arc;

use serde::Serialize;

use crate::curve::Prediction;
use crate::fleet::{Backend, InFlightGuard};

/// Why a backend was chosen (the `reason` label of `tpsgate_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Predicted to meet the SLO, chosen by the class policy.
    Feasible,
    /// A never-observed backend taking a request its ramp allows (a lone one at first).
    ColdStart,
    /// Spent from the exploration budget.
    Explore,
    /// No backend was feasible at the class's percentiles: where the request adds the most
    /// expected good completions, its own chance of meeting the SLO less what it costs the
    /// requests already there.
    BestChance,
    /// No backend was feasible nor worth a chance, and the class sends anyway: the likeliest.
    BestEffort,
    /// Feasible after waiting in the class's line.
    Queued,
    /// Refused with 429: nothing feasible (at once, or before the wait ran out).
    Shed,
    /// Chosen by a baseline policy, which does not predict.
    Baseline,
}

impl Reason {
    pub(crate) const ALL: [Self; 8] = [
        Self::Feasible,
        Self::ColdStart,
        Self::Explore,
        Self::BestChance,
        Self::BestEffort,
        Self::Queued,
        Self::Shed,
        Self::Baseline,
    ];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Feasible => "feasible",
            Self::ColdStart => "cold_start",
            Self::Explore => "explore",
            Self::BestChance => "best_chance",
            Self::BestEffort => "best_effort",
            Self::Queued => "queued",
            Self::Shed => "shed",
            Self::Baseline => "baseline",
        }
    }
}

/// A routing decision with its in-flight slot.
#[derive(Debug)]
pub struct Decision {
    /// The chosen backend.
    pub backend: Arc<Backend>,
    /// Its index in the router's list.
    pub index: usize,
    /// The slot taken there.
    pub guard: InFlightGuard,
    /// What the router expected this request to see there.
    pub prediction: Option<Prediction>,
    /// Why.
    pub reason: Reason,
    /// Near the backend's edge in a cluster: the fleet-wide limit its slot is claimed against
    /// before the request goes ([`settle`](super::wait::settle)).
    pub claim: Option<u32>,
}
