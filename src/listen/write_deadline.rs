//! A client that stops reading: its socket fills, every write waits, and whatever the response
//! holds (a backend's slot and its KV cache) is held for as long as the socket stays open. A
//! write (or flush) that has waited `limits.client_write_timeout_s` without taking a byte fails
//! the connection instead, which drops the response and releases what it held.
//!
//! The timer is made the first time a write waits (a client that keeps up never has one) and
//! re-armed only when a write starts waiting again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// `io` whose writes may wait at most `after` for the client to take bytes.
    #[derive(Debug)]
    pub(super) struct WriteDeadline<I> {
        #[pin]
        io: I,
        after: Duration,
        // Armed while a write waits.
        timer: Option<Pin<Box<Sleep>>>,
        waiting: bool,
    }
}

impl<I> WriteDeadline<I> {
    pub(super) fn new(io: I, after: Duration) -> Self {
        Self {
            io,
            after,
            timer: None,
            waiting: false,
        }
    }
}

/// What a write (or flush) that got `polled` turns into: a wait past the deadline fails.
fn watched<T>(
    polled: Poll<io::Result<T>>,
    cx: &mut Context<'_>,
    timer: &mut Option<Pin<Box<Sleep>>>,
    waiting: &mut bool,
    after: Duration,
) -> Poll<io::Result<T>> {
    if polled.is_ready() {
        *waiting = false;
        return polled;
    }
    let deadline = Instant::now() + after;
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
    if !std::mem::replace(waiting, true) {
        timer.as_mut().reset(deadline);
    }
    ready!(timer.as_mut().poll(cx));
    crate::telemetry::count_client_write_timeout();
    Poll::Ready(Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the client took no bytes for the write timeout",
    )))
}

impl<I: AsyncRead> AsyncRead for WriteDeadline<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<I: AsyncWrite> AsyncWrite for WriteDeadline<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write(cx, buf);
        watched(polled, cx, this.timer, this.waiting, *this.after)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write_vectored(cx, bufs);
        watched(polled, cx, this.timer, this.waiting, *this.after)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let polled = this.io.poll_flush(cx);
        watched(polled, cx, this.timer, this.waiting, *this.after)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}
