//! The simulated engine: one scheduler task per backend that decodes every running request.
//!
//! # The timing rule
//!
//! A decode step with `b` requests running takes `s(b) = step_base + step_per_seq * min(b, until)`
//! (`until`: `step_per_seq_until`, unbounded unless set) and yields
//! one token for each of them; requests beyond `max_batch` wait FIFO. The scheduler keeps a
//! virtual clock `V` counting completed steps: it advances at `1 / s(b)` per second for the batch
//! size `b` of the moment, so a change of batch changes everyone's speed from that instant on.
//! Request `r` admitted at virtual time `v0` gets token `k` when `V` reaches `v0 + k` (plus the
//! jitter, drawn per token from `±jitter` of a step around that grid point, so it never drifts).
//!
//! Admitting a request with a prompt of `P` tokens stalls decoding for all running requests by
//! `P / prefill_tokens_per_s` plus `prefill_stall` (`V` stands still: the prefill lengthens the
//! step it joins, and an engine without chunked prefill runs a forward pass of its own for it);
//! prompts admitted together prefill back to back. With `speed_spread`, each request takes its
//! own number of steps per token after the first, drawn once at admission: some requests
//! decode slower than others at the same batch, as measured on real engines.
//!
//! The newcomer's first token comes one step `s(b)` after its own prefill ends (`b` counts the
//! newcomer), on the wall clock: prompts admitted after it prefill after it, as in an engine
//! without chunked prefill, whose prefill pass emits its own first token. They stall its next
//! tokens, never its first. With nothing queued ahead, TTFT is therefore `P / prefill + s(b)`
//! exactly; prompts admitted just before it add what remains of their prefills.
//!
//! Requests are not phase-aligned: each decodes on its own grid at the shared rate. Real engines
//! align tokens to global step boundaries, which adds a uniformly distributed residual of up to
//! one step to TTFT that depends on arrival phase; leaving it out keeps the analytic curve exact
//! for both closed and open loops, and a gateway cannot observe the phase anyway.
//!
//! Engines on one device (`device:` in the fleet file) share it as engines on one GPU or one
//! host's cores do: the device runs one engine's forward pass at a time, so a decode step of
//! one engine also waits for the steps of every other engine there that has requests running:
//! `s(b) + Σ s_other(b_other)`. A serial engine's lone request then costs a batching engine
//! beside it a whole step of its own, as measured with two `transformers serve` on one host.
//!
//! The clock comes from `tokio::time`, so the engine can run under paused time in tests.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use slab::Slab;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::config::Timing;

/// One token, delivered to the request's stream. The channel closes after the last one.
pub(crate) type TokenRx = mpsc::UnboundedReceiver<()>;

/// A handle to a running engine. Cloning is cheap; the engine stops when every handle is gone.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    commands: mpsc::UnboundedSender<Command>,
    stats: Arc<EngineStats>,
}

/// Live counters of an engine, readable from any thread.
#[derive(Debug, Default)]
pub(crate) struct EngineStats {
    running: AtomicU64,
    queued: AtomicU64,
    admitted: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    tokens: AtomicU64,
}

/// A snapshot of [`EngineStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Requests decoding now.
    pub running: u64,
    /// Requests waiting for a batch slot.
    pub queued: u64,
    /// Requests ever admitted to the batch.
    pub admitted: u64,
    /// Requests that got all their tokens.
    pub completed: u64,
    /// Requests whose client went away first.
    pub cancelled: u64,
    /// Tokens emitted.
    pub tokens: u64,
}

impl EngineStats {
    /// Reads all counters.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(AtomicOrdering::Relaxed);
        StatsSnapshot {
            running: get(&self.running),
            queued: get(&self.queued),
            admitted: get(&self.admitted),
            completed: get(&self.completed),
            cancelled: get(&self.cancelled),
            tokens: get(&self.tokens),
        }
    }
}

#[derive(Debug)]
enum Command {
    Submit(Job),
    Retime(Timing),
}

#[derive(Debug)]
struct Job {
    prompt_tokens: u32,
    max_tokens: u32,
    /// Seeds the request's own draws (its speed), when it names one.
    seed: Option<u64>,
    tokens: mpsc::UnboundedSender<()>,
}

/// A device several engines share: each one's current step time, seconds (0 while it has
/// nothing running), and a counter bumped whenever one changes, which wakes the others.
#[derive(Debug)]
pub(crate) struct SharedDevice {
    steps: Box<[AtomicU64]>,
    changed: watch::Sender<u64>,
}

