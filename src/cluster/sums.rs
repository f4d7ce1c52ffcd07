//! The fleet's load as sums kept in Redis: each replica states its own counts (requests in
//! flight per backend and class, those waiting for a first token, requests per API key) and a
//! server-side script adds the difference from what it stated before into one hash of sums, so
//! that what a replica reads each round is O(backends), however many replicas there are.
//!
//! A replica states absolute values, never increments: the script keeps each replica's last
//! statement (its *part*) and applies the difference, so that a round whose answer was lost can
//! be sent again, and a restart under the same id replaces its part rather than adding to it.
//! Each part has a lease in a sorted set, renewed by every round; any replica's round removes
//! the parts whose lease ran out (a replica killed without a word), so a dead replica's load
//! leaves the sums within a lease plus one round.
//!
//! Integrals do not travel as integrals, which change all the time, but as levels that change
//! only when a request starts or ends: a replica's request-seconds on a backend are
//! `x + n·t` with `n` its requests in flight and `x` the *intercept* (its integral less `n·t`,
//! t in Unix milliseconds), and the ages of its requests waiting for a first token add up to
//! `w·t − y` with `y` the sum of their admission times. The fleet's integral is then the sums'
//! `x + n·t`, read at any moment. A removed part keeps the area it accrued (its `x` becomes
//! `x + n·t` at its lease's end and stays in the sums): the fleet's integral never steps back.
//!
//! Counters that only grow (`q`: curve samples taken per backend and model, what thins the
//! shared samples) are added, not stated.

use std::collections::HashMap;

use crate::curve::{LocalLoad, PeerLoad};

/// Keeps the sums (KEYS[1], a hash), the leases (KEYS[2], a sorted set of replica id by the end
/// of its lease, Unix ms) and one replica's part (KEYS[3], a hash of the fields it stated; `@`:
/// its process's incarnation). ARGV: the replica's id, its incarnation, now (Unix ms), lease
/// (ms), the mode, then field and value pairs. Values are integers
/// (Lua's doubles are exact to 2^53, and every value here stays far below it).
///
/// Modes: `full` replaces the part with the fields given; `changes` states only those (and
/// answers `{'resend'}` when it finds no part: its lease ran out, or Redis lost it); `claim`
/// is `changes` on a condition (ARGV[6] a field, ARGV[7] a limit, the pairs after them): that
/// the field's sum, with this statement, stays within the limit, else nothing is stated and
/// the answer is `{'refused'}` (a slot at a backend's edge, [`crate::fleet::claim`]);
/// `leave` takes the part out; `retire` takes out another replica's part (ARGV[1] its id,
/// KEYS[3] its part) if its lease has indeed run out (each in its own call, so that every key
/// a call touches is named in it, as Redis Cluster requires). The sums are read with a plain
/// `HGETALL` after the call: Lua's copy of them would cost more than the statement.
pub(super) const SCRIPT: &str = r"
local sums, leases, part = KEYS[1], KEYS[2], KEYS[3]
local id, incarnation, now, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local mode = ARGV[5]

local function fmt(n) return string.format('%.0f', n) end

local function add(field, n)
  if n ~= 0 then
    if redis.call('HINCRBY', sums, field, fmt(n)) == 0 then redis.call('HDEL', sums, field) end
  end
end

-- The part leaves the sums: its levels are taken out, its intercepts keep the area accrued by `at`.
local function retire(at)
  local flat = redis.call('HGETALL', part)
  local p = {}
  for i = 1, #flat, 2 do p[flat[i]] = flat[i + 1] end
  for f, v in pairs(p) do
    local kind = string.sub(f, 1, 1)
    if kind == 'x' then
      add(f, tonumber(p['n' .. string.sub(f, 2)] or '0') * at)
    elseif kind ~= '@' then
      add(f, -tonumber(v))
    end
  end
  redis.call('DEL', part)
  redis.call('ZREM', leases, id)
end

if mode == 'retire' then
  local ends = redis.call('ZSCORE', leases, id)
  if ends and tonumber(ends) < now then retire(tonumber(ends)) end
  return {}
end
local stored = redis.call('HGET', part, '@')
if stored and stored ~= incarnation then
  retire(now)
  stored = nil
