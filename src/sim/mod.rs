//! `tpsgate sim`: a simulated continuous-batching LLM server.
//!
//! It serves the OpenAI (chat completions, completions, models) and Anthropic (messages) APIs,
//! streamed and not, byte for byte as vLLM and Anthropic do, from a model of an engine whose
//! per-user speed falls as its batch grows ([`engine`]); it injects faults on request
//! ([`faults`]), publishes its analytic curve ([`truth`]) and takes new parameters at runtime.
//! Every test, benchmark and demo of the gateway runs against it.

pub mod config;
pub(crate) mod engine;
pub(crate) mod faults;
pub(crate) mod fleet;
mod responses;
pub(crate) mod seen;
pub(crate) mod server;
pub mod truth;
mod window;
pub mod wire;

pub use config::{BackendSpec, FleetRaw};
pub use fleet::Fleet;
