//! One round trip of the cluster protocol, in one pipeline: state this replica's part of the
//! sums and read them back ([`sums::SCRIPT`]); append the samples it learned and read the
//! others'; note health and read the notes; now and then list the peers. A replica and the
//! scale harness's emulated replicas (`tpsgate replicas`) speak it through this one function.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};

use tokio::time::Instant;

use super::RedisKeys;
use super::sums::{self, Kind, Mine, Mode, Totals};
use super::thin::Thinning;

/// The stream keeps about this many entries (each holds one round's samples of one replica).
const STREAM_ENTRIES: usize = 4096;
/// A round reads at most this many entries of the stream.
const READ_ENTRIES: usize = 512;
/// A replica's first round reads this many of the newest entries: enough to start warm, and
/// cheap enough that a thousand replicas starting at once do not stall Redis.
const FIRST_ENTRIES: usize = 256;
/// A round names at most this many replicas whose leases ran out.
const EXPIRED_PER_ROUND: usize = 8;
/// The admin plane lists at most this many peers.
const LISTED_PEERS: isize = 64;

/// What a round sends.
#[derive(Debug)]
pub(super) struct Outgoing<'a> {
    /// This replica's id, and its process's incarnation.
    pub(super) replica: &'a str,
    /// See `replica`.
    pub(super) incarnation: &'a str,
    /// Now, Unix ms.
    pub(super) now_ms: u64,
    /// How long the part holds without a round, ms.
    pub(super) lease_ms: u64,
    /// How the part is stated.
    pub(super) mode: Mode,
    /// The fields stated.
    pub(super) fields: &'a [(String, i64)],
    /// The samples to append, JSON, and the prompts routed (see [`super::wire::RoutedPrompt`]).
    pub(super) samples: Option<String>,
    /// See `samples`.
    pub(super) routed: Option<String>,
    /// Where reading the sample stream goes on; `None`: the recent samples, newest first.
    pub(super) cursor: Option<&'a str>,
    /// Health notes to write, JSON per backend name.
    pub(super) health: &'a [(String, String)],
    /// Whether to list the peers.
    pub(super) list_peers: bool,
    /// Replicas whose leases ran out, to take out of the sums first.
    pub(super) retire: &'a [String],
}

/// The sums' part of an answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SumsReply {
    /// This replica's part was gone: state it whole.
    Resend,
    /// Stated (or the lease renewed); the sums as read after it.
    Read {
        /// Replicas holding a lease.
        replicas: u64,
        /// The sums.
        sums: HashMap<String, i64>,
        /// Replicas whose leases ran out.
        expired: Vec<String>,
    },
}

/// What a round brought back.
#[derive(Debug)]
pub(super) struct Incoming {
    /// The sums.
    pub(super) sums: SumsReply,
    /// New stream entries, oldest first.
    pub(super) samples: Vec<StreamId>,
    /// Every health note, JSON per backend name.
    pub(super) health: HashMap<String, String>,
    /// The peers' ids and the ends of their leases (Unix ms), when asked for.
    pub(super) leases: Option<Vec<(String, f64)>>,
}

/// The script, as Redis knows it by its hash.
pub(super) fn script() -> redis::Script {
    redis::Script::new(sums::SCRIPT)
}

/// Whose part a call of the script is about, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Part<'a> {
    /// The replica's id.
    pub(super) replica: &'a str,
    /// Its process's incarnation.
    pub(super) incarnation: &'a str,
    /// Now, Unix ms.
    pub(super) now_ms: u64,
    /// How long the part holds without a round, ms.
    pub(super) lease_ms: u64,
}

/// Adds a call of the script on `part` in `mode` to `pipe` (fields, if any, are appended by
/// the caller).
fn invoke<'p>(
    pipe: &'p mut redis::Pipeline,
    script: &redis::Script,
    keys: &RedisKeys,
    part: Part<'_>,
    mode: Mode,
) -> &'p mut redis::Pipeline {
    pipe.cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(3)
        .arg(&keys.sums)
        .arg(&keys.leases)
        .arg(keys.part(part.replica))
        .arg(part.replica)
        .arg(part.incarnation)
        .arg(part.now_ms)
        .arg(part.lease_ms)
        .arg(mode.arg())
}

/// `replica` leaves: its part is taken out of the sums at once (the peers stop counting its
/// load now rather than when its lease runs out).
pub(super) async fn leave<C: ConnectionLike>(
    conn: &mut C,
    keys: &RedisKeys,
    script: &redis::Script,
    replica: &str,
    incarnation: &str,
    now_ms: u64,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    let part = Part {
        replica,
        incarnation,
        now_ms,
        lease_ms: 0,
    };
    invoke(&mut pipe, script, keys, part, Mode::Leave);
    pipe.query_async::<redis::Value>(conn).await.map(drop)
}

