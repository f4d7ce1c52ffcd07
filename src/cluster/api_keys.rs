//! API keys' limits across the fleet (`crate::tenant`): each key's per-minute buckets and its
//! spend per period live in Redis. Every round, after the shared picture's round trip, each
//! replica tells the fleet what its keys used since the last round, in one pipeline, and takes
//! back the fleet's level of each bucket, of which it may use its `1 / R` part until the next
//! round (R: the replicas publishing, itself included), refilled at its part of the rate. The
//! request path never waits on Redis: it draws from that part in memory.
//!
//! The fleet's buckets are token buckets kept by a script, on Redis's clock (`TIME`), so that
//! replicas' clocks do not matter. Requests in flight per key ride each replica's occupancy
//! publication and leave with a replica that stops publishing.
//!
//! Bounds: the replicas together admit no more than the fleet's bucket held at the last round
//! plus its refill, so a key goes over its requests limit only by requests settled twice when
//! a round failed after Redis applied it (its usage is sent again, erring on the side of
//! refusing), and over its tokens limit by its requests in flight using more than their
//! estimates, and by chance where a part is below one request (see
//! [`Bucket::wait_for`](crate::tenant::Bucket::wait_for)): on average, not at all. The price of
//! the parts: a key sending through one replica of R takes `1 / R` of what is left of its
//! bucket per round, so a burst of its whole limit arrives over a few rounds (half of it at
//! once of two replicas, a fifth per second of a hundred at the default 50 ms), and before a
//! replica's first round its keys count on it alone.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::config::BudgetPeriod;
use crate::tenant::{Delta, FleetView, Tenant, Verdict, VerdictCounts};

/// A key's fleet-wide token bucket: refilled to `now` on Redis's clock, what a replica used
/// (ARGV[2], negative where settling gave back) taken out, the level returned.
const BUCKET: &str = r"
local cap = tonumber(ARGV[1])
local used = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(b[1]) or cap
local at = tonumber(b[2]) or now
if now > at then
  level = math.min(cap, level + (now - at) * cap / 60000)
  at = now
end
level = math.min(cap, level - used)
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(at))
redis.call('PEXPIRE', KEYS[1], 180000)
return tostring(level)
";

/// What one key sends in a round, and which replies are its.
struct Planned<'a> {
    tenant: &'a Tenant,
    delta: Delta,
    requests: bool,
    tokens: bool,
    spend: bool,
}

/// One round for every key with a per-minute limit or a budget, shared by `replicas`; every
/// key learns the peers' requests in flight (`peers_in_flight`, by name). On an error, what
/// was not told is kept for the next round.
pub(super) async fn sync(
    conn: &mut ConnectionManager,
    prefix: &str,
    tenants: &[Arc<Tenant>],
    replicas: usize,
    peers_in_flight: impl Fn(&str) -> u64,
) -> redis::RedisResult<()> {
    let now = Instant::now();
    let unix_s = crate::tenant::unix_now();
    let mut pipe = redis::pipe();
    let mut planned = Vec::new();
    for tenant in tenants.iter() {
        let limits = tenant.limits();
        let (requests, tokens, spend) = (
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.budget.is_some(),
        );
        if requests.is_none() && tokens.is_none() && !spend {
            tenant.share_fleet(
                FleetView {
                    replicas,
                    peers_in_flight: peers_in_flight(tenant.name()),
                    ..FleetView::default()
                },
                now,
            );
            continue;
        }
        let delta = tenant.take_delta();
        let key = |kind: &str| format!("{{{prefix}}}:key:{}:{kind}", tenant.name());
        for (limit, used, kind) in [
            (requests, delta.requests, "requests"),
            (tokens, delta.tokens, "tokens"),
        ] {
            if let Some(per_minute) = limit {
                pipe.cmd("EVAL")
                    .arg(BUCKET)
                    .arg(1)
                    .arg(key(kind))
                    .arg(per_minute)
                    .arg(used);
            }
        }
        if spend {
            let (period, n) = tenant.period(unix_s);
            let spend_key = key(&format!("spend:{}:{n}", period_name(period)));
            pipe.cmd("INCRBYFLOAT").arg(&spend_key).arg(delta.usd);
            // Kept a little over a month: long enough for any period, then gone.
            pipe.cmd("EXPIRE").arg(&spend_key).arg(32 * 86_400).ignore();
        }
        planned.push(Planned {
            tenant,
            delta,
            requests: requests.is_some(),
            tokens: tokens.is_some(),
            spend,
        });
    }
    if planned.is_empty() {
        return Ok(());
    }
    let replies: Vec<String> = match pipe.query_async(conn).await {
        Ok(replies) => replies,
        Err(e) => {
            for p in &planned {
                p.tenant.untake(p.delta);
            }
            return Err(e);
        }
    };
    let mut replies = replies.iter().map(|r| r.parse::<f64>().ok());
    for p in planned {
        let mut next = |wanted: bool| {
            if wanted {
                replies.next().flatten()
            } else {
                None
            }
        };
        let view = FleetView {
            requests: next(p.requests),
            tokens: next(p.tokens),
            spent_usd: next(p.spend),
            replicas,
            peers_in_flight: peers_in_flight(p.tenant.name()),
        };
        p.tenant.share_fleet(view, now);
    }
    Ok(())
}