end
if mode == 'leave' then
  retire(now)
  return {}
end
if not stored and mode ~= 'full' then return {'resend'} end
local first = 6
if mode == 'claim' then
  first = 8
  local f, limit = ARGV[6], tonumber(ARGV[7])
  local had = tonumber(redis.call('HGET', part, f) or '0')
  local now_mine = had
  for i = first, #ARGV, 2 do
    if ARGV[i] == f then now_mine = tonumber(ARGV[i + 1]) end
  end
  local sum = tonumber(redis.call('HGET', sums, f) or '0') - had + now_mine
  if sum > limit then return {'refused'} end
end
if mode == 'full' and stored then
  local stated = {}
  for i = 6, #ARGV, 2 do stated[ARGV[i]] = true end
  local flat = redis.call('HGETALL', part)
  for i = 1, #flat, 2 do
    local f = flat[i]
    if f ~= '@' and not stated[f] then
      add(f, -tonumber(flat[i + 1]))
      redis.call('HDEL', part, f)
    end
  end
end
for i = first, #ARGV, 2 do
  local f, v = ARGV[i], tonumber(ARGV[i + 1])
  if string.sub(f, 1, 1) == 'q' then
    add(f, v)
  else
    add(f, v - tonumber(redis.call('HGET', part, f) or '0'))
    if v == 0 then redis.call('HDEL', part, f) else redis.call('HSET', part, f, fmt(v)) end
  end
end
redis.call('HSET', part, '@', incarnation)
redis.call('ZADD', leases, fmt(now + lease), id)
return {}
";

/// Separates the parts of a field's name (a backend's, class's or key's name never holds it).
const SEP: char = '\u{1f}';

/// The name of a field: a one-letter kind, then the names it is about.
pub(super) fn field(kind: Kind, names: &[&str]) -> String {
    let mut out = String::with_capacity(2 + names.iter().map(|n| n.len() + 1).sum::<usize>());
    out.push(kind.letter());
    for name in names {
        out.push(SEP);
        out.push_str(name);
    }
    out
}

/// What a field counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Requests in flight on a backend.
    InFlight,
    /// A backend's area intercept, request-milliseconds (see the module's comment).
    Intercept,
    /// Requests on a backend still waiting for a first token.
    Waiting,
    /// The sum of their admission times, Unix ms.
    WaitingSince,
    /// Requests in flight on a backend of one class.
    Class,
    /// Requests in flight of one API key.
    Key,
    /// Curve samples taken of a backend and model, ever (added, not stated).
    Samples,
}

impl Kind {
    const fn letter(self) -> char {
        match self {
            Self::InFlight => 'n',
            Self::Intercept => 'x',
            Self::Waiting => 'w',
            Self::WaitingSince => 'y',
            Self::Class => 'c',
            Self::Key => 'k',
            Self::Samples => 'q',
        }
    }

    /// Levels that drift by a few milliseconds between rounds without any request starting or
    /// ending (the wall clock against the monotonic one): stated again only when they moved by
    /// more than [`DRIFT_MS`].
    fn drifts(letter: Option<char>) -> bool {
        matches!(letter, Some('x' | 'y'))
    }
}

/// How far an intercept may drift before it is stated again, ms (a request starting or ending
/// moves it by the current time, ~10^12).
const DRIFT_MS: i64 = 250;

/// How a round states this replica's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Every field; the part is replaced.
    Full,
    /// Only what changed since the last statement the script acknowledged.
    Changes,
    /// Take the part out of the sums (a replica leaving).
    Leave,
    /// Take another replica's part out, its lease having run out.
    Retire,
    /// What changed, on the condition that one sum stays within a limit.
    Claim,
}

impl Mode {
    /// As the script reads it.
    pub(super) const fn arg(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Changes => "changes",
            Self::Leave => "leave",
            Self::Retire => "retire",
            Self::Claim => "claim",
        }
    }
}

/// What this replica stated and what the script acknowledged.
#[derive(Debug)]
pub(super) struct Mine {
    /// The part as the script holds it (levels only; zero fields absent).
    stored: HashMap<String, i64>,
    /// The next statement must be whole: first, or the part was found gone.
    whole: bool,
    /// Per backend, the integral (request-seconds) at the last whole statement: the intercept
    /// counts only the area since, so that a part removed and stated again is not counted twice.
    base: HashMap<String, f64>,
}

