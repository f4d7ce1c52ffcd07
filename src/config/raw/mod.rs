//! The gateway config exactly as written in YAML. Unknown fields are errors; every default is
//! stated here. [`super::validate`] turns this into [`super::Config`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

mod backend;
pub(crate) use backend::*;
pub use backend::{BackendDialect, ResponsesApi};

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// Client-facing listener.
    #[serde(default)]
    pub listen: RawListen,
    /// Admin listener (health, readiness, backends).
    #[serde(default)]
    pub admin: RawAdmin,
    /// Request limits and shutdown.
    #[serde(default)]
    pub limits: RawLimits,
    /// Upstream providers.
    pub backends: Vec<RawBackend>,
    /// Backend for `/v1/*` paths whose body names no model.
    #[serde(default)]
    pub default_backend: Option<String>,
    /// Traffic classes.
    #[serde(default)]
    pub classes: Vec<RawClass>,
    /// Class of requests that name none (default: the first class).
    #[serde(default)]
    pub default_class: Option<String>,
    /// Rules that give requests a class by path and model.
    #[serde(default)]
    pub routes: Vec<RawRouteRule>,
    /// Gateway API keys clients must present; each may give its requests a class.
    #[serde(default)]
    pub api_keys: Vec<RawApiKey>,
    /// How a backend is chosen.
    #[serde(default)]
    pub routing: RawRouting,
    /// How curves weigh old observations.
    #[serde(default)]
    pub curves: RawCurves,
    /// Several replicas sharing backend state through Redis; absent: this gateway alone.
    #[serde(default)]
    pub cluster: Option<RawCluster>,
    /// Browser clients: origins allowed to call the gateway (CORS); off when absent.
    #[serde(default)]
    pub cors: Option<RawCors>,
    /// The DNS resolver of `backends[].discovery: dns`; default: the system's.
    #[serde(default)]
    pub resolver: Option<RawResolver>,
    /// OpenTelemetry traces: a span per request, exported over OTLP; off when absent.
    #[serde(default)]
    pub tracing: Option<RawTracing>,
    /// API keys made, changed and revoked at runtime through the admin API; off when absent.
    #[serde(default)]
    pub virtual_keys: Option<RawVirtualKeys>,
    /// JWT bearer tokens of an identity provider as identities; off when absent.
    #[serde(default)]
    pub jwt: Option<RawJwt>,
    /// The gateway's estimate of what each backend's prefix cache holds, and routing by it.
    #[serde(default)]
    pub prefix_cache: RawPrefixCache,
}

/// `prefix_cache:`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawPrefixCache {
    /// Keep the index and route by it; default true.
    pub enabled: bool,
    /// Tokens per indexed block (a token taken as 4 bytes of the request); default 64.
    pub block_tokens: u32,
    /// A backend counts as holding a request's prefix from this many tokens on; default 256.
    pub min_match_tokens: u32,
    /// What a backend's cache is believed to hold before its reports say otherwise, tokens;
    /// default 1,048,576 (`backends[].prefix_cache_tokens` sets one backend's).
    pub capacity_tokens: u64,
    /// A prefix not sent to a backend for this long is taken as gone, seconds; default 600.
    pub ttl_s: f64,
}

impl Default for RawPrefixCache {
    fn default() -> Self {
        Self {
            enabled: true,
            block_tokens: 64,
            min_match_tokens: 256,
            capacity_tokens: 1 << 20,
            ttl_s: 600.0,
        }
    }
}

/// `tracing:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    /// Where spans go: an OTLP/HTTP traces endpoint, e.g.
    /// `http://otel-collector:4318/v1/traces` (protobuf).
    pub otlp_endpoint: String,
    /// `service.name` of the spans; default `tpsgate`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Share of traces started here that are sampled (0 to 1; a client's own decision, in its
    /// `traceparent`, is kept); default 1.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
}

fn default_service_name() -> String {
    "tpsgate".to_owned()
}

fn default_sample_ratio() -> f64 {
    1.0
}

/// `resolver:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResolver {
    /// Nameservers to ask, `IP:PORT` (port 53 when left out), in order.
    pub nameservers: Vec<String>,
    /// How long one query may take, ms; default 2000.
    #[serde(default = "default_resolver_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_resolver_timeout_ms() -> u64 {
    2000
}

/// How a backend's addresses are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawDiscovery {
    /// Every address the URL's host resolves to is a backend of its own.
    Dns,
}

