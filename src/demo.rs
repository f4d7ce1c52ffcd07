//! `tpsgate demo`: the simulated fleet of `config/sim-fleet.yaml` (on free ports), the gateway in
//! front of it with an interactive and a batch class, and background traffic whose rate rises
//! and falls, so that every backend's curve forms on the dashboard within a minute.

use std::f64::consts::TAU;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bench::{self, BenchDialect, HttpClient, RequestSpec};
use crate::console::{say, status};
use crate::gateway::Gateway;
use crate::sim::{Fleet, FleetRaw};

/// The fleet, compiled in so that the demo runs from any directory.
const FLEET: &str = include_str!("../config/sim-fleet.yaml");

/// The model every simulated backend serves.
const MODEL: &str = "llama-3.1-8b";

/// One rise and fall of the traffic rate.
const PERIOD_S: f64 = 120.0;

/// The interactive class's SLO (as the gateway config below gives it), for the status line.
const SLO_TTFT_S: f64 = 1.0;
const SLO_TPS: f64 = 25.0;

/// How often the status line is written when stdout is not a terminal (on one, it is
/// rewritten in place every second).
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// What the demo's traffic has seen, for its status line.
#[derive(Debug, Default)]
struct Tally {
    sent: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    interactive: AtomicU64,
    interactive_met: AtomicU64,
}

impl Tally {
    fn record(&self, sample: &bench::Measurement, interactive: bool) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if sample.error.is_some() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        if interactive {
            self.interactive.fetch_add(1, Ordering::Relaxed);
            let met = bench::BenchSlo {
                ttft_s: SLO_TTFT_S,
                tps: SLO_TPS,
            }
            .met(sample);
            self.interactive_met
                .fetch_add(u64::from(met), Ordering::Relaxed);
        }
    }

    fn line(&self, seconds: f64) -> String {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let (sent, done) = (get(&self.sent), get(&self.done));
        let met = match get(&self.interactive) {
            0 => "-".to_owned(),
            n => format!(
                "{:.0}%",
                100.0 * get(&self.interactive_met) as f64 / n as f64
            ),
        };
        format!(
            "  traffic    {seconds:>4.0} s: {sent} sent, {} in flight, {} failed; interactive within its SLO ({SLO_TTFT_S} s, {SLO_TPS} tok/s): {met}",
            sent.saturating_sub(done),
            get(&self.failed),
        )
    }
}

/// `tpsgate demo` settings.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// Gateway address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Admin address (dashboard, metrics).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin: String,
    /// Peak arrival rate of the background traffic, requests per second (0: no traffic).
    #[arg(long, default_value_t = 6.0)]
    pub rate: f64,
}

/// The gateway config in front of the running fleet.
fn gateway_yaml(fleet: &Fleet, args: &DemoArgs) -> String {
    let mut text = format!(
        "listen: {{address: '{}'}}\nadmin: {{listen: '{}'}}\nbackends:\n",
        args.listen, args.admin
    );
    for (name, addr) in fleet.addrs() {
        // The hosted API is rate-limited, as hosted APIs are; the others by their engines.
        let limit = match name {
            "hosted-api" => {
                "\n    max_concurrency: 16\n    cost: {input_per_1m: 0.15, output_per_1m: 0.60}"
            }
            "llamacpp-serial" => "\n    max_concurrency: 4",
            _ => "\n    max_concurrency: 64",
        };
        let models = if name == "hosted-api" {
            format!("{{{MODEL}: {MODEL}, gpt-4o-mini: gpt-4o-mini}}")
        } else {
            format!("{{{MODEL}: {MODEL}}}")
        };
        text.push_str(&format!(
            "  - name: {name}\n    url: http://{addr}\n    dialect: openai\n    models: {models}{limit}\n"
        ));
    }
    text.push_str(
        "classes:\n  - {name: interactive, min_tps: 25, max_ttft_ms: 1000}\n  - {name: batch}\n\
         curves: {half_life_s: 120}\n",
    );
    text
}