impl Default for Mine {
    fn default() -> Self {
        Self {
            stored: HashMap::new(),
            whole: true,
            base: HashMap::new(),
        }
    }
}

impl Mine {
    /// The fields of a backend's load at `t_ms`, appended to `out`.
    pub(super) fn backend_fields(
        &mut self,
        backend: &str,
        load: LocalLoad,
        t_ms: u64,
        out: &mut Vec<(String, i64)>,
    ) {
        let whole = self.whole;
        let base = *self
            .base
            .entry(backend.to_owned())
            .and_modify(|b| {
                if whole {
                    *b = load.area;
                }
            })
            .or_insert(load.area);
        let t = t_ms as f64;
        let count = f64::from(load.count);
        let waiting = f64::from(load.waiting);
        out.push((field(Kind::InFlight, &[backend]), i64::from(load.count)));
        out.push((
            field(Kind::Intercept, &[backend]),
            ((load.area - base) * 1000.0 - count * t).round() as i64,
        ));
        out.push((field(Kind::Waiting, &[backend]), i64::from(load.waiting)));
        out.push((
            field(Kind::WaitingSince, &[backend]),
            (waiting * t - load.waiting_age_s * 1000.0).round() as i64,
        ));
    }

    /// What the next round states of `current` (this replica's levels now, and the counters'
    /// increments), and how.
    pub(super) fn statement(&self, current: Vec<(String, i64)>) -> (Mode, Vec<(String, i64)>) {
        if self.whole {
            let all = current.into_iter().filter(|(_, v)| *v != 0).collect();
            return (Mode::Full, all);
        }
        // A stored field that is no longer among the current ones (a backend gone from the
        // config) is stated as zero.
        let gone: Vec<(String, i64)> = {
            let listed: std::collections::HashSet<&str> =
                current.iter().map(|(f, _)| f.as_str()).collect();
            self.stored
                .keys()
                .filter(|f| !listed.contains(f.as_str()))
                .map(|f| (f.clone(), 0))
                .collect()
        };
        let mut out = self.changed(current);
        out.extend(gone);
        (Mode::Changes, out)
    }

    /// Those of `current` that differ from what the script holds (counters: those not zero).
    pub(super) fn changed(&self, current: Vec<(String, i64)>) -> Vec<(String, i64)> {
        current
            .into_iter()
            .filter(|(f, v)| {
                let kind = f.chars().next();
                if kind == Some('q') {
                    return *v != 0;
                }
                let stored = self.stored.get(f).copied().unwrap_or(0);
                if Kind::drifts(kind) {
                    (v - stored).abs() > DRIFT_MS
                } else {
                    *v != stored
                }
            })
            .collect()
    }

    /// Whether the next statement must be whole (nothing acknowledged yet, or the part gone):
    /// no claim can be stated before it.
    pub(super) fn whole(&self) -> bool {
        self.whole
    }

    /// The script took `stated` in `mode`.
    pub(super) fn acknowledged(&mut self, mode: Mode, stated: &[(String, i64)]) {
        if mode == Mode::Full {
            self.stored.clear();
            self.whole = false;
        }
        for (f, v) in stated {
            if f.starts_with('q') {
                continue;
            }
            if *v == 0 {
                self.stored.remove(f);
            } else {
                self.stored.insert(f.clone(), *v);
            }
        }
    }

    /// The script found no part of this replica's: the next statement is whole, its integral
    /// counted from then.
    pub(super) fn lost(&mut self) {
        self.whole = true;
    }

    /// This replica's stored value of a field.
    fn own(&self, field: &str) -> i64 {
        self.stored.get(field).copied().unwrap_or(0)
    }
}

/// The fleet's sums as last read.
#[derive(Debug, Default)]
pub(super) struct Totals {
    /// Replicas holding a lease, this one included.
    pub(super) replicas: u64,
    sums: HashMap<String, i64>,
}

impl Totals {
    /// Takes a new reading of the sums.
    pub(super) fn replace(&mut self, replicas: u64, sums: HashMap<String, i64>) {
        self.replicas = replicas;
        self.sums = sums;
    }

