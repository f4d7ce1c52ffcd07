//! `tpsgate bench`: an active sweep client for OpenAI- and Anthropic-compatible servers.
//!
//! Closed loop ([`closed_loop`]) keeps `c` streaming requests in flight and reports, per level,
//! TTFT and per-user TPS quantiles and system TPS. So that each level describes a steady state,
//! not a burst:
//! - each worker's first request is warm-up and not measured; worker `i` of `c` asks in it for
//!   `i / c` of the output length, which spreads the workers' phases evenly over one request's
//!   lifetime at this very concurrency, so arrivals do not pile up in synchronised waves (with
//!   equal requests a burst start would repeat itself forever);
//! - workers keep the load on (unmeasured) until the last measured request ends, so every
//!   measured request ran at the stated concurrency.
//!
//! Open loop ([`open_loop`]) sends Poisson arrivals at a rate for a bounded time and scores each
//! request against an SLO: attainment is the share of requests that met both targets, goodput
//! the number of such requests per second of wall time (first arrival to last completion).
//! Per-request definitions are in [`client`].

pub(crate) mod args;
pub mod client;
pub(crate) mod conversation;
pub(crate) mod mix;
pub(crate) mod stats;
pub(crate) mod trace;

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub(crate) use args::{BenchArgs, run};
pub use client::{BenchDialect, HttpClient, Measurement, Prompt, RequestSpec, http_client};
pub use mix::{Lengths, Mix};
pub use stats::{BenchSlo, LevelReport};

/// Runs one request with a time limit.
async fn timed(client: &HttpClient, spec: &RequestSpec, limit: Duration) -> Measurement {
    let sample = match tokio::time::timeout(limit, client::run_one(client, spec)).await {
        Ok(sample) => sample,
        Err(_) => Measurement {
            error: Some(format!(
                "no complete response within {}s",
                limit.as_secs_f64()
            )),
            ..Measurement::default()
        },
    };
    Measurement {
        prompt_tokens: spec.prompt_tokens(),
        max_tokens: spec.max_tokens,
        ..sample
    }
}

