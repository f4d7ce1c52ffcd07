//! The in-flight slot of one admitted request: counted in its backend's occupancy from admission
//! until the guard is dropped, which the response body does when it ends, fails or is dropped
//! (tower-http's `in_flight_requests` defines in-flight the same way).

use std::sync::Arc;

use tokio::time::Instant;

use super::backend::Backend;
use super::paces::Pace;
use super::prefix::Hit;
use super::trial::Trial;
use crate::curve::{Admitted, Reading};

/// One admitted request; releases its slot on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    backend: Arc<Backend>,
    admitted_with: Admitted,
    admitted: Instant,
    /// Still counted among the backend's requests waiting for a first token.
    waiting: bool,
    /// Others still waiting for theirs when its first token came (a burst's first request
    /// waits for the prefills admitted right after it).
    waiting_at_first_token: u32,
    class: Option<usize>,
    /// Uncached prompt tokens counted in the backend's waiting prefill until the first token.
    prefill: u64,
    /// Uncached prompt tokens of the requests sent to the backend before it and not yet at
    /// their first token when it was admitted: prefill it waits behind.
    prefill_ahead: u64,
    /// What the backend's prefix index expected it to hold of this request.
    expected: Hit,
    /// What it probes of its backend's slow start or curve, if anything.
    trial: Option<Trial>,
    /// The backends sharing its backend's device (`device:`), whose load its speed is learned
    /// against; `None` for a backend that shares none.
    neighbours: Option<Arc<[Arc<Backend>]>>,
    /// Uncached prompt tokens, counted as prefilled on its backend at its first token.
    uncached: u64,
    /// Its progress against its speed target, read by the router ([`super::paces`]).
    pace: Option<Arc<Pace>>,
    /// Its backend's occupancy integral at its first token: the load its decode ran at.
    decoding_from: Option<Reading>,
}

impl InFlightGuard {
    /// Admits a request of `class` to `backend` if it is under its `max_concurrency`. The guard
    /// releases the slot when dropped, which the response body does when it ends, fails or is
    /// dropped.
    pub fn try_admit(backend: &Arc<Backend>, class: Option<usize>) -> Option<Self> {
        let admitted = Instant::now();
        let (admitted_with, class) = backend.admit(class, admitted)?;
        Some(Self {
            backend: Arc::clone(backend),
            admitted_with,
            admitted,
            waiting: true,
            waiting_at_first_token: 0,
            class,
            prefill: 0,
            prefill_ahead: 0,
            expected: Hit::default(),
            trial: None,
            neighbours: None,
            uncached: 0,
            pace: None,
            decoding_from: None,
        })
    }

    /// It streams about `tokens` output tokens, held to `min_tps` where its class has a speed
    /// target: its progress counts in what a prefill beside it would cost
    /// ([`Paces`](super::paces::Paces)).
    pub fn pace(&mut self, tokens: u32, min_tps: Option<f64>) {
        self.pace = Some(self.backend.paces.start(tokens, min_tps));
    }

    /// `events` content events so far, the latest at `at`.
    pub fn progress(&self, events: u32, at: Instant) {
        if let Some(pace) = &self.pace {
            let tokens = self.backend.chunking.tokens(events);
            pace.progress(&self.backend.paces, tokens, at);
        }
    }

    /// Its backend shares a device with `neighbours`: its speed is learned against their load
    /// as well as its own.
    pub(crate) fn beside(&mut self, neighbours: Option<&Arc<[Arc<Backend>]>>) {
        self.neighbours = neighbours.cloned();
    }

    /// Its share of its backend's time from admission to `now`, seconds: each moment divided
    /// among the requests in flight then, fleet-wide (what a price per engine-hour charges).
    pub(crate) fn engine_seconds(&self, now: Instant) -> f64 {
        (self.backend.occupancy.share(now) - self.admitted_with.share).max(0.0)
    }

    /// The occupancy integral of its backend as of `now`, with its neighbours'.
    pub(crate) fn reading(&self, now: Instant) -> Reading {
        self.with_neighbours(self.backend.occupancy.read(now))
    }

    fn with_neighbours(&self, own: Reading) -> Reading {
        match &self.neighbours {
            Some(others) => own.with_neighbours(others.iter().map(|b| b.occupancy.read(own.at))),
            None => own,
        }
    }

