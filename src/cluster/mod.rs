//! Several replicas, one picture: gateway replicas in front of the same backends share, through
//! Redis, what each backend's load, curve and health are, so that every replica routes by the
//! fleet's facts rather than by its own share of them.
//!
//! Each replica, every `sync_interval`, in one pipelined round trip (`round.rs`):
//! - states its own load per backend (in flight, the requests waiting for a first token, per
//!   class, per API key) as its part of the fleet's sums, kept by a script in the hash
//!   `{PREFIX}:sums` (`sums.rs`), and reads the sums back: the peers' load is the sums less its
//!   own part, which each backend's occupancy adds to its own (admission, caps, the queue,
//!   Retry-After, the TTFT bucket and experienced concurrency are then fleet-wide). A round
//!   states only what changed, and a round with nothing to state just renews its lease, so what
//!   Redis does and what a replica reads are O(backends) a round, however many replicas there
//!   are. A replica that dies without a word has its part taken out by whichever replica sees
//!   its lease run out;
//! - appends the curve samples it took since the last round (first tokens, requests' ends) to
//!   the stream `{PREFIX}:samples` and reads the others' from where it left off: every curve
//!   learns from the whole fleet's traffic, and a replica that starts reads the recent samples
//!   back and is warm at once. Where the fleet takes more samples of a backend and model than
//!   a curve needs, each replica shares only its part of a fixed budget (`thin.rs`);
//! - notes an ejection or a 429 cool-down it decided in the hash `{PREFIX}:health`, and applies
//!   every new one it reads there for its period;
//! - then, in a second pipeline, tells each API key's fleet-wide buckets and spend what the
//!   key used here, and takes back this replica's part of what is left (`api_keys.rs`).
//!
//! The request path hands samples to a bounded queue ([`crate::fleet::Outbox`]) and reads only
//! what the last round left in memory; it waits on Redis in one place, a decision near its
//! backend's edge claiming its slot (`router::wait::settle`, answered by `claims.rs` between
//! rounds). With Redis
//! away, slow or partitioned, each replica serves on its own view: the round trip times out,
//! the peers' numbers are dropped after a lease, the connection is made again with backoff,
//! and the next round that gets through resynchronises (the sample stream is read on from where
//! it was left). One log line per transition. Keys carry the prefix in braces, so that on a Redis
//! Cluster they share a hash slot and one pipeline serves them.

mod api_keys;
mod client;
pub(crate) mod emulate;
mod redis_keys;
mod round;
mod status;
mod sums;
mod sync_task;
mod thin;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::config::ClusterConfig;
use crate::fleet::Inbox;
use crate::live::Live;
pub(crate) use redis_keys::RedisKeys;
pub(crate) use status::Status;
use sync_task::SyncTask;

/// A running cluster link: the status, and the task that syncs until stopped.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// What it shows.
    pub status: Arc<Status>,
    /// The sync task.
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts syncing the backends of `live` with the other replicas through the Redis of
/// `config`, until `stop` says so; `inbox` is where the backends' samples arrive.
pub(crate) fn start(
    config: &ClusterConfig,
    live: Arc<ArcSwap<Live>>,
    inbox: Inbox,
    stop: watch::Receiver<bool>,
) -> Result<Cluster, String> {
    let client = client::client(config)?;
    let replica = client::replica_id(config);
    let status = Arc::new(Status::new(config, replica.clone()));
    let task = SyncTask::new(config, replica, live, inbox, Arc::clone(&status));
    let task = tokio::spawn(task.run(client, stop));
    Ok(Cluster { status, task })
}

/// The Redis client of `config`, for what else keeps fleet-wide state there (virtual keys).
pub(crate) fn redis_client(config: &ClusterConfig) -> Result<redis::Client, String> {
    client::client(config)
}

/// How long a replica's part holds without a round: eight intervals, and half a second at
/// least. Also how long the sums last read count as the peers' load while Redis is away.
fn lease(interval: Duration) -> Duration {
    (interval * 8).max(Duration::from_millis(500))
}
