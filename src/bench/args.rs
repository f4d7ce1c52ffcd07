//! `tpsgate bench`'s flags, and a run assembled from them: the request, the mix, the levels or
//! rates, or a trace replayed.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use http::{HeaderName, HeaderValue};

use super::{BenchDialect, BenchSlo, Lengths, LevelReport, Mix, RequestSpec};
use crate::console::say;

/// `tpsgate bench` arguments.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Server root, e.g. http://127.0.0.1:8080 (bench appends /v1/...).
    #[arg(long)]
    pub url: String,
    /// Model to ask for.
    #[arg(long)]
    pub model: String,
    /// Closed loop: concurrency levels to sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Closed loop: measured requests per level (warm-up and filler requests come on top).
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Output tokens per request (max_tokens): N, uniform:min=N,max=N or
    /// normal:mean=N,sd=N,min=N,max=N.
    #[arg(long, default_value = "128")]
    pub max_tokens: Lengths,
    /// Prompt length in tokens (4 bytes of text each), written as --max-tokens is.
    #[arg(long, default_value = "64", conflicts_with = "prompts")]
    pub prompt_tokens: Lengths,
    /// Prompts from a file of conversations (JSON Lines, or a JSON array as ShareGPT ships):
    /// each record's first user turn, drawn at random.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Requests that share system prompts: `groups=G,system=S,question=Q[,hot=H]` (G system
    /// prompts of S tokens, each request one of them and a question of Q tokens of its own;
    /// `hot`: group 0 takes that share). Per level, the share of prompt tokens the server
    /// reported served from its cache.
    #[arg(long, conflicts_with_all = ["prompts", "prompt_tokens"])]
    pub shared_prefix: Option<super::conversation::SharedPrefix>,
    /// Each arrival a conversation: `turns=T,think_s=X` (T turns, each re-sending the whole
    /// history, X seconds after the previous reply). Open loop only (`--rate`): the rate is of
    /// conversations.
    #[arg(long, requires = "rate")]
    pub conversation: Option<super::conversation::Conversation>,
    /// API dialect.
    #[arg(long, value_enum, default_value = "openai")]
    pub dialect: BenchDialect,
    /// Ask for whole JSON responses instead of streams (reports latency, no TTFT).
    #[arg(long)]
    pub no_stream: bool,
    /// Open loop: Poisson arrival rates, requests per second, comma-separated (replaces the
    /// closed loop).
    #[arg(long, value_delimiter = ',')]
    pub rate: Vec<f64>,
    /// Replay a trace at its own arrival times, with its own prompt and output lengths (and
    /// shared prefixes, where it has them): Mooncake JSON Lines or the Azure LLM inference CSV.
    /// Reports per window of arrivals, then the whole replay.
    #[arg(long, conflicts_with_all = ["rate", "prompts", "shared_prefix", "conversation", "mix"])]
    pub trace: Option<PathBuf>,
    /// Trace replay: arrival times multiplied by this (0.5 replays twice as fast).
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    pub time_scale: f64,
    /// Trace replay: prompt and output lengths (and the 512-token blocks of shared prefixes)
    /// multiplied by this.
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    pub token_scale: f64,
    /// Trace replay: only the arrivals within this many seconds (after --time-scale).
    #[arg(long, requires = "trace")]
    pub trace_until: Option<f64>,
    /// Trace replay: report per window of this many seconds of arrivals.
    #[arg(long, default_value_t = 60.0, requires = "trace")]
    pub window: f64,
    /// Open loop: how long arrivals go on at each rate, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seed for the draws (arrival times, classes, lengths, prompts): runs with the same seed
    /// offer the same requests (at the same moments, in open loop); default: fresh draws.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Open loop SLO: largest acceptable TTFT, ms (with --slo-tps).
    #[arg(long, requires = "slo_tps")]
    pub slo_ttft_ms: Option<f64>,
    /// Open loop SLO: smallest acceptable per-user tokens per second (with --slo-ttft-ms).
    #[arg(long, requires = "slo_ttft_ms")]
    pub slo_tps: Option<f64>,
    /// Open loop: a mix of classes, `NAME=WEIGHT[:MAX_TOKENS]`, comma-separated (e.g.
    /// `interactive=0.8,batch=0.2:512`); each request is sent with `x-tpsgate-class: NAME` and
    /// reported per class.
    #[arg(long, value_delimiter = ',', requires = "rate")]
    pub mix: Vec<String>,
    /// Open loop with --mix: the classes scored against the SLO (default: the first in --mix).
    #[arg(long, value_delimiter = ',', requires = "mix")]
    pub slo_class: Vec<String>,
    /// Extra request header, `Name: value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// API key: sent as `Authorization: Bearer` (openai) or `x-api-key` (anthropic).
    #[arg(long, env = "TPSGATE_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read the API key from this environment variable (a hosted API's, e.g. OPENAI_API_KEY),
    /// so that it never appears on a command line.
    #[arg(long, conflicts_with = "api_key")]
    pub api_key_env: Option<String>,
    /// Extra PEM root certificates to trust for an https:// --url (beside the platform's).
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Give up on a request after this many seconds.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Print one JSON object per level instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command line.
impl BenchArgs {
    fn request_spec(&self) -> Result<RequestSpec, String> {
        let mut headers = Vec::with_capacity(self.headers.len() + 1);
        for raw in &self.headers {
            let (name, value) = raw
                .split_once(':')
                .ok_or_else(|| format!("--header `{raw}`: write it as `Name: value`"))?;
            let name = HeaderName::try_from(name.trim())
                .map_err(|e| format!("--header `{raw}`: bad header name: {e}"))?;
            let value = HeaderValue::try_from(value.trim())
                .map_err(|e| format!("--header `{raw}`: bad header value: {e}"))?;
            headers.push((name, value));
        }
        let from_env = match &self.api_key_env {
            Some(var) => Some(
                std::env::var(var)
                    .ok()
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| {
                        format!("--api-key-env: environment variable {var} is not set (or empty)")
                    })?,
            ),
            None => None,
        };
        if let Some(key) = from_env.as_ref().or(self.api_key.as_ref()) {
            let (name, value) = match self.dialect {
                BenchDialect::Openai => ("authorization", format!("Bearer {key}")),
                BenchDialect::Anthropic => ("x-api-key", key.clone()),
            };
            let mut value = HeaderValue::try_from(value)
                .map_err(|_| "--api-key contains characters not allowed in a header".to_owned())?;
            value.set_sensitive(true);
            headers.push((HeaderName::from_static(name), value));
        }
        let spec = RequestSpec::new(
            &self.url,
            self.dialect,
            &self.model,
            self.prompt_tokens.typical(),
            self.max_tokens.typical(),
            headers,
        )?;
        Ok(if self.no_stream {
            spec.unstreamed()
        } else {
            spec
        })
    }

    fn mix(&self) -> Result<Mix, String> {
        let prompts = match &self.prompts {
            Some(file) => Some((super::mix::load_prompts(file)?, file.display().to_string())),
            None => None,
        };
        Ok(Mix {
            prompt: self.prompt_tokens,
            output: self.max_tokens,
            prompts,
            seed: self.seed,
            shared: self.shared_prefix.clone(),
            conversation: self.conversation,
        })
    }
}

