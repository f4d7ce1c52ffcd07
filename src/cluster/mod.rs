//! Several replicas, one picture: gateway replicas in front of the same backends share, through
//! Redis, what each backend's load, curve and health are, so that every replica routes by the
//! fleet's facts rather than by its own share of them.
//!
//! Each replica, every `sync_interval`, in one pipelined round trip:
//! - publishes its own load per backend (in flight, the running in-flight integral, the
//!   requests waiting for a first token, per class) into the hash `{PREFIX}:occupancy` under its
//!   replica id, and reads every replica's: [`peers::Peers`] turns them into the peers' load that
//!   each backend's occupancy adds to its own (admission, caps, the queue, Retry-After, the TTFT
//!   bucket and experienced concurrency are then fleet-wide);
//! - appends the curve samples it took since the last round (first tokens, requests' ends) to
//!   the stream `{PREFIX}:samples` and reads the others' from where it left off: every curve
//!   learns from the whole fleet's traffic, and a replica that starts reads the recent samples
//!   back and is warm at once;
//! - notes an ejection or a 429 cool-down it decided in the hash `{PREFIX}:health`, and applies
//!   every new one it reads there for its period;
//! - then, in a second pipeline, tells each API key's fleet-wide buckets and spend what the
//!   key used here, and takes back this replica's part of what is left ([`keys`]).
//!
//! The request path never waits on Redis: it hands samples to a bounded queue
//! ([`crate::fleet::Outbox`]) and reads only what the last round left in memory. With Redis
//! away, slow or partitioned, each replica serves on its own view: the round trip times out,
//! the peers' numbers expire after a few intervals, the connection is made again with backoff,
//! and the next round that gets through resynchronises (the sample stream is read on from where
//! it was left). One log line per transition. Keys carry the prefix in braces, so that on a Redis
//! Cluster they share a hash slot and one pipeline serves them.

mod keys;
pub mod peers;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::ConnectionManager;
use redis::streams::{StreamRangeReply, StreamReadReply};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{ClusterConfig, without_password};
use crate::fleet::{Event, Inbox};
use crate::live::Live;
use peers::{PeerInfo, Peers};
use wire::{BackendLoad, Clock, HealthNote, Routed, Sample, Snapshot};

/// The stream keeps about this many entries (each holds one round's samples of one replica).
const STREAM_ENTRIES: usize = 4096;
/// A round reads at most this many entries of the stream.
const READ_ENTRIES: usize = 512;
/// Samples kept for the next round while Redis is away; older ones are dropped first.
const PENDING_SAMPLES: usize = 64 * 1024;
/// A publication unchanged for this long belongs to a replica that is gone without saying so
/// (a crash): any replica removes it from the store.
const GONE_AFTER: Duration = Duration::from_secs(60);

/// What the admin plane and the metrics show of the cluster.
#[derive(Debug)]
pub struct Status {
    replica: String,
    redis: String,
    key_prefix: String,
    sync_interval: Duration,
    connected: AtomicBool,
    sent: AtomicU64,
    received: AtomicU64,
    view: Mutex<View>,
}

#[derive(Debug, Default)]
struct View {
    peers: Vec<PeerInfo>,
    last_sync: Option<Instant>,
    last_error: Option<String>,
}

/// `/admin/cluster`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// This replica's id.
    pub replica: String,
    /// The Redis URL, password removed.
    pub redis: String,
    /// The key prefix.
    pub key_prefix: String,
    /// The sync interval, ms.
    pub sync_interval_ms: u128,
    /// Whether the last round trip got through.
    pub connected: bool,
    /// Seconds since the last round trip that got through.
    pub last_sync_age_s: Option<f64>,
    /// Why the last one failed, when it did.
    pub last_error: Option<String>,
    /// The live peers.
    pub peers: Vec<PeerInfo>,
    /// Samples sent to and received from the peers since start.
    pub samples_sent: u64,
    /// See `samples_sent`.
    pub samples_received: u64,
}

impl Status {
    /// What `/admin/cluster` answers.
    pub fn report(&self) -> StatusReport {
        let view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        StatusReport {
            replica: self.replica.clone(),
            redis: self.redis.clone(),
            key_prefix: self.key_prefix.clone(),
            sync_interval_ms: self.sync_interval.as_millis(),
            connected: self.connected.load(Ordering::Relaxed),
            last_sync_age_s: view.last_sync.map(|t| t.elapsed().as_secs_f64()),
            last_error: view.last_error.clone(),
            peers: view.peers.clone(),
            samples_sent: self.sent.load(Ordering::Relaxed),
            samples_received: self.received.load(Ordering::Relaxed),
        }
    }