/// One engine's place on a [`SharedDevice`].
#[derive(Debug, Clone)]
pub(crate) struct Seat {
    device: Arc<SharedDevice>,
    index: usize,
}

impl SharedDevice {
    /// A device for `engines` engines; their seats are `0..engines`.
    pub(crate) fn new(engines: usize) -> Arc<Self> {
        Arc::new(Self {
            steps: (0..engines).map(|_| AtomicU64::new(0)).collect(),
            changed: watch::channel(0).0,
        })
    }

    /// Seat `index` on it.
    pub(crate) fn seat(self: &Arc<Self>, index: usize) -> Seat {
        Seat {
            device: Arc::clone(self),
            index,
        }
    }
}

impl Seat {
    /// What the other engines' steps add to one of this engine's, seconds.
    fn beside(&self) -> f64 {
        let d = &self.device;
        d.steps
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.index)
            .map(|(_, s)| f64::from_bits(s.load(AtomicOrdering::Relaxed)))
            .sum()
    }

    /// This engine's step is now `step_s`: the others are woken if it changed.
    fn publish(&self, step_s: f64) {
        let slot = &self.device.steps[self.index];
        if slot.swap(step_s.to_bits(), AtomicOrdering::Relaxed) != step_s.to_bits() {
            self.device.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Engine {
    /// Starts the scheduler task on the current Tokio runtime, alone on its device or on
    /// `seat` of a shared one.
    pub(crate) fn spawn(timing: Timing, seat: Option<Seat>) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(EngineStats::default());
        let scheduler = Scheduler::new(timing, Arc::clone(&stats), seat);
        tokio::spawn(scheduler.run(rx));
        Self { commands, stats }
    }

    #[cfg(test)]
    /// Queues a request; its tokens arrive on the returned channel, which closes after the
    /// `max_tokens`-th. Dropping the receiver cancels the request.
    pub(crate) fn submit(&self, prompt_tokens: u32, max_tokens: u32) -> TokenRx {
        self.submit_after(Duration::ZERO, prompt_tokens, max_tokens, None)
    }

    /// Like [`Engine::submit`], but the engine sees the request only after `delay` (a hosted
    /// API's network and queue time, which holds no batch slot). A request given a `seed`
    /// draws its speed from it, so that the same request gets the same speed on every run.
    pub(crate) fn submit_after(
        &self,
        delay: Duration,
        prompt_tokens: u32,
        max_tokens: u32,
        seed: Option<u64>,
    ) -> TokenRx {
        let (tokens, rx) = mpsc::unbounded_channel();
        let job = Command::Submit(Job {
            prompt_tokens,
            max_tokens: max_tokens.max(1),
            seed,
            tokens,
        });
        // A send fails only once the scheduler has stopped; the receiver then closes empty and
        // the caller reports the truncated stream.
        if delay.is_zero() {
            let _ = self.commands.send(job);
        } else {
            let commands = self.commands.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = commands.send(job);
            });
        }
        rx
    }

    /// Changes the timing from now on; running requests keep their progress.
    pub(crate) fn retime(&self, timing: Timing) {
        let _ = self.commands.send(Command::Retime(timing));
    }

    /// Live counters.
    pub(crate) fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

/// A new request's steps per token: log-normal about 1, so that its speed's 10th percentile is
/// `spread` below the median (`z` of the 10th percentile: −1.2816).
fn pace(spread: f64, rng: &mut SmallRng) -> f64 {
    if spread <= 0.0 {
        return 1.0;
    }
    let sigma = -(1.0 - spread).ln() / 1.281_552;
    // Box–Muller: one standard normal from two uniforms.
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    let v: f64 = rng.random();
    let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
    (-sigma * z).exp()
}

/// Half of Tokio's timer resolution (1 ms), seconds.
const HALF_TICK_S: f64 = 0.0005;

// === impl Scheduler ===

struct Scheduler {
    timing: Timing,
    stats: Arc<EngineStats>,
    rng: SmallRng,
    /// Virtual time: decode steps completed by any request running throughout.
    v: f64,
    /// When `v` was last brought up to date.
    last: Instant,
    /// Decoding stands still until then (prefill in progress).
    stall_until: Instant,
    running: Slab<Running>,
    /// First tokens, by when they are due on the wall clock (see the module's timing rule).
    firsts: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Every later token, by when it is due on the virtual clock.
    due: BinaryHeap<Due>,
    waiting: VecDeque<Job>,
    /// Its place on a shared device, and what the other engines' steps add to its own.
    seat: Option<Seat>,
    beside: f64,
}