/// Runs the demo until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: DemoArgs) -> Result<(), String> {
    if !(args.rate.is_finite() && args.rate >= 0.0) {
        return Err("--rate: use a number of requests per second, 0 or more".into());
    }
    let mut fleet: FleetRaw =
        crate::yaml::from_str(FLEET).map_err(|e| format!("the built-in fleet: {e}"))?;
    for backend in &mut fleet.backends {
        backend.listen = "127.0.0.1:0".to_owned();
    }
    let specs = fleet
        .validate()
        .map_err(|e| format!("the built-in fleet: {e}"))?;
    let sims = Fleet::start(&specs)
        .await
        .map_err(|e| format!("cannot start the simulated backends: {e}"))?;
    let text = gateway_yaml(&sims, &args);
    let config = crate::config::parse(&text, |_| None)
        .map_err(|e| format!("--listen/--admin: {}", e.message))?;
    let gateway = Gateway::start(&config).await.map_err(|e| {
        format!("{e} (is another tpsgate running? pick other ports with --listen and --admin)")
    })?;
    let url = gateway.url();
    let admin = format!("http://{}", gateway.admin_addr());
    let interrupted = crate::signal::shutdown_signal();
    say(&format!(
        "tpsgate demo: {} simulated backends behind the gateway, traffic up to {} requests/s \
         (80% interactive, 20% batch), rising and falling every {PERIOD_S:.0} s.",
        specs.len(),
        args.rate
    ));
    say(&format!(
        "  gateway    {url}/v1   (OpenAI and Anthropic APIs)"
    ));
    say(&format!(
        "  dashboard  {admin}/   (curves form within a minute)"
    ));
    say(&format!(
        "  metrics    {admin}/metrics   curves: {admin}/admin/curves"
    ));
    say(&format!(
        "  curl       curl -N {url}/v1/chat/completions -H 'content-type: application/json' \
         -H 'x-tpsgate-class: interactive' \
         -d '{{\"model\":\"{MODEL}\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    ));
    say(&format!(
        "  python     from openai import OpenAI; c = OpenAI(base_url=\"{url}/v1\", api_key=\"unused\"); \
         print(c.chat.completions.create(model=\"{MODEL}\", messages=[{{\"role\":\"user\",\"content\":\"hi\"}}]).choices[0].message.content)"
    ));
    say("Ctrl-C stops everything.");

    let (stop, stopped) = watch::channel(false);
    let tally = Arc::new(Tally::default());
    let traffic = tokio::spawn(traffic(url, args.rate, Arc::clone(&tally), stopped));
    // Request lines stay out of the demo's log (RUST_LOG=tpsgate::request=info shows them): a
    // status line tells how the traffic goes, so the URLs above stay on screen.
    let started = Instant::now();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let every = if terminal {
        Duration::from_secs(1)
    } else {
        STATUS_EVERY
    };
    let mut tick = tokio::time::interval_at(started + every, every);
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            () = &mut interrupted => break,
            _ = tick.tick() => {
                let line = tally.line(started.elapsed().as_secs_f64());
                if terminal { status(&line) } else { say(&line) }
            }
        }
    }
    if terminal {
        say("");
    }
    say(&tally.line(started.elapsed().as_secs_f64()));
    say("stopping: traffic, then the gateway, then the backends");
    let _ = stop.send(true);
    let _ = traffic.await;
    gateway.stop().await;
    sims.stop().await;
    Ok(())
}

/// The request kinds of the traffic: interactive with prompts and outputs of several sizes,
/// and long batch generations.
fn kinds(url: &str) -> Result<(Vec<RequestSpec>, Vec<RequestSpec>), String> {
    let class = |name: &'static str| {
        vec![(
            HeaderName::from_static("x-tpsgate-class"),
            HeaderValue::from_static(name),
        )]
    };
    let mut interactive = Vec::new();
    for prompt in [32, 256, 1024] {
        for output in [64, 128, 256] {
            interactive.push(RequestSpec::new(
                url,
                BenchDialect::Openai,
                MODEL,
                prompt,
                output,
                class("interactive"),
            )?);
        }
    }
    let batch = vec![RequestSpec::new(
        url,
        BenchDialect::Openai,
        MODEL,
        512,
        512,
        class("batch"),
    )?];
    Ok((interactive, batch))
}

/// Poisson arrivals whose rate follows `peak × (0.55 + 0.45 sin(2πt / PERIOD_S))`.
async fn traffic(url: String, peak: f64, tally: Arc<Tally>, mut stopped: watch::Receiver<bool>) {
    let Ok((interactive, batch)) = kinds(&url) else {
        return;
    };
    if peak <= 0.0 {
        return;
    }
    let Ok(client): Result<HttpClient, _> = bench::http_client(None) else {
        return;
    };
    let mut rng = SmallRng::from_os_rng();
    let mut running = JoinSet::new();
    let start = Instant::now();
    loop {
        let t = start.elapsed().as_secs_f64();
        let rate = peak * (0.55 + 0.45 * (TAU * t / PERIOD_S).sin());
        let gap = -(1.0 - rng.random::<f64>()).ln() / rate.max(1e-3);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs_f64(gap.min(5.0))) => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
        let is_interactive = rng.random::<f64>() < 0.8;
        let kind = if is_interactive {
            &interactive[rng.random_range(0..interactive.len())]
        } else {
            &batch[0]
        };
        let (client, spec, tally) = (client.clone(), kind.clone(), Arc::clone(&tally));
        tally.sent.fetch_add(1, Ordering::Relaxed);
        running.spawn(async move {
            let sample = bench::client::run_one(&client, &spec).await;
            tally.record(&sample, is_interactive);
        });
        while running.try_join_next().is_some() {}
    }
    // In-flight requests are dropped: the client goes away, as users do.
    running.abort_all();
}
