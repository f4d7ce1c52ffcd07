//! The streams on one backend that have a speed target, each with how far it is from missing
//! it, and what one more prompt's prefill would cost them.
//!
//! A curve says what a request at a level sees on average. It cannot say that *this* prompt,
//! 7,000 tokens long, would stall for most of a second the three short answers decoding there,
//! each a few tokens from its end and with a tenth of a second to spare: on an engine that
//! prefills a prompt whole between decode steps (vLLM without chunked prefill, `transformers
//! serve`), every stream decoding beside a prefill waits for it. The gateway times every
//! stream's tokens, so it knows each one's spare time: how much longer than its pace so far its
//! remaining tokens may take and still meet its class's `min_tps`. And it learns how long a
//! prefill stalls the streams beside it, per prompt token, from the streams themselves: their
//! time per token against the prefill that ran beside them (nothing on an engine whose
//! prefill stalls nobody, such as a hosted API, where this costs nothing). An engine that
//! serves one request at a time runs a newcomer's prefill after the streams there: its first
//! tokens come while others wait and never beside a decoding stream, and it is charged nothing.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::curve::Spread;

/// One stream with a speed target: what the router reads of its progress, written per content
/// event with two relaxed stores.
#[derive(Debug)]
pub(crate) struct Pace {
    /// Output tokens it is expected to stream (`max_tokens`).
    tokens: u32,
    /// Seconds from its first token to its last that still meet its target:
    /// `(tokens - 1) / min_tps`.
    allowed_s: f64,
    /// Microseconds after the registry's epoch of its first and latest content events
    /// (`u64::MAX`: none yet).
    first_us: AtomicU64,
    last_us: AtomicU64,
    /// Tokens streamed so far: its content events, at the tokens its backend's events carry.
    streamed: AtomicU32,
    /// The registry's prefill count when its first token came.
    prefilled_at_first: AtomicU64,
}

/// How likely `remaining` tokens are to stream within `left` seconds at a speed drawn from
/// `speed` (without one, in no time).
fn within(speed: Option<&Spread>, remaining: f64, left: f64) -> f64 {
    if left < 0.0 {
        0.0
    } else if remaining <= 0.0 {
        1.0
    } else {
        speed.map_or(1.0, |s| s.share_above(remaining / left))
    }
}

impl Pace {
    /// Its tokens still to come, and the seconds they have left to meet its target at `now_us`
    /// (the registry's clock) with `ahead` seconds of prefill due first (a stream still waiting
    /// for its first token has its whole allowance: its own prefill runs before).
    fn due(&self, now_us: u64, ahead: f64) -> (f64, f64) {
        let streamed = self.streamed.load(Ordering::Relaxed);
        let remaining = f64::from(self.tokens.saturating_sub(streamed.max(1)));
        let first = self.first_us.load(Ordering::Relaxed);
        let left = if first == u64::MAX {
            self.allowed_s
        } else {
            self.allowed_s - now_us.saturating_sub(first) as f64 / 1e6 - ahead
        };
        (remaining, left)
    }

    /// `streamed` tokens so far, the latest at `now` (the first of them its first token).
    pub(crate) fn progress(&self, paces: &Paces, streamed: u32, now: Instant) {
        let us = paces.micros(now);
        if self.first_us.load(Ordering::Relaxed) == u64::MAX {
            self.first_us.store(us, Ordering::Relaxed);
            self.prefilled_at_first
                .store(paces.prefilled.load(Ordering::Relaxed), Ordering::Relaxed);
            paces.decoding.fetch_add(1, Ordering::Relaxed);
        }
        self.last_us.store(us, Ordering::Relaxed);
        self.streamed.store(streamed, Ordering::Relaxed);
    }
}

