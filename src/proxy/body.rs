//! The response body: upstream frames forwarded unchanged and at once, observed on the way.
//!
//! For a stream it reads SSE beside the forwarding to find the first content event and the usage,
//! and removes the usage chunk when the gateway itself asked for it (and only that chunk). While
//! removing, an event split across frames is held until its blank line arrives — a client cannot
//! use half an event anyway — and nothing else is ever held. When the body ends, fails or is
//! dropped, it hands one [`Observation`] to the backend's curve, releases the in-flight slot and
//! writes the request's log line.
//!
//! Per frame: the time is read once; per event: byte searches for content and usage (JSON is
//! parsed only for an event that mentions usage). The backend's occupancy lock is taken twice per
//! request (first content, end), never per chunk.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::curve::{Observation, Outcome, Reading};
use crate::sse::SseParser;
use crate::sse::observe::{self, StreamDialect};
use crate::upstream::InFlightGuard;

/// Errors a response body can end with.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Every response the gateway sends: one it made, or one from upstream.
    #[project = ProxyBodyProj]
    #[derive(Debug)]
    pub enum ProxyBody {
        /// A body the gateway made (errors, `/v1/models`).
        Local { #[pin] body: Full<Bytes> },
        /// An upstream body, observed.
        Upstream { #[pin] body: Observed },
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
    pub fn hold(&mut self, guard: InFlightGuard) {
        if let Self::Upstream { body } = self {
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
            ProxyBodyProj::Upstream { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Local { body } => body.is_end_stream(),
            Self::Upstream { body } => body.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Local { body } => body.size_hint(),
            Self::Upstream { body } => body.inner.size_hint(),
        }
    }
}

/// What the log line of one request says; written when the body is dropped.
#[derive(Debug)]
pub struct RequestLog {
    /// The request id.
    pub id: http::HeaderValue,
    /// The model the client asked for.
    pub model: Option<String>,
    /// The upstream status.
    pub status: u16,
    /// When the gateway received the request.
    pub start: Instant,
    /// The backend that answered.
    pub backend: Arc<str>,
    /// The backend slot; released with this log.
    guard: Option<InFlightGuard>,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    /// Occupancy integral at the first content event.
    first_reading: Option<Reading>,
    content_events: u32,
    output_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    /// Whether the body was read as a stream (only streams are timed).
    timed: bool,
    bytes: u64,
    outcome: &'static str,
}

impl RequestLog {
    /// A log for a request whose response head just arrived.
    pub fn new(
        id: http::HeaderValue,
        model: Option<String>,
        status: u16,
        start: Instant,
        backend: Arc<str>,
    ) -> Self {
        Self {
            id,
            model,
            status,
            start,
            backend,
            guard: None,
            first_content: None,
            last_content: None,
            first_reading: None,
            content_events: 0,
            output_tokens: None,
            prompt_tokens: None,
            timed: false,
            bytes: 0,
            outcome: "cancelled",
        }
    }
}

impl RequestLog {
    /// What this request taught us, as of `now` (its end).
    fn observation(&self, guard: &InFlightGuard, now: Instant) -> Observation {
        let outcome = match self.outcome {
            "ok" => Outcome::Completed,
            "upstream_error" => Outcome::Failed,
            _ => Outcome::Cancelled,
        };
        let estimated = self.output_tokens.is_none();
        let tokens = self.output_tokens.unwrap_or(u64::from(self.content_events));
        let (tpot, concurrency) = match (self.first_content, self.last_content, &self.first_reading)
        {
            (Some(first), Some(last), Some(start)) if self.content_events >= 2 && last > first => {
                // The tokens of the first event were made before it arrived (see bench's TPOT).
                let tokens = tokens as f64;
                let after_first = tokens - tokens / f64::from(self.content_events);
                let tpot = (after_first > 0.0).then(|| (last - first).as_secs_f64() / after_first);
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
            outcome,
            ttft: self.first_content.map(|t| (t - self.start).as_secs_f64()),
            tpot,
            output_tokens: tokens,
            estimated,
            prompt_tokens: self.prompt_tokens,
            concurrency,
            admitted_with: guard.admitted_with(),
        }
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let now = Instant::now();
        if let (Some(guard), Some(model), true) = (
            &self.guard,
            &self.model,
            self.timed && (200..300).contains(&self.status),
        ) {
            let obs = self.observation(guard, now);
            guard.backend().record(model, &obs);
        }
        let backend: &str = &self.backend;
        let ttft_ms = self
            .first_content
            .map(|t| (t - self.start).as_secs_f64() * 1e3);
        tracing::info!(
            request_id = self.id.to_str().unwrap_or("-"),
            backend,
            model = self.model.as_deref().unwrap_or("-"),
            status = self.status,
            outcome = self.outcome,
            ttft_ms,
            output_tokens = self.output_tokens,
            bytes = self.bytes,
            total_ms = self.start.elapsed().as_secs_f64() * 1e3,
            "request"
        );
    }
}

/// How a stream is read.
#[derive(Debug)]
struct Watch {
    dialect: StreamDialect,
    /// Remove the usage-only chunk (the gateway asked for it, not the client).
    strip: bool,
    parser: SseParser,
    /// Start of an event whose end has not arrived (only while stripping).
    held: BytesMut,
}

pin_project! {
    /// An upstream body on its way to the client.
    #[derive(Debug)]
    pub struct Observed {
        #[pin]
        inner: Incoming,
        watch: Option<Watch>,
        log: RequestLog,
    }
}

impl Observed {
    /// Forwards `inner`; reads it as an SSE stream of `dialect` when `stream` is set.
    pub fn new(
        inner: Incoming,
        mut log: RequestLog,
        stream: Option<(StreamDialect, bool)>,
    ) -> Self {
        log.timed = stream.is_some();
        Self {
            inner,
            watch: stream.map(|(dialect, strip)| Watch {
                dialect,
                strip,
                parser: SseParser::new(),
                held: BytesMut::new(),
            }),
            log,
        }
    }
}

impl Body for Observed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut this = self.project();
        loop {
            let frame = match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(err)) => {
                    this.log.outcome = "upstream_error";
                    return Poll::Ready(Some(Err(err.into())));
                }
                None => {
                    this.log.outcome = "ok";
                    // An unfinished last event still belongs to the client.
                    if let Some(watch) = this.watch.as_mut()
                        && !watch.held.is_empty()
                    {
                        let rest = watch.held.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    return Poll::Ready(None);
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
            };
            this.log.bytes += data.len() as u64;
            let Some(watch) = this.watch.as_mut() else {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            };
            let now = Instant::now();
            if !watch.strip {
                let (dialect, log) = (watch.dialect, &mut *this.log);
                watch.parser.feed(&data, &mut |ev| {
                    note(dialect, log, ev.event, ev.data, now);
                });
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let out = strip_usage(watch, this.log, data, now);
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }
}

/// Records what one event says; returns whether it is a usage-only chunk.
fn note(
    dialect: StreamDialect,
    log: &mut RequestLog,
    event: &[u8],
    data: &[u8],
    now: Instant,
) -> bool {
    if observe::is_content(dialect, event, data) {
        if log.first_content.is_none() {
            log.first_content = Some(now);
            log.first_reading = log.guard.as_ref().map(|g| g.backend().occupancy.read(now));
        }
        log.last_content = Some(now);
        log.content_events += 1;
    }
    match observe::usage(dialect, event, data) {
        Some(u) => {
            if u.usage.prompt_tokens.is_some() {
                log.prompt_tokens = u.usage.prompt_tokens;
            }
            // Anthropic's message_start reports input tokens only; output comes in message_delta.
            if u.usage.output_tokens > 0 || event != b"message_start" {
                log.output_tokens = Some(u.usage.output_tokens);
            }
            u.usage_only
        }
        None => false,
    }
}

/// Forwards every complete event of `held + data` except a usage-only chunk; keeps an incomplete
/// tail for the next frame. Zero-copy unless an event was split or removed.
fn strip_usage(watch: &mut Watch, log: &mut RequestLog, data: Bytes, now: Instant) -> Bytes {
    let buf = if watch.held.is_empty() {
        data
    } else {
        watch.held.put(data);
        watch.held.split().freeze()
    };
    let mut at = 0;
    let mut cut: Option<std::ops::Range<usize>> = None;
    while let Some(len) = observe::event_end(&buf[at..]) {
        let mut usage_only = false;
        let dialect = watch.dialect;
        watch.parser.feed(&buf[at..at + len], &mut |ev| {
            usage_only |= note(dialect, log, ev.event, ev.data, now);
        });
        if usage_only && cut.is_none() {
            cut = Some(at..at + len);
        }
        at += len;
    }
    if at < buf.len() {
        watch.held.put(&buf[at..]);
    }
    match cut {
        None => buf.slice(..at),
        Some(cut) => {
            let mut out = BytesMut::with_capacity(at - cut.len());
            out.put(&buf[..cut.start]);
            out.put(&buf[cut.end..at]);
            let _ = out.remaining();
            out.freeze()
        }
    }
}
