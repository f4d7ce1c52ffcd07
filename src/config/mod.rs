//! Gateway configuration: a YAML file ([`raw`]) validated whole ([`validate`]) into a typed
//! [`Config`]. There is one way in — [`load`] — and a config is either entirely valid or rejected
//! with an error naming the file, line, column, field path and the fix.

pub(crate) mod raw;
pub(crate) mod slo;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Uri};

pub use raw::{BackendDialect, BudgetPeriod, OnMiss, Policy, ResponsesApi};
pub(crate) use slo::Slo;
pub(crate) use validate::{validate, validate_key_limits, validate_key_models, without_password};

pub(crate) use crate::curve::PriorPoint;
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
    /// Bearer token the admin data endpoints require, if any.
    pub admin_token: Option<Secret>,
    /// Host names the admin data endpoints answer to without a token, beside IP addresses and
    /// `localhost` (lowercase).
    pub admin_hosts: Vec<String>,
    /// The most API keys whose metrics carry their own `key` label (`admin.max_key_series`);
    /// the rest share `key="other"`, so that a fleet of many keys keeps its series bounded.
    pub max_key_series: usize,
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
    /// Rules giving requests a class by path and model, first match wins.
    pub routes: Vec<RouteRule>,
    /// Gateway API keys; empty (and no `virtual_keys`) means clients need none.
    pub api_keys: Vec<ApiKey>,
    /// Keys made at runtime through the admin API, when on.
    pub virtual_keys: Option<VirtualKeys>,
    /// JWT bearer tokens as identities, when on.
    pub jwt: Option<JwtConfig>,
    /// Policy defaults and exploration.
    pub routing: Routing,
    /// Half-life of curve observations, seconds.
    pub curve_half_life_s: f64,
    /// Shared state with other replicas, if configured.
    pub cluster: Option<ClusterConfig>,
    /// Browser clients allowed, if configured.
    pub cors: Option<Cors>,
    /// The nameservers `discovery: dns` asks; `None`: the system's (`/etc/resolv.conf`).
    pub resolver: Option<ResolverConfig>,
    /// OpenTelemetry traces, if configured.
    pub tracing: Option<TracingConfig>,
}

impl Config {
    /// Pairs of backends that are one engine declared once per dialect (the same URL and
    /// address): each half gets a curve and an in-flight count of its own, so neither tells
    /// the router what the engine carries. Declared once, its clients of the other dialect
    /// reach it translated.
    pub(crate) fn engines_declared_twice(&self) -> Vec<(&str, &str)> {
        let mut pairs = Vec::new();
        for (i, a) in self.backends.iter().enumerate() {
            for b in &self.backends[i + 1..] {
                if a.url == b.url && a.dial == b.dial && a.dialect != b.dialect {
                    pairs.push((&*a.name, &*b.name));
                }
            }
        }
        pairs
    }
}

/// `tracing:` validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The OTLP/HTTP traces endpoint.
    pub otlp_endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// Share of root traces sampled.
    pub sample_ratio: f64,
}

/// `resolver:` validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverConfig {
    /// Nameservers, in order.
    pub nameservers: Vec<SocketAddr>,
    /// How long one query may take.
    pub timeout: Duration,
}

/// How a backend's addresses are found when its URL's host names several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discovery {
    /// How often the host is resolved again.
    pub refresh: Duration,
}

/// `cluster:` validated: where the replicas of a fleet meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The Redis URL (it may carry a password: shown only with it removed).
    pub redis_url: Secret,
    /// The password from `password_env`, if given.
    pub password: Option<Secret>,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Publish and read every this often.
    pub sync_interval: Duration,
    /// This replica's name, if configured (else one is made at start).
    pub replica_id: Option<String>,
    /// Extra PEM roots for `rediss://`.
    pub ca_file: Option<PathBuf>,
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
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Client connections open at once.
    pub max_connections: usize,
    /// Time a client has to send its body, beyond what its size takes at `body_min_rate`.
    pub body_read_timeout: Duration,
    /// The slowest a request body may arrive, bytes per second.
    pub body_min_rate: u64,
    /// A client connection with nothing in flight is closed after this long.
    pub idle_timeout: Duration,
    /// A client that takes no bytes for this long loses its connection.
    pub client_write_timeout: Duration,
}

