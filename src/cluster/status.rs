//! What the admin plane (`/admin/cluster`) and the metrics show of the cluster link.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::config::{ClusterConfig, without_password};

/// What the admin plane and the metrics show of the cluster.
#[derive(Debug)]
pub(crate) struct Status {
    replica: String,
    pub(super) redis: String,
    key_prefix: String,
    sync_interval: Duration,
    pub(super) connected: AtomicBool,
    pub(super) sent: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) thinned: AtomicU64,
    pub(super) view: Mutex<View>,
}

/// What the last rounds saw, as the sync task leaves it.
#[derive(Debug, Default)]
pub(super) struct View {
    /// Replicas holding a lease, this one included (0: not known yet).
    pub(super) replicas: u64,
    pub(super) peers: Vec<PeerInfo>,
    pub(super) last_sync: Option<Instant>,
    pub(super) last_round: Option<Duration>,
    pub(super) last_error: Option<String>,
}

/// A peer, as `/admin/cluster` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PeerInfo {
    /// Its replica id.
    pub replica: String,
    /// Seconds since its last round got through.
    pub age_s: f64,
}

/// `/admin/cluster`.
#[derive(Debug, Serialize)]
pub(crate) struct StatusReport {
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
    /// How long that round trip took, ms.
    pub last_round_ms: Option<f64>,
    /// Why the last one failed, when it did.
    pub last_error: Option<String>,
    /// Replicas holding a lease, this one included.
    pub replicas: u64,
    /// The live peers (the first 64 by id).
    pub peers: Vec<PeerInfo>,
    /// Samples sent to and received from the peers since start.
    pub samples_sent: u64,
    /// See `samples_sent`.
    pub samples_received: u64,
    /// Samples kept to this replica because the fleet already shares enough of their backend
    /// and model.
    pub samples_thinned: u64,
}

impl Status {
    /// Nothing synced yet, for the replica `replica` of `config`'s cluster.
    pub(super) fn new(config: &ClusterConfig, replica: String) -> Self {
        Self {
            replica,
            redis: without_password(config.redis_url.expose()),
            key_prefix: config.key_prefix.clone(),
            sync_interval: config.sync_interval,
            connected: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            thinned: AtomicU64::new(0),
            view: Mutex::new(View::default()),
        }
    }

    /// What `/admin/cluster` answers.
    pub(crate) fn report(&self) -> StatusReport {
        let view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        StatusReport {
            replica: self.replica.clone(),
            redis: self.redis.clone(),
            key_prefix: self.key_prefix.clone(),
            sync_interval_ms: self.sync_interval.as_millis(),
            connected: self.connected.load(Ordering::Relaxed),
            last_sync_age_s: view.last_sync.map(|t| t.elapsed().as_secs_f64()),
            last_round_ms: view.last_round.map(|d| d.as_secs_f64() * 1000.0),
            last_error: view.last_error.clone(),
            replicas: view.replicas,
            peers: view.peers.clone(),
            samples_sent: self.sent.load(Ordering::Relaxed),
            samples_received: self.received.load(Ordering::Relaxed),
            samples_thinned: self.thinned.load(Ordering::Relaxed),
        }
    }

    /// Whether the last round trip got through.
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }
}
