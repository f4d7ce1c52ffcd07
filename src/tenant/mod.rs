//! Tenants: what each API key may use and what it has used: requests and tokens per minute,
//! requests in flight, spend per calendar period. Counted on this replica.
//!
//! A request is admitted against its key's limits with an estimate of its tokens (the prompt as
//! classify sized it, plus its `max_tokens`) and leaves a [`Charge`]; the request's end settles
//! the charge with the tokens the backend reported and their price (`backends[].cost`), and a
//! request that never reached a backend gives its estimate back. Per-minute limits are token
//! buckets ([`Bucket`]): a key may burst up to its limit, then use it at its rate.
//!
//! How far a key can go over: requests per minute and in flight, never (checked and taken under
//! one lock); tokens per minute, by what its requests in flight used beyond their estimates
//! (a request without `max_tokens` is estimated at 256 output tokens); spend, by what its
//! requests in flight cost when the budget ran out (spend is known only at a request's end).
//!
//! A reload keeps each key's usage by its name; a key's limits may change in place.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::config::{BudgetPeriod, KeyLimits, Price, Slo};
use crate::telemetry::{KeyMetrics, OTHER_KEYS};

mod attainment;
mod bucket;
mod period;
#[cfg(test)]
mod tests;

pub(crate) use attainment::{Attainment, ClassAttainment, Counts as VerdictCounts, Verdict};
pub(crate) use bucket::{Allowance, Bucket};

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
    /// `max_concurrency`.
    Concurrency,
    /// `budget_usd`.
    Budget,
}

impl Limit {
    /// Every limit, in the order of its discriminant (which indexes [`KeyMetrics::limited`]).
    pub(crate) const ALL: [Self; 4] = [
        Self::Requests,
        Self::Tokens,
        Self::Concurrency,
        Self::Budget,
    ];

    /// The `limit` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::Budget => "budget",
        }
    }
}

/// A key's per-minute limits after a decision, for the response's rate-limit headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Quota {
    /// `requests_per_minute`, if set.
    pub requests: Option<Allowance>,
    /// `tokens_per_minute`, if set.
    pub tokens: Option<Allowance>,
}

/// A request its key's limits refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The limit it is over (the first found: in flight, budget, requests, tokens).
    pub limit: Limit,
    /// When it would be admitted, as far as can be told.
    pub retry_after: Duration,
    /// The key's limits as they stand.
    pub quota: Quota,
}

/// One API key's limits and usage.
#[derive(Debug)]
pub(crate) struct Tenant {
    name: Arc<str>,
    /// Unique in the process: the key's flow in a class's fair line.
    id: u64,
    /// Its weight in the line, as `f64` bits (changed by a reload).
    weight: AtomicU64,
    state: Mutex<State>,
    in_flight: AtomicU64,
    totals: Totals,
    metrics: KeyMetrics,
    /// Its requests' verdicts against their classes' SLOs.
    attainment: attainment::Attainment,
}

#[derive(Debug)]
struct State {
    limits: KeyLimits,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    spend: Spend,
    /// What this replica used since it last told the fleet.
    unsent: Delta,
    /// Requests in flight for this key through the other replicas, as last heard.
    peers_in_flight: u64,
}

/// Usage not yet told to the fleet: requests admitted, tokens drawn (less what settling gave
/// back), dollars spent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Delta {
    /// Requests admitted.
    pub requests: f64,
    /// Tokens drawn, net of what settling gave back (may be negative).
    pub tokens: f64,
    /// Dollars spent.
    pub usd: f64,
}

/// The fleet's view of one key after a sync, for [`Tenant::share_fleet`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct FleetView {
    /// The fleet's requests bucket, if the key has one.
    pub requests: Option<f64>,
    /// The fleet's tokens bucket, if the key has one.
    pub tokens: Option<f64>,
    /// The fleet's spend this period.
    pub spent_usd: Option<f64>,
    /// Replicas sharing the key's limits (every replica publishing, this one included).
    pub replicas: usize,
    /// The key's requests in flight through the other replicas.
    pub peers_in_flight: u64,
}

/// Spend in the current period (of the budget's kind, a day without one).
#[derive(Debug, Default)]
struct Spend {
    period: Option<(BudgetPeriod, i64)>,
    usd: f64,
}

#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    limited: AtomicU64,
    estimated: AtomicU64,
}

