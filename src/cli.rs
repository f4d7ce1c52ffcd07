//! The command line: `tpsgate serve | check | sim | bench | demo`.
//!
//! Everything the binary prints to stdout goes through [`say`]; logs go to stderr via tracing.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use http::{HeaderName, HeaderValue};

use crate::bench::{self, BenchDialect, Lengths, LevelReport, Mix, RequestSpec, Slo};
use crate::console::say;
use crate::logging::LogFormat;
use crate::signal::{received, shutdown_signal};
use crate::sim::config::{BackendRaw, EngineRaw, Mode, PrefixCacheRaw, StreamRaw, UsageStyle};
use crate::sim::{Fleet, FleetRaw};
use crate::yaml;

/// tpsgate: an LLM gateway that measures per-user tokens per second and TTFT against
/// concurrency, and routes by them.
#[derive(Debug, Parser)]
#[command(name = "tpsgate", version, about, long_about = None)]
pub struct Cli {
    /// Tokio worker threads (default: one per core the process may use; with one, the runtime
    /// runs on the main thread alone).
    #[arg(long, global = true, help_heading = "Global options")]
    pub threads: Option<usize>,
    /// Log format on stderr (pretty: coloured only on a terminal; json: one object per line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "pretty",
        help_heading = "Global options"
    )]
    pub log_format: LogFormat,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ConfigArg),
    /// Validate a gateway config and print a summary (exit 1 with every error, one per line:
    /// FILE:LINE:COL: field: message).
    Check(CheckArgs),
    /// Serve simulated LLM backends (OpenAI and Anthropic APIs) with a known curve.
    Sim(SimArgs),
    /// Measure TTFT, per-user TPS and goodput of a server, closed or open loop.
    Bench(Box<BenchArgs>),
    /// Run simulated backends, the gateway in front of them and traffic; watch the dashboard.
    Demo(crate::demo::DemoArgs),
    /// Emulate gateway replicas on a cluster's Redis (the scale harness): they speak the
    /// cluster protocol with synthetic traffic; prints Redis's cost as JSON.
    Replicas(crate::cluster::emulate::ReplicasArgs),
    /// Take a running gateway's curves away: the dashboard's picture as SVG, the numbers as CSV.
    Curves(CurvesArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `--config FILE`.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Gateway config file (YAML).
    #[arg(long, short, env = "TPSGATE_CONFIG")]
    pub config: PathBuf,
}

/// `tpsgate curves` arguments.
#[derive(Debug, Args)]
pub struct CurvesArgs {
    /// The gateway's admin plane, e.g. http://127.0.0.1:9090.
    #[arg(long)]
    pub url: String,
    /// Write the picture (the dashboard's charts) to this SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the points and fits to this CSV file (without --svg or --csv: CSV on stdout).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// The environment variable holding the admin token, when the gateway has one
    /// (admin.token_env).
    #[arg(long)]
    pub token_env: Option<String>,
    /// Extra PEM roots for an https:// admin URL.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

/// `tpsgate check` arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The config.
    #[command(flatten)]
    pub config: ConfigArg,
    /// Treat every environment variable the config names as set: lint a config in CI, where
    /// its secrets are not.
    #[arg(long)]
    pub no_env: bool,
}

/// `tpsgate sim` arguments: a fleet file, or one backend described by flags.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Fleet file with several backends (e.g. config/sim-fleet.yaml).
    #[arg(long, short, conflicts_with_all = ["listen", "name", "model"])]
    pub config: Option<PathBuf>,
    /// Address of the single backend (without --config).
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub listen: String,
    /// Name of the single backend.
    #[arg(long, default_value = "sim")]
    pub name: String,
    /// Model the single backend serves (repeat for several).
    #[arg(long = "model", default_value = "sim-model")]
    pub model: Vec<String>,
    /// Engine and stream settings for the single backend.
    #[command(flatten)]
    pub engine: EngineFlags,
}

