//! The sync task: each interval, one pipelined round trip that states this replica's part,
//! reads the fleet's sums, sends and reads samples and health notes (`round.rs`), and applies
//! what came back to the backends; between rounds, the claims of slots (`claims.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tokio::time::Instant;

use super::redis_keys::RedisKeys;
use super::round::Standing;
use super::status::{PeerInfo, Status};
use super::sums::{self, Kind};
use super::wire::{Clock, HealthNote, RoutedPrompt, SharedSample};
use super::{api_keys, lease, round};
use crate::config::{ClassConfig, ClusterConfig};
use crate::curve::PeerLoad;
use crate::fleet::{Backend, Event, Inbox};
use crate::live::Live;

mod claims;

/// Samples kept for the next round while Redis is away; older ones are dropped first.
const PENDING_SAMPLES: usize = 64 * 1024;
/// The list of peers is read again every this many rounds (and whenever their number changes).
const LIST_EVERY: u64 = 20;

/// The sync task: one round trip to Redis every interval, and the claims between rounds.
pub(super) struct SyncTask {
    replica: String,
    /// Tells this process's part from an earlier process's under the same replica id.
    incarnation: String,
    keys: RedisKeys,
    interval: Duration,
    live: Arc<ArcSwap<Live>>,
    inbox: Inbox,
    status: Arc<Status>,
    script: redis::Script,
    /// Whether the script is known to be loaded on the connection's server.
    loaded: bool,
    rounds: u64,
    /// Its part of the sums, the sums as read, the samples' shares (see [`round::Standing`]).
    standing: Standing,
    /// When the sums were last read (this process's time, Unix ms).
    read_at: Option<(Instant, u64)>,
    /// Per backend: the peers' integral last handed to its occupancy, and the offset that
    /// keeps it continuous across a gap in the readings.
    area: HashMap<String, PeerArea>,
    /// Where reading the sample stream goes on; `None` until the recent samples were loaded.
    cursor: Option<String>,
    /// Samples not yet sent (Redis away), oldest first.
    pending: Vec<SharedSample>,
    /// Prompts routed since the last round that went through, for the peers' prefix indexes.
    routed: Vec<RoutedPrompt>,
    /// Samples the outbox had dropped as of the last look.
    dropped: u64,
    /// Health notes not yet sent, per backend.
    health_out: HashMap<String, HealthNote>,
    /// The last note read per backend, applied once.
    health_seen: HashMap<String, HealthNote>,
    /// When the keys' verdicts were last told to the fleet and read back.
    attainment_at: Option<Instant>,
}

/// How often the keys' verdicts go to the fleet and come back: a view for `/admin/keys`, not
/// an input to any decision, so a second apart is enough (and one `HGETALL` per key a second
/// stays small however many keys there are).
const ATTAINMENT_EVERY: Duration = Duration::from_secs(1);

/// The peers' integral on one backend as handed to its occupancy: only its growth matters, so
/// after a gap (Redis away, the peers' load dropped) it continues from where it stood.
#[derive(Debug, Default, Clone, Copy)]
struct PeerArea {
    given: f64,
    offset: f64,
    /// The next reading starts from `given` (first, or after a gap).
    rebase: bool,
}

impl SyncTask {
    /// The task for replica `replica` of `config`'s cluster, syncing `live`'s backends, the
    /// samples arriving in `inbox`, showing what it sees in `status`.
    pub(super) fn new(
        config: &ClusterConfig,
        replica: String,
        live: Arc<ArcSwap<Live>>,
        inbox: Inbox,
        status: Arc<Status>,
    ) -> Self {
        Self {
            replica,
            incarnation: format!("{:016x}", rand::random::<u64>()),
            keys: RedisKeys::new(&config.key_prefix),
            interval: config.sync_interval,
            live,
            inbox,
            status,
            script: round::script(),
            loaded: false,
            rounds: 0,
            standing: Standing::default(),
            read_at: None,
            area: HashMap::new(),
            cursor: None,
            pending: Vec::new(),
            routed: Vec::new(),
            dropped: 0,
            attainment_at: None,
            health_out: HashMap::new(),
            health_seen: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self, client: redis::Client, mut stop: watch::Receiver<bool>) {
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
            let claim = tokio::select! {
                _ = every.tick() => None,
                _ = stop.wait_for(|s| *s) => break,
                Some(claim) = self.inbox.claims.next() => Some(claim),
            };
            if let Some(claim) = claim {
                self.claims(conn.as_mut(), claim).await;
                continue;
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
                let started = Instant::now();
                let outcome = tokio::time::timeout(self.round_timeout(), self.round(c)).await;
                match outcome {
                    Ok(Ok(())) => {
                        self.status
                            .view
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .last_round = Some(started.elapsed());
                        self.sync_keys(c).await;
                    }
                    // Whether Redis took the statement is not known (a paused or slow Redis
                    // runs it after the answer was given up on): the next one is whole, or a
                    // level it raised and that came back down here would stay in the sums.
                    Ok(Err(e)) => {
                        self.standing.mine.lost();
                        self.failed(&e.to_string());
                    }
                    Err(_) => {
                        self.standing.mine.lost();
                        self.failed("no answer within the round trip's time limit");
                    }
                }
            }
            self.share_peers();
        }
        // Leaving: the peers stop counting this replica's load at once.
        if let Some(mut c) = conn {
            let now_ms = Clock::read().wall(Instant::now());
            let leave = round::leave(
                &mut c,
                &self.keys,
                &self.script,
                &self.replica,
                &self.incarnation,
                now_ms,
            );
            let _ = tokio::time::timeout(self.round_timeout(), leave).await;
        }
    }

