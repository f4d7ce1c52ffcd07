//! Closing client connections that have nothing in flight: a connection that opens and sends
//! nothing more (an HTTP/2 preface and SETTINGS, then silence), or keeps a slot between requests
//! for longer than `limits.idle_timeout_s`, is shut down gracefully, so that idle clients cannot
//! hold every one of `max_connections`.
//!
//! The service counts requests in flight and requests done ([`Counted`]); the connection's timer
//! ([`Idle`]) fires every idle period and shuts the connection when nothing was in flight and
//! nothing finished since it last looked (so a connection goes between one and two periods
//! after its last request). Per request: two atomic additions; no clock read.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::Service;

/// What a connection has in flight, and how much it has done.
#[derive(Debug, Default)]
pub(super) struct Activity {
    in_flight: AtomicUsize,
    done: AtomicU64,
}

/// A request's place in its connection's activity; counts it done when dropped (with its
/// response body, or with its future if it never answered).
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// The connection's service, counting its requests in `activity`.
#[derive(Debug, Clone)]
pub(super) struct Counted<S> {
    pub(super) inner: S,
    pub(super) activity: Arc<Activity>,
}

impl<S, B> Service<Request<hyper::body::Incoming>> for Counted<S>
where
    S: Service<Request<hyper::body::Incoming>, Response = Response<B>, Error = Infallible>,
{
    type Response = Response<CountedBody<B>>;
    type Error = Infallible;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<hyper::body::Incoming>) -> Self::Future {
        CountedFuture {
            in_flight: Some(InFlight::new(&self.activity)),
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// Response future of [`Counted`]: hands the request's place to the response body.
    pub(super) struct CountedFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, B> Future for CountedFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    type Output = Result<Response<CountedBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(resp) = std::task::ready!(this.inner.poll(cx));
        let in_flight = this.in_flight.take();
        Poll::Ready(Ok(resp.map(|body| CountedBody {
            inner: body,
            _in_flight: in_flight,
        })))
    }
}

pin_project! {
    /// A response body that keeps its request counted in flight until it is done.
    pub(super) struct CountedBody<B> {
        #[pin]
        inner: B,
        _in_flight: Option<InFlight>,
    }
}

impl<B: Body<Data = Bytes>> Body for CountedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's idle timer.
#[derive(Debug)]
pub(super) struct Idle {
    activity: Arc<Activity>,
    after: Duration,
    timer: Pin<Box<Sleep>>,
    /// Requests done when the timer last fired.
    seen: u64,
}

impl Idle {
    /// A timer for a connection whose requests `activity` counts, idle after `after`.
    pub(super) fn new(activity: Arc<Activity>, after: Duration) -> Self {
        Self {
            activity,
            after,
            timer: Box::pin(tokio::time::sleep(after)),
            seen: 0,
        }
    }

    /// Whether the connection has been idle for a whole period. `registered`: the timer was
    /// last polled by this same task, so it will wake it and needs no poll until it has fired.
    pub(super) fn poll_idle(&mut self, cx: &mut Context<'_>, registered: bool) -> bool {
        if registered && !self.timer.is_elapsed() {
            return false;
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        let done = self.activity.done.load(Ordering::Relaxed);
        if self.activity.in_flight.load(Ordering::Relaxed) == 0 && done == self.seen {
            return true;
        }
        self.seen = done;
        self.timer.as_mut().reset(Instant::now() + self.after);
        let _ = self.timer.as_mut().poll(cx);
        false
    }
}
