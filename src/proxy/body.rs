//! The response body: upstream frames forwarded unchanged and at once, observed on the way.
//!
//! For a stream, a [`StreamMeter`] reads SSE beside the forwarding (first and last content,
//! usage) and removes the usage chunk the gateway itself asked for. When the body ends, fails or
//! is dropped, it hands one [`Observation`] to the backend's curve and metrics, releases the
//! in-flight slot and writes the request's log line.
//!
//! Per frame: the time is read once; per event: byte searches for content and usage (JSON is
//! parsed only for an event that mentions usage). The backend's occupancy lock is taken twice per
//! request (first content, end), never per chunk.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::meter::StreamMeter;
use crate::config::Timeouts;
use crate::curve::{FirstToken, Observation, Outcome, Reading};
use crate::logging::RequestLine;
use crate::signal::Signal;
use crate::sse::observe::StreamDialect;
pub use crate::upstream::BodyError;
use crate::upstream::{InFlightGuard, PooledBody};

pin_project! {
    /// Every response the gateway sends: one it made, or one from upstream.
    #[project = ProxyBodyProj]
    #[derive(Debug)]
    pub enum ProxyBody {
        /// A body the gateway made (errors, `/v1/models`).
        Local { #[pin] body: Full<Bytes> },
        /// An upstream body, observed. Boxed: it is several hundred bytes, and the response is
        /// moved whole through every layer of the stack on its way out.
        Upstream { body: Box<Observed> },
    }
}

impl ProxyBody {
    /// A complete body made by the gateway.
    pub fn full(bytes: Bytes) -> Self {
        Self::Local {
            body: Full::new(bytes),
        }
    }

    /// Keeps a backend's in-flight slot until this body is done (a local body has nothing to
    /// wait for, so the slot goes at once).
    pub fn hold(&mut self, mut guard: InFlightGuard) {
        if let Self::Upstream { body } = self {
            if body.log.meter.is_none() {
                // Not a stream (or an error): there is no first token to wait for.
                guard.stop_waiting();
            }
            body.log.guard = Some(guard);
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.project() {
            ProxyBodyProj::Local { body } => body.poll_frame(cx).map_err(|never| match never {}),
            ProxyBodyProj::Upstream { body } => Pin::new(&mut **body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Local { body } => body.is_end_stream(),
            // Not while the meter still holds the start of an unfinished event.
            Self::Upstream { body } => {
                body.held.is_empty()
                    && body.inner.is_end_stream()
                    && body.log.meter.as_ref().is_none_or(|m| !m.holds_bytes())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Local { body } => body.size_hint(),
            // Removing the usage chunk changes the length: then it is unknown.
            Self::Upstream { body } if body.log.meter.as_ref().is_some_and(StreamMeter::strips) => {
                SizeHint::default()
            }
            Self::Upstream { body } => body.inner.size_hint(),
        }
    }
}

/// One request's response on its way out: what the log line says and what the curve learns.
/// Written when the body is dropped.
#[derive(Debug)]
pub struct RequestLog {
    /// The request id.
    pub id: http::HeaderValue,
    /// The model the client asked for.
    pub model: Option<String>,
    /// The request's traffic class.
    pub class: Option<Arc<str>>,
    /// The upstream status.
    pub status: u16,
    /// When the gateway received the request (the client's TTFT and total run from here).
    pub start: Instant,
    /// When it was sent to the backend that answered: the backend's own TTFT, which its curve
    /// learns, runs from here (time spent in the gateway's line, or on a failed attempt, is
    /// not the backend's).
    sent: Instant,
    /// The backend that answered.
    pub backend: Arc<str>,
    /// Prompt tokens as routing estimated them (for the TTFT sample when the stream has not
    /// reported its own count by the first token).
    prompt_estimate: u64,
    /// The backend slot; released with this log.
    guard: Option<InFlightGuard>,
    /// The stream's meter (streams only).
    meter: Option<StreamMeter>,
    /// Occupancy integral at the first content event.
    first_reading: Option<Reading>,
    bytes: u64,
    outcome: Outcome,
}

impl RequestLog {
    /// A log for a request whose response head just arrived.
    pub fn new(
        id: http::HeaderValue,
        model: Option<String>,
        class: Option<Arc<str>>,
        status: u16,
        (start, sent): (Instant, Instant),
        backend: Arc<str>,
        prompt_estimate: u64,
    ) -> Self {
        Self {
            id,
            model,
            class,
            status,
            start,
            sent,
            backend,
            prompt_estimate,
            guard: None,
            meter: None,
            first_reading: None,
            bytes: 0,
            outcome: Outcome::Cancelled,
        }
    }

    /// The first content event arrived at `now`: the curve learns this request's TTFT at once,
    /// and the occupancy integral starts for its experienced concurrency.
    fn first_token(&mut self, now: Instant) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        self.first_reading = Some(guard.first_token(now));
        let backend = guard.backend();
        if let Some(model) = &self.model
            && (200..300).contains(&self.status)
        {
            let prompt = self.meter.as_ref().and_then(|m| m.prompt_tokens);
            backend.first_token(
                model,
                &FirstToken {
                    at: now,
                    ttft: (now - self.sent).as_secs_f64(),
                    prompt_tokens: Some(prompt.unwrap_or(self.prompt_estimate)),
                    admitted_with: f64::from(guard.admitted_with().max(1)),
                },
            );
        }
    }

    /// What this request taught us, as of `now` (its end).
    fn observation(&self, meter: &StreamMeter, guard: &InFlightGuard, now: Instant) -> Observation {
        let estimated = meter.output_tokens.is_none();
        let tokens = meter
            .output_tokens
            .unwrap_or(u64::from(meter.content_events));
        let (tpot, concurrency) =
            match (meter.first_content, meter.last_content, &self.first_reading) {
                (Some(first), Some(last), Some(start))
                    if meter.content_events >= 2 && last > first =>
                {
                    // The tokens of the first event were made before it arrived (see bench's TPOT).
                    let tokens = tokens as f64;
                    let after_first = tokens - tokens / f64::from(meter.content_events);
                    let tpot =
                        (after_first > 0.0).then(|| (last - first).as_secs_f64() / after_first);
                    // The integral was read at the end; take back what accrued after the last content.
                    let end = guard.backend().occupancy.read(now);
                    let at_last = Reading {
                        area: end.area - f64::from(end.count) * (now - last).as_secs_f64(),
                        count: end.count,
                        at: last,
                    };
                    (tpot, start.mean_until(&at_last))
                }
                _ => (None, None),
            };
        Observation {
            at: now,
            outcome: self.outcome,
            ttft: meter.first_content.map(|t| (t - self.sent).as_secs_f64()),
            tpot,
            output_tokens: tokens,
            estimated,
            prompt_tokens: meter.prompt_tokens,
            concurrency,
        }
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let now = Instant::now();
        let success = (200..300).contains(&self.status);
        let class = self.class.as_deref().unwrap_or("none");
        if let Some(guard) = &self.guard {
            if self.status >= 500 || self.outcome == Outcome::Failed {
                guard.backend().note_upstream(false);
            } else if success && self.outcome == Outcome::Completed {
                guard.backend().note_upstream(true);
            }
        }
        match (&self.guard, &self.model) {
            (Some(guard), Some(model)) => {
                let backend = guard.backend();
                let timed = match &self.meter {
                    Some(meter) if success => {
                        let obs = self.observation(meter, guard, now);
                        backend.record(model, &obs);
                        Some((obs, meter.max_gap_s))
                    }
                    _ => None,
                };
                backend.count(model, class, self.status, self.outcome, timed.as_ref());
            }
            _ => crate::telemetry::count_response(
                &self.backend,
                self.model.as_deref(),
                class,
                self.status,
                self.outcome,
            ),
        }
        let outcome = match self.outcome {
            Outcome::Completed => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "upstream_error",
        };
        crate::logging::request_line(&RequestLine {
            request_id: self.id.to_str().unwrap_or("-"),
            backend: &self.backend,
            model: self.model.as_deref().unwrap_or("-"),
            class,
            status: self.status,
            outcome,
            ttft: self
                .meter
                .as_ref()
                .and_then(|m| m.first_content)
                .map(|t| t - self.start),
            output_tokens: self.meter.as_ref().and_then(|m| m.output_tokens),
            bytes: self.bytes,
            total: now - self.start,
        });
    }
}

pin_project! {
    /// An upstream body on its way to the client, with its first-token, stall and total
    /// deadlines.
    #[derive(Debug)]
    pub struct Observed {
        #[pin]
        inner: PooledBody,
        log: RequestLog,
        deadline: Deadline,
        timeouts: Timeouts,
        // When the request was sent upstream: the timeouts run from here.
        sent: Instant,
        // The drain deadline (streams only): the signal says whether it passed, the future wakes
        // the body when it does.
        drained: Option<Drained>,
        // The waker the deadline's timer and the drain future were last polled with. While the
        // body is polled for the same task, a pending read need not poll them again: they will
        // wake it (see `poll_frame`).
        registered: Option<Waker>,
        dialect: Option<StreamDialect>,
        // Set once the stream was cut (a deadline passed, or the upstream broke off) and ended
        // with an error event.
        timed_out: bool,
        // Frames read ahead while the response was held for its first content; sent first.
        held: std::collections::VecDeque<Bytes>,
        // Reading ahead: frames go into `held`, not out.
        holding: bool,
        // The upstream body ended (the held frames may still be waiting).
        ended: bool,
    }
}

/// The drain deadline's signal, and the future that wakes the body when it passes.
type Drained = (
    Signal,
    Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
);

/// A body's next deadline, and its timer: armed the first time the upstream keeps the body
/// waiting, so that a body that arrives whole never registers one. Boxed so that the body is
/// Unpin and can be read ahead while held.
///
/// While output flows the deadline moves later with every frame; the timer is not moved with
/// it, but armed again for the current deadline when it fires at one that has since moved on.
/// (Moving it per chunk, and polling it and the drain signal again on every pending read, was
/// ~5% of a streamed request's instructions.)
#[derive(Debug)]
struct Deadline {
    at: Instant,
    /// The timer, and the instant it is armed for.
    timer: Option<(Pin<Box<tokio::time::Sleep>>, Instant)>,
}

impl Deadline {
    fn set(&mut self, at: Instant) {
        self.at = at;
    }

    /// Whether [`Deadline::poll`] has anything to do that the timer's last registered waker
    /// does not cover: arm it, move it earlier, or see that it fired.
    fn needs_poll(&self) -> bool {
        self.timer
            .as_ref()
            .is_none_or(|(timer, armed)| *armed > self.at || timer.is_elapsed())
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        let (timer, armed) = self
            .timer
            .get_or_insert_with(|| (Box::pin(tokio::time::sleep_until(at)), at));
        if *armed > at {
            timer.as_mut().reset(at);
            *armed = at;
        }
        loop {
            ready!(timer.as_mut().poll(cx));
            if *armed == at {
                return Poll::Ready(());
            }
            // It fired for a deadline that has since moved on.
            timer.as_mut().reset(at);
            *armed = at;
        }
    }
}

/// The deadline while output flows: a stall from `now`, or the total, if sooner.
fn stall_deadline(timeouts: &Timeouts, sent: Instant, now: Instant) -> Instant {
    let stall = now + timeouts.stall;
    timeouts.total.map_or(stall, |t| stall.min(sent + t))
}

impl Observed {
    /// Forwards `inner`; meters it as an SSE stream of `dialect` when `stream` is set (`true`:
    /// remove the usage chunk the gateway asked for).
    pub fn new(
        inner: PooledBody,
        mut log: RequestLog,
        stream: Option<(StreamDialect, bool)>,
        timeouts: Timeouts,
        sent: Instant,
        drained: Option<Signal>,
    ) -> Self {
        log.meter = stream.map(|(dialect, strip)| StreamMeter::new(dialect, strip));
        let first = sent + timeouts.first_token;
        Self {
            inner,
            dialect: stream.map(|(d, _)| d),
            log,
            deadline: Deadline {
                at: timeouts.total.map_or(first, |t| first.min(sent + t)),
                timer: None,
            },
            timeouts,
            sent,
            drained: stream.and(drained).map(|d| {
                let fired = Box::pin(d.fired());
                (d, fired)
            }),
            registered: None,
            timed_out: false,
            held: std::collections::VecDeque::new(),
            holding: false,
            ended: false,
        }
    }
}

impl ProxyBody {
    /// Reads ahead, keeping what it reads to send later, until the first content event, the end
    /// of the body or a failure. `true` when content came: the response may go to the client.
    /// `false` when the upstream failed (or ended) before producing any: the request may still
    /// be retried elsewhere, since nothing reached the client. Only streams are held; any other
    /// body answers `true` at once.
    pub async fn hold_until_content(&mut self) -> bool {
        let Self::Upstream { body } = self else {
            return true;
        };
        if body.log.meter.is_none() {
            return true;
        }
        body.holding = true;
        let content = body.read_ahead().await;
        body.holding = false;
        content
    }
}

impl Observed {
    async fn read_ahead(&mut self) -> bool {
        use http_body_util::BodyExt as _;
        let body = self;
        loop {
            if body
                .log
                .meter
                .as_ref()
                .is_some_and(|m| m.first_content.is_some())
            {
                return true;
            }
            match Pin::new(&mut *body).frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        body.held.push_back(data);
                    }
                    if body.timed_out {
                        return false;
                    }
                }
                Some(Err(_)) => return false,
                None if body.timed_out => return false,
                None => {
                    body.ended = true;
                    return body
                        .log
                        .meter
                        .as_ref()
                        .is_some_and(|m| m.first_content.is_some());
                }
            }
        }
    }
}

