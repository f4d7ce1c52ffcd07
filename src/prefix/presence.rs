//! Which block hashes a [`Held`](super::Held) set may hold, readable without the lock it lives
//! under: a counting Bloom filter of one hash function, whose counts change with the set (under
//! its lock) and whose "any here" bits are atomics. A decision asks every candidate's index
//! about the request's prefix, and most hold none of it: a clear bit answers that without the
//! index's lock. A set bit says only "maybe" (another block sharing its slot, or a block held
//! past its age), and the index is then looked up as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per block the set holds at most: at about a quarter full, three "maybe"s in four
/// asked of a block not held are a clear "no".
const SLOTS_PER_BLOCK: usize = 4;

/// At most this many slots (8 KiB of bits, 64 KiB of counts per index).
const MAX_SLOTS: usize = 1 << 16;

/// The writer's side: a count per slot, and the bits readers see.
#[derive(Debug)]
pub(crate) struct Counts {
    counts: Box<[u8]>,
    bits: Presence,
}

/// The readers' side: whether a slot holds any block.
#[derive(Debug, Clone)]
pub(crate) struct Presence {
    bits: Arc<[AtomicU64]>,
    mask: u64,
}

impl Counts {
    /// For a set of up to `capacity` blocks.
    pub(crate) fn new(capacity: usize) -> Self {
        let slots = capacity
            .saturating_mul(SLOTS_PER_BLOCK)
            .next_power_of_two()
            .clamp(64, MAX_SLOTS);
        Self {
            counts: vec![0; slots].into_boxed_slice(),
            bits: Presence {
                bits: (0..slots / 64).map(|_| AtomicU64::new(0)).collect(),
                mask: slots as u64 - 1,
            },
        }
    }

    /// What readers ask.
    pub(crate) fn presence(&self) -> Presence {
        self.bits.clone()
    }

    /// `hash` is held from now on.
    pub(crate) fn add(&mut self, hash: u64) {
        let slot = self.bits.slot(hash);
        let count = &mut self.counts[slot];
        // A full count stays full (its slot "maybe" for good): never wrong, only slower.
        if *count == u8::MAX {
            return;
        }
        *count += 1;
        if *count == 1 {
            self.bits.set(slot, true);
        }
    }

    /// `hash` is held no more.
    pub(crate) fn remove(&mut self, hash: u64) {
        let slot = self.bits.slot(hash);
        let count = &mut self.counts[slot];
        if *count == u8::MAX || *count == 0 {
            return;
        }
        *count -= 1;
        if *count == 0 {
            self.bits.set(slot, false);
        }
    }
}

impl Presence {
    fn slot(&self, hash: u64) -> usize {
        // Block hashes are rapidhash outputs: their low bits are as good as any.
        (hash & self.mask) as usize
    }

    fn set(&self, slot: usize, on: bool) {
        let bit = 1u64 << (slot % 64);
        let word = &self.bits[slot / 64];
        if on {
            word.fetch_or(bit, Ordering::Release);
        } else {
            word.fetch_and(!bit, Ordering::Release);
        }
    }

    /// Whether the set may hold `hash`; `false` is certain.
    pub(crate) fn may_hold(&self, hash: u64) -> bool {
        let slot = self.slot(hash);
        self.bits[slot / 64].load(Ordering::Acquire) & (1u64 << (slot % 64)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_maybe_held_while_any_block_of_its_slot_is_and_surely_not_after() {
        let mut counts = Counts::new(16);
        let presence = counts.presence();
        let slots = 64u64;
        let (a, b) = (7, 7 + slots); // one slot
        assert!(!presence.may_hold(a));
        counts.add(a);
        counts.add(b);
        assert!(presence.may_hold(a) && presence.may_hold(b));
        counts.remove(a);
        assert!(presence.may_hold(a), "b still holds the slot");
        counts.remove(b);
        assert!(!presence.may_hold(a) && !presence.may_hold(b));
        // A slot counted full stays "maybe".
        for _ in 0..300 {
            counts.add(a);
        }
        for _ in 0..300 {
            counts.remove(a);
        }
        assert!(presence.may_hold(a));
    }
}