/// A string that never shows itself in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub(crate) fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for the one place that sends it.
    pub(crate) fn expose(&self) -> &str {
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
    pub(crate) fn upstream<'a>(&'a self, client: &'a str) -> Option<&'a str> {
        match self.aliases.get(client) {
            Some(upstream) => Some(upstream),
            None => self.passthrough.then_some(client),
        }
    }
}

/// A backend's context window, prompt and output tokens together, by client model name, as
/// its config gives it (`max_context_tokens`); its `/v1/models` may tell the others at runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextWindows {
    /// By client model name.
    pub by_model: BTreeMap<String, NonZeroU32>,
    /// Every model not named (one number, or `"*"`).
    pub others: Option<NonZeroU32>,
}

impl ContextWindows {
    /// The configured window for the client's `model`, if there is one.
    pub(crate) fn of(&self, model: &str) -> Option<NonZeroU32> {
        self.by_model.get(model).copied().or(self.others)
    }

    /// Whether every model's window is configured (nothing to learn from the backend).
    pub(crate) fn covers_all(&self) -> bool {
        self.others.is_some()
    }
}

/// Prices of one model's tokens, USD per million.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// Per million input tokens.
    pub input_per_1m: f64,
    /// Per million output tokens.
    pub output_per_1m: f64,
}

impl Price {
    /// What `input` and `output` tokens cost, USD.
    pub(crate) fn usd(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_per_1m + output as f64 * self.output_per_1m) / 1e6
    }
}

/// What a backend's requests cost: its tokens, by model, and its engine's time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cost {
    /// The tokens of every model not in `models`.
    pub tokens: Price,
    /// By client model name.
    pub models: BTreeMap<String, Price>,
    /// USD per hour of a self-hosted engine: each second of it is shared among the requests in
    /// flight on it then (fleet-wide), so an idle engine charges no one.
    pub gpu_hour_usd: Option<f64>,
}

impl Cost {
    /// The prices of `model`'s tokens (the client's name).
    pub(crate) fn price(&self, model: &str) -> Price {
        self.models.get(model).copied().unwrap_or(self.tokens)
    }
}

/// A validated backend. Two are equal when every field is: a reload carries a backend over
/// (its connections, counts and health) only when nothing in its config changed.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// Unique name.
    pub name: Arc<str>,
    /// Base URL: scheme, authority and an optional path prefix (no trailing slash).
    pub url: Uri,
    /// Replaces the client path's leading `/v1` (after the URL's path).
    pub path_prefix: Option<String>,
    /// Added to every request's query (`name=value&...`, validated to need no escaping).
    pub query: Option<String>,
    /// The upstream `Host` header: the URL's host, with its port unless the scheme's default.
    /// Made once here, so that the client need not format one per request.
    pub host: HeaderValue,
    /// API dialect.
    pub dialect: BackendDialect,
    /// The header carrying the key from `api_key_env` (read at load time), ready to send:
    /// sensitive, so it never shows in debug output.
    pub api_key: Option<(http::HeaderName, http::HeaderValue)>,
    /// Extra headers for every upstream request.
    pub headers: HeaderMap,
    /// Models served.
    pub models: ModelMap,
    /// Hard in-flight limit.
    pub max_concurrency: Option<u32>,
    /// The device its engine shares with the other backends naming it: their load slows its
    /// decode, and its theirs (docs/routing.md, "Backends that share a device").
    pub device: Option<Arc<str>>,
    /// Distinct model names tracked (curves, metrics) beyond the configured ones' count.
    pub max_models: usize,
    /// The longest SSE line or event the backend may send, bytes.
    pub max_event_bytes: usize,
    /// Price.
    pub cost: Option<Cost>,
    /// Extra trusted roots.
    pub ca_file: Option<PathBuf>,
    /// Send the client's credentials instead of `api_key`.
    pub forward_client_auth: bool,
    /// Connect timeout (TCP and TLS).
    pub connect_timeout: Duration,
    /// First-token, stall and total timeouts.
    pub timeouts: Timeouts,
    /// Default `anthropic-version`.
    pub anthropic_version: HeaderValue,
    /// Clients of the other dialect may reach it through translation.
    pub translate: bool,
    /// `max_tokens` for a request translated to it that set none (Anthropic requires one).
    pub default_max_tokens: u32,
    /// What it reads of an Anthropic client's reasoning switches (an OpenAI backend).
    pub thinking: crate::translate::Thinking,
    /// How it serves Responses clients (an OpenAI backend; an Anthropic one is translated to).
    pub responses_api: ResponsesApi,
    /// What a Responses request translated for it does with tools it cannot run.
    pub hosted_tools: crate::translate::HostedTools,
    /// Its context window by model, where configured.
    pub max_context_tokens: ContextWindows,
    /// Cold-start curve points, if configured.
    pub prior: Option<Vec<PriorPoint>>,
    /// Outlier ejection.
    pub ejection: Ejection,
    /// `discovery: dns`: this entry stands for every address its host resolves to (see
    /// `crate::discovery`), never for a backend of its own.
    pub discovery: Option<Discovery>,
    /// The address connections go to instead of the URL's host (one found by discovery); the
    /// host still names the server for TLS and the `Host` header.
    pub dial: Option<std::net::IpAddr>,
    /// Its prefix index, unless `prefix_cache.enabled` is false.
    pub prefix_index: Option<PrefixIndexSize>,
}

