//! `tpsgate replicas`: the scale harness's emulated replicas. Each speaks the cluster protocol
//! exactly as a gateway replica does (the same [`round::round_trip`], the same statements of
//! its part, the same thinning of samples), with synthetic traffic instead of a router:
//! requests arrive at a set rate per replica, wait a while for a first token, stream a while
//! and end; every first token and end is a curve sample. So 10, 100 or 1,000 replicas can be
//! put on one Redis from one process, beside one real gateway, and Redis's cost measured.
//!
//! At the end the replicas hold their requests still for a while (`--hold-s`), so that a real
//! gateway's fleet-wide counts can be compared with the sums the report gives; then they leave
//! (or, with `--vanish`, stop without a word, as killed replicas do).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::time::Instant;

use super::RedisKeys;
use super::round::{self, Outgoing, Standing};
use super::sums::{self, Kind};
use super::wire::{Clock, SampleBody, SharedSample};
use crate::curve::{LocalLoad, Outcome};

/// `tpsgate replicas` arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReplicasArgs {
    /// The Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,
    /// The fleet's key prefix (the gateway's `cluster.key_prefix`).
    #[arg(long, default_value = "tpsgate")]
    pub key_prefix: String,
    /// Emulated replicas.
    #[arg(long, default_value_t = 100)]
    pub replicas: usize,
    /// Backend names, comma-separated (the gateway's).
    #[arg(long, value_delimiter = ',', required = true)]
    pub backends: Vec<String>,
    /// The model the samples are of.
    #[arg(long, default_value = "m")]
    pub model: String,
    /// The class every request is of.
    #[arg(long, default_value = "interactive")]
    pub class: String,
    /// The sync interval, ms.
    #[arg(long, default_value_t = 50)]
    pub interval_ms: u64,
    /// New requests a second through each replica.
    #[arg(long, default_value_t = 0.5)]
    pub rate: f64,
    /// Mean seconds a request streams (its first token comes after a tenth of it).
    #[arg(long, default_value_t = 8.0)]
    pub mean_s: f64,
    /// Seconds of traffic before measuring.
    #[arg(long, default_value_t = 5.0)]
    pub warmup_s: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 20.0)]
    pub measure_s: f64,
    /// Seconds the requests then hold still, for comparing a gateway's counts with the sums.
    #[arg(long, default_value_t = 3.0)]
    pub hold_s: f64,
    /// Connections to Redis the replicas share (each multiplexed).
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Stop without leaving: the replicas' parts go when their leases run out.
    #[arg(long)]
    pub vanish: bool,
}

/// What `tpsgate replicas` reports (JSON).
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// Emulated replicas, backends, interval.
    pub replicas: usize,
    /// See `replicas`.
    pub backends: usize,
    /// See `replicas`.
    pub interval_ms: u64,
    /// Seconds measured.
    pub measured_s: f64,
    /// Rounds a second the replicas achieved together (the target is replicas / interval).
    pub rounds_per_s: f64,
    /// Rounds that failed (timed out) a second.
    pub failed_per_s: f64,
    /// Why rounds failed, and how often (all replicas, the whole run).
    pub errors: BTreeMap<String, u64>,
    /// Round trips' time, ms: median, 99th percentile.
    pub round_ms_p50: f64,
    /// See `round_ms_p50`.
    pub round_ms_p99: f64,
    /// Redis's CPU, seconds a second (1.0: one core).
    pub redis_cpu: f64,
    /// Redis's commands a second.
    pub redis_commands_per_s: f64,
    /// Bytes a second into and out of Redis, all clients together.
    pub redis_bytes_in_per_s: f64,
    /// See `redis_bytes_in_per_s`.
    pub redis_bytes_out_per_s: f64,
    /// Both directions, per replica.
    pub bytes_per_s_per_replica: f64,
    /// Samples a second the replicas took, and shared.
    pub samples_taken_per_s: f64,
    /// See `samples_taken_per_s`.
    pub samples_shared_per_s: f64,
    /// Requests in flight per backend, all replicas, while they hold still.
    pub held: BTreeMap<String, u64>,
    /// When the hold began, Unix ms.
    pub held_from_ms: u64,
    /// The sums' in-flight count per backend as Redis held it during the hold.
    pub sums_in_flight: BTreeMap<String, i64>,
}