/// `cluster:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    /// `redis://HOST:PORT/DB` or `rediss://...` (TLS).
    pub redis_url: String,
    /// Environment variable holding the Redis password (instead of one in the URL).
    #[serde(default)]
    pub password_env: Option<String>,
    /// Prefix of every key, so that several gateway fleets can share one Redis; default
    /// `tpsgate`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// How often a replica publishes its state and reads its peers'; default 50 ms.
    #[serde(default = "default_sync_interval_ms")]
    pub sync_interval_ms: u64,
    /// This replica's name among its peers; default: host name, process id and a random
    /// suffix.
    #[serde(default)]
    pub replica_id: Option<String>,
    /// PEM roots to trust for `rediss://`, beside the platform's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn default_key_prefix() -> String {
    "tpsgate".to_owned()
}

fn default_sync_interval_ms() -> u64 {
    50
}

/// `curves:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawCurves {
    /// An observation's weight halves every this many seconds; default 300.
    pub half_life_s: f64,
}

impl Default for RawCurves {
    fn default() -> Self {
        Self { half_life_s: 300.0 }
    }
}

/// `listen:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListen {
    /// `IP:port`; default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub address: String,
    /// Serve HTTPS (ALPN h2 and http/1.1) with this certificate.
    #[serde(default)]
    pub tls: Option<RawTls>,
}

impl Default for RawListen {
    fn default() -> Self {
        Self {
            address: default_listen(),
            tls: None,
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_owned()
}

/// `listen.tls:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// `admin:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    /// `IP:port`; default `127.0.0.1:9090` (loopback: the admin plane is not for the internet).
    #[serde(default = "default_admin")]
    pub listen: String,
    /// Environment variable holding a bearer token that `/metrics` and `/admin/*` require.
    #[serde(default)]
    pub token_env: Option<String>,
    /// A file holding that token instead (a mounted secret); its surrounding whitespace is
    /// not part of it.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Host names (beside IP addresses and `localhost`) under which `/metrics` and `/admin/*`
    /// answer without a token (what a scraper calls the gateway by, e.g. a compose service).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// The most API keys (in `api_keys` order) whose metrics carry their own `key` label; the
    /// rest share `key="other"`. Default 1000.
    #[serde(default = "default_max_key_series")]
    pub max_key_series: usize,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: default_admin(),
            token_env: None,
            token_file: None,
            allowed_hosts: Vec::new(),
            max_key_series: default_max_key_series(),
        }
    }
}

fn default_max_key_series() -> usize {
    1000
}

fn default_admin() -> String {
    "127.0.0.1:9090".to_owned()
}

/// `limits:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawLimits {
    /// Largest request body, bytes; default 4 MiB.
    pub max_body_bytes: u64,
    /// How long a client may take to send its request headers, seconds; default 10.
    pub header_read_timeout_s: f64,
    /// On SIGINT/SIGTERM, how long in-flight requests may go on, seconds; default 30.
    pub drain_timeout_s: f64,
    /// Largest request head (request line and headers), bytes; default 65536.
    pub max_header_bytes: u64,
    /// Client connections open at once; default 10000.
    pub max_connections: u64,
    /// How long a client has to send its request body, seconds, on top of the time its size
    /// takes at `body_min_bytes_per_s`; default 10.
    pub body_read_timeout_s: f64,
    /// The slowest a request body may arrive, bytes per second; default 16384.
    pub body_min_bytes_per_s: u64,
    /// A client connection with no request in flight is closed after this long, seconds;
    /// default 120.
    pub idle_timeout_s: f64,
    /// A client that takes no bytes of a response for this long loses its connection (and the
    /// backend slot it held), seconds; default 30.
    pub client_write_timeout_s: f64,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            header_read_timeout_s: 10.0,
            drain_timeout_s: 30.0,
            max_header_bytes: 64 << 10,
            max_connections: 10_000,
            body_read_timeout_s: 10.0,
            body_min_bytes_per_s: 16 << 10,
            idle_timeout_s: 120.0,
            client_write_timeout_s: 30.0,
        }
    }
}

const fn default_true() -> bool {
    true
}