/// A least-squares plane `speed = a + c · requests in flight + d · prompt tokens prefilled
/// beside it per second` over the streams that ended, older ones fading ([`FADE`]). Where a
/// prefill stalls the streams beside it for `s` seconds a token, a stream beside `r` tokens a
/// second of it is stalled `s · r` of its time, and streams at `v0` alone at `v0 · (1 − s · r)`:
/// `s = −d / v0`. By the rate and the speed, not by the tokens beside a stream and its time per
/// token: a stream that is slow for its own reasons (its draw of the engine's spread) stays
/// longer and sees more prefill beside it, which would read as a stall. The requests in flight
/// are there because, on a batching engine, more of them mean both more prefill beside a
/// stream and a slower step for it.
#[derive(Debug, Default, Clone, Copy)]
struct StallFit {
    w: f64,
    r: f64,
    n: f64,
    v: f64,
    rr: f64,
    nn: f64,
    rn: f64,
    rv: f64,
    nv: f64,
    /// Streams that had prefill run beside them, faded the same way.
    beside: f64,
    /// First tokens that came while other requests here waited for theirs and no stream was
    /// decoding, and those that came while one was, each faded by [`FADE`] per first token:
    /// an engine that serves one request at a time shows only the first kind.
    apart: f64,
    overlapped: f64,
}

/// Weight each earlier stream keeps when one more ends: about the last hundred count.
const FADE: f64 = 0.99;

/// Streams with prefill beside them before the slope is believed.
const MIN_BESIDE: f64 = 4.0;

impl StallFit {
    /// A stream with `r` prompt tokens a second prefilled beside it, `n` requests in flight on
    /// average, at `v` tokens a second.
    fn add(&mut self, r: f64, n: f64, v: f64) {
        let f = |s: f64, x: f64| s * FADE + x;
        self.w = f(self.w, 1.0);
        self.r = f(self.r, r);
        self.n = f(self.n, n);
        self.v = f(self.v, v);
        self.rr = f(self.rr, r * r);
        self.nn = f(self.nn, n * n);
        self.rn = f(self.rn, r * n);
        self.rv = f(self.rv, r * v);
        self.nv = f(self.nv, n * v);
        self.beside = f(self.beside, if r > 0.0 { 1.0 } else { 0.0 });
    }

    /// A first token came with others waiting for theirs, or with a stream decoding beside
    /// it.
    fn first_token(&mut self, others_waiting: bool, decoding: bool) {
        self.apart = self.apart * FADE + f64::from(u8::from(others_waiting && !decoding));
        self.overlapped = self.overlapped * FADE + f64::from(u8::from(decoding));
    }

    /// Seconds a stream waits per prompt token prefilled beside it, once enough streams had
    /// prefill beside them to tell (never below 0). Where the load never moved, the line
    /// through the prefill rate alone. An engine whose first tokens come while others wait and
    /// (next to never) while a stream decodes serves one request at a time: a newcomer's
    /// prefill runs after the streams there and stalls none of them.
    fn stall_s_per_token(&self) -> Option<f64> {
        if self.apart >= MIN_BESIDE && self.overlapped * 10.0 < self.apart {
            return Some(0.0);
        }
        if self.beside < MIN_BESIDE {
            return None;
        }
        // Sums of squares and products about the means, times the weight.
        let centred = |a: f64, b: f64, ab: f64| self.w * ab - a * b;
        let srr = centred(self.r, self.r, self.rr);
        let snn = centred(self.n, self.n, self.nn);
        let srn = centred(self.r, self.n, self.rn);
        let srv = centred(self.r, self.v, self.rv);
        let snv = centred(self.n, self.v, self.nv);
        if srr <= 0.0 {
            return None;
        }
        let det = srr * snn - srn * srn;
        let d = if det > 1e-9 * srr * snn.max(f64::MIN_POSITIVE) {
            (srv * snn - snv * srn) / det
        } else {
            srv / srr
        };
        // The speed at the mean load with no prefill beside.
        let alone = (self.v - d * self.r) / self.w;
        (alone > 0.0).then(|| (-d / alone).max(0.0))
    }
}