/// Which deadline passed, for the error event and the metric.
fn timeout_kind(
    log: &RequestLog,
    timeouts: &Timeouts,
    sent: Instant,
    now: Instant,
) -> (&'static str, String) {
    if timeouts.total.is_some_and(|t| now >= sent + t) {
        let ms = timeouts.total.map_or(0, |t| t.as_millis());
        (
            "total",
            format!("the upstream did not finish within {ms} ms"),
        )
    } else if log
        .meter
        .as_ref()
        .is_some_and(|m| m.first_content.is_some())
    {
        let ms = timeouts.stall.as_millis();
        (
            "stall",
            format!("the upstream stalled: no data for {ms} ms"),
        )
    } else {
        let ms = timeouts.first_token.as_millis();
        (
            "first_token",
            format!("no first token from the upstream within {ms} ms"),
        )
    }
}

/// What a cut stream's last frame carries: whatever the meter still held, then the error event.
fn end_with_error(
    log: &mut RequestLog,
    dialect: StreamDialect,
    message: &str,
    code: &str,
) -> Bytes {
    let mut out = log
        .meter
        .as_mut()
        .and_then(StreamMeter::finish)
        .map(|b| b.to_vec())
        .unwrap_or_default();
    out.extend_from_slice(&error_event(dialect, message, code));
    Bytes::from(out)
}

