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

pub mod admin;
pub mod bench;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod console;
pub mod curve;
pub mod demo;
pub mod discovery;
pub mod error;
pub mod fleet;
pub mod gateway;
pub mod listen;
pub mod live;
pub mod logging;
pub mod otel;
pub mod prefix;
pub mod proxy;
pub mod router;
pub mod signal;
pub mod sim;
pub mod sse;
pub mod stack;
pub mod telemetry;
pub mod tenant;
pub mod tls;
pub mod translate;
pub mod upstream;
pub mod yaml;
