//! `backends[]` as the YAML gives it: each entry, its ejection rule, prior, costs, and the
//! defaults of its fields.

use super::*;

/// The API dialect a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendDialect {
    /// OpenAI-compatible (vLLM, SGLang, TGI, llama.cpp, Ollama, OpenAI).
    Openai,
    /// Anthropic messages API.
    Anthropic,
}

/// How an OpenAI backend serves Responses clients (`/v1/responses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponsesApi {
    /// It has its own Responses API: requests pass through as they came.
    Native,
    /// It serves chat completions only: requests are translated (`translate::responses_to_chat`).
    Translate,
}

/// One `backends[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    /// Unique name, used in metrics, logs and `x-tpsgate-backend`.
    pub name: String,
    /// Base URL, `http://` or `https://`, e.g. `http://10.0.0.5:8000`; a path prefix is kept.
    pub url: String,
    /// `openai` or `anthropic`.
    pub dialect: BackendDialect,
    /// What replaces the client path's leading `/v1`, e.g. `/v1beta/openai` (Gemini's
    /// OpenAI-compatible endpoint); after the URL's own path, if it has one.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// Query parameters added to every request, e.g. `{api-version: 2024-10-21}` (Azure OpenAI).
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Environment variable holding the API key (read at start-up).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The header that carries the key, bare (e.g. `api-key`, Azure OpenAI's resource keys);
    /// default: `Authorization: Bearer KEY` (openai) or `x-api-key` (anthropic).
    #[serde(default)]
    pub api_key_header: Option<String>,
    /// Extra headers sent upstream on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Client model name -> upstream model name; the key `"*"` (value `"*"`) passes any model
    /// through unchanged.
    pub models: BTreeMap<String, String>,
    /// Hard limit on requests in flight to this backend.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// A name for the accelerator (or host) this backend's engine runs on; backends with the
    /// same name share it, and each one's load slows the others.
    #[serde(default)]
    pub device: Option<String>,
    /// Distinct model names the backend keeps curves and metrics for (the configured ones
    /// always); others seen through `"*": "*"` fold into `other`; default 64.
    #[serde(default = "default_max_models")]
    pub max_models: u32,
    /// The longest SSE line or event the backend may send, bytes; past it the stream ends with
    /// an error event; default 1048576.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: u64,
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
    /// From the gateway receiving the request to the first content event, ms; default 60000.
    #[serde(default = "default_first_token_timeout_ms")]
    pub first_token_timeout_ms: u64,
    /// Longest silence between two chunks once output flows, ms; default 30000.
    #[serde(default = "default_stall_timeout_ms")]
    pub stall_timeout_ms: u64,
    /// Whole response, ms; default none.
    #[serde(default)]
    pub total_timeout_ms: Option<u64>,
    /// A response that is not a stream, from sending the request to its end, ms (it has no
    /// first token); default 300000.
    #[serde(default = "default_response_timeout_ms")]
    pub response_timeout_ms: u64,
    /// `anthropic-version` sent when the client sends none; default `2023-06-01`.
    #[serde(default)]
    pub anthropic_version: Option<String>,
    /// Clients of the other dialect reach this backend through translation (chat completions
    /// and messages); `false`: only clients of its own dialect, requests never rewritten.
    #[serde(default = "default_true")]
    pub translate: bool,
    /// The `max_tokens` an Anthropic backend is sent for a translated request that set none
    /// (Anthropic requires one); default 4096.
    #[serde(default = "default_translated_max_tokens")]
    pub default_max_tokens: u32,
    /// An OpenAI backend: what it reads of an Anthropic client's `thinking` and
    /// `output_config.effort` (`drop`, `chat_template` or `reasoning_effort`); default `drop`.
    #[serde(default)]
    pub thinking: Option<crate::translate::Thinking>,
    /// An OpenAI backend: whether it has its own Responses API (`native`) or Responses clients
    /// are translated to its chat completions (`translate`); default `native` for OpenAI's own
    /// hosts and where `translate: false`, else `translate`.
    #[serde(default)]
    pub responses_api: Option<ResponsesApi>,
    /// Its context window, prompt and output tokens together (vLLM's `--max-model-len`): one
    /// number for every model it serves, or a number per client model name (`"*"`: the
    /// others); default: what its `/v1/models` reports as `max_model_len`, else none known.
    #[serde(default)]
    pub max_context_tokens: Option<RawContextWindow>,
    /// A Responses request translated for this backend: what becomes of tools only OpenAI's
    /// servers run (`web_search`, …) and `namespace` tools (`drop` or `refuse`); default `drop`.
    #[serde(default)]
    pub hosted_tools: crate::translate::HostedTools,
    /// What the backend is believed to do before it has been observed.
    #[serde(default)]
    pub prior: Option<RawPrior>,
    /// When upstream failures take the backend out of routing, and for how long.
    #[serde(default)]
    pub ejection: RawEjection,
    /// `dns`: the URL's host is resolved every `refresh_s` and each address becomes a backend
    /// of its own (`NAME/ADDRESS`); absent: the URL is one backend.
    #[serde(default)]
    pub discovery: Option<RawDiscovery>,
    /// With `discovery`, how often the host is resolved again, seconds; default 5.
    #[serde(default)]
    pub refresh_s: Option<f64>,
    /// Prompt tokens this backend's prefix cache holds, if known (e.g. its KV cache memory);
    /// default `prefix_cache.capacity_tokens`.
    #[serde(default)]
    pub prefix_cache_tokens: Option<u64>,
}

