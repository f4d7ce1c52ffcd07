//! The command line: `tpsgate serve | check | sim | bench | demo`.
//!
//! Everything the binary prints to stdout goes through [`say`]; logs go to stderr via tracing.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench;
use crate::console::say;
use crate::logging::LogFormat;
use crate::signal::shutdown_signal;
use crate::sim::config::{BackendRaw, EngineRaw, Mode, PrefixCacheRaw, StreamRaw, UsageStyle};
use crate::sim::{Fleet, FleetRaw};
use crate::yaml;

/// tpsgate: an LLM gateway that measures per-user tokens per second and TTFT against
/// concurrency, and routes by them.
#[derive(Debug, Parser)]
#[command(name = "tpsgate", version, about, long_about = None)]
pub(crate) struct Cli {
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
pub(crate) enum Command {
    /// Run the gateway.
    Serve(ConfigArg),
    /// Validate a gateway config and print a summary (exit 1 with every error, one per line:
    /// FILE:LINE:COL: field: message).
    Check(CheckArgs),
    /// Serve simulated LLM backends (OpenAI and Anthropic APIs) with a known curve.
    Sim(SimArgs),
    /// Measure TTFT, per-user TPS and goodput of a server, closed or open loop.
    Bench(Box<bench::BenchArgs>),
    /// Run simulated backends, the gateway in front of them and traffic; watch the dashboard.
    Demo(crate::demo::DemoArgs),
    /// Emulate gateway replicas on a cluster's Redis (the scale harness): they speak the
    /// cluster protocol with synthetic traffic; prints Redis's cost as JSON.
    Replicas(crate::cluster::emulate::ReplicasArgs),
    /// Take a running gateway's curves away: the dashboard's picture as SVG, the numbers as CSV.
    Curves(CurvesArgs),
    /// Make, list, change, rotate and revoke a running gateway's virtual keys (its admin API;
    /// `virtual_keys:` on). Prints the gateway's JSON answer.
    Keys(crate::admin::keys_cli::KeysArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `--config FILE`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArg {
    /// Gateway config file (YAML).
    #[arg(long, short, env = "TPSGATE_CONFIG")]
    pub config: PathBuf,
}

/// `tpsgate curves` arguments.
#[derive(Debug, Args)]
pub(crate) struct CurvesArgs {
    /// The gateway's admin plane, e.g. http://127.0.0.1:9090.
    #[arg(long, required_unless_present = "from", conflicts_with = "from")]
    pub url: Option<String>,
    /// A saved `/admin/curves` document to draw instead (a benchmark's, say).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
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
pub(crate) struct CheckArgs {
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
pub(crate) struct SimArgs {
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
pub(crate) struct EngineFlags {
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
    /// A natural reply's mean length: each reply ends with `stop` at a length drawn between
    /// half and one and a half times this, where its max_tokens is longer [default: none, a
    /// reply runs to its max_tokens].
    #[arg(long)]
    pub reply_tokens: Option<u32>,
    /// Percent of the turns offering tools whose answer calls one (drawn per request) [default:
    /// 100].
    #[arg(long)]
    pub tool_call_pct: Option<f64>,
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
    /// A context window of this many tokens, prompt and output together (vLLM's
    /// `--max-model-len`): reported by `/v1/models`, refused past it [default: none].
    #[arg(long)]
    pub max_model_len: Option<u32>,
}

pub(crate) fn run(cli: Cli) -> ExitCode {
    // The demo's screen is for its URLs and a status line: its request lines stay out of the
    // log unless RUST_LOG asks for them.
    let quiet = matches!(cli.command, Command::Demo(_)).then_some("info,tpsgate::request=warn");
    crate::logging::init(cli.log_format, quiet);
    let threads = cli.threads;
    let code = match cli.command {
        Command::Serve(args) => block_on(threads, serve(args.config)),
        Command::Check(args) => crate::check::check(&args.config.config, args.no_env),
        Command::Demo(args) => block_on(threads, crate::demo::run(args)),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tpsgate", &mut out);
            say(String::from_utf8_lossy(&out).trim_end());
            ExitCode::SUCCESS
        }
        Command::Sim(args) => block_on(threads, sim(args)),
        Command::Bench(args) => block_on(threads, bench::run(*args)),
        Command::Curves(args) => block_on(threads, curves(args)),
        Command::Replicas(args) => block_on(threads, replicas(args)),
        Command::Keys(args) => block_on(threads, async {
            let answer = crate::admin::keys_cli::run(args).await?;
            say(&serde_json::to_string_pretty(&answer).unwrap_or_default());
            Ok(())
        }),
    };
    crate::logging::flush();
    code
}

// === serve ===

async fn serve(file: PathBuf) -> Result<(), String> {
    // Taken before the file is read, so that a change made from now on is seen as one.
    let loaded = crate::live::watcher::fingerprint(&file);
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
    let watcher = tokio::spawn(crate::live::watcher::reload_on_change(
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
            step_per_seq_until: defaults.step_per_seq_until,
            max_batch: f.max_batch.or(defaults.max_batch),
            prefill_tokens_per_s: f
                .prefill_tokens_per_s
                .unwrap_or(defaults.prefill_tokens_per_s),
            prefill_stall_ms: f.prefill_stall_ms.unwrap_or(defaults.prefill_stall_ms),
            speed_spread_pct: f.speed_spread_pct.unwrap_or(defaults.speed_spread_pct),
            jitter_pct: f.jitter_pct.unwrap_or(defaults.jitter_pct),
            extra_ttft_ms: f.extra_ttft_ms.unwrap_or(defaults.extra_ttft_ms),
            default_max_tokens: f.default_max_tokens.unwrap_or(defaults.default_max_tokens),
            reply_tokens: f.reply_tokens.or(defaults.reply_tokens),
            tool_call_pct: f.tool_call_pct.unwrap_or(defaults.tool_call_pct),
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
                device: None,
                engine,
                stream,
                faults: Vec::new(),
                prefix_cache: f.prefix_cache_tokens.map(|tokens| PrefixCacheRaw {
                    tokens,
                    block_tokens: f.prefix_block_tokens,
                }),
                max_model_len: f.max_model_len,
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
    let doc = match (&args.url, &args.from) {
        (_, Some(file)) => {
            let text =
                std::fs::read(file).map_err(|e| format!("--from {}: {e}", file.display()))?;
            let doc: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                format!(
                    "--from {}: not an /admin/curves document ({e})",
                    file.display()
                )
            })?;
            if !doc["curves"].is_array() {
                return Err(format!(
                    "--from {}: not an /admin/curves document (no `curves` list); save one with `curl ADMIN/admin/curves`",
                    file.display()
                ));
            }
            doc
        }
        (Some(url), None) => fetch_curves(url, &args).await?,
        (None, None) => {
            return Err("give --url (an admin plane) or --from (a saved document)".into());
        }
    };
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

/// The `/admin/curves` document of the admin plane at `url`.
async fn fetch_curves(url: &str, args: &CurvesArgs) -> Result<serde_json::Value, String> {
    let remote = crate::admin::remote::Remote::new(
        url,
        args.token_env.as_deref(),
        true,
        args.ca_file.clone(),
    )?;
    remote.call(http::Method::GET, "/admin/curves", None).await
}