    /// What it probes of its backend ([`Trial`]), begun on first asking.
    pub(crate) fn trial(&mut self) -> &mut Trial {
        self.trial
            .get_or_insert_with(|| Trial::new(Arc::clone(&self.backend)))
    }

    /// What it probes of its backend, if anything.
    pub(crate) fn trial_ref(&self) -> Option<&Trial> {
        self.trial.as_ref()
    }

    /// [`InFlightGuard::trial_ref`], to tell it what the stream showed.
    pub(crate) fn trial_mut(&mut self) -> Option<&mut Trial> {
        self.trial.as_mut()
    }

    /// The request is expected to find `hit` of its `prompt_tokens` in the backend's prefix
    /// cache: the rest counts as prefill waiting there until its first token.
    pub(crate) fn expect_prefill(&mut self, prompt_tokens: u64, hit: Hit) {
        self.expected = hit;
        self.uncached = prompt_tokens.saturating_sub(hit.cached_tokens);
        if let Some(index) = &self.backend.prefix {
            self.prefill = prompt_tokens.saturating_sub(hit.cached_tokens);
            self.prefill_ahead = index.prefill_sent(self.prefill);
        }
    }

    /// Prefill it waited behind: the uncached prompt tokens sent to the backend before it and
    /// not yet at their first token when it was admitted (0 without a prefix index).
    pub(crate) fn prefill_ahead(&self) -> u64 {
        self.prefill_ahead
    }

    /// What the backend's prefix index expected it to hold of this request.
    pub(crate) fn expected(&self) -> Hit {
        self.expected
    }

    fn prefill_done(&mut self) {
        if let (Some(index), tokens @ 1..) =
            (&self.backend.prefix, std::mem::take(&mut self.prefill))
        {
            index.prefill_done(tokens);
        }
    }

    /// The backend this request was admitted to.
    pub(crate) fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// In flight at admission, this request included; from its first token on, with the
    /// requests other replicas had admitted there that it could not see then.
    pub(crate) fn admitted_with(&self) -> u32 {
        self.admitted_with.in_flight
    }

    /// Other requests waiting for their first token when this one was admitted or, once it
    /// came, when its own first token came: whether it shared a queue.
    pub(crate) fn queued_with(&self) -> u32 {
        self.admitted_with
            .queued_behind
            .max(self.waiting_at_first_token)
    }

    /// It will have no first token (not a stream): no longer waiting for one.
    pub(crate) fn stop_waiting(&mut self) {
        self.prefill_done();
        if std::mem::take(&mut self.waiting) {
            self.backend
                .occupancy
                .stop_waiting(self.admitted, Instant::now());
        }
    }

    /// Its first token came at `now`, as the response body tells it (a benchmark's held
    /// streams too): no longer waiting.
    pub fn first_token_came(&mut self, now: Instant) {
        let _ = self.first_token(now);
    }

