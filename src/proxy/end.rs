//! The end of a request that reached a backend, written exactly once when its response body
//! ends, fails or is dropped (as linkerd's `BodyWithEosFn` takes its callback once): the
//! backend's health, the curve's sample, the metrics and the log line; and, through the slot it
//! keeps, the release of the request's place in flight.
//!
//! The first token is learned as soon as it comes ([`RequestEnd::first_token`]): the curve's TTFT
//! needs no end, and the occupancy integral starts there for the request's experienced
//! concurrency.

use std::sync::Arc;

use tokio::time::Instant;

use super::meter::StreamMeter;
use crate::curve::{FirstToken, Observation, Outcome, Reading};
use crate::fleet::{Backend, Hit, InFlightGuard};
use crate::logging::RequestLine;
use crate::router::Reason;
use crate::sse::StreamTiming;
use crate::sse::events::Usage;
use crate::tenant::{Bill, Charge, Verdict};

/// One request's response on its way out: what its end will say and teach.
#[derive(Debug)]
pub(crate) struct RequestEnd {
    /// The request id.
    id: http::HeaderValue,
    /// The model the client asked for.
    model: Option<String>,
    /// The request's traffic class.
    class: Option<Arc<str>>,
    /// The upstream status.
    status: http::StatusCode,
    /// When the gateway received the request (the client's TTFT and total run from here).
    start: Instant,
    /// When it was sent to the backend that answered: the backend's own TTFT, which its curve
    /// learns, runs from here (time spent in the gateway's line, or on a failed attempt, is
    /// not the backend's).
    sent: Instant,
    /// The backend that answered.
    backend: Arc<str>,
    /// Prompt tokens as routing estimated them (for the TTFT sample when the stream has not
    /// reported its own count by the first token).
    prompt_estimate: u64,
    /// The backend slot; released when this is dropped, after the end is written.
    slot: Option<InFlightGuard>,
    /// Occupancy integral at the first content event.
    first_reading: Option<Reading>,
    /// A first token whose prompt the prefix index expected partly cached, on a backend that
    /// reports its cached tokens at the end of a stream: learned at the end, with the count
    /// the backend reported.
    deferred_start: Option<FirstToken>,
    /// Bytes forwarded to the client.
    bytes: u64,
    /// How the response ended, as far as known; `Cancelled` until it ends otherwise.
    outcome: Outcome,
    /// The end was written.
    written: bool,
    /// The request's span, when traced: ended with the end.
    span: Option<crate::otel::RequestSpan>,
    /// Its API key's charge: settled at the end with the tokens used.
    charge: Option<Arc<Charge>>,
    /// A whole answer's usage, as its body reported it.
    whole_usage: Option<Usage>,
    /// Why the router chose the backend.
    reason: Reason,
}

/// What a request's end needs to know of it from before its backend answered, for its
/// [`RequestEnd`].
#[derive(Debug)]
pub(crate) struct RequestFacts {
    /// The request id.
    pub id: http::HeaderValue,
    /// The model the client asked for.
    pub model: Option<String>,
    /// The request's traffic class.
    pub class: Option<Arc<str>>,
    /// Prompt tokens as routing estimated them.
    pub prompt_estimate: u64,
    /// When the gateway received it.
    pub start: Instant,
    /// Its span, when traced.
    pub span: Option<crate::otel::RequestSpan>,
    /// Its API key's charge, when the key is counted.
    pub charge: Option<Arc<Charge>>,
    /// Why the router chose its backend.
    pub reason: Reason,
}

impl RequestEnd {
    /// The end of `request`, whose response head (`status`) came from `backend`, to which it
    /// was sent at `sent`.
    pub(crate) fn new(
        request: RequestFacts,
        status: http::StatusCode,
        sent: Instant,
        backend: Arc<str>,
    ) -> Self {
        Self {
            id: request.id,
            model: request.model,
            class: request.class,
            status,
            start: request.start,
            sent,
            backend,
            prompt_estimate: request.prompt_estimate,
            slot: None,
            first_reading: None,
            deferred_start: None,
            bytes: 0,
            outcome: Outcome::Cancelled,
            written: false,
            span: request.span,
            charge: request.charge,
            whole_usage: None,
            reason: request.reason,
        }
    }