/// A claim as the script takes it: this replica's fields that changed (the backend's, its
/// request among them), stated only if the sum of `field` then stays within `limit`.
#[derive(Debug)]
pub(super) struct Condition<'a> {
    /// The fields stated.
    pub(super) fields: &'a [(String, i64)],
    /// The in-flight field of the backend claimed.
    pub(super) field: &'a str,
    /// The most the fleet may have there.
    pub(super) limit: u32,
}

/// The script's answer to one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimReply {
    /// Stated.
    Granted,
    /// Not stated: the fleet has the limit there already.
    Refused,
    /// This replica's part was gone: nothing stated, state it whole.
    Resend,
}

/// Claims, each stated on its condition in the order given, then the sums read after them, in
/// one pipeline over `conn`.
pub(super) async fn claim<C: ConnectionLike>(
    conn: &mut C,
    keys: &RedisKeys,
    script: &redis::Script,
    part: Part<'_>,
    claims: &[Condition<'_>],
) -> redis::RedisResult<(Vec<ClaimReply>, HashMap<String, i64>)> {
    let mut pipe = redis::pipe();
    for claim in claims {
        invoke(&mut pipe, script, keys, part, Mode::Claim)
            .arg(claim.field)
            .arg(claim.limit);
        for (field, value) in claim.fields {
            pipe.arg(field).arg(*value);
        }
    }
    pipe.cmd("HGETALL").arg(&keys.sums);
    let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let sums: HashMap<String, i64> = match replies.pop() {
        Some(v) => redis::from_redis_value(v)?,
        None => HashMap::new(),
    };
    let answers = replies
        .into_iter()
        .map(|v| {
            let said: Vec<String> = redis::from_redis_value(v)?;
            Ok(match said.first().map(String::as_str) {
                None => ClaimReply::Granted,
                Some("refused") => ClaimReply::Refused,
                Some(_) => ClaimReply::Resend,
            })
        })
        .collect::<redis::RedisResult<Vec<_>>>()?;
    Ok((answers, sums))
}

/// One round trip over `conn`. The script must have been loaded (`SCRIPT LOAD`): after an
/// error, load it again before the next round (Redis may have restarted).
pub(super) async fn round_trip<C: ConnectionLike>(
    conn: &mut C,
    keys: &RedisKeys,
    script: &redis::Script,
    out: &Outgoing<'_>,
) -> redis::RedisResult<Incoming> {
    let mut pipe = redis::pipe();
    state(&mut pipe, keys, script, out);
    read_sums_and_samples(&mut pipe, keys, out);
    note_health(&mut pipe, keys, out);
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    incoming(replies, out)
}

/// The round's statement: the parts of replicas whose lease ran out taken out, and this
/// replica's part stated (or only its lease renewed, when nothing changed).
fn state(pipe: &mut redis::Pipeline, keys: &RedisKeys, script: &redis::Script, out: &Outgoing<'_>) {
    for gone in out.retire {
        let part = Part {
            replica: gone,
            incarnation: "",
            now_ms: out.now_ms,
            lease_ms: out.lease_ms,
        };
        invoke(pipe, script, keys, part, Mode::Retire).ignore();
    }
    // Nothing to state (most rounds of a replica with little traffic): the lease alone is
    // renewed, and only if it is still there (else the part was taken out: state it whole).
    let renew_only = out.mode == Mode::Changes && out.fields.is_empty();
    if renew_only {
        pipe.cmd("ZADD")
            .arg(&keys.leases)
            .arg("XX")
            .arg("CH")
            .arg(out.now_ms + out.lease_ms)
            .arg(out.replica);
    } else {
        let part = Part {
            replica: out.replica,
            incarnation: out.incarnation,
            now_ms: out.now_ms,
            lease_ms: out.lease_ms,
        };
        invoke(pipe, script, keys, part, out.mode);
        for (field, value) in out.fields {
            pipe.arg(field).arg(*value);
        }
    }
}

/// The fleet's sums and leases read, this replica's samples appended to the stream and the
/// peers' read from the cursor (or the recent ones, on a first round).
fn read_sums_and_samples(pipe: &mut redis::Pipeline, keys: &RedisKeys, out: &Outgoing<'_>) {
    pipe.cmd("ZCARD").arg(&keys.leases);
    pipe.cmd("ZRANGEBYSCORE")
        .arg(&keys.leases)
        .arg("-inf")
        .arg(format!("({}", out.now_ms))
        .arg("LIMIT")
        .arg(0)
        .arg(EXPIRED_PER_ROUND);
    pipe.cmd("HGETALL").arg(&keys.sums);
    if let Some(samples) = &out.samples {
        pipe.cmd("XADD")
            .arg(&keys.samples)
            .arg("MAXLEN")
            .arg("~")
            .arg(STREAM_ENTRIES)
            .arg("*")
            .arg("r")
            .arg(out.replica)
            .arg("s")
            .arg(samples);
        if let Some(routed) = &out.routed {
            pipe.arg("p").arg(routed);
        }
        pipe.ignore();
    }
    match out.cursor {
        None => {
            pipe.cmd("XREVRANGE")
                .arg(&keys.samples)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(FIRST_ENTRIES);
        }
        Some(cursor) => {
            pipe.cmd("XREAD")
                .arg("COUNT")
                .arg(READ_ENTRIES)
                .arg("STREAMS")
                .arg(&keys.samples)
                .arg(cursor);
        }
    }
}

/// This replica's health notes written, everyone's read, and the peers listed when asked.
fn note_health(pipe: &mut redis::Pipeline, keys: &RedisKeys, out: &Outgoing<'_>) {
    for (backend, note) in out.health {
        pipe.cmd("HSET")
            .arg(&keys.health)
            .arg(backend)
            .arg(note)
            .ignore();
    }
    pipe.cmd("HGETALL").arg(&keys.health);
    if out.list_peers {
        pipe.cmd("ZRANGE")
            .arg(&keys.leases)
            .arg(0)
            .arg(LISTED_PEERS)
            .arg("WITHSCORES");
    }
}

/// The round's replies, in the pipeline's order read from the end.
fn incoming(mut replies: Vec<redis::Value>, out: &Outgoing<'_>) -> redis::RedisResult<Incoming> {
    let leases = if out.list_peers {
        replies
            .pop()
            .map(redis::from_redis_value::<Vec<(String, f64)>>)
            .transpose()?
    } else {
        None
    };
    let health = match replies.pop() {
        Some(v) => redis::from_redis_value(v)?,
        None => HashMap::new(),
    };
    let stream = replies.pop().unwrap_or(redis::Value::Nil);
    let sums: HashMap<String, i64> = match replies.pop() {
        Some(v) => redis::from_redis_value(v)?,
        None => HashMap::new(),
    };
    let expired: Vec<String> = match replies.pop() {
        Some(v) => redis::from_redis_value(v)?,
        None => Vec::new(),
    };
    let replicas: u64 = match replies.pop() {
        Some(v) => redis::from_redis_value(v)?,
        None => 0,
    };
    let stated = match replies.pop() {
        // ZADD XX CH: 1 when the lease was there and renewed.
        Some(redis::Value::Int(n)) => n > 0,
        // The script: `{'resend'}` or `{}`.
        Some(v) => redis::from_redis_value::<Vec<String>>(v)?.is_empty(),
        None => false,
    };
    let sums = if stated {
        SumsReply::Read {
            replicas,
            sums,
            expired: expired.into_iter().filter(|id| id != out.replica).collect(),
        }
    } else {
        SumsReply::Resend
    };
    let samples = match (out.cursor, stream) {
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
    Ok(Incoming {
        sums,
        samples,
        health,
        leases,
    })
}

/// What a replica carries from one round to the next: its part as stated, the sums as read,
/// the fleet's sample rates, the samples taken since the last round that got through, and the
/// replicas whose leases ran out. A gateway replica and an emulated one keep it alike.
#[derive(Debug, Default)]
pub(super) struct Standing {
    /// This replica's part of the sums, as stated.
    pub(super) mine: Mine,
    /// The sums as last read.
    pub(super) totals: Totals,
    thinning: Thinning,
    /// Samples taken per counter field since the last round that got through.
    taken: HashMap<String, i64>,
    /// Replicas whose leases ran out, to take out of the sums next round.
    pub(super) expired: Vec<String>,
}

impl Standing {
    /// A sample of `backend` and `model` was taken: counted for the fleet's rate; whether to
    /// share it (all where samples are scarce, a share where the fleet has plenty).
    pub(super) fn sample_taken(&mut self, backend: &str, model: &str) -> bool {
        let counter = sums::field(Kind::Samples, &[backend, model]);
        let share = self.thinning.share(&counter);
        *self.taken.entry(counter).or_default() += 1;
        share >= 1.0 || rand::random::<f64>() < share
    }

    /// What the next round states of `current` (this replica's levels now), with the samples
    /// taken since the last round, and how.
    pub(super) fn statement(&self, mut current: Vec<(String, i64)>) -> (Mode, Vec<(String, i64)>) {
        current.extend(self.taken.iter().map(|(f, n)| (f.clone(), *n)));
        self.mine.statement(current)
    }

    /// Takes in the answer to a statement of `fields` in `mode`, read at `now`; whether the
    /// sums were read (not: the part was gone, and is stated whole next round).
    pub(super) fn answered(
        &mut self,
        mode: Mode,
        fields: &[(String, i64)],
        reply: SumsReply,
        now: Instant,
    ) -> bool {
        match reply {
            SumsReply::Resend => {
                self.mine.lost();
                false
            }
            SumsReply::Read {
                replicas,
                sums,
                expired,
            } => {
                self.expired = expired;
                self.mine.acknowledged(mode, fields);
                self.taken.clear();
                self.totals.replace(replicas, sums);
                for (field, total) in self.totals.counters() {
                    self.thinning.read(field, total, now);
                }
                true
            }
        }
    }
}
