//! The response body: upstream frames forwarded unchanged and at once, metered on the way.
//!
//! Three jobs, three types, nested as linkerd nests its body layers:
//! - [`Timed`](super::deadline::Timed), innermost: the deadlines (first token, stall, total,
//!   drain);
//! - [`Metered`], here: for a stream, a [`StreamMeter`] reads SSE beside the forwarding (first
//!   and last content, usage) and removes the usage chunk the gateway itself asked for; any cut
//!   becomes the dialect's error event, never a silent end; before a retry is ruled out, it
//!   reads ahead to the first content event ([`ProxyBody::read_ahead_to_content`]);
//! - [`RequestEnd`](super::end::RequestEnd), owned by the metered body: what the request leaves
//!   behind when the body ends, fails or is dropped.
//!
//! A response from a backend of the other dialect is metered as the backend sent it (its own
//! usage counts) and then translated (`crate::translate::ResponseTranslator`) in the same
//! poll: a stream event by event, so that its first content leaves when it arrives.
//!
//! Per frame: the time is read once; per event: byte searches for content and usage (JSON is
//! parsed only for an event that mentions usage). The backend's occupancy lock is taken twice per
//! request (first content, end), never per chunk.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::deadline::{Cut, Timed};
use super::end::RequestEnd;
use super::meter::StreamMeter;
use super::whole::WholeUsage;
use crate::curve::Outcome;
use crate::fleet::InFlightGuard;
use crate::sse::events::StreamDialect;
use crate::translate::ResponseTranslator;
pub(crate) use crate::upstream::BodyError;
use crate::upstream::PooledBody;

/// The most a stream's bytes before its first content event are kept while a retry is still
/// possible (a role chunk and a few comments are a few hundred bytes); past it the response goes
/// to the client as it is.
pub(crate) const READ_AHEAD_LIMIT: usize = 1 << 20;

pin_project! {
    /// Every response the gateway sends: one it made, or one from upstream.
    #[project = ProxyBodyProj]
    #[derive(Debug)]
    pub(crate) enum ProxyBody {
        /// A body the gateway made (errors, `/v1/models`).
        Local { #[pin] body: Full<Bytes> },
        /// An upstream body, metered. Boxed: it is several hundred bytes, and the response is
        /// moved whole through every layer of the stack on its way out.
        Upstream { body: Box<Metered> },
    }
}

/// An empty body made by the gateway (a CORS preflight's answer).
impl Default for ProxyBody {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl ProxyBody {
    /// A complete body made by the gateway.
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::Local {
            body: Full::new(bytes),
        }
    }

    /// Keeps a backend's in-flight slot until this body is done (a local body has nothing to
    /// wait for, so the slot goes at once).
    pub(crate) fn keep_slot(&mut self, slot: InFlightGuard) {
        if let Self::Upstream { body } = self {
            body.keep_slot(slot);
        }
    }

    /// See [`Metered::read_ahead_to_content`]; a local body answers `true` at once.
    pub(crate) async fn read_ahead_to_content(&mut self) -> bool {
        match self {
            Self::Upstream { body } => body.read_ahead_to_content().await,
            Self::Local { .. } => true,
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
            Self::Upstream { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Local { body } => body.size_hint(),
            Self::Upstream { body } => body.size_hint(),
        }
    }
}

pin_project! {
    /// An upstream body on its way to the client: timed, metered, read ahead while a retry is
    /// possible, and ending its request when it ends, fails or is dropped.
    #[derive(Debug)]
    pub(crate) struct Metered<B = PooledBody> {
        #[pin]
        inner: Timed<B>,
        end: RequestEnd,
        // The stream's meter (successful event streams only).
        meter: Option<StreamMeter>,
        dialect: Option<StreamDialect>,
        // The response's translation for a client of the other dialect, if it is one.
        translate: Option<Box<ResponseTranslator>>,
        // A whole answer's frames, for its usage (successful generations only).
        whole: Option<WholeUsage>,
        // Set once the stream was cut and ended with an error event (or error).
        cut: bool,
        // Frames read ahead while the response waited for its first content; sent first.
        read: VecDeque<Bytes>,
        // Reading ahead: frames go into `read`, not out.
        reading_ahead: bool,
        // The upstream body ended (frames read ahead may still be waiting).
        ended: bool,
    }

    impl<B> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(whole) = this.whole.take() {
                this.end.reported(whole.usage());
            }
            this.end.write(this.meter.as_ref());
        }
    }
}

impl<B> Metered<B> {
    /// Forwards `inner`, ending `end` when done; meters it as an SSE stream of `dialect` when
    /// `stream` is set (`true`: remove the usage chunk the gateway asked for), whose lines and
    /// events may be `max_event` bytes long.
    pub(crate) fn new(
        inner: Timed<B>,
        end: RequestEnd,
        stream: Option<(StreamDialect, bool)>,
        max_event: usize,
    ) -> Self {
        Self {
            inner,
            end,
            meter: stream
                .map(|(dialect, strip)| StreamMeter::new(dialect, strip).with_max_event(max_event)),
            dialect: stream.map(|(d, _)| d),
            translate: None,
            whole: None,
            cut: false,
            read: VecDeque::new(),
            reading_ahead: false,
            ended: false,
        }
    }