    /// Keeps the request's in-flight slot until the end; `streamed`: a first token may come
    /// (otherwise the slot stops waiting for one at once).
    pub(crate) fn keep_slot(&mut self, mut slot: InFlightGuard, streamed: bool) {
        if !streamed {
            slot.stop_waiting();
        }
        self.slot = Some(slot);
    }

    /// `n` more bytes went to the client.
    pub(crate) fn forwarded(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    /// A whole answer's body reported `usage` (or none).
    pub(crate) fn reported(&mut self, usage: Option<Usage>) {
        self.whole_usage = usage;
    }

    /// The response ended this way (the last word counts).
    pub(crate) fn ended(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// The first content event arrived at `now`: the curve learns this request's TTFT at once,
    /// and the occupancy integral starts for its experienced concurrency. `prompt_tokens` and
    /// `cached_tokens`: the counts the stream reported, if it did by now (Anthropic's
    /// `message_start`). The sample's prompt is what the backend had to prefill before this
    /// first token: the prompt less its cached tokens, as reported, else as the prefix index
    /// expected, plus the uncached prompts sent there before it and not yet at their first token.
    ///
    /// Except where the index expected a hit on a backend that reports its hits only at the end
    /// (OpenAI's usage chunk): an estimate that is wrong there (the engine evicted what the index
    /// still holds) teaches the fit a cold prefill at a cached prompt's size, so that sample waits
    /// for the reported count. The queue such a request saw still shows at once, in the
    /// occupancy's count of requests waiting for a first token.
    pub(crate) fn first_token(
        &mut self,
        now: Instant,
        prompt_tokens: Option<u64>,
        cached_tokens: Option<u64>,
    ) {
        let Some(slot) = &mut self.slot else {
            return;
        };
        self.first_reading = Some(slot.first_token(now));
        if let Some(trial) = slot.trial_ref() {
            trial.first_token((now - self.sent).as_secs_f64());
        }
        let prompt = prompt_tokens.unwrap_or(self.prompt_estimate);
        let expected = slot.expected().cached_tokens;
        // What the backend prefilled before this first token: this prompt's uncached tokens
        // and the prefill it waited behind (prefills run one after another).
        let uncached =
            prompt - cached_tokens.unwrap_or(expected).min(prompt) + slot.prefill_ahead();
        let backend = slot.backend();
        if let Some(model) = &self.model
            && self.status.is_success()
        {
            let start = FirstToken {
                at: now,
                ttft: (now - self.sent).as_secs_f64(),
                prompt_tokens: Some(uncached),
                admitted_with: f64::from(slot.admitted_with().max(1)),
                queued_with: slot.queued_with(),
            };
            let reports_later = cached_tokens.is_none()
                && expected > 0
                && backend.prefix.as_ref().is_some_and(|i| i.has_reports());
            if reports_later {
                self.deferred_start = Some(start);
            } else {
                backend.first_token(model, &start);
            }
        }
    }

    /// The stream's content events so far, for its pace on its backend
    /// ([`InFlightGuard::progress`]).
    pub(crate) fn progress(&self, timing: &StreamTiming) {
        if let (Some(slot), Some(at)) = (&self.slot, timing.last_content) {
            slot.progress(timing.content_events, at);
        }
    }

    /// The request was admitted on its backend's ramp and the ramp has not heard its speed, or
    /// probes a level of its curve that the curve has not learned yet: the stream's content
    /// events so far may tell them ([`RequestEnd::probe_speed`]).
    pub(crate) fn probing(&self) -> bool {
        self.slot
            .as_ref()
            .and_then(InFlightGuard::trial_ref)
            .is_some_and(|t| t.probing() || t.early_pending())
    }

    /// Tells the backend's ramp a probe's speed once `timing` has enough content events (or
    /// the stream `ended` with fewer); and its curve, as of `now`, a level probe's speed once
    /// it has [`EARLY_EVENTS`](crate::fleet::trial::EARLY_EVENTS) of them.
    pub(crate) fn probe_speed(&mut self, timing: &StreamTiming, ended: bool, now: Instant) {
        let Some(slot) = &mut self.slot else {
            return;
        };
        if let (Some(first), Some(last)) = (timing.first_content, timing.last_content) {
            let visible = last.saturating_duration_since(first).as_secs_f64();
            if let Some(trial) = slot.trial_mut() {
                trial.probe_speed(timing.content_events, visible, ended, timing.output_tokens);
            }
        }
        if !ended
            && slot
                .trial_ref()
                .is_some_and(|t| t.early_due(timing.content_events))
            && let Some(model) = &self.model
            && self.status.is_success()
        {
            // Its speed so far, against the occupancy since its first token: an observation
            // of the stream as it stands, each content event taken as a token.
            let obs = Observation::of_stream(
                timing,
                Outcome::Completed,
                self.sent,
                self.first_reading.as_ref(),
                &slot.reading(now),
                now,
            )
            .counted_at(slot.backend().chunking.per_event());
            slot.backend().record(model, &obs);
            if let Some(trial) = slot.trial_mut() {
                trial.read_early_done();
            }
            slot.backend().room_grew();
        }
    }

    /// Writes the end, once, in named steps: the probe's last word, the backend's health, what
    /// its curve learns, the metrics, the key's charge, the span and the log line. Later calls
    /// do nothing.
    pub(crate) fn write(&mut self, meter: Option<&StreamMeter>) {
        if std::mem::replace(&mut self.written, true) {
            return;
        }
        let now = Instant::now();
        let timing = meter.map(|m| &m.timing);
        self.last_probe(meter, now);
        self.note_health();
        let timed = self.teach(meter, now);
        self.count(timed.as_ref());
        if let Some(charge) = self.charge.take() {
            self.judge(&charge, timing, timed.as_ref());
            self.settle(&charge, timing);
        }
        if let Some(span) = self.span.take() {
            self.end_span(&span, timing, now);
        }
        self.log_line(timing, now);
    }

    /// A probe whose speed was not judged yet is judged on the whole stream.
    fn last_probe(&mut self, meter: Option<&StreamMeter>, now: Instant) {
        let unjudged = self
            .slot
            .as_ref()
            .and_then(InFlightGuard::trial_ref)
            .is_some_and(|t| t.probe_unjudged());
        if let Some(meter) = meter.filter(|_| self.status.is_success() && unjudged) {
            self.probe_speed(&meter.timing, true, now);
        }
    }

    /// The backend's health hears of a server error or a failed stream, or of a success.
    fn note_health(&self) {
        let Some(slot) = &self.slot else {
            return;
        };
        if self.failed() {
            slot.backend().note_upstream(false);
        } else if self.status.is_success() && self.outcome == Outcome::Completed {
            slot.backend().note_upstream(true);
        }
    }

    /// What the backend's curve learns of a successful response: a first token held until the
    /// stream reported its cached tokens, the stream's observation (unless it was read early),
    /// and for a completed stream, how much of the prompt its prefix cache held and how many
    /// tokens its content events carried. The
    /// observation and the stream's longest gap, for the metrics.
    fn teach(&mut self, meter: Option<&StreamMeter>, now: Instant) -> Option<(Observation, f64)> {
        let (Some(slot), Some(model)) = (&self.slot, &self.model) else {
            return None;
        };
        let backend = slot.backend();
        if let Some(mut start) = self.deferred_start.take() {
            let timing = meter.map(|m| &m.timing);
            let prompt = timing
                .and_then(|t| t.prompt_tokens)
                .unwrap_or(self.prompt_estimate);
            let cached = timing
                .and_then(|t| t.cached_tokens)
                .unwrap_or(slot.expected().cached_tokens);
            start.prompt_tokens = Some(prompt - cached.min(prompt) + slot.prefill_ahead());
            backend.first_token(model, &start);
        }
        let meter = meter.filter(|_| self.status.is_success())?;
        if let Some(tokens) = meter.timing.output_tokens
            && self.outcome == Outcome::Completed
        {
            backend.chunking.learn(tokens, meter.timing.content_events);
        }
        let obs = Observation::of_stream(
            &meter.timing,
            self.outcome,
            self.sent,
            self.first_reading.as_ref(),
            &slot.reading(now),
            now,
        )
        .counted_at(backend.chunking.per_event());
        if !slot.trial_ref().is_some_and(|t| t.was_read_early()) {
            backend.record(model, &obs);
        }
        if self.outcome == Outcome::Completed {
            self.calibrate_prefix(backend, slot.expected(), &meter.timing);
        }
        Some((obs, meter.max_gap_s))
    }

    /// The response's metrics: its backend's, with what its stream showed (`timed`), or the
    /// gateway's where no backend's slot or model is known.
    fn count(&self, timed: Option<&(Observation, f64)>) {
        let class = self.class_label();
        match (&self.slot, &self.model) {
            (Some(slot), Some(model)) => {
                slot.backend()
                    .count(model, class, self.status.as_u16(), self.outcome, timed);
            }
            _ => crate::telemetry::count_response(
                &self.backend,
                self.model.as_deref(),
                class,
                self.status.as_u16(),
                self.outcome,
            ),
        }
    }

    /// The request's log line.
    fn log_line(&self, timing: Option<&StreamTiming>, now: Instant) {
        crate::logging::request_line(&RequestLine {
            request_id: self.id.to_str().unwrap_or("-"),
            backend: &self.backend,
            model: self.model.as_deref().unwrap_or("-"),
            class: self.class_label(),
            status: self.status.as_u16(),
            outcome: self.outcome_label(),
            ttft: timing.and_then(|t| t.first_content).map(|t| t - self.start),
            output_tokens: timing.and_then(|t| t.output_tokens),
            bytes: self.bytes,
            total: now - self.start,
            route: self.reason.label(),
        });
    }

    /// The backend failed the request: a server error, or a stream that broke.
    fn failed(&self) -> bool {
        self.status.is_server_error() || self.outcome == Outcome::Failed
    }

    /// The class, as metrics and logs name it.
    fn class_label(&self) -> &str {
        self.class.as_deref().unwrap_or("none")
    }

    /// The outcome, as logs and spans name it.
    fn outcome_label(&self) -> &'static str {
        match self.outcome {
            Outcome::Completed => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "upstream_error",
        }
    }
}

impl RequestEnd {
    /// A completed stream's report of its cached tokens tells the backend's prefix index how
    /// much of the prompt it held against what was `expected`.
    fn calibrate_prefix(&self, backend: &Backend, expected: Hit, timing: &StreamTiming) {
        let (Some(index), Some(cached)) = (&backend.prefix, timing.cached_tokens) else {
            return;
        };
        let prompt = timing.prompt_tokens.unwrap_or(self.prompt_estimate);
        tracing::debug!(
            backend = &*backend.config.name,
            expected = expected.cached_tokens,
            depth = expected.depth,
            reported = cached,
            prompt,
            "cached tokens reported"
        );
        if let Some(blocks) = index.reported(expected, self.prompt_estimate, cached, prompt) {
            tracing::debug!(
                backend = &*backend.config.name,
                blocks,
                "prefix index recalibrated"
            );
        }
    }
}

impl RequestEnd {
    /// What became of the request against its class's SLO, for its key: its first token (from
    /// the client's side, time in a line included) and its stream's speed against the targets;
    /// a failure the backend's (a server error, a 429, a broken stream), a client gone first
    /// neither met nor missed. A request the backend refused as bad (another 4xx) says nothing
    /// of the fleet and is not judged.
    fn judge(
        &self,
        charge: &Charge,
        timing: Option<&StreamTiming>,
        timed: Option<&(Observation, f64)>,
    ) {
        let Some(slo) = charge.slo() else {
            return;
        };
        let verdict = if self.failed() || self.status == http::StatusCode::TOO_MANY_REQUESTS {
            Verdict::UpstreamError
        } else if !self.status.is_success() {
            return;
        } else if self.outcome == Outcome::Cancelled {
            Verdict::Cancelled
        } else {
            let ttft = timing
                .and_then(|t| t.first_content)
                .map(|at| at.saturating_duration_since(self.start).as_secs_f64());
            let tps = timed
                .and_then(|(obs, _)| obs.tpot)
                .filter(|tpot| *tpot > 0.0)
                .map(|tpot| 1.0 / tpot);
            Verdict::of_completed(&slo, ttft, tps)
        };
        charge.judged(verdict);
    }

