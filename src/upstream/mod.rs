//! Upstream providers at runtime: a pooled HTTP client per backend ([`client`]) and the live
//! state of each backend ([`backend`]).

pub mod backend;
pub mod client;

pub use backend::{Backend, InFlightGuard};
pub use client::{UpstreamBody, UpstreamClient};
