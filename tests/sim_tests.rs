//! `tpsgate sim` and `tpsgate bench`, tested on loopback against the real server stack and the
//! real binary.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers outside #[test] functions fail the test loudly too"
)]

mod support;

#[path = "sim/binary.rs"]
mod binary;
#[path = "sim/control.rs"]
mod control;
#[path = "sim/faults.rs"]
mod faults;
#[path = "sim/prefix_cache.rs"]
mod prefix_cache;
#[path = "sim/wire.rs"]
mod wire;
