//! The wait line of `on_miss: queue`: requests that no backend can take within their SLO wait
//! here until a backend frees a slot (or its curve changes) or their wait runs out.
//!
//! Within a class the line is served in weighted fair order by tokens (start-time fair
//! queueing, Goyal et al. 1996): each request is tagged at joining with a virtual finish time,
//! its API key's previous finish (or the class's virtual time, if later) plus its tokens over
//! the key's weight, and the smallest tag goes first. A key that sends ten times its share
//! finds its own earlier requests ahead of its new ones, not the other keys': it waits on
//! itself. Requests without a key share one flow; with one flow the order is arrival order.
//!
//! Releasing a slot is on the per-request path, so it costs one atomic load when nobody waits.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Who a waiting request is, for the fair order: its flow (an API key's id; 0 for requests
/// without a key), the flow's weight, and the request's cost in tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// The flow.
    pub flow: u64,
    /// Its weight (above 0; a flow of weight 2 gets twice the tokens of one of weight 1).
    pub weight: f64,
    /// The request's tokens (prompt and output, estimated).
    pub tokens: u64,
}

impl Default for Share {
    fn default() -> Self {
        Self {
            flow: 0,
            weight: 1.0,
            tokens: 1,
        }
    }
}

/// Shared by the router and every backend: backends call [`Line::released`] when a slot frees.
#[derive(Debug)]
pub struct Line {
    waiting: AtomicUsize,
    notify: Notify,
    next_ticket: AtomicU64,
    classes: Mutex<Vec<ClassLine>>,
    /// Waiting per class, read without the lock.
    per_class: Box<[AtomicUsize]>,
}

/// One class's line.
#[derive(Debug, Default, Clone)]
struct ClassLine {
    /// Waiting requests by (virtual finish, ticket), first served first.
    order: BTreeSet<(u64, u64)>,
    /// Each flow's last virtual finish; forgotten when the line empties (an idle flow keeps
    /// no credit and owes nothing).
    finish: HashMap<u64, u64>,
    /// The class's virtual time: the largest start tag served so far.
    now: u64,
}

/// Virtual time per token of weight 1 (tags are integers; a weight of 1/1000 still moves them).
const TAG_PER_TOKEN: f64 = 1024.0;

impl Line {
    /// A line for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self {
            waiting: AtomicUsize::new(0),
            notify: Notify::new(),
            next_ticket: AtomicU64::new(0),
            classes: Mutex::new(vec![ClassLine::default(); classes]),
            per_class: (0..classes).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn classes(&self) -> std::sync::MutexGuard<'_, Vec<ClassLine>> {
        self.classes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Requests of `class` waiting now.
    pub fn waiting_in(&self, class: usize) -> usize {
        self.per_class
            .get(class)
            .map_or(0, |n| n.load(Ordering::Acquire))
    }

    /// A slot was released somewhere: waiters re-check.
    pub fn released(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Joins the line of `class` as `share`; leaving is dropping the [`Place`].
    pub fn join(&self, class: usize, share: Share) -> Place<'_> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let mut classes = self.classes();
        let (start, finish) = match classes.get_mut(class) {
            Some(line) => {
                let previous = line.finish.get(&share.flow).copied().unwrap_or(0);
                let start = previous.max(line.now);
                let cost = share.tokens.max(1) as f64 * TAG_PER_TOKEN / share.weight.max(1e-3);
                let finish = start.saturating_add(cost as u64);
                line.finish.insert(share.flow, finish);
                line.order.insert((finish, ticket));
                (start, finish)
            }
            None => (0, 0),
        };
        drop(classes);
        if let Some(n) = self.per_class.get(class) {
            n.fetch_add(1, Ordering::AcqRel);
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Place {
            line: self,
            class,
            ticket,
            start,
            finish,
        }
    }
}

/// A request's place in line.
#[derive(Debug)]
pub struct Place<'a> {
    line: &'a Line,
    class: usize,
    ticket: u64,
    start: u64,
    finish: u64,
}

impl Place<'_> {
    /// Whether it is the next of its class to be served.
    pub fn is_first(&self) -> bool {
        self.line
            .classes()
            .get(self.class)
            .and_then(|line| line.order.first().copied())
            .is_none_or(|first| first == (self.finish, self.ticket))
    }

    /// Resolves at the next release (register before checking, so none is missed).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.line.notify.notified()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut classes = self.line.classes();
        if let Some(line) = classes.get_mut(self.class) {
            line.order.remove(&(self.finish, self.ticket));
            // Served or gone, the class's virtual time has reached its start.
            line.now = line.now.max(self.start);
            if line.order.is_empty() {
                line.finish.clear();
            }
        }
        drop(classes);
        if let Some(n) = self.line.per_class.get(self.class) {
            n.fetch_sub(1, Ordering::AcqRel);
        }
        self.line.waiting.fetch_sub(1, Ordering::AcqRel);
        // The next in this class may now be first.
        self.line.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(flow: u64, weight: f64, tokens: u64) -> Share {
        Share {
            flow,
            weight,
            tokens,
        }
    }

    #[test]
    fn one_flow_is_served_in_arrival_order_within_a_class() {
        let line = Line::new(2);
        let a = line.join(0, Share::default());
        let b = line.join(0, Share::default());
        let other_class = line.join(1, Share::default());
        assert!(a.is_first() && !b.is_first() && other_class.is_first());
        assert_eq!(line.waiting(), 3);
        assert_eq!(line.waiting_in(0), 2);
        drop(a);
        assert!(b.is_first());
        drop(b);
        drop(other_class);
        assert_eq!(line.waiting(), 0);
    }

    #[test]
    fn a_key_that_floods_the_line_waits_behind_its_own_requests_not_the_others() {
        let line = Line::new(1);
        // Key 1 queues ten requests, then key 2 one of the same size.
        let mut flood: Vec<_> = (0..10).map(|_| line.join(0, flow(1, 1.0, 100))).collect();
        let polite = line.join(0, flow(2, 1.0, 100));
        // Key 2's request is second, behind only key 1's first.
        assert!(flood[0].is_first());
        flood.remove(0);
        assert!(polite.is_first(), "the polite key goes next");
    }

    #[test]
    fn weights_share_tokens_not_requests() {
        let line = Line::new(1);
        // Key 1 weighs twice key 2: its 200-token requests tag like key 2's 100-token ones.
        let heavy = line.join(0, flow(1, 2.0, 200));
        let light = line.join(0, flow(2, 1.0, 100));
        let heavy2 = line.join(0, flow(1, 2.0, 200));
        let light2 = line.join(0, flow(2, 1.0, 150));
        let order = |places: &[&Place<'_>]| places.iter().map(|p| p.finish).collect::<Vec<_>>();
        let tags = order(&[&heavy, &light, &heavy2, &light2]);
        assert_eq!(tags[0], tags[1]);
        assert!(
            tags[2] < tags[3],
            "a bigger request of the lighter key comes later"
        );
    }

    #[test]
    fn a_key_idle_while_the_line_was_empty_keeps_no_debt() {
        let line = Line::new(1);
        drop(
            (0..5)
                .map(|_| line.join(0, flow(1, 1.0, 1000)))
                .collect::<Vec<_>>(),
        );
        // The line emptied: key 1 starts level with a newcomer.
        let again = line.join(0, flow(1, 1.0, 100));
        let newcomer = line.join(0, flow(2, 1.0, 100));
        assert_eq!(again.finish, newcomer.finish);
        assert!(again.is_first(), "equal tags: arrival order");
    }
}