    /// Whether the last round trip got through.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Live peers.
    pub fn peers(&self) -> usize {
        self.view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .peers
            .len()
    }
}

/// The Redis keys of one fleet.
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
    occupancy: String,
    samples: String,
    health: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            occupancy: format!("{{{prefix}}}:occupancy"),
            samples: format!("{{{prefix}}}:samples"),
            health: format!("{{{prefix}}}:health"),
        }
    }
}

/// A running cluster link: the status, and the task that syncs until stopped.
#[derive(Debug)]
pub struct Cluster {
    /// What it shows.
    pub status: Arc<Status>,
    /// The sync task.
    pub task: tokio::task::JoinHandle<()>,
}

/// This replica's id: the configured one, or host name, process id and a random suffix.
fn replica_id(config: &ClusterConfig) -> String {
    if let Some(id) = &config.replica_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tpsgate".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// The Redis client for `config` (nothing is connected yet).
fn client(config: &ClusterConfig) -> Result<redis::Client, String> {
    use redis::IntoConnectionInfo as _;
    let url = config.redis_url.expose();
    let shown = without_password(url);
    let mut info = url
        .into_connection_info()
        .map_err(|e| format!("cluster.redis_url `{shown}`: {e}"))?;
    if let Some(password) = &config.password {
        let settings = info
            .redis_settings()
            .clone()
            .set_password(password.expose());
        info = info.set_redis_settings(settings);
    }
    match &config.ca_file {
        None => redis::Client::open(info).map_err(|e| format!("cluster.redis_url `{shown}`: {e}")),
        Some(ca) => {
            let root =
                std::fs::read(ca).map_err(|e| format!("cluster.ca_file {}: {e}", ca.display()))?;
            redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            )
            .map_err(|e| format!("cluster.ca_file {}: {e}", ca.display()))
        }
    }
}

/// Starts syncing the backends of `live` with the other replicas through the Redis of
/// `config`, until `stop` says so; `inbox` is where the backends' samples arrive.
pub fn start(
    config: &ClusterConfig,
    live: Arc<ArcSwap<Live>>,
    inbox: Inbox,
    stop: watch::Receiver<bool>,
) -> Result<Cluster, String> {
    let client = client(config)?;
    let replica = replica_id(config);
    let status = Arc::new(Status {
        replica: replica.clone(),
        redis: without_password(config.redis_url.expose()),
        key_prefix: config.key_prefix.clone(),
        sync_interval: config.sync_interval,
        connected: AtomicBool::new(false),
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        view: Mutex::new(View::default()),
    });
    let sync = Sync {
        // A peer unseen for eight intervals (half a second at least) has stopped.
        peers: Peers::new(
            replica.clone(),
            (config.sync_interval * 8).max(Duration::from_millis(500)),
        ),
        replica,
        keys: Keys::new(&config.key_prefix),
        interval: config.sync_interval,
        live,
        inbox,
        status: Arc::clone(&status),
        seq: 0,
        cursor: None,
        pending: Vec::new(),
        routed: Vec::new(),
        dropped: 0,
        health_out: HashMap::new(),
        health_seen: HashMap::new(),
        stale: HashMap::new(),
        gone: Vec::new(),
    };
    let task = tokio::spawn(sync.run(client, stop));
    Ok(Cluster { status, task })
}

/// The sync task's state.
struct Sync {
    replica: String,
    keys: Keys,
    interval: Duration,
    live: Arc<ArcSwap<Live>>,
    inbox: Inbox,
    status: Arc<Status>,
    peers: Peers,
    /// This replica's publication count.
    seq: u64,
    /// Where reading the sample stream goes on; `None` until the recent samples were loaded.
    cursor: Option<String>,
    /// Samples not yet sent (Redis away), oldest first.
    pending: Vec<Sample>,
    /// Prompts routed since the last round that went through, for the peers' prefix indexes.
    routed: Vec<Routed>,
    /// Samples the outbox had dropped as of the last look.
    dropped: u64,
    /// Health notes not yet sent, per backend.
    health_out: HashMap<String, HealthNote>,
    /// The last note read per backend, applied once.
    health_seen: HashMap<String, HealthNote>,
    /// Publications and since when they have not changed, for removing long-gone replicas.
    stale: HashMap<String, (u64, Instant)>,
    /// Long-gone replicas to remove from the store in the next round.
    gone: Vec<String>,
}