/// What a key has used and may still use, for `/admin/keys`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Usage {
    /// The key's name.
    pub name: String,
    /// Requests in flight now through this replica.
    pub in_flight: u64,
    /// Requests in flight through the other replicas (with `cluster:`).
    pub peers_in_flight: u64,
    /// `max_concurrency`, if set.
    pub max_concurrency: Option<u64>,
    /// `requests_per_minute`: limit, remaining, seconds to full.
    pub requests_per_minute: Option<Allowance>,
    /// `tokens_per_minute`: limit, remaining, seconds to full.
    pub tokens_per_minute: Option<Allowance>,
    /// Dollars spent this period.
    pub spent_usd: f64,
    /// `budget_usd`, if set.
    pub budget_usd: Option<f64>,
    /// The period spend is counted over.
    pub budget_period: BudgetPeriod,
    /// Seconds until the period renews.
    pub period_resets_in_s: i64,
    /// Requests admitted since start.
    pub requests_total: u64,
    /// Prompt tokens used since start.
    pub input_tokens_total: u64,
    /// Output tokens used since start.
    pub output_tokens_total: u64,
    /// Requests refused by a limit since start.
    pub limited_total: u64,
    /// Of the requests settled since start, those whose backend reported no output count:
    /// their tokens and spend are the admission's estimate.
    pub estimated_total: u64,
    /// Per class, how its requests fared against the class's SLO.
    pub slo: Vec<ClassAttainment>,
}

impl Tenant {
    /// A key named `name` with `limits`, nothing used yet, of weight 1.
    #[cfg(test)]
    pub(crate) fn new(name: Arc<str>, limits: KeyLimits, now: Instant) -> Arc<Self> {
        Self::labelled(Arc::clone(&name), name, limits, now)
    }