    /// Settles the API key's charge: a stream by the usage it reported (its content events
    /// where it reported none), a whole response by its body's usage (its estimate where it
    /// reported none), priced by the backend's `cost` for the model, with its share of the
    /// engine's time where the engine is priced by the hour. A stream that sent nothing used
    /// nothing: the charge, dropped unsettled, gives its estimate back.
    fn settle(&self, charge: &Charge, timing: Option<&StreamTiming>) {
        let bill = self.bill();
        let unix_s = crate::tenant::unix_now();
        match timing {
            Some(t) if t.content_events > 0 || t.output_tokens.is_some() => charge.settle(
                Some(t.prompt_tokens.unwrap_or(self.prompt_estimate)),
                Some(t.output_tokens.unwrap_or(u64::from(t.content_events))),
                bill,
                unix_s,
            ),
            None if self.status.is_success() => {
                let usage = self.whole_usage.unwrap_or_default();
                charge.settle(usage.prompt_tokens, usage.output_tokens, bill, unix_s);
            }
            _ => {}
        }
    }

    /// What the backend charges for this request's tokens, and for its time on the engine.
    fn bill(&self) -> Bill {
        let Some((slot, cost)) = self
            .slot
            .as_ref()
            .and_then(|s| Some((s, s.backend().config.cost.as_ref()?)))
        else {
            return Bill::default();
        };
        Bill {
            tokens: cost.price(self.model.as_deref().unwrap_or_default()),
            engine_usd: cost.gpu_hour_usd.map_or(0.0, |usd| {
                usd / 3600.0 * slot.engine_seconds(Instant::now())
            }),
        }
    }