/// The streams with a speed target on one backend (see the module doc).
#[derive(Debug)]
pub struct Paces {
    streams: Mutex<Vec<Arc<Pace>>>,
    /// Uncached prompt tokens whose first token has come, since start.
    prefilled: AtomicU64,
    /// Streams past their first token and not yet ended.
    decoding: AtomicU32,
    fit: Mutex<StallFit>,
    /// The fit's stall per prompt token as of its last change (f64 bits; NaN while it has
    /// none): read per candidate of every decision, without the fit's lock.
    stall: AtomicU64,
    /// The least first-token time per uncached prompt token of a long prompt sent to an idle
    /// backend (f64 bits; infinity before one): its prefill's time per token, or a little more.
    alone_s_per_token: AtomicU64,
    epoch: Instant,
}

/// Uncached prompt tokens from which a lone request's first token is mostly its prefill.
const LONG_PROMPT: u64 = 512;

impl Default for Paces {
    fn default() -> Self {
        Self {
            streams: Mutex::default(),
            prefilled: AtomicU64::new(0),
            decoding: AtomicU32::new(0),
            fit: Mutex::default(),
            stall: AtomicU64::new(f64::NAN.to_bits()),
            alone_s_per_token: AtomicU64::new(f64::INFINITY.to_bits()),
            epoch: Instant::now(),
        }
    }
}