/// What one round trip brought back.
struct Round {
    occupancy: HashMap<String, String>,
    samples: Vec<redis::streams::StreamId>,
    health: HashMap<String, String>,
}

impl Sync {
    async fn run(mut self, client: redis::Client, mut stop: watch::Receiver<bool>) {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.round_timeout()))
            .set_response_timeout(Some(self.round_timeout()))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(5));
        let mut conn: Option<ConnectionManager> = None;
        let mut next_connect = Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut every = tokio::time::interval(self.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            if conn.is_none() && Instant::now() >= next_connect {
                let made = tokio::time::timeout(
                    self.round_timeout(),
                    ConnectionManager::new_with_config(client.clone(), config.clone()),
                )
                .await;
                match made {
                    Ok(Ok(c)) => {
                        conn = Some(c);
                        backoff = Duration::from_millis(100);
                    }
                    Ok(Err(e)) => self.failed(&e.to_string()),
                    Err(_) => self.failed("connecting timed out"),
                }
                if conn.is_none() {
                    next_connect = Instant::now() + backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            self.collect();
            if let Some(c) = conn.as_mut() {
                let clock = Clock::read();
                match tokio::time::timeout(self.round_timeout(), self.round_trip(c, &clock)).await {
                    Ok(Ok(round)) => {
                        self.apply(round, &clock);
                        self.sync_keys(c).await;
                    }
                    Ok(Err(e)) => self.failed(&e.to_string()),
                    Err(_) => self.failed("no answer within the round trip's time limit"),
                }
            }
            self.share_peers();
        }
        // Leaving: the peers stop counting this replica's load at once.
        if let Some(mut c) = conn {
            let _ = tokio::time::timeout(
                self.round_timeout(),
                redis::cmd("HDEL")
                    .arg(&self.keys.occupancy)
                    .arg(&self.replica)
                    .exec_async(&mut c),
            )
            .await;
        }
    }

    /// API keys' limits: what this replica's keys used goes to the fleet's buckets, and each
    /// key takes its part of what is left (see [`keys`]).
    async fn sync_keys(&mut self, conn: &mut ConnectionManager) {
        let live = self.live.load_full();
        let now = Instant::now();
        self.peers.expire(now);
        let replicas = self.peers.len() + 1;
        let peers = &self.peers;
        let synced = tokio::time::timeout(
            self.round_timeout(),
            keys::sync(conn, &self.keys.prefix, &live.tenants, replicas, |name| {
                peers.key_in_flight(name)
            }),
        )
        .await;
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.failed(&e.to_string()),
            Err(_) => self.failed("no answer within the round trip's time limit"),
        }
    }

    /// How long a round trip may take before Redis counts as away: a few intervals, and at
    /// least a quarter of a second.
    fn round_timeout(&self) -> Duration {
        (self.interval * 4).max(Duration::from_millis(250))
    }

    /// Takes what the backends queued: samples to send, health notes to publish.
    fn collect(&mut self) {
        let dropped = self.inbox.dropped();
        if dropped > self.dropped {
            crate::telemetry::count_cluster_samples("dropped", dropped - self.dropped);
            self.dropped = dropped;
        }
        let mut events = Vec::new();
        self.inbox.drain(PENDING_SAMPLES, &mut events);
        if events.is_empty() {
            return;
        }
        let clock = Clock::read();
        for event in events {
            match event {
                Event::Learned {
                    backend,
                    model,
                    learned,
                } => self
                    .pending
                    .push(Sample::new(&backend, &model, &learned, &clock)),
                Event::Ejected { backend, until } => {
                    let note = self.health_out.entry(backend.to_string()).or_default();
                    note.ejected_until_ms = note.ejected_until_ms.max(clock.wall(until));
                }
                Event::Cooling { backend, until } => {
                    let note = self.health_out.entry(backend.to_string()).or_default();
                    note.cooling_until_ms = note.cooling_until_ms.max(clock.wall(until));
                }
                Event::Routed {
                    backend,
                    hashes,
                    hint,
                } => self.routed.push(Routed {
                    backend: backend.to_string(),
                    hashes,
                    hint,
                }),
            }
        }
        if self.routed.len() > PENDING_SAMPLES {
            let extra = self.routed.len() - PENDING_SAMPLES;
            self.routed.drain(..extra);
        }
        if self.pending.len() > PENDING_SAMPLES {
            let extra = self.pending.len() - PENDING_SAMPLES;
            self.pending.drain(..extra);
            crate::telemetry::count_cluster_samples("dropped", extra as u64);
        }
    }

    /// This replica's own load on every backend.
    fn snapshot(&mut self, now: Instant) -> Snapshot {
        self.seq += 1;
        let live = self.live.load();
        let classes = live.router.classes();
        let backends = live
            .router
            .backends()
            .iter()
            .map(|b| {
                let own = b.occupancy.local(now);
                let classes = classes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| {
                        let n = b.local_class_in_flight(i);
                        (n > 0).then(|| (c.name.to_string(), n))
                    })
                    .collect();
                let load = BackendLoad {
                    count: own.count,
                    area: own.area,
                    waiting: own.waiting,
                    waiting_age_s: own.waiting_age_s,
                    classes,
                };
                (b.config.name.to_string(), load)
            })
            .collect();
        let keys = live
            .tenants
            .iter()
            .filter(|t| t.in_flight() > 0)
            .map(|t| (t.name().to_string(), t.in_flight()))
            .collect();
        Snapshot {
            seq: self.seq,
            backends,
            keys,
        }
    }

    /// One pipelined round trip: publish, append, read.
    async fn round_trip(
        &mut self,
        conn: &mut ConnectionManager,
        clock: &Clock,
    ) -> redis::RedisResult<Round> {
        let snapshot = serde_json::to_string(&self.snapshot(clock.now())).unwrap_or_default();
        let samples = (!self.pending.is_empty() || !self.routed.is_empty())
            .then(|| serde_json::to_string(&self.pending).unwrap_or_default());
        let routed = (!self.routed.is_empty())
            .then(|| serde_json::to_string(&self.routed).unwrap_or_default());
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(&self.keys.occupancy)
            .arg(&self.replica)
            .arg(snapshot)
            .ignore();
        for id in &self.gone {
            pipe.cmd("HDEL").arg(&self.keys.occupancy).arg(id).ignore();
        }
        pipe.cmd("HGETALL").arg(&self.keys.occupancy);
        if let Some(samples) = &samples {
            pipe.cmd("XADD")
                .arg(&self.keys.samples)
                .arg("MAXLEN")
                .arg("~")
                .arg(STREAM_ENTRIES)
                .arg("*")
                .arg("r")
                .arg(&self.replica)
                .arg("s")
                .arg(samples);
            if let Some(routed) = &routed {
                pipe.arg("p").arg(routed);
            }
            pipe.ignore();
        }
        match &self.cursor {
            // The first round: the recent samples, newest first.
            None => {
                pipe.cmd("XREVRANGE")
                    .arg(&self.keys.samples)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(STREAM_ENTRIES);
            }
            Some(cursor) => {
                pipe.cmd("XREAD")
                    .arg("COUNT")
                    .arg(READ_ENTRIES)
                    .arg("STREAMS")
                    .arg(&self.keys.samples)
                    .arg(cursor);
            }
        }
        for (backend, note) in &self.health_out {
            pipe.cmd("HSET")
                .arg(&self.keys.health)
                .arg(backend)
                .arg(serde_json::to_string(note).unwrap_or_default())
                .ignore();
        }
        pipe.cmd("HGETALL").arg(&self.keys.health);
        let (occupancy, samples_reply, health): (
            HashMap<String, String>,
            redis::Value,
            HashMap<String, String>,
        ) = pipe.query_async(conn).await?;
        let samples = match (&self.cursor, samples_reply) {
            (_, redis::Value::Nil) => Vec::new(),
            (None, reply) => {
                let mut ids = redis::from_redis_value::<StreamRangeReply>(reply)?.ids;
                ids.reverse();
                ids
            }
            (Some(_), reply) => redis::from_redis_value::<StreamReadReply>(reply)?
                .keys
                .into_iter()
                .flat_map(|k| k.ids)
                .collect(),
        };
        // Sent: the round got through.
        self.status
            .sent
            .fetch_add(self.pending.len() as u64, Ordering::Relaxed);
        crate::telemetry::count_cluster_samples("sent", self.pending.len() as u64);
        self.pending.clear();
        self.routed.clear();
        self.health_out.clear();
        self.gone.clear();
        Ok(Round {
            occupancy,
            samples,
            health,
        })
    }

    /// Takes in what a round brought back.
    fn apply(&mut self, round: Round, clock: &Clock) {
        let now = clock.now();
        if !self.status.connected.swap(true, Ordering::Relaxed) {
            tracing::info!(
                redis = %self.status.redis,
                replica = %self.replica,
                "cluster: connected; sharing backend state with the other replicas"
            );
        }
        let published: Vec<(&str, Snapshot)> = round
            .occupancy
            .iter()
            .filter_map(|(id, text)| Some((id.as_str(), serde_json::from_str(text).ok()?)))
            .collect();
        self.gone = self.peers.long_gone(
            now,
            published.iter().map(|(id, s)| (*id, s.seq)),
            &mut self.stale,
            GONE_AFTER,
        );
        self.peers.update(now, published);
        if self.cursor.is_none() {
            // Nothing in the stream yet: read from its beginning from now on.
            self.cursor = Some("0-0".to_owned());
        }
        let live = self.live.load();
        let backends = live.router.backends();
        let mut received = 0u64;
        for entry in round.samples {
            self.cursor = Some(entry.id.clone());
            if entry.get::<String>("r").as_deref() == Some(self.replica.as_str()) {
                continue;
            }
            if let Some(routed) = entry
                .get::<String>("p")
                .and_then(|p| serde_json::from_str::<Vec<Routed>>(&p).ok())
            {
                for r in routed {
                    if let Some(index) = backends
                        .iter()
                        .find(|b| *b.config.name == *r.backend)
                        .and_then(|b| b.prefix.as_ref())
                    {
                        index.learned(&r.hashes, r.hint, now);
                    }
                }
            }
            let Some(samples) = entry
                .get::<String>("s")
                .and_then(|s| serde_json::from_str::<Vec<Sample>>(&s).ok())
            else {
                continue;
            };
            for sample in samples {
                let Some(backend) = backends.iter().find(|b| *b.config.name == *sample.backend)
                else {
                    continue;
                };
                if let Some(learned) = sample.learned(clock) {
                    backend.learn(&sample.model, &learned);
                    received += 1;
                }
            }
        }
        if received > 0 {
            self.status.received.fetch_add(received, Ordering::Relaxed);
            crate::telemetry::count_cluster_samples("received", received);
        }
        for (name, text) in &round.health {
            let Ok(note) = serde_json::from_str::<HealthNote>(text) else {
                continue;
            };
            if self.health_seen.get(name) == Some(&note) {
                continue;
            }
            self.health_seen.insert(name.clone(), note);
            let Some(backend) = backends.iter().find(|b| *b.config.name == **name) else {
                continue;
            };
            if let Some(until) = clock.until(note.ejected_until_ms) {
                backend.ejected_elsewhere(until);
            }
            if let Some(until) = clock.until(note.cooling_until_ms) {
                backend.cooling_elsewhere(until);
            }
        }
        let mut view = self
            .status
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        view.last_sync = Some(now);
        view.last_error = None;
    }

    /// A round (or a connection) failed: serve on this replica's own view (API keys' limits
    /// counted by this replica alone), say so once.
    fn failed(&mut self, error: &str) {
        let now = Instant::now();
        for tenant in self.live.load().tenants.iter() {
            tenant.alone(now);
        }
        if self.status.connected.swap(false, Ordering::Relaxed)
            || self
                .status
                .view
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_error
                .is_none()
        {
            tracing::warn!(
                redis = %self.status.redis,
                %error,
                "cluster: Redis is unreachable; serving on this replica's own view, reconnecting"
            );
        }
        self.status
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error = Some(error.to_owned());
    }

    /// Hands every backend the peers' load (expired peers gone), and updates the status.
    fn share_peers(&mut self) {
        let now = Instant::now();
        self.peers.expire(now);
        let live = self.live.load();
        let classes = live.router.classes();
        for backend in live.router.backends() {
            let name = &*backend.config.name;
            backend.occupancy.set_peers(now, self.peers.load(name, now));
            let by_class: BTreeMap<&str, u32> = self.peers.classes(name);
            backend.set_peer_classes(
                classes
                    .iter()
                    .map(|c| by_class.get(&*c.name).copied().unwrap_or(0)),
            );
        }
        let info = self.peers.info(now);
        crate::telemetry::set_cluster(self.status.connected(), info.len());
        self.status
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .peers = info;
    }
}
