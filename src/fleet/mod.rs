//! The fleet: what the gateway knows of each backend at runtime, shared by every request and
//! read by the router. A [`Backend`] holds its config, its connection pool, its occupancy (in
//! flight, and the integral behind experienced concurrency), its [`health`], its curves and its
//! metric handles; an [`InFlightGuard`] is one request's slot there; the [`waiters`] line holds
//! requests waiting for a slot to free; a backend's [`ramp`] is its slow start before its curve
//! has evidence; the [`outbox`] carries what a backend learns to the
//! other replicas of a cluster, and its [`claim`]s of the slots at a backend's edge.
//!
//! Below the router, above the curves and the transport: it imports `curve`, `upstream`,
//! `telemetry` and `config`, never `router` or `proxy`.

pub mod backend;
pub mod claim;
pub mod health;
pub mod in_flight;
pub mod outbox;
pub mod prefix;
pub mod ramp;
pub mod waiters;

pub use backend::{Backend, ByModel};
pub use claim::Claimed;
pub use in_flight::InFlightGuard;
pub use outbox::{Event, Inbox, Learned, Outbox};
pub use prefix::{Hit, PrefixIndex};
pub use ramp::Ramp;
pub use waiters::{Line, Share};