/// `backends[].ejection`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawEjection {
    /// Upstream failures in a row (connect errors, 5xx, broken streams) that eject; default 3.
    pub after_failures: u32,
    /// First ejection, ms; doubled after each failed probe; default 5000.
    pub base_ms: u64,
    /// Longest ejection, ms; default 300000.
    pub max_ms: u64,
}

impl Default for RawEjection {
    fn default() -> Self {
        Self {
            after_failures: 3,
            base_ms: 5000,
            max_ms: 300_000,
        }
    }
}

/// `backends[].prior`: exactly one of `points`, `fit` or `bench_file`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrior {
    /// Measured or published points.
    #[serde(default)]
    pub points: Option<Vec<RawPriorPoint>>,
    /// The fitted lines, as `/admin/curves` shows them.
    #[serde(default)]
    pub fit: Option<RawPriorFit>,
    /// Output of `tpsgate bench --json` (closed loop), relative to the config file.
    #[serde(default)]
    pub bench_file: Option<PathBuf>,
}

/// `backends[].prior.points[]`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPriorPoint {
    /// Requests in flight.
    pub concurrency: f64,
    /// Per-user tokens per second there.
    pub per_user_tps: f64,
    /// Time to first token there, ms.
    pub ttft_ms: f64,
}

/// `backends[].prior.fit`: TPOT = tpot_base_ms + tpot_per_seq_ms x c, TTFT = ttft_base_ms +
/// ttft_per_seq_ms x c.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPriorFit {
    /// Time per output token of a lone request, ms.
    pub tpot_base_ms: f64,
    /// Added per concurrent request, ms.
    #[serde(default)]
    pub tpot_per_seq_ms: f64,
    /// TTFT of a lone request, ms.
    pub ttft_base_ms: f64,
    /// Added per concurrent request, ms.
    #[serde(default)]
    pub ttft_per_seq_ms: f64,
}

fn default_first_token_timeout_ms() -> u64 {
    60_000
}

fn default_stall_timeout_ms() -> u64 {
    30_000
}

fn default_max_event_bytes() -> u64 {
    1 << 20
}

const fn default_translated_max_tokens() -> u32 {
    4096
}

fn default_max_models() -> u32 {
    64
}

fn default_response_timeout_ms() -> u64 {
    300_000
}

fn default_connect_timeout_ms() -> u64 {
    5000
}

/// `backends[].cost`: token prices (0 where a price is not given), per model where a model's
/// differ, and a self-hosted engine's price per hour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCost {
    /// USD per million input tokens.
    #[serde(default)]
    pub input_per_1m: f64,
    /// USD per million output tokens.
    #[serde(default)]
    pub output_per_1m: f64,
    /// Prices by client model name, where a model's are not the backend's.
    #[serde(default)]
    pub models: BTreeMap<String, RawPrice>,
    /// USD per hour of the engine (its GPU), shared among the requests it serves.
    pub gpu_hour_usd: Option<f64>,
}

/// `backends[].cost.models.<model>`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    /// USD per million input tokens.
    #[serde(default)]
    pub input_per_1m: f64,
    /// USD per million output tokens.
    #[serde(default)]
    pub output_per_1m: f64,
}
