//! The fleet: what the gateway knows of each backend at runtime, shared by every request and
//! read by the router. A [`Backend`] holds its config, its connection pool, its occupancy (in
//! flight, and the integral behind experienced concurrency), its [`health`], its curves and its
//! metric handles; an [`InFlightGuard`] is one request's slot there; the [`waiters`] line holds
//! requests waiting for a slot to free; a backend's [`ramp`] is its slow start before its curve
//! has evidence, and a request's [`trial`] what it probes of that ramp or of its curve; its
//! [`chunking`] how many tokens its content events carry; the [`outbox`] carries what a backend learns to the
//! other replicas of a cluster, and its [`claim`]s of the slots at a backend's edge.
//!
//! Below the router, above the curves and the transport: it imports `curve`, `upstream`,
//! `telemetry` and `config`, never `router` or `proxy`.

pub(crate) mod backend;
pub(crate) mod chunking;
pub(crate) mod claim;
pub(crate) mod health;
pub(crate) mod in_flight;
pub(crate) mod outbox;
pub(crate) mod paces;
pub(crate) mod prefix;
pub(crate) mod ramp;
pub(crate) mod trial;
pub(crate) mod waiters;
pub(crate) mod window;

pub use backend::Backend;
pub(crate) use claim::Claimed;
pub use in_flight::InFlightGuard;
pub(crate) use outbox::{Event, Inbox, Learned, Outbox};
pub use prefix::{Hit, PrefixIndex};
pub use waiters::Line;
pub(crate) use waiters::Share;