/// A worker's (or the arrivals') random draws: from `seed` and `stream` when seeded, so that a
/// run repeats; else fresh.
fn draws(seed: Option<u64>, stream: u64) -> SmallRng {
    seed.map_or_else(SmallRng::from_os_rng, |s| {
        SmallRng::seed_from_u64(s ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    })
}

/// Measures `requests` requests of `mix`, shaped from `spec`, at a steady `concurrency` (see
/// the module docs).
pub async fn closed_loop(
    client: &HttpClient,
    spec: &RequestSpec,
    mix: &Mix,
    concurrency: usize,
    requests: usize,
    limit: Duration,
    progress: &ProgressBar,
) -> LevelReport {
    let concurrency = concurrency.max(1);
    let tickets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (done_tx, done_rx) = watch::channel(requests == 0);
    let done_tx = std::sync::Arc::new(done_tx);
    let mut workers = JoinSet::new();
    for i in 0..concurrency {
        let (client, spec, progress) = (client.clone(), spec.clone(), progress.clone());
        let (tickets, finished, done_tx) = (tickets.clone(), finished.clone(), done_tx.clone());
        let mut done = done_rx.clone();
        let mix = mix.clone();
        // Seeded, each request's shape comes from its ticket's own draws: which worker takes
        // which ticket varies from run to run, the measured requests do not.
        let mut unseeded = draws(None, 0);
        let mut shape = move |ticket: u64| match mix.seed {
            Some(_) => mix.draw(&spec, &mut draws(mix.seed, ticket)),
            None => mix.draw(&spec, &mut unseeded),
        };
        workers.spawn(async move {
            use std::sync::atomic::Ordering::SeqCst;
            let mut mine = Vec::new();
            let first = shape(u64::MAX - i as u64);
            let phase = (u64::from(first.max_tokens) * i as u64 / concurrency as u64).max(1);
            let mut warm_up = Some(first.with_max_tokens(u32::try_from(phase).unwrap_or(1)));
            loop {
                if let Some(first) = warm_up.take() {
                    tokio::select! {
                        _ = timed(&client, &first, limit) => {}
                        _ = done.wait_for(|d| *d) => break,
                    }
                    continue;
                }
                let ticket = tickets.fetch_add(1, SeqCst);
                let measured = ticket < requests;
                let next = shape(ticket as u64);
                if measured {
                    mine.push(timed(&client, &next, limit).await);
                    progress.inc(1);
                    if finished.fetch_add(1, SeqCst) + 1 == requests {
                        let _ = done_tx.send(true);
                    }
                } else {
                    if *done.borrow() {
                        break;
                    }
                    // Filler load: dropped (the request cancelled) once the level is measured.
                    tokio::select! {
                        _ = timed(&client, &next, limit) => {}
                        _ = done.wait_for(|d| *d) => break,
                    }
                }
            }
            mine
        });
    }
    let samples: Vec<Measurement> = workers.join_all().await.into_iter().flatten().collect();
    // Little's law on a closed loop: c requests always in flight, each yielding tokens/total.
    let ok = samples.iter().filter(|s| s.error.is_none());
    let tokens: f64 = ok.clone().map(|s| f64::from(s.output_tokens)).sum();
    let time: f64 = ok.map(|s| s.total).sum();
    let system_tps = if time > 0.0 {
        concurrency as f64 * tokens / time
    } else {
        0.0
    };
    let ok: Vec<f64> = samples
        .iter()
        .filter(|s| s.error.is_none())
        .map(|s| s.total)
        .collect();
    let mean_time = ok.iter().sum::<f64>() / ok.len().max(1) as f64;
    LevelReport {
        concurrency: Some(concurrency),
        requests_per_s: (mean_time > 0.0).then(|| concurrency as f64 / mean_time),
        mix: Some(mix.to_string()),
        ..LevelReport::from_samples(&samples, system_tps)
    }
}

/// One kind of request in an open-loop mix.
#[derive(Debug, Clone)]
pub(crate) struct Arm {
    /// The class it is sent as (`x-tpsgate-class`), if any.
    pub class: Option<String>,
    /// The request.
    pub spec: RequestSpec,
    /// How its requests are shaped from `spec`.
    pub mix: Mix,
    /// Relative share of arrivals.
    pub weight: f64,
    /// What a request of this kind must meet to count as good.
    pub slo: Option<BenchSlo>,
}

/// Sends Poisson arrivals at `rate` per second for `duration`, each drawn from `arms` by weight,
/// then waits for them all; one report per arm. The same `seed` draws the same sequence of arms
/// and the same arrival times (scaled by the rate), and each arm's mix the same requests, so
/// that policies compared side by side are offered identical work.
pub(crate) async fn open_loop(
    client: &HttpClient,
    arms: &[Arm],
    rate: f64,
    duration: Duration,
    limit: Duration,
    seed: Option<u64>,
    progress: &ProgressBar,
) -> Vec<LevelReport> {
    let mut rng = seed.map_or_else(SmallRng::from_os_rng, SmallRng::seed_from_u64);
    // A stream of its own for the requests' shapes: a fixed mix draws nothing, and a drawn one
    // leaves the arrival times as they are.
    let mut shapes = draws(seed, u64::MAX);
    let total_weight: f64 = arms.iter().map(|a| a.weight).sum();
    let start = Instant::now();
    let mut at = 0.0;
    let mut inflight = JoinSet::new();
    let mut arrivals = 0_u64;
    loop {
        // Exponential gaps: -ln(U) / rate, with U in (0, 1].
        at += -(1.0 - rng.random::<f64>()).ln() / rate.max(1e-9);
        if at > duration.as_secs_f64() {
            break;
        }
        let mut draw = rng.random::<f64>() * total_weight;
        let arm = arms
            .iter()
            .position(|a| {
                draw -= a.weight;
                draw < 0.0
            })
            .unwrap_or(arms.len().saturating_sub(1));
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let Some((spec, mix)) = arms
            .get(arm)
            .map(|a| (a.mix.draw(&a.spec, &mut shapes), a.mix.clone()))
        else {
            break;
        };
        // A seeded run names its requests, so that a simulator draws the same speeds for them
        // on every run (`RequestSpec::named`).
        let name = seed.map(|s| format!("s{s}-r{}-{arrivals}", (rate * 1000.0).round() as u64));
        arrivals += 1;
        let spec = match &name {
            Some(name) => spec.named(name),
            None => spec,
        };
        let (client, progress) = (client.clone(), progress.clone());
        // A conversation's later questions come from draws of its own, seeded from the
        // shapes' stream so that a seeded run repeats.
        let mut own = draws(mix.seed.map(|_| shapes.random()), 0);
        inflight.spawn(async move {
            let Some(conversation) = mix.conversation else {
                let sample = timed(&client, &spec, limit).await;
                progress.inc(1);
                return vec![(arm, sample)];
            };
            let question = mix
                .shared
                .as_ref()
                .map_or(mix.prompt.typical(), |s| s.question_tokens);
            let mut turns = Vec::with_capacity(conversation.turns as usize);
            let mut spec = spec;
            for turn in 0..conversation.turns {
                if turn > 0 {
                    tokio::time::sleep(conversation.think).await;
                }
                let sample = timed(&client, &spec, limit).await;
                progress.inc(1);
                let (failed, reply) = (sample.error.is_some(), sample.output_tokens);
                turns.push((arm, sample));
                if failed {
                    break;
                }
                spec = spec.next_turn(reply, conversation::words(question, &mut own));
                if let Some(name) = &name {
                    spec = spec.named(&format!("{name}-t{}", turn + 1));
                }
            }
            turns
        });
    }
    let samples: Vec<(usize, Measurement)> =
        inflight.join_all().await.into_iter().flatten().collect();
    let wall = (Instant::now() - start).as_secs_f64().max(1e-9);
    arms.iter()
        .enumerate()
        .map(|(i, a)| arm_report(a, &samples, i, rate, duration, wall))
        .collect()
}

/// What arm `i` (`a`) measured of an open-loop run at `rate` for `duration` that took `wall`
/// seconds to its last answer: its speed, and its SLO's attainment and goodput.
fn arm_report(
    a: &Arm,
    samples: &[(usize, Measurement)],
    i: usize,
    rate: f64,
    duration: Duration,
    wall: f64,
) -> LevelReport {
    let mine: Vec<Measurement> = samples
        .iter()
        .filter(|(arm, _)| *arm == i)
        .map(|(_, s)| s.clone())
        .collect();
    let tokens: f64 = mine
        .iter()
        .filter(|s| s.error.is_none())
        .map(|s| f64::from(s.output_tokens))
        .sum();
    let mut report = LevelReport::from_samples(&mine, tokens / wall);
    report.rate_rps = Some(rate);
    report.class.clone_from(&a.class);
    report.mix = Some(a.mix.to_string());
    if let Some(slo) = a.slo {
        let good = mine.iter().filter(|s| slo.met(s)).count();
        report.slo = Some(slo);
        report.slo_attainment = Some(if mine.is_empty() {
            0.0
        } else {
            good as f64 / mine.len() as f64
        });
        // Over the window arrivals were offered in (rate x attainment), so that a slow
        // tail of another class does not dilute it.
        report.goodput_rps = Some(good as f64 / duration.as_secs_f64().max(1e-9));
    }
    report
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) fn progress_bar(len: u64, label: String) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label);
    bar
}