/// Engine flags of `tpsgate sim`; unset flags keep the defaults of a large batching server.
#[derive(Debug, Args)]
#[group(conflicts_with = "config")]
pub struct EngineFlags {
    /// `batching` or `serial` [default: batching].
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Fixed part of a decode step, ms [default: 13.5].
    #[arg(long)]
    pub step_base_ms: Option<f64>,
    /// Added to a step per running request, ms [default: 0.83].
    #[arg(long)]
    pub step_per_seq_ms: Option<f64>,
    /// Most requests decoding at once [default: 64; 1 in serial mode].
    #[arg(long)]
    pub max_batch: Option<u32>,
    /// Prefill speed, prompt tokens per second [default: 8000].
    #[arg(long)]
    pub prefill_tokens_per_s: Option<f64>,
    /// Decode stall of every admission beyond its prompt's prefill, ms (an engine without
    /// chunked prefill) [default: 0].
    #[arg(long)]
    pub prefill_stall_ms: Option<f64>,
    /// Per-request speed spread: the 10th percentile this many percent below the median
    /// (0-90) [default: 0].
    #[arg(long)]
    pub speed_spread_pct: Option<f64>,
    /// Per-token timing jitter, percent of a step (0-50) [default: 0].
    #[arg(long)]
    pub jitter_pct: Option<f64>,
    /// Fixed delay before the engine sees a request, ms [default: 0].
    #[arg(long)]
    pub extra_ttft_ms: Option<f64>,
    /// Output length when a request names no max_tokens [default: 256].
    #[arg(long)]
    pub default_max_tokens: Option<u32>,
    /// Tokens per SSE chunk [default: 1].
    #[arg(long)]
    pub tokens_per_chunk: Option<u32>,
    /// Where usage goes when asked for [default: final-chunk].
    #[arg(long, value_enum)]
    pub usage: Option<UsageStyle>,
    /// Never send the text of the last N tokens of an answer (a byte-level BPE engine holding
    /// back bytes that are not valid UTF-8) [default: 0].
    #[arg(long)]
    pub hold_back_tokens: Option<u32>,
    /// End OpenAI streams after the finish chunk, without `data: [DONE]` (transformers serve).
    #[arg(long)]
    pub no_done: bool,
    /// Keep a prefix cache of this many prompt tokens: a prompt whose leading blocks it holds
    /// prefills only the rest, and usage reports the cached tokens [default: no cache].
    #[arg(long)]
    pub prefix_cache_tokens: Option<u32>,
    /// Tokens per prefix-cache block.
    #[arg(long, default_value_t = 16, requires = "prefix_cache_tokens")]
    pub prefix_block_tokens: u32,
}

/// `tpsgate bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
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
    pub shared_prefix: Option<bench::conversation::SharedPrefix>,
    /// Each arrival a conversation: `turns=T,think_s=X` (T turns, each re-sending the whole
    /// history, X seconds after the previous reply). Open loop only (`--rate`): the rate is of
    /// conversations.
    #[arg(long, requires = "rate")]
    pub conversation: Option<bench::conversation::Conversation>,
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
pub fn run(cli: Cli) -> ExitCode {
    // The demo's screen is for its URLs and a status line: its request lines stay out of the
    // log unless RUST_LOG asks for them.
    let quiet = matches!(cli.command, Command::Demo(_)).then_some("info,tpsgate::request=warn");
    crate::logging::init(cli.log_format, quiet);
    let threads = cli.threads;
    let code = match cli.command {
        Command::Serve(args) => block_on(threads, serve(args.config)),
        Command::Check(args) => check(&args.config.config, args.no_env),
        Command::Demo(args) => block_on(threads, crate::demo::run(args)),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tpsgate", &mut out);
            say(String::from_utf8_lossy(&out).trim_end());
            ExitCode::SUCCESS
        }
        Command::Sim(args) => block_on(threads, sim(args)),
        Command::Bench(args) => block_on(threads, run_bench(*args)),
        Command::Curves(args) => block_on(threads, curves(args)),
        Command::Replicas(args) => block_on(threads, replicas(args)),
    };
    crate::logging::flush();
    code
}

// === serve and check ===

async fn serve(file: PathBuf) -> Result<(), String> {
    // Taken before the file is read, so that a change made from now on is seen as one.
    let loaded = fingerprint(&file);
    let config = crate::config::load(&file).map_err(|e| e.to_string())?;
    let gateway = crate::gateway::Gateway::start(&config).await?;
    // Both handlers are in place before the line that says the gateway listens.
    let stop = shutdown_signal();
    #[cfg(unix)]
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    say(&format!(
        "tpsgate listening on {} (admin http://{}), {} backends",
        gateway.url(),
        gateway.admin_addr(),
        config.backends.len()
    ));
    let watcher = tokio::spawn(reload_on_change(
        file,
        loaded,
        gateway.reloader(),
        #[cfg(unix)]
        hangup,
    ));
    stop.await;
    watcher.abort();
    tracing::info!(
        drain_s = config.limits.drain_timeout.as_secs_f64(),
        "draining"
    );
    gateway.stop().await;
    Ok(())
}

/// How often the config file is looked at, and how long a change must stay put before it is
/// read (an editor or a deploy tool writing it in several steps).
const WATCH_EVERY: Duration = Duration::from_millis(500);
const SETTLE: Duration = Duration::from_millis(200);