    /// Translates what goes out with `translator`; a stream's error events then take
    /// `client`'s dialect.
    #[must_use]
    pub(crate) fn translated(
        mut self,
        translator: ResponseTranslator,
        client: StreamDialect,
    ) -> Self {
        if self.dialect.is_some() {
            self.dialect = Some(client);
        }
        self.translate = Some(Box::new(translator));
        self
    }

    /// Reads a whole answer's usage at its end with `whole`.
    #[must_use]
    pub(crate) fn reading_usage(mut self, whole: WholeUsage) -> Self {
        self.whole = Some(whole);
        self
    }

    fn has_content(&self) -> bool {
        self.meter
            .as_ref()
            .is_some_and(|m| m.timing.first_content.is_some())
    }

    /// The stream carried its finish event (it may have had no content: an empty answer is an
    /// answer).
    fn has_finished(&self) -> bool {
        self.meter
            .as_ref()
            .is_some_and(|m| m.timing.finished.is_some())
    }
}

impl<B: Body<Data = Bytes, Error = BodyError> + Unpin> Metered<B> {
    /// Keeps a backend's in-flight slot until this body is done.
    pub(crate) fn keep_slot(&mut self, slot: InFlightGuard) {
        let streamed = self.meter.is_some();
        self.end.keep_slot(slot, streamed);
    }

    /// Reads ahead, keeping what it reads to send later, until the first content event, the end
    /// of the body or a failure. `true` when content came, or the stream ended cleanly after its
    /// finish event (an empty completion): the response may go to the client. `false` when the
    /// upstream failed (or ended without finishing) before producing any: the request may still
    /// be retried elsewhere, since nothing reached the client. Only streams are read ahead; any
    /// other body answers `true` at once.
    pub(crate) async fn read_ahead_to_content(&mut self) -> bool {
        if self.meter.is_none() {
            return true;
        }
        self.reading_ahead = true;
        let content = self.read_ahead().await;
        self.reading_ahead = false;
        content
    }

    async fn read_ahead(&mut self) -> bool {
        use http_body_util::BodyExt as _;
        let mut kept = 0;
        loop {
            if self.has_content() {
                return true;
            }
            if kept > READ_AHEAD_LIMIT {
                // A backend that sends this much before any content (comments, pings) is not
                // kept in memory for a retry: the response is this backend's now.
                return true;
            }
            match Pin::new(&mut *self).frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        kept += data.len();
                        self.read.push_back(data);
                    }
                    if self.cut {
                        return false;
                    }
                }
                Some(Err(_)) => return false,
                None if self.cut => return false,
                None => {
                    self.ended = true;
                    return self.has_content() || self.has_finished();
                }
            }
        }
    }
}

