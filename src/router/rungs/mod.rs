//! The rungs of the decision ladder, one rule a file; `ladder.rs` runs them in order and
//! docs/ARCHITECTURE.md ("Routing") lists them so. Each reads the [`Scene`](super::scene::Scene)
//! and its candidates, and picks one or passes.

pub(crate) mod batch;
pub(crate) mod best_chance;
pub(crate) mod best_effort;
pub(crate) mod explore;
pub(crate) mod holder;
pub(crate) mod place;
pub(crate) mod policy;
pub(crate) mod retry_idle;
pub(crate) mod slow_start;
