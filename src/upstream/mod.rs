//! Upstream providers at runtime: the connector ([`client`]) and connection pool ([`pool`]) of
//! each backend, and each backend's live state ([`backend`]).

pub mod backend;
pub mod client;
pub mod pool;

pub use backend::{Backend, InFlightGuard};
pub use client::UpstreamBody;
pub use pool::{Pool, PooledBody};
