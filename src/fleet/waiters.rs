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
//! Waiting requests take turns in rounds: a round starts when a slot frees (or, while nothing
//! frees, when the first in line looks again after a curve refresh), and each request in turn,
//! in fair order, tries once to be placed; one that cannot be placed now passes the turn to the
//! next. The first in line does not block the others: a request that has waited longer has less
//! of its TTFT budget left, and where it fits nowhere a newer one may still fit. Each turn wakes
//! only the request whose turn it is.
//!
//! Releasing a slot is on the per-request path, so it costs one atomic load when nobody waits.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Who a waiting request is, for the fair order: its flow (an API key's id; 0 for requests
/// without a key), the flow's weight, and the request's cost in tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Share {
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
    next_ticket: AtomicU64,
    /// The current round of turns.
    round: AtomicU64,
    classes: Mutex<Vec<ClassLine>>,
    /// Waiting per class, read without the lock.
    per_class: Box<[AtomicUsize]>,
}

/// A waiting request's place in the fair order: (virtual finish, ticket).
type Key = (u64, u64);

/// One class's line.
#[derive(Debug, Default, Clone)]
struct ClassLine {
    /// Waiting requests in fair order, first served first, each with what wakes it and its
    /// start tag.
    order: BTreeMap<Key, (Arc<Notify>, u64)>,
    /// Each flow's last virtual finish; forgotten when the line empties (an idle flow keeps
    /// no credit and owes nothing).
    finish: HashMap<u64, u64>,
    /// The class's virtual time: the smallest start tag still waiting, never moving back.
    now: u64,
    /// Where the turn is: in round `.0`, every request before key `.1` has passed.
    turn: (u64, Key),
}

impl ClassLine {
    /// Whose turn it is in `round`: the first request that has not passed in it.
    fn turn_holder(&self, round: u64) -> Option<(&Key, &(Arc<Notify>, u64))> {
        if self.turn.0 == round {
            self.order.range(self.turn.1..).next()
        } else {
            self.order.first_key_value()
        }
    }

    /// Wakes the request whose turn it is in `round`, if any.
    fn wake_turn(&self, round: u64) {
        if let Some((_, (wake, _))) = self.turn_holder(round) {
            wake.notify_one();
        }
    }
}

/// Virtual time per token of weight 1 (tags are integers; a weight of 1/1000 still moves them).
const TAG_PER_TOKEN: f64 = 1024.0;

impl Line {
    /// A line for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self {
            waiting: AtomicUsize::new(0),
            next_ticket: AtomicU64::new(0),
            round: AtomicU64::new(1),
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
    pub(crate) fn waiting_in(&self, class: usize) -> usize {
        self.per_class
            .get(class)
            .map_or(0, |n| n.load(Ordering::Acquire))
    }

    /// A slot was released somewhere: a new round of turns.
    pub(crate) fn released(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.new_round();
        }
    }

    /// Starts a round: every class's first request in line tries again, then the next...
    fn new_round(&self) {
        let round = self.round.fetch_add(1, Ordering::AcqRel) + 1;
        for line in self.classes().iter() {
            line.wake_turn(round);
        }
    }

    /// Requests waiting now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Joins the line of `class` as `share`; leaving is dropping the [`Place`] (or
    /// placed).
    pub(crate) fn join(&self, class: usize, share: Share) -> Place<'_> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let mut classes = self.classes();
        let finish = match classes.get_mut(class) {
            Some(line) => {
                let previous = line.finish.get(&share.flow).copied().unwrap_or(0);
                let start = previous.max(line.now);
                let cost = share.tokens.max(1) as f64 * TAG_PER_TOKEN / share.weight.max(1e-3);
                let finish = start.saturating_add(cost as u64);
                line.finish.insert(share.flow, finish);
                line.order
                    .insert((finish, ticket), (Arc::clone(&wake), start));
                // Joining ahead of where the turn is: the turn is this request's (it has not
                // passed).
                line.turn.1 = line.turn.1.min((finish, ticket));
                finish
            }
            None => 0,
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
            finish,
            wake,
        }
    }
}

/// A request's place in line.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    line: &'a Line,
    class: usize,
    ticket: u64,
    finish: u64,
    wake: Arc<Notify>,
}