/// A hash of the file's content, `None` when it cannot be read.
fn fingerprint(file: &std::path::Path) -> Option<u64> {
    use std::hash::{Hash as _, Hasher as _};
    let bytes = std::fs::read(file).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// Reloads the config on SIGHUP, and when the file's content changes (once per change: a file
/// caught half-written fails validation, and the next write is another change).
async fn reload_on_change(
    file: PathBuf,
    loaded: Option<u64>,
    reloader: crate::live::Reloader,
    #[cfg(unix)] mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let apply = async |why: &str| {
        tracing::info!(file = %file.display(), why, "reloading the config");
        // Whatever a file holds, the watcher goes on: a panic while reading or applying one is
        // a refused reload (logged, on /admin/reload), not the end of reloading.
        let attempt = std::panic::AssertUnwindSafe(async {
            match crate::config::load(&file) {
                Ok(config) => {
                    let _ = reloader.reload(&config).await;
                }
                Err(err) => {
                    let message = err.to_string();
                    tracing::error!(error = %message, "config reload refused; the running config stays");
                    reloader.refused(message);
                }
            }
        });
        if let Err(panic) = futures_util::FutureExt::catch_unwind(attempt).await {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            let message =
                format!("internal error while reloading (a bug; please report it): {what}");
            tracing::error!(error = %message, "config reload refused; the running config stays");
            reloader.refused(message);
        }
    };
    let mut seen = loaded;
    let mut every = tokio::time::interval(WATCH_EVERY);
    loop {
        #[cfg(unix)]
        let hup = received(&mut hangup);
        #[cfg(not(unix))]
        let hup = std::future::pending::<()>();
        tokio::select! {
            () = hup => {
                seen = fingerprint(&file);
                apply("SIGHUP").await;
            }
            _ = every.tick() => {
                let now = fingerprint(&file);
                if now == seen {
                    continue;
                }
                tokio::time::sleep(SETTLE).await;
                let settled = fingerprint(&file);
                if settled != now {
                    continue; // still being written: look again next tick
                }
                seen = settled;
                apply("the file changed").await;
            }
        }
    }
}

/// A simulator fleet lists backends by `listen` address; a gateway config by `url`.
fn is_sim_fleet(file: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(&text) else {
        return false;
    };
    doc.get("backends")
        .and_then(|b| b.as_sequence())
        .and_then(|b| b.first())
        .is_some_and(|first| first.get("listen").is_some() && first.get("url").is_none())
}

fn check(file: &std::path::Path, no_env: bool) -> ExitCode {
    if is_sim_fleet(file) {
        return match yaml::from_file::<FleetRaw>(file)
            .and_then(|f| f.validate().map_err(|e| e.in_file(file)))
        {
            Ok(specs) => {
                say(&format!("{}: ok (simulator fleet)", file.display()));
                for spec in specs {
                    say(&format!(
                        "sim backend {} on {}: {}",
                        spec.name,
                        spec.listen,
                        spec.models.join(", ")
                    ));
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{err}");
                ExitCode::FAILURE
            }
        };
    }
    let loaded = if no_env {
        crate::config::load_with(file, |_| Some("set-by-check".to_owned()))
    } else {
        crate::config::load(file)
    };
    let config = match loaded {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            if err.count() > 1 {
                eprintln!("{} errors", err.count());
            }
            return ExitCode::FAILURE;
        }
    };
    let unchecked = if no_env {
        " (environment variables not read: --no-env)"
    } else {
        ""
    };
    say(&format!("{}: ok{unchecked}", file.display()));
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    say(&format!(
        "listen {scheme}://{}  admin http://{}",
        config.listen, config.admin_listen
    ));
    for b in &config.backends {
        let mut models: Vec<String> = b
            .models
            .aliases
            .iter()
            .map(|(client, upstream)| {
                if client == upstream {
                    client.clone()
                } else {
                    format!("{client} -> {upstream}")
                }
            })
            .collect();
        if b.models.passthrough {
            models.push("* (any, passed through)".to_owned());
        }
        let dialect = match b.dialect {
            crate::config::BackendDialect::Openai => "openai",
            crate::config::BackendDialect::Anthropic => "anthropic",
        };
        let key = if b.api_key.is_some() { ", key set" } else { "" };
        // Where a client's /v1/chat/completions goes, when the backend reshapes the path.
        let shape = match (&b.path_prefix, &b.query) {
            (None, None) => String::new(),
            (prefix, query) => format!(
                ", /v1/chat/completions -> {}{}/chat/completions{}",
                b.url.path().trim_end_matches('/'),
                prefix.as_deref().unwrap_or("/v1"),
                query.as_deref().map_or(String::new(), |q| format!("?{q}"))
            ),
        };
        let discovered = b.discovery.map_or(String::new(), |d| {
            format!(
                ", one backend per address of {} (DNS, every {} s)",
                b.url.host().unwrap_or_default(),
                d.refresh.as_secs_f64()
            )
        });
        say(&format!(
            "backend {} ({dialect}, {}{key}{shape}{discovered}): {}",
            b.name,
            b.url,
            models.join(", ")
        ));
    }
    for (a, b) in config.engines_declared_twice() {
        eprintln!(
            "warning: backends {a} and {b} have the same URL in two dialects: one engine split into two curves and two in-flight counts, which misleads the router; declare it once (clients of the other dialect reach it translated: docs/gateway.md, \"Translation between dialects\")"
        );
    }
    for (i, c) in config.classes.iter().enumerate() {
        let default = if config.default_class == Some(i) {
            " (default)"
        } else {
            ""
        };
        say(&format!("class {}{default}", c.name));
    }
    if let Some(c) = &config.cluster {
        say(&format!(
            "cluster {} (key prefix {}, sync every {} ms)",
            crate::config::without_password(c.redis_url.expose()),
            c.key_prefix,
            c.sync_interval.as_millis()
        ));
    }
    ExitCode::SUCCESS
}

