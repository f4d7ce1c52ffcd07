//! Deadlines of an upstream exchange, in one place: the first token, the stall (the longest
//! silence once output flows), the total, and the drain deadline at shutdown. [`Deadlines`] is
//! the arithmetic (the head wait in `forward` uses it too); [`Timed`] enforces it on a response
//! body, as linkerd's `EnforceTimeouts` does (tower-http's `timeout/body.rs` explains why a body
//! needs its own timer: the service's future is long gone while the body streams).
//!
//! The timer is armed the first time the upstream keeps the body waiting, so a body that arrives
//! whole never registers one. While output flows the deadline moves later with every frame; the
//! timer is not moved with it, but armed again for the current deadline when it fires at one
//! that has since moved on, and a pending read polled by the task that last registered the
//! timer does not poll it again (what each saved: docs/benchmarks/overhead.md, "Per-chunk polling: the
//! deadline timer and graceful shutdown").

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::config::Timeouts;
use crate::signal::Signal;
use crate::upstream::BodyError;

/// A backend's timeouts, counted from when the request was sent to it (time in the gateway's
/// line, or on a failed attempt elsewhere, is not the backend's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    timeouts: Timeouts,
    sent: Instant,
    /// A stream (else a response with no first token: its deadline is the response timeout).
    streamed: bool,
}

/// A deadline that passed: which one (the `kind` label of `tpsgate_upstream_timeouts_total`),
/// and the message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expired {
    /// `first_token`, `stall` or `total`.
    pub kind: &'static str,
    /// What the client is told.
    pub message: String,
}

impl Deadlines {
    /// The deadlines of a request sent at `sent`; `streamed`: it asked for a stream.
    pub(crate) const fn new(timeouts: Timeouts, sent: Instant, streamed: bool) -> Self {
        Self {
            timeouts,
            sent,
            streamed,
        }
    }

    /// Whether the request asked for a stream.
    pub(crate) const fn streamed(&self) -> bool {
        self.streamed
    }

    /// When the request was sent.
    pub(crate) const fn sent(&self) -> Instant {
        self.sent
    }

    fn capped(&self, at: Instant) -> Instant {
        self.timeouts.total.map_or(at, |t| at.min(self.sent + t))
    }

    /// Until the first token (the response head included): the first-token timeout, or the
    /// total if sooner. A response that is not a stream has no first token: its whole
    /// response timeout.
    pub(crate) fn first_token(&self) -> Instant {
        let first = if self.streamed {
            self.timeouts.first_token
        } else {
            self.timeouts.response
        };
        self.capped(self.sent + first)
    }

    /// While output flows: a stall from `now`, or the total if sooner.
    pub(crate) fn stall_from(&self, now: Instant) -> Instant {
        self.capped(now + self.timeouts.stall)
    }

    /// Which deadline had passed at `now`; `flowing`: output had begun.
    pub(crate) fn expired(&self, now: Instant, flowing: bool) -> Expired {
        if self.timeouts.total.is_some_and(|t| now >= self.sent + t) {
            let ms = self.timeouts.total.map_or(0, |t| t.as_millis());
            Expired {
                kind: "total",
                message: format!("the upstream did not finish within {ms} ms"),
            }
        } else if flowing {
            let ms = self.timeouts.stall.as_millis();
            Expired {
                kind: "stall",
                message: format!("the upstream stalled: no data for {ms} ms"),
            }
        } else if !self.streamed {
            let ms = self.timeouts.response.as_millis();
            Expired {
                kind: "response",
                message: format!("the upstream did not answer within {ms} ms"),
            }
        } else {
            let ms = self.timeouts.first_token.as_millis();
            Expired {
                kind: "first_token",
                message: format!("no first token from the upstream within {ms} ms"),
            }
        }
    }
}

/// Why a [`Timed`] body stopped early.
#[derive(Debug)]
pub(crate) enum Cut {
    /// A deadline passed (already counted in the metrics).
    Expired(Expired),
    /// The gateway's drain deadline passed with the body still open.
    Drained,
    /// The upstream body failed.
    Upstream(BodyError),
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Expired(e) => f.write_str(&e.message),
            Self::Drained => {
                f.write_str("the gateway is shutting down and its drain deadline passed")
            }
            Self::Upstream(e) => write!(f, "the upstream broke off the stream: {e}"),
        }
    }
}

