//! Deciding which injected fault, if any, strikes a request.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use super::config::{Fault, FaultAction, Trigger};

/// The configured faults with their every-N-th counters, which start over whenever the fault list
/// is replaced.
#[derive(Debug)]
pub(crate) struct FaultPlan {
    faults: Vec<Fault>,
    seen: Vec<AtomicU64>,
}

impl FaultPlan {
    /// A plan for `faults`, checked in order.
    pub(crate) fn new(faults: Vec<Fault>) -> Self {
        let seen = faults.iter().map(|_| AtomicU64::new(0)).collect();
        Self { faults, seen }
    }

    /// The first fault that fires for this request. Every fault counts every request, so
    /// `every: 3` fires on requests 3, 6, 9… whatever the other faults do.
    pub(crate) fn pick(&self) -> Option<FaultAction> {
        let mut chosen = None;
        for (fault, seen) in self.faults.iter().zip(&self.seen) {
            let fires = match fault.trigger {
                Trigger::Every(n) => (seen.fetch_add(1, Ordering::Relaxed) + 1) % n == 0,
                Trigger::Probability(p) => rand::rng().random_bool(p),
            };
            if fires && chosen.is_none() {
                chosen = Some(fault.action);
            }
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_fires_on_exact_multiples() {
        let plan = FaultPlan::new(vec![Fault {
            trigger: Trigger::Every(3),
            action: FaultAction::Reset { after_tokens: 1 },
        }]);
        let fired: Vec<bool> = (0..7).map(|_| plan.pick().is_some()).collect();
        assert_eq!(fired, [false, false, true, false, false, true, false]);
    }

    #[test]
    fn probability_one_always_fires() {
        let plan = FaultPlan::new(vec![Fault {
            trigger: Trigger::Probability(1.0),
            action: FaultAction::Status {
                status: 500,
                retry_after: None,
            },
        }]);
        assert!((0..20).all(|_| plan.pick().is_some()));
    }
}
