//! Prefix caches as chained block hashes: the simulator's truth of what an engine holds and
//! the gateway's estimate of it are the same two pieces.
//!
//! An engine with prefix caching (vLLM's automatic prefix caching, SGLang's radix cache) keeps
//! the KV blocks of prompts it has prefilled, keyed by the hash of the block's tokens chained
//! with the hash of everything before it (vLLM `vllm/v1/core/kv_cache_utils.py`,
//! `hash_block_tokens`). A block's hash therefore stands for the whole prefix up to its end, and
//! a new prompt is served from cache for as many leading blocks as the cache holds.
//!
//! - [`Chain`] cuts a byte stream into fixed-size blocks and hashes each with the previous
//!   block's hash as the seed (rapidhash V3, whose output is specified, so that replicas of different
//!   builds agree). Only whole blocks are hashed: an engine caches whole blocks.
//! - [`Held`] is a bounded LRU of block hashes with an age limit. Blocks are touched last to
//!   first, so a prefix's first block is always at least as recent as any block after it and
//!   eviction takes the tails first (vLLM frees a request's blocks in reverse for the same
//!   reason). What is held is then prefix-closed, and [`Held::longest`] finds the held length
//!   by binary search instead of a walk.
//!
//! Pure: no I/O, time comes in as an argument.

use std::num::NonZeroUsize;
use std::time::Duration;

use lru::LruCache;
use rapidhash::v3::{DEFAULT_RAPID_SECRETS, RapidSecrets, rapidhash_v3, rapidhash_v3_seeded};
use tokio::time::Instant;

#[cfg(test)]
pub(crate) use calibration::{CALIBRATION_WINDOW, MIN_CALIBRATED_BLOCKS};
pub(crate) use calibration::{Calibration, Report};
pub(crate) use presence::Presence;
use recency::Recency;

mod calibration;
mod presence;
mod recency;

/// The hashes of the whole blocks of one prompt, in order; `hashes[k]` stands for the prefix
/// of `k + 1` blocks.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    block_bytes: usize,
    partial: Vec<u8>,
    prev: u64,
    hashes: Vec<u64>,
}

impl Chain {
    /// A chain of `block_bytes`-byte blocks (at least 1) whose first block is seeded by `seed`
    /// (the model: blocks of two models never match).
    pub(crate) fn new(seed: &[u8], block_bytes: usize) -> Self {
        Self {
            block_bytes: block_bytes.max(1),
            partial: Vec::new(),
            prev: rapidhash_v3(seed),
            hashes: Vec::new(),
        }
    }

    /// Appends `bytes` to the stream. Whole blocks inside `bytes` are hashed where they lie;
    /// only a block split across two calls is copied.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        let size = self.block_bytes;
        self.hashes
            .reserve((self.partial.len() + bytes.len()) / size);
        if !self.partial.is_empty() {
            let take = (size - self.partial.len()).min(bytes.len());
            self.partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.partial.len() < size {
                return;
            }
            let block = std::mem::take(&mut self.partial);
            self.push(&block);
            self.partial = block;
            self.partial.clear();
        }
        let mut blocks = bytes.chunks_exact(size);
        for block in blocks.by_ref() {
            self.push(block);
        }
        self.partial.extend_from_slice(blocks.remainder());
    }

    fn push(&mut self, block: &[u8]) {
        self.prev = seeded(block, self.prev);
        self.hashes.push(self.prev);
    }

    /// The hashes of the whole blocks fed; a trailing partial block is not cached by engines
    /// and is left out.
    pub(crate) fn finish(self) -> Vec<u64> {
        self.hashes
    }
}

/// Every how many blocks a replica tells its peers what it routed: the peers learn a prefix at
/// this granularity, and what a routed prompt costs on the wire falls by this factor.
pub(crate) const SHARE_STEP: usize = 4;

/// The positions of `hashes` worth telling a peer: every [`SHARE_STEP`]-th block and the last.
pub(crate) fn coarse(hashes: &[u64]) -> impl DoubleEndedIterator<Item = u64> + '_ {
    let last = hashes.len().checked_sub(1);
    hashes
        .iter()
        .enumerate()
        .filter(move |(k, _)| (k + 1) % SHARE_STEP == 0 || Some(*k) == last)
        .map(|(_, h)| *h)
}

/// A bounded set of block hashes, least recently used out first, each held for at most a
/// time-to-live since it was last touched.
#[derive(Debug)]
pub(crate) struct Held {
    blocks: LruCache<u64, Touch>,
    /// Which hashes may be held, for readers without the lock ([`Held::presence`]).
    counts: presence::Counts,
    recency: Recency,
    ttl: Duration,
    evicted: u64,
}

/// When a held block was last touched, and that touch's number in [`Recency`].
#[derive(Debug, Clone, Copy)]
struct Touch {
    at: Instant,
    number: u32,
}