/// The open-loop arms: one plain arm, or one per `--mix` entry.
fn mix_arms(
    args: &BenchArgs,
    spec: &RequestSpec,
    mix: &Mix,
    slo: Option<BenchSlo>,
) -> Result<Vec<super::Arm>, String> {
    if args.mix.is_empty() {
        return Ok(vec![super::Arm {
            class: None,
            spec: spec.clone(),
            mix: mix.clone(),
            weight: 1.0,
            slo,
        }]);
    }
    let mut arms = Vec::with_capacity(args.mix.len());
    for (i, entry) in args.mix.iter().enumerate() {
        let bad = || format!("--mix `{entry}`: write NAME=WEIGHT or NAME=WEIGHT:MAX_TOKENS");
        let (name, rest) = entry.split_once('=').ok_or_else(bad)?;
        let (weight, max_tokens) = match rest.split_once(':') {
            Some((w, t)) => (w, Some(t.parse::<u32>().map_err(|_| bad())?)),
            None => (rest, None),
        };
        let weight: f64 = weight.parse().map_err(|_| bad())?;
        if name.is_empty() || !(weight.is_finite() && weight > 0.0) {
            return Err(bad());
        }
        let (mut arm_spec, arm_mix) = match max_tokens {
            Some(t) => (spec.with_max_tokens(t), mix.with_output(t)),
            None => (spec.clone(), mix.clone()),
        };
        let value = HeaderValue::try_from(name).map_err(|_| bad())?;
        arm_spec
            .headers
            .push((HeaderName::from_static("x-tpsgate-class"), value));
        let scored = if args.slo_class.is_empty() {
            i == 0
        } else {
            args.slo_class.iter().any(|c| c == name)
        };
        arms.push(super::Arm {
            class: Some(name.to_owned()),
            spec: arm_spec,
            mix: arm_mix,
            weight,
            slo: slo.filter(|_| scored),
        });
    }
    Ok(arms)
}

