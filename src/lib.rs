//! tpsgate: a reverse proxy for LLM inference APIs that times every streamed token and routes by
//! the measured curve of per-user tokens per second and time to first token against concurrency.
//!
//! This crate is one library with one binary (`tpsgate`). The pieces that exist today:
//!
//! - [`gateway`]: a running gateway; [`stack`] composes its request path from the layers in
//!   [`proxy`], over the per-backend clients in [`upstream`], configured by [`config`]; errors are
//!   [`error::Error`]; [`admin`] serves health and backend state.
//! - [`sim`]: a simulated continuous-batching LLM server (`tpsgate sim`), the upstream every test,
//!   benchmark and demo runs against, and which publishes its own analytic curve.
//! - [`mod@bench`]: an active sweep client (`tpsgate bench`) that measures TTFT, per-user TPS and
//!   goodput of any OpenAI- or Anthropic-compatible server.
//! - [`sse`]: an incremental Server-Sent Events parser (pure: no I/O).
//! - [`translate`]: OpenAI chat completions and Anthropic messages translated both ways,
//!   requests, streams and errors, for clients reaching a backend of the other dialect (pure).
//! - [`listen`]: the accept loop shared by every server we run (TCP or TLS, HTTP/1.1 and h2).
//! - [`yaml`]: YAML loading with errors that name file, line, column and field.
//! - [`cli`]: the command line.
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