impl Held {
    /// Holds up to `capacity` blocks (at least 1) for `ttl` each.
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            blocks: LruCache::new(capacity),
            counts: presence::Counts::new(capacity.get()),
            recency: Recency::new(capacity.get()),
            ttl,
            evicted: 0,
        }
    }

    /// Which hashes it may hold, asked without its lock: "no" is certain.
    pub(crate) fn presence(&self) -> Presence {
        self.counts.presence()
    }

    /// Whether [`Held::longest`] may find any of `hashes`, or `extra` be held: where not, that
    /// is 0 and nothing needs looking up. Three blocks tell: whatever is held of a prompt
    /// starts at its first block (routed here) or at its first coarse one (learned from a
    /// peer; a peer's coarse blocks are prefix-closed among themselves, as every insert touches
    /// a prefix last to first), and `longest` finds nothing past a first block not held but
    /// the whole prompt (its last block held).
    pub(crate) fn may_hold_any(presence: &Presence, hashes: &[u64], extra: Option<u64>) -> bool {
        let at = |i: usize| hashes.get(i).is_some_and(|&h| presence.may_hold(h));
        extra.is_some_and(|h| presence.may_hold(h))
            || at(0)
            || at(SHARE_STEP.min(hashes.len()).saturating_sub(1))
            || hashes.len().checked_sub(1).is_some_and(at)
    }

    /// Blocks held now (expired ones included until they are evicted or looked at).
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The most blocks held.
    pub(crate) fn capacity(&self) -> usize {
        self.blocks.cap().get()
    }

    #[cfg(test)]
    /// Blocks pushed out by newer ones, ever.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Changes the most blocks held, evicting the least recent beyond it.
    pub(crate) fn resize(&mut self, capacity: usize) {
        let cap = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        while self.blocks.len() > cap.get() {
            let Some((hash, _)) = self.blocks.pop_lru() else {
                break;
            };
            self.counts.remove(hash);
            self.evicted += 1;
        }
        self.blocks.resize(cap);
        self.renumber();
    }

    /// Gives the held blocks touch numbers afresh, the least recent 0.
    fn renumber(&mut self) {
        let len = self.blocks.len();
        for (i, (_, touch)) in self.blocks.iter_mut().enumerate() {
            touch.number = u32::try_from(len - 1 - i).unwrap_or(u32::MAX);
        }
        self.recency.renumbered(len, self.capacity());
    }

    fn holds(&self, hash: u64, now: Instant) -> bool {
        self.blocks
            .peek(&hash)
            .is_some_and(|touch| now.saturating_duration_since(touch.at) < self.ttl)
    }

    /// How many leading blocks of `hashes` are held at `now`, without touching them. Held sets
    /// are prefix-closed (see the module docs), so a binary search over every
    /// [`SHARE_STEP`]-th position finds the last coarse block held, and at most
    /// `SHARE_STEP - 1` more lookups the exact end: `O(log n)` lookups for a prompt of `n`
    /// blocks. A peer's prefix, learned at the coarse positions only, is found to within a step.
    pub(crate) fn longest(&self, hashes: &[u64], now: Instant) -> usize {
        let Some(&last) = hashes.last() else {
            return 0;
        };
        if self.holds(last, now) {
            return hashes.len();
        }
        // Coarse position m (1-based) is block m * STEP - 1; find the largest m held.
        let (mut lo, mut hi) = (0, hashes.len() / SHARE_STEP);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.holds(hashes[mid * SHARE_STEP - 1], now) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut held = lo * SHARE_STEP;
        while held < hashes.len() && self.holds(hashes[held], now) {
            held += 1;
        }
        held
    }

    /// Held blocks touched after block `hash`: its LRU stack distance, which a cache must hold
    /// more than of blocks to still hold it. `None` when it is not held.
    pub(crate) fn depth(&self, hash: u64) -> Option<u32> {
        self.blocks
            .peek(&hash)
            .map(|touch| self.recency.newer_than(touch.number))
    }

    /// Holds every hash of `hashes` as touched at `now`, the first one most recently.
    pub(crate) fn insert(&mut self, hashes: impl DoubleEndedIterator<Item = u64>, now: Instant) {
        for hash in hashes.rev() {
            let number = match self.recency.touch() {
                Some(n) => n,
                None => {
                    self.renumber();
                    self.recency.touch().unwrap_or_default()
                }
            };
            match self.blocks.push(hash, Touch { at: now, number }) {
                Some((old, touch)) => {
                    self.recency.forget(touch.number);
                    if old != hash {
                        self.evicted += 1;
                        self.counts.remove(old);
                        self.counts.add(hash);
                    }
                }
                None => self.counts.add(hash),
            }
        }
        self.recency.settle();
    }
}

/// A request's prefix as routing sees it: its prompt's block hashes and, when the client
/// named its conversation (`prompt_cache_key`, `x-session-id`), that name's hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestPrefix {
    /// [`Chain`] hashes of the prompt.
    pub hashes: Vec<u64>,
    /// The hint's hash, seeded like the chain (a hint of one model is not another's).
    pub hint: Option<u64>,
}

impl RequestPrefix {
    /// The hash a hint is held under: apart from every block hash by a domain tag.
    pub(crate) fn hint_hash(model: &[u8], hint: &[u8]) -> u64 {
        seeded(hint, rapidhash_v3(model) ^ HINT_DOMAIN)
    }
}

/// `bytes` hashed with `seed`. The seed is itself a hash, so it is taken as it is, without the
/// premix `RapidSecrets::seed_cpp` gives a seed of unknown quality (~4 ns per block: the chain
/// hashes ~19 GB/s on 256-byte blocks with it left out, ~16 with it, ~10 with XXH3).
fn seeded(bytes: &[u8], seed: u64) -> u64 {
    rapidhash_v3_seeded(
        bytes,
        &RapidSecrets {
            seed,
            ..DEFAULT_RAPID_SECRETS
        },
    )
}

/// A backend's seed in rendezvous orders: its name's hash, the same in every replica.
pub(crate) fn name_seed(name: &str) -> u64 {
    rapidhash_v3(name.as_bytes())
}

/// Backend `seed`'s score for `key` in highest-random-weight (rendezvous) order: every replica
/// ranks the backends for a key alike, and a backend leaving moves only its own keys.
pub(crate) fn rendezvous(key: u64, seed: u64) -> u64 {
    // SplitMix64's finalizer over the pair.
    let mut z = key ^ seed.rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keeps hint hashes apart from block hashes.
const HINT_DOMAIN: u64 = 0x6869_6e74_6b65_7921;

#[cfg(test)]
mod tests;