/// One `classes[]` entry: a name, an SLO (a class with neither target is a batch class), and
/// how to route and what to do when no backend can meet the SLO.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClass {
    /// Name, as sent in `x-tpsgate-class`.
    pub name: String,
    /// Smallest acceptable per-user tokens per second.
    #[serde(default)]
    pub min_tps: Option<f64>,
    /// Which share of requests must reach `min_tps`: 50 (the median) or 90 (the slow tail's
    /// p10); default 90.
    #[serde(default = "default_percentile")]
    pub tps_percentile: u8,
    /// Largest acceptable time to first token, ms.
    #[serde(default)]
    pub max_ttft_ms: Option<f64>,
    /// Which share of requests must stay under `max_ttft_ms`: 50 or 90; default 90.
    #[serde(default = "default_percentile")]
    pub ttft_percentile: u8,
    /// How to choose a backend; default `routing.policy`.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// When no backend is predicted to meet the SLO; default `best_effort`, or `queue` for a
    /// class without an SLO (batch waits for capacity rather than take it from others).
    #[serde(default)]
    pub on_miss: Option<OnMiss>,
    /// `queue`: longest wait, ms; default max_ttft_ms, or 60000 for a batch class.
    #[serde(default)]
    pub queue_max_wait_ms: Option<f64>,
}

fn default_percentile() -> u8 {
    90
}

/// The calendar period a budget renews on (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    /// From each full hour.
    Hour,
    /// From each midnight.
    #[default]
    Day,
    /// From each first of the month.
    Month,
}

/// A routing policy. The first four use the curves; the rest are baselines kept for comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Among backends predicted to meet the SLO, the one with the most slack.
    Headroom,
    /// Among those, the cheapest per token, then the most slack.
    Cheapest,
    /// Among those, the one with the least slack (keeps other backends free).
    Pack,
    /// Where the request adds the most system TPS without breaking anyone's SLO (batch).
    Throughput,
    /// Baseline: in turn.
    RoundRobin,
    /// Baseline: fewest requests in flight.
    LeastInflight,
    /// Baseline: the better of two random backends by peak-EWMA TTFT x (in flight + 1).
    P2cPeakEwma,
    /// Baseline: lowest recent TTFT.
    LowestTtft,
    /// Baseline: session affinity, blind to load: the prompt's first block (or its
    /// `prompt_cache_key` / `x-session-id`) hashed onto the backends, as consistent-hash
    /// routers pin a conversation or a shared system prompt to one replica.
    PrefixHash,
    /// Benchmark only: `headroom` with the simulator's true curves (`/sim/truth`).
    Oracle,
}

/// What a class does when no backend is predicted to meet its SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMiss {
    /// Send it where the predicted violation is least.
    BestEffort,
    /// Wait (FIFO within the class) until a backend is feasible, up to the queue wait; then 429.
    Queue,
    /// Answer 429 with Retry-After at once.
    Shed,
}

/// One `routes[]` rule: requests matching every given field get `class` (unless they name a
/// class in `x-tpsgate-class`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouteRule {
    /// Exact request path, e.g. `/v1/completions`.
    #[serde(default)]
    pub path: Option<String>,
    /// Exact client model name.
    #[serde(default)]
    pub model: Option<String>,
    /// The class to give.
    #[serde(default)]
    pub class: Option<String>,
    /// With `path` alone: the backend that a body naming no model (an upload, a transcription)
    /// on that path is forwarded to, instead of `default_backend`.
    #[serde(default)]
    pub backend: Option<String>,
    /// `false`: matching requests go only to backends of the client's own dialect, never
    /// translated; default `true`.
    #[serde(default = "default_true")]
    pub translate: bool,
}

/// `cors:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCors {
    /// Origins allowed (`https://app.example.com`), or `["*"]` for any.
    pub allowed_origins: Vec<String>,
    /// How long a browser may keep a preflight's answer, seconds; default 600.
    #[serde(default = "default_cors_max_age_s")]
    pub max_age_s: u64,
}

fn default_cors_max_age_s() -> u64 {
    600
}

/// One `api_keys[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApiKey {
    /// Environment variable holding the key (read at start-up).
    pub key_env: String,
    /// Class of this key's requests when neither the header nor a route rule gives one.
    #[serde(default)]
    pub class: Option<String>,
    /// Classes its requests may claim in `x-tpsgate-class` (default: only `class`).
    #[serde(default)]
    pub classes: Option<Vec<String>>,
    /// Whether its requests may set their own SLO (`x-tpsgate-slo-*`, `x-slo-*`); default false.
    #[serde(default)]
    pub slo_overrides: bool,
    /// The key's name in metrics, `/admin/keys` and logs (never the key itself); default its
    /// `key_env`.
    #[serde(default)]
    pub name: Option<String>,
    /// What the key may use; none: no limit.
    #[serde(default)]
    pub limits: RawKeyLimits,
    /// Its share of a class's line when requests queue, against other keys' (by tokens);
    /// default 1.
    #[serde(default = "one")]
    pub weight: f64,
    /// The models (as clients name them) its requests may ask for; absent: any.
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

