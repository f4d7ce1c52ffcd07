//! Recency ranks of the blocks a [`super::Held`] holds: how many held blocks were touched
//! after a given one, which is its LRU stack distance. A cache of `C` blocks holds exactly the
//! blocks whose stack distance is below `C`, so a rank read when a prompt is routed, set
//! against whether the engine still held that block, says on which side of the rank the
//! engine's capacity lies (Mattson et al., 1970).
//!
//! Each touch gets the next number; a Fenwick tree over the numbers counts the live ones (each
//! held block's latest), so a rank is a count of live numbers above one: `O(log n)`. Numbers
//! run up to twice the capacity before they are given out afresh in LRU order, so the tree is
//! rebuilt (`O(n)`) at most once per `capacity` touches.
//!
//! A prompt's blocks are touched together and were mostly touched together before, so their
//! new numbers are one run and their old ones a few: the tree takes each run at once
//! ([`Recency::settle`]), `O(k + log n)` for a run of `k` where one number at a time is
//! `O(k log n)`.

/// Live touch numbers, counted by a Fenwick tree.
#[derive(Debug)]
pub(super) struct Recency {
    /// `tree[i]` counts live numbers in `(i - lowbit(i), i]`, 1-based.
    tree: Vec<u32>,
    live: u32,
    next: u32,
    /// Numbers from here to `next` are given out but not yet counted in `tree`.
    counted: u32,
    /// A run of numbers forgotten but still counted in `tree`: its first and its length.
    forgotten: (u32, u32),
}

impl Recency {
    /// Numbers for up to `capacity` live touches.
    pub(super) fn new(capacity: usize) -> Self {
        let mut recency = Self {
            tree: Vec::new(),
            live: 0,
            next: 0,
            counted: 0,
            forgotten: (0, 0),
        };
        recency.renumbered(0, capacity);
        recency
    }

    /// The number for a touch now, or `None` when they have run out: renumber first. Counted
    /// when [`Recency::settle`]d.
    pub(super) fn touch(&mut self) -> Option<u32> {
        let n = self.next;
        if n as usize >= self.tree.len() - 1 {
            return None;
        }
        self.next += 1;
        self.live += 1;
        Some(n)
    }

    /// Number `n` is no longer a held block's latest touch. Taken out when
    /// [`Recency::settle`]d.
    pub(super) fn forget(&mut self, n: u32) {
        if n >= self.counted {
            self.settle();
        }
        self.live -= 1;
        let (first, len) = &mut self.forgotten;
        if *len > 0 && n == *first + *len {
            *len += 1;
        } else if *len > 0 && n + 1 == *first {
            *first = n;
            *len += 1;
        } else {
            let (first, len) = std::mem::replace(&mut self.forgotten, (n, 1));
            self.add_run(first, len, u32::MAX);
        }
    }

    /// Brings the tree up to date with the touches and forgets since the last time.
    pub(super) fn settle(&mut self) {
        self.add_run(self.counted, self.next - self.counted, 1);
        self.counted = self.next;
        let (first, len) = std::mem::take(&mut self.forgotten);
        self.add_run(first, len, u32::MAX);
    }

    /// Live numbers above `n`: blocks touched after the one that holds `n`. Settled first.
    pub(super) fn newer_than(&self, n: u32) -> u32 {
        debug_assert!(self.counted == self.next && self.forgotten.1 == 0);
        self.live - self.up_to(n)
    }

    /// The `live` held blocks were given numbers `0..live` (the least recent 0); room for
    /// `capacity` of them from now on.
    pub(super) fn renumbered(&mut self, live: usize, capacity: usize) {
        let slots = 2 * capacity.max(live).max(32);
        self.tree.clear();
        self.tree.resize(slots + 1, 0);
        // Ones at 1..=live, built in place in O(n).
        for i in 1..=slots {
            if i <= live {
                self.tree[i] += 1;
            }
            let parent = i + lowbit(i);
            if parent <= slots {
                self.tree[parent] += self.tree[i];
            }
        }
        self.live = u32::try_from(live).unwrap_or(u32::MAX);
        self.next = self.live;
        self.counted = self.next;
        self.forgotten = (0, 0);
    }

    /// Adds `delta` (wrapping: `u32::MAX` takes one away) at each of the `len` numbers from
    /// `first`. The nodes counting any of them are the ones between the run's ends and those
    /// above its last position that count that position (a node above it that counts an
    /// earlier one counts every later one too).
    fn add_run(&mut self, first: u32, len: u32, delta: u32) {
        let (lo, hi) = (first as usize, first as usize + len as usize);
        let top = self.tree.len() - 1;
        let covered = |i: usize| (i.min(hi) - (i - lowbit(i)).max(lo)) as u32;
        for i in lo + 1..=hi.min(top) {
            self.tree[i] = self.tree[i].wrapping_add(covered(i).wrapping_mul(delta));
        }
        if len == 0 {
            return;
        }
        let mut i = hi + lowbit(hi);
        while i <= top {
            self.tree[i] = self.tree[i].wrapping_add(covered(i).wrapping_mul(delta));
            i += lowbit(i);
        }
    }

    /// Live numbers at or below `n`.
    fn up_to(&self, n: u32) -> u32 {
        let mut i = (n as usize + 1).min(self.tree.len() - 1);
        let mut sum = 0u32;
        while i > 0 {
            sum = sum.wrapping_add(self.tree[i]);
            i &= i - 1;
        }
        sum
    }
}

/// The lowest set bit of `i`: Fenwick node `i` counts the numbers in `(i - lowbit(i), i]`.
fn lowbit(i: usize) -> usize {
    i & i.wrapping_neg()
}