    /// [`Tenant::new`], its metrics labelled `label` (its name, or [`OTHER_KEYS`] past
    /// `admin.max_key_series`).
    pub(crate) fn labelled(
        name: Arc<str>,
        label: Arc<str>,
        limits: KeyLimits,
        now: Instant,
    ) -> Arc<Self> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let metrics = KeyMetrics::new(&label, Limit::ALL.map(Limit::label));
        let attainment = attainment::Attainment::new(label);
        Arc::new(Self {
            metrics,
            name,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            weight: AtomicU64::new(1f64.to_bits()),
            state: Mutex::new(State {
                limits,
                requests: limits.requests_per_minute.map(|n| Bucket::full(n, now)),
                tokens: limits.tokens_per_minute.map(|n| Bucket::full(n, now)),
                spend: Spend::default(),
                unsent: Delta::default(),
                peers_in_flight: 0,
            }),
            in_flight: AtomicU64::new(0),
            totals: Totals::default(),
            attainment,
        })
    }

    /// Its requests' verdicts against their classes' SLOs.
    pub(crate) fn attainment(&self) -> &Attainment {
        &self.attainment
    }

    /// The key's name.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Its flow in a class's fair line (never 0, the flow of requests without a key).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Its weight in a class's fair line.
    pub(crate) fn weight(&self) -> f64 {
        f64::from_bits(self.weight.load(Ordering::Relaxed))
    }

    /// Sets its weight in a class's fair line.
    pub(crate) fn set_weight(&self, weight: f64) {
        self.weight.store(weight.to_bits(), Ordering::Relaxed);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding it cannot leave the counts torn (each update is one
        // assignment), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the limits; what was used stays used.
    pub(crate) fn set_limits(&self, limits: KeyLimits, now: Instant) {
        let mut state = self.state();
        let resize =
            |bucket: &mut Option<Bucket>, limit: Option<u64>| match (bucket.as_mut(), limit) {
                (Some(b), Some(n)) => b.resize(n, now),
                (None, Some(n)) => *bucket = Some(Bucket::full(n, now)),
                (_, None) => *bucket = None,
            };
        resize(&mut state.requests, limits.requests_per_minute);
        resize(&mut state.tokens, limits.tokens_per_minute);
        state.limits = limits;
    }

    /// Admits a request estimated at `prompt` + `output` tokens at `now` (`unix_s` for the
    /// budget's calendar), or says which limit it is over and for how long.
    pub(crate) fn admit(
        self: &Arc<Self>,
        prompt: u64,
        output: u64,
        now: Instant,
        unix_s: i64,
    ) -> Result<(Arc<Charge>, Quota), Refusal> {
        let mut state = self.state();
        if let Some((limit, retry_after)) = self.refusal(&mut state, prompt + output, now, unix_s) {
            let quota = state.quota(now);
            drop(state);
            self.totals.limited.fetch_add(1, Ordering::Relaxed);
            self.metrics.limited[limit as usize].increment(1);
            return Err(Refusal {
                limit,
                retry_after,
                quota,
            });
        }
        if let Some(b) = &mut state.requests {
            b.draw(1);
        }
        if let Some(b) = &mut state.tokens {
            b.draw(prompt + output);
        }
        state.unsent.requests += 1.0;
        state.unsent.tokens += (prompt + output) as f64;
        let quota = state.quota(now);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        drop(state);
        self.totals.requests.fetch_add(1, Ordering::Relaxed);
        self.metrics.requests.increment(1);
        self.metrics.in_flight.increment(1.0);
        let charge = Charge {
            tenant: Arc::clone(self),
            prompt,
            output,
            settled: AtomicBool::new(false),
            class: std::sync::OnceLock::new(),
            verdict: std::sync::atomic::AtomicU8::new(0),
            used: std::sync::OnceLock::new(),
        };
        Ok((Arc::new(charge), quota))
    }

    /// The first limit a request of `tokens` is over, and the wait; nothing taken.
    fn refusal(
        &self,
        state: &mut State,
        tokens: u64,
        now: Instant,
        unix_s: i64,
    ) -> Option<(Limit, Duration)> {
        let in_flight = self.in_flight.load(Ordering::Relaxed) + state.peers_in_flight;
        if state
            .limits
            .max_concurrency
            .is_some_and(|max| in_flight >= max)
        {
            // A slot frees when a request ends, which cannot be told: a second is a guess.
            return Some((Limit::Concurrency, Duration::from_secs(1)));
        }
        let period_end = state.roll(unix_s);
        if let Some(budget) = state.limits.budget
            && state.spend.usd >= budget.usd
        {
            let wait = u64::try_from(period_end.saturating_sub(unix_s)).unwrap_or(0);
            return Some((Limit::Budget, Duration::from_secs(wait.max(1))));
        }
        let requests = state.requests.as_mut().and_then(|b| b.wait_for(1, now));
        let tokens = state.tokens.as_mut().and_then(|b| b.wait_for(tokens, now));
        match (requests, tokens) {
            (Some(r), Some(t)) if t > r => Some((Limit::Tokens, t)),
            (Some(r), _) => Some((Limit::Requests, r)),
            (None, Some(t)) => Some((Limit::Tokens, t)),
            (None, None) => None,
        }
    }

    /// A charge's end: `input` + `output` tokens used at `cost_usd`, against its estimate.
    fn settle(&self, estimate: u64, input: u64, output: u64, cost_usd: f64, unix_s: i64) {
        let now = Instant::now();
        let mut state = self.state();
        let back = estimate as f64 - (input + output) as f64;
        if let Some(b) = &mut state.tokens {
            b.settle(back, now);
        }
        state.unsent.tokens -= back;
        state.unsent.usd += cost_usd;
        state.roll(unix_s);
        state.spend.usd += cost_usd;
        let spent = state.spend.usd;
        drop(state);
        self.totals.input_tokens.fetch_add(input, Ordering::Relaxed);
        self.totals
            .output_tokens
            .fetch_add(output, Ordering::Relaxed);
        self.metrics.input_tokens.increment(input);
        self.metrics.output_tokens.increment(output);
        self.metrics.spend.set(spent);
    }

    /// A charge that used nothing: its estimate goes back.
    fn refund(&self, estimate: u64) {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(b) = &mut state.tokens {
            b.settle(estimate as f64, now);
        }
        state.unsent.tokens -= estimate as f64;
    }

    /// The key's limits.
    pub(crate) fn limits(&self) -> KeyLimits {
        self.state().limits
    }

    /// The budget period `unix_s` falls in: its kind and number (spend is kept per period).
    pub(crate) fn period(&self, unix_s: i64) -> (BudgetPeriod, i64) {
        let kind = self
            .limits()
            .budget
            .map_or_else(BudgetPeriod::default, |b| b.period);
        (kind, period::of(kind, unix_s).0)
    }

    /// What this replica used since the last call, for the fleet.
    pub(crate) fn take_delta(&self) -> Delta {
        std::mem::take(&mut self.state().unsent)
    }

    /// Gives back a delta the fleet did not take (Redis away): it is sent with the next.
    pub(crate) fn untake(&self, delta: Delta) {
        let mut state = self.state();
        state.unsent.requests += delta.requests;
        state.unsent.tokens += delta.tokens;
        state.unsent.usd += delta.usd;
    }

    /// Takes the fleet's view after a sync: this replica's part of each bucket, the fleet's
    /// spend (with what this replica spent since the sync), the peers' requests in flight.
    pub(crate) fn share_fleet(&self, view: FleetView, now: Instant) {
        let mut state = self.state();
        if let (Some(b), Some(level)) = (&mut state.requests, view.requests) {
            b.share_fleet(level, view.replicas, now);
        }
        if let (Some(b), Some(level)) = (&mut state.tokens, view.tokens) {
            b.share_fleet(level, view.replicas, now);
        }
        if let Some(spent) = view.spent_usd {
            state.spend.usd = spent + state.unsent.usd;
        }
        state.peers_in_flight = view.peers_in_flight;
    }

    /// The fleet is out of reach: limits count on this replica alone.
    pub(crate) fn alone(&self, now: Instant) {
        let mut state = self.state();
        let state = &mut *state;
        for b in [&mut state.requests, &mut state.tokens]
            .into_iter()
            .flatten()
        {
            b.alone(now);
        }
        state.peers_in_flight = 0;
    }

    /// Requests in flight through this replica.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sets its gauges (spend this period, requests in flight) for a scrape: gauges not set
    /// for a while leave the metrics page.
    pub(crate) fn publish(&self, unix_s: i64) {
        let mut state = self.state();
        state.roll(unix_s);
        self.metrics.spend.set(state.spend.usd);
        drop(state);
        self.metrics
            .in_flight
            .set(self.in_flight.load(Ordering::Relaxed) as f64);
    }

    /// What the key has used and may use at `now`.
    pub(crate) fn usage(&self, now: Instant, unix_s: i64) -> Usage {
        let mut state = self.state();
        let period_end = state.roll(unix_s);
        let quota = state.quota(now);
        Usage {
            name: self.name.to_string(),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            peers_in_flight: state.peers_in_flight,
            max_concurrency: state.limits.max_concurrency,
            requests_per_minute: quota.requests,
            tokens_per_minute: quota.tokens,
            spent_usd: state.spend.usd,
            budget_usd: state.limits.budget.map(|b| b.usd),
            budget_period: state
                .spend
                .period
                .map_or_else(BudgetPeriod::default, |p| p.0),
            period_resets_in_s: period_end.saturating_sub(unix_s),
            requests_total: self.totals.requests.load(Ordering::Relaxed),
            input_tokens_total: self.totals.input_tokens.load(Ordering::Relaxed),
            output_tokens_total: self.totals.output_tokens.load(Ordering::Relaxed),
            limited_total: self.totals.limited.load(Ordering::Relaxed),
            estimated_total: self.totals.estimated.load(Ordering::Relaxed),
            slo: self.attainment.classes(),
        }
    }
}

impl State {
    /// See [`Spend::roll`].
    fn roll(&mut self, unix_s: i64) -> i64 {
        self.spend.roll(self.limits, unix_s)
    }

    fn quota(&mut self, now: Instant) -> Quota {
        Quota {
            requests: self.requests.as_mut().map(|b| b.allowance(now)),
            tokens: self.tokens.as_mut().map(|b| b.allowance(now)),
        }
    }
}

impl Spend {
    /// Starts a new period where `unix_s` is past this one; the second the period ends.
    fn roll(&mut self, limits: KeyLimits, unix_s: i64) -> i64 {
        let kind = limits
            .budget
            .map_or_else(BudgetPeriod::default, |b| b.period);
        let (n, end) = period::of(kind, unix_s);
        // A budget whose period changed kind on reload starts afresh too.
        if self.period != Some((kind, n)) {
            self.usd = 0.0;
            self.period = Some((kind, n));
        }
        end
    }
}

/// A request's hold on its key: in flight until dropped, its estimate drawn until settled.
#[derive(Debug)]
pub(crate) struct Charge {
    tenant: Arc<Tenant>,
    prompt: u64,
    output: u64,
    settled: AtomicBool,
    /// The request's class and its SLO (overrides applied), once classified.
    class: std::sync::OnceLock<(Option<Arc<str>>, Slo)>,
    /// Its [`Verdict::code`], once judged (0: not yet); tallied when the charge goes.
    verdict: std::sync::atomic::AtomicU8,
    /// The tokens it used and what they cost, once settled: tallied with the verdict.
    used: std::sync::OnceLock<(u64, f64)>,
}

/// What a backend charges for one request: its tokens' prices (0 where unpriced), and its
/// share of an engine priced by the hour.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bill {
    /// The model's token prices.
    pub tokens: Price,
    /// Its share of the engine's time, USD.
    pub engine_usd: f64,
}