    /// API keys' limits: what this replica's keys used goes to the fleet's buckets, and each
    /// key takes its part of what is left (see [`keys`]).
    async fn sync_keys(&mut self, conn: &mut ConnectionManager) {
        let tenants = self.live.load().every_tenant();
        let replicas = usize::try_from(self.standing.totals.replicas.max(1)).unwrap_or(usize::MAX);
        let (totals, mine) = (&self.standing.totals, &self.standing.mine);
        let fresh = self.read_at.is_some();
        let synced = tokio::time::timeout(
            self.round_timeout(),
            api_keys::sync(conn, &self.keys.prefix, &tenants, replicas, |name| {
                if fresh {
                    totals.peer_key(mine, name)
                } else {
                    0
                }
            }),
        )
        .await;
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.failed(&e.to_string()),
            Err(_) => self.failed("no answer within the round trip's time limit"),
        }
        let now = Instant::now();
        if self
            .attainment_at
            .is_some_and(|at| now.saturating_duration_since(at) < ATTAINMENT_EVERY)
        {
            return;
        }
        self.attainment_at = Some(now);
        let attainment = tokio::time::timeout(
            self.round_timeout(),
            api_keys::sync_attainment(conn, &self.keys.prefix, &tenants),
        )
        .await;
        match attainment {
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

    /// Takes what the backends queued: samples to send (thinned where the fleet has plenty),
    /// health notes to publish, prompts routed.
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
        let mut thinned = 0u64;
        for event in events {
            match event {
                Event::Learned {
                    backend,
                    model,
                    learned,
                } => {
                    if self.standing.sample_taken(&backend, &model) {
                        self.pending
                            .push(SharedSample::new(&backend, &model, &learned, &clock));
                    } else {
                        thinned += 1;
                    }
                }
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
                } => self.routed.push(RoutedPrompt {
                    backend: backend.to_string(),
                    hashes,
                    hint,
                }),
            }
        }
        if thinned > 0 {
            self.status.thinned.fetch_add(thinned, Ordering::Relaxed);
            crate::telemetry::count_cluster_samples("thinned", thinned);
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

    /// This replica's own levels on every backend and per API key, and the samples taken since
    /// the last round, as of wall time `t_ms`.
    fn fields(&mut self, now: Instant, t_ms: u64) -> Vec<(String, i64)> {
        let live = self.live.load();
        let classes = live.router.classes();
        let mut out = Vec::new();
        for b in live.router.backends() {
            self.backend_fields(b, classes, now, t_ms, &mut out);
        }
        for t in live.every_tenant() {
            let n = i64::try_from(t.in_flight()).unwrap_or(i64::MAX);
            out.push((sums::field(Kind::Key, &[t.name()]), n));
        }
        out
    }

    /// This replica's own levels on backend `b` (per class of `classes`) as of `t_ms`,
    /// appended to `out`.
    fn backend_fields(
        &mut self,
        b: &Backend,
        classes: &[ClassConfig],
        now: Instant,
        t_ms: u64,
        out: &mut Vec<(String, i64)>,
    ) {
        let name = &*b.config.name;
        let load = b.occupancy.local(now);
        self.standing.mine.backend_fields(name, load, t_ms, out);
        for (i, c) in classes.iter().enumerate() {
            let n = b.local_class_in_flight(i);
            out.push((sums::field(Kind::Class, &[name, &c.name]), i64::from(n)));
        }
    }

    /// One round trip (see [`round`]).
    async fn round(&mut self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        if !self.loaded {
            self.script.load_async(conn).await?;
            self.loaded = true;
        }
        let clock = Clock::read();
        let t_ms = clock.wall(clock.now());
        let current = self.fields(clock.now(), t_ms);
        let (mode, fields) = self.standing.statement(current);
        let samples = (!self.pending.is_empty() || !self.routed.is_empty())
            .then(|| serde_json::to_string(&self.pending).unwrap_or_default());
        let routed = (!self.routed.is_empty())
            .then(|| serde_json::to_string(&self.routed).unwrap_or_default());
        let health: Vec<(String, String)> = self
            .health_out
            .iter()
            .map(|(b, n)| (b.clone(), serde_json::to_string(n).unwrap_or_default()))
            .collect();
        let list_peers = self.rounds.is_multiple_of(LIST_EVERY);
        let out = round::Outgoing {
            replica: &self.replica,
            incarnation: &self.incarnation,
            now_ms: t_ms,
            lease_ms: u64::try_from(lease(self.interval).as_millis()).unwrap_or(u64::MAX),
            mode,
            fields: &fields,
            samples,
            routed,
            cursor: self.cursor.as_deref(),
            health: &health,
            list_peers,
            retire: &self.standing.expired,
        };
        let incoming = match round::round_trip(conn, &self.keys, &self.script, &out).await {
            Ok(incoming) => incoming,
            Err(e) => {
                // Redis may have restarted without the script.
                self.loaded = false;
                return Err(e);
            }
        };
        self.rounds += 1;
        // Sent: the round got through.
        self.status
            .sent
            .fetch_add(self.pending.len() as u64, Ordering::Relaxed);
        crate::telemetry::count_cluster_samples("sent", self.pending.len() as u64);
        self.pending.clear();
        self.routed.clear();
        self.health_out.clear();
        let before = self.standing.totals.replicas;
        if self
            .standing
            .answered(mode, &fields, incoming.sums, clock.now())
        {
            self.read_at = Some((clock.now(), t_ms));
        }
        if before != self.standing.totals.replicas {
            // Their number moved: list them again next round.
            self.rounds = 0;
        }
        self.apply(&incoming.samples, &incoming.health, incoming.leases, &clock);
        Ok(())
    }

    /// Applies what a round read: the peers' samples and routed prompts (`entries`), their
    /// health notes, and the leases (who is alive), at `clock`.
    fn apply(
        &mut self,
        entries: &[redis::streams::StreamId],
        health: &HashMap<String, String>,
        leases: Option<Vec<(String, f64)>>,
        clock: &Clock,
    ) {
        let now = clock.now();
        if !self.status.connected.swap(true, Ordering::Relaxed) {
            tracing::info!(
                redis = %self.status.redis,
                replica = %self.replica,
                "cluster: connected; sharing backend state with the other replicas"
            );
        }
        let live = self.live.load();
        let backends = live.router.backends();
        // Nothing in the stream yet: read from its beginning from now on.
        let read_to = entries
            .last()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        if entries.last().is_some() || self.cursor.is_none() {
            self.cursor = Some(read_to);
        }
        let received = learn_from_peers(entries, &self.replica, backends, clock);
        if received > 0 {
            self.status.received.fetch_add(received, Ordering::Relaxed);
            crate::telemetry::count_cluster_samples("received", received);
        }
        apply_health(health, &mut self.health_seen, backends, clock);
        let mut view = self
            .status
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        view.last_sync = Some(now);
        view.last_error = None;
        view.replicas = self.standing.totals.replicas;
        if let Some(leases) = leases {
            let lease_ms = lease(self.interval).as_secs_f64() * 1000.0;
            view.peers = peers(leases, &self.replica, lease_ms, clock.wall(now) as f64);
        }
    }

    /// A round (or a connection) failed: serve on this replica's own view (API keys' limits
    /// counted by this replica alone), say so once.
    fn failed(&mut self, error: &str) {
        let now = Instant::now();
        for tenant in self.live.load().every_tenant() {
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

    /// Hands every backend the peers' load as of the last reading (none once it is older than
    /// a lease: Redis is away), and updates the status.
    fn share_peers(&mut self) {
        let now = Instant::now();
        let lease = lease(self.interval);
        if self
            .read_at
            .is_some_and(|(at, _)| now.saturating_duration_since(at) > lease)
        {
            self.read_at = None;
            let mut view = self
                .status
                .view
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            view.replicas = 0;
            view.peers.clear();
        }
        let live = self.live.load();
        let classes = live.router.classes();
        for backend in live.router.backends() {
            let name = &*backend.config.name;
            let area = self.area.entry(name.to_owned()).or_insert(PeerArea {
                rebase: true,
                ..PeerArea::default()
            });
            let load = match self.read_at {
                Some((at, t_ms)) => {
                    let since = u64::try_from(now.saturating_duration_since(at).as_millis())
                        .unwrap_or(u64::MAX);
                    let mut load =
                        self.standing
                            .totals
                            .peers(&self.standing.mine, name, t_ms + since);
                    if area.rebase {
                        area.offset = area.given - load.area;
                        area.rebase = false;
                    }
                    load.area += area.offset;
                    area.given = load.area;
                    if backend.occupancy.set_peers(now, load) {
                        // Room freed by a peer: this replica's line looks at once, and a
                        // request taking the room near the edge claims it, so that the lines
                        // of every replica do not all take the same slot.
                        backend.room_grew();
                    }
                    load
                }
                None => {
                    // No picture of the peers: their load stops where it stood.
                    area.rebase = true;
                    let load = PeerLoad {
                        area: area.given,
                        ..PeerLoad::default()
                    };
                    backend.occupancy.set_peers(now, load);
                    load
                }
            };
            let _ = load;
            let fresh = self.read_at.is_some();
            backend.set_peer_classes(classes.iter().map(|c| {
                if fresh {
                    self.standing
                        .totals
                        .peer_class(&self.standing.mine, name, &c.name)
                } else {
                    0
                }
            }));
        }
        let peers =
            usize::try_from(self.standing.totals.replicas.saturating_sub(1)).unwrap_or(usize::MAX);
        let peers = if self.read_at.is_some() { peers } else { 0 };
        self.inbox.claims.set_shared(peers > 0);
        crate::telemetry::set_cluster(self.status.connected(), peers);
    }
}

/// Teaches `backends` what the peers' stream `entries` say (this replica, `me`, skips its own):
/// prompts routed, for the prefix indexes, and curve samples; returns how many samples.
fn learn_from_peers(
    entries: &[redis::streams::StreamId],
    me: &str,
    backends: &[Arc<Backend>],
    clock: &Clock,
) -> u64 {
    let now = clock.now();
    let named = |name: &str| backends.iter().find(|b| *b.config.name == *name);
    let mut received = 0;
    for entry in entries {
        if entry.get::<String>("r").as_deref() == Some(me) {
            continue;
        }
        let routed = entry
            .get::<String>("p")
            .and_then(|p| serde_json::from_str::<Vec<RoutedPrompt>>(&p).ok());
        for r in routed.into_iter().flatten() {
            if let Some(index) = named(&r.backend).and_then(|b| b.prefix.as_ref()) {
                index.learned(&r.hashes, r.hint, now);
            }
        }
        let samples = entry
            .get::<String>("s")
            .and_then(|s| serde_json::from_str::<Vec<SharedSample>>(&s).ok());
        for sample in samples.into_iter().flatten() {
            if let (Some(backend), Some(learned)) = (named(&sample.backend), sample.learned(clock))
            {
                backend.learn(&sample.model, &learned);
                received += 1;
            }
        }
    }
    received
}

/// Applies each health note not `seen` before (a note is applied once: an ejection a peer
/// decided holds here for its period, and no longer).
fn apply_health(
    health: &HashMap<String, String>,
    seen: &mut HashMap<String, HealthNote>,
    backends: &[Arc<Backend>],
    clock: &Clock,
) {
    for (name, text) in health {
        let Ok(note) = serde_json::from_str::<HealthNote>(text) else {
            continue;
        };
        if seen.get(name) == Some(&note) {
            continue;
        }
        seen.insert(name.clone(), note);
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
}

/// The live peers as `/admin/cluster` shows them: every lease but this replica's (`me`), each
/// with the seconds since its last round, from when its lease (of `lease_ms`) runs out and the
/// wall clock `t_ms`.
fn peers(leases: Vec<(String, f64)>, me: &str, lease_ms: f64, t_ms: f64) -> Vec<PeerInfo> {
    leases
        .into_iter()
        .filter(|(id, _)| id != me)
        .map(|(replica, until)| PeerInfo {
            replica,
            age_s: ((lease_ms - (until - t_ms)) / 1000.0).max(0.0),
        })
        .collect()
}

#[cfg(test)]
mod tests;