/// The event that ends a cut stream, in the stream's dialect. It opens with a line end so that
/// it stands apart even after an event the upstream left unfinished.
fn error_event(dialect: StreamDialect, message: &str, code: &str) -> Bytes {
    let text = match dialect {
        StreamDialect::Anthropic => format!(
            "\nevent: error\ndata: {}\n\n",
            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}})
        ),
        StreamDialect::OpenAi | StreamDialect::Responses => format!(
            "\ndata: {}\n\n",
            serde_json::json!({"error": {"message": message, "type": "server_error", "code": code}})
        ),
    };
    Bytes::from(text)
}

impl Body for Observed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut this = self.project();
        if !*this.holding
            && let Some(data) = this.held.pop_front()
        {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if *this.timed_out || *this.ended {
            return Poll::Ready(None);
        }
        loop {
            let polled = match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(polled) => polled,
                Poll::Pending => {
                    let registered = this
                        .registered
                        .as_ref()
                        .is_some_and(|w| w.will_wake(cx.waker()));
                    if registered
                        && !this.deadline.needs_poll()
                        && this
                            .drained
                            .as_ref()
                            .is_none_or(|(signal, _)| !signal.has_fired())
                    {
                        return Poll::Pending;
                    }
                    if let Some((_, drained)) = this.drained.as_mut()
                        && drained.as_mut().poll(cx).is_ready()
                        && let Some(dialect) = *this.dialect
                    {
                        // The drain deadline passed with the stream still open.
                        this.log.outcome = Outcome::Cancelled;
                        *this.timed_out = true;
                        return Poll::Ready(Some(Ok(Frame::data(end_with_error(
                            this.log,
                            dialect,
                            "the gateway is shutting down and its drain deadline passed",
                            "gateway_shutdown",
                        )))));
                    }
                    if this.deadline.poll(cx).is_pending() {
                        if !registered {
                            *this.registered = Some(cx.waker().clone());
                        }
                        return Poll::Pending;
                    }
                    // A deadline passed: end the stream with an error event, never silently.
                    let now = Instant::now();
                    let (kind, message) = timeout_kind(this.log, this.timeouts, *this.sent, now);
                    crate::telemetry::count_timeout(&this.log.backend, kind);
                    this.log.outcome = Outcome::Failed;
                    *this.timed_out = true;
                    let Some(dialect) = *this.dialect else {
                        return Poll::Ready(Some(Err(message.into())));
                    };
                    return Poll::Ready(Some(Ok(Frame::data(end_with_error(
                        this.log,
                        dialect,
                        &message,
                        "upstream_timeout",
                    )))));
                }
            };
            let frame = match polled {
                Some(Ok(frame)) => frame,
                Some(Err(err)) => {
                    // The upstream broke off: a stream ends with an error event, never silently.
                    this.log.outcome = Outcome::Failed;
                    *this.timed_out = true;
                    let Some(dialect) = *this.dialect else {
                        return Poll::Ready(Some(Err(err)));
                    };
                    let message = format!("the upstream broke off the stream: {err}");
                    return Poll::Ready(Some(Ok(Frame::data(end_with_error(
                        this.log,
                        dialect,
                        &message,
                        "upstream_error",
                    )))));
                }
                None => {
                    this.log.outcome = Outcome::Completed;
                    let rest = this.log.meter.as_mut().and_then(StreamMeter::finish);
                    return Poll::Ready(rest.map(|r| Ok(Frame::data(r))));
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
            };
            let log = &mut *this.log;
            log.bytes += data.len() as u64;
            let Some(meter) = log.meter.as_mut() else {
                if this.inner.is_end_stream() {
                    // hyper stops polling a body that says it has ended: the last frame completes
                    // it (and there is no next frame to set a deadline for).
                    log.outcome = Outcome::Completed;
                } else {
                    // Not a stream: the bytes still may not stall.
                    this.deadline
                        .set(stall_deadline(this.timeouts, *this.sent, Instant::now()));
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            };
            let now = Instant::now();
            let (out, first_content) = meter.frame(data, now);
            if meter.first_content.is_some() {
                // Output flows: the next deadline is a stall.
                this.deadline
                    .set(stall_deadline(this.timeouts, *this.sent, now));
            }
            if this.inner.is_end_stream() && !meter.holds_bytes() {
                log.outcome = Outcome::Completed;
            }
            if first_content {
                log.first_token(now);
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }
}