fn block_on(threads: Option<usize>, work: impl Future<Output = Result<(), String>>) -> ExitCode {
    // One thread (asked for, or all the process may use) is one thread used. A multi-thread
    // runtime with one worker runs `work` here and every task on the worker, handing wake-ups
    // between the two: pinned to one core it served a third fewer requests per second.
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().on_thread_park(crate::logging::flush);
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tpsgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(work);
    crate::logging::flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tpsgate: {message}");
            ExitCode::FAILURE
        }
    }
}

// === sim ===

impl SimArgs {
    /// The fleet these arguments describe.
    fn fleet(&self) -> Result<FleetRaw, String> {
        if let Some(file) = &self.config {
            return yaml::from_file(file).map_err(|e| e.to_string());
        }
        let defaults = EngineRaw::default();
        let f = &self.engine;
        let engine = EngineRaw {
            mode: f.mode.unwrap_or(defaults.mode),
            step_base_ms: f.step_base_ms.unwrap_or(defaults.step_base_ms),
            step_per_seq_ms: f.step_per_seq_ms.unwrap_or(defaults.step_per_seq_ms),
            max_batch: f.max_batch.or(defaults.max_batch),
            prefill_tokens_per_s: f
                .prefill_tokens_per_s
                .unwrap_or(defaults.prefill_tokens_per_s),
            prefill_stall_ms: f.prefill_stall_ms.unwrap_or(defaults.prefill_stall_ms),
            speed_spread_pct: f.speed_spread_pct.unwrap_or(defaults.speed_spread_pct),
            jitter_pct: f.jitter_pct.unwrap_or(defaults.jitter_pct),
            extra_ttft_ms: f.extra_ttft_ms.unwrap_or(defaults.extra_ttft_ms),
            default_max_tokens: f.default_max_tokens.unwrap_or(defaults.default_max_tokens),
        };
        let stream = StreamRaw {
            tokens_per_chunk: f.tokens_per_chunk.unwrap_or(1),
            usage: f.usage.unwrap_or_default(),
            hold_back_tokens: f.hold_back_tokens.unwrap_or(0),
            send_done: !f.no_done,
        };
        Ok(FleetRaw {
            backends: vec![BackendRaw {
                name: self.name.clone(),
                listen: self.listen.clone(),
                models: self.model.clone(),
                tls: None,
                engine,
                stream,
                faults: Vec::new(),
                prefix_cache: f.prefix_cache_tokens.map(|tokens| PrefixCacheRaw {
                    tokens,
                    block_tokens: f.prefix_block_tokens,
                }),
            }],
        })
    }
}

async fn sim(args: SimArgs) -> Result<(), String> {
    let fleet = args.fleet()?;
    let specs = fleet.validate().map_err(|e| match &args.config {
        Some(file) => e.in_file(file).to_string(),
        None => format!("sim flags: {}", e.message),
    })?;
    let running = Fleet::start(&specs).await.map_err(|e| e.to_string())?;
    let stop = shutdown_signal();
    for ((name, addr), spec) in running.addrs().zip(&specs) {
        say(&format!(
            "sim backend {name} listening on http://{addr} (models: {})",
            spec.models.join(", ")
        ));
    }
    stop.await;
    running.stop().await;
    Ok(())
}

// === curves ===