fn period_name(period: BudgetPeriod) -> &'static str {
    match period {
        BudgetPeriod::Hour => "hour",
        BudgetPeriod::Day => "day",
        BudgetPeriod::Month => "month",
    }
}

/// Each key's verdicts against its classes' SLOs across the fleet: every round, what this
/// replica judged since the last goes into the key's hash in Redis (fields `CLASS/VERDICT`,
/// `CLASS/tokens` and `CLASS/usd`), and the fleet's counts come back, one `HGETALL` per key. On an
/// error, or a round given up unanswered, what was taken is kept for the next round (sent
/// twice where Redis had applied it, as the limits' usage is).
pub(super) async fn sync_attainment(
    conn: &mut ConnectionManager,
    prefix: &str,
    tenants: &[Arc<Tenant>],
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    let mut taken: Vec<Taken<'_>> = Vec::new();
    for tenant in tenants.iter() {
        let key = format!("{{{prefix}}}:key:{}:slo", tenant.name());
        let unsent = tenant.attainment().take_unsent();
        for (class, counts) in &unsent {
            let labels = Verdict::ALL.iter().map(|v| v.label()).chain(["tokens"]);
            let values = counts.verdicts.iter().chain([&counts.tokens]);
            for (label, n) in labels.zip(values).filter(|(_, n)| **n > 0) {
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg(format!("{class}/{label}"))
                    .arg(*n)
                    .ignore();
            }
            if counts.usd > 0.0 {
                pipe.cmd("HINCRBYFLOAT")
                    .arg(&key)
                    .arg(format!("{class}/usd"))
                    .arg(counts.usd)
                    .ignore();
            }
        }
        if !unsent.is_empty() {
            pipe.cmd("EXPIRE").arg(&key).arg(32 * 86_400).ignore();
        }
        pipe.cmd("HGETALL").arg(&key);
        taken.push(Taken {
            tenant,
            unsent: Some(unsent),
        });
    }
    if taken.is_empty() {
        return Ok(());
    }
    let replies: Vec<std::collections::HashMap<String, String>> = pipe.query_async(conn).await?;
    for (mut t, fields) in taken.into_iter().zip(replies) {
        t.unsent = None;
        t.tenant.attainment().set_fleet(fleet_counts(&fields));
    }
    Ok(())
}

/// One key's verdicts taken for a round: given back unless the round got through, also when
/// the round is dropped on its time limit.
struct Taken<'a> {
    tenant: &'a Tenant,
    unsent: Option<Vec<(std::sync::Arc<str>, VerdictCounts)>>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(unsent) = self.unsent.take() {
            self.tenant.attainment().untake(unsent);
        }
    }
}

/// A key's hash read back: counts per class, by verdict (fields this build does not know are
/// skipped).
fn fleet_counts(
    fields: &std::collections::HashMap<String, String>,
) -> Vec<(String, VerdictCounts)> {
    let mut out: Vec<(String, VerdictCounts)> = Vec::new();
    for (field, value) in fields {
        let Some((class, label)) = field.rsplit_once('/') else {
            continue;
        };
        let i = match out.iter().position(|(c, _)| c == class) {
            Some(i) => i,
            None => {
                out.push((class.to_owned(), VerdictCounts::default()));
                out.len() - 1
            }
        };
        let counts = &mut out[i].1;
        match (Verdict::ALL.iter().position(|v| v.label() == label), label) {
            (Some(v), _) => counts.verdicts[v] = value.parse().unwrap_or(0),
            (None, "tokens") => counts.tokens = value.parse().unwrap_or(0),
            (None, "usd") => counts.usd = value.parse().unwrap_or(0.0),
            _ => {}
        }
    }
    out
}