impl Charge {
    /// The request is of `class` (`None`: none), held to `slo`.
    pub(crate) fn of_class(&self, class: Option<Arc<str>>, slo: Slo) {
        let _ = self.class.set((class, slo));
    }

    /// The SLO its request is judged by, where it has a class.
    pub(crate) fn slo(&self) -> Option<Slo> {
        self.class.get().map(|(_, slo)| *slo)
    }

    /// What became of the request; the first verdict stands (a refusal, a failure, or the
    /// response's end, whichever came first).
    pub(crate) fn judged(&self, verdict: Verdict) {
        let _ =
            self.verdict
                .compare_exchange(0, verdict.code(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The key.
    pub(crate) fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The tokens it was admitted at (prompt and output, estimated).
    pub(crate) fn tokens(&self) -> u64 {
        self.prompt + self.output
    }

    /// The request ended having used `input` and `output` tokens (`None`: unknown, the
    /// estimate stands), charged by `bill`, at `unix_s` (its cost counts in the budget period
    /// of that second, as [`Tenant::admit`]'s clock). Only the first call counts.
    pub(crate) fn settle(&self, input: Option<u64>, output: Option<u64>, bill: Bill, unix_s: i64) {
        if self.settled.swap(true, Ordering::Relaxed) {
            return;
        }
        if output.is_none() {
            self.tenant.totals.estimated.fetch_add(1, Ordering::Relaxed);
        }
        let input = input.unwrap_or(self.prompt);
        let output = output.unwrap_or(self.output);
        let cost = bill.tokens.usd(input, output) + bill.engine_usd;
        let _ = self.used.set((input + output, cost));
        self.tenant
            .settle(self.prompt + self.output, input, output, cost, unix_s);
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(verdict) = Verdict::of_code(self.verdict.load(Ordering::Relaxed)) {
            let class = self.class.get().and_then(|(c, _)| c.as_ref());
            let (tokens, usd) = self.used.get().copied().unwrap_or_default();
            self.tenant.attainment.tally(class, verdict, tokens, usd);
        }
        if !self.settled.swap(true, Ordering::Relaxed) {
            self.tenant.refund(self.prompt + self.output);
        }
        self.tenant.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.tenant.metrics.in_flight.decrement(1.0);
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Every configured key's tenant, in `api_keys` order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tenants {
    keys: Vec<Arc<Tenant>>,
}

impl Tenants {
    /// The tenants of `keys` (each a name, its limits and weight: the config's API keys, then
    /// its JWT tenants); a key of the same name in `old` keeps its usage (its limits changed to
    /// the new ones, its metrics' label as it was), a key gone from `keys` is gone. The first
    /// `max_series` keys' metrics carry their names, the rest's [`OTHER_KEYS`].
    pub(crate) fn build<'k>(
        keys: impl IntoIterator<Item = (&'k Arc<str>, KeyLimits, f64)>,
        old: Option<&Self>,
        now: Instant,
        max_series: usize,
    ) -> Self {
        let keys = keys
            .into_iter()
            .enumerate()
            .map(|(i, (name, limits, weight))| {
                let kept = old.and_then(|o| o.keys.iter().find(|t| t.name == *name));
                let tenant = match kept {
                    Some(t) => {
                        t.set_limits(limits, now);
                        Arc::clone(t)
                    }
                    None => {
                        let label = if i < max_series {
                            Arc::clone(name)
                        } else {
                            OTHER_KEYS.into()
                        };
                        Tenant::labelled(Arc::clone(name), label, limits, now)
                    }
                };
                tenant.set_weight(weight);
                tenant
            })
            .collect();
        Self { keys }
    }

    /// The tenant of the `index`-th key.
    pub(crate) fn get(&self, index: usize) -> Option<&Arc<Tenant>> {
        self.keys.get(index)
    }

    /// Every key's tenant, in `api_keys` order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.keys.iter()
    }

    /// Every key's usage at `now`.
    pub(crate) fn usage(&self, now: Instant, unix_s: i64) -> Vec<Usage> {
        self.keys.iter().map(|t| t.usage(now, unix_s)).collect()
    }
}
