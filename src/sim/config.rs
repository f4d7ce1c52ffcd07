//! Simulator configuration: the YAML fleet file, the single-backend flags, and runtime patches
//! (`POST /sim/params`) all go through one raw shape and one validation.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::yaml::ConfigError;

/// A fleet file (`config/sim-fleet.yaml`): several backends served by one process.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetRaw {
    /// The simulated backends, each on its own address.
    pub backends: Vec<BackendRaw>,
}

/// One simulated backend as written in YAML.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendRaw {
    /// Name reported by `/sim/truth` and in logs.
    pub name: String,
    /// Address to bind, e.g. `127.0.0.1:9101` (port 0 picks a free port).
    pub listen: String,
    /// Model names this backend serves; any other model gets 404.
    pub models: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain and key (`[cert_file, key_file]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SimTls>,
    /// The device its engine shares with the other backends naming it (one GPU, one host's
    /// cores): a decode step also waits for theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Timing model of the engine.
    #[serde(default)]
    pub engine: EngineRaw,
    /// Wire-format choices of the stream.
    #[serde(default)]
    pub stream: StreamRaw,
    /// Injected failures.
    #[serde(default)]
    pub faults: Vec<FaultRaw>,
    /// A prefix cache (vLLM's automatic prefix caching): prompts whose leading blocks it holds
    /// prefill only the rest. Absent: every prompt prefills whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheRaw>,
    /// Its context window, prompt and output tokens together (vLLM's `--max-model-len`):
    /// reported by `/v1/models` and `/tokenize`, and a request past it gets vLLM's 400.
    /// Absent: no window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
}

/// `backends[].prefix_cache` of a fleet file.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCacheRaw {
    /// Prompt tokens the cache holds, across every prompt (the KV memory left for it).
    pub tokens: u32,
    /// Tokens per cached block; default 16 (vLLM's block size).
    #[serde(default = "default_block_tokens")]
    pub block_tokens: u32,
}

fn default_block_tokens() -> u32 {
    16
}

/// A validated prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheSpec {
    /// Blocks held at most.
    pub blocks: usize,
    /// Tokens per block.
    pub block_tokens: u32,
}

impl PrefixCacheRaw {
    fn validate(&self, at: &str) -> Result<PrefixCacheSpec, ConfigError> {
        if !(1..=4096).contains(&self.block_tokens) {
            return Err(ConfigError::at(
                format!("{at}.block_tokens"),
                format!("{} is out of range: use 1 to 4096", self.block_tokens),
            ));
        }
        if self.tokens < self.block_tokens {
            return Err(ConfigError::at(
                format!("{at}.tokens"),
                format!(
                    "{} holds not one block of {} tokens: give at least block_tokens",
                    self.tokens, self.block_tokens
                ),
            ));
        }
        Ok(PrefixCacheSpec {
            blocks: (self.tokens / self.block_tokens) as usize,
            block_tokens: self.block_tokens,
        })
    }
}

/// `backends[].tls` of a fleet file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimTls {
    /// PEM certificate chain.
    pub cert_file: std::path::PathBuf,
    /// PEM private key.
    pub key_file: std::path::PathBuf,
}

/// Whether the engine batches requests or serves them one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Continuous batching: up to `max_batch` requests decode together.
    Batching,
    /// One request at a time; the rest wait in FIFO order.
    Serial,
}

/// Engine timing as written in YAML. Defaults describe a large batching server
/// (about 70 tok/s per user at concurrency 1, about 15 at 64).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineRaw {
    /// `batching` or `serial`.
    pub mode: Mode,
    /// Fixed part of one decode step, milliseconds.
    pub step_base_ms: f64,
    /// Added to a decode step per running request, milliseconds.
    pub step_per_seq_ms: f64,
    /// The batch past which a running request adds nothing more to a step (absent: none). A
    /// batching `transformers serve` on an H200 slowed as a line to 8 in flight and held its
    /// speed from there to 19: a fit through the levels below cannot see that.
    pub step_per_seq_until: Option<u32>,
    /// Most requests decoding at once; more wait FIFO. Must be 1 (or absent) in serial mode.
    pub max_batch: Option<u32>,
    /// Prefill speed: a prompt of P tokens stalls decoding for P / this seconds.
    pub prefill_tokens_per_s: f64,
    /// Each admission stalls every running request's decode this much longer than its prompt's
    /// prefill, milliseconds: the newcomer's forward pass of its own, as engines without
    /// chunked prefill run it whatever its length. Speed then falls with the arrival rate too,
    /// and a request's speed with the arrivals during its decode.
    pub prefill_stall_ms: f64,
    /// Each request decodes at a speed of its own, drawn once at admission: log-normal about
    /// the engine's, its 10th percentile this many percent below the median (0..=90). A
    /// batching engine measured on an H100 spread so at 30 (p10 / p50 = 0.7 at concurrency 8).
    pub speed_spread_pct: f64,
    /// Each token's emission time deviates from its grid point by up to this share of a step, in
    /// percent (0..=50). It does not drift: the mean rate stays exact.
    pub jitter_pct: f64,
    /// Fixed delay before a request reaches the engine (a hosted API's network and queue),
    /// milliseconds. It holds no batch slot.
    pub extra_ttft_ms: f64,
    /// Output length when the request names no max_tokens; such requests finish with `stop`.
    pub default_max_tokens: u32,
    /// A natural reply's length, tokens (absent: a reply runs to its limit): each request's is
    /// drawn between half and one and a half times this (from its `x-request-id` where it has
    /// one), and a reply shorter than its `max_tokens` ends there with `stop`, as a model's
    /// does. A coding agent asking 32,000 tokens a turn gets its answer, not 32,000 tokens.
    pub reply_tokens: Option<u32>,
    /// The share of the turns offering tools whose answer calls one, percent (0..=100; drawn
    /// per request, from its `x-request-id` where it has one); the others answer with text.
    pub tool_call_pct: f64,
}

impl Default for EngineRaw {
    fn default() -> Self {
        Self {
            mode: Mode::Batching,
            step_base_ms: 13.5,
            step_per_seq_ms: 0.83,
            step_per_seq_until: None,
            max_batch: None,
            prefill_tokens_per_s: 8000.0,
            prefill_stall_ms: 0.0,
            speed_spread_pct: 0.0,
            jitter_pct: 0.0,
            extra_ttft_ms: 0.0,
            default_max_tokens: 256,
            reply_tokens: None,
            tool_call_pct: 100.0,
        }
    }
}

/// Batch limit when `max_batch` is absent in batching mode.
pub(crate) const DEFAULT_MAX_BATCH: u32 = 64;

/// Wire-format options as written in YAML.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamRaw {
    /// Tokens packed into one SSE chunk (real engines with stream intervals or speculative
    /// decoding send several).
    pub tokens_per_chunk: u32,
    /// Where usage goes when the client asks for it: `final_chunk` (vLLM: a last chunk with empty
    /// `choices`), `finish_chunk` (transformers serve: on the chunk with `finish_reason`) or
    /// `never` (servers that ignore `include_usage`).
    pub usage: UsageStyle,
    /// The text of the last this many tokens of every answer is never sent, though they take
    /// their decode steps and usage counts them: a byte-level BPE engine holds back bytes that
    /// are not yet valid UTF-8, and a stream of such tokens goes silent until its finish event.
    pub hold_back_tokens: u32,
    /// Send `data: [DONE]` after the last OpenAI chunk; `false` ends the stream right after the
    /// finish (or usage) chunk, as transformers serve does.
    pub send_done: bool,
}

/// Where an OpenAI stream reports usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum UsageStyle {
    /// A final chunk with empty `choices` (vLLM, OpenAI).
    #[default]
    FinalChunk,
    /// On the chunk that carries `finish_reason` (transformers serve).
    FinishChunk,
    /// Not at all, even when asked.
    Never,
}

impl Default for StreamRaw {
    fn default() -> Self {
        Self {
            tokens_per_chunk: 1,
            usage: UsageStyle::FinalChunk,
            hold_back_tokens: 0,
            send_done: true,
        }
    }
}

/// One injected fault as written in YAML. Exactly one of `probability` and `every` says when it
/// fires; the other fields depend on `kind`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRaw {
    /// `http_500`, `http_503`, `http_429`, `slow_first_byte`, `stall` or `reset`.
    pub kind: FaultKindRaw,
    /// Fire on this share of requests (0 < p <= 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Fire on every N-th request (N >= 1) to this backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    /// `http_429`: the Retry-After header, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u32>,
    /// `slow_first_byte`: delay before response headers; `stall`: length of the silence. Milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// `stall` and `reset`: tokens sent before the fault strikes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_tokens: Option<u32>,
}

/// The fault kinds a backend can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKindRaw {
    /// Answer 500 with an OpenAI-style error body.
    #[serde(rename = "http_500")]
    Http500,
    /// Answer 503 with an OpenAI-style error body.
    #[serde(rename = "http_503")]
    Http503,
    /// Answer 429 with `Retry-After`.
    #[serde(rename = "http_429")]
    Http429,
    /// Wait `delay_ms` before sending response headers.
    SlowFirstByte,
    /// After `after_tokens` tokens, send nothing for `delay_ms`, then go on.
    Stall,
    /// After `after_tokens` tokens, cut the connection without ending the stream.
    Reset,
}

/// Validated engine timing; all durations in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// Fixed part of one step.
    pub step_base: f64,
    /// Per running request part of one step.
    pub step_per_seq: f64,
    /// The batch past which the per-request part stops growing.
    pub step_per_seq_until: usize,
    /// Most requests decoding at once (1 in serial mode).
    pub max_batch: usize,
    /// Prefill speed, tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Decode stall of every admission beyond its prompt's prefill, seconds.
    pub prefill_stall: f64,
    /// The share below its median at which a request's own speed has its 10th percentile
    /// (0..=0.9).
    pub speed_spread: f64,
    /// Emission jitter as a fraction of a step (0..=0.5).
    pub jitter: f64,
    /// Delay before the engine sees the request.
    pub extra_ttft: Duration,
    /// Output length when the request names none.
    pub default_max_tokens: u32,
    /// A natural reply's mean length (`EngineRaw::reply_tokens`).
    pub reply_tokens: Option<u32>,
    /// The share of the turns offering tools whose answer calls one (0..=1).
    pub tool_call_share: f64,
}

impl Timing {
    /// Length of one decode step with `batch` requests running, seconds.
    pub(crate) fn step(&self, batch: usize) -> f64 {
        self.step_base + self.step_per_seq * batch.min(self.step_per_seq_until) as f64
    }

    /// Decode stall caused by admitting a prompt of `prompt_tokens`, seconds.
    pub(crate) fn prefill(&self, prompt_tokens: u32) -> f64 {
        f64::from(prompt_tokens) / self.prefill_tokens_per_s + self.prefill_stall
    }
}

/// Validated wire-format options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// Tokens per SSE chunk, >= 1.
    pub tokens_per_chunk: u32,
    /// Where usage goes.
    pub usage: UsageStyle,
    /// Tokens at the end of every answer whose text is never sent.
    pub hold_back_tokens: u32,
    /// Whether an OpenAI stream ends with `data: [DONE]`.
    pub send_done: bool,
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On this share of requests.
    Probability(f64),
    /// On every N-th request.
    Every(u64),
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this status and an error body; `retry_after` seconds for 429.
    Status {
        status: u16,
        retry_after: Option<u32>,
    },
    /// Hold the response headers this long.
    SlowFirstByte(Duration),
    /// Go silent after `after_tokens` tokens for this long.
    Stall { after_tokens: u32, pause: Duration },
    /// Cut the connection after `after_tokens` tokens.
    Reset { after_tokens: u32 },
}

/// A validated fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fault {
    /// When it fires.
    pub trigger: Trigger,
    /// What it does.
    pub action: FaultAction,
}

/// Everything about a backend that `POST /sim/params` may change, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Engine timing.
    pub timing: Timing,
    /// Wire format.
    pub stream: StreamOptions,
    /// Injected faults, checked in order; the first that fires wins.
    pub faults: Vec<Fault>,
}

/// A validated backend.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Name.
    pub name: String,
    /// Where to bind.
    pub listen: SocketAddr,
    /// Served model names.
    pub models: Vec<String>,
    /// Certificate and key files when serving HTTPS.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The device its engine shares with the backends naming the same (fixed at start).
    pub device: Option<String>,
    /// Runtime-changeable parameters.
    pub params: Params,
    /// Its prefix cache, if it has one.
    pub prefix_cache: Option<PrefixCacheSpec>,
    /// Its context window, if it has one.
    pub max_model_len: Option<u32>,
    /// The raw form, kept so that runtime patches merge into what was configured.
    pub raw: BackendRaw,
}

impl FleetRaw {
    /// Validates every backend; names and fixed ports must be unique.
    pub fn validate(&self) -> Result<Vec<BackendSpec>, ConfigError> {
        if self.backends.is_empty() {
            return Err(ConfigError::at(
                "backends",
                "no backends: list at least one simulated backend",
            ));
        }
        let mut specs: Vec<BackendSpec> = Vec::with_capacity(self.backends.len());
        for (i, raw) in self.backends.iter().enumerate() {
            let at = format!("backends[{i}]");
            let spec = raw.validate(&at)?;
            if specs.iter().any(|s| s.name == spec.name) {
                return Err(ConfigError::at(
                    format!("{at}.name"),
                    format!(
                        "duplicate backend name `{}`: names must be unique",
                        spec.name
                    ),
                ));
            }
            if spec.listen.port() != 0 && specs.iter().any(|s| s.listen == spec.listen) {
                return Err(ConfigError::at(
                    format!("{at}.listen"),
                    format!("address {} is used by another backend", spec.listen),
                ));
            }
            specs.push(spec);
        }
        Ok(specs)
    }
}

impl BackendRaw {
    /// Validates this backend; `at` is its path in the file (e.g. `backends[2]`).
    pub fn validate(&self, at: &str) -> Result<BackendSpec, ConfigError> {
        if self.name.trim().is_empty() {
            return Err(ConfigError::at(format!("{at}.name"), "must not be empty"));
        }
        let listen = self.listen.parse().map_err(|_| {
            ConfigError::at(
                format!("{at}.listen"),
                format!(
                    "`{}` is not an IP:port address; write e.g. 127.0.0.1:9101",
                    self.listen
                ),
            )
        })?;
        if self.models.is_empty() {
            return Err(ConfigError::at(
                format!("{at}.models"),
                "list at least one model name this backend serves",
            ));
        }
        if let Some(i) = self.models.iter().position(|m| m.trim().is_empty()) {
            return Err(ConfigError::at(
                format!("{at}.models[{i}]"),
                "model names must not be empty",
            ));
        }
        Ok(BackendSpec {
            name: self.name.clone(),
            listen,
            models: self.models.clone(),
            tls: self
                .tls
                .as_ref()
                .map(|t| (t.cert_file.clone(), t.key_file.clone())),
            device: match &self.device {
                Some(d) if d.trim().is_empty() => {
                    return Err(ConfigError::at(
                        format!("{at}.device"),
                        "name the shared device (e.g. gpu0), or remove the field",
                    ));
                }
                d => d.clone(),
            },
            params: self.params(at)?,
            prefix_cache: self
                .prefix_cache
                .map(|c| c.validate(&format!("{at}.prefix_cache")))
                .transpose()?,
            max_model_len: match self.max_model_len {
                Some(0) => {
                    return Err(ConfigError::at(
                        format!("{at}.max_model_len"),
                        "give the context window in tokens, above 0, or remove the field",
                    ));
                }
                n => n,
            },
            raw: self.clone(),
        })
    }

    /// Validates only the runtime-changeable part.
    pub(crate) fn params(&self, at: &str) -> Result<Params, ConfigError> {
        let faults = self
            .faults
            .iter()
            .enumerate()
            .map(|(i, f)| f.validate(&format!("{at}.faults[{i}]")))
            .collect::<Result<_, _>>()?;
        Ok(Params {
            timing: self.engine.validate(&format!("{at}.engine"))?,
            stream: self.stream.validate(&format!("{at}.stream"))?,
            faults,
        })
    }
}

fn finite_at_least(
    at: &str,
    field: &str,
    value: f64,
    min: f64,
    hint: &str,
) -> Result<(), ConfigError> {
    if value.is_finite() && value >= min {
        Ok(())
    } else {
        Err(ConfigError::at(
            format!("{at}.{field}"),
            format!("{value} is out of range: {hint}"),
        ))
    }
}

impl EngineRaw {
    fn validate(&self, at: &str) -> Result<Timing, ConfigError> {
        if !(self.step_base_ms.is_finite() && self.step_base_ms > 0.0) {
            return Err(ConfigError::at(
                format!("{at}.step_base_ms"),
                format!(
                    "{} is out of range: a step takes more than 0 ms",
                    self.step_base_ms
                ),
            ));
        }
        finite_at_least(
            at,
            "step_per_seq_ms",
            self.step_per_seq_ms,
            0.0,
            "use 0 or more",
        )?;
        if self.step_per_seq_until == Some(0) {
            return Err(ConfigError::at(
                format!("{at}.step_per_seq_until"),
                "must be at least 1 (leave it out for a step that grows with every request)",
            ));
        }
        if !(self.prefill_tokens_per_s.is_finite() && self.prefill_tokens_per_s > 0.0) {
            return Err(ConfigError::at(
                format!("{at}.prefill_tokens_per_s"),
                format!(
                    "{} is out of range: use a positive rate",
                    self.prefill_tokens_per_s
                ),
            ));
        }
        finite_at_least(
            at,
            "extra_ttft_ms",
            self.extra_ttft_ms,
            0.0,
            "use 0 or more",
        )?;
        finite_at_least(
            at,
            "prefill_stall_ms",
            self.prefill_stall_ms,
            0.0,
            "use 0 or more",
        )?;
        if !(0.0..=90.0).contains(&self.speed_spread_pct) {
            return Err(ConfigError::at(
                format!("{at}.speed_spread_pct"),
                format!(
                    "{} is out of range: use 0 to 90 (percent below the median at the 10th percentile)",
                    self.speed_spread_pct
                ),
            ));
        }
        if !(0.0..=50.0).contains(&self.jitter_pct) {
            return Err(ConfigError::at(
                format!("{at}.jitter_pct"),
                format!(
                    "{} is out of range: use 0 to 50 (percent of a step)",
                    self.jitter_pct
                ),
            ));
        }
        if self.default_max_tokens == 0 {
            return Err(ConfigError::at(
                format!("{at}.default_max_tokens"),
                "must be at least 1",
            ));
        }
        if !(0.0..=100.0).contains(&self.tool_call_pct) {
            return Err(ConfigError::at(
                format!("{at}.tool_call_pct"),
                format!(
                    "{} is out of range: use 0 to 100 (percent of the turns offering tools)",
                    self.tool_call_pct
                ),
            ));
        }
        if self.reply_tokens == Some(0) {
            return Err(ConfigError::at(
                format!("{at}.reply_tokens"),
                "must be at least 1 (or absent: a reply runs to its max_tokens)",
            ));
        }
        let max_batch = match (self.mode, self.max_batch) {
            (_, Some(0)) => {
                return Err(ConfigError::at(
                    format!("{at}.max_batch"),
                    "must be at least 1",
                ));
            }
            (Mode::Serial, Some(n)) if n > 1 => {
                return Err(ConfigError::at(
                    format!("{at}.max_batch"),
                    format!(
                        "{n} conflicts with mode: serial, which serves one request at a time; remove max_batch or use mode: batching"
                    ),
                ));
            }
            (Mode::Serial, _) => 1,
            (Mode::Batching, n) => n.unwrap_or(DEFAULT_MAX_BATCH) as usize,
        };
        Ok(Timing {
            step_base: self.step_base_ms / 1e3,
            step_per_seq: self.step_per_seq_ms / 1e3,
            step_per_seq_until: self.step_per_seq_until.map_or(usize::MAX, |n| n as usize),
            max_batch,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            prefill_stall: self.prefill_stall_ms / 1e3,
            speed_spread: self.speed_spread_pct / 100.0,
            jitter: self.jitter_pct / 100.0,
            extra_ttft: Duration::from_secs_f64(self.extra_ttft_ms / 1e3),
            default_max_tokens: self.default_max_tokens,
            reply_tokens: self.reply_tokens,
            tool_call_share: self.tool_call_pct / 100.0,
        })
    }
}

impl StreamRaw {
    fn validate(&self, at: &str) -> Result<StreamOptions, ConfigError> {
        if self.tokens_per_chunk == 0 {
            return Err(ConfigError::at(
                format!("{at}.tokens_per_chunk"),
                "must be at least 1",
            ));
        }
        Ok(StreamOptions {
            tokens_per_chunk: self.tokens_per_chunk,
            usage: self.usage,
            hold_back_tokens: self.hold_back_tokens,
            send_done: self.send_done,
        })
    }
}

impl FaultRaw {
    fn validate(&self, at: &str) -> Result<Fault, ConfigError> {
        let trigger = match (self.probability, self.every) {
            (Some(p), None) if p > 0.0 && p <= 1.0 => Trigger::Probability(p),
            (Some(p), None) => {
                return Err(ConfigError::at(
                    format!("{at}.probability"),
                    format!("{p} is out of range: use 0 < probability <= 1"),
                ));
            }
            (None, Some(n)) if n >= 1 => Trigger::Every(n),
            (None, Some(_)) => {
                return Err(ConfigError::at(format!("{at}.every"), "must be at least 1"));
            }
            _ => {
                return Err(ConfigError::at(
                    at,
                    "give exactly one of `probability` (share of requests) and `every` (every N-th request)",
                ));
            }
        };
        let need = |value: Option<u64>, field: &str| {
            value.ok_or_else(|| {
                ConfigError::at(
                    format!("{at}.{field}"),
                    format!("required for kind {:?}", self.kind),
                )
            })
        };
        let forbid = |present: bool, field: &str| {
            if present {
                Err(ConfigError::at(
                    format!("{at}.{field}"),
                    format!("does not apply to kind {:?}; remove it", self.kind),
                ))
            } else {
                Ok(())
            }
        };
        let action = match self.kind {
            FaultKindRaw::Http500 | FaultKindRaw::Http503 => {
                forbid(self.retry_after_s.is_some(), "retry_after_s")?;
                forbid(self.delay_ms.is_some(), "delay_ms")?;
                forbid(self.after_tokens.is_some(), "after_tokens")?;
                let status = if self.kind == FaultKindRaw::Http500 {
                    500
                } else {
                    503
                };
                FaultAction::Status {
                    status,
                    retry_after: None,
                }
            }
            FaultKindRaw::Http429 => {
                forbid(self.delay_ms.is_some(), "delay_ms")?;
                forbid(self.after_tokens.is_some(), "after_tokens")?;
                FaultAction::Status {
                    status: 429,
                    retry_after: Some(self.retry_after_s.unwrap_or(1)),
                }
            }
            FaultKindRaw::SlowFirstByte => {
                forbid(self.retry_after_s.is_some(), "retry_after_s")?;
                forbid(self.after_tokens.is_some(), "after_tokens")?;
                FaultAction::SlowFirstByte(Duration::from_millis(need(self.delay_ms, "delay_ms")?))
            }
            FaultKindRaw::Stall => {
                forbid(self.retry_after_s.is_some(), "retry_after_s")?;
                FaultAction::Stall {
                    after_tokens: self.after_tokens.unwrap_or(1),
                    pause: Duration::from_millis(need(self.delay_ms, "delay_ms")?),
                }
            }
            FaultKindRaw::Reset => {
                forbid(self.retry_after_s.is_some(), "retry_after_s")?;
                forbid(self.delay_ms.is_some(), "delay_ms")?;
                FaultAction::Reset {
                    after_tokens: self.after_tokens.unwrap_or(1),
                }
            }
        };
        Ok(Fault { trigger, action })
    }
}

/// Merges a JSON patch (objects merge key by key; anything else replaces) into `base`.
pub(crate) fn merge_json(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                match base.get_mut(&key) {
                    Some(slot) => merge_json(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

#[cfg(test)]
mod tests;