impl<B: Body<Data = Bytes, Error = BodyError>> Body for Metered<B> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut this = self.project();
        if !*this.reading_ahead
            && let Some(data) = this.read.pop_front()
        {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if *this.cut || *this.ended {
            return Poll::Ready(None);
        }
        loop {
            let frame = match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(cut)) => {
                    *this.cut = true;
                    return Poll::Ready(Some(cut_short(
                        cut,
                        this.end,
                        *this.dialect,
                        this.meter.as_mut(),
                        this.translate.as_deref_mut(),
                    )));
                }
                None => {
                    this.end.ended(Outcome::Completed);
                    return Poll::Ready(last_bytes(
                        this.meter.as_mut(),
                        this.translate.as_deref_mut(),
                    ));
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
            };
            this.end.forwarded(data.len());
            let Some(meter) = this.meter.as_mut() else {
                if let Some(whole) = this.whole.as_mut() {
                    whole.frame(&data);
                }
                if let Some(t) = this.translate.as_mut() {
                    // Kept whole until its end, translated there (the end comes as `None`).
                    let out = t.frame(&data);
                    this.inner.as_mut().flowing(Instant::now());
                    if out.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                if this.inner.is_end_stream() {
                    // hyper stops polling a body that says it has ended: the last frame completes
                    // it (and there is no next frame to set a deadline for).
                    this.end.ended(Outcome::Completed);
                } else {
                    // Not a stream: the bytes still may not stall.
                    this.inner.as_mut().flowing(Instant::now());
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            };
            let now = Instant::now();
            let (out, first_content) = meter.frame(data, now);
            if meter.overflowed() {
                // A line or event without end in sight: the stream ends here, with what the
                // meter had kept of it dropped.
                *this.cut = true;
                this.end.ended(Outcome::Failed);
                let dialect = this.dialect.unwrap_or(StreamDialect::OpenAi);
                let translate = this.translate.as_deref_mut();
                return Poll::Ready(Some(Ok(overflowed(meter, &out, dialect, translate))));
            }
            if meter.timing.first_content.is_some() {
                // Output flows: the next deadline is a stall.
                this.inner.as_mut().flowing(now);
            }
            if this.inner.is_end_stream() && !meter.has_partial_event() {
                this.end.ended(Outcome::Completed);
            }
            if first_content {
                let (prompt, cached) = (meter.timing.prompt_tokens, meter.timing.cached_tokens);
                this.end.first_token(now, prompt, cached);
            }
            this.end.progress(&meter.timing);
            if this.end.probing() {
                this.end.probe_speed(&meter.timing, false, now);
            }
            let out = match this.translate.as_mut() {
                Some(t) if !out.is_empty() => t.frame(&out),
                _ => out,
            };
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not while the meter keeps back the start of an unfinished event.
        // A translation says more at the end: only `None` ends it.
        self.read.is_empty()
            && self.translate.is_none()
            && self.inner.is_end_stream()
            && self.meter.as_ref().is_none_or(|m| !m.has_partial_event())
    }

    fn size_hint(&self) -> SizeHint {
        // A stream's length is unknown: the usage chunk may be removed, an error event added.
        if self.meter.is_some() || self.translate.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

/// The event that ends a cut stream, in the stream's dialect. It opens with a line end so that
/// it stands apart even after an event the upstream left unfinished.
fn error_event(dialect: StreamDialect, message: &str, code: &str) -> Bytes {
    let text = match dialect {
        StreamDialect::Anthropic => format!(
            "\nevent: error\ndata: {}\n\n",
            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}})
        ),
        StreamDialect::OpenAi => format!(
            "\ndata: {}\n\n",
            serde_json::json!({"error": {"message": message, "type": "server_error", "code": code}})
        ),
        // What a Responses client (Codex) reads as the response's failure.
        StreamDialect::Responses => format!(
            "\nevent: response.failed\ndata: {}\n\n",
            serde_json::json!({"type": "response.failed", "response": {
                "object": "response", "status": "failed", "output": [],
                "error": {"code": code, "message": message}}})
        ),
    };
    Bytes::from(text)
}

/// A body cut short by `cut` (a deadline, the drain, the upstream): its end recorded, and for a
/// stream (of `dialect`) what the meter kept and an error event, never a silent end; any other
/// body fails.
#[cold]
fn cut_short(
    cut: Cut,
    end: &mut RequestEnd,
    dialect: Option<StreamDialect>,
    meter: Option<&mut StreamMeter>,
    translate: Option<&mut ResponseTranslator>,
) -> Result<Frame<Bytes>, BodyError> {
    end.ended(match cut {
        Cut::Drained => Outcome::Cancelled,
        Cut::Expired(_) | Cut::Upstream(_) => Outcome::Failed,
    });
    let Some(dialect) = dialect else {
        return Err(match cut {
            Cut::Upstream(err) => err,
            other => other.into(),
        });
    };
    let (message, code) = match &cut {
        Cut::Expired(e) => (e.message.clone(), "upstream_timeout"),
        Cut::Drained => (cut.to_string(), "gateway_shutdown"),
        Cut::Upstream(_) => (cut.to_string(), "upstream_error"),
    };
    let rest = meter.and_then(StreamMeter::finish);
    let mut out = match (rest, translate) {
        (Some(rest), Some(t)) => t.frame(&rest).to_vec(),
        (rest, _) => rest.map(|b| b.to_vec()).unwrap_or_default(),
    };
    out.extend_from_slice(&error_event(dialect, &message, code));
    Ok(Frame::data(Bytes::from(out)))
}

/// What a body that ended leaves to send: what the meter kept back, and what a translation
/// adds at its end.
fn last_bytes(
    meter: Option<&mut StreamMeter>,
    translate: Option<&mut ResponseTranslator>,
) -> Option<Result<Frame<Bytes>, BodyError>> {
    let rest = meter.and_then(StreamMeter::finish);
    let Some(t) = translate else {
        return rest.map(|r| Ok(Frame::data(r)));
    };
    let mut out = rest.map(|r| t.frame(&r).to_vec()).unwrap_or_default();
    out.extend_from_slice(&t.finish());
    (!out.is_empty()).then(|| Ok(Frame::data(Bytes::from(out))))
}

/// A stream whose line or event outgrew the meter's limit: what it had let through (`out`),
/// then an error event saying why.
#[cold]
fn overflowed(
    meter: &StreamMeter,
    out: &Bytes,
    dialect: StreamDialect,
    translate: Option<&mut ResponseTranslator>,
) -> Frame<Bytes> {
    let message = format!(
        "the upstream sent an SSE line or event over {} bytes (max_event_bytes)",
        meter.max_event()
    );
    let mut bytes = match translate {
        Some(t) => t.frame(out).to_vec(),
        None => out.to_vec(),
    };
    bytes.extend_from_slice(&error_event(dialect, &message, "upstream_error"));
    Frame::data(Bytes::from(bytes))
}

#[cfg(test)]
mod tests;