/// How long a backend may take, past connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From receipt to the first content event.
    pub first_token: Duration,
    /// Longest silence between chunks after the first content.
    pub stall: Duration,
    /// Whole response.
    pub total: Option<Duration>,
    /// A response that is not a stream, from sending to its end (within the total).
    pub response: Duration,
}

/// When a backend is ejected and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Failures in a row that eject.
    pub after_failures: u32,
    /// First period.
    pub base: Duration,
    /// Longest period.
    pub max: Duration,
}

/// A validated traffic class.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassConfig {
    /// Name.
    pub name: Arc<str>,
    /// Its targets (none for a batch class).
    pub slo: Slo,
    /// How its requests choose a backend.
    pub policy: Policy,
    /// What happens when no backend is predicted to meet the SLO.
    pub on_miss: OnMiss,
    /// `queue`: the longest wait.
    pub queue_max_wait: Duration,
}

/// A validated `routes[]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    /// Exact path to match, if any.
    pub path: Option<String>,
    /// Exact client model to match, if any.
    pub model: Option<String>,
    /// Index into `classes` of the class it gives, if it gives one.
    pub class: Option<usize>,
    /// Index into `backends` of where a body naming no model on `path` goes (instead of
    /// `default_backend`), if the rule says.
    pub backend: Option<usize>,
    /// `false`: matching requests are never translated for a backend of the other dialect.
    pub translate: bool,
}

/// `cors:` validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// Origins allowed, each a valid header value; `None`: any.
    pub origins: Option<Vec<HeaderValue>>,
    /// How long a browser may keep a preflight's answer.
    pub max_age: Duration,
}

/// A gateway API key.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    /// The key.
    pub key: Secret,
    /// Its name, unique among the keys: what metrics, `/admin/keys` and logs show.
    pub name: std::sync::Arc<str>,
    /// The class its requests get, if it gives one (by name: a key outlives a reload that
    /// reorders the classes).
    pub class: Option<std::sync::Arc<str>>,
    /// What its requests may claim (shared with every request that carries the key).
    pub grant: std::sync::Arc<KeyGrant>,
    /// What it may use.
    pub limits: KeyLimits,
    /// Its weight in a class's line (fair order by tokens).
    pub weight: f64,
}

/// What one API key may use; `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KeyLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Prompt and output tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    pub max_concurrency: Option<u64>,
    /// Spend per period.
    pub budget: Option<Budget>,
}

impl KeyLimits {}