struct Running {
    /// The virtual time its token grid starts from: token `k` (from 1) is due at
    /// `v0 + 1 + (k - 1) * pace`.
    v0: f64,
    /// Steps per token after the first: 1, or the request's own speed drawn at admission
    /// (`Timing::speed_spread`).
    pace: f64,
    emitted: u32,
    max_tokens: u32,
    tokens: mpsc::UnboundedSender<()>,
}

/// The next token of one running request, ordered so that the heap pops the earliest first.
struct Due {
    v: f64,
    key: usize,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .v
            .total_cmp(&self.v)
            .then_with(|| other.key.cmp(&self.key))
    }
}

impl Scheduler {
    fn new(timing: Timing, stats: Arc<EngineStats>, seat: Option<Seat>) -> Self {
        let now = Instant::now();
        Self {
            timing,
            stats,
            rng: SmallRng::from_os_rng(),
            v: 0.0,
            last: now,
            stall_until: now,
            running: Slab::new(),
            firsts: BinaryHeap::new(),
            due: BinaryHeap::new(),
            waiting: VecDeque::new(),
            seat,
            beside: 0.0,
        }
    }

    /// A decode step's time with `batch` running, the other engines on its device included.
    fn step(&self, batch: usize) -> f64 {
        self.timing.step(batch) + self.beside
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        let mut received = Vec::with_capacity(64);
        let mut device = self.seat.as_ref().map(|s| s.device.changed.subscribe());
        loop {
            let wake = self.next_wake();
            if let Some(at) = wake {
                sleep.as_mut().reset(at);
            }
            let neighbours = async {
                match device.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                got = commands.recv_many(&mut received, 256) => {
                    if got == 0 {
                        return;
                    }
                }
                () = &mut sleep, if wake.is_some() => {}
                open = neighbours => {
                    if !open {
                        device = None;
                    }
                }
            }
            let now = Instant::now();
            // Up to now at the pace the neighbours set until now; from now at theirs of now.
            self.advance(now);
            if let Some(seat) = &self.seat {
                self.beside = seat.beside();
            }
            for command in received.drain(..) {
                match command {
                    Command::Submit(job) => self.waiting.push_back(job),
                    Command::Retime(timing) => self.timing = timing,
                }
            }
            self.emit_due();
            self.admit(now);
            self.publish();
        }
    }

    /// Brings the virtual clock up to `now` at the rate of the current batch.
    fn advance(&mut self, now: Instant) {
        let from = self.last.max(self.stall_until);
        if now > from && !self.running.is_empty() {
            self.v += (now - from).as_secs_f64() / self.step(self.running.len());
        }
        self.last = self.last.max(now);
    }

