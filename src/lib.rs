//! tpsgate: a reverse proxy for LLM inference APIs that times every streamed token and routes by
//! the measured curve of per-user tokens per second and time to first token against concurrency.
//!
//! This crate is one library with one binary (`tpsgate`). Its pieces, top to bottom (which may
//! import which: docs/ARCHITECTURE.md, "Floors", checked by `tests/architecture_tests.rs`):
//!
//! - [`cli`]: the command line, flags and dispatch; [`check`] is `tpsgate check`'s report and
//!   [`demo`] the demo; [`console`] the one writer of stdout.
//! - [`gateway`]: a running gateway; [`admin`] its admin plane; [`cluster`] the replicas' shared
//!   picture through Redis; [`live`] the running state built from one config (reloads, the
//!   config file's watcher, rediscovery by [`discovery`]).
//! - [`stack`] composes the request path from the layers in [`proxy`]; [`router`] decides where
//!   each request goes, over the backends' runtime state in [`fleet`]; [`tenant`] keeps each API
//!   key's limits and usage; [`upstream`] is the per-backend client.
//! - [`telemetry`] (metrics) and [`otel`] (traces); [`config`]: YAML to a validated config.
//! - The pure floor: [`curve`] (per-backend curves, the observation a request teaches),
//!   [`sse`] (an incremental Server-Sent Events parser and a stream's timing read from it),
//!   [`translate`] (OpenAI chat completions and Anthropic messages, both ways), [`prefix`]
//!   (prefix caches as chained block hashes); [`error`], [`signal`], [`logging`], [`tls`],
//!   [`yaml`] (errors that name file, line, column and field), and [`listen`], the accept loop
//!   shared by every server we run.
//! - [`sim`]: a simulated continuous-batching LLM server (`tpsgate sim`), the upstream every test,
//!   benchmark and demo runs against, and which publishes its own analytic curve;
//!   [`mod@bench`]: an active sweep client (`tpsgate bench`) that measures TTFT, per-user TPS and
//!   goodput of any OpenAI- or Anthropic-compatible server.
//!
//! Words (TTFT, TPOT, per-user TPS, experienced concurrency, goodput) are defined in README.md.

pub(crate) mod admin;
pub mod bench;
pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod console;
pub(crate) mod curve;
pub(crate) mod demo;
pub(crate) mod discovery;
pub(crate) mod error;
pub(crate) mod fleet;
pub mod gateway;
pub(crate) mod jwt;
pub(crate) mod keystore;
pub(crate) mod listen;
pub(crate) mod live;
pub(crate) mod logging;
pub(crate) mod otel;
pub(crate) mod prefix;
pub(crate) mod proxy;
pub(crate) mod router;
pub(crate) mod signal;
pub mod sim;
pub mod sse;
pub(crate) mod stack;
pub mod telemetry;
pub(crate) mod tenant;
pub mod tls;
pub mod translate;
pub(crate) mod upstream;
pub mod yaml;

// What is public, and why. The binary calls `main`. The modules left `pub` above are products
// or contracts of their own, each offering only what its `pub` items say (the rest is
// `pub(crate)`, and `unreachable_pub` keeps it so): the gateway started from a config
// (`gateway`, `config`), the simulator and the bench client the tests drive it with (`sim`,
// `bench`), the pure stream and translation code the fuzz targets and benches run (`sse`,
// `translate`), the metric names the deploy files are checked against (`telemetry`), and the
// YAML and TLS set-up a test's own config or client needs (`yaml`, `tls`). The rest is the
// crate's own; the few pieces of it that a benchmark or a fuzz target runs alone, outside a
// gateway, are re-exported here.

// The request path's pieces that benches and fuzz targets run alone: the body's JSON peek,
// endpoints, the stream meter, the body rewrite, a prompt's prefix.
pub use proxy::{
    classify::peek,
    endpoint::Endpoint,
    meter::StreamMeter,
    rewrite::{Edits, rewrite_body},
    route::prefix_of,
};

// The router and the backends' runtime state it decides over (`benches/route.rs`,
// `benches/prefix.rs`).
pub use fleet::{Backend, Hit, InFlightGuard, Line, PrefixIndex};
pub use prefix::RequestPrefix;
pub use router::{Ask, Reach, Router};

// A curve and what it learns from (`benches/curve.rs`).
pub use curve::{Curve, FirstToken, Observation, Outcome};

// The HTTP/1.1 client's response reader (the `h1_response` fuzz target).
pub use upstream::h1::{Error as H1Error, read_response};

/// The `tpsgate` binary's whole work: the command line parsed, its command run.
pub fn main() -> std::process::ExitCode {
    cli::run(<cli::Cli as clap::Parser>::parse())
}
