//! The gateway (`tpsgate serve`), tested on loopback with `tpsgate sim` as the upstream.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers outside #[test] functions fail the test loudly too"
)]

mod support;

#[path = "gateway/agents.rs"]
mod agents;
#[path = "gateway/binary.rs"]
mod binary;
#[path = "gateway/classes.rs"]
mod classes;
#[path = "gateway/cluster.rs"]
mod cluster;
#[path = "gateway/connections.rs"]
mod connections;
#[path = "gateway/credentials.rs"]
mod credentials;
#[path = "gateway/curves.rs"]
mod curves;
#[path = "gateway/demo.rs"]
mod demo;
#[path = "gateway/discovery.rs"]
mod discovery;
#[path = "gateway/errors.rs"]
mod errors;
#[path = "gateway/hardening.rs"]
mod hardening;
#[path = "gateway/jwt.rs"]
mod jwt;
#[path = "gateway/keys.rs"]
mod keys;
#[path = "gateway/passthrough.rs"]
mod passthrough;
#[path = "gateway/prefix.rs"]
mod prefix;
#[path = "gateway/reload.rs"]
mod reload;
#[path = "gateway/resilience.rs"]
mod resilience;
#[path = "gateway/routing.rs"]
mod routing;
#[path = "gateway/sdk.rs"]
mod sdk;
#[path = "gateway/traces.rs"]
mod traces;
#[path = "gateway/translate.rs"]
mod translate;
#[path = "gateway/transport.rs"]
mod transport;
#[path = "gateway/usage.rs"]
mod usage;
#[path = "gateway/virtual_keys.rs"]
mod virtual_keys;
#[path = "gateway/windows.rs"]
mod windows;