    /// Ends the request's span with what the stream measured, named and attributed after the
    /// GenAI semantic conventions, the gateway's own facts under `tpsgate.*`.
    fn end_span(
        &self,
        span: &crate::otel::RequestSpan,
        timing: Option<&StreamTiming>,
        now: Instant,
    ) {
        use opentelemetry::KeyValue;
        let mut attributes = vec![
            KeyValue::new("http.response.status_code", i64::from(self.status.as_u16())),
            KeyValue::new("tpsgate.outcome", self.outcome_label()),
            KeyValue::new("tpsgate.duration_s", (now - self.start).as_secs_f64()),
        ];
        if let Some(model) = &self.model {
            attributes.push(KeyValue::new("gen_ai.operation.name", "chat"));
            attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        if let Some(class) = &self.class {
            attributes.push(KeyValue::new("tpsgate.class", class.to_string()));
        }
        if let Some(t) = timing {
            let count = |n: Option<u64>| i64::try_from(n.unwrap_or(0)).unwrap_or(i64::MAX);
            if t.output_tokens.is_some() {
                attributes.push(KeyValue::new(
                    "gen_ai.usage.output_tokens",
                    count(t.output_tokens),
                ));
            }
            if t.prompt_tokens.is_some() {
                attributes.push(KeyValue::new(
                    "gen_ai.usage.input_tokens",
                    count(t.prompt_tokens),
                ));
            }
            if let Some(first) = t.first_content {
                // The client's TTFT (from receipt) and the backend's (from sending).
                attributes.push(KeyValue::new(
                    "tpsgate.ttft_s",
                    (first - self.start).as_secs_f64(),
                ));
                attributes.push(KeyValue::new(
                    "tpsgate.backend_ttft_s",
                    (first - self.sent).as_secs_f64(),
                ));
            }
        }
        span.end(
            self.model.as_ref().map(|m| format!("chat {m}")),
            attributes,
            self.failed().then_some("upstream_error"),
        );
    }
}

impl Drop for RequestEnd {
    /// A request whose body never wrote its end (it was never polled) still has one.
    fn drop(&mut self) {
        self.write(None);
    }
}