    /// Its first token came at `now`: no longer waiting; the occupancy integral as of then.
    pub(crate) fn first_token(&mut self, now: Instant) -> Reading {
        self.prefill_done();
        if std::mem::take(&mut self.waiting) {
            if self.admitted_with.in_flight == 1 {
                let ttft = now.saturating_duration_since(self.admitted).as_secs_f64();
                self.backend.paces.alone(ttft, self.uncached);
            }
            let (reading, others, unseen) =
                self.backend
                    .occupancy
                    .first_token(self.admitted, &self.admitted_with, now);
            self.backend.paces.first_token(self.uncached, others > 0);
            self.waiting_at_first_token = others;
            self.decoding_from = Some(reading);
            // Its TTFT is learned at the occupancy it really found.
            self.admitted_with.in_flight += unseen;
            self.with_neighbours(reading)
        } else {
            self.reading(now)
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // A level probe's end lets the next go before the slot wakes the line.
        drop(self.trial.take());
        self.prefill_done();
        if let Some(pace) = self.pace.take() {
            let in_flight = self
                .decoding_from
                .and_then(|from| from.mean_until(&self.backend.occupancy.read(Instant::now())))
                .unwrap_or(1.0);
            self.backend.paces.end(&pace, in_flight);
        }
        let waiting_since = std::mem::take(&mut self.waiting).then_some(self.admitted);
        self.backend.release(waiting_since, self.class);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Line;
    use crate::fleet::trial::EARLY_EVENTS;

    /// A backend with `max_concurrency: 2`, two classes, and the wait line it wakes.
    fn backend() -> (Arc<Backend>, Arc<Line>) {
        let text = "backends:\n\
            - {name: b, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}, max_concurrency: 2}\n";
        let config = crate::config::parse(text, |_| None).unwrap();
        let line = Arc::new(Line::new(2));
        let backend = Backend::new(
            config.backends[0].clone(),
            300.0,
            2,
            Arc::clone(&line),
            None,
        )
        .unwrap();
        (backend, line)
    }

    #[test]
    fn slots_are_taken_up_to_max_concurrency_and_given_back_on_drop() {
        let (backend, _) = backend();
        let first = InFlightGuard::try_admit(&backend, Some(0)).unwrap();
        let second = InFlightGuard::try_admit(&backend, Some(1)).unwrap();
        assert_eq!((first.admitted_with(), second.admitted_with()), (1, 2));
        assert!(
            InFlightGuard::try_admit(&backend, Some(0)).is_none(),
            "the limit holds"
        );
        assert_eq!(
            (backend.class_in_flight(0), backend.class_in_flight(1)),
            (1, 1)
        );
        drop(first);
        assert_eq!((backend.in_flight(), backend.class_in_flight(0)), (1, 0));
        assert!(InFlightGuard::try_admit(&backend, None).is_some());
    }

    #[test]
    fn a_level_probe_is_read_after_a_few_events_and_holds_the_next_until_then() {
        let (backend, _) = backend();
        let mut probe = InFlightGuard::try_admit(&backend, None).unwrap();
        let trial = probe.trial();
        trial.read_early();
        assert!(backend.level_probe.out(), "the next probe waits");
        assert!(trial.early_pending() && !trial.early_due(EARLY_EVENTS - 1));
        assert!(trial.early_due(EARLY_EVENTS));
        trial.read_early_done();
        assert!(!backend.level_probe.out() && !trial.early_pending());
        assert!(
            trial.was_read_early(),
            "its end teaches the curve nothing more"
        );
        // One that ends before it is read lets the next go all the same.
        let mut short = InFlightGuard::try_admit(&backend, None).unwrap();
        short.trial().read_early();
        drop(short);
        assert!(!backend.level_probe.out());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_waits_for_its_first_token_until_it_comes_or_will_not() {
        let (backend, _) = backend();
        let mut streamed = InFlightGuard::try_admit(&backend, None).unwrap();
        let mut plain = InFlightGuard::try_admit(&backend, None).unwrap();
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert!((backend.occupancy.waited(Instant::now()) - 1.0).abs() < 1e-9);
        plain.stop_waiting();
        let reading = streamed.first_token(Instant::now());
        assert_eq!(reading.count, 2);
        assert_eq!(backend.occupancy.waited(Instant::now()), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_wait_together_for_first_tokens_know_they_shared_a_queue() {
        let (backend, _) = backend();
        // Two at once: the second is admitted behind the first, and the first's token comes
        // while the second still waits for its own.
        let mut first = InFlightGuard::try_admit(&backend, None).unwrap();
        let mut second = InFlightGuard::try_admit(&backend, None).unwrap();
        first.first_token(Instant::now());
        second.first_token(Instant::now());
        assert_eq!((first.queued_with(), second.queued_with()), (1, 1));
        drop((first, second));
        // One alone, with nobody waiting at either end: no queue.
        let mut alone = InFlightGuard::try_admit(&backend, None).unwrap();
        alone.first_token(Instant::now());
        assert_eq!(alone.queued_with(), 0);
    }

    #[tokio::test]
    async fn a_released_slot_wakes_requests_waiting_in_line() {
        let (backend, line) = backend();
        let slot = InFlightGuard::try_admit(&backend, None).unwrap();
        let place = line.join(0, crate::fleet::Share::default());
        let wake = place.wake();
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(slot);
        tokio::time::timeout(std::time::Duration::from_secs(1), woken)
            .await
            .expect("the release woke the line");
    }
}
