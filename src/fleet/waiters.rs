//! The wait line of `on_miss: queue`: requests that no backend can take within their SLO wait
//! here, first come first served within their class, until a backend frees a slot (or its curve
//! changes) or their wait runs out.
//!
//! Releasing a slot is on the per-request path, so it costs one atomic load when nobody waits.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Shared by the router and every backend: backends call [`Line::released`] when a slot frees.
#[derive(Debug)]
pub struct Line {
    waiting: AtomicUsize,
    notify: Notify,
    next_ticket: AtomicU64,
    /// Waiting tickets per class (index), smallest first.
    tickets: Mutex<Vec<BTreeSet<u64>>>,
    /// Waiting per class, read without the lock.
    per_class: Box<[AtomicUsize]>,
}

impl Line {
    /// A line for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self {
            waiting: AtomicUsize::new(0),
            notify: Notify::new(),
            next_ticket: AtomicU64::new(0),
            tickets: Mutex::new(vec![BTreeSet::new(); classes]),
            per_class: (0..classes).map(|_| AtomicUsize::new(0)).collect(),
        }
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

    /// Joins the line of `class`; leaving is dropping the [`Place`].
    pub fn join(&self, class: usize) -> Place<'_> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let mut tickets = self
            .tickets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(set) = tickets.get_mut(class) {
            set.insert(ticket);
        }
        drop(tickets);
        if let Some(n) = self.per_class.get(class) {
            n.fetch_add(1, Ordering::AcqRel);
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Place {
            line: self,
            class,
            ticket,
        }
    }
}

/// A request's place in line.
#[derive(Debug)]
pub struct Place<'a> {
    line: &'a Line,
    class: usize,
    ticket: u64,
}

impl Place<'_> {
    /// Whether no earlier request of the same class is still waiting.
    pub fn is_first(&self) -> bool {
        let tickets = self
            .line
            .tickets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tickets
            .get(self.class)
            .and_then(BTreeSet::first)
            .is_none_or(|first| *first == self.ticket)
    }

    /// Resolves at the next release (register before checking, so none is missed).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.line.notify.notified()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut tickets = self
            .line
            .tickets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(set) = tickets.get_mut(self.class) {
            set.remove(&self.ticket);
        }
        drop(tickets);
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

    #[test]
    fn places_are_first_in_arrival_order_within_a_class() {
        let line = Line::new(2);
        let a = line.join(0);
        let b = line.join(0);
        let other_class = line.join(1);
        assert!(a.is_first() && !b.is_first() && other_class.is_first());
        assert_eq!(line.waiting(), 3);
        assert_eq!(line.waiting_in(0), 2);
        drop(a);
        assert!(b.is_first());
        drop(b);
        drop(other_class);
        assert_eq!(line.waiting(), 0);
    }
}