pub(crate) async fn run(args: BenchArgs) -> Result<(), String> {
    let spec = args.request_spec()?;
    let mix = args.mix()?;
    if args.concurrency.contains(&0) {
        return Err("--concurrency: levels must be at least 1".into());
    }
    if args.rate.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err("--rate: rates must be positive numbers".into());
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.duration) || !positive(args.timeout) {
        return Err("--duration and --timeout must be positive numbers of seconds".into());
    }
    let slo = match (args.slo_ttft_ms, args.slo_tps) {
        (Some(ttft_ms), Some(tps)) => Some(BenchSlo {
            ttft_s: ttft_ms / 1e3,
            tps,
        }),
        _ => None,
    };
    let client = super::http_client(args.ca_file.as_deref())?;
    let limit = Duration::from_secs_f64(args.timeout);
    let show = |report: &LevelReport| {
        if args.json {
            say(&serde_json::to_string(report).unwrap_or_default());
        } else {
            say(&super::table_row(report));
        }
    };
    if let Some(file) = &args.trace {
        return replay_trace(&args, file, &client, &spec, slo, limit, show).await;
    }
    if !args.json {
        say(&format!("requests: {mix}"));
        say(super::TABLE_HEADER);
    }
    if args.rate.is_empty() {
        for &c in &args.concurrency {
            let bar = super::progress_bar(args.requests as u64, format!("c={c}"));
            let report =
                super::closed_loop(&client, &spec, &mix, c, args.requests, limit, &bar).await;
            bar.finish_and_clear();
            show(&report);
        }
    } else {
        let arms = mix_arms(&args, &spec, &mix, slo)?;
        let duration = Duration::from_secs_f64(args.duration);
        for &rate in &args.rate {
            let expected = (rate * args.duration).ceil() as u64;
            let bar = super::progress_bar(expected, format!("{rate}/s"));
            let reports =
                super::open_loop(&client, &arms, rate, duration, limit, args.seed, &bar).await;
            bar.finish_and_clear();
            for report in &reports {
                show(report);
            }
        }
    }
    Ok(())
}

/// `bench --trace`: the trace's requests at their scaled times, reported per window and whole.
async fn replay_trace(
    args: &BenchArgs,
    file: &std::path::Path,
    client: &super::HttpClient,
    spec: &RequestSpec,
    slo: Option<BenchSlo>,
    limit: Duration,
    show: impl Fn(&LevelReport),
) -> Result<(), String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.time_scale) || !positive(args.token_scale) || !positive(args.window) {
        return Err("--time-scale, --token-scale and --window must be positive numbers".into());
    }
    if args.trace_until.is_some_and(|s| !positive(s)) {
        return Err("--trace-until must be a positive number of seconds".into());
    }
    let requests = super::trace::load(file)?;
    let scale = super::trace::Scale {
        time: args.time_scale,
        tokens: args.token_scale,
    };
    if !args.json {
        say(&format!(
            "trace: {} ({} requests; times x{}, tokens x{})",
            file.display(),
            requests.len(),
            args.time_scale,
            args.token_scale
        ));
        say(super::TABLE_HEADER);
    }
    let bar = super::progress_bar(requests.len() as u64, "trace".to_owned());
    let replay = super::trace::Replay {
        requests: &requests,
        scale,
        until_s: args.trace_until,
        window_s: args.window,
        slo,
        limit,
    };
    let reports = super::trace::replay(client, spec, &replay, &bar).await;
    bar.finish_and_clear();
    for report in &reports {
        show(report);
    }
    Ok(())
}
