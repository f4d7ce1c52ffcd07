//! A backend's prefix index: the gateway's estimate of which prompt prefixes the backend's
//! prefix cache holds, learned from what was routed there (here and, in a cluster, by the
//! peers), sized by calibration against the cached tokens the backend reports, and the prefill
//! work it has been sent that has not reached a first token yet.
//!
//! An estimate, not the engine's state: the engine may have evicted what the index still
//! holds (calibration shrinks the index when its reports say so), and a backend that reports
//! nothing is never corrected.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::time::Instant;

use crate::config::PrefixIndexSize;
use crate::prefix::{Calibration, Held, Presence, Report, RequestPrefix};

/// Weight of one request in the hit-rate averages.
const RATE_ALPHA: f64 = 0.02;

/// What a backend is expected to hold of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hit {
    /// Leading prompt tokens expected in its cache.
    pub cached_tokens: u64,
    /// It served the request's conversation before (the hint is held).
    pub hint: bool,
    /// Thousandths of the index's capacity in use: how full the backend's cache is believed
    /// to be, whatever this request finds there.
    pub fill_per_mille: u32,
    /// Blocks the index saw sent here after the last one expected: its LRU stack distance,
    /// which calibration sets against what the backend reports.
    pub depth: Option<u32>,
}

/// One backend's index. Every method takes its lock once, briefly; none awaits. Asked about a
/// prefix none of which it holds (most candidates of most requests), it takes none.
#[derive(Debug)]
pub struct PrefixIndex {
    size: PrefixIndexSize,
    state: Mutex<State>,
    /// Which blocks it may hold, without the lock.
    presence: Presence,
    /// [`Hit::fill_per_mille`] as the last change left it.
    fill_per_mille: std::sync::atomic::AtomicU32,
    /// Uncached prompt tokens of requests sent here that have no first token yet.
    prefill_waiting: AtomicU64,
    /// The backend has reported cached tokens in a usage.
    reports: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct State {
    held: Held,
    calibration: Calibration,
    /// Decayed estimated cached share of routed prompts.
    estimated: CachedShare,
    /// Decayed reported cached share of completed prompts.
    reported: CachedShare,
}

/// A decayed ratio of two token counts.
#[derive(Debug, Clone, Copy, Default)]
struct CachedShare {
    cached: f64,
    prompt: f64,
}

impl CachedShare {
    fn add(&mut self, cached: u64, prompt: u64) {
        self.cached += RATE_ALPHA * (cached as f64 - self.cached);
        self.prompt += RATE_ALPHA * (prompt as f64 - self.prompt);
    }

    fn rate(self) -> Option<f64> {
        (self.prompt > 0.0).then(|| (self.cached / self.prompt).clamp(0.0, 1.0))
    }
}

/// The index as `/admin/backends` and the metrics show it.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct IndexView {
    /// Blocks held now.
    pub blocks: usize,
    /// Blocks held at most: configured, then calibrated.
    pub capacity_blocks: usize,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Recent share of routed prompt tokens the index expected the backend to hold.
    pub estimated_hit_rate: Option<f64>,
    /// Recent share of prompt tokens the backend reported served from its cache.
    pub reported_hit_rate: Option<f64>,
    /// Uncached prompt tokens sent here and not yet at a first token.
    pub prefill_waiting_tokens: u64,
}