/// `jwt:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` it must carry (one of these).
    pub audience: OneOrMany,
    /// Where the issuer publishes its signing keys (a JWK set).
    pub jwks_url: String,
    /// The claim naming a token's tenant (a dotted path into nested claims); default `sub`.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// Each tenant a token may name: what it may use, like an API key.
    pub tenants: BTreeMap<String, RawJwtTenant>,
    /// How often the key set is fetched again (and at once for a key it does not have, at most
    /// once a second); default 300.
    #[serde(default = "default_jwks_refresh_s")]
    pub jwks_refresh_s: u64,
    /// Clock skew allowed on `exp` and `nbf`, seconds; default 30.
    #[serde(default = "default_leeway_s")]
    pub leeway_s: u64,
}

/// One string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

fn default_tenant_claim() -> String {
    "sub".to_owned()
}

fn default_jwks_refresh_s() -> u64 {
    300
}

fn default_leeway_s() -> u64 {
    30
}

/// One `jwt.tenants` entry: an `api_keys[]` entry's fields but its key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwtTenant {
    /// Its requests' class.
    #[serde(default)]
    pub class: Option<String>,
    /// Other classes they may claim.
    #[serde(default)]
    pub classes: Option<Vec<String>>,
    /// Whether they may set their own SLO.
    #[serde(default)]
    pub slo_overrides: bool,
    /// What the tenant may use.
    #[serde(default)]
    pub limits: RawKeyLimits,
    /// Its weight in a class's line.
    #[serde(default = "one")]
    pub weight: f64,
    /// The models it may ask for; absent: any.
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

/// `virtual_keys:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVirtualKeys {
    /// Where the keys are kept without `cluster:` (with it, they live in Redis).
    #[serde(default)]
    pub file: Option<PathBuf>,
}

fn one() -> f64 {
    1.0
}

/// `api_keys[].limits`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKeyLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Tokens (prompt and output) per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    pub max_concurrency: Option<u64>,
    /// Spend per `budget_period`, US dollars, priced by `backends[].cost`.
    pub budget_usd: Option<f64>,
    /// `hour`, `day` (default) or `month`, in UTC.
    pub budget_period: Option<BudgetPeriod>,
}

/// `routing:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawRouting {
    /// Policy of classes that name none, and of requests without a class; default `headroom`.
    pub policy: Policy,
    /// Share of requests that may try a backend at a concurrency its curve has not seen;
    /// default 0.02.
    pub exploration: f64,
    /// The request shape the `oracle` policy asks `/sim/truth` about.
    pub oracle: RawOracle,
    /// Attempts per request, the first included (retries happen only before any content
    /// reached the client); default 2.
    pub max_attempts: u32,
    /// Retries as a share of requests; default 0.2.
    pub retry_budget: f64,
}

impl Default for RawRouting {
    fn default() -> Self {
        Self {
            policy: Policy::Headroom,
            exploration: 0.02,
            oracle: RawOracle::default(),
            max_attempts: 2,
            retry_budget: 0.2,
        }
    }
}

/// `routing.oracle:`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawOracle {
    /// Prompt tokens; default 64.
    pub prompt_tokens: u32,
    /// Output tokens; default 128.
    pub output_tokens: u32,
}

impl Default for RawOracle {
    fn default() -> Self {
        Self {
            prompt_tokens: 64,
            output_tokens: 128,
        }
    }
}

/// `backends[].max_context_tokens`: a token count, or token counts by client model name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawContextWindow {
    /// Every model the backend serves.
    All(u64),
    /// By client model name, `"*"` for the others.
    ByModel(BTreeMap<String, u64>),
}

impl<'de> Deserialize<'de> for RawContextWindow {
    // By hand: an untagged enum's error would say only "did not match any variant".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = RawContextWindow;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a token count (e.g. 32768), or token counts by model name")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(RawContextWindow::All(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(RawContextWindow::All)
                    .map_err(|_| E::custom("a token count cannot be negative"))
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                map: M,
            ) -> Result<Self::Value, M::Error> {
                BTreeMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawContextWindow::ByModel)
            }
        }
        d.deserialize_any(Either)
    }
}
