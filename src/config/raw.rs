//! The gateway config exactly as written in YAML. Unknown fields are errors; every default is
//! stated here. [`super::validate`] turns this into [`super::Config`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
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
    /// How a backend is chosen.
    #[serde(default)]
    pub routing: RawRouting,
    /// How curves weigh old observations.
    #[serde(default)]
    pub curves: RawCurves,
}

/// `curves:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCurves {
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
pub struct RawListen {
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
pub struct RawTls {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// `admin:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// `IP:port`; default `127.0.0.1:9090` (loopback: the admin plane is not for the internet).
    #[serde(default = "default_admin")]
    pub listen: String,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: default_admin(),
        }
    }
}

fn default_admin() -> String {
    "127.0.0.1:9090".to_owned()
}

/// `limits:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    /// Largest request body, bytes; default 4 MiB.
    pub max_body_bytes: u64,
    /// How long a client may take to send its request headers, seconds; default 10.
    pub header_read_timeout_s: f64,
    /// On SIGINT/SIGTERM, how long in-flight requests may go on, seconds; default 30.
    pub drain_timeout_s: f64,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            header_read_timeout_s: 10.0,
            drain_timeout_s: 30.0,
        }
    }
}

/// The API dialect a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendDialect {
    /// OpenAI-compatible (vLLM, SGLang, TGI, llama.cpp, Ollama, OpenAI).
    Openai,
    /// Anthropic messages API.
    Anthropic,
}

/// One `backends[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    /// Unique name, used in metrics, logs and `x-tpsgate-backend`.
    pub name: String,
    /// Base URL, `http://` or `https://`, e.g. `http://10.0.0.5:8000`; a path prefix is kept.
    pub url: String,
    /// `openai` or `anthropic`.
    pub dialect: BackendDialect,
    /// Environment variable holding the API key (read at start-up).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Extra headers sent upstream on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Client model name -> upstream model name; the key `"*"` (value `"*"`) passes any model
    /// through unchanged.
    pub models: BTreeMap<String, String>,
    /// Hard limit on requests in flight to this backend.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Price, for the `cheapest` policy and reports.
    #[serde(default)]
    pub cost: Option<RawCost>,
    /// Extra PEM root certificates to trust for this backend.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Forward the client's own Authorization (and x-api-key) instead of a configured key.
    #[serde(default)]
    pub forward_client_auth: bool,
    /// TCP (and TLS) connect timeout, ms; default 5000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// `anthropic-version` sent when the client sends none; default `2023-06-01`.
    #[serde(default)]
    pub anthropic_version: Option<String>,
}

fn default_connect_timeout_ms() -> u64 {
    5000
}

/// `backends[].cost`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    /// USD per million input tokens.
    pub input_per_1m: f64,
    /// USD per million output tokens.
    pub output_per_1m: f64,
}

/// One `classes[]` entry. The SLO fields are read now and used by the SLO-aware router.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClass {
    /// Name, as sent in `x-tpsgate-class`.
    pub name: String,
    /// Smallest acceptable per-user tokens per second.
    #[serde(default)]
    pub min_tps: Option<f64>,
    /// Largest acceptable time to first token, ms.
    #[serde(default)]
    pub max_ttft_ms: Option<f64>,
}

/// `routing:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    /// `round_robin` (the only policy in this version).
    #[serde(default = "default_policy")]
    pub policy: String,
}

impl Default for RawRouting {
    fn default() -> Self {
        Self {
            policy: default_policy(),
        }
    }
}

fn default_policy() -> String {
    "round_robin".to_owned()
}
