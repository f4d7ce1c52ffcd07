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

/// Live touch numbers, counted by a Fenwick tree.
#[derive(Debug)]
pub(super) struct Recency {
    /// `tree[i]` counts live numbers in `(i - lowbit(i), i]`, 1-based.
    tree: Vec<u32>,
    live: u32,
    next: u32,
}

impl Recency {
    /// Numbers for up to `capacity` live touches.
    pub(super) fn new(capacity: usize) -> Self {
        let mut recency = Self {
            tree: Vec::new(),
            live: 0,
            next: 0,
        };
        recency.renumbered(0, capacity);
        recency
    }

    /// The number for a touch now, or `None` when they have run out: renumber first.
    pub(super) fn touch(&mut self) -> Option<u32> {
        let n = self.next;
        if n as usize >= self.tree.len() - 1 {
            return None;
        }
        self.next += 1;
        self.add(n, 1);
        self.live += 1;
        Some(n)
    }

    /// Number `n` is no longer a held block's latest touch.
    pub(super) fn forget(&mut self, n: u32) {
        self.add(n, u32::MAX);
        self.live -= 1;
    }

    /// Live numbers above `n`: blocks touched after the one that holds `n`.
    pub(super) fn newer_than(&self, n: u32) -> u32 {
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
            let parent = i + (i & i.wrapping_neg());
            if parent <= slots {
                self.tree[parent] += self.tree[i];
            }
        }
        self.live = u32::try_from(live).unwrap_or(u32::MAX);
        self.next = self.live;
    }

    /// Adds `delta` (wrapping: `u32::MAX` takes one away) at number `n`.
    fn add(&mut self, n: u32, delta: u32) {
        let mut i = n as usize + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
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