impl Paces {
    fn micros(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// A stream of `tokens` output tokens, held to `min_tps` if it has a speed target (one
    /// without still teaches the stall per prompt token), from now on.
    pub(crate) fn start(&self, tokens: u32, min_tps: Option<f64>) -> Arc<Pace> {
        let pace = Arc::new(Pace {
            tokens,
            allowed_s: min_tps
                .filter(|m| *m > 0.0)
                .map_or(f64::INFINITY, |m| f64::from(tokens.saturating_sub(1)) / m),
            first_us: AtomicU64::new(u64::MAX),
            last_us: AtomicU64::new(u64::MAX),
            streamed: AtomicU32::new(0),
            prefilled_at_first: AtomicU64::new(0),
        });
        self.lock_streams().push(Arc::clone(&pace));
        pace
    }

    /// The stream ended, with `in_flight` requests on the backend on average since its first
    /// token: it leaves, and its time per token against the prefill that ran beside it
    /// teaches the stall per prompt token.
    pub(crate) fn end(&self, pace: &Arc<Pace>, in_flight: f64) {
        {
            let mut streams = self.lock_streams();
            if let Some(i) = streams.iter().position(|p| Arc::ptr_eq(p, pace)) {
                streams.swap_remove(i);
            }
        }
        let streamed = pace.streamed.load(Ordering::Relaxed);
        let (first, last) = (
            pace.first_us.load(Ordering::Relaxed),
            pace.last_us.load(Ordering::Relaxed),
        );
        if first != u64::MAX {
            self.decoding.fetch_sub(1, Ordering::Relaxed);
        }
        if streamed < 4 || first == u64::MAX || last <= first {
            return;
        }
        let beside = self
            .prefilled
            .load(Ordering::Relaxed)
            .saturating_sub(pace.prefilled_at_first.load(Ordering::Relaxed));
        let decode_s = (last - first) as f64 / 1e6;
        self.teach(|fit| {
            fit.add(
                beside as f64 / decode_s,
                in_flight,
                f64::from(streamed - 1) / decode_s,
            );
        });
    }

    /// A request's first token came, after `tokens` of uncached prompt were prefilled, with
    /// `others_waiting` for theirs here or not (read before its stream counts as decoding).
    pub(crate) fn first_token(&self, tokens: u64, others_waiting: bool) {
        self.prefilled.fetch_add(tokens, Ordering::Relaxed);
        let decoding = self.decoding.load(Ordering::Relaxed) > 0;
        if others_waiting || decoding {
            self.teach(|fit| fit.first_token(others_waiting, decoding));
        }
    }

    /// A request sent to this backend while it was idle had its first token `ttft_s` later,
    /// after prefilling `tokens` of its prompt.
    pub(crate) fn alone(&self, ttft_s: f64, tokens: u64) {
        if tokens < LONG_PROMPT || ttft_s.is_nan() || ttft_s <= 0.0 {
            return;
        }
        let per_token = ttft_s / tokens as f64;
        let _ = self
            .alone_s_per_token
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                (per_token < f64::from_bits(bits)).then_some(per_token.to_bits())
            });
    }

    /// Seconds a stream here waits per prompt token prefilled beside it, once learned.
    pub(crate) fn stall_s_per_token(&self) -> Option<f64> {
        Some(f64::from_bits(self.stall.load(Ordering::Relaxed))).filter(|s| !s.is_nan())
    }

    /// What prefilling `prompt_tokens` here, after `ahead_tokens` already due, would cost the
    /// streams here at `now`: the good completions they lose between them. A stream meets its
    /// target where its remaining tokens fit in the time it has left (its target's time less
    /// what has passed since its first token and the prefill ahead), at a speed drawn from
    /// `speed` (the level's spread; without one, in no time); the prompt's prefill takes its
    /// stall off that time. A stream still waiting for its first token is stalled by this
    /// prompt alone (its own prefill runs before). Until the streams here have told the stall
    /// per prompt token, a prefill is taken to stall every stream beside it for its whole
    /// length: `unlearned` (the backend's prefill time per token), else a long prompt's first
    /// token time per token on the idle backend.
    pub(crate) fn stall_loss(
        &self,
        now: Instant,
        speed: Option<&Spread>,
        prompt_tokens: u64,
        ahead_tokens: u64,
        unlearned: Option<f64>,
    ) -> f64 {
        let alone = Some(f64::from_bits(
            self.alone_s_per_token.load(Ordering::Relaxed),
        ))
        .filter(|s| s.is_finite());
        let Some(per_token) = self
            .stall_s_per_token()
            .or(unlearned)
            .or(alone)
            .filter(|s| *s > 0.0)
        else {
            return 0.0;
        };
        let this = per_token * prompt_tokens as f64;
        let ahead = per_token * ahead_tokens as f64;
        let now_us = self.micros(now);
        // A stream that needs less than the slowest speed of the spread even after the stall
        // meets its target either way, and costs nothing: skipped without reading the spread
        // (most streams, most of the time).
        let surely = speed.map_or(f64::INFINITY, Spread::surely_above);
        self.lock_streams()
            .iter()
            .filter_map(|p| {
                let (remaining, left) = p.due(now_us, ahead);
                let after = left - this;
                if after >= 0.0 && (remaining <= 0.0 || remaining / after < surely) {
                    return None;
                }
                Some(within(speed, remaining, left) - within(speed, remaining, after))
            })
            .sum()
    }

    /// Changes the fit, and the stall per token read from it.
    fn teach(&self, change: impl FnOnce(&mut StallFit)) {
        let mut fit = self
            .fit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut fit);
        let stall = fit.stall_s_per_token().unwrap_or(f64::NAN);
        self.stall.store(stall.to_bits(), Ordering::Relaxed);
    }

    fn lock_streams(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Pace>>> {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stall's cost read over every stream, none skipped: what `stall_loss` must equal.
    fn every_stream(paces: &Paces, now: Instant, speed: &Spread, this: f64, ahead: f64) -> f64 {
        let now_us = paces.micros(now);
        paces
            .lock_streams()
            .iter()
            .map(|p| {
                let (remaining, left) = p.due(now_us, ahead);
                within(Some(speed), remaining, left) - within(Some(speed), remaining, left - this)
            })
            .sum()
    }

    proptest::proptest! {
        #[test]
        fn skipping_the_streams_with_spare_to_the_spread_s_floor_changes_no_loss(
            streams in proptest::collection::vec(
                (1u32..400, proptest::option::of(1.0f64..200.0), 0u32..400, 0u64..20_000),
                0..24,
            ),
            median in 1.0f64..300.0,
            ratio in 0.05f64..1.0,
            prompt in 0u64..20_000,
            ahead in 0u64..20_000,
        ) {
            let paces = Paces::default();
            let start = paces.epoch;
            let mut held = Vec::new();
            for (tokens, min_tps, events, first_ms) in streams {
                let pace = paces.start(tokens, min_tps);
                if events > 0 {
                    pace.progress(&paces, events, start + std::time::Duration::from_millis(first_ms));
                }
                held.push(pace);
            }
            let now = start + std::time::Duration::from_secs(5);
            let speed = Spread::log_normal(median, 0.1, ratio);
            let per_token = 1e-4;
            let loss = paces.stall_loss(now, Some(&speed), prompt, ahead, Some(per_token));
            let all = every_stream(&paces, now, &speed, per_token * prompt as f64, per_token * ahead as f64);
            proptest::prop_assert_eq!(loss, all);
        }
    }

    #[test]
    fn a_prefill_costs_the_streams_it_pushes_past_their_spare_and_not_those_already_past_it() {
        let paces = Paces::default();
        let now = Instant::now();
        // 11 tokens at 25 tok/s: 0.4 s for the last ten, which take 0.1 s at 100 tok/s: 0.3 s
        // to spare, whether decoding (one token out now) or still waiting for its first.
        let decoding = paces.start(11, Some(25.0));
        decoding.progress(&paces, 1, now);
        let _waiting = paces.start(11, Some(25.0));
        // Seconds to spare, and no target at all.
        let long = paces.start(101, Some(25.0));
        long.progress(&paces, 1, now);
        let _batch = paces.start(11, None);
        let exactly = Spread::log_normal(100.0, 0.1, 1.0);
        let per_token = Some(1e-4);
        let loss = |prompt, ahead| paces.stall_loss(now, Some(&exactly), prompt, ahead, per_token);
        assert_eq!(loss(1500, 0), 0.0, "0.15 s: everyone keeps the target");
        assert_eq!(loss(4000, 0), 2.0, "0.4 s: both short answers miss");
        // 0.15 s of prefill due first leaves the decoding one 0.15 s; the waiting one
        // prefills before this prompt, whatever is ahead.
        assert_eq!(loss(2000, 1500), 1.0);
        assert_eq!(
            loss(1000, 4000),
            0.0,
            "the prefill ahead breaks it already: this one costs nothing more"
        );
        assert_eq!(
            paces.stall_loss(now, Some(&exactly), 4000, 0, None),
            0.0,
            "nothing known of the stall: nothing charged"
        );
        // Speeds that spread: a stall takes a share of a stream's chance, not all or nothing.
        let spread = Spread::log_normal(100.0, 0.1, 0.7);
        let partial = paces.stall_loss(now, Some(&spread), 3000, 0, per_token);
        assert!(partial > 0.0 && partial < 2.0, "{partial}");
        // A long prompt sent to the idle backend tells the stall's size until streams do.
        paces.alone(0.11, 1000);
        assert_eq!(paces.stall_loss(now, Some(&exactly), 4000, 0, None), 2.0);
    }

    #[test]
    fn an_engine_that_serves_one_request_at_a_time_is_not_charged_for_a_newcomer_s_prefill() {
        let exactly = Spread::log_normal(100.0, 0.1, 1.0);
        let per_token = Some(1e-4);
        // One stream a few tokens from its target's edge, and one waiting behind it.
        let loaded = |paces: &Paces, now: Instant| {
            let decoding = paces.start(11, Some(25.0));
            decoding.progress(paces, 1, now);
            let waiting = paces.start(11, Some(25.0));
            (decoding, waiting)
        };
        let now = Instant::now();
        let unknown = Paces::default();
        let _there = loaded(&unknown, now);
        assert_eq!(
            unknown.stall_loss(now, Some(&exactly), 4000, 0, per_token),
            2.0,
            "nothing known of the engine: it is taken to prefill beside its streams"
        );
        // Every first token so far came while others waited and none decoded: the engine runs
        // a prompt after the streams there, not beside them.
        let serial = Paces::default();
        for _ in 0..8 {
            serial.first_token(64, true);
        }
        assert_eq!(serial.stall_s_per_token(), Some(0.0));
        let _there = loaded(&serial, now);
        assert_eq!(
            serial.stall_loss(now, Some(&exactly), 4000, 0, per_token),
            0.0
        );
        // First tokens beside a decoding stream: it batches after all.
        for _ in 0..4 {
            serial.first_token(64, false);
        }
        assert_eq!(
            serial.stall_loss(now, Some(&exactly), 4000, 0, per_token),
            2.0
        );
    }
}