/// Runs the emulated replicas; the report.
pub(crate) async fn run(args: ReplicasArgs) -> Result<Report, String> {
    if args.replicas == 0 || args.backends.is_empty() || args.connections == 0 {
        return Err("--replicas, --backends and --connections need at least one".to_owned());
    }
    let (client, pool, script) = connect(&args).await?;
    let keys = RedisKeys::new(&args.key_prefix);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup_s);
    let hold_from = measure_from + Duration::from_secs_f64(args.measure_s);
    let stop_at = hold_from + Duration::from_secs_f64(args.hold_s);
    let shared = Arc::new(Shared {
        args: args.clone(),
        keys,
        script,
        measure_from,
        hold_from,
        stop_at,
    });
    let mut tasks = Vec::with_capacity(args.replicas);
    for i in 0..args.replicas {
        let conn = pool[i % pool.len()].clone();
        tasks.push(tokio::spawn(
            Emulated::new(i, &shared).run(conn, Arc::clone(&shared)),
        ));
    }
    // Its own connection, so that its answers do not queue behind the replicas' rounds.
    let mut info_conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("{}: {e}", args.redis_url))?;
    tokio::time::sleep_until(measure_from).await;
    let before = info(&mut info_conn).await?;
    tokio::time::sleep_until(hold_from).await;
    let after = info(&mut info_conn).await?;
    let measured = after.at.duration_since(before.at).as_secs_f64();
    // Half-way through the hold, every replica has stated its held counts.
    tokio::time::sleep(Duration::from_secs_f64(args.hold_s / 2.0)).await;
    let sums: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&shared.keys.sums)
        .query_async(&mut info_conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut stats = Stats::default();
    for task in tasks {
        let s = task.await.map_err(|e| e.to_string())?;
        stats.merge(s);
    }
    stats.latencies.sort_by(f32::total_cmp);
    let quantile = |q: f64| {
        let n = stats.latencies.len();
        if n == 0 {
            return 0.0;
        }
        f64::from(stats.latencies[((n - 1) as f64 * q) as usize])
    };
    let held_from_ms = Clock::read().wall(hold_from);
    let sums_in_flight = args
        .backends
        .iter()
        .map(|b| {
            let n = sums
                .get(&sums::field(Kind::InFlight, &[b]))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (b.clone(), n)
        })
        .collect();
    let bytes = (after.bytes_in - before.bytes_in) + (after.bytes_out - before.bytes_out);
    Ok(Report {
        replicas: args.replicas,
        backends: args.backends.len(),
        interval_ms: args.interval_ms,
        measured_s: measured,
        rounds_per_s: stats.rounds as f64 / measured,
        failed_per_s: stats.failed as f64 / measured,
        errors: std::mem::take(&mut stats.errors),
        round_ms_p50: quantile(0.5),
        round_ms_p99: quantile(0.99),
        redis_cpu: (after.cpu - before.cpu) / measured,
        redis_commands_per_s: (after.commands - before.commands) / measured,
        redis_bytes_in_per_s: (after.bytes_in - before.bytes_in) / measured,
        redis_bytes_out_per_s: (after.bytes_out - before.bytes_out) / measured,
        bytes_per_s_per_replica: bytes / measured / args.replicas as f64,
        samples_taken_per_s: stats.taken as f64 / measured,
        samples_shared_per_s: stats.shared as f64 / measured,
        held: stats.held,
        held_from_ms,
        sums_in_flight,
    })
}

/// The Redis client of `args`, its pool of connections, and the script loaded there.
async fn connect(
    args: &ReplicasArgs,
) -> Result<
    (
        redis::Client,
        Vec<redis::aio::MultiplexedConnection>,
        redis::Script,
    ),
    String,
> {
    let client = redis::Client::open(args.redis_url.as_str())
        .map_err(|e| format!("--redis-url `{}`: {e}", args.redis_url))?;
    let mut pool = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        pool.push(
            client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("{}: {e}", args.redis_url))?,
        );
    }
    let script = round::script();
    script
        .load_async(&mut pool[0])
        .await
        .map_err(|e| format!("loading the script: {e}"))?;
    Ok((client, pool, script))
}