impl std::error::Error for Cut {}

/// The drain deadline's signal, and the future that wakes the body when it passes.
type Drained = (
    Signal,
    Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
);

pin_project! {
    /// A response body under its deadlines: the first-token deadline until [`Timed::flowing`]
    /// is called, then a stall deadline moved by every frame, all within the total; and the
    /// drain deadline, when given. Past any of them it yields one [`Cut`] and then ends.
    #[derive(Debug)]
    pub(crate) struct Timed<B> {
        #[pin]
        inner: B,
        deadlines: Deadlines,
        timer: Timer,
        // Output has begun: the next deadline is a stall.
        flowing: bool,
        drained: Option<Drained>,
        // The waker the timer and the drain future were last polled with. While the body is
        // polled by the same task, a pending read need not poll them again: they will wake it.
        registered: Option<Waker>,
        // The backend, for the timeout metric.
        backend: Arc<str>,
        // A cut was yielded: the body is over.
        cut: bool,
    }
}

impl<B> Timed<B> {
    /// `inner` under `deadlines`; `drained`, when given, cuts it at the drain deadline.
    pub(crate) fn new(
        inner: B,
        deadlines: Deadlines,
        drained: Option<Signal>,
        backend: Arc<str>,
    ) -> Self {
        Self {
            inner,
            timer: Timer {
                at: deadlines.first_token(),
                armed: None,
            },
            deadlines,
            flowing: false,
            drained: drained.map(|d| {
                let fired = Box::pin(d.fired());
                (d, fired)
            }),
            registered: None,
            backend,
            cut: false,
        }
    }

    /// Output flows as of `now` (a content event, or any data of a body that is not a stream):
    /// the next deadline is a stall from now.
    pub(crate) fn flowing(self: Pin<&mut Self>, now: Instant) {
        let this = self.project();
        *this.flowing = true;
        this.timer.at = this.deadlines.stall_from(now);
    }
}

impl<B: Body<Data = Bytes, Error = BodyError>> Body for Timed<B> {
    type Data = Bytes;
    type Error = Cut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        let this = self.project();
        if *this.cut {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(err))) => {
                *this.cut = true;
                return Poll::Ready(Some(Err(Cut::Upstream(err))));
            }
            Poll::Ready(polled) => return Poll::Ready(polled.map(|f| f.map_err(Cut::Upstream))),
            Poll::Pending => {}
        }
        let registered = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if registered
            && !this.timer.needs_poll()
            && this
                .drained
                .as_ref()
                .is_none_or(|(signal, _)| !signal.has_fired())
        {
            return Poll::Pending;
        }
        if let Some((_, drained)) = this.drained.as_mut()
            && drained.as_mut().poll(cx).is_ready()
        {
            *this.cut = true;
            return Poll::Ready(Some(Err(Cut::Drained)));
        }
        if this.timer.poll(cx).is_pending() {
            if !registered {
                *this.registered = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let expired = this.deadlines.expired(Instant::now(), *this.flowing);
        crate::telemetry::count_timeout(this.backend, expired.kind);
        *this.cut = true;
        Poll::Ready(Some(Err(Cut::Expired(expired))))
    }

    fn is_end_stream(&self) -> bool {
        self.cut || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The next deadline, and its timer with the instant it is armed for. Boxed so that the body is
/// `Unpin` (a stream is read ahead to its first content before it goes out).
#[derive(Debug)]
struct Timer {
    at: Instant,
    armed: Option<(Pin<Box<tokio::time::Sleep>>, Instant)>,
}

impl Timer {
    /// Whether [`Timer::poll`] has anything to do that the timer's last registered waker does
    /// not cover: arm it, move it earlier, or see that it fired.
    fn needs_poll(&self) -> bool {
        self.armed
            .as_ref()
            .is_none_or(|(timer, armed)| *armed > self.at || timer.is_elapsed())
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        let (timer, armed) = self
            .armed
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

#[cfg(test)]
mod tests;