impl Place<'_> {
    fn key(&self) -> Key {
        (self.finish, self.ticket)
    }

    /// The round, if it is this request's turn to try to be placed (call [`Place::pass`]
    /// with it when it cannot be).
    pub(crate) fn turn(&self) -> Option<u64> {
        let round = self.line.round.load(Ordering::Acquire);
        let classes = self.line.classes();
        let line = classes.get(self.class)?;
        let holds = line
            .turn_holder(round)
            .is_some_and(|(key, _)| *key == self.key());
        holds.then_some(round)
    }

    /// Could not be placed in its turn of `round`: the next request in line tries. (If a new
    /// round began meanwhile, its turn in that one stands.)
    pub(crate) fn pass(&self, round: u64) {
        let mut classes = self.line.classes();
        let Some(line) = classes.get_mut(self.class) else {
            return;
        };
        // A round that has ended, or a turn that is no longer its own (a request joined ahead of
        // it meanwhile, and has not tried yet): nothing to pass.
        let holds = line
            .turn_holder(round)
            .is_some_and(|(key, _)| *key == self.key());
        if self.line.round.load(Ordering::Acquire) != round || !holds {
            return;
        }
        let (finish, ticket) = self.key();
        line.turn = (round, (finish, ticket.saturating_add(1)));
        line.wake_turn(round);
    }

    /// Whether it is first in its class's line (whatever the turn).
    pub(crate) fn is_first(&self) -> bool {
        self.line
            .classes()
            .get(self.class)
            .and_then(|line| line.order.first_key_value().map(|(key, _)| *key))
            .is_none_or(|first| first == self.key())
    }

    /// Nothing freed for a while, yet curves change with time: the first in line starts a
    /// new round of turns.
    pub(crate) fn look_again(&self) {
        if self.is_first() {
            self.line.new_round();
        }
    }

    /// What wakes it for its turn: register (`notified().enable()`) before checking
    /// [`Place::turn`], so that none is missed; a wake-up while it is not waiting is kept.
    pub(crate) fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let round = self.line.round.load(Ordering::Acquire);
        let mut classes = self.line.classes();
        if let Some(line) = classes.get_mut(self.class) {
            line.order.remove(&self.key());
            // Virtual time is the oldest start still waiting. The start of what was served
            // would do where the line serves in fair order, but it does not always: a newer
            // request fits a slot too late for an older one's first token, and taking its
            // start would tag a light key's next request level with a flood's newest instead
            // of its oldest (tenant B lost its priority to A's freshest requests). Nor does a
            // request that gave up, tagged far ahead when its flow floods, carry every later
            // tag with it.
            if let Some(oldest) = line.order.values().map(|&(_, start)| start).min() {
                line.now = line.now.max(oldest);
            }
            if line.order.is_empty() {
                line.finish.clear();
            }
            // It may have held the turn.
            line.wake_turn(round);
        }
        drop(classes);
        if let Some(n) = self.line.per_class.get(self.class) {
            n.fetch_sub(1, Ordering::AcqRel);
        }
        self.line.waiting.fetch_sub(1, Ordering::AcqRel);
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

    /// Whether `place` has been woken (a kept wake-up resolves at once).
    async fn woken(place: &Place<'_>) -> bool {
        let wake = place.wake();
        tokio::time::timeout(std::time::Duration::from_millis(10), wake.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_placed_passes_its_turn_to_the_next_in_line() {
        let line = Line::new(1);
        let (old, new, newest) = (
            line.join(0, Share::default()),
            line.join(0, Share::default()),
            line.join(0, Share::default()),
        );
        line.released();
        assert!(
            woken(&old).await && !woken(&new).await,
            "the first in line is woken"
        );
        let round = old.turn().expect("the first in line has the turn");
        assert_eq!((new.turn(), newest.turn()), (None, None));
        // The oldest fits nowhere (its TTFT budget is nearly spent): the next one tries.
        old.pass(round);
        assert!(woken(&new).await, "the next in line is woken");
        assert_eq!((old.turn(), new.turn()), (None, Some(round)));
        // Placed: it leaves, and the turn goes on to the one after it.
        drop(new);
        assert!(woken(&newest).await);
        newest.pass(round);
        assert_eq!((old.turn(), newest.turn()), (None, None), "everyone tried");
        // A slot frees: a new round, from the first in line.
        line.released();
        assert!(woken(&old).await);
        assert!(old.turn().is_some_and(|r| r > round));
    }

    #[test]
    fn a_turn_passed_in_a_round_that_has_ended_stands_in_the_new_one() {
        let line = Line::new(1);
        let (first, second) = (
            line.join(0, Share::default()),
            line.join(0, Share::default()),
        );
        let round = first.turn().unwrap();
        // A slot frees while the first is trying: its failure is of the old round.
        line.released();
        first.pass(round);
        assert!(first.turn().is_some() && second.turn().is_none());
    }

    #[test]
    fn a_request_that_joins_ahead_of_the_turn_tries_before_the_one_whose_turn_it_was() {
        let line = Line::new(1);
        let first = line.join(0, flow(1, 1.0, 100));
        let round = first.turn().unwrap();
        // A smaller request of another key joins ahead of it while it tries.
        let smaller = line.join(0, flow(2, 1.0, 50));
        first.pass(round);
        assert_eq!((smaller.turn(), first.turn()), (Some(round), None));
        smaller.pass(round);
        assert_eq!(first.turn(), Some(round), "then the turn comes back to it");
    }

    #[test]
    fn a_flood_s_newest_request_served_first_does_not_cost_a_light_key_its_place() {
        let line = Line::new(1);
        let mut flood: Vec<_> = (0..10).map(|_| line.join(0, flow(1, 1.0, 100))).collect();
        // A slot too late for the older requests' first tokens goes to the flood's newest.
        drop(flood.pop());
        // The light key's request is tagged from the oldest start still waiting: it goes
        // second, not behind the flood's other eight.
        let light = line.join(0, flow(2, 1.0, 100));
        assert_eq!(light.finish, 100 * TAG_PER_TOKEN as u64);
        drop(flood.remove(0));
        assert!(light.is_first());
    }

    #[test]
    fn requests_that_gave_up_move_the_virtual_time_only_to_the_oldest_still_waiting() {
        let line = Line::new(1);
        let mut flood: Vec<_> = (0..10).map(|_| line.join(0, flow(1, 1.0, 100))).collect();
        // Five of the flooding key's requests give up waiting; the next of its own is the
        // oldest start left (5 requests' worth), not the far-ahead tag of its newest.
        flood.drain(..5).for_each(drop);
        let newcomer = line.join(0, flow(2, 1.0, 100));
        assert_eq!(newcomer.finish, 6 * 100 * TAG_PER_TOKEN as u64);
        drop(flood.remove(0));
        assert!(newcomer.is_first());
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