/// What every emulated replica shares.
struct Shared {
    args: ReplicasArgs,
    keys: RedisKeys,
    script: redis::Script,
    measure_from: Instant,
    hold_from: Instant,
    stop_at: Instant,
}

/// Redis's counters at a moment.
struct Info {
    at: Instant,
    cpu: f64,
    commands: f64,
    bytes_in: f64,
    bytes_out: f64,
}

async fn info(conn: &mut MultiplexedConnection) -> Result<Info, String> {
    let text: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO: {e}"))?;
    let get = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    Ok(Info {
        at: Instant::now(),
        cpu: get("used_cpu_sys") + get("used_cpu_user"),
        commands: get("total_commands_processed"),
        bytes_in: get("total_net_input_bytes"),
        bytes_out: get("total_net_output_bytes"),
    })
}

/// One replica's counts while measured.
#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    failed: u64,
    errors: BTreeMap<String, u64>,
    latencies: Vec<f32>,
    taken: u64,
    shared: u64,
    held: BTreeMap<String, u64>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.rounds += other.rounds;
        self.failed += other.failed;
        for (e, n) in other.errors {
            *self.errors.entry(e).or_default() += n;
        }
        self.latencies.extend(other.latencies);
        self.taken += other.taken;
        self.shared += other.shared;
        for (b, n) in other.held {
            *self.held.entry(b).or_default() += n;
        }
    }
}

/// A synthetic request: seconds after the emulator's start.
#[derive(Debug, Clone, Copy)]
struct Synthetic {
    start: f64,
    first: f64,
    end: f64,
    first_seen: bool,
}

#[derive(Debug)]
struct BackendState {
    name: String,
    requests: Vec<Synthetic>,
    area: f64,
}

/// One emulated replica.
struct Emulated {
    id: String,
    incarnation: String,
    standing: Standing,
    cursor: Option<String>,
    backends: Vec<BackendState>,
    pending: Vec<SharedSample>,
    next_arrival: f64,
    last: f64,
    stats: Stats,
}

/// An exponentially distributed wait of mean `mean`.
fn exponential(mean: f64) -> f64 {
    -mean * (1.0 - rand::random::<f64>()).ln()
}

impl Emulated {
    fn new(i: usize, shared: &Shared) -> Self {
        Self {
            id: format!("emulated-{i:05}"),
            incarnation: format!("{:016x}", rand::random::<u64>()),
            standing: Standing::default(),
            cursor: None,
            backends: shared
                .args
                .backends
                .iter()
                .map(|name| BackendState {
                    name: name.clone(),
                    requests: Vec::new(),
                    area: 0.0,
                })
                .collect(),
            pending: Vec::new(),
            next_arrival: exponential(1.0 / shared.args.rate.max(1e-9)),
            last: 0.0,
            stats: Stats::default(),
        }
    }