/// Fetches `/admin/curves` and writes the picture and the numbers.
async fn replicas(args: crate::cluster::emulate::ReplicasArgs) -> Result<(), String> {
    let report = crate::cluster::emulate::run(args).await?;
    say(&serde_json::to_string(&report).map_err(|e| e.to_string())?);
    Ok(())
}

async fn curves(args: CurvesArgs) -> Result<(), String> {
    use http_body_util::BodyExt as _;
    let base = args.url.trim_end_matches('/');
    let uri: http::Uri = format!("{base}/admin/curves")
        .parse()
        .map_err(|e| format!("--url: `{}` is not a URL: {e}", args.url))?;
    let mut request = http::Request::get(uri);
    if let Some(var) = &args.token_env {
        let token = std::env::var(var)
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                format!("--token-env: environment variable {var} is not set (or empty)")
            })?;
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .map_err(|e| format!("--url: {e}"))?;
    let client = crate::tls::http_client(args.ca_file.as_deref())?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{base}: the answer broke: {e}"))?
        .to_bytes();
    if !status.is_success() {
        let hint = if status == http::StatusCode::UNAUTHORIZED {
            " (the admin plane wants its token: --token-env VAR)"
        } else {
            ""
        };
        return Err(format!(
            "{base}/admin/curves answered {status}{hint}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    let doc: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{base}/admin/curves is not a tpsgate admin plane ({e})"))?;
    let write = |file: &std::path::Path, text: String| {
        std::fs::write(file, text).map_err(|e| format!("{}: {e}", file.display()))
    };
    if let Some(file) = &args.svg {
        write(file, crate::admin::export::svg(&doc))?;
    }
    if let Some(file) = &args.csv {
        write(file, crate::admin::export::csv(&doc))?;
    }
    if args.svg.is_none() && args.csv.is_none() {
        say(crate::admin::export::csv(&doc).trim_end());
    }
    Ok(())
}

// === bench ===

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
            Some(file) => Some((bench::mix::load_prompts(file)?, file.display().to_string())),
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
    slo: Option<Slo>,
) -> Result<Vec<bench::Arm>, String> {
    if args.mix.is_empty() {
        return Ok(vec![bench::Arm {
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
        arms.push(bench::Arm {
            class: Some(name.to_owned()),
            spec: arm_spec,
            mix: arm_mix,
            weight,
            slo: slo.filter(|_| scored),
        });
    }
    Ok(arms)
}

async fn run_bench(args: BenchArgs) -> Result<(), String> {
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
        (Some(ttft_ms), Some(tps)) => Some(Slo {
            ttft_s: ttft_ms / 1e3,
            tps,
        }),
        _ => None,
    };
    let client = bench::http_client(args.ca_file.as_deref())?;
    let limit = Duration::from_secs_f64(args.timeout);
    let show = |report: &LevelReport| {
        if args.json {
            say(&serde_json::to_string(report).unwrap_or_default());
        } else {
            say(&bench::table_row(report));
        }
    };
    if let Some(file) = &args.trace {
        return replay_trace(&args, file, &client, &spec, slo, limit, show).await;
    }
    if !args.json {
        say(&format!("requests: {mix}"));
        say(bench::TABLE_HEADER);
    }
    if args.rate.is_empty() {
        for &c in &args.concurrency {
            let bar = bench::progress_bar(args.requests as u64, format!("c={c}"));
            let report =
                bench::closed_loop(&client, &spec, &mix, c, args.requests, limit, &bar).await;
            bar.finish_and_clear();
            show(&report);
        }
    } else {
        let arms = mix_arms(&args, &spec, &mix, slo)?;
        let duration = Duration::from_secs_f64(args.duration);
        for &rate in &args.rate {
            let expected = (rate * args.duration).ceil() as u64;
            let bar = bench::progress_bar(expected, format!("{rate}/s"));
            let reports =
                bench::open_loop(&client, &arms, rate, duration, limit, args.seed, &bar).await;
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
    client: &bench::HttpClient,
    spec: &RequestSpec,
    slo: Option<Slo>,
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
    let requests = bench::trace::load(file)?;
    let scale = bench::trace::Scale {
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
        say(bench::TABLE_HEADER);
    }
    let bar = bench::progress_bar(requests.len() as u64, "trace".to_owned());
    let replay = bench::trace::Replay {
        requests: &requests,
        scale,
        until_s: args.trace_until,
        window_s: args.window,
        slo,
        limit,
    };
    let reports = bench::trace::replay(client, spec, &replay, &bar).await;
    bar.finish_and_clear();
    for report in &reports {
        show(report);
    }
    Ok(())
}
