//! Fits a prefix index's capacity to its backend's cache, from the cached tokens the backend
//! reports.
//!
//! The index is learned from what was routed, so it holds what the backend was sent, not what
//! the backend kept. Each hit the index expected carries its depth when it was routed: how many
//! held blocks were touched after the last block it expected, that block's LRU stack distance
//! ([`super::Held::depth`]). An LRU cache of `C` blocks holds a block exactly while its depth
//! is below `C`, so each report puts a point on one side of the engine's capacity: held at
//! depth `d` says `C > d`, lost says `C <= d`. Lost counts a part lost too: a prompt's later
//! blocks lie at least as deep as its earlier ones, so an engine that kept a shared system
//! prompt but not the history after it lacked a block no deeper than `d`. The capacity that
//! best splits the recent points into held below and lost above becomes the index's, and the
//! index evicts what the engine has evicted; a stray miss among many hits (an engine is not
//! exactly an LRU of what one gateway sent it) moves nothing.
//!
//! Points come only from below the index's own capacity (it holds nothing deeper), so too
//! small a capacity shows another way: the backend reports hits the index did not expect. A
//! window with such reports grows the index by a quarter, never past what was configured.

/// Calibration never shrinks an index below this many blocks (or its configured size).
pub(crate) const MIN_CALIBRATED_BLOCKS: usize = 16;

/// Reports read between two calibration steps.
pub(crate) const CALIBRATION_WINDOW: u32 = 16;

/// Points a step is fitted to: the last four windows' worth.
const KEPT: usize = 64;

/// One completed request's usage set against what the index expected of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Report {
    /// Prompt tokens the index expected the backend to hold.
    pub expected: u64,
    /// The last expected block's depth when the request was routed.
    pub depth: Option<u32>,
    /// The gateway's estimate of the prompt's tokens: the unit of `expected`.
    pub estimated_prompt: u64,
    /// Prompt tokens the backend reported served from its cache.
    pub reported: u64,
    /// Prompt tokens the backend reported.
    pub prompt: u64,
    /// Tokens per index block.
    pub block_tokens: u32,
}

impl Report {
    /// The point it puts on the capacity (depth, still held), and whether the backend held
    /// more than the index expected.
    fn judged(&self) -> (Option<(u32, bool)>, bool) {
        // Shares of the prompt: the gateway's estimate of tokens and the engine's tokenizer
        // need not agree. An engine caches whole blocks of its own size and recomputes the
        // last; the index drops a partial block: a block and a fiftieth either way are
        // rounding. No more: a conversation's turn adds a few percent to its prompt, and an
        // engine that kept the shared system prompt but lost the history after it has lost
        // the block whose depth the point carries.
        let estimated = self.estimated_prompt.max(1) as f64;
        let expected = self.expected as f64 / estimated;
        let reported = self.reported as f64 / self.prompt.max(1) as f64;
        let slack = 0.02 * expected + f64::from(self.block_tokens) / estimated;
        let point = self
            .depth
            .filter(|_| self.expected > 0)
            .map(|d| (d, reported + slack >= expected));
        (point, reported > expected + slack)
    }
}

/// The recent reports of one index, and what it was configured to hold.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Calibration {
    /// A ring of (depth, still held).
    points: [(u32, bool); KEPT],
    kept: usize,
    next: usize,
    reports: u32,
    unexpected: u32,
    configured: usize,
}

impl Calibration {
    /// Calibrates an index configured to hold `configured` blocks.
    pub(crate) fn new(configured: usize) -> Self {
        Self {
            points: [(0, false); KEPT],
            kept: 0,
            next: 0,
            reports: 0,
            unexpected: 0,
            configured,
        }
    }

    /// One request's report; `Some(blocks)` when the index's capacity (now `capacity` blocks)
    /// should change.
    pub(crate) fn observe(&mut self, report: &Report, capacity: usize) -> Option<usize> {
        if report.expected == 0 && report.reported == 0 {
            return None;
        }
        let (point, unexpected) = report.judged();
        if let Some(point) = point {
            self.points[self.next] = point;
            self.next = (self.next + 1) % KEPT;
            self.kept = (self.kept + 1).min(KEPT);
        }
        self.unexpected += u32::from(unexpected);
        self.reports += 1;
        if self.reports < CALIBRATION_WINDOW {
            return None;
        }
        self.reports = 0;
        let unexpected = std::mem::take(&mut self.unexpected);
        if let Some(fit) = self.fit()
            && fit < capacity
        {
            return Some(fit.max(MIN_CALIBRATED_BLOCKS.min(self.configured)));
        }
        // Two in a window: one is chance (a peer's routing it has not heard of yet).
        (unexpected >= 2 && capacity < self.configured)
            .then(|| (capacity + capacity / 4 + 1).min(self.configured))
    }

    /// The capacity that best splits the kept points into held below it and lost at or above
    /// it (fewest points on the wrong side; of equals, the larger); `None` when holding every
    /// depth seen fits best.
    fn fit(&self) -> Option<usize> {
        let mut sorted = self.points;
        let points = &mut sorted[..self.kept];
        points.sort_unstable_by_key(|&(depth, _)| depth);
        // Wrong with every point taken as lost: the held ones.
        let mut wrong = points.iter().filter(|&&(_, held)| held).count();
        let (mut fewest, mut split) = (wrong, 0);
        for k in 0..points.len() {
            wrong = if points[k].1 { wrong - 1 } else { wrong + 1 };
            // A split falls between two depths, never inside one.
            let between = points.get(k + 1).is_none_or(|next| next.0 > points[k].0);
            if between && wrong <= fewest {
                (fewest, split) = (wrong, k + 1);
            }
        }
        let lost = points.get(split)?.0;
        let held = split.checked_sub(1).map_or(0, |k| points[k].0 + 1);
        usize::try_from((u64::from(held) + u64::from(lost)) / 2).ok()
    }
}