/// The human table's header line.
pub(crate) const TABLE_HEADER: &str = "level        reqs  err  ttft_p50  ttft_p90  ttft_p99 | tps_p10  tps_p50  tps_p90 | sys_tps  gap_p99   slo_ok  goodput   cached";

/// One row of the human table.
pub(crate) fn table_row(r: &LevelReport) -> String {
    let level = match (r.concurrency, r.rate_rps, r.window_s) {
        (Some(c), _, _) => format!("c={c}"),
        (None, Some(rate), _) => format!("{rate}/s"),
        (None, None, Some([from, to])) => format!("{from:.0}-{to:.0}s"),
        (None, None, None) => "all".to_owned(),
    };
    let level = match &r.class {
        Some(class) => format!("{level} {class}"),
        None => level,
    };
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |s| format!("{:.1}ms", s * 1e3));
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", x * 100.0));
    format!(
        "{level:<12} {:>4} {:>4} {:>9} {:>9} {:>9} | {:>7} {:>8} {:>8} | {:>7.1} {:>8} {:>8} {:>8} {:>8}",
        r.requests,
        r.errors,
        ms(r.ttft_p50_s),
        ms(r.ttft_p90_s),
        ms(r.ttft_p99_s),
        num(r.per_user_tps_p10),
        num(r.per_user_tps_p50),
        num(r.per_user_tps_p90),
        r.system_tps,
        ms(r.chunk_gap_p99_s),
        pct(r.slo_attainment),
        num(r.goodput_rps),
        pct(r.cached_share),
    )
}
