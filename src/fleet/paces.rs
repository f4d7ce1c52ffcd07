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
//! prefill stalls nobody, such as a hosted API, where this costs nothing).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

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
    /// Content events so far.
    events: AtomicU32,
    /// The registry's prefill count when its first token came.
    prefilled_at_first: AtomicU64,
}

impl Pace {
    /// `n` content events so far, the latest at `now` (the first of them its first token).
    pub(crate) fn progress(&self, paces: &Paces, events: u32, now: Instant) {
        let us = paces.micros(now);
        if self.first_us.load(Ordering::Relaxed) == u64::MAX {
            self.first_us.store(us, Ordering::Relaxed);
            self.prefilled_at_first
                .store(paces.prefilled.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.last_us.store(us, Ordering::Relaxed);
        self.events.store(events, Ordering::Relaxed);
    }
}

/// A least-squares line `seconds per output token = a + stall · prefill tokens per output
/// token` over the streams that ended, older ones fading ([`FADE`]).
#[derive(Debug, Default, Clone, Copy)]
struct StallFit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// Streams that had prefill run beside them, faded the same way.
    beside: f64,
}

/// Weight each earlier stream keeps when one more ends: about the last hundred count.
const FADE: f64 = 0.99;

/// Streams with prefill beside them before the slope is believed.
const MIN_BESIDE: f64 = 4.0;

impl StallFit {
    fn add(&mut self, x: f64, y: f64) {
        let f = |s: f64, v: f64| s * FADE + v;
        self.w = f(self.w, 1.0);
        self.x = f(self.x, x);
        self.y = f(self.y, y);
        self.xx = f(self.xx, x * x);
        self.xy = f(self.xy, x * y);
        self.beside = f(self.beside, if x > 0.0 { 1.0 } else { 0.0 });
    }

    /// Seconds a stream waits per prompt token prefilled beside it, once enough streams had
    /// prefill beside them to tell (never below 0).
    fn stall_s_per_token(&self) -> Option<f64> {
        if self.beside < MIN_BESIDE {
            return None;
        }
        let var = self.w * self.xx - self.x * self.x;
        (var > 0.0).then(|| ((self.w * self.xy - self.x * self.y) / var).max(0.0))
    }
}

/// The streams with a speed target on one backend (see the module doc).
#[derive(Debug)]
pub struct Paces {
    streams: Mutex<Vec<Arc<Pace>>>,
    /// Uncached prompt tokens whose first token has come, since start.
    prefilled: AtomicU64,
    fit: Mutex<StallFit>,
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
            fit: Mutex::default(),
            alone_s_per_token: AtomicU64::new(f64::INFINITY.to_bits()),
            epoch: Instant::now(),
        }
    }
}

/// What a prompt's prefill would cost the streams on a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Stall {
    /// Streams still on their target that it would push below it.
    pub broken: u32,
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
            events: AtomicU32::new(0),
            prefilled_at_first: AtomicU64::new(0),
        });
        self.lock_streams().push(Arc::clone(&pace));
        pace
    }

    /// The stream ended: it leaves, and its time per token against the prefill that ran beside
    /// it teaches the stall per prompt token.
    pub(crate) fn end(&self, pace: &Arc<Pace>) {
        {
            let mut streams = self.lock_streams();
            if let Some(i) = streams.iter().position(|p| Arc::ptr_eq(p, pace)) {
                streams.swap_remove(i);
            }
        }
        let events = pace.events.load(Ordering::Relaxed);
        let (first, last) = (
            pace.first_us.load(Ordering::Relaxed),
            pace.last_us.load(Ordering::Relaxed),
        );
        if events < 4 || first == u64::MAX || last <= first {
            return;
        }
        let per = f64::from(events - 1);
        let beside = self
            .prefilled
            .load(Ordering::Relaxed)
            .saturating_sub(pace.prefilled_at_first.load(Ordering::Relaxed));
        let decode_s = (last - first) as f64 / 1e6;
        self.fit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(beside as f64 / per, decode_s / per);
    }

    /// `tokens` of uncached prompt were prefilled (a request's first token came).
    pub(crate) fn prefilled(&self, tokens: u64) {
        self.prefilled.fetch_add(tokens, Ordering::Relaxed);
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
        self.fit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stall_s_per_token()
    }

    /// What prefilling `prompt_tokens` here, after `ahead_tokens` already due, would cost the
    /// streams here at `now`, each expected to stream its remaining tokens at `tps` (in no
    /// time where nothing is predicted): those
    /// that would still meet their target after the prefill ahead and would not after this
    /// one too. A stream still waiting for its first token is stalled by this prompt alone
    /// (its own prefill runs before). Until the streams here have told the stall per prompt
    /// token, a prefill is taken to stall every stream beside it for its whole length:
    /// `unlearned` (the backend's prefill time per token), else a long prompt's first token
    /// time per token on the idle backend.
    pub(crate) fn stall(
        &self,
        now: Instant,
        tps: Option<f64>,
        prompt_tokens: u64,
        ahead_tokens: u64,
        unlearned: Option<f64>,
    ) -> Stall {
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
            return Stall::default();
        };
        let this = per_token * prompt_tokens as f64;
        let ahead = per_token * ahead_tokens as f64;
        let now_us = self.micros(now);
        let broken = self
            .lock_streams()
            .iter()
            .filter(|p| {
                let events = p.events.load(Ordering::Relaxed);
                let remaining = tps.filter(|t| *t > 0.0).map_or(0.0, |t| {
                    f64::from(p.tokens.saturating_sub(events.max(1))) / t
                });
                let first = p.first_us.load(Ordering::Relaxed);
                let spare = if first == u64::MAX {
                    p.allowed_s - remaining
                } else {
                    let since = now_us.saturating_sub(first) as f64 / 1e6;
                    p.allowed_s - since - remaining - ahead
                };
                (0.0..this).contains(&spare)
            })
            .count();
        Stall {
            broken: u32::try_from(broken).unwrap_or(u32::MAX),
        }
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

    #[test]
    fn a_prefill_breaks_the_streams_it_pushes_past_their_spare_and_not_those_already_past_it() {
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
        let per_token = Some(1e-4);
        let broken = |prompt, ahead| {
            paces
                .stall(now, Some(100.0), prompt, ahead, per_token)
                .broken
        };
        assert_eq!(broken(2000, 0), 0, "0.2 s: everyone keeps the target");
        assert_eq!(broken(4000, 0), 2, "0.4 s: both short answers miss");
        // 0.2 s of prefill due first leaves the decoding one 0.1 s; the waiting one prefills
        // before this prompt, whatever is ahead.
        assert_eq!(broken(2000, 2000), 1);
        assert_eq!(
            broken(1000, 4000),
            0,
            "the prefill ahead breaks it already: this one costs nothing more"
        );
        assert_eq!(
            paces.stall(now, Some(100.0), 4000, 0, None).broken,
            0,
            "nothing known of the stall: nothing charged"
        );
        // A long prompt sent to the idle backend tells the stall's size until streams do.
        paces.alone(0.11, 1000);
        assert_eq!(paces.stall(now, Some(100.0), 4000, 0, None).broken, 2);
    }
}