    fn sum(&self, field: &str) -> i64 {
        self.sums.get(field).copied().unwrap_or(0)
    }

    /// The sum less this replica's own part.
    fn others(&self, mine: &Mine, field: &str) -> i64 {
        self.sum(field) - mine.own(field)
    }

    /// The other replicas' load on `backend` at wall time `t_ms`.
    pub(super) fn peers(&self, mine: &Mine, backend: &str, t_ms: u64) -> PeerLoad {
        let t = i64::try_from(t_ms).unwrap_or(i64::MAX);
        let count = self.others(mine, &field(Kind::InFlight, &[backend])).max(0);
        let intercept = self.others(mine, &field(Kind::Intercept, &[backend]));
        let waiting = self.others(mine, &field(Kind::Waiting, &[backend])).max(0);
        let since = self.others(mine, &field(Kind::WaitingSince, &[backend]));
        PeerLoad {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            area: intercept.saturating_add(count.saturating_mul(t)) as f64 / 1000.0,
            waiting: u32::try_from(waiting).unwrap_or(u32::MAX),
            waiting_age_s: (waiting.saturating_mul(t).saturating_sub(since)).max(0) as f64 / 1000.0,
        }
    }

    /// The other replicas' requests in flight on `backend` of `class`.
    pub(super) fn peer_class(&self, mine: &Mine, backend: &str, class: &str) -> u32 {
        let n = self.others(mine, &field(Kind::Class, &[backend, class]));
        u32::try_from(n.max(0)).unwrap_or(u32::MAX)
    }

    /// The other replicas' requests in flight of the API key named `key`.
    pub(super) fn peer_key(&self, mine: &Mine, key: &str) -> u64 {
        u64::try_from(self.others(mine, &field(Kind::Key, &[key])).max(0)).unwrap_or(0)
    }

