//! Measurements scored against the simulator's truth. They time real streams on loopback, so
//! they run in this binary of their own (cargo runs test binaries one after another) and take
//! [`ALONE`] so that they also run one at a time within it: on a 2-core machine, parallel load
//! from other tests shows up as TTFT.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers outside #[test] functions fail the test loudly too"
)]

mod support;

#[path = "gateway/curve_accuracy.rs"]
mod curve_accuracy;
#[path = "sim/accuracy.rs"]
mod sim_accuracy;

/// Held by every test of this binary: one measurement at a time.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