/// A spend budget: US dollars per calendar period (UTC).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Dollars per period.
    pub usd: f64,
    /// The period.
    pub period: BudgetPeriod,
}

/// What a request with a given API key may claim: the most it may ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyGrant {
    /// The classes `x-tpsgate-class` may name.
    pub classes: Vec<std::sync::Arc<str>>,
    /// Whether SLO-override headers are honoured.
    pub slo_overrides: bool,
    /// The models (as clients name them) it may ask for; `None`: any.
    pub models: Option<Vec<String>>,
}

/// `jwt:` validated: bearer tokens of one issuer as identities.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtConfig {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` values one of which it must carry.
    pub audience: Vec<String>,
    /// The issuer's JWK set.
    pub jwks_url: http::Uri,
    /// The claim naming the tenant, as a path of field names.
    pub tenant_claim: Vec<String>,
    /// The tenants a token may name.
    pub tenants: Vec<Identity>,
    /// How often the key set is fetched again.
    pub jwks_refresh: Duration,
    /// Clock skew allowed on `exp` and `nbf`, seconds.
    pub leeway_s: u64,
}

/// Who a request is, and what it may use: a tenant of `jwt:` (an API key's fields but its key).
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// Its name: what metrics and `/admin/keys` show; unique among keys and tenants.
    pub name: std::sync::Arc<str>,
    /// Its requests' class.
    pub class: Option<std::sync::Arc<str>>,
    /// What they may claim.
    pub grant: std::sync::Arc<KeyGrant>,
    /// What it may use.
    pub limits: KeyLimits,
    /// Its weight in a class's line.
    pub weight: f64,
}

/// `virtual_keys:` validated: keys made at runtime through the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualKeys {
    /// The file they are kept in; `None`: in the cluster's Redis.
    pub file: Option<std::path::PathBuf>,
}

/// `routing:` validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routing {
    /// Policy of classes naming none and of requests without a class.
    pub policy: Policy,
    /// Share of requests that may explore.
    pub exploration: f64,
    /// Prompt and output tokens the oracle asks `/sim/truth` about.
    pub oracle_shape: (u32, u32),
    /// Attempts per request (1: no retries).
    pub max_attempts: u32,
    /// Retries as a share of requests.
    pub retry_budget: f64,
    /// Prefix-cache-aware routing, unless `prefix_cache.enabled` is false.
    pub prefix: Option<PrefixRouting>,
}

/// `prefix_cache:` as routing uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixRouting {
    /// Tokens per indexed block.
    pub block_tokens: u32,
    /// A backend holds a request's prefix from this many tokens on.
    pub min_match_tokens: u64,
}

impl PrefixRouting {
    /// Request bytes per block ([`crate::prefix::Chain`] cuts bytes; a token is taken as 4).
    pub(crate) fn block_bytes(&self) -> usize {
        self.block_tokens as usize * 4
    }
}

/// One backend's prefix index: how much it may hold and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixIndexSize {
    /// Blocks held at most (before calibration lowers it).
    pub blocks: usize,
    /// Tokens per block.
    pub block_tokens: u32,
    /// A block not sent for this long is taken as gone.
    pub ttl: Duration,
}

/// Reads, parses and validates a config file, reading API keys from the process environment.
/// Relative paths in it (`prior.bench_file`) are relative to the file's directory.
pub(crate) fn load(file: &Path) -> Result<Config, ConfigError> {
    load_with(file, |name| std::env::var(name).ok())
}

/// [`load`], with `env` looking up environment variables.
pub(crate) fn load_with(
    file: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|err| ConfigError::at("", format!("cannot read the file: {err}")).in_file(file))?;
    let dir = file.parent().unwrap_or_else(|| Path::new("."));
    parse_in(&text, env, dir).map_err(|err| yaml::place(err, file, &text))
}

/// Parses and validates config text; `env` looks up environment variables; relative paths are
/// relative to the working directory.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    parse_in(text, env, Path::new("."))
}

/// [`parse`], with relative paths resolved against `dir`.
pub fn parse_in(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = yaml::from_str(text)?;
    validate(&raw, &env, dir)
}