    /// The counters (curve samples taken per backend and model, fleet-wide, ever).
    pub(super) fn counters(&self) -> impl Iterator<Item = (&str, i64)> {
        self.sums
            .iter()
            .filter(|(f, _)| f.starts_with('q'))
            .map(|(f, v)| (f.as_str(), *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(count: u32, area: f64, waiting: u32, waiting_age_s: f64) -> LocalLoad {
        LocalLoad {
            count,
            area,
            waiting,
            waiting_age_s,
        }
    }

    /// What the script would hold after `stated`: the replica's part, and the sums of a fleet
    /// of this replica alone.
    fn apply(
        part: &mut HashMap<String, i64>,
        sums: &mut HashMap<String, i64>,
        mode: Mode,
        stated: &[(String, i64)],
    ) {
        if mode == Mode::Full {
            for (f, v) in part.drain() {
                *sums.entry(f).or_default() -= v;
            }
        }
        for (f, v) in stated {
            if f.starts_with('q') {
                *sums.entry(f.clone()).or_default() += v;
                continue;
            }
            let old = part.get(f).copied().unwrap_or(0);
            *sums.entry(f.clone()).or_default() += v - old;
            if *v == 0 {
                part.remove(f);
            } else {
                part.insert(f.clone(), *v);
            }
        }
    }

    #[test]
    fn a_replica_states_everything_first_then_only_what_changed() {
        let mut mine = Mine::default();
        let (mut part, mut sums) = (HashMap::new(), HashMap::new());
        let t0 = 1_700_000_000_000u64;
        let mut fields = Vec::new();
        mine.backend_fields("b", load(2, 10.0, 1, 0.25), t0, &mut fields);
        let (mode, stated) = mine.statement(fields);
        assert_eq!(mode, Mode::Full);
        // Zero fields are not stated; the intercept counts the area from now on.
        assert_eq!(stated.len(), 4, "{stated:?}");
        apply(&mut part, &mut sums, mode, &stated);
        mine.acknowledged(mode, &stated);

        // 100 ms on, the same requests: the intercept has not moved, nothing is stated.
        let mut fields = Vec::new();
        mine.backend_fields("b", load(2, 10.2, 1, 0.35), t0 + 100, &mut fields);
        let (mode, stated) = mine.statement(fields);
        assert_eq!((mode, stated.len()), (Mode::Changes, 0), "{stated:?}");

        // A request ends: count and intercept change; waiting stays.
        let mut fields = Vec::new();
        mine.backend_fields("b", load(1, 10.4, 1, 0.45), t0 + 200, &mut fields);
        let (mode, stated) = mine.statement(fields);
        let names: Vec<&str> = stated.iter().map(|(f, _)| &f[..1]).collect();
        assert_eq!(names, ["n", "x"], "{stated:?}");
        apply(&mut part, &mut sums, mode, &stated);
        mine.acknowledged(mode, &stated);

        // The fleet's integral from the sums is what accrued since the first statement: 0.4 s.
        let n = sums[&field(Kind::InFlight, &["b"])];
        let x = sums[&field(Kind::Intercept, &["b"])];
        let t = i64::try_from(t0 + 200).unwrap();
        assert_eq!(n, 1);
        assert_eq!(x + n * t, 400);
        // Its waiting request has waited 0.45 s.
        let w = sums[&field(Kind::Waiting, &["b"])];
        let y = sums[&field(Kind::WaitingSince, &["b"])];
        assert_eq!(w * t - y, 450);
        // The peers are the sums less this replica's part: none.
        let totals = Totals {
            replicas: 1,
            sums: sums.clone(),
        };
        assert_eq!(totals.peers(&mine, "b", t0 + 300), PeerLoad::default());
    }

    #[test]
    fn a_part_found_gone_is_stated_whole_and_counts_its_area_afresh() {
        let mut mine = Mine::default();
        let t0 = 1_700_000_000_000u64;
        let mut fields = Vec::new();
        mine.backend_fields("b", load(3, 50.0, 0, 0.0), t0, &mut fields);
        let (mode, stated) = mine.statement(fields);
        mine.acknowledged(mode, &stated);
        mine.lost();
        let mut fields = Vec::new();
        mine.backend_fields("b", load(3, 80.0, 0, 0.0), t0 + 10_000, &mut fields);
        let (mode, stated) = mine.statement(fields);
        assert_eq!(mode, Mode::Full);
        let x = stated
            .iter()
            .find(|(f, _)| f.starts_with('x'))
            .map(|(_, v)| *v)
            .unwrap();
        // The 80 request-seconds before were counted (and kept) by the part taken out.
        assert_eq!(x + 3 * i64::try_from(t0 + 10_000).unwrap(), 0);
    }

    #[test]
    fn the_peers_are_the_sums_less_this_replicas_part() {
        let mut mine = Mine::default();
        let t0 = 1_700_000_000_000u64;
        let mut fields = Vec::new();
        mine.backend_fields("b", load(2, 0.0, 0, 0.0), t0, &mut fields);
        fields.push((field(Kind::Class, &["b", "interactive"]), 2));
        fields.push((field(Kind::Key, &["team-a"]), 1));
        let (mode, stated) = mine.statement(fields);
        mine.acknowledged(mode, &stated);
        let t = i64::try_from(t0).unwrap();
        // Ours (2 in flight since t0) and a peer's (3 in flight since t0 - 1 s, 1 waiting for
        // 0.5 s) on `b`.
        let sums: HashMap<String, i64> = [
            (field(Kind::InFlight, &["b"]), 5),
            (field(Kind::Intercept, &["b"]), -2 * t - 3 * (t - 1000)),
            (field(Kind::Waiting, &["b"]), 1),
            (field(Kind::WaitingSince, &["b"]), t - 500),
            (field(Kind::Class, &["b", "interactive"]), 4),
            (field(Kind::Key, &["team-a"]), 3),
        ]
        .into();
        let totals = Totals { replicas: 2, sums };
        let peers = totals.peers(&mine, "b", t0 + 1000);
        assert_eq!(peers.count, 3);
        assert!((peers.area - 6.0).abs() < 1e-9, "{peers:?}");
        assert_eq!(peers.waiting, 1);
        assert!((peers.waiting_age_s - 1.5).abs() < 1e-9, "{peers:?}");
        assert_eq!(totals.peer_class(&mine, "b", "interactive"), 2);
        assert_eq!(totals.peer_key(&mine, "team-a"), 2);
    }
}
