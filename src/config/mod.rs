//! Gateway configuration: a YAML file ([`raw`]) validated whole ([`validate`]) into a typed
//! [`Config`]. There is one way in — [`load`] — and a config is either entirely valid or rejected
//! with an error naming the file, line, column, field path and the fix.

pub mod raw;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Uri};

pub use raw::BackendDialect;
pub use validate::validate;

use crate::yaml::{self, ConfigError};

/// A validated gateway config.
#[derive(Debug, Clone)]
pub struct Config {
    /// Client-facing address.
    pub listen: SocketAddr,
    /// Client-facing TLS, if any.
    pub tls: Option<TlsFiles>,
    /// Admin listener address.
    pub admin_listen: SocketAddr,
    /// Request limits and drain.
    pub limits: Limits,
    /// Upstream providers, in config order.
    pub backends: Vec<BackendConfig>,
    /// Index into `backends` for `/v1/*` passthrough of bodies naming no model.
    pub default_backend: Option<usize>,
    /// Traffic classes.
    pub classes: Vec<ClassConfig>,
    /// Index into `classes` of the default class (None when no classes are configured).
    pub default_class: Option<usize>,
    /// Half-life of curve observations, seconds.
    pub curve_half_life_s: f64,
}

/// PEM files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert_file: PathBuf,
    /// Private key.
    pub key_file: PathBuf,
}

/// Limits on what a client may send, and how long shutdown waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Time allowed to send request headers.
    pub header_read_timeout: Duration,
    /// How long in-flight requests may finish after SIGINT/SIGTERM.
    pub drain_timeout: Duration,
}

/// A string that never shows itself in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Which client model names a backend serves, and under what upstream name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelMap {
    /// Client name -> upstream name.
    pub aliases: BTreeMap<String, String>,
    /// Any other model passes through under its own name.
    pub passthrough: bool,
}

impl ModelMap {
    /// The upstream name for a client's model, if this backend serves it.
    pub fn upstream<'a>(&'a self, client: &'a str) -> Option<&'a str> {
        match self.aliases.get(client) {
            Some(upstream) => Some(upstream),
            None => self.passthrough.then_some(client),
        }
    }
}

/// Price per million tokens, USD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Per million input tokens.
    pub input_per_1m: f64,
    /// Per million output tokens.
    pub output_per_1m: f64,
}

/// A validated backend.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Unique name.
    pub name: Arc<str>,
    /// Base URL: scheme, authority and an optional path prefix (no trailing slash).
    pub url: Uri,
    /// API dialect.
    pub dialect: BackendDialect,
    /// Key from `api_key_env`, read at load time.
    pub api_key: Option<Secret>,
    /// Extra headers for every upstream request.
    pub headers: HeaderMap,
    /// Models served.
    pub models: ModelMap,
    /// Hard in-flight limit.
    pub max_concurrency: Option<u32>,
    /// Price.
    pub cost: Option<Cost>,
    /// Extra trusted roots.
    pub ca_file: Option<PathBuf>,
    /// Send the client's credentials instead of `api_key`.
    pub forward_client_auth: bool,
    /// Connect timeout (TCP and TLS).
    pub connect_timeout: Duration,
    /// Default `anthropic-version`.
    pub anthropic_version: HeaderValue,
}

/// A validated traffic class.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassConfig {
    /// Name.
    pub name: Arc<str>,
    /// Smallest acceptable per-user TPS.
    pub min_tps: Option<f64>,
    /// Largest acceptable TTFT.
    pub max_ttft: Option<Duration>,
}

/// Reads, parses and validates a config file, reading API keys from the process environment.
pub fn load(file: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|err| ConfigError::at("", format!("cannot read the file: {err}")).in_file(file))?;
    parse(&text, |name| std::env::var(name).ok()).map_err(|err| yaml::place(err, file, &text))
}

/// Parses and validates config text; `env` looks up environment variables.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = yaml::from_str(text)?;
    validate(&raw, &env)
}