    /// When to wake for the earliest due token: half a timer tick before it is due, because
    /// Tokio's timers fire on whole milliseconds, rounding up. Waking early by half a tick and
    /// emitting what is due within half a tick ([`Scheduler::emit_due`]) makes a token's error
    /// ±0.5 ms around its time instead of 0..+1 ms late.
    fn next_wake(&self) -> Option<Instant> {
        let half_tick = Duration::from_secs_f64(HALF_TICK_S);
        let first = self.firsts.peek().map(|Reverse((at, _))| *at - half_tick);
        let next = self.due.peek().map(|next| {
            let from = self.last.max(self.stall_until);
            let steps = (next.v - self.v).max(0.0);
            let secs = (steps * self.step(self.running.len()) - HALF_TICK_S).max(0.0);
            from + Duration::from_secs_f64(secs)
        });
        match (first, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn emit_due(&mut self) {
        let soon = self.last + Duration::from_secs_f64(HALF_TICK_S);
        while let Some(&Reverse((at, key))) = self.firsts.peek()
            && at <= soon
        {
            self.firsts.pop();
            self.emit(key);
        }
        let batch = self.running.len().max(1);
        // Due within half a timer tick counts as due now (see `next_wake`); nothing is due while
        // a prefill stalls decoding.
        let slack = if self.last >= self.stall_until {
            HALF_TICK_S / self.step(batch)
        } else {
            0.0
        };
        while self
            .due
            .peek()
            .is_some_and(|d| d.v <= self.v + slack + 1e-9)
        {
            let Some(Due { key, .. }) = self.due.pop() else {
                break;
            };
            self.emit(key);
        }
    }

    /// Sends request `key` its next token and schedules the one after, if any.
    fn emit(&mut self, key: usize) {
        let Some(run) = self.running.get_mut(key) else {
            return;
        };
        if run.tokens.send(()).is_err() {
            self.running.remove(key);
            self.stats.cancelled.fetch_add(1, AtomicOrdering::Relaxed);
            return;
        }
        self.stats.tokens.fetch_add(1, AtomicOrdering::Relaxed);
        if run.emitted == 0 {
            // A later prompt's prefill may have held the virtual clock since this one was
            // admitted; the second token still comes `pace` steps of decode after the first.
            run.v0 = run.v0.min(self.v - 1.0);
        }
        run.emitted += 1;
        if run.emitted >= run.max_tokens {
            self.running.remove(key);
            self.stats.completed.fetch_add(1, AtomicOrdering::Relaxed);
        } else {
            let next = run.v0 + 1.0 + f64::from(run.emitted) * run.pace;
            let v = next + self.jitter();
            self.due.push(Due { v, key });
        }
    }

    /// Moves waiting requests into the batch while there is room, each stalling decode for its
    /// prefill.
    fn admit(&mut self, now: Instant) {
        while self.running.len() < self.timing.max_batch {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            if job.tokens.is_closed() {
                self.stats.cancelled.fetch_add(1, AtomicOrdering::Relaxed);
                continue;
            }
            let prefill = Duration::from_secs_f64(self.timing.prefill(job.prompt_tokens));
            self.stall_until = self.stall_until.max(now) + prefill;
            let v0 = self.v;
            let first_step = self.step(self.running.len() + 1) * (1.0 + self.jitter());
            let first = self.stall_until + Duration::from_secs_f64(first_step.max(0.0));
            let pace = match job.seed {
                Some(seed) => pace(self.timing.speed_spread, &mut SmallRng::seed_from_u64(seed)),
                None => pace(self.timing.speed_spread, &mut self.rng),
            };
            let key = self.running.insert(Running {
                v0,
                pace,
                emitted: 0,
                max_tokens: job.max_tokens,
                tokens: job.tokens,
            });
            self.firsts.push(Reverse((first, key)));
            self.stats.admitted.fetch_add(1, AtomicOrdering::Relaxed);
        }
    }

    fn jitter(&mut self) -> f64 {
        let j = self.timing.jitter;
        if j > 0.0 {
            self.rng.random_range(-j..=j)
        } else {
            0.0
        }
    }

    fn publish(&self) {
        if let Some(seat) = &self.seat {
            let running = self.running.len();
            seat.publish(if running == 0 {
                0.0
            } else {
                self.timing.step(running)
            });
        }
        self.stats
            .running
            .store(self.running.len() as u64, AtomicOrdering::Relaxed);
        self.stats
            .queued
            .store(self.waiting.len() as u64, AtomicOrdering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(base_ms: f64, per_seq_ms: f64, max_batch: usize) -> Timing {
        Timing {
            step_base: base_ms / 1e3,
            step_per_seq: per_seq_ms / 1e3,
            step_per_seq_until: usize::MAX,
            max_batch,
            prefill_tokens_per_s: 1000.0,
            prefill_stall: 0.0,
            speed_spread: 0.0,
            jitter: 0.0,
            extra_ttft: Duration::ZERO,
            default_max_tokens: 16,
            reply_tokens: None,
            tool_call_share: 1.0,
        }
    }

    /// Token arrival times of one request, relative to `start`.
    async fn arrivals(mut rx: TokenRx, start: Instant) -> Vec<f64> {
        let mut out = Vec::new();
        while rx.recv().await.is_some() {
            out.push((Instant::now() - start).as_secs_f64());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn lone_request_gets_prefill_then_one_step_per_token() {
        let engine = Engine::spawn(timing(10.0, 2.0, 8), None);
        let start = Instant::now();
        let times = arrivals(engine.submit(100, 5), start).await;
        // prefill 100 tokens at 1000/s = 100 ms, then steps of 12 ms.
        let want = [0.112, 0.124, 0.136, 0.148, 0.160];
        assert_eq!(times.len(), 5);
        for (got, want) in times.iter().zip(want) {
            assert!((got - want).abs() < 0.0011, "{times:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn batch_of_four_decodes_at_the_four_way_step() {
        let engine = Engine::spawn(timing(10.0, 2.0, 8), None);
        let start = Instant::now();
        let rxs: Vec<_> = (0..4).map(|_| engine.submit(0, 50)).collect();
        let all =
            futures_util::future::join_all(rxs.into_iter().map(|rx| arrivals(rx, start))).await;
        for times in all {
            let tpot = (times[49] - times[0]) / 49.0;
            assert!((tpot - 0.018).abs() < 1e-4, "tpot {tpot}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_max_batch_wait_in_fifo_order() {
        let engine = Engine::spawn(timing(10.0, 0.0, 1), None);
        let start = Instant::now();
        let rxs: Vec<_> = (0..3).map(|_| engine.submit(0, 10)).collect();
        let all =
            futures_util::future::join_all(rxs.into_iter().map(|rx| arrivals(rx, start))).await;
        let firsts: Vec<f64> = all.iter().map(|t| t[0]).collect();
        // Each waits for the ones ahead: 10 tokens of 10 ms each.
        for (i, first) in firsts.iter().enumerate() {
            let want = 0.010 + 0.100 * i as f64;
            assert!((first - want).abs() < 0.0015, "{firsts:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_stream_cancels_the_request() {
        let engine = Engine::spawn(timing(10.0, 0.0, 1), None);
        let rx = engine.submit(0, 1000);
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(rx);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = engine.stats();
        assert_eq!((stats.running, stats.cancelled), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn retime_changes_speed_from_that_moment() {
        let engine = Engine::spawn(timing(10.0, 0.0, 8), None);
        let start = Instant::now();
        let rx = engine.submit(0, 20);
        let handle = tokio::spawn(arrivals(rx, start));
        tokio::time::sleep(Duration::from_millis(105)).await;
        engine.retime(timing(20.0, 0.0, 8));
        let times = handle.await.unwrap();
        let early = times[5] - times[4];
        let late = times[19] - times[18];
        assert!(
            (early - 0.010).abs() < 0.0011 && (late - 0.020).abs() < 0.0011,
            "{times:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_moves_tokens_but_not_the_mean_rate() {
        let mut jittery = timing(10.0, 0.0, 8);
        jittery.jitter = 0.4;
        let engine = Engine::spawn(jittery, None);
        let times = arrivals(engine.submit(0, 201), Instant::now()).await;
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let spread = gaps.iter().copied().fold(0.0_f64, f64::max)
            - gaps.iter().copied().fold(1.0_f64, f64::min);
        assert!(spread > 0.004, "gaps should vary: spread {spread}");
        let tpot = (times[200] - times[0]) / 200.0;
        assert!((tpot - 0.010).abs() < 0.0001, "mean TPOT {tpot}");
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_speed_spread_requests_of_one_batch_decode_at_speeds_of_their_own() {
        let mut spread = timing(10.0, 0.0, 256);
        spread.speed_spread = 0.3;
        let engine = Engine::spawn(spread, None);
        let start = Instant::now();
        let rxs: Vec<_> = (0..200).map(|_| engine.submit(0, 41)).collect();
        let all =
            futures_util::future::join_all(rxs.into_iter().map(|rx| arrivals(rx, start))).await;
        let mut tps: Vec<f64> = all.iter().map(|t| 40.0 / (t[40] - t[0])).collect();
        tps.sort_by(f64::total_cmp);
        // 100 tok/s at the median; the 10th percentile about 70 (200 draws: within five
        // standard errors).
        let (p10, p50) = (tps[20], tps[100]);
        assert!((85.0..=118.0).contains(&p50), "{tps:?}");
        assert!((0.55..=0.85).contains(&(p10 / p50)), "{tps:?}");
        // The first token is one step after admission, whatever the request's own speed.
        assert!(all.iter().all(|t| (t[0] - 0.010).abs() < 0.0011));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_names_a_seed_decodes_at_the_same_speed_on_every_run() {
        let mut spread = timing(10.0, 0.0, 256);
        spread.speed_spread = 0.3;
        let speeds = |seeds: [u64; 8]| {
            let engine = Engine::spawn(spread.clone(), None);
            async move {
                let start = Instant::now();
                let rxs: Vec<_> = seeds
                    .iter()
                    .map(|&s| engine.submit_after(Duration::ZERO, 0, 11, Some(s)))
                    .collect();
                let all =
                    futures_util::future::join_all(rxs.into_iter().map(|rx| arrivals(rx, start)))
                        .await;
                all.iter()
                    .map(|t| 10.0 / (t[10] - t[0]))
                    .collect::<Vec<f64>>()
            }
        };
        let seeds = [1, 2, 3, 4, 5, 6, 7, 8];
        let (first, again) = (speeds(seeds).await, speeds(seeds).await);
        for (a, b) in first.iter().zip(&again) {
            assert!((a - b).abs() < 1e-6 * a, "{first:?} {again:?}");
        }
        // Each seed its own speed: the draws are spread, not one for all.
        let (slowest, fastest) = first
            .iter()
            .fold((f64::MAX, 0.0_f64), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        assert!(fastest > 1.1 * slowest, "{first:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn each_admission_stalls_the_batch_for_its_forward_pass() {
        let mut stalling = timing(10.0, 0.0, 8);
        stalling.prefill_stall = 0.050;
        let engine = Engine::spawn(stalling, None);
        let start = Instant::now();
        let first = tokio::spawn(arrivals(engine.submit(0, 20), start));
        tokio::time::sleep(Duration::from_millis(105)).await;
        // A second request joins: the first one's next token waits 50 ms longer.
        let second = tokio::spawn(arrivals(engine.submit(0, 2), start));
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        let gaps: Vec<f64> = first.windows(2).map(|w| w[1] - w[0]).collect();
        let longest = gaps.iter().copied().fold(0.0_f64, f64::max);
        assert!((longest - 0.060).abs() < 0.0015, "{gaps:?}");
        // Its own first token comes after its own stall and a step.
        assert!(
            (second[0] - (0.105 + 0.050 + 0.010)).abs() < 0.0015,
            "{second:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_admitted_later_stalls_an_earlier_ones_decode_but_not_its_first_token() {
        let engine = Engine::spawn(timing(10.0, 0.0, 8), None);
        let start = Instant::now();
        // 200 ms of prefill, then a 500 ms one admitted while it runs.
        let early = tokio::spawn(arrivals(engine.submit(200, 3), start));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let late = tokio::spawn(arrivals(engine.submit(500, 2), start));
        let (early, late) = (early.await.unwrap(), late.await.unwrap());
        // Its first token at the end of its own prefill and a step; its next once the later
        // prefill (200 .. 700 ms) is done, a step later.
        let want = [0.210, 0.710, 0.720];
        for (got, want) in early.iter().zip(want) {
            assert!((got - want).abs() < 0.0015, "{early:?}");
        }
        // The later one's first token: after both prefills, back to back, and a step.
        assert!((late[0] - 0.710).abs() < 0.0015, "{late:?}");
    }

    /// Gaps between a request's tokens, ms.
    async fn gaps_ms(mut rx: TokenRx) -> Vec<f64> {
        let mut times = Vec::new();
        while rx.recv().await.is_some() {
            times.push(Instant::now());
        }
        times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn engines_on_one_device_wait_for_each_others_steps() {
        let device = SharedDevice::new(2);
        let batching = Engine::spawn(timing(10.0, 1.0, 8), Some(device.seat(0)));
        let serial = Engine::spawn(timing(8.0, 0.0, 1), Some(device.seat(1)));
        // Alone on the device, the batching engine's lone request takes 11 ms a token.
        let alone = gaps_ms(batching.submit(0, 11)).await;
        assert!(alone.iter().all(|g| (g - 11.0).abs() < 1.01), "{alone:?}");
        // With the serial engine decoding beside it, 11 + 8 ms; and the serial's 8 + 11.
        let (beside, other) = tokio::join!(
            gaps_ms(batching.submit(0, 21)),
            gaps_ms(serial.submit(0, 21))
        );
        let steady = |g: &[f64]| g[2..g.len() - 2].iter().sum::<f64>() / (g.len() - 4) as f64;
        assert!((steady(&beside) - 19.0).abs() < 1.0, "{beside:?}");
        assert!((steady(&other) - 19.0).abs() < 1.0, "{other:?}");
        // An engine on a device of its own is not slowed.
        let apart = Engine::spawn(timing(10.0, 1.0, 8), None);
        let busy = serial.submit(0, 50);
        let own = gaps_ms(apart.submit(0, 11)).await;
        assert!(own.iter().all(|g| (g - 11.0).abs() < 1.01), "{own:?}");
        drop(busy);
    }
}