impl PrefixIndex {
    /// An empty index of `size`.
    pub fn new(size: PrefixIndexSize) -> Self {
        let held = Held::new(size.blocks, size.ttl);
        Self {
            size,
            presence: held.presence(),
            fill_per_mille: std::sync::atomic::AtomicU32::new(0),
            state: Mutex::new(State {
                held,
                calibration: Calibration::new(size.blocks),
                estimated: CachedShare::default(),
                reported: CachedShare::default(),
            }),
            prefill_waiting: AtomicU64::new(0),
            reports: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The backend has reported cached tokens in a usage (so it will again).
    pub(crate) fn has_reports(&self) -> bool {
        self.reports.load(Ordering::Relaxed)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = f(&mut state);
        let fill = u32::try_from(state.held.len() * 1000 / state.held.capacity().max(1))
            .unwrap_or(u32::MAX);
        self.fill_per_mille.store(fill, Ordering::Relaxed);
        out
    }

    /// What this backend is expected to hold of `prefix` at `now` (nothing is touched).
    pub fn expected(&self, prefix: &RequestPrefix, now: Instant) -> Hit {
        let fill_per_mille = self.fill_per_mille.load(Ordering::Relaxed);
        if !Held::may_hold_any(&self.presence, &prefix.hashes, prefix.hint) {
            return Hit {
                fill_per_mille,
                ..Hit::default()
            };
        }
        self.with(|s| {
            let blocks = s.held.longest(&prefix.hashes, now);
            Hit {
                cached_tokens: blocks as u64 * u64::from(self.size.block_tokens),
                hint: prefix.hint.is_some_and(|h| s.held.longest(&[h], now) == 1),
                fill_per_mille,
                depth: blocks
                    .checked_sub(1)
                    .and_then(|last| s.held.depth(prefix.hashes[last])),
            }
        })
    }

    /// A request with `prefix` was sent here at `now`, expected to find `hit` of its
    /// `prompt_tokens` cached: the backend holds its prefix from now on.
    pub fn routed(&self, prefix: &RequestPrefix, hit: Hit, prompt_tokens: u64, now: Instant) {
        self.with(|s| {
            s.held.insert(prefix.hashes.iter().copied(), now);
            if let Some(h) = prefix.hint {
                s.held.insert(std::iter::once(h), now);
            }
            s.estimated
                .add(hit.cached_tokens.min(prompt_tokens), prompt_tokens);
        });
    }

    /// A peer routed a prompt whose coarse hashes are `hashes` (and hint `hint`) here.
    pub(crate) fn learned(&self, hashes: &[u64], hint: Option<u64>, now: Instant) {
        self.with(|s| {
            s.held.insert(hashes.iter().copied(), now);
            if let Some(h) = hint {
                s.held.insert(std::iter::once(h), now);
            }
        });
    }

    /// A completed request's usage: the backend served `reported` of its `prompt` tokens from
    /// its cache, where the index expected `hit` of the `estimated_prompt` it saw. Reports move
    /// the reported hit rate and calibrate the index's capacity: `Some(blocks)` when this one
    /// changed it.
    pub(crate) fn reported(
        &self,
        hit: Hit,
        estimated_prompt: u64,
        reported: u64,
        prompt: u64,
    ) -> Option<usize> {
        self.reports.store(true, Ordering::Relaxed);
        let report = Report {
            expected: hit.cached_tokens,
            depth: hit.depth,
            estimated_prompt,
            reported,
            prompt,
            block_tokens: self.size.block_tokens,
        };
        self.with(|s| {
            s.reported.add(reported.min(prompt), prompt);
            let blocks = s.calibration.observe(&report, s.held.capacity())?;
            s.held.resize(blocks);
            Some(blocks)
        })
    }

    /// `tokens` of prefill were sent here (uncached prompt tokens of a request admitted now);
    /// what was waiting before them, which they wait behind.
    pub(crate) fn prefill_sent(&self, tokens: u64) -> u64 {
        self.prefill_waiting.fetch_add(tokens, Ordering::Relaxed)
    }

    /// A request's `tokens` of prefill are done (its first token came, or it ended first).
    pub(crate) fn prefill_done(&self, tokens: u64) {
        let _ = self
            .prefill_waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w.saturating_sub(tokens))
            });
    }

    /// Uncached prompt tokens sent here that have no first token yet.
    pub(crate) fn prefill_waiting(&self) -> u64 {
        self.prefill_waiting.load(Ordering::Relaxed)
    }

    /// The index as the admin plane shows it.
    pub(crate) fn view(&self) -> IndexView {
        self.with(|s| IndexView {
            blocks: s.held.len(),
            capacity_blocks: s.held.capacity(),
            block_tokens: self.size.block_tokens,
            estimated_hit_rate: s.estimated.rate(),
            reported_hit_rate: s.reported.rate(),
            prefill_waiting_tokens: self.prefill_waiting(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::prefix::{CALIBRATION_WINDOW, Chain};

    fn index(blocks: usize) -> PrefixIndex {
        PrefixIndex::new(PrefixIndexSize {
            blocks,
            block_tokens: 64,
            ttl: Duration::from_secs(600),
        })
    }

    fn prompt(fill: u8, bytes: usize, hint: Option<&str>) -> RequestPrefix {
        let mut chain = Chain::new(b"m", 256);
        chain.feed(&vec![fill; bytes]);
        RequestPrefix {
            hashes: chain.finish(),
            hint: hint.map(|h| RequestPrefix::hint_hash(b"m", h.as_bytes())),
        }
    }

    #[test]
    fn a_routed_prompt_is_expected_whole_next_time_and_its_hint_with_it() {
        let now = Instant::now();
        let idx = index(1000);
        let first = prompt(1, 8000, Some("conv-1"));
        assert_eq!(idx.expected(&first, now), Hit::default());
        idx.routed(&first, Hit::default(), 2000, now);
        // 8,000 bytes: 31 whole blocks of 256 bytes (64 tokens).
        // 32 of its 1,000 blocks in use: the prompt's 31 and the hint.
        let held = Hit {
            fill_per_mille: 32,
            ..Hit::default()
        };
        assert_eq!(
            idx.expected(&first, now),
            Hit {
                cached_tokens: 31 * 64,
                hint: true,
                // Its last block was touched first: the other 30 and the hint came after.
                depth: Some(31),
                ..held
            }
        );
        let other = prompt(2, 8000, Some("conv-2"));
        assert_eq!(idx.expected(&other, now), held);
    }

    #[test]
    fn an_index_forgets_what_its_backend_reports_it_lost_and_keeps_what_it_still_held() {
        let idx = index(100_000);
        let now = Instant::now();
        let prompts: Vec<_> = (0..20).map(|fill| prompt(fill, 8000, None)).collect();
        for p in &prompts {
            idx.routed(p, Hit::default(), 2000, now);
        }
        assert_eq!(idx.view().blocks, 620);
        // The ten sent first are gone from the backend; the ten after are held.
        let report = |k: usize, reported: u64| {
            let hit = idx.expected(&prompts[k], now);
            assert_eq!(hit.cached_tokens, 31 * 64);
            idx.reported(hit, 2000, reported, 2000);
        };
        for k in 0..CALIBRATION_WINDOW as usize / 2 {
            report(k, 0);
            report(10 + k, 31 * 64);
        }
        let view = idx.view();
        // The tenth held prompt's last block lies 309 deep, the eighth lost one's 402.
        assert!(
            (310..=402).contains(&view.capacity_blocks),
            "between the deepest held and the shallowest lost: {view:?}"
        );
        assert_eq!(idx.expected(&prompts[0], now).cached_tokens, 0);
        assert_eq!(idx.expected(&prompts[19], now).cached_tokens, 31 * 64);
        assert!(view.reported_hit_rate.unwrap() > 0.0);
    }

    #[test]
    fn prefill_waiting_counts_what_was_sent_until_it_is_done() {
        let idx = index(10);
        assert_eq!(idx.prefill_sent(3000), 0, "nothing ahead of the first");
        assert_eq!(
            idx.prefill_sent(500),
            3000,
            "the second waits behind the first"
        );
        idx.prefill_done(3000);
        assert_eq!(idx.prefill_waiting(), 500);
        idx.prefill_done(1000);
        assert_eq!(idx.prefill_waiting(), 0, "never below zero");
    }
}