    async fn run(mut self, mut conn: MultiplexedConnection, shared: Arc<Shared>) -> Stats {
        let interval = Duration::from_millis(shared.args.interval_ms.max(1));
        // Replicas start spread over one interval, as independent processes would.
        tokio::time::sleep(interval.mul_f64(rand::random::<f64>())).await;
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let lease_ms = u64::try_from(super::lease(interval).as_millis()).unwrap_or(u64::MAX);
        loop {
            every.tick().await;
            let now = Instant::now();
            if now >= shared.stop_at {
                break;
            }
            let holding = now >= shared.hold_from;
            let measuring = now >= shared.measure_from && !holding;
            let t = now
                .duration_since(shared.measure_from - Duration::from_secs_f64(shared.args.warmup_s))
                .as_secs_f64();
            let clock = Clock::read();
            self.advance(t, holding, &shared, &clock, measuring);
            let t_ms = clock.wall(now);
            let mut current = Vec::new();
            for b in &self.backends {
                let waiting: Vec<&Synthetic> =
                    b.requests.iter().filter(|r| !r.first_seen).collect();
                let load = LocalLoad {
                    count: u32::try_from(b.requests.len()).unwrap_or(u32::MAX),
                    area: b.area,
                    waiting: u32::try_from(waiting.len()).unwrap_or(u32::MAX),
                    waiting_age_s: waiting.iter().map(|r| t - r.start).sum(),
                };
                self.standing
                    .mine
                    .backend_fields(&b.name, load, t_ms, &mut current);
                current.push((
                    sums::field(Kind::Class, &[&b.name, &shared.args.class]),
                    i64::from(load.count),
                ));
            }
            let (mode, fields) = self.standing.statement(current);
            let samples = (!self.pending.is_empty())
                .then(|| serde_json::to_string(&self.pending).unwrap_or_default());
            let out = Outgoing {
                replica: &self.id,
                incarnation: &self.incarnation,
                now_ms: t_ms,
                lease_ms,
                mode,
                fields: &fields,
                samples,
                routed: None,
                cursor: self.cursor.as_deref(),
                health: &[],
                list_peers: false,
                retire: &self.standing.expired,
            };
            let sent = Instant::now();
            let Ok(incoming) =
                round::round_trip(&mut conn, &shared.keys, &shared.script, &out).await
            else {
                if measuring {
                    self.stats.failed += 1;
                }
                continue;
            };
            if measuring {
                self.stats.rounds += 1;
                self.stats
                    .latencies
                    .push(sent.elapsed().as_secs_f32() * 1000.0);
                self.stats.shared += self.pending.len() as u64;
            }
            self.pending.clear();
            self.cursor = incoming
                .samples
                .last()
                .map(|e| e.id.clone())
                .or(self.cursor.take())
                .or_else(|| Some("0-0".to_owned()));
            self.standing.answered(mode, &fields, incoming.sums, now);
        }
        self.stats.held = self
            .backends
            .iter()
            .map(|b| (b.name.clone(), b.requests.len() as u64))
            .collect();
        if !shared.args.vanish {
            let now_ms = Clock::read().wall(Instant::now());
            let _ = round::leave(
                &mut conn,
                &shared.keys,
                &shared.script,
                &self.id,
                &self.incarnation,
                now_ms,
            )
            .await;
        }
        self.stats
    }

    /// Moves the synthetic traffic on to `t` seconds: arrivals, first tokens and ends (none
    /// while holding), each first token and end a sample.
    fn advance(&mut self, t: f64, holding: bool, shared: &Shared, clock: &Clock, measuring: bool) {
        let dt = (t - self.last).max(0.0);
        self.last = t;
        for b in &mut self.backends {
            b.area += b.requests.len() as f64 * dt;
        }
        if holding {
            return;
        }
        let args = &shared.args;
        while self.next_arrival <= t {
            let start = self.next_arrival;
            let length = exponential(args.mean_s);
            let i = rand::random_range(0..self.backends.len());
            self.backends[i].requests.push(Synthetic {
                start,
                first: start + length / 10.0,
                end: start + length,
                first_seen: false,
            });
            self.next_arrival += exponential(1.0 / args.rate.max(1e-9));
        }
        let wall = clock.wall(clock.now());
        let mut learned: Vec<(usize, SampleBody)> = Vec::new();
        for (i, b) in self.backends.iter_mut().enumerate() {
            let count = b.requests.len() as f64;
            for r in &mut b.requests {
                if !r.first_seen && r.first <= t {
                    r.first_seen = true;
                    learned.push((
                        i,
                        SampleBody::FirstToken {
                            ttft: r.first - r.start,
                            prompt: Some(500),
                            admitted_with: count,
                            queued: 0,
                        },
                    ));
                }
            }
            b.requests.retain(|r| {
                if r.end > t {
                    return true;
                }
                learned.push((
                    i,
                    SampleBody::Ended {
                        outcome: Outcome::Completed,
                        ttft: Some(r.first - r.start),
                        tpot: Some((r.end - r.first) / 200.0),
                        tokens: 200,
                        estimated: false,
                        prompt: Some(500),
                        concurrency: Some(count),
                        neighbours: 0.0,
                    },
                ));
                false
            });
        }
        for (i, body) in learned {
            let backend = &self.backends[i].name;
            if measuring {
                self.stats.taken += 1;
            }
            if self.standing.sample_taken(backend, &args.model) {
                self.pending.push(SharedSample {
                    backend: backend.clone(),
                    model: args.model.clone(),
                    wall_ms: wall,
                    body,
                });
            }
        }
    }
}
